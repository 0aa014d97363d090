#!/usr/bin/env bash
# bench/device.sh [ROUNDS] [SECONDS] -- faultline's disk vs its peers, side by side in one run.
#
# All candidates run at once, idle until measured: the peers of ../shared/bench (ceiling loop over
# tmpfs, a minimal C libfuse RAM disk, nbdkit memory + error/delay filters via nbdfuse) and
# faultline. Each device's 512 MiB is written once before measuring (steady state). Each round
# runs each of fio-points.sh's four points (same fio arguments) on every candidate back to back,
# in an order rotated per round, so the machine's slow drift (other tenants; QD1 swings 20-30%
# over minutes here) lands on all candidates alike. Ratios are the median over rounds of the
# per-round ratio (paired); IOPS tables are medians.
#
# The rules overhead is the smallest difference measured, too small for separate 3 s runs on
# this machine, so it has a phase of its own: 100,000 rules that never match (50,000 content,
# 50,000 offset: gen-rules.py) are armed on the faultline disk through its control socket, then
# per point ONE fio run in which they are paused and resumed in turns (`fault pause`: the disk
# matches nothing, as one without rules; `fault resume`: all 100k match again; both instant),
# RULES_ROUNDS (default 100) rounds of a window with rules and one without, RULES_SECS (default
# 0.5) each, order alternating by round. Short adjacent windows and instant toggles: this VM's
# throughput moves fast (other tenants), so only more measured time narrows the interval, and
# re-arming the rules per window (a parse of 100k rules) would spend it on transitions
# (BENCHMARKS.md, session 19). A window opens 50 ms after its toggle returned; its IOPS come from
# fio's IOPS log (100 ms averages).
# The overhead is the median over rounds of the paired loss, with a bootstrap 90% interval
# (bench/windows.py) that shows whether the rounds resolve the 3% target. Last line:
#   min_ratio_vs_libfuse=R1 min_ratio_vs_nbdkit=R2 min_ratio_vs_libfuse_uring=R3 rules_overhead_pct=P qd32_vs_ceiling=C
# QD32 against the ceiling loop has a phase of its own for the same reason: the ceiling's QD32
# IOPS move by a quarter between 3 s runs here. Two fio runs of the rr4k-qd32 point (threads, so
# one signal stops a run whole), one on the ceiling loop and one on faultline, take turns: one
# runs for a window while the other is stopped (SIGSTOP), QD32_ROUNDS (default 60) rounds of
# QD32_SECS (default 0.5) each, order alternating by round; qd32_vs_ceiling is the median over
# rounds of faultline's window IOPS over the same round's ceiling window, with its 90% interval.
# The libfuse 3.19 FUSE-over-io_uring peer (one queue and thread per CPU) is skipped, with the
# reason printed and R3 reported as "skipped", where the kernel lacks FUSE over io_uring.
# RING_THREADS_AB=1 adds `faultline-1thread` (faultline with --ring-threads 1: one ring thread for
# every CPU queue, busy-polling between serial requests) to compare with the default (one ring
# per CPU queue, frontend/uring/shared.rs) in the same rounds. MAX_BACKGROUND_AB=N adds `faultline-bg` (faultline's defaults, its FUSE
# connection's max_background set to N and congestion_threshold to 3/4 of it after the start;
# faultline asks for 12 over io_uring, as libfuse leaves it) and prints its ratio to the default.
#
# faultline runs with its defaults, among them `--cpu-latency auto`: while its disk has
# requests, idle CPUs poll instead of halting (frontend/cpu_latency.rs), which the peers do not
# ask for. HOLD_CPU_LATENCY=1 makes the bench itself hold that setting for the whole run, so
# every candidate is measured with polling CPUs: the comparison of the designs alone.
# POINTS="w128k-qd1 ..." runs only the points named (for a quick look at one of them).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
# the shared folder's bench/ (the peers) sits beside the repository
peers=${FAULTLINE_PEERS:-$(dirname "$top")/shared/bench}
rounds=${1:-5}
secs=${2:-3}
[ -d "$peers" ] || { echo "device.sh: peer scripts not found at $peers (expected in the shared folder beside the repository; set FAULTLINE_PEERS to its bench/)" >&2; exit 2; }
bash "$top/scripts/setup.sh"
fl="$top/target/release/faultline"
. "$here/lib.sh"
hold_cpu_latency "every candidate"
work=$(mktemp -d)
python3 "$here/gen-rules.py" 50000 > "$work/rules.yaml"
rules_rounds=${RULES_ROUNDS:-100}
rules_secs=${RULES_SECS:-0.5}
qd32_rounds=${QD32_ROUNDS:-60}
qd32_secs=${QD32_SECS:-0.5}
fpid=""
declare -A qpid pid  # pid: none, fio_turns reads no daemon CPU here

