#!/usr/bin/env bash
# Memory soak (issue 7, target 5): the server's resident memory under a
# steady 64-client mixed load, sampled every 30 s for 10 minutes. Memory is
# flat when it stops growing once the caches have filled: the summary
# compares the middle of the run with its end.
#
#   bench/soak.sh                                   # SQLite, 10 minutes
#   DATABASE_URL=postgres://postgres@127.0.0.1:5432/palisade_soak bench/soak.sh
#   SOAK_SECONDS=120 bench/soak.sh                  # a quick look
#
# Needs: cargo, curl; for PostgreSQL, the database must exist (it is used
# as is).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PORT=${PORT:-17272}
SOAK_SECONDS=${SOAK_SECONDS:-600}
CLIENTS=${CLIENTS:-64}
WORK=$(mktemp -d /tmp/palisade-soak.XXXXXX)
DATABASE_URL=${DATABASE_URL:-sqlite://$WORK/soak.db}
SERVER_PID=""
BENCH_PID=""

cleanup() {
  [[ -n $BENCH_PID ]] && kill "$BENCH_PID" 2>/dev/null
  [[ -n $SERVER_PID ]] && kill "$SERVER_PID" 2>/dev/null && wait "$SERVER_PID" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT

(cd "$ROOT" && cargo build --release --quiet)
PALISADE=$ROOT/target/release/palisade

RUST_LOG=warn "$PALISADE" serve --listen "127.0.0.1:$PORT" --database-url "$DATABASE_URL" \
  >"$WORK/server.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 1 100); do
  curl -fs "http://127.0.0.1:$PORT/readyz" >/dev/null 2>&1 && break
  sleep 0.1
done

"$PALISADE" bench --server "http://127.0.0.1:$PORT" --scenario mixed --clients "$CLIENTS" \
  --duration "${SOAK_SECONDS}s" >"$WORK/bench.log" 2>&1 &
BENCH_PID=$!

rss_mib() { awk '/^VmRSS:/ { printf "%.1f", $2 / 1024 }' "/proc/$SERVER_PID/status"; }
echo "database: ${DATABASE_URL%%\?*}; $CLIENTS clients, mixed scenario, ${SOAK_SECONDS} s"
echo "elapsed_s rss_mib"
samples=()
elapsed=0
while kill -0 "$BENCH_PID" 2>/dev/null && ((elapsed < SOAK_SECONDS)); do
  sleep 30
  elapsed=$((elapsed + 30))
  rss=$(rss_mib)
  samples+=("$rss")
  echo "$elapsed $rss"
done
wait "$BENCH_PID" || true
BENCH_PID=""
grep -E "ops/s|errors" "$WORK/bench.log" | tr '\n' ' '
echo
n=${#samples[@]}
if ((n >= 4)); then
  # Caches (SQLite's page cache, pools, allocator arenas) fill during the
  # first minutes while the database grows; after that, growth is a leak.
  half=${samples[n / 2 - 1]}
  last=${samples[n - 1]}
  peak=$(printf '%s\n' "${samples[@]}" | sort -n | tail -1)
  awk -v h="$half" -v l="$last" -v p="$peak" -v t="$((n / 2 * 30))" 'BEGIN {
    printf "peak %.1f MiB (target: under 64 MB); second half: %.1f MiB at %d s, %.1f MiB at the end: %+.1f%%\n", p, h, t, l, 100 * (l - h) / h
  }'
fi
