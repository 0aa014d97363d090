#!/usr/bin/env bash
# bench/monitor-overhead.sh [ROUNDS] [SECONDS] -- what timing the block layer costs the I/O it
# times: fio's four points (as bench/device.sh runs them) on one faultline disk with nothing
# attached (bare), with `faultline monitor --device` as experiments get it by default
# (monitor: the block layer, one BPF program per request at its completion, aggregated in the
# kernel; the journal layer has nothing to time on a raw disk), with the opt-in driver layer
# added (driver: `--layers driver`, the FUSE request pair), with ftrace (the block
# tracepoints queue and service times need, bio queue, request issue and completion, filtered
# to the device, in a tracefs instance of our own whose buffer is drained to /dev/null) and
# with perf (perf record of the same tracepoints and filters, all CPUs).
# Many short rounds; in each, every point runs every mode back to back, the order rotated by
# round and reversed every other round (each mode takes each position, and each neighbour
# side, equally often). Per run: IOPS, and CPU per I/O: fio's own CPU (user + system, its
# JSON), the disk daemon's and the tracing tool's process (the monitor, perf, or the reader of
# the ftrace buffer), from /proc, over the run; it varies far less than IOPS on a busy
# machine. A mode's overhead at a point is the median over rounds of its per-round paired ratio
# against that round's bare run, with a bootstrap 90% interval. Prints a table per point; the
# last line holds the worst point of each mode (IOPS loss, then CPU per I/O added):
#   monitor_overhead_pct=M ftrace_overhead_pct=F perf_overhead_pct=P driver_overhead_pct=D
#   monitor_cpu_pct=... ftrace_cpu_pct=... perf_cpu_pct=... driver_cpu_pct=...
# (P is "na" where perf is not installed.)
# MODES="monitor base" limits the modes (bare always runs), POINTS="rr4k-qd1" the points.
# With MONITOR_BASE=BIN, a mode `base` runs `BIN monitor --device` as `monitor` does (an A/B of
# two builds' default monitor, e.g. main's against a branch's); it is in the table, not in the
# last line.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
rounds=${1:-12}
secs=${2:-1}
bash "$top/scripts/setup.sh" >&2
fl="$top/target/release/faultline"
work=$(mktemp -d)
tr=/sys/kernel/tracing
inst=$tr/instances/faultline-overhead-$$
spid=""
mpid=""
events=(block/block_bio_queue block/block_rq_issue block/block_rq_complete)
cleanup() {
  if [ -d "$inst" ]; then
    for e in "${events[@]}"; do echo 0 > "$inst/events/$e/enable" 2>/dev/null || true; done
    rmdir "$inst" 2>/dev/null || true
  fi
  # the tracing tool of a run cut short (an error, Ctrl-C) goes too
  [ -n "$mpid" ] && kill -INT "$mpid" 2>/dev/null && wait "$mpid" 2>/dev/null
  [ -n "$spid" ] && kill -TERM "$spid" 2>/dev/null && while kill -0 "$spid" 2>/dev/null; do sleep 0.1; done
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

"$fl" serve --size 1GiB --socket "$work/ctl.sock" > "$work/serve.out" 2> "$work/serve.err" &
spid=$!
for _ in $(seq 600); do [ -s "$work/serve.out" ] && break; sleep 0.1; done
dev=$(head -1 "$work/serve.out")
[ -b "$dev" ] || { echo "serve did not start: $(cat "$work/serve.err")" >&2; exit 1; }
# the device number as the block tracepoints print it (kernel dev_t: major << 20 | minor)
kdev=$(( ($(stat -c '%t' "$dev" | sed 's/^/0x/') << 20) | $(stat -c '%T' "$dev" | sed 's/^/0x/') ))
# the FUSE connection behind the loop device: its file's st_dev, as the kernel encodes it
sdev=$(stat -c '%d' "$(cat "/sys/block/$(basename "$dev")/loop/backing_file")")
fdev=$(( (((sdev >> 8) & 0xfff) << 20) | (sdev & 0xff) | ((sdev >> 12) & 0xfff00) ))
filter_of() { case $1 in block/*) echo "dev == $kdev" ;; fuse/*) echo "connection == $fdev" ;; esac; }
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
      [ "$1" = driver ] && extra=(--layers driver)
      [ "$1" = base ] && bin=$MONITOR_BASE
      "$bin" monitor --device "$dev" "${extra[@]}" > "$work/mon.out" 2> "$work/mon.err" &
      mpid=$!
      for _ in $(seq 100); do grep -q '^monitoring' "$work/mon.out" 2>/dev/null && return; sleep 0.05; done
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
      perf record -q -a "${args[@]}" -o "$work/perf.data" > /dev/null 2>&1 &
      mpid=$!
      sleep 1 ;;
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

points=("w4k-qd1|--rw=write --bs=4k --ioengine=psync" "rr4k-qd1|--rw=randread --bs=4k --ioengine=psync"
        "rr4k-qd32|--rw=randread --bs=4k --ioengine=libaio --iodepth=32" "w128k-qd1|--rw=write --bs=128k --ioengine=psync")
# POINTS="rr4k-qd1 w128k-qd1" runs only those points
. "$here/lib.sh"
select_points monitor-overhead.sh
# CPU time of a process's threads in ns (their schedstat: exact, not in clock ticks)
cpu_ns() { [ -n "$1" ] && cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{s += $1} END {printf "%.0f\n", s}' || echo 0; }
measure() { # fio-args... -> "IOPS/CPU-µs-per-I/O"
  local d0 t0 d1 t1
  d0=$(cpu_ns "$spid"); t0=$(cpu_ns "$mpid")
  fio --name=p --filename="$dev" --direct=1 --size=512M --runtime="$secs" --time_based --output-format=json "$@" 2>/dev/null > "$work/fio.json"
  d1=$(cpu_ns "$spid"); t1=$(cpu_ns "$mpid")
  python3 - "$work/fio.json" $(( d1 - d0 + t1 - t0 )) <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
n = j["read"]["total_ios"] + j["write"]["total_ios"]
rt = j["job_runtime"] / 1000
cpu = (j["usr_cpu"] + j["sys_cpu"]) / 100 * rt + int(sys.argv[2]) / 1e9
print(f"{n / rt:.0f}/{cpu * 1e6 / max(n, 1):.3f}")
PY
}
: > "$work/samples"
for r in $(seq "$rounds"); do
  echo "== round $r/$rounds" >&2
  for p in "${points[@]}"; do
    IFS='|' read -r pname pargs <<< "$p"
    line="$pname"
    for k in $(seq 0 $((${#modes[@]} - 1))); do
      (( r % 2 )) && k=$(( ${#modes[@]} - 1 - k ))
      m=${modes[$(( (k + r / 2) % ${#modes[@]} ))]}
      start_mode "$m"
      # shellcheck disable=SC2086
      line="$line $m=$(measure $pargs)"
      stop_mode "$m"
    done
    echo "$line" | tee -a "$work/samples" >&2
  done
done

python3 - "$work/samples" "${modes[*]}" <<'PY'
import sys, random, statistics as st
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
modes = [m for m in sys.argv[2].split() if m != "bare"]
points = list(dict.fromkeys(r[0] for r in rows))
rng = random.Random(7)
def interval(x):
    meds = sorted(st.median(rng.choices(x, k=len(x))) for _ in range(2000))
    return meds[100], meds[1899]
worst = {m: [None, None] for m in ("monitor", "ftrace", "perf", "driver")}
print(f"{'point':<10} {'bare IOPS':>10} {'CPU µs/IO':>9}  " + "  ".join(f"{m + ' IOPS loss % [90%]':>26} {'CPU/IO more % [90%]':>22}" for m in modes))
for p in points:
    samples = [{k: tuple(map(float, v.split("/"))) for k, v in (kv.split("=") for kv in r[1:])} for r in rows if r[0] == p]
    cells = []
    for m in modes:
        loss = [(1 - s[m][0] / s["bare"][0]) * 100 for s in samples]
        more = [(s[m][1] / s["bare"][1] - 1) * 100 for s in samples]
        (lo, hi), (clo, chi) = interval(loss), interval(more)
        for i, v in enumerate((st.median(loss), st.median(more))):
            w = worst.setdefault(m, [None, None])
            w[i] = v if w[i] is None else max(w[i], v)
        cells.append(f"{st.median(loss):>10.1f} [{lo:>5.1f},{hi:>5.1f}]      {st.median(more):>8.1f} [{clo:>5.1f},{chi:>5.1f}]")
    print(f"{p:<10} {st.median(s['bare'][0] for s in samples):>10.0f} {st.median(s['bare'][1] for s in samples):>9.2f}  " + "  ".join(cells))
if "base" in modes:
    for p in points:
        samples = [{k: tuple(map(float, v.split("/"))) for k, v in (kv.split("=") for kv in r[1:])} for r in rows if r[0] == p]
        d = [(s["monitor"][0] / s["base"][0] - 1) * 100 for s in samples]
        c = [(s["monitor"][1] / s["base"][1] - 1) * 100 for s in samples]
        (lo, hi), (clo, chi) = interval(d), interval(c)
        print(f"{p:<10} monitor vs base: IOPS {st.median(d):+.1f}% [{lo:+.1f},{hi:+.1f}], CPU/IO {st.median(c):+.1f}% [{clo:+.1f},{chi:+.1f}]")
print(f"({len(rows) // max(len(points), 1)} rounds; per-round paired ratios against the round's bare run; order rotated and reversed by round; intervals: bootstrap over rounds)")
fmt = lambda v: "na" if v is None else f"{v:.1f}"
print(" ".join(f"{m}_overhead_pct={fmt(worst[m][0])}" for m in ("monitor", "ftrace", "perf", "driver")) + " " +
      " ".join(f"{m}_cpu_pct={fmt(worst[m][1])}" for m in ("monitor", "ftrace", "perf", "driver")))
PY
