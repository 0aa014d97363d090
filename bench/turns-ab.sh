#!/usr/bin/env bash
# bench/turns-ab.sh [ROUNDS] [SECONDS] -- two faultline disks (A and B) at one fio point, in turns:
# one long fio run per disk (threads, so one signal stops a run whole), one running a window while
# the other is stopped (SIGSTOP), ROUNDS (default 60) rounds of SECONDS (default 0.5) windows,
# order alternating by round, as device.sh's QD32 phase. For differences of a few percent that
# separate 3 s runs on this VM cannot resolve (BENCHMARKS.md, "Measuring in turns"). Per round: B's window
# IOPS over A's, and each daemon's CPU per I/O in its window (schedstat of all its threads).
#   A_BIN / B_BIN     the builds (default target/release/faultline for both)
#   A_ARGS / B_ARGS   extra `serve` arguments (e.g. B_ARGS="--ring-threads 1")
#   A_ENV / B_ENV     extra environment for the serve process (e.g. B_ENV="FAULTLINE_X=1")
#   MAX_BACKGROUND_A / MAX_BACKGROUND_B  that disk's FUSE connection's max_background, written
#                     after the start (congestion_threshold at 3/4 of it)
#   CEILING=1         also run the ceiling loop (../shared/bench) as a third in the turns
#   FIO="..."         the point (default rr4k-qd32: --rw=randread --bs=4k --ioengine=libaio --iodepth=32)
#   HOLD_CPU_LATENCY=1 as in device.sh (bench/lib.sh)
# Last line: b_vs_a=R [lo,hi] cpu_per_io_a_us=X cpu_per_io_b_us=Y far_rounds=K/N (medians; 90% bootstrap
# interval; K of the N rounds had CPUs sharing no cache, bench/lib.sh xcpu_ns, and where some did and
# some did not, b_vs_a over each kind of round is printed before)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
peers=${FAULTLINE_PEERS:-$(dirname "$top")/shared/bench}
rounds=${1:-60}
secs=${2:-0.5}
. "$here/lib.sh"
[ "${CEILING:-0}" = 1 ] && need_peers turns-ab.sh
bash "$top/scripts/setup.sh"
hold_cpu_latency "both disks"
def="$top/target/release/faultline"
declare -A bin=([a]="${A_BIN:-$def}" [b]="${B_BIN:-$def}") args=([a]="${A_ARGS:-}" [b]="${B_ARGS:-}") envs=([a]="${A_ENV:-}" [b]="${B_ENV:-}")
declare -A mbg=([a]="${MAX_BACKGROUND_A:-}" [b]="${MAX_BACKGROUND_B:-}")
read -r -a fio_args <<< "${FIO:---rw=randread --bs=4k --ioengine=libaio --iodepth=32}"
work=$(mktemp -d)
declare -A dev pid qpid
names=(a b)
cleanup() {
  for n in "${!qpid[@]}"; do kill -CONT "${qpid[$n]}" 2>/dev/null; kill -INT "${qpid[$n]}" 2>/dev/null; wait "${qpid[$n]}" 2>/dev/null || true; done
  for n in a b; do
    [ -n "${pid[$n]:-}" ] || continue
    kill -TERM "${pid[$n]}" 2>/dev/null || true
    while kill -0 "${pid[$n]}" 2>/dev/null; do sleep 0.1; done
  done
  [ "${CEILING:-0}" = 1 ] && bash "$peers/ceiling-loop.sh" stop > /dev/null 2>&1
  rm -rf "$work"
}
trap cleanup EXIT INT TERM
for n in a b; do
  # shellcheck disable=SC2086
  env ${envs[$n]} "${bin[$n]}" serve --size 1GiB --socket "$work/$n.sock" ${args[$n]} > "$work/$n.out" 2> "$work/$n.err" &
  pid[$n]=$!
  for _ in $(seq 600); do [ -s "$work/$n.out" ] && break; sleep 0.1; done
  dev[$n]=$(head -1 "$work/$n.out")
  [ -b "${dev[$n]}" ] || { echo "$n did not start: $(cat "$work/$n.err")" >&2; exit 1; }
  if [ -n "${mbg[$n]}" ]; then
    set_max_background "${dev[$n]}" "${mbg[$n]}" > /dev/null
  fi
  echo "$n: ${envs[$n]} ${bin[$n]} serve ${args[$n]} -> ${dev[$n]}${mbg[$n]:+ max_background=${mbg[$n]}}" >&2
done
if [ "${CEILING:-0}" = 1 ]; then
  dev[ceiling]=$(bash "$peers/ceiling-loop.sh" start 1024); names+=(ceiling)
fi
for n in "${names[@]}"; do
  fio --name=pre --filename="${dev[$n]}" --direct=1 --size=512M --rw=write --bs=1M --ioengine=psync > /dev/null 2>&1
done
echo "== $rounds rounds of ${secs}s windows: ${names[*]} in turns, fio ${fio_args[*]}" >&2
fio_turns "$work" "$rounds" "$secs" "${names[@]}"
python3 - "$work" "$here" "${names[@]}" <<'PY'
import sys, statistics
sys.path.insert(0, sys.argv[2])
from windows import interval, fio_turns, placement, split_rounds
work, names = sys.argv[1], sys.argv[3:]
w = fio_turns(work)  # w[round][name] = (iops, cpu ns per I/O)
med = lambda n, k: statistics.median(v[n][k] for v in w.values())
for n in names:
    line = f"{n:<8} median window IOPS {med(n, 0):>9.0f}"
    if n != "ceiling":
        line += f"  daemon CPU per I/O {med(n, 1) / 1000:.2f} us"
    print(line)
per = [v["b"][0] / v["a"][0] for v in w.values()]
lo, hi = interval(per)
if "ceiling" in names:
    for n in ("a", "b"):
        pc = [v[n][0] / v["ceiling"][0] for v in w.values()]
        l, h = interval(pc)
        print(f"{n}/ceiling {statistics.median(pc):.3f} [{l:.3f},{h:.3f}]")
near, far = split_rounds(placement(work + "/windows"))
if near and far:
    for kind, rs in (("near", near), ("far", far)):
        v = [w[r]["b"][0] / w[r]["a"][0] for r in rs if r in w]
        if len(v) >= 3:
            l, h = interval(v)
            print(f"host placement {kind} ({len(v)} rounds): a {statistics.median(w[r]['a'][0] for r in rs if r in w):.0f} IOPS, b_vs_a {statistics.median(v):.3f} [{l:.3f},{h:.3f}]")
print(f"b_vs_a={statistics.median(per):.3f} [{lo:.3f},{hi:.3f}] cpu_per_io_a_us={med('a', 1) / 1000:.2f} cpu_per_io_b_us={med('b', 1) / 1000:.2f} far_rounds={len(far)}/{len(near) + len(far)}")
PY
