#!/usr/bin/env bash
# bench/monitor-overhead.sh [ROUNDS] [SECONDS] -- what timing the block layer costs the I/O it
# times: IOPS of fio's four points (as bench/device.sh runs them) on one faultline disk with
# nothing attached (bare), with `faultline monitor --device` as experiments get it by default
# (monitor: the block layer, one BPF program per request at its completion, aggregated in the
# kernel; the journal layer has nothing to time on a raw disk), with the opt-in driver layer
# added (driver: `--layers driver`, the FUSE request pair), with ftrace (the block
# tracepoints queue and service times need, bio queue, request issue and completion, filtered
# to the device, in a tracefs instance of our own whose buffer is drained to /dev/null) and
# with perf (perf record of the same tracepoints and filters, all CPUs). Each round runs every
# mode back to back per point, order rotating by round; a mode's overhead at a point is the
# median over rounds of its paired IOPS loss against that round's bare run (slow drift of the
# machine cancels). Prints a table per point; the last line holds the worst point of each mode:
#   monitor_overhead_pct=M ftrace_overhead_pct=F perf_overhead_pct=P driver_overhead_pct=D
# (P is "na" where perf is not installed.)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
rounds=${1:-5}
secs=${2:-2}
bash "$top/scripts/setup.sh" >&2
fl="$top/target/release/faultline"
work=$(mktemp -d)
tr=/sys/kernel/tracing
inst=$tr/instances/faultline-overhead-$$
spid=""
events=(block/block_bio_queue block/block_rq_issue block/block_rq_complete)
cleanup() {
  if [ -d "$inst" ]; then
    for e in "${events[@]}"; do echo 0 > "$inst/events/$e/enable" 2>/dev/null || true; done
    rmdir "$inst" 2>/dev/null || true
  fi
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

mpid=""
start_mode() {
  case $1 in
    bare) ;;
    monitor|driver)
      local extra=()
      [ "$1" = driver ] && extra=(--layers driver)
      "$fl" monitor --device "$dev" "${extra[@]}" > "$work/mon.out" 2> "$work/mon.err" &
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
    monitor|driver|perf) kill -INT "$mpid"; wait "$mpid" 2>/dev/null || true ;;
    ftrace)
      for e in "${events[@]}"; do echo 0 > "$inst/events/$e/enable"; done
      kill "$mpid"; wait "$mpid" 2>/dev/null || true ;;
  esac
  rm -f "$work/perf.data"
}

points=("w4k-qd1|--rw=write --bs=4k --ioengine=psync" "rr4k-qd1|--rw=randread --bs=4k --ioengine=psync"
        "rr4k-qd32|--rw=randread --bs=4k --ioengine=libaio --iodepth=32" "w128k-qd1|--rw=write --bs=128k --ioengine=psync")
iops() { # fio-args...
  fio --name=p --filename="$dev" --direct=1 --size=512M --runtime="$secs" --time_based --output-format=json "$@" 2>/dev/null |
    python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]; print(int(j["read"]["iops"]+j["write"]["iops"]))'
}
: > "$work/samples"
for r in $(seq "$rounds"); do
  echo "== round $r/$rounds" >&2
  for p in "${points[@]}"; do
    IFS='|' read -r pname pargs <<< "$p"
    line="$pname"
    for k in $(seq 0 $((${#modes[@]} - 1))); do
      m=${modes[$(( (k + r) % ${#modes[@]} ))]}
      start_mode "$m"
      # shellcheck disable=SC2086
      line="$line $m=$(iops $pargs)"
      stop_mode "$m"
    done
    echo "$line" | tee -a "$work/samples" >&2
  done
done

python3 - "$work/samples" "${modes[*]}" <<'PY'
import sys, statistics
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
modes = [m for m in sys.argv[2].split() if m != "bare"]
points = list(dict.fromkeys(r[0] for r in rows))
worst = {m: None for m in ("monitor", "ftrace", "perf", "driver")}
print(f"{'point':<10} {'bare IOPS':>10} " + " ".join(f"{m + ' %':>10}" for m in modes))
for p in points:
    samples = [dict(kv.split("=") for kv in r[1:]) for r in rows if r[0] == p]
    bare = statistics.median(int(s["bare"]) for s in samples)
    cells = []
    for m in modes:
        loss = statistics.median((1 - int(s[m]) / int(s["bare"])) * 100 for s in samples)
        worst[m] = loss if worst[m] is None else max(worst[m], loss)
        cells.append(f"{loss:>10.1f}")
    print(f"{p:<10} {bare:>10.0f} " + " ".join(cells))
fmt = lambda v: "na" if v is None else f"{v:.1f}"
print(f"monitor_overhead_pct={fmt(worst['monitor'])} ftrace_overhead_pct={fmt(worst['ftrace'])} perf_overhead_pct={fmt(worst['perf'])} driver_overhead_pct={fmt(worst['driver'])}")
PY
