#!/usr/bin/env bash
# The issue's targets as ratios (cycles, hot handoffs and fenced writes
# against their baselines, refused against accepted writes, single-client
# acquire p50 against pgbench's), each measured in interleaved rounds: every
# Palisade run sits next to the baseline run it is divided by (odd rounds
# Palisade first, even rounds the baseline first), so a machine whose speed
# drifts within minutes moves both sides of a ratio alike. Prints every
# round's ratio and, per target, the median and the range over the rounds;
# then, per backend, the hot scenario's longest wait and lowest Jain index.
# bench/compare.sh runs every scenario once and the baselines afterwards;
# this runs fewer scenarios, several times.
#
#   bench/targets.sh                       # 3 rounds of 10 s runs, 32 clients
#   ROUNDS=5 DURATION=5 bench/targets.sh  # quicker runs, more of them
#   BACKENDS=sqlite bench/targets.sh       # one backend
#   PALISADE_BIN=/tmp/palisade-old bench/targets.sh
#
# Needs what bench/compare.sh needs, etcd included (no etcd: the etcd ratios
# are left out and the script says so).
set -euo pipefail
# A failing command inside $(...) stops the script too.
shopt -s inherit_errexit

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BASELINES=${BASELINES:-$ROOT/../shared/bench}
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10}
WARMUP=${WARMUP:-2}
CLIENTS=${CLIENTS:-32}
BACKENDS=${BACKENDS:-sqlite postgres}
PG_HOST=${PG_HOST:-127.0.0.1}
PG_PORT=${PG_PORT:-5432}
PG_DB=palisade_targets
PG_BASELINE_DB=palisade_targets_baseline
PORT=${PORT:-17074}
ETCD_PORT=32379
SERVE_ARGS=${SERVE_ARGS:-}
WORK=$(mktemp -d /tmp/palisade-targets.XXXXXX)
SERVER_PID=""
ETCD_PID=""
# shellcheck source=bench/lib.sh
source "$ROOT/bench/lib.sh"
trap stop_everything EXIT

use_palisade
sync

if etcd_available; then
  HAVE_ETCD=yes
else
  echo "etcd not installed: its ratios are left out" >&2
  HAVE_ETCD=no
fi

# palisade_run CLIENTS SCENARIO: the JSON summary of one run against the
# running server, after an unrecorded warm-up.
palisade_run() {
  local bench=("$PALISADE" bench --server "http://127.0.0.1:$PORT" --clients "$1"
    --scenario "$2")
  [[ $WARMUP != 0 ]] && "${bench[@]}" --duration "${WARMUP}s" >/dev/null
  "${bench[@]}" --duration "${DURATION}s" --json
}

# measure NAME: one number. Palisade's: cycle, hot, write and stale (ops/s
# at $CLIENTS clients) and acquire-p50 (p50 ms of one client acquiring);
# the baselines': etcd-distinct, etcd-hot, pgbench-fenced (ops/s) and
# pgbench-acquire-p50 (p50 ms of one client running acquire_cte.sql).
measure() {
  case $1 in
    cycle | write | stale) palisade_run "$CLIENTS" "$1" | jq -r '.ops_per_sec' ;;
    hot)
      # Fairness too: the longest any waiter waited, and Jain's index over
      # the clients' handoffs (1 is perfectly even), per backend.
      local run
      run=$(palisade_run "$CLIENTS" hot)
      jq -r --arg b "$backend" '"\($b) \(.max_wait_ms) \(.jain_fairness)"' <<<"$run" >>"$WORK/fairness"
      jq -r '.ops_per_sec' <<<"$run"
      ;;
    acquire-p50) palisade_run 1 acquire | jq -r '.p50_ms' ;;
    etcd-distinct) etcd_out distinct | field ops_per_s ;;
    etcd-hot) etcd_out hot | field ops_per_s ;;
    pgbench-fenced)
      # On a fresh table each time, as in bench/compare.sh and the shared
      # README: pgbench's rate on one table climbs from run to run (12,000
      # to 25,000/s over six runs on 7 December) as its pages gain room.
      fresh_baseline_db >/dev/null
      local tps
      tps=$(cd "$WORK" && pgbench_out "$CLIENTS" fenced.sql -D nrows=10000 -D seq=0 \
        | awk '/^tps = / { print $3 }')
      rm -f "$WORK"/pgbench_log.*
      echo "$tps"
      ;;
    pgbench-acquire-p50)
      fresh_baseline_db >/dev/null
      local out
      out=$(cd "$WORK" && pgbench_out 1 acquire_cte.sql -D nres=10000 -D ttl=0) || {
        echo "$out" >&2
        return 1
      }
      pgbench_log_p50_ms
      ;;
    *) echo "unknown measure $1" >&2 && exit 2 ;;
  esac
}

