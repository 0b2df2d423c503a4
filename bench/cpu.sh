#!/usr/bin/env bash
# What one operation costs in CPU: runs each scenario against a fresh
# database and prints its ops/s with the CPU time the server and (on
# PostgreSQL) the database's processes spent per operation, from /proc.
# Throughput on this shared 2-core machine hides cost when the load generator
# is the bottleneck; CPU per operation does not (e.g. refused vs accepted
# writes: `stale` against `write`).
#
#   bench/cpu.sh BINARY
#   RUNS=3 BACKENDS=sqlite SCENARIOS="write stale" DURATION=8 bench/cpu.sh target/release/palisade
#
# Needs: curl, jq, psql and a PostgreSQL at $PG_HOST (user postgres) on this
# machine (its processes are found with pgrep).
set -euo pipefail

[[ $# == 1 ]] || { sed -n '2,11p' "$0" >&2; exit 2; }
PALISADE=$1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
RUNS=${RUNS:-2}
DURATION=${DURATION:-5}
WARMUP=${WARMUP:-2}
CLIENTS=${CLIENTS:-32}
BACKENDS=${BACKENDS:-sqlite postgres}
SCENARIOS=${SCENARIOS:-write stale}
PG_HOST=${PG_HOST:-127.0.0.1}
PG_PORT=${PG_PORT:-5432}
PG_DB=palisade_cpu
PORT=${PORT:-17073}
SERVE_ARGS=${SERVE_ARGS:-}
WORK=$(mktemp -d /tmp/palisade-cpu.XXXXXX)
SERVER_PID=""
trap '[[ -n $SERVER_PID ]] && kill "$SERVER_PID" 2>/dev/null; rm -rf "$WORK"' EXIT
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
TICK=$(getconf CLK_TCK)

# ticks PID...: user + system CPU ticks of the given processes (those that
# have exited count as 0).
ticks() {
  local total=0 pid stat
  for pid in "$@"; do
    stat=$(cat "/proc/$pid/stat" 2>/dev/null) || continue
    stat=${stat##*) } # fields after the command name, which may hold spaces
    read -r -a f <<<"$stat"
    total=$((total + f[11] + f[12]))
  done
  echo "$total"
}

for backend in $BACKENDS; do
  for scenario in $SCENARIOS; do
    for run in $(seq 1 "$RUNS"); do
      start_fresh "$backend"
      bench=("$PALISADE" bench --server "http://127.0.0.1:$PORT" --scenario "$scenario"
        --clients "$CLIENTS")
      [[ $WARMUP != 0 ]] && "${bench[@]}" --duration "${WARMUP}s" >/dev/null
      # The database's processes after the warm-up: the pool is open by now.
      mapfile -t pg < <([[ $backend == postgres ]] && pgrep -x postgres || true)
      s0=$(ticks "$SERVER_PID") && p0=$(ticks "${pg[@]}")
      ops=$("${bench[@]}" --duration "${DURATION}s" --json | jq -r '.ops_per_sec')
      s1=$(ticks "$SERVER_PID") && p1=$(ticks "${pg[@]}")
      stop_server
      awk -v b="$backend" -v s="$scenario" -v r="$run" -v ops="$ops" -v d="$DURATION" \
        -v ds=$((s1 - s0)) -v dp=$((p1 - p0)) -v tick="$TICK" 'BEGIN {
          n = ops * d
          printf "%s %s run %d: %.0f ops/s, server %.0f us/op", b, s, r, ops, ds / tick * 1e6 / n
          if (b == "postgres") printf ", database %.0f us/op", dp / tick * 1e6 / n
          printf "\n"
        }'
    done
  done
done
