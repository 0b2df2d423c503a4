#!/usr/bin/env bash
# Compares two builds of Palisade on this machine by alternating them: on a
# shared machine whose speed drifts within minutes, only runs taken side by
# side mean anything. Each pair runs A then B, the next pair B then A, every
# run on a fresh database; it prints every run and, per scenario, the median
# of A, of B and of the pairs' B/A ratios.
#
#   bench/ab.sh OLD_BINARY NEW_BINARY
#   PAIRS=7 DURATION=8 BACKENDS=sqlite SCENARIOS="cycle hot" bench/ab.sh A B
#
# Build the old one in a worktree of its own, e.g.
#   git worktree add /tmp/old HEAD~1 && (cd /tmp/old && cargo build --release)
# Needs: curl, jq, psql and a PostgreSQL at $PG_HOST (user postgres).
set -euo pipefail

[[ $# == 2 ]] || { sed -n '2,12p' "$0" >&2; exit 2; }
A_BIN=$1 B_BIN=$2
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PAIRS=${PAIRS:-5}
DURATION=${DURATION:-5}
WARMUP=${WARMUP:-2}
CLIENTS=${CLIENTS:-32}
BACKENDS=${BACKENDS:-sqlite postgres}
SCENARIOS=${SCENARIOS:-cycle}
PG_HOST=${PG_HOST:-127.0.0.1}
PG_PORT=${PG_PORT:-5432}
PG_DB=palisade_ab
PORT=${PORT:-17072}
SERVE_ARGS=${SERVE_ARGS:-}
WORK=$(mktemp -d /tmp/palisade-ab.XXXXXX)
SERVER_PID=""
trap '[[ -n $SERVER_PID ]] && kill "$SERVER_PID" 2>/dev/null; rm -rf "$WORK"' EXIT
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"

# one BINARY BACKEND SCENARIO: ops/s of one run on a fresh database.
one() {
  PALISADE=$1
  start_fresh "$2"
  local bench=("$PALISADE" bench --server "http://127.0.0.1:$PORT" --scenario "$3"
    --clients "$CLIENTS")
  [[ $WARMUP != 0 ]] && "${bench[@]}" --duration "${WARMUP}s" >/dev/null
  "${bench[@]}" --duration "${DURATION}s" --json | jq -r '.ops_per_sec'
  stop_server
}

sync
for backend in $BACKENDS; do
  for scenario in $SCENARIOS; do
    : >"$WORK/a" && : >"$WORK/b" && : >"$WORK/ratio"
    for pair in $(seq 1 "$PAIRS"); do
      if ((pair % 2)); then
        a=$(one "$A_BIN" "$backend" "$scenario") && b=$(one "$B_BIN" "$backend" "$scenario")
      else
        b=$(one "$B_BIN" "$backend" "$scenario") && a=$(one "$A_BIN" "$backend" "$scenario")
      fi
      echo "$a" >>"$WORK/a" && echo "$b" >>"$WORK/b"
      awk -v a="$a" -v b="$b" 'BEGIN { print b / a }' >>"$WORK/ratio"
      printf '%s %s pair %d: A %.0f ops/s, B %.0f ops/s\n' "$backend" "$scenario" "$pair" "$a" "$b" >&2
    done
    printf '%s %s: median A %.0f ops/s, median B %.0f ops/s, median B/A %.2f over %d pairs\n' \
      "$backend" "$scenario" "$(median <"$WORK/a")" "$(median <"$WORK/b")" \
      "$(median <"$WORK/ratio")" "$PAIRS"
  done
done