# The targets: backend, what is measured, what it is divided by, the goal
# and whether the ratio must reach it (ge) or stay under it (le). Each
# backend's single-client acquires come last: their short leases keep the
# sweeper busy for a while after the run.
targets() {
  for backend in $BACKENDS; do
    local cycle_goal=2
    [[ $backend == postgres ]] && cycle_goal=1.5
    if [[ $HAVE_ETCD == yes ]]; then
      echo "$backend cycle etcd-distinct $cycle_goal ge"
      echo "$backend hot etcd-hot 1 ge"
    fi
    echo "$backend write pgbench-fenced 1 ge"
    echo "$backend stale write 1 ge"
    echo "$backend acquire-p50 pgbench-acquire-p50 1.5 le"
  done
}

for round in $(seq 1 "$ROUNDS"); do
  # A fresh etcd each round, as Palisade gets a fresh database: etcd's
  # history grows with every lock taken.
  if [[ $HAVE_ETCD == yes ]]; then start_etcd "$WORK/etcd-data.$round"; fi
  for backend in $BACKENDS; do
    start_fresh "$backend"
    while read -r b scenario baseline goal cmp; do
      [[ $b == "$backend" ]] || continue
      # Two statements, not `a && b`: errexit must stop the script when
      # either run fails.
      if ((round % 2)); then
        p=$(measure "$scenario")
        d=$(measure "$baseline")
      else
        d=$(measure "$baseline")
        p=$(measure "$scenario")
      fi
      r=$(awk -v p="$p" -v d="$d" 'BEGIN { if (!(p + 0 > 0 && d + 0 > 0)) exit 1; print p / d }') || {
        echo "no number for $backend $scenario against $baseline (got '$p' and '$d')" >&2
        exit 1
      }
      printf '%s %s %s\n' "$backend" "$scenario" "$r" >>"$WORK/ratios"
      printf 'round %d: %-8s %-11s %9.2f / %-19s %9.2f = %5.2fx\n' \
        "$round" "$backend" "$scenario" "$p" "$baseline" "$d" "$r" >&2
    done < <(targets)
    stop_server
  done
  if [[ $HAVE_ETCD == yes ]]; then stop_etcd; fi
done

echo
printf 'median over %d rounds of %s s (%d clients; acquire-p50: 1 client); range in brackets\n' \
  "$ROUNDS" "$DURATION" "$CLIENTS"
while read -r backend scenario baseline goal cmp; do
  rs=$(awk -v b="$backend" -v s="$scenario" '$1 == b && $2 == s { print $3 }' "$WORK/ratios")
  m=$(median <<<"$rs")
  lo=$(sort -g <<<"$rs" | head -1) hi=$(sort -g <<<"$rs" | tail -1)
  met=$(awk -v m="$m" -v g="$goal" -v c="$cmp" \
    'BEGIN { print ((c == "ge") ? m >= g : m <= g) ? "met" : "not met" }')
  case $cmp in
    ge) sign='>=' ;;
    le) sign='<=' ;;
    *) echo "target $backend $scenario: goal direction '$cmp' is neither ge nor le" >&2 && exit 2 ;;
  esac
  printf '%-8s %-11s vs %-19s %5.2fx [%.2f-%.2f]  goal %s %sx: %s\n' \
    "$backend" "$scenario" "$baseline" "$m" "$lo" "$hi" "$sign" "$goal" "$met"
done < <(targets)
if [[ -s $WORK/fairness ]]; then
  for backend in $BACKENDS; do
    awk -v b="$backend" '$1 == b { if ($2 > w) w = $2; if (j == "" || $3 < j) j = $3 }
      END { if (j != "") printf "%-8s hot fairness: longest wait %.0f ms, lowest Jain index %.6f\n", b, w, j }' \
      "$WORK/fairness"
  done
fi
psql_q -d postgres -c "DROP DATABASE IF EXISTS $PG_DB WITH (FORCE)"
psql_q -d postgres -c "DROP DATABASE IF EXISTS $PG_BASELINE_DB WITH (FORCE)"
