#!/usr/bin/env bash
# bench/monitor-overhead.sh [ROUNDS] [SECONDS] -- what timing the storage stack costs the I/O it
# times. Points: fio's four raw-device points (as bench/device.sh runs them) on one faultline
# disk, and a fileserver-like file-system point (ext4 on the same disk: 4 threads over 256 files
# of 128 KiB, 2:1 writes to reads, 4 KiB buffered, fdatasync every 16 writes, so the journal and
# the block layer both work). Modes: nothing attached (bare); `faultline monitor --device` as
# experiments get it by default (monitor: the block and journal layers, aggregated in the
# kernel); the opt-in driver layer added (driver: `--layers journal,driver`, the FUSE request
# pair); ftrace (the block tracepoints queue and service times need, bio queue, request issue
# and completion, filtered to the device, in a tracefs instance of our own whose buffer is
# drained to /dev/null); perf (perf record of the same tracepoints and filters, all CPUs).
#
# Each point is ONE fio run; the modes take turns in windows of SECONDS (default 1) while it
# runs: a mode starts, the window opens once it is attached (plus 0.2 s), closes SECONDS later,
# and the mode stops before the next one starts; the transitions are outside every window. A
# round gives every mode one window, in an order rotated by round and reversed every other
# round (balanced when ROUNDS, default 20, is a multiple of twice the number of modes). A
# window's IOPS come from fio's own IOPS log (100 ms averages, Unix-epoch stamps), its CPU per
# I/O from the schedstat of fio's threads, the disk daemon's and the tracing tool's (monitor,
# perf, or the ftrace buffer's reader). A mode's overhead at a point is the median over
# rounds of its window's paired ratio against the same round's bare window (seconds apart, so
# the machine's slow drifts cancel), with a bootstrap 90% interval. Prints a table per point;
# the last line holds the worst point of each mode (IOPS loss, then CPU per I/O added):
#   monitor_overhead_pct=M ftrace_overhead_pct=F perf_overhead_pct=P driver_overhead_pct=D
#   monitor_cpu_pct=... ftrace_cpu_pct=... perf_cpu_pct=... driver_cpu_pct=...
# (P is "na" where perf is not installed.) Each round also records where the host placed the VM's
# CPUs (bench/lib.sh xcpu_ns); where some rounds had them sharing a cache and some not, each
# point's losses over the two kinds of round are printed apart.
# MODES="monitor base" limits the modes (bare always runs), POINTS="rr4k-qd1 fs-fileserver" the
# points. With MONITOR_BASE=BIN, a mode `base` runs `BIN monitor --device` as `monitor` does (an
# A/B of two builds' default monitor); it is in the table, not in the last line.
# HOLD_CPU_LATENCY=1 holds a 0 us CPU wake-up latency for the whole run (bench/lib.sh);
# SERVE_ARGS="--ring-threads 1" passes options to the disk's `faultline serve`.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
rounds=${1:-20}
secs=${2:-1}
bash "$top/scripts/setup.sh" >&2
. "$here/lib.sh"
fl="$top/target/release/faultline"
work=$(mktemp -d)
tr=/sys/kernel/tracing
inst=$tr/instances/faultline-overhead-$$
spid=""
mpid=""
fpid=""
events=(block/block_bio_queue block/block_rq_issue block/block_rq_complete)
cleanup() {
  if [ -d "$inst" ]; then
    for e in "${events[@]}"; do echo 0 > "$inst/events/$e/enable" 2>/dev/null || true; done
    rmdir "$inst" 2>/dev/null || true
  fi
  # the tracing tool and fio of a run cut short (an error, Ctrl-C) go too
  [ -n "$mpid" ] && kill -INT "$mpid" 2>/dev/null && wait "$mpid" 2>/dev/null
  [ -n "$fpid" ] && kill -INT "$fpid" 2>/dev/null && wait "$fpid" 2>/dev/null
  mountpoint -q "$work/mnt" 2>/dev/null && umount "$work/mnt"
  [ -n "$spid" ] && kill -TERM "$spid" 2>/dev/null && while kill -0 "$spid" 2>/dev/null; do sleep 0.1; done
  rm -rf "$work"
}
trap cleanup EXIT INT TERM
hold_cpu_latency "every mode"

# shellcheck disable=SC2086
"$fl" serve --size 1GiB --socket "$work/ctl.sock" ${SERVE_ARGS:-} > "$work/serve.out" 2> "$work/serve.err" &
spid=$!
for _ in $(seq 600); do [ -s "$work/serve.out" ] && break; sleep 0.1; done
dev=$(head -1 "$work/serve.out")
[ -b "$dev" ] || { echo "serve did not start: $(cat "$work/serve.err")" >&2; exit 1; }
# the device number as the block tracepoints print it (kernel dev_t: major << 20 | minor)
kdev=$(( ($(stat -c '%t' "$dev" | sed 's/^/0x/') << 20) | $(stat -c '%T' "$dev" | sed 's/^/0x/') ))
filter_of() { echo "dev == $kdev"; }
fio --name=pre --filename="$dev" --direct=1 --size=512M --rw=write --bs=1M --ioengine=psync >/dev/null 2>&1