start_faultline() { # $1 = name, $2 = rules file or empty, then extra serve arguments; prints the device
  local args=(serve --size 1GiB --socket "$work/$1.sock")
  [ -n "$2" ] && args+=(--rules "$2")
  args+=("${@:3}")
  "$fl" "${args[@]}" > "$work/$1.out" 2> "$work/$1.err" &
  echo $! > "$work/$1.pid"
  for _ in $(seq 600); do [ -s "$work/$1.out" ] && break; sleep 0.1; done
  head -1 "$work/$1.out"
}
stop_faultline() { # $1 = name
  [ -f "$work/$1.pid" ] || return 0
  local p; p=$(cat "$work/$1.pid"); rm -f "$work/$1.pid"
  kill -TERM "$p" 2>/dev/null || true
  while kill -0 "$p" 2>/dev/null; do sleep 0.1; done
}
cleanup() {
  [ -n "$fpid" ] && kill -INT "$fpid" 2>/dev/null && wait "$fpid" 2>/dev/null
  for q in "${qpid[@]}"; do kill -CONT "$q" 2>/dev/null; kill -INT "$q" 2>/dev/null; wait "$q" 2>/dev/null; done
  stop_faultline fl; stop_faultline fl1; stop_faultline flbg
  for p in ceiling-loop peer-libfuse peer-nbdkit peer-libfuse-uring; do bash "$peers/$p.sh" stop >/dev/null 2>&1 || true; done
  # KEEP=DIR keeps the raw results (rounds, windows, fio's IOPS logs) for a second look
  if [ -n "${KEEP:-}" ]; then
    mkdir -p "$KEEP" && cp -r "$work"/results "$work"/rules-windows "$work"/iops.rules.* "$work"/qd32 "$KEEP"/ 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

declare -A dev
dev[ceiling]=$(bash "$peers/ceiling-loop.sh" start 1024)
dev[libfuse]=$(bash "$peers/peer-libfuse.sh" start)
dev[nbdkit]=$(bash "$peers/peer-nbdkit.sh" start)
dev[faultline]=$(start_faultline fl '')
names=(ceiling libfuse nbdkit faultline)
if uring_dev=$(bash "$peers/peer-libfuse-uring.sh" start 2>"$work/uring.err"); then
  dev[libfuse-uring]=$uring_dev; names+=(libfuse-uring)
else
  echo "libfuse-uring peer skipped: $(tail -1 "$work/uring.err")" >&2
  echo "skipped: $(tail -1 "$work/uring.err")" > "$work/uring.skipped"
fi
if [ "${RING_THREADS_AB:-0}" = 1 ]; then
  dev[faultline-1thread]=$(start_faultline fl1 '' --ring-threads 1); names+=(faultline-1thread)
fi
if [ -n "${MAX_BACKGROUND_AB:-}" ]; then
  dev[faultline-bg]=$(start_faultline flbg ''); names+=(faultline-bg)
  conn=$(set_max_background "${dev[faultline-bg]}" "$MAX_BACKGROUND_AB")
  echo "faultline-bg: $conn max_background=$(cat "$conn/max_background")" >&2
fi
for n in "${names[@]}"; do
  [ -b "${dev[$n]}" ] || { echo "$n did not start (got '${dev[$n]}')" >&2; exit 1; }
done
# precondition: write each device's measured 512 MiB once, so every round (the first included)
# measures allocated, steady-state storage (first writes allocate memory in every candidate)
for n in "${names[@]}"; do
  fio --name=pre --filename="${dev[$n]}" --direct=1 --size=512M --rw=write --bs=1M --ioengine=psync --output-format=terse >/dev/null 2>&1
done
echo "devices: $(for n in "${names[@]}"; do printf '%s=%s ' "$n" "${dev[$n]}"; done)" >&2

# fio exactly as fio-points.sh runs each point
points=("w4k-qd1|--rw=write --bs=4k --ioengine=psync" "rr4k-qd1|--rw=randread --bs=4k --ioengine=psync"
        "rr4k-qd32|--rw=randread --bs=4k --ioengine=libaio --iodepth=32" "w128k-qd1|--rw=write --bs=128k --ioengine=psync")
# a subset, e.g. POINTS="w128k-qd1 rr4k-qd32" (the last line then covers only these)
select_points device.sh
iops() { # dev fio-args...
  local d=$1; shift
  fio --name=p --filename="$d" --direct=1 --size=512M --runtime="$secs" --time_based --output-format=json "$@" 2>/dev/null |
    python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]; print(int(j["read"]["iops"]+j["write"]["iops"]))'
}
for r in $(seq "$rounds"); do
  echo "== round $r/$rounds" >&2
  for p in "${points[@]}"; do
    IFS='|' read -r pname pargs <<< "$p"
    line="$pname"
    for k in $(seq 0 $((${#names[@]} - 1))); do
      n=${names[$(( (k + r) % ${#names[@]} ))]}
      # shellcheck disable=SC2086
      line="$line $n=$(iops "${dev[$n]}" $pargs)"
    done
    echo "$r $line" | tee -a "$work/results" >&2
  done
done

# the rules phase: 100k rules armed, then per point one fio run with them paused and resumed
ctl() { "$fl" fault --socket "$work/fl.sock" "$@" > /dev/null; }
ctl add "$work/rules.yaml"
ctl pause
: > "$work/rules-windows"
for p in "${points[@]}"; do
  IFS='|' read -r pname pargs <<< "$p"
  echo "== rules: $pname, $rules_rounds rounds of ${rules_secs}s windows with 100k rules resumed and paused" >&2
  # shellcheck disable=SC2086
  start_window_fio "$work" --filename="${dev[faultline]}" --direct=1 --size=512M $pargs
  sleep 1
  for r in $(seq "$rules_rounds"); do
    if (( r % 2 )); then order=(rules none); else order=(none rules); fi
    for m in "${order[@]}"; do
      if [ "$m" = rules ]; then ctl resume; fi
      sleep 0.05
      t0=$EPOCHREALTIME
      sleep "$rules_secs"
      t1=$EPOCHREALTIME
      if [ "$m" = rules ]; then ctl pause; fi
      echo "$pname $r $m $t0 $t1" >> "$work/rules-windows"
    done
  done
  stop_window_fio "$work" "$work/iops.rules.$pname"
done

# the QD32 phase: the ceiling loop and faultline take turns at rr4k-qd32, one fio run each
if [[ " ${points[*]} " == *" rr4k-qd32|"* ]]; then
  echo "== qd32: $qd32_rounds rounds of ${qd32_secs}s windows, ceiling loop and faultline in turns" >&2
  fio_args=(--rw=randread --bs=4k --ioengine=libaio --iodepth=32)
  fio_turns "$work/qd32" "$qd32_rounds" "$qd32_secs" ceiling faultline
fi

python3 - "$work/results" "$work/uring.skipped" "$work" "$here" <<'PY'
import sys, statistics, os
from collections import defaultdict
sys.path.insert(0, sys.argv[4])
from windows import fio_slots, window_iops, interval
vals = defaultdict(lambda: defaultdict(dict))   # vals[point][round][name] = iops
for line in open(sys.argv[1]):
    r, point, *kv = line.split()
    for x in kv:
        k, v = x.split("=")
        vals[point][r][k] = int(v)
points = [p for p in ["w4k-qd1", "rr4k-qd1", "rr4k-qd32", "w128k-qd1"] if p in vals]
first = next(iter(next(iter(vals.values())).values()))
names = [n for n in ["ceiling", "libfuse", "nbdkit", "libfuse-uring", "faultline", "faultline-1thread", "faultline-bg"] if n in first]
med = lambda p, n: statistics.median(v[n] for v in vals[p].values())
paired = lambda p, a, b: statistics.median(v[a] / v[b] for v in vals[p].values())
print(f"{'IOPS (median)':<16}" + "".join(f"{p:>12}" for p in points))
for n in names:
    print(f"{n:<16}" + "".join(f"{med(p, n):>12.0f}" for p in points))
r1 = {p: paired(p, "faultline", "libfuse") for p in points}
r2 = {p: paired(p, "faultline", "nbdkit") for p in points}
# rules overhead: per round of the rules phase, the loss of the window with 100k rules against
# the same round's window without
rw = defaultdict(dict)   # rw[point][round][mode] = (t0, t1)
for line in open(os.path.join(sys.argv[3], "rules-windows")):
    p, r, m, t0, t1 = line.split()
    rw[p].setdefault(r, {})[m] = (float(t0), float(t1))
ov, ci, rules_iops, none_iops = {}, {}, {}, {}
for p in points:
    slots = fio_slots(os.path.join(sys.argv[3], f"iops.rules.{p}"))
    per, with_rules, without = [], [], []
    for r, w in rw[p].items():
        a, b = window_iops(slots, *w["rules"]), window_iops(slots, *w["none"])
        if a is None or b is None:
            sys.exit(f"no IOPS samples inside a rules-phase window of {p} round {r}: is fio's log empty?")
        per.append(100 * (1 - a / b))
        with_rules.append(a)
        without.append(b)
    ov[p], ci[p] = statistics.median(per), interval(per)
    rules_iops[p], none_iops[p] = statistics.median(with_rules), statistics.median(without)
r3 = {p: paired(p, "faultline", "libfuse-uring") for p in points} if "libfuse-uring" in names else None
# QD32 vs the ceiling: per round of the QD32 phase, faultline's window over the ceiling's
qw = defaultdict(dict)   # qw[round][name] = (t0, t1)
qdir = os.path.join(sys.argv[3], "qd32")
for line in open(os.path.join(qdir, "windows")) if os.path.isdir(qdir) else []:
    r, n, t0, t1, _cpu = line.split()
    qw[r][n] = (float(t0), float(t1))
qd32, qd32_line = "skipped", None
if qw:
    qs = {n: fio_slots(os.path.join(qdir, f"iops.{n}")) for n in ("ceiling", "faultline")}
    per, wi = [], {"ceiling": [], "faultline": []}
    for r, w in qw.items():
        a, b = window_iops(qs["faultline"], *w["faultline"]), window_iops(qs["ceiling"], *w["ceiling"])
        if a is None or b is None:
            sys.exit(f"no IOPS samples inside a QD32-phase window of round {r}: is fio's log empty?")
        per.append(a / b)
        wi["faultline"].append(a)
        wi["ceiling"].append(b)
    lo, hi = interval(per)
    qd32 = f"{statistics.median(per):.3f}"
    qd32_line = (f"qd32 phase, median window IOPS ceiling / faultline: {statistics.median(wi['ceiling']):.0f}/{statistics.median(wi['faultline']):.0f}, "
                 f"faultline/ceiling {qd32} [{lo:.2f},{hi:.2f}] over {len(per)} rounds (the rounds above: {paired('rr4k-qd32', 'faultline', 'ceiling'):.2f})")
print("ratio vs libfuse " + " ".join(f"{p}={r1[p]:.2f}" for p in points))
if r3:
    print("ratio vs libfuse-uring " + " ".join(f"{p}={r3[p]:.2f}" for p in points))
if "faultline-1thread" in names:
    print("1thread/default  " + " ".join(f"{p}={paired(p, 'faultline-1thread', 'faultline'):.2f}" for p in points))
if "faultline-bg" in names:
    print("bg/default       " + " ".join(f"{p}={paired(p, 'faultline-bg', 'faultline'):.2f}" for p in points))
print("ratio vs nbdkit  " + " ".join(f"{p}={r2[p]:.2f}" for p in points))
print("rules phase, median window IOPS without / with 100k rules: " + " ".join(f"{p}={none_iops[p]:.0f}/{rules_iops[p]:.0f}" for p in points))
print("rules overhead % " + " ".join(f"{p}={ov[p]:.1f}" for p in points))
print("  90% interval   " + " ".join(f"{p}=[{ci[p][0]:.1f},{ci[p][1]:.1f}]" for p in points))
if qd32_line:
    print(qd32_line)
print(f"(ratios: median over rounds of the per-round ratio; rules: median over {len(next(iter(rw.values())))} rounds of the paired window loss, interval: bootstrap over rounds)")
r3s = f"{min(r3.values()):.2f}" if r3 else "skipped"
print(f"min_ratio_vs_libfuse={min(r1.values()):.2f} min_ratio_vs_nbdkit={min(r2.values()):.2f} min_ratio_vs_libfuse_uring={r3s} rules_overhead_pct={max(ov.values()):.1f} qd32_vs_ceiling={qd32}")
PY
