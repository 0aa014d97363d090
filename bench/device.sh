#!/usr/bin/env bash
# bench/device.sh [ROUNDS] [SECONDS] -- faultline's disk vs its peers, side by side in one run.
#
# All candidates run at once, idle until measured: the peers of ../shared/bench (ceiling loop over
# tmpfs, a minimal C libfuse RAM disk, nbdkit memory + error/delay filters via nbdfuse, the
# libfuse 3.19 FUSE-over-io_uring RAM disk) and faultline. Each device's 512 MiB is written once
# before measuring (steady state).
#
# The candidates take turns inside one fio run each: per point of fio-points.sh (same fio
# arguments) every candidate gets ONE time-based fio run (threads, so one signal stops a run
# whole), all stopped (SIGSTOP); then ROUNDS (default 40) rounds in which each runs alone for a
# window of SECONDS (default 0.5; SIGCONT, 50 ms to settle, the window, SIGSTOP), the order
# reversed every other round (bench/lib.sh fio_turns). A window's IOPS come from fio's IOPS log
# (100 ms averages). Each ratio is the median over rounds of the same round's window ratio
# (paired), with a bootstrap 90% interval (bench/windows.py); IOPS tables are median windows.
# Windows, not whole runs per candidate: this VM's throughput moves by a quarter between runs
# seconds apart (other tenants), faster than rounds of whole runs can pair away (BENCHMARKS.md,
# "Measuring in turns"). The order of the turns
# puts faultline next to the ceiling loop and the io_uring peer, whose ratios lie closest to
# their targets.
#
# The rules overhead is the smallest difference measured, so it has a phase of its own: 100,000
# rules that never match (50,000 content, 50,000 offset: gen-rules.py) are armed on the
# faultline disk through its control socket, then per point ONE fio run in which they are
# paused and resumed in turns (`fault pause`: the disk matches nothing, as one without rules;
# `fault resume`: all 100k match again; both instant), RULES_ROUNDS (default 100) rounds of a
# window with rules and one without, RULES_SECS (default 0.5) each, order alternating by round.
# Re-arming the rules per window (a parse of 100k rules) would spend the time on transitions
# (BENCHMARKS.md, "Measuring in turns"). The overhead is the median over rounds of the paired loss, with
# its bootstrap 90% interval. Last line:
#   min_ratio_vs_libfuse=R1 min_ratio_vs_nbdkit=R2 min_ratio_vs_libfuse_uring=R3 rules_overhead_pct=P qd32_vs_ceiling=C
# C is faultline's ratio to the ceiling loop at rr4k-qd32. Each round also records where the host
# placed the VM's two CPUs (bench/lib.sh xcpu_ns): `far_rounds=K/N` counts the rounds whose CPUs
# shared no cache (cross-CPU round trip above XCPU_FAR_NS, default 200), and where there were
# any, the ratios over each kind of round follow apart, "near/far" (every candidate slows down in
# far rounds, by different amounts). The libfuse-over-io_uring peer is
# skipped, with the reason printed and R3 reported as "skipped", where the kernel lacks FUSE over
# io_uring. RING_THREADS_AB=1 adds `faultline-1thread` (faultline with --ring-threads 1: one ring
# thread for every CPU queue) to compare with the default (one ring per CPU queue,
# frontend/uring/shared.rs) in the same turns. MAX_BACKGROUND_AB=N adds `faultline-bg`
# (faultline's defaults, its FUSE connection's max_background set to N and congestion_threshold
# to 3/4 of it after the start; faultline asks for 12 over io_uring) and prints its ratio to the
# default.
#
# faultline runs with its defaults, among them `--cpu-latency auto`: while its disk has
# requests, idle CPUs poll instead of halting (frontend/cpu_latency.rs), which the peers do not
# ask for. HOLD_CPU_LATENCY=1 makes the bench itself hold that setting for the whole run, so
# every candidate is measured with polling CPUs: the comparison of the designs alone.
# POINTS="w128k-qd1 ..." runs only the points named (for a quick look at one of them).
# KEEP=DIR keeps the raw results (windows, fio's IOPS logs) for a second look.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
# the shared folder's bench/ (the peers) sits beside the repository
peers=${FAULTLINE_PEERS:-$(dirname "$top")/shared/bench}
rounds=${1:-40}
secs=${2:-0.5}
. "$here/lib.sh"
need_peers device.sh
bash "$top/scripts/setup.sh"
fl="$top/target/release/faultline"
hold_cpu_latency "every candidate"
work=$(mktemp -d)
python3 "$here/gen-rules.py" 50000 > "$work/rules.yaml"
rules_rounds=${RULES_ROUNDS:-100}
rules_secs=${RULES_SECS:-0.5}
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
  if [ -n "${KEEP:-}" ]; then
    mkdir -p "$KEEP" && cp -r "$work"/turns "$work"/rules-windows "$work"/iops.rules.* "$KEEP"/ 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

