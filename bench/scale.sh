#!/usr/bin/env bash
# Scale check (issue 7, target 6): does a big database slow the lock path?
#
# 1. Measures single-client acquire latency and 32-client cycles on an empty
#    PostgreSQL database.
# 2. Loads 1,000,000 resources, 1,000,000 ended leases, 100,000 active leases
#    (an hour to go, so the sweeper has nothing due) and 10,000,000 events,
#    then measures the same scenarios again and prints the change.
# 3. Prints EXPLAIN ANALYZE of the statements on the lock path and of the
#    sweeper's and metrics' queries, and the server's idle CPU with 100,000
#    active leases (sweeper every 250 ms, active-lease gauge every 2 s).
#
#   bench/scale.sh                    # ~10 minutes, ~6 GB of disk while it runs
#   EVENTS=1000000 bench/scale.sh     # smaller, quicker
#
# Needs: cargo, curl, psql, a PostgreSQL at $PG_HOST (user postgres, trust
# auth). Creates and drops the database palisade_scale.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PG_HOST=${PG_HOST:-127.0.0.1}
PG_PORT=${PG_PORT:-5432}
DB=palisade_scale
URL="postgres://postgres@$PG_HOST:$PG_PORT/$DB"
PORT=${PORT:-17171}
RESOURCES=${RESOURCES:-1000000}
EVENTS=${EVENTS:-10000000}
ACTIVE=${ACTIVE:-100000}
DURATION=${DURATION:-10s}
SERVER_PID=""

psql_q() { psql -q -X -v ON_ERROR_STOP=1 -h "$PG_HOST" -p "$PG_PORT" -U postgres "$@"; }
say() { printf '\n== %s\n' "$*" >&2; }

cleanup() {
  [[ -n $SERVER_PID ]] && kill "$SERVER_PID" 2>/dev/null && wait "$SERVER_PID" 2>/dev/null
  psql_q -d postgres -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" || true
}
trap cleanup EXIT

say "building (release)"
(cd "$ROOT" && cargo build --release --quiet)
PALISADE=$ROOT/target/release/palisade

start_server() {
  RUST_LOG=warn "$PALISADE" serve --listen "127.0.0.1:$PORT" --database-url "$URL" \
    --sweep-interval-ms 250 >/dev/null 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 1 100); do
    curl -fs "http://127.0.0.1:$PORT/readyz" >/dev/null 2>&1 && return
    sleep 0.1
  done
  echo "server did not start" >&2
  exit 1
}
stop_server() {
  kill "$SERVER_PID" && wait "$SERVER_PID" 2>/dev/null || true
  SERVER_PID=""
}

# bench_run SCENARIO CLIENTS: prints "ops/s p50" of one run.
bench_run() {
  "$PALISADE" bench --server "http://127.0.0.1:$PORT" --scenario "$1" --clients "$2" \
    --duration "$DURATION" --resources 1000 2>&1 |
    awk '/ops\/s/ { for (i = 1; i <= NF; i++) if ($i == "ops/s") ops = $(i + 1) }
         /p50/ { for (i = 1; i <= NF; i++) if ($i == "p50") p50 = $(i + 1) }
         END { print ops, p50 }'
}

measure() {
  local label=$1
  read -r a1_ops a1_p50 < <(bench_run acquire 1)
  read -r c_ops c_p50 < <(bench_run cycle 32)
  printf '%-6s acquire(1 client) p50 %s ms (%s/s) | cycle(32 clients) %s/s p50 %s ms\n' \
    "$label" "$a1_p50" "$a1_ops" "$c_ops" "$c_p50"
  eval "${label}_a1=$a1_p50; ${label}_cycle=$c_ops"
}

psql_q -d postgres -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" -c "CREATE DATABASE $DB"

say "empty database"
start_server
measure empty
stop_server

say "loading $RESOURCES resources, $EVENTS events, $ACTIVE active leases"
started=$(date +%s)
psql_q -d "$DB" <<SQL
INSERT INTO resources (name, last_token, accepted_token, created_at, last_activity_at)
SELECT 'scale/' || g, 2, 1, now() - interval '30 days', now() - (g % 43200) * interval '1 minute'
FROM generate_series(1, $RESOURCES) AS g;
INSERT INTO leases (lease_id, resource, token, holder, state, ttl_ms, acquired_at, expires_at, ended_at)
SELECT md5('ended' || g), 'scale/' || g, 1, 'worker-' || (g % 100), 'released', 30000,
       now() - interval '1 day', now() - interval '1 day' + interval '30 seconds',
       now() - interval '1 day' + interval '5 seconds'
