#!/bin/bash
# bench/workload.sh [SECONDS] -- fio vs `faultline workload`, same run, same device: the ceiling
# loop device of ../shared/bench (no interception), at fio-points.sh's four points plus 4 KiB
# random write QD32 io_uring. IOPS from each tool's own report; CPU per I/O = user+system CPU
# seconds of the whole process (wait4 rusage, the same for both) / I/Os completed.
# Each point runs REPS times (default 3) per tool, alternating (which tool goes first swaps every
# rep); best IOPS and best CPU/IO kept. HOLD_CPU_LATENCY=1 holds a 0 us CPU wake-up latency
# (/dev/cpu_dma_latency) for the whole run, the same for both tools: at QD1 a VM's idle CPUs
# otherwise halt between I/Os and the points measure the host's wake-ups more than the engines.
# Last line: min_iops_ratio_vs_fio=R cpu_per_io_ratio_vs_fio=C (R: worst point; C: worst point).
set -euo pipefail
cd "$(dirname "$0")/.."
top=$(pwd)
. scripts/env.sh
secs=${1:-3}
reps=${REPS:-3}
. bench/lib.sh
hold_cpu_latency "both tools"
# the shared folder (peers, fio points) sits beside the repository
shared=${FAULTLINE_SHARED:-$(dirname "$top")/shared}
[ -d "$shared/bench" ] || { echo "workload.sh: shared bench scripts not found at $shared/bench (expected beside the repository; set FAULTLINE_SHARED to the shared folder)" >&2; exit 2; }
. "$shared/bench/_deps.sh"
cargo build --release --quiet --bin faultline --example contentspeed
bin=target/release/faultline
tmp=$(mktemp -d)
dev=""
cleanup() { [ -n "$dev" ] && "$shared/bench/ceiling-loop.sh" stop; rm -rf "$tmp"; }
trap cleanup EXIT
export FAULTLINE_PEER_STATE=$tmp/peers
dev=$("$shared/bench/ceiling-loop.sh" start 1024)

# run CMD...: prints "CPU_SECONDS" of the finished child (its stdout goes to $tmp/out)
cpu_of() {
  python3 - "$@" <<'PY'
import os, sys
pid = os.fork()
if pid == 0:
    fd = os.open(os.environ["OUTFILE"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(fd, 1)
    os.execvp(sys.argv[1], sys.argv[1:])
_, status, ru = os.wait4(pid, 0)
if status != 0:
    sys.exit("command failed: " + " ".join(sys.argv[1:]))
print(ru.ru_utime + ru.ru_stime)
PY
}

# fio exactly as fio-points.sh runs it (plus its own JSON); prints "IOPS IOS CPU"
fio_point() {
  local cpu
  cpu=$(OUTFILE=$tmp/fio.json cpu_of fio --name=p --filename="$dev" --direct=1 --size=512M --runtime="$secs" --time_based --output-format=json "$@")
  python3 -c 'import json,sys; j=json.load(open(sys.argv[1]))["jobs"][0]; r,w=j["read"],j["write"]; print(r["iops"]+w["iops"], r["total_ios"]+w["total_ios"], sys.argv[2])' "$tmp/fio.json" "$cpu"
}
# faultline over the same 512 MiB; prints "IOPS IOS CPU"
fl_point() {
  local cpu
  cpu=$(OUTFILE=$tmp/fl.out cpu_of $bin workload --device "$dev" --span 512MiB --duration "${secs}s" --out "$tmp/flres" "$@")
  python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); r,w=j["read"],j["write"]; print(r["iops"]+w["iops"], r["ops"]+w["ops"], sys.argv[2])' "$tmp/flres/result.json" "$cpu"
}

best() { # best IOPS and best CPU per I/O over lines "IOPS IOS CPU"
  python3 -c 'import sys; v=[tuple(map(float,l.split())) for l in sys.stdin if l.strip()]; print(max(x[0] for x in v), min(x[2]/x[1] for x in v))'
}

points=(
  "w4k-qd1|--rw=write --bs=4k --ioengine=psync|--pattern sequential --write-pct 100 --bs 4KiB --engine psync"
  "rr4k-qd1|--rw=randread --bs=4k --ioengine=psync|--pattern uniform --write-pct 0 --bs 4KiB --engine psync"
  "rr4k-qd32|--rw=randread --bs=4k --ioengine=libaio --iodepth=32|--pattern uniform --write-pct 0 --bs 4KiB --engine io_uring --iodepth 32"
  "w128k-qd1|--rw=write --bs=128k --ioengine=psync|--pattern sequential --write-pct 100 --bs 128KiB --engine psync"
  "rw4k-qd32-uring|--rw=randwrite --bs=4k --ioengine=io_uring --iodepth=32|--pattern uniform --write-pct 100 --bs 4KiB --engine io_uring --iodepth 32"
  # not in the summary: fio made to generate fresh data per write too (faultline always does)
  "(w128k-refill)|--rw=write --bs=128k --ioengine=psync --refill_buffers|--pattern sequential --write-pct 100 --bs 128KiB --engine psync"
)
echo "device $dev (ceiling loop over tmpfs), ${secs}s per run, $reps runs per tool and point"
printf "%-16s %12s %12s %7s %12s %12s %7s\n" point fio_iops fl_iops ratio fio_us/io fl_us/io ratio
summary=$tmp/summary
: > "$summary"
for p in "${points[@]}"; do
  IFS='|' read -r name fargs largs <<< "$p"
  : > "$tmp/f"; : > "$tmp/l"
  for r in $(seq "$reps"); do
    # shellcheck disable=SC2086
    if (( r % 2 == 0 )); then fl_point $largs >> "$tmp/l"; fi
    # shellcheck disable=SC2086
    fio_point $fargs >> "$tmp/f"
    # shellcheck disable=SC2086
    if (( r % 2 == 1 )); then fl_point $largs >> "$tmp/l"; fi
  done
  read -r fi fc < <(best < "$tmp/f")
  read -r li lc < <(best < "$tmp/l")
  python3 -c 'import sys; n,fi,li,fc,lc=sys.argv[1],*map(float,sys.argv[2:]); print(f"{n:<16} {fi:12.0f} {li:12.0f} {li/fi:7.3f} {fc*1e6:12.2f} {lc*1e6:12.2f} {lc/fc:7.3f}")' "$name" "$fi" "$li" "$fc" "$lc"
  [[ $name == \(* ]] || echo "$fi $li $fc $lc" >> "$summary"
done
target/release/examples/contentspeed
python3 -c 'import sys; v=[list(map(float,l.split())) for l in open(sys.argv[1])]; print("min_iops_ratio_vs_fio=%.3f cpu_per_io_ratio_vs_fio=%.3f" % (min(x[1]/x[0] for x in v), max(x[3]/x[2] for x in v)))' "$summary"