declare -A dev
dev[ceiling]=$(bash "$peers/ceiling-loop.sh" start 1024)
dev[libfuse]=$(bash "$peers/peer-libfuse.sh" start)
dev[nbdkit]=$(bash "$peers/peer-nbdkit.sh" start)
dev[faultline]=$(start_faultline fl '')
# the order of the turns: faultline between the ceiling loop and the io_uring peer
names=(libfuse nbdkit ceiling faultline)
if uring_dev=$(bash "$peers/peer-libfuse-uring.sh" start 2>"$work/uring.err"); then
  dev[libfuse-uring]=$uring_dev; names+=(libfuse-uring)
else
  echo "libfuse-uring peer skipped: $(tail -1 "$work/uring.err")" >&2
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
# precondition: write each device's measured 512 MiB once, so every window measures allocated,
# steady-state storage (first writes allocate memory in every candidate)
for n in "${names[@]}"; do
  fio --name=pre --filename="${dev[$n]}" --direct=1 --size=512M --rw=write --bs=1M --ioengine=psync --output-format=terse >/dev/null 2>&1
done
echo "devices: $(for n in "${names[@]}"; do printf '%s=%s ' "$n" "${dev[$n]}"; done)" >&2

# fio exactly as fio-points.sh runs each point
points=("w4k-qd1|--rw=write --bs=4k --ioengine=psync" "rr4k-qd1|--rw=randread --bs=4k --ioengine=psync"
        "rr4k-qd32|--rw=randread --bs=4k --ioengine=libaio --iodepth=32" "w128k-qd1|--rw=write --bs=128k --ioengine=psync")
# a subset, e.g. POINTS="w128k-qd1 rr4k-qd32" (the last line then covers only these)
select_points device.sh
mkdir -p "$work/turns"
for p in "${points[@]}"; do
  IFS='|' read -r pname pargs <<< "$p"
  echo "== $pname: $rounds rounds of ${secs}s windows, ${names[*]} in turns" >&2
  read -ra fio_args <<< "$pargs"
  fio_turns "$work/turns/$pname" "$rounds" "$secs" "${names[@]}"
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

python3 - "$work" "$here" <<'PY'
import sys, statistics, os
from collections import defaultdict
sys.path.insert(0, sys.argv[2])
from windows import fio_slots, window_iops, interval, fio_turns, placement, split_rounds
work = sys.argv[1]
order = ["w4k-qd1", "rr4k-qd1", "rr4k-qd32", "w128k-qd1"]
points = [p for p in order if os.path.isdir(os.path.join(work, "turns", p))]
# win[point][round][name] = (window IOPS, CPU per I/O: none counted here)
win = {p: fio_turns(os.path.join(work, "turns", p), f"{p}: ") for p in points}
names = [n for n in ["ceiling", "libfuse", "nbdkit", "libfuse-uring", "faultline", "faultline-1thread", "faultline-bg"]
         if n in next(iter(win[points[0]].values()))]
med = lambda p, n: statistics.median(v[n][0] for v in win[p].values())
def ratios(p, a, b, rounds=None):  # per round: a's window IOPS over b's (all rounds, or those named)
    return [v[a][0] / v[b][0] for r, v in win[p].items() if rounds is None or r in rounds]
def paired(p, a, b):
    per = ratios(p, a, b)
    return statistics.median(per), interval(per)
print(f"{'IOPS (median)':<16}" + "".join(f"{p:>12}" for p in points))
for n in names:
    print(f"{n:<16}" + "".join(f"{med(p, n):>12.0f}" for p in points))
