# Shared by bench/compare.sh, bench/ab.sh, bench/cpu.sh and bench/targets.sh (sourced, not run). Expects
# PALISADE (the binary), PORT, WORK (a scratch directory), SERVE_ARGS and
# PG_HOST/PG_PORT (and PG_DB for start_fresh) to be set; sets SERVER_PID
# (and PALISADE with use_palisade, from ROOT).

psql_q() { psql -q -X -v ON_ERROR_STOP=1 -h "$PG_HOST" -p "$PG_PORT" -U postgres "$@"; }

# start_server URL: starts `palisade serve` on URL and waits until it is ready.
start_server() {
  local url=$1
  RUST_LOG=warn "$PALISADE" serve --listen "127.0.0.1:$PORT" --database-url "$url" \
    --admin-token compare-admin $SERVE_ARGS >"$WORK/server.log" 2>&1 & # split on purpose
  SERVER_PID=$!
  wait_until_up "http://127.0.0.1:$PORT/readyz" || {
    cat "$WORK/server.log" >&2
    echo "server did not become ready" >&2
    exit 1
  }
}

# wait_until_up URL: succeeds once URL answers 2xx, fails after 10 s.
wait_until_up() {
  for _ in $(seq 1 100); do
    curl -fs "$1" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  return 1
}

# use_palisade: sets PALISADE to $PALISADE_BIN (a binary built elsewhere,
# e.g. from an older commit) or to a fresh release build of this checkout.
use_palisade() {
  if [[ -n ${PALISADE_BIN:-} ]]; then
    PALISADE=$PALISADE_BIN
  else
    echo "building (release)" >&2
    (cd "$ROOT" && cargo build --release --quiet)
    PALISADE=$ROOT/target/release/palisade
  fi
}

# stop_everything: the EXIT trap of the scripts that start a server and
# etcd in $WORK.
stop_everything() {
  [[ -n ${SERVER_PID:-} ]] && kill "$SERVER_PID" 2>/dev/null && wait "$SERVER_PID" 2>/dev/null
  [[ -n ${ETCD_PID:-} ]] && kill "$ETCD_PID" 2>/dev/null && wait "$ETCD_PID" 2>/dev/null
  rm -rf "$WORK"
}

stop_server() {
  kill "$SERVER_PID" && wait "$SERVER_PID" || true
  SERVER_PID=""
}

# fresh_pg_db NAME: drops and creates a PostgreSQL database (durable commits).
fresh_pg_db() {
  psql_q -d postgres -c "DROP DATABASE IF EXISTS $1 WITH (FORCE)"
  psql_q -d postgres -c "CREATE DATABASE $1"
  psql_q -d postgres -c "ALTER DATABASE $1 SET synchronous_commit = on"
}

# start_fresh BACKEND: starts `palisade serve` on an empty database, SQLite
# in $WORK or PostgreSQL database $PG_DB (dropped and created again).
start_fresh() {
  if [[ $1 == postgres ]]; then
    fresh_pg_db "$PG_DB"
    start_server "postgres://postgres@$PG_HOST:$PG_PORT/$PG_DB"
  else
    rm -f "$WORK"/fresh.db*
    start_server "sqlite://$WORK/fresh.db"
  fi
}

# The reference baselines (../shared/bench): pgbench scripts and etcd's lock
# API through the shared load generator. Expect BASELINES, CLIENTS, DURATION,
# ETCD_PORT and PG_BASELINE_DB; set ETCD_PID.
ETCD_BENCH=${ETCD_BENCH:-/tmp/etcdlockbench}

# pgbench_out CLIENTS SCRIPT DEFINES...: pgbench's whole output for one run of
# a baseline script on $PG_BASELINE_DB (durable commits, prepared statements),
# with the per-transaction log (-l) in the current directory.
pgbench_out() {
  local clients=$1 script=$2
  shift 2
  PGOPTIONS='-c synchronous_commit=on' pgbench -n -M prepared -h "$PG_HOST" -p "$PG_PORT" \
    -U postgres -c "$clients" -j 2 -T "$DURATION" -l "$@" -f "$BASELINES/postgres/$script" \
    "$PG_BASELINE_DB" 2>&1
}

# pgbench_log_p50_ms: the median latency (ms) in the per-transaction logs
# pgbench_out left in $WORK (third column, µs; pgbench 15 writes "failed"
# there for a failed transaction, which is left out), then removes them.
pgbench_log_p50_ms() {
  cat "$WORK"/pgbench_log.* | awk '$3 ~ /^[0-9]+$/ { print $3 / 1000 }' | median
  rm -f "$WORK"/pgbench_log.*
}

# fresh_baseline_db: $PG_BASELINE_DB, dropped and created with the shared schema.
fresh_baseline_db() {
  psql_q -d postgres -c "DROP DATABASE IF EXISTS $PG_BASELINE_DB WITH (FORCE)"
  createdb -h "$PG_HOST" -p "$PG_PORT" -U postgres "$PG_BASELINE_DB"
  psql_q -d "$PG_BASELINE_DB" -f "$BASELINES/postgres/schema.sql" >/dev/null 2>&1
}

# etcd_available: etcd is installed and the load generator built (building it
# into $ETCD_BENCH if Go and etcd's client sources are there).
etcd_available() {
  command -v etcd >/dev/null || return 1
  if [[ ! -x $ETCD_BENCH ]] && command -v go >/dev/null; then
    echo "building the etcd load generator into $ETCD_BENCH" >&2
    # `|| exit`: errexit does not apply inside a function called as a condition.
    mkdir -p /tmp/etcdbench/src/etcdlockbench \
      && cp "$BASELINES/etcd/main.go" /tmp/etcdbench/src/etcdlockbench/ \
      && (cd /tmp/etcdbench/src/etcdlockbench \
        && GO111MODULE=off GOPATH=/tmp/etcdbench:/usr/share/gocode go build -o "$ETCD_BENCH" .) \
      || { echo "building $ETCD_BENCH failed" >&2; exit 1; }
  fi
  [[ -x $ETCD_BENCH ]]
}

# start_etcd DATA_DIR: a single-member etcd (fsync on every write, its
# default) on $ETCD_PORT, waited for until healthy.
start_etcd() {
  etcd --name bench --data-dir "$1" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls http://127.0.0.1:32380 --initial-advertise-peer-urls http://127.0.0.1:32380 \
    --initial-cluster bench=http://127.0.0.1:32380 --listen-metrics-urls http://127.0.0.1:32381 \
    --log-level warn >"$1.log" 2>&1 &
  ETCD_PID=$!
  wait_until_up "http://127.0.0.1:$ETCD_PORT/health" || {
    echo "etcd did not become healthy" >&2
    exit 1
  }
}

stop_etcd() {
  kill "$ETCD_PID" && wait "$ETCD_PID" || true
  ETCD_PID=""
}

# etcd_out KEYS: the load generator's one line for KEYS (distinct or hot),
# e.g. "mode=v3lock keys=distinct ... ops_per_s=3096.0 p50_ms=9.8 ...".
etcd_out() {
  "$ETCD_BENCH" -endpoints "127.0.0.1:$ETCD_PORT" -mode v3lock -clients "$CLIENTS" \
    -keys "$1" -duration "${DURATION}s"
}

# field NAME: NAME's value in a "name=value" line on stdin.
field() { grep -o "$1=[0-9.]*" | cut -d= -f2; }

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
