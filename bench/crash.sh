#!/usr/bin/env bash
# bench/crash.sh [ROUNDS] [SECONDS] -- what the volatile write cache costs (docs/crash.md):
# two faultline disks alive at once, `--write-cache none` and `--write-cache volatile` (default
# bound, 256 MiB of undo copies), each 1 GiB in RAM, their measured 512 MiB written once and
# flushed before measuring (so every write's undo copy is real bytes, the cache's worst case:
# undo copies of never-written, all-zero ranges cost nothing).
#
# The two take turns inside one fio run each per point (bench/lib.sh fio_turns: ROUNDS rounds,
# default 20, of a SECONDS window each, default 1, order reversed every other round), at the
# write points w4k-qd1 (sequential 4 KiB, psync), w128k-qd1 (sequential 128 KiB, psync) and
# rw4k-qd32 (random 4 KiB writes, libaio, queue depth 32), O_DIRECT on the loop devices, no
# flushes: the cache keeps every write's undo copy until its bound, then writes everything back
# (a drain; the count is printed). A point's loss is the median over rounds of the paired window
# loss of volatile against none, with its bootstrap 90% interval (bench/windows.py).
# POINTS="w4k-qd1 ..." runs only the points named; KEEP=DIR keeps the raw windows and logs;
# HOLD_CPU_LATENCY=1 as in device.sh (bench/lib.sh). Then bench/crash-states.sh (ext4 crash
# states checked per second by `faultline crash explore`). Last line:
#   cache_overhead_pct=C crash_states_per_s=S   (C: the worst point's loss, target C <= 10;
#   S: target >= 20)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
rounds=${1:-20}
secs=${2:-1}
. "$here/lib.sh"
bash "$top/scripts/setup.sh" >&2
fl="$top/target/release/faultline"
[ -x "$fl" ] || { echo "build first: cargo build --release" >&2; exit 1; }
hold_cpu_latency "both disks"
work=$(mktemp -d)
declare -A dev pid qpid
cleanup() {
  for q in "${qpid[@]}"; do kill -CONT "$q" 2>/dev/null; kill -INT "$q" 2>/dev/null; wait "$q" 2>/dev/null; done
  for n in none volatile; do
    [ -n "${pid[$n]:-}" ] && kill -TERM "${pid[$n]}" 2>/dev/null && while kill -0 "${pid[$n]}" 2>/dev/null; do sleep 0.1; done
  done
  if [ -n "${KEEP:-}" ]; then mkdir -p "$KEEP" && cp -r "$work"/turns "$KEEP"/ 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT INT TERM
for n in none volatile; do
  "$fl" serve --size 1GiB --write-cache "$n" --socket "$work/$n.sock" > "$work/$n.out" 2> "$work/$n.err" &
  pid[$n]=$!
  for _ in $(seq 600); do [ -s "$work/$n.out" ] && break; sleep 0.1; done
  dev[$n]=$(head -1 "$work/$n.out")
  [ -b "${dev[$n]}" ] || { echo "$n did not start: $(cat "$work/$n.err")" >&2; exit 1; }
  # steady state: every measured byte written once, then flushed (the epoch starts empty)
  fio --name=pre --filename="${dev[$n]}" --direct=1 --size=512M --rw=write --bs=1M --ioengine=psync --end_fsync=1 >/dev/null 2>&1
done
echo "devices: none=${dev[none]} volatile=${dev[volatile]}" >&2
points=("w4k-qd1|--rw=write --bs=4k --ioengine=psync" "w128k-qd1|--rw=write --bs=128k --ioengine=psync"
        "rw4k-qd32|--rw=randwrite --bs=4k --ioengine=libaio --iodepth=32")
select_points crash.sh
mkdir -p "$work/turns"
for p in "${points[@]}"; do
  IFS='|' read -r pname pargs <<< "$p"
  echo "== $pname: $rounds rounds of ${secs}s windows, none and volatile in turns" >&2
  read -ra fio_args <<< "$pargs"
  fio_turns "$work/turns/$pname" "$rounds" "$secs" none volatile
done
"$fl" fault --socket "$work/volatile.sock" stats |
  python3 -c 'import json, sys
c = json.load(sys.stdin)["write_cache"]
print("volatile cache after the run: %d drains, %d flushes, %d writes unflushed (%d MiB of undo copies held, bound %d MiB)" % (c["drains"], c["flushes"], c["unflushed"], c["held_bytes"] >> 20, c["limit_bytes"] >> 20))'

python3 - "$work" "$here" "${points[@]}" <<'PY' | tee "$work/overhead"
import os, sys, statistics
work = sys.argv[1]
sys.path.insert(0, sys.argv[2])
from windows import fio_turns, interval
points = [p.split("|")[0] for p in sys.argv[3:]]
print(f"{'':<22}" + "".join(f"{p:>12}" for p in points))
loss, ci, iops = {}, {}, {}
for p in points:
    w = fio_turns(os.path.join(work, "turns", p), f"{p}: ")
    per = [(1 - v["volatile"][0] / v["none"][0]) * 100 for v in w.values()]
    loss[p], ci[p] = statistics.median(per), interval(per)
    iops[p] = {n: statistics.median(v[n][0] for v in w.values()) for n in ("none", "volatile")}
for n in ("none", "volatile"):
    print(f"{'IOPS ' + n + ' (median)':<22}" + "".join(f"{iops[p][n]:>12.0f}" for p in points))
print(f"{'loss % (median)':<22}" + "".join(f"{loss[p]:>12.1f}" for p in points))
print(f"{'  90% interval':<22}" + " ".join(f"{p}=[{ci[p][0]:.1f},{ci[p][1]:.1f}]" for p in points))
print(f"({len(w)} rounds per point; loss: median over rounds of the paired window loss of volatile against none; intervals: bootstrap over rounds)")
print(f"cache_overhead_pct={max(loss.values()):.1f}")
PY
C=$(tail -1 "$work/overhead" | cut -d= -f2)
# the second figure: crash states checked per second (bench/crash-states.sh, its own runs)
echo "== crash states per second (bench/crash-states.sh)" >&2
S=$(bash "$here/crash-states.sh" | tee /dev/stderr | tail -1 | cut -d= -f2)
echo "cache_overhead_pct=$C crash_states_per_s=$S"
