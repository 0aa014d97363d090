#!/bin/bash
# bench/workload.sh [ROUNDS] [SECONDS] -- fio vs `faultline workload`, same run, same device: the
# ceiling loop device of ../shared/bench (no interception), at fio-points.sh's four points plus
# 4 KiB random write QD32 io_uring.
# Per point, ONE fio run (--thread, time-based, its 100 ms IOPS log) and ONE `faultline workload`
# run (--jsonl, its 100 ms series) take turns on the device: both start and are stopped
# (SIGSTOP), then each round gives each tool a window of SECONDS (default 0.5; SIGCONT, 50 ms to
# settle, the window, SIGSTOP), which tool goes first swapping every round, ROUNDS rounds
# (default 30). A window's IOPS is the mean of the 100 ms intervals wholly inside it; its CPU per
# I/O is the CPU time of all the tool's threads in the window (schedstat, the same for both
# tools) over its I/Os. Per point, the IOPS ratio and the CPU-per-I/O ratio are the medians over
# rounds of the round's paired ratio (the two windows are a second apart, so the machine's
# drifts cancel), with bootstrap 90% intervals. HOLD_CPU_LATENCY=1 holds a 0 us CPU wake-up
# latency (/dev/cpu_dma_latency) for the whole run, the same for both tools: at QD1 a VM's idle
# CPUs otherwise halt between I/Os and the points measure the host's wake-ups more than the
# engines. POINTS="rr4k-qd1 w128k-qd1" runs only those points.
# Last line: min_iops_ratio_vs_fio=R cpu_per_io_ratio_vs_fio=C (R: worst point; C: worst point).
set -euo pipefail
cd "$(dirname "$0")/.."
top=$(pwd)
here=$top/bench
. scripts/env.sh
rounds=${1:-30}
secs=${2:-0.5}
. bench/lib.sh
hold_cpu_latency "both tools"
# the shared folder (peers, fio points) sits beside the repository
shared=${FAULTLINE_SHARED:-$(dirname "$top")/shared}
[ -d "$shared/bench" ] || { echo "workload.sh: shared bench scripts not found at $shared/bench (expected beside the repository; set FAULTLINE_SHARED to the shared folder)" >&2; exit 2; }
. "$shared/bench/_deps.sh"
cargo build --release --quiet --bin faultline
contentspeed=$(micro_build contentspeed)
bin=target/release/faultline
tmp=$(mktemp -d)
dev=""
declare -A qpid pid  # the two stopped runs; whose CPU a window counts (the same)
cleanup() {
  local p
  for p in "${qpid[@]}"; do kill -CONT "$p" 2>/dev/null; kill -TERM "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  [ -n "$dev" ] && "$shared/bench/ceiling-loop.sh" stop
  rm -rf "$tmp"
}
trap cleanup EXIT INT TERM
export FAULTLINE_PEER_STATE=$tmp/peers
dev=$("$shared/bench/ceiling-loop.sh" start 1024)

