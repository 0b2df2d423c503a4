# Shared by bench/compare.sh, bench/ab.sh and bench/cpu.sh (sourced, not run). Expects
# PALISADE (the binary), PORT, WORK (a scratch directory), SERVE_ARGS and
# PG_HOST/PG_PORT (and PG_DB for start_fresh) to be set; sets SERVER_PID.

psql_q() { psql -q -X -v ON_ERROR_STOP=1 -h "$PG_HOST" -p "$PG_PORT" -U postgres "$@"; }

# start_server URL: starts `palisade serve` on URL and waits until it is ready.
start_server() {
  local url=$1
  RUST_LOG=warn "$PALISADE" serve --listen "127.0.0.1:$PORT" --database-url "$url" \
    --admin-token compare-admin $SERVE_ARGS >"$WORK/server.log" 2>&1 & # split on purpose
  SERVER_PID=$!
  for _ in $(seq 1 100); do
    curl -fs "http://127.0.0.1:$PORT/readyz" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  cat "$WORK/server.log" >&2
  echo "server did not become ready" >&2
  exit 1
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