[ -d "$tr/events" ] || mount -t tracefs nodev "$tr"
modes=(bare monitor driver ftrace)
if command -v perf >/dev/null 2>&1; then modes+=(perf); fi
if [ -n "${MONITOR_BASE:-}" ]; then modes+=(base); fi
# MODES="monitor base" measures only those (bare always runs: every ratio is against it)
if [ -n "${MODES:-}" ]; then read -r -a modes <<< "bare ${MODES//bare/}"; fi

start_mode() {
  mpid=""
  case $1 in
    bare) ;;
    monitor|driver|base)
      local extra=() bin=$fl
      [ "$1" = driver ] && extra=(--layers journal,driver)
      [ "$1" = base ] && bin=$MONITOR_BASE
      "$bin" monitor --device "$dev" "${extra[@]}" > "$work/mon.out" 2> "$work/mon.err" &
      mpid=$!
      for _ in $(seq 200); do grep -q '^monitoring' "$work/mon.out" 2>/dev/null && return; sleep 0.05; done
      echo "monitor did not start: $(cat "$work/mon.err")" >&2; exit 1 ;;
    ftrace)
      mkdir -p "$inst"
      for e in "${events[@]}"; do
        filter_of "$e" > "$inst/events/$e/filter"
        echo 1 > "$inst/events/$e/enable"
      done
      cat "$inst/trace_pipe" > /dev/null &
      mpid=$! ;;
    perf)
      local args=()
      for e in "${events[@]}"; do args+=(-e "${e/\//:}" --filter "$(filter_of "$e")"); done
      perf record -q -a "${args[@]}" -o "$work/perf.data" > /dev/null 2> "$work/perf.err" &
      mpid=$!
      # attached once perf's file has its header (its size stops at the header until samples)
      for _ in $(seq 100); do [ -s "$work/perf.data" ] && break; sleep 0.05; done
      sleep 0.3 ;;
  esac
}
stop_mode() {
  case $1 in
    bare) ;;
    monitor|driver|base|perf) kill -INT "$mpid"; wait "$mpid" 2>/dev/null || true ;;
    ftrace)
      for e in "${events[@]}"; do echo 0 > "$inst/events/$e/enable"; done
      kill "$mpid"; wait "$mpid" 2>/dev/null || true ;;
  esac
  rm -f "$work/perf.data"
  mpid=""
}

points=("w4k-qd1|--rw=write --bs=4k --ioengine=psync --direct=1 --filename=$dev --size=512M"
        "rr4k-qd1|--rw=randread --bs=4k --ioengine=psync --direct=1 --filename=$dev --size=512M"
        "rr4k-qd32|--rw=randread --bs=4k --ioengine=libaio --iodepth=32 --direct=1 --filename=$dev --size=512M"
        "w128k-qd1|--rw=write --bs=128k --ioengine=psync --direct=1 --filename=$dev --size=512M"
        "fs-fileserver|--directory=$work/mnt --numjobs=4 --nrfiles=256 --filesize=128k --bs=4k --rw=randrw --rwmixwrite=67 --ioengine=psync --fdatasync=16 --file_service_type=random --openfiles=32")
select_points monitor-overhead.sh
# fio, the daemon and the tool together (the tool's part is read at open and close of its window)
cpu_all() { echo $(( $(cpu_ns "$fpid") + $(cpu_ns "$spid") + $(cpu_ns "$mpid") )); }

