#!/usr/bin/env bash
# bench/serve-ab.sh [ROUNDS] [SECONDS] [SERVE-ARGS...] -- `faultline serve` with its defaults (A)
# vs with SERVE-ARGS (B; default `--busy-poll 0`), side by side in one run: both disks alive at
# once (an idle disk does not poll), each of fio-points.sh's four points run on both back to back
# per round, order alternating by round. Prints per point the median over rounds of the paired
# IOPS ratio (A / B) and of the daemon CPU time per I/O ratio (what A's extra speed costs).
#   bash bench/serve-ab.sh 10 2                  # busy polling vs none
#   bash bench/serve-ab.sh 10 2 --ring off       # FUSE over io_uring vs classic /dev/fuse
# HOLD_CPU_LATENCY=1 and POINTS="..." as in device.sh (bench/lib.sh). Last line:
#   min_iops_ratio=X max_cpu_per_io_ratio=Y
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
rounds=${1:-10}
secs=${2:-2}
shift $(( $# < 2 ? $# : 2 ))
b_args=("$@")
[ ${#b_args[@]} -gt 0 ] || b_args=(--busy-poll 0)
echo "A: serve (defaults)   B: serve ${b_args[*]}" >&2
bash "$top/scripts/setup.sh"
. "$here/lib.sh"
hold_cpu_latency "both disks"
fl="$top/target/release/faultline"
work=$(mktemp -d)
declare -A dev pid
cleanup() {
  for n in poll nopoll; do
    [ -n "${pid[$n]:-}" ] && kill -TERM "${pid[$n]}" 2>/dev/null && while kill -0 "${pid[$n]}" 2>/dev/null; do sleep 0.1; done
  done
  rm -rf "$work"
}
trap cleanup EXIT INT TERM
start() { # $1 = name, rest = extra serve args
  local n=$1; shift
  "$fl" serve --size 1GiB --socket "$work/$n.sock" "$@" > "$work/$n.out" 2> "$work/$n.err" &
  pid[$n]=$!
  for _ in $(seq 600); do [ -s "$work/$n.out" ] && break; sleep 0.1; done
  dev[$n]=$(head -1 "$work/$n.out")
  [ -b "${dev[$n]}" ] || { echo "$n did not start: $(cat "$work/$n.err")" >&2; exit 1; }
  fio --name=pre --filename="${dev[$n]}" --direct=1 --size=512M --rw=write --bs=1M --ioengine=psync >/dev/null 2>&1
}
start poll
start nopoll "${b_args[@]}"
ticks() { # CPU ticks (user+system) of a pid
  awk '{print $14 + $15}' "/proc/$1/stat"
}
points=("w4k-qd1|--rw=write --bs=4k --ioengine=psync" "rr4k-qd1|--rw=randread --bs=4k --ioengine=psync"
        "rr4k-qd32|--rw=randread --bs=4k --ioengine=libaio --iodepth=32" "w128k-qd1|--rw=write --bs=128k --ioengine=psync")
select_points serve-ab.sh
for r in $(seq "$rounds"); do
  echo "== round $r/$rounds" >&2
  if (( r % 2 )); then order=(poll nopoll); else order=(nopoll poll); fi
  for p in "${points[@]}"; do
    IFS='|' read -r pname pargs <<< "$p"
    line="$r $pname"
    for n in "${order[@]}"; do
      t0=$(ticks "${pid[$n]}")
      # shellcheck disable=SC2086
      ios=$(fio --name=p --filename="${dev[$n]}" --direct=1 --size=512M --runtime="$secs" --time_based --output-format=json $pargs 2>/dev/null |
        python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]; print(j["read"]["total_ios"]+j["write"]["total_ios"])')
      t1=$(ticks "${pid[$n]}")
      line="$line $n=$ios:$((t1 - t0))"
    done
    echo "$line" | tee -a "$work/results" >&2
  done
done
python3 - "$work/results" "$secs" <<'PY'
import sys, statistics
from collections import defaultdict
secs = float(sys.argv[2])
rows = defaultdict(list)  # point -> [(iops ratio, cpu/io ratio)]
iops = defaultdict(lambda: defaultdict(list))
for line in open(sys.argv[1]):
    r, point, *kv = line.split()
    d = {}
    for x in kv:
        k, v = x.split("=")
        ios, ticks = map(int, v.split(":"))
        d[k] = (ios, max(ticks, 1))
        iops[point][k].append(ios / secs)
    (pi, pt), (ni, nt) = d["poll"], d["nopoll"]
    rows[point].append((pi / ni, (pt / pi) / (nt / ni)))
points = [p for p in ["w4k-qd1", "rr4k-qd1", "rr4k-qd32", "w128k-qd1"] if p in rows]
print(f"{'':<24}" + "".join(f"{p:>12}" for p in points))
for n, label in [("nopoll", "B"), ("poll", "A")]:
    print(f"{'IOPS ' + label + ' (median)':<24}" + "".join(f"{statistics.median(iops[p][n]):>12.0f}" for p in points))
ri = {p: statistics.median(x[0] for x in rows[p]) for p in points}
rc = {p: statistics.median(x[1] for x in rows[p]) for p in points}
print(f"{'IOPS ratio A/B':<24}" + "".join(f"{ri[p]:>12.2f}" for p in points))
print(f"{'CPU/IO ratio A/B':<24}" + "".join(f"{rc[p]:>12.2f}" for p in points))
print("(daemon CPU from /proc/PID/stat, 10 ms ticks; ratios: median over rounds of the paired ratio)")
print(f"min_iops_ratio={min(ri.values()):.2f} max_cpu_per_io_ratio={max(rc.values()):.2f}")
PY
