#!/usr/bin/env bash
# bench/injection-overhead.sh [ROUNDS] [SECONDS] -- what armed fault rules cost the raw
# sequential-write workload of the study (4 KiB O_DIRECT writes, psync, realistic content: the
# debian12-usr profile), side by side in ONE run: one faultline disk, one `faultline workload`
# writing it for the whole bench (wrapping around the disk), and the rules taking turns in
# windows of SECONDS (default 1): no rules; offset (a bit flip on the last block of each 64 MiB,
# as the experiment `target: last_written_block, when: {every: 64MiB}` arms them, by offset);
# content (16 bit-flip rules by content hash, so every written block is hashed and looked up).
# The content rules' hashes match no block the workload writes: the cost of hashing and lookup
# is the same for every block, and the disk's content stays as written.
# A setup's rules are armed through the control socket (`faultline fault add`), its window opens
# 0.2 s later and closes SECONDS after; then `faultline fault clear`. A round gives each setup one
# window, in an order rotated by round and reversed every other round. A window's throughput
# comes from the workload's own 100 ms series (`--jsonl`), its CPU per written block from the
# schedstat of the workload's and the disk daemon's threads. A setup's overhead is the median
# over rounds of its window's paired ratio against the same round's no-rules window (seconds
# apart: the machine's slow drifts cancel), with a bootstrap 90% interval. Last line:
#   offset_overhead_pct=A content_overhead_pct=B offset_cpu_overhead_pct=C content_cpu_overhead_pct=D
# HOLD_CPU_LATENCY=1 holds a 0 us CPU wake-up latency for the whole run (bench/lib.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
rounds=${1:-60}
secs=${2:-1}
bash "$top/scripts/setup.sh" >&2
. "$here/lib.sh"
fl="$top/target/release/faultline"
work=$(mktemp -d)
spid=""
wpid=""
cleanup() {
  [ -n "$wpid" ] && kill -TERM "$wpid" 2>/dev/null && wait "$wpid" 2>/dev/null
  [ -n "$spid" ] && kill -TERM "$spid" 2>/dev/null && while kill -0 "$spid" 2>/dev/null; do sleep 0.1; done
  rm -rf "$work"
}
trap cleanup EXIT INT TERM
hold_cpu_latency "every setup"

"$fl" serve --size 1GiB --socket "$work/ctl.sock" > "$work/serve.out" 2> "$work/serve.err" &
spid=$!
for _ in $(seq 600); do [ -s "$work/serve.out" ] && break; sleep 0.1; done
dev=$(head -1 "$work/serve.out")
[ -b "$dev" ] || { echo "serve did not start: $(cat "$work/serve.err")" >&2; exit 1; }

# the rules: the last block of each 64 MiB of the 1 GiB disk, by offset and by (unmatched) hash
{
  echo "rules:"
  for i in $(seq 16); do
    echo "  - {type: bitflip, op: write, times: 1, target: {block: $(( i * 16384 - 1 ))}}"
  done
} > "$work/offset.yaml"
{
  echo "rules:"
  for i in $(seq 16); do
    echo "  - {type: bitflip, op: write, times: 1, target: {hash: \"$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')\"}}"
  done
} > "$work/content.yaml"
setups=(no-rules offset content)
arm() { [ "$1" = no-rules ] || "$fl" fault --socket "$work/ctl.sock" add "$work/$1.yaml" > /dev/null; }
disarm() { [ "$1" = no-rules ] || "$fl" fault --socket "$work/ctl.sock" clear > /dev/null; }

"$fl" workload --device "$dev" --pattern sequential --write-pct 100 --bs 4KiB --engine psync \
  --duration 100000s --profile debian12-usr --seed 5 --interval 100ms --jsonl > "$work/series" 2> "$work/workload.err" &
wpid=$!
for _ in $(seq 200); do [ -s "$work/series" ] && break; sleep 0.05; done
[ -s "$work/series" ] || { echo "the workload did not start: $(cat "$work/workload.err")" >&2; exit 1; }
sleep 1
: > "$work/windows"
echo "$rounds rounds of ${setups[*]}, ${secs}s windows, one workload on $dev" >&2
for r in $(seq "$rounds"); do
  for k in 0 1 2; do
    (( r % 2 )) && k=$(( 2 - k ))
    s=${setups[$(( (k + r / 2) % 3 ))]}
    arm "$s"
    sleep 0.2
    t0=$EPOCHREALTIME c0=$(( $(cpu_ns "$wpid") + $(cpu_ns "$spid") ))
    sleep "$secs"
    t1=$EPOCHREALTIME c1=$(( $(cpu_ns "$wpid") + $(cpu_ns "$spid") ))
    disarm "$s"
    echo "$r $s $t0 $t1 $(( c1 - c0 ))" >> "$work/windows"
  done
  (( r % 10 )) || echo "round $r/$rounds" >&2
done
kill -TERM "$wpid"; wait "$wpid" 2>/dev/null || true
wpid=""

python3 - "$work" "$here" <<'PY'
import json, sys, statistics as st, collections
work = sys.argv[1]
sys.path.insert(0, sys.argv[2])
from windows import interval
start, slots = None, []   # (end of a 100 ms interval in s since the epoch, blocks written in it)
for l in open(f"{work}/series"):
    o = json.loads(l)
    if "start_ns" in o:
        start = o["start_ns"] / 1e9
    elif "t_s" in o and start is not None:
        slots.append((start + o["t_s"], o["ops"]))
if not slots:
    sys.exit("the workload's series is empty")
names = ("no-rules", "offset", "content")
rows = collections.defaultdict(dict)   # round -> setup -> (MiB/s, µs CPU per block)
for l in open(f"{work}/windows"):
    r, s, t0, t1, cpu = l.split()
    lo, hi = float(t0) + 0.1, float(t1)
    inside = [n for t, n in slots if lo <= t <= hi]
    if not inside:
        sys.exit(f"no series interval inside the {s} window of round {r}")
    ops_s = sum(inside) / (len(inside) * 0.1)
    blocks = ops_s * (float(t1) - float(t0))
    rows[r][s] = (ops_s * 4096 / 2**20, int(cpu) / 1e3 / max(blocks, 1))
for k in names:
    mib = [v[k][0] for v in rows.values()]; cpu = [v[k][1] for v in rows.values()]
    print(f"{k:9s} {st.mean(mib):8.1f} MiB/s (sd {st.pstdev(mib):5.1f})  {st.mean(cpu):6.2f} µs CPU/block (sd {st.pstdev(cpu):5.2f})")
out = {}
for k in ("offset", "content"):
    loss = [(1 - v[k][0] / v["no-rules"][0]) * 100 for v in rows.values()]
    more = [(v[k][1] / v["no-rules"][1] - 1) * 100 for v in rows.values()]
    lo, hi = interval(loss); clo, chi = interval(more)
    print(f"{k:9s} throughput loss median {st.median(loss):5.1f}% 90% [{lo:.1f},{hi:.1f}]   CPU/block more median {st.median(more):5.1f}% 90% [{clo:.1f},{chi:.1f}]")
    out[k] = (st.median(loss), st.median(more))
print(f"({len(rows)} rounds in one workload run; per-round paired ratios against the round's no-rules window; order rotated and reversed by round; intervals: bootstrap over rounds)")
print(f"offset_overhead_pct={out['offset'][0]:.1f} content_overhead_pct={out['content'][0]:.1f} offset_cpu_overhead_pct={out['offset'][1]:.1f} content_cpu_overhead_pct={out['content'][1]:.1f}")
PY
