#!/usr/bin/env bash
# bench/device.sh [ROUNDS] [SECONDS] -- faultline's disk vs its peers, side by side in one run.
#
# Part 1: peers (../shared/bench: ceiling loop over tmpfs, a minimal C libfuse RAM disk, nbdkit
# memory + error/delay filters via nbdfuse) and faultline without rules, each measured with
# fio-points.sh, interleaved over ROUNDS rounds (median per point).
# Part 2: rules overhead, A/B on one faultline disk: alternately no rules and 50,000 content +
# 50,000 offset rules that never match (armed through the control socket), ROUNDS times each,
# so process placement and device differences cancel out. Last line:
#   min_ratio_vs_libfuse=R1 min_ratio_vs_nbdkit=R2 rules_overhead_pct=P
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
peers=${FAULTLINE_PEERS:-$top/../shared/bench}
rounds=${1:-5}
secs=${2:-3}
[ -d "$peers" ] || { echo "peer scripts not found at $peers (set FAULTLINE_PEERS)" >&2; exit 2; }
bash "$top/scripts/setup.sh"
fl="$top/target/release/faultline"
work=$(mktemp -d)
python3 "$here/gen-rules.py" 50000 > "$work/rules.yaml"

start_faultline() { # $1 = rules file or empty
  local args=(serve --size 1GiB --socket "$work/fl.sock")
  [ -n "$1" ] && args+=(--rules "$1")
  # runs inside $(...): remember the pid in a file, not a variable
  "$fl" "${args[@]}" > "$work/fl.out" 2> "$work/fl.err" &
  echo $! > "$work/fl.pid"
  for _ in $(seq 600); do [ -s "$work/fl.out" ] && break; sleep 0.1; done
  head -1 "$work/fl.out"
}
stop_faultline() {
  [ -f "$work/fl.pid" ] || return 0
  local p; p=$(cat "$work/fl.pid"); rm -f "$work/fl.pid" "$work/fl.out"
  kill -TERM "$p" 2>/dev/null || true
  while kill -0 "$p" 2>/dev/null; do sleep 0.1; done
}
cleanup() {
  stop_faultline
  for p in ceiling-loop peer-libfuse peer-nbdkit; do bash "$peers/$p.sh" stop >/dev/null 2>&1 || true; done
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

measure() { # name start-cmd stop-cmd
  local name=$1 dev
  dev=$(eval "$2")
  [ -b "$dev" ] || { echo "$name did not start (got '$dev')" >&2; exit 1; }
  echo "$name $(bash "$peers/fio-points.sh" "$dev" "$secs")" | tee -a "$work/results" >&2
  eval "$3" >/dev/null 2>&1
}

for r in $(seq "$rounds"); do
  echo "== peers, round $r/$rounds" >&2
  measure ceiling "bash $peers/ceiling-loop.sh start 1024" "bash $peers/ceiling-loop.sh stop"
  measure libfuse "bash $peers/peer-libfuse.sh start" "bash $peers/peer-libfuse.sh stop"
  measure nbdkit "bash $peers/peer-nbdkit.sh start" "bash $peers/peer-nbdkit.sh stop"
  measure faultline "start_faultline ''" "stop_faultline"
done

echo "== rules overhead: one disk, rules armed and cleared in turn" >&2
dev=$(start_faultline '')
ctl() { "$fl" fault --socket "$work/fl.sock" "$@" >/dev/null; }
for r in $(seq "$rounds"); do
  ctl clear
  echo "faultline-ab $(bash "$peers/fio-points.sh" "$dev" "$secs")" | tee -a "$work/results" >&2
  ctl add "$work/rules.yaml"
  echo "faultline-ab+100k $(bash "$peers/fio-points.sh" "$dev" "$secs")" | tee -a "$work/results" >&2
done
stop_faultline

python3 - "$work/results" <<'PY'
import sys, statistics
from collections import defaultdict
vals = defaultdict(lambda: defaultdict(list))
for line in open(sys.argv[1]):
    name, *kv = line.split()
    for p in kv:
        k, v = p.split("=")
        vals[name][k].append(int(v))
points = ["w4k-qd1", "rr4k-qd1", "rr4k-qd32", "w128k-qd1"]
med = {n: {p: statistics.median(vals[n][p]) for p in points} for n in vals}
print(f"{'IOPS (median)':<16}" + "".join(f"{p:>12}" for p in points))
for n in ["ceiling", "libfuse", "nbdkit", "faultline", "faultline-ab", "faultline-ab+100k"]:
    print(f"{n:<16}" + "".join(f"{med[n][p]:>12.0f}" for p in points))
fl = med["faultline"]
ab, rl = med["faultline-ab"], med["faultline-ab+100k"]
r1 = {p: fl[p] / med["libfuse"][p] for p in points}
r2 = {p: fl[p] / med["nbdkit"][p] for p in points}
ov = {p: 100 * (1 - rl[p] / ab[p]) for p in points}
print("ratio vs libfuse " + " ".join(f"{p}={r1[p]:.2f}" for p in points))
print("ratio vs nbdkit  " + " ".join(f"{p}={r2[p]:.2f}" for p in points))
print("rules overhead % " + " ".join(f"{p}={ov[p]:.1f}" for p in points))
print(f"min_ratio_vs_libfuse={min(r1.values()):.2f} min_ratio_vs_nbdkit={min(r2.values()):.2f} rules_overhead_pct={max(ov.values()):.1f}")
PY