def ratio_line(label, a, b):
    got = {p: paired(p, a, b) for p in points}
    print(f"{label:<24}" + " ".join(f"{p}={m:.2f}" for p, (m, _) in got.items()))
    print(f"{'  90% interval':<24}" + " ".join(f"{p}=[{lo:.2f},{hi:.2f}]" for p, (_, (lo, hi)) in got.items()))
    return {p: m for p, (m, _) in got.items()}
r1 = ratio_line("ratio vs libfuse", "faultline", "libfuse")
r2 = ratio_line("ratio vs nbdkit", "faultline", "nbdkit")
r3 = ratio_line("ratio vs libfuse-uring", "faultline", "libfuse-uring") if "libfuse-uring" in names else None
rc = ratio_line("ratio vs ceiling", "faultline", "ceiling")
if "faultline-1thread" in names:
    ratio_line("1thread/default", "faultline-1thread", "faultline")
if "faultline-bg" in names:
    ratio_line("bg/default", "faultline-bg", "faultline")
# by host placement: the same ratios over the rounds whose CPUs shared a cache and over those
# whose CPUs did not (bench/lib.sh xcpu_ns), where both kinds occurred
ns = {p: placement(os.path.join(work, "turns", p, "windows")) for p in points}
split = {p: split_rounds(ns[p]) for p in points}
far_rounds = sum(len(f) for _, f in split.values())
fmt = lambda rs, p: f"{len(rs)}@{statistics.median(ns[p][r] for r in rs):.0f}ns" if rs else "0"
if any(ns.values()):
    print(f"{'host placement':<24}" + " ".join(f"{p}=near {fmt(n, p)}/far {fmt(f, p)}" for p, (n, f) in split.items()))
if far_rounds:
    def by_place(label, a, b):
        def m(p, rs):
            v = ratios(p, a, b, set(rs))
            return f"{statistics.median(v):.2f}" if len(v) >= 3 else "-"
        print(f"{'  ' + label + ' near/far':<28}" + " ".join(f"{p}={m(p, n)}/{m(p, f)}" for p, (n, f) in split.items()))
    by_place("vs nbdkit", "faultline", "nbdkit")
    by_place("vs libfuse", "faultline", "libfuse")
    if "libfuse-uring" in names:
        by_place("vs libfuse-uring", "faultline", "libfuse-uring")
    by_place("vs ceiling", "faultline", "ceiling")
# rules overhead: per round of the rules phase, the loss of the window with 100k rules against
# the same round's window without
rw = defaultdict(dict)   # rw[point][round][mode] = (t0, t1)
for line in open(os.path.join(work, "rules-windows")):
    p, r, m, t0, t1 = line.split()
    rw[p].setdefault(r, {})[m] = (float(t0), float(t1))
ov, ci, rules_iops, none_iops = {}, {}, {}, {}
for p in points:
    slots = fio_slots(os.path.join(work, f"iops.rules.{p}"))
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
print("rules phase, median window IOPS without / with 100k rules: " + " ".join(f"{p}={none_iops[p]:.0f}/{rules_iops[p]:.0f}" for p in points))
print(f"{'rules overhead %':<24}" + " ".join(f"{p}={ov[p]:.1f}" for p in points))
print(f"{'  90% interval':<24}" + " ".join(f"{p}=[{ci[p][0]:.1f},{ci[p][1]:.1f}]" for p in points))
print(f"(ratios: median over {len(win[points[0]])} rounds of the same round's window ratio; rules: over "
      f"{len(next(iter(rw.values())))} rounds of the paired window loss; intervals: bootstrap over rounds)")
r3s = f"{min(r3.values()):.2f}" if r3 else "skipped"
qd32 = f"{rc['rr4k-qd32']:.3f}" if "rr4k-qd32" in rc else "skipped"
print(f"min_ratio_vs_libfuse={min(r1.values()):.2f} min_ratio_vs_nbdkit={min(r2.values()):.2f} min_ratio_vs_libfuse_uring={r3s} rules_overhead_pct={max(ov.values()):.1f} qd32_vs_ceiling={qd32} far_rounds={far_rounds}/{sum(len(n) + len(f) for n, f in split.values())}")
PY