: > "$work/windows"
: > "$work/windows.xcpu"
xcpu_build || echo "bench/micro/xcpu.rs did not build; host placement not recorded" >&2
for p in "${points[@]}"; do
  IFS='|' read -r pname pargs <<< "$p"
  if [[ $pname == fs-* ]] && ! mountpoint -q "$work/mnt" 2>/dev/null; then
    mkfs.ext4 -q -F "$dev" && mkdir -p "$work/mnt" && mount "$dev" "$work/mnt"
    # lay the files out before the timed run, so its windows see only the workload
    # shellcheck disable=SC2086
    fio --name=p --thread $pargs --runtime=1 --time_based > /dev/null 2>&1
  fi
  # shellcheck disable=SC2086
  start_window_fio "$work" --thread $pargs
  sleep 1
  echo "== $pname: $rounds rounds of ${modes[*]}, ${secs}s windows" >&2
  for r in $(seq "$rounds"); do
    echo "$pname $r $(xcpu_ns)" >> "$work/windows.xcpu"
    for k in $(seq 0 $((${#modes[@]} - 1))); do
      (( r % 2 )) && k=$(( ${#modes[@]} - 1 - k ))
      m=${modes[$(( (k + r / 2) % ${#modes[@]} ))]}
      start_mode "$m"
      sleep 0.2
      t0=$EPOCHREALTIME c0=$(cpu_all)
      sleep "$secs"
      t1=$EPOCHREALTIME c1=$(cpu_all)
      stop_mode "$m"
      echo "$pname $r $m $t0 $t1 $(( c1 - c0 ))" >> "$work/windows"
    done
  done
  stop_window_fio "$work" "$work/iops.$pname"
done

python3 - "$work" "${modes[*]}" "$here" <<'PY'
import sys, statistics as st, collections
work, modes = sys.argv[1], [m for m in sys.argv[2].split() if m != "bare"]
sys.path.insert(0, sys.argv[3])
from windows import fio_slots, window_iops, interval, split_rounds
wins = [l.split() for l in open(f"{work}/windows") if l.strip()]
points = list(dict.fromkeys(w[0] for w in wins))
samples = collections.defaultdict(dict)  # (point, round) -> mode -> (IOPS, CPU µs per I/O)
for p in points:
    # a window's IOPS: fio's 100 ms slots fully inside it (all job threads summed)
    slots = fio_slots(f"{work}/iops.{p}")
    for _, r, m, t0, t1, cpu in (w for w in wins if w[0] == p):
        iops = window_iops(slots, float(t0), float(t1))
        if iops is None:
            sys.exit(f"no IOPS samples inside the {m} window of {p} round {r}: is fio's log empty?")
        ios = iops * (float(t1) - float(t0))
        samples[(p, r)][m] = (iops, int(cpu) / 1e3 / max(ios, 1))
worst = {m: [None, None] for m in ("monitor", "ftrace", "perf", "driver")}
print(f"{'point':<14} {'bare IOPS':>10} {'CPU µs/IO':>9}  " + "  ".join(f"{m + ' IOPS loss % [90%]':>26} {'CPU/IO more % [90%]':>22}" for m in modes))
per_point = {p: [s for (q, _), s in samples.items() if q == p] for p in points}
for p in points:
    ss = per_point[p]
    cells = []
    for m in modes:
        loss = [(1 - s[m][0] / s["bare"][0]) * 100 for s in ss]
        more = [(s[m][1] / s["bare"][1] - 1) * 100 for s in ss]
        (lo, hi), (clo, chi) = interval(loss), interval(more)
        for i, v in enumerate((st.median(loss), st.median(more))):
            w = worst.setdefault(m, [None, None])
            w[i] = v if w[i] is None else max(w[i], v)
        cells.append(f"{st.median(loss):>10.1f} [{lo:>5.1f},{hi:>5.1f}]      {st.median(more):>8.1f} [{clo:>5.1f},{chi:>5.1f}]")
    print(f"{p:<14} {st.median(s['bare'][0] for s in ss):>10.0f} {st.median(s['bare'][1] for s in ss):>9.2f}  " + "  ".join(cells))
# the same losses over the rounds whose CPUs shared a cache and over those whose CPUs did not
# (bench/lib.sh xcpu_ns), where both kinds occurred
place = {(f[0], f[1]): int(f[2]) for f in (l.split() for l in open(f"{work}/windows.xcpu")) if len(f) == 3 and f[2].isdigit()}
near, far = (set(k) for k in split_rounds(place))
for p in points:
    kinds = {k: [s for (q, r), s in samples.items() if q == p and (q, r) in rs] for k, rs in (("near", near), ("far", far))}
    if all(len(v) >= 3 for v in kinds.values()):
        print(f"{p:<14} by host placement: " + "; ".join(
            f"{k} ({len(ss)} rounds, bare {st.median(s['bare'][0] for s in ss):.0f} IOPS): " + ", ".join(
                f"{m} loss {st.median(l := [(1 - s[m][0] / s['bare'][0]) * 100 for s in ss]):.1f}% [{interval(l)[0]:.1f},{interval(l)[1]:.1f}]" for m in modes)
            for k, ss in kinds.items()))
if "base" in modes:
    for p in points:
        ss = per_point[p]
        d = [(s["monitor"][0] / s["base"][0] - 1) * 100 for s in ss]
        c = [(s["monitor"][1] / s["base"][1] - 1) * 100 for s in ss]
        (lo, hi), (clo, chi) = interval(d), interval(c)
        print(f"{p:<14} monitor vs base: IOPS {st.median(d):+.1f}% [{lo:+.1f},{hi:+.1f}], CPU/IO {st.median(c):+.1f}% [{clo:+.1f},{chi:+.1f}]")
print(f"({len(samples) // max(len(points), 1)} rounds per point, one fio run per point; per-round paired ratios against the round's bare window; order rotated and reversed by round; intervals: bootstrap over rounds)")
fmt = lambda v: "na" if v is None else f"{v:.1f}"
print(" ".join(f"{m}_overhead_pct={fmt(worst[m][0])}" for m in ("monitor", "ftrace", "perf", "driver")) + " " +
      " ".join(f"{m}_cpu_pct={fmt(worst[m][1])}" for m in ("monitor", "ftrace", "perf", "driver")))
PY