FROM generate_series(1, $RESOURCES) AS g;
INSERT INTO leases (lease_id, resource, token, holder, state, ttl_ms, acquired_at, expires_at)
SELECT md5('active' || g), 'scale/' || g, 2, 'worker-' || (g % 100), 'active', 3600000,
       now(), now() + interval '1 hour'
FROM generate_series(1, $ACTIVE) AS g;
INSERT INTO events (at, kind, resource, token, holder, detail)
SELECT now() - (g % 43200) * interval '1 minute',
       (ARRAY['acquired', 'renewed', 'write_accepted', 'released', 'write_rejected'])[1 + g % 5],
       'scale/' || (1 + g % $RESOURCES), 1 + g % 2, 'worker-' || (g % 100), '{}'::jsonb
FROM generate_series(1, $EVENTS) AS g;
VACUUM ANALYZE;
SQL
echo "loaded in $(($(date +%s) - started)) s; database size $(psql -X -At -h "$PG_HOST" -p "$PG_PORT" -U postgres -d "$DB" -c "SELECT pg_size_pretty(pg_database_size('$DB'))")"

say "loaded database"
start_server
measure loaded

say "server CPU while idle with $ACTIVE active leases (10 s)"
ticks() { awk '{ print $14 + $15 }' "/proc/$SERVER_PID/stat"; }
t0=$(ticks)
sleep 10
t1=$(ticks)
hz=$(getconf CLK_TCK)
awk -v d=$((t1 - t0)) -v hz="$hz" 'BEGIN { printf "server CPU: %.1f%% of one core\n", 100 * d / hz / 10 }'
stop_server

say "query plans on the loaded database"
explain() {
  echo "-- $1"
  psql -X -h "$PG_HOST" -p "$PG_PORT" -U postgres -d "$DB" -c "EXPLAIN (ANALYZE, COSTS OFF, TIMING ON, SUMMARY ON) $2" |
    grep -Ev '^\s*$|^\(|QUERY PLAN|^-+$'
}
explain "batch lock (acquire of an existing resource, release by lease id)" \
  "SELECT name, last_token FROM resources WHERE name = ANY(ARRAY['scale/500000', 'scale/7']
   || ARRAY(SELECT resource FROM leases WHERE lease_id = ANY(ARRAY[md5('active7')]))) ORDER BY name FOR UPDATE"
explain "batch load: active leases, leases by id, leases by token" \
  "SELECT lease_id FROM leases WHERE resource = ANY(ARRAY['scale/500000', 'scale/7']) AND state = 'active'
   UNION SELECT lease_id FROM leases WHERE lease_id = ANY(ARRAY[md5('active7')])
   UNION SELECT lease_id FROM leases WHERE (resource, token) IN
     (SELECT r, t FROM unnest(ARRAY['scale/7'], ARRAY[2::bigint]) AS p(r, t))"
explain "sweeper: due leases (none due among $ACTIVE active)" \
  "SELECT resource FROM leases WHERE state = 'active' AND expires_at <= statement_timestamp() ORDER BY expires_at LIMIT 500"
explain "active-lease gauge (every 2 s)" \
  "SELECT count(*) FROM leases WHERE state = 'active' AND expires_at > statement_timestamp()"
explain "one resource's events (API and timeline)" \
  "SELECT id FROM events WHERE id > 0 AND resource = 'scale/4242' ORDER BY id LIMIT 100"
explain "a timeline window's marks: (resource, id) between id bounds found by time" \
  "SELECT id FROM events WHERE resource = 'scale/4242'
   AND id > coalesce((SELECT id FROM events WHERE at < now() - interval '1 hour 10 minutes'
     ORDER BY at DESC, id DESC LIMIT 1), 0)
   AND id < coalesce((SELECT id FROM events WHERE at >= now() + interval '10 minutes'
     ORDER BY at, id LIMIT 1), 9223372036854775807)
   AND at >= now() - interval '1 hour' AND at < now()
   AND kind IN ('renewed', 'write_accepted', 'write_rejected') ORDER BY id LIMIT 101"
explain "event stream page" \
  "SELECT id FROM events WHERE id > $((EVENTS - 500)) ORDER BY id LIMIT 100"

say "summary"
awk -v e="$empty_a1" -v l="$loaded_a1" -v ec="$empty_cycle" -v lc="$loaded_cycle" 'BEGIN {
  printf "single-client acquire p50: %.2f ms empty, %.2f ms loaded: %+.0f%% (target: under +20%%)\n", e, l, 100 * (l - e) / e
  printf "32-client cycles/s: %.0f empty, %.0f loaded: %+.0f%%\n", ec, lc, 100 * (lc - ec) / ec
}'
