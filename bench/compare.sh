#!/usr/bin/env bash
# Runs Palisade's benchmark scenarios on SQLite and on PostgreSQL, then the
# reference baselines (pgbench scripts and, if installed, etcd's lock API)
# back to back on this machine, and prints each ratio. Bounded in time:
# about 24 runs of $WARMUP + $DURATION seconds plus builds and start-ups.
#
#   bench/compare.sh                 # 10 s per run, 32 clients
#   DURATION=5 bench/compare.sh      # quicker, noisier
#   WARMUP=0 bench/compare.sh        # no unrecorded warm-up run (default 2 s)
#   SERVE_ARGS=--group-commit bench/compare.sh   # extra `palisade serve` options
#   SCENARIOS="cycle hot" BASELINES_TOO=no bench/compare.sh   # Palisade only
#   PALISADE_BIN=/tmp/palisade-old bench/compare.sh               # another build
#
# Needs: cargo, curl, jq, psql/createdb/pgbench, a PostgreSQL at $PG_HOST
# (user postgres, trust auth). etcd is optional: install it with
#   apt-get install -y etcd-server golang-go golang-etcd-server-dev
# and the script builds the shared load generator into /tmp.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BASELINES=${BASELINES:-$ROOT/../shared/bench}
DURATION=${DURATION:-10}
WARMUP=${WARMUP:-2}
CLIENTS=${CLIENTS:-32}
PG_HOST=${PG_HOST:-127.0.0.1}
PG_PORT=${PG_PORT:-5432}
PG_BENCH_DB=palisade_bench
PG_BASELINE_DB=palisade_baseline
PORT=${PORT:-17070}
SERVE_ARGS=${SERVE_ARGS:-}
SCENARIOS=${SCENARIOS:-cycle acquire hot renew write stale mixed}
BASELINES_TOO=${BASELINES_TOO:-yes}
ETCD_PORT=32379

WORK=$(mktemp -d /tmp/palisade-compare.XXXXXX)
RESULTS=$WORK/results.tsv
SERVER_PID=""
ETCD_PID=""

say() { printf '\n== %s\n' "$*" >&2; }
# record NAME VALUE: one measured number, for the summary.
record() { printf '%s\t%s\n' "$1" "$2" >>"$RESULTS"; }
value() { awk -F'\t' -v k="$1" '$1 == k { v = $2 } END { print v }' "$RESULTS"; }
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
trap stop_everything EXIT

use_palisade
# Let the build's (or anything else's) dirty pages reach the disk first: the
# first durable run's fsyncs would otherwise queue behind that writeback.
sync

# unswept BACKEND: leases past their deadline that the sweeper has not
# recorded as expired yet.
unswept() {
  local sql="SELECT count(*) FROM leases WHERE state = 'active'"
  if [[ $1 == postgres ]]; then
    psql -X -At -h "$PG_HOST" -p "$PG_PORT" -U postgres -d "$PG_BENCH_DB" -c "$sql"
  elif command -v sqlite3 >/dev/null; then
    sqlite3 -readonly "$WORK/palisade.db" "$sql"
  else
    sleep 20 && echo 0 # no sqlite3 CLI: give the sweeper a fixed while
  fi
}

# Waits (up to 60 s) until the sweeper has caught up with the leases a
# scenario left behind.
wait_for_sweeper() {
  local left
  for _ in $(seq 1 120); do
    left=$(unswept "$1")
    [[ $left == 0 ]] && return 0
    sleep 0.5
  done
  echo "the sweeper still has $left leases to expire; going on" >&2
}