points=(
  "w4k-qd1|--rw=write --bs=4k --ioengine=psync|--pattern sequential --write-pct 100 --bs 4KiB --engine psync"
  "rr4k-qd1|--rw=randread --bs=4k --ioengine=psync|--pattern uniform --write-pct 0 --bs 4KiB --engine psync"
  "rr4k-qd32|--rw=randread --bs=4k --ioengine=libaio --iodepth=32|--pattern uniform --write-pct 0 --bs 4KiB --engine io_uring --iodepth 32"
  "w128k-qd1|--rw=write --bs=128k --ioengine=psync|--pattern sequential --write-pct 100 --bs 128KiB --engine psync"
  "rw4k-qd32-uring|--rw=randwrite --bs=4k --ioengine=io_uring --iodepth=32|--pattern uniform --write-pct 100 --bs 4KiB --engine io_uring --iodepth 32"
  # not in the summary: fio made to generate fresh data per write too (faultline always does)
  "(w128k-refill)|--rw=write --bs=128k --ioengine=psync --refill_buffers|--pattern sequential --write-pct 100 --bs 128KiB --engine psync"
)
select_points workload.sh
xcpu_build || echo "bench/micro/xcpu.rs did not build; host placement not recorded" >&2
echo "device $dev (ceiling loop over tmpfs), $rounds rounds of ${secs}s windows per point, fio and faultline in turns"
printf "%-16s %10s %10s %7s %-15s %9s %9s %7s %s\n" point fio_iops fl_iops ratio "[90%]" fio_us/io fl_us/io ratio "[90%]"
: > "$tmp/summary"
for p in "${points[@]}"; do
  IFS='|' read -r name fargs largs <<< "$p"
  rm -rf "$tmp/p" && mkdir -p "$tmp/p"
  # shellcheck disable=SC2086
  fio --name=p --thread --filename="$dev" --direct=1 --size=512M $fargs --runtime=100000 --time_based \
    --write_iops_log="$tmp/p/io" --log_avg_msec=100 --log_unix_epoch=1 > /dev/null 2> "$tmp/p/fio.err" &
  qpid[fio]=$! pid[fio]=$!
  # shellcheck disable=SC2086
  $bin workload --device "$dev" --span 512MiB $largs --duration 100000s --interval 100ms --jsonl > "$tmp/p/series" 2> "$tmp/p/fl.err" &
  qpid[fl]=$! pid[fl]=$!
  for _ in $(seq 200); do [ -s "$tmp/p/series" ] && break; sleep 0.05; done
  [ -s "$tmp/p/series" ] || { echo "faultline workload did not start: $(cat "$tmp/p/fl.err")" >&2; exit 1; }
  kill -STOP "${qpid[fio]}" "${qpid[fl]}"
  take_turns "$tmp/p/windows" "$rounds" "$secs" fio fl
  # fio stops on SIGINT; faultline, a background job of this non-interactive shell, ignores it
  kill -CONT "${qpid[fio]}" "${qpid[fl]}"; kill -INT "${qpid[fio]}"; kill -TERM "${qpid[fl]}"
  for n in fio fl; do end_or_kill "${qpid[$n]}" "$n"; done
  qpid=() pid=()
  cat "$tmp/p"/io_iops.*.log > "$tmp/p/iops.fio"
  python3 - "$tmp/p" "$here" "$name" "$tmp/summary" <<'PY'
import json, os, statistics as st, sys
d, name, summary = sys.argv[1], sys.argv[3], sys.argv[4]
sys.path.insert(0, sys.argv[2])
from windows import fio_slots, interval, turns, placement, split_rounds
fio = fio_slots(os.path.join(d, "iops.fio"))
fl, start = {}, None   # faultline's series: end of each 100 ms interval (epoch ms) -> I/Os per second
for line in open(os.path.join(d, "series")):
    o = json.loads(line)
    if "start_ns" in o:
        start = o["start_ns"] / 1e6
    elif "t_s" in o and start is not None:
        fl[round(start + o["t_s"] * 1000)] = o["ops"] * 10
w = turns(os.path.join(d, "windows"), {"fio": fio, "fl": fl}, f"{name}: ")  # round -> tool -> (IOPS, ns CPU per I/O)
ratio = [v["fl"][0] / v["fio"][0] for v in w.values()]
cpu = [v["fl"][1] / v["fio"][1] for v in w.values()]
med = lambda n, k: st.median(v[n][k] for v in w.values())
(lo, hi), (clo, chi) = interval(ratio), interval(cpu)
print(f"{name:<16} {med('fio', 0):10.0f} {med('fl', 0):10.0f} {st.median(ratio):7.3f} [{lo:.3f},{hi:.3f}]  "
      f"{med('fio', 1) / 1e3:9.2f} {med('fl', 1) / 1e3:9.2f} {st.median(cpu):7.3f} [{clo:.3f},{chi:.3f}]")
near, far = split_rounds(placement(os.path.join(d, "windows")))
if near or far:
    # k: 0 IOPS, 1 CPU per I/O
    sub = lambda rs, k: f"{st.median(w[r]['fl'][k] / w[r]['fio'][k] for r in rs if r in w):.3f}" if len(rs) >= 3 else "-"
    print(f"{'':<16} host placement (bench/lib.sh xcpu_ns): {len(near)} rounds near, {len(far)} far; "
          f"IOPS ratio near {sub(near, 0)}, far {sub(far, 0)}; CPU per I/O ratio near {sub(near, 1)}, far {sub(far, 1)}")
if not name.startswith("("):
    with open(summary, "a") as f:
        f.write(f"{st.median(ratio)} {st.median(cpu)}\n")
PY
done
"$contentspeed"
echo "(ratios: faultline / fio, median over rounds of the round's paired ratio; intervals: bootstrap over rounds)"
python3 -c 'import sys; v=[list(map(float,l.split())) for l in open(sys.argv[1])]; print("min_iops_ratio_vs_fio=%.3f cpu_per_io_ratio_vs_fio=%.3f" % (min(x[0] for x in v), max(x[1] for x in v)))' "$tmp/summary"