# bench_run BACKEND SCENARIO CLIENTS: runs one scenario and records it.
bench_run() {
  local backend=$1 scenario=$2 clients=$3 out
  # Unrecorded: a just-started server, a new resource and cold caches make
  # the first seconds of a scenario slower than the rest.
  if [[ $WARMUP != 0 ]]; then
    "$PALISADE" bench --server "http://127.0.0.1:$PORT" --scenario "$scenario" \
      --clients "$clients" --duration "${WARMUP}s" >/dev/null
  fi
  out=$("$PALISADE" bench --server "http://127.0.0.1:$PORT" --scenario "$scenario" \
    --clients "$clients" --duration "${DURATION}s" --server-pid "$SERVER_PID" --json)
  echo "$out" >>"$WORK/palisade.jsonl"
  local key="palisade.$backend.$scenario.c$clients"
  record "$key.ops" "$(jq -r '.ops_per_sec' <<<"$out")"
  record "$key.p50_ms" "$(jq -r '.p50_ms' <<<"$out")"
  record "$key.p99_ms" "$(jq -r '.p99_ms' <<<"$out")"
  record "$key.errors" "$(jq -r '.errors' <<<"$out")"
  record "$key.rss_mb" "$(jq -r '(.rss_peak_bytes // 0) / 1048576' <<<"$out")"
  [[ $scenario == hot ]] && record "$key.max_wait_ms" "$(jq -r '.max_wait_ms' <<<"$out")" \
    && record "$key.jain" "$(jq -r '.jain_fairness' <<<"$out")"
  jq -r --arg b "$backend" \
    '"\($b) \(.scenario) c=\(.clients): \(.ops_per_sec|floor) ops/s p50 \(.p50_ms*100|floor/100) ms p99 \(.p99_ms*100|floor/100) ms p99.9 \(.p999_ms*100|floor/100) ms errors \(.errors) rss \((.rss_peak_bytes // 0)/1048576|floor) MiB" + (if .max_wait_ms then " max wait \(.max_wait_ms|floor) ms jain \(.jain_fairness*1000|floor/1000)" else "" end)' \
    <<<"$out" >&2
}

palisade_suite() {
  local backend=$1
  for scenario in $SCENARIOS; do
    bench_run "$backend" "$scenario" "$CLIENTS"
    # `acquire` leaves thousands of 100 ms leases for the sweeper to expire
    # (in shared batches, a few thousand a second): let it finish before the
    # next scenario, which would otherwise be measured against that backlog.
    if [[ $scenario == acquire ]]; then wait_for_sweeper "$backend"; fi
  done
  if [[ $BASELINES_TOO == yes ]]; then
    bench_run "$backend" acquire 1
    bench_run "$backend" cycle 64
  fi
}

say "Palisade on SQLite (WAL, synchronous=FULL)"
start_server "sqlite://$WORK/palisade.db"
palisade_suite sqlite
stop_server

say "Palisade on PostgreSQL (synchronous_commit=on, database $PG_BENCH_DB)"
fresh_pg_db "$PG_BENCH_DB"
start_server "postgres://postgres@$PG_HOST:$PG_PORT/$PG_BENCH_DB"
palisade_suite postgres
stop_server
psql_q -d postgres -c "DROP DATABASE IF EXISTS $PG_BENCH_DB WITH (FORCE)"

# pgbench_run NAME CLIENTS SCRIPT DEFINES...: runs one baseline script.
pgbench_run() {
  local name=$1 clients=$2 script=$3 out tps
  shift 3
  out=$(cd "$WORK" && pgbench_out "$clients" "$script" "$@")
  tps=$(awk '/^tps = / { print $3 }' <<<"$out")
  record "pgbench.$name.c$clients.ops" "$tps"
  local p50
  p50=$(pgbench_log_p50_ms)
  record "pgbench.$name.c$clients.p50_ms" "$p50"
  echo "pgbench $name c=$clients: $tps tps, p50 $p50 ms" >&2
}

reset_resources() {
  psql_q -d "$PG_BASELINE_DB" -c "UPDATE resources SET holder = NULL, expires_at = NULL" >/dev/null
}

if [[ $BASELINES_TOO != yes ]]; then
  say "results"
  cat "$RESULTS"
  [[ -n ${KEEP_RESULTS:-} ]] && cp "$RESULTS" "$KEEP_RESULTS.tsv" && cp "$WORK/palisade.jsonl" "$KEEP_RESULTS.jsonl"
  exit 0
fi

say "pgbench baselines (database $PG_BASELINE_DB)"
fresh_baseline_db
pgbench_run acqrel "$CLIENTS" acqrel_cte.sql -D nres=10000 -D ttl=30
reset_resources
pgbench_run acquire "$CLIENTS" acquire_cte.sql -D nres=10000 -D ttl=0
reset_resources
pgbench_run acquire 1 acquire_cte.sql -D nres=10000 -D ttl=0
pgbench_run fenced "$CLIENTS" fenced.sql -D nrows=10000 -D seq=0
psql_q -d postgres -c "DROP DATABASE IF EXISTS $PG_BASELINE_DB WITH (FORCE)"

if etcd_available; then
  say "etcd baselines (v3lock)"
  start_etcd "$WORK/etcd-data"
  for keys in distinct hot; do
    out=$(etcd_out "$keys")
    echo "etcd $out" >&2
    record "etcd.$keys.ops" "$(field ops_per_s <<<"$out")"
    record "etcd.$keys.p50_ms" "$(field p50_ms <<<"$out")"
  done
  stop_etcd
else
  say "etcd not installed: skipping its baseline"
fi

# ratio LABEL NUMERATOR DENOMINATOR TARGET: one line of the summary.
ratio() {
  local n d
  n=$(value "$2") d=$(value "$3")
  if [[ -z $n || -z $d ]] || awk -v d="$d" 'BEGIN { exit !(d == 0) }'; then
    printf '%-58s %12s\n' "$1" "n/a"
  else
    printf '%-58s %10.0f / %-10.0f = %5.2fx  (target %s)\n' "$1" "$n" "$d" \
      "$(awk -v n="$n" -v d="$d" 'BEGIN { print n / d }')" "$4"
  fi
}

say "ratios (${CLIENTS} clients unless noted, ${DURATION}s runs)"
{
  ratio "PostgreSQL acquire+release vs etcd v3lock" palisade.postgres.cycle.c$CLIENTS.ops etcd.distinct.ops ">= 1.5x"
  ratio "SQLite acquire+release vs etcd v3lock" palisade.sqlite.cycle.c$CLIENTS.ops etcd.distinct.ops ">= 2x"
  ratio "PostgreSQL hot handoffs vs etcd hot key" palisade.postgres.hot.c$CLIENTS.ops etcd.hot.ops ">= 1x"
  ratio "SQLite hot handoffs vs etcd hot key" palisade.sqlite.hot.c$CLIENTS.ops etcd.hot.ops ">= 1x"
  ratio "PostgreSQL fenced writes vs pgbench fenced.sql" palisade.postgres.write.c$CLIENTS.ops pgbench.fenced.c$CLIENTS.ops ">= 1x"
  ratio "SQLite fenced writes vs pgbench fenced.sql" palisade.sqlite.write.c$CLIENTS.ops pgbench.fenced.c$CLIENTS.ops ">= 1x"
  ratio "PostgreSQL acquire+release vs pgbench acqrel_cte.sql" palisade.postgres.cycle.c$CLIENTS.ops pgbench.acqrel.c$CLIENTS.ops "(context)"
  ratio "PostgreSQL acquire vs pgbench acquire_cte.sql" palisade.postgres.acquire.c$CLIENTS.ops pgbench.acquire.c$CLIENTS.ops "(context)"
  ratio "PostgreSQL stale (refused) vs accepted writes" palisade.postgres.stale.c$CLIENTS.ops palisade.postgres.write.c$CLIENTS.ops ">= 1x"
  ratio "SQLite stale (refused) vs accepted writes" palisade.sqlite.stale.c$CLIENTS.ops palisade.sqlite.write.c$CLIENTS.ops ">= 1x"
  printf '%-58s %s ms vs pgbench %s ms  (target <= 1.5x)\n' "PostgreSQL single-client acquire p50" \
    "$(value palisade.postgres.acquire.c1.p50_ms)" "$(value pgbench.acquire.c1.p50_ms)"
  printf '%-58s sqlite %s / postgres %s max wait ms, Jain %s / %s\n' "Hot fairness" \
    "$(value palisade.sqlite.hot.c$CLIENTS.max_wait_ms)" "$(value palisade.postgres.hot.c$CLIENTS.max_wait_ms)" \
    "$(value palisade.sqlite.hot.c$CLIENTS.jain)" "$(value palisade.postgres.hot.c$CLIENTS.jain)"
  printf '%-58s sqlite %s MiB / postgres %s MiB  (target < 64)\n' "Server peak RSS, 64 clients" \
    "$(value palisade.sqlite.cycle.c64.rss_mb)" "$(value palisade.postgres.cycle.c64.rss_mb)"
} | tee "$WORK/summary.txt"
if [[ -n ${KEEP_RESULTS:-} ]]; then
  cp "$RESULTS" "$KEEP_RESULTS.tsv" && cp "$WORK/palisade.jsonl" "$KEEP_RESULTS.jsonl"
fi
