#!/usr/bin/env bash
# bench/injection-overhead.sh [ROUNDS] [SIZE] -- the study's question, side by side in one run:
# throughput and CPU of the raw sequential-write experiment (4 KiB O_DIRECT writes, psync, SIZE
# written, default 256MiB) with no rules, with an offset bit-flip rule on the last block of each
# 64 MiB, and with the same rules matched by content (every written block is hashed).
# Each round runs the three setups back to back in an order rotated per round (each setup is
# first, second and third equally often, so neither drift nor a warm-up favours one); the
# overhead is the median over rounds of each round's loss against that round's no-rules run
# (paired). Besides throughput, which swings with the machine, it reports CPU per written block
# (the workload's process and the disk server during the drive phase, results' drive_cpu_s),
# which varies far less, with a bootstrap 90% interval over rounds for both. Last line:
#   offset_overhead_pct=A content_overhead_pct=B offset_cpu_overhead_pct=C content_cpu_overhead_pct=D
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
rounds=${1:-24}
size=${2:-256MiB}
bash "$top/scripts/setup.sh" >&2
fl="$top/target/release/faultline"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
setup() { # $1 = name
  case $1 in
    no-rules) echo "  - {name: no-rules, faults: []}" ;;
    offset) echo "  - {name: offset, faults: [{type: bitflip, op: write, times: 1, target: last_written_block, by: offset, when: {every: 64MiB}}]}" ;;
    content) echo "  - {name: content, faults: [{type: bitflip, op: write, times: 1, target: last_written_block, by: content, when: {every: 64MiB}}]}" ;;
  esac
}
orders=("no-rules offset content" "offset content no-rules" "content no-rules offset")
for r in $(seq "$rounds"); do
  {
    cat <<YAML
name: injection-overhead
disk: { size: 1GiB }
stack: raw
monitor: off
workload:
  pattern: sequential
  mix: { write: 100 }
  block_size: 4KiB
  size: $size
  content: { profile: debian12-usr, seed: 5 }
repeat: 1
setups:
YAML
    for s in ${orders[$(( r % 3 ))]}; do setup "$s"; done
  } > "$work/exp$r.yaml"
  "$fl" run "$work/exp$r.yaml" --out "$work/r$r" -q > "$work/r$r.txt"
  echo "round $r: $(grep -E '^(no-rules|offset|content) ' "$work/r$r.txt" | awk '{printf "%s %s MiB/s  ", $1, $4}')" >&2
done
python3 - "$work" "$rounds" <<'PY'
import json, sys, random, statistics as st
work, rounds = sys.argv[1], int(sys.argv[2])
names = ("no-rules", "offset", "content")
mib = {k: [] for k in names}
cpu = {k: [] for k in names}   # µs of CPU per written block
for r in range(1, rounds + 1):
    res = json.load(open(f"{work}/r{r}/results.json"))
    for s in res["setups"]:
        rep = s["repetitions"][0]
        mib[s["name"]].append(rep["write"]["mib_s"])
        c = rep["drive_cpu_s"]
        cpu[s["name"]].append((c["workload"] + c["disks"]) * 1e6 / max(rep["write"]["ops"], 1))
rng = random.Random(7)
def interval(x):
    meds = sorted(st.median(rng.choices(x, k=len(x))) for _ in range(2000))
    return meds[100], meds[1899]
for k in names:
    print(f"{k:9s} {st.mean(mib[k]):8.1f} MiB/s (sd {st.pstdev(mib[k]):5.1f})  {st.mean(cpu[k]):6.2f} µs CPU/block (sd {st.pstdev(cpu[k]):5.2f})")
out = {}
for k in ("offset", "content"):
    loss = [(1 - a / b) * 100 for a, b in zip(mib[k], mib["no-rules"])]
    more = [(a / b - 1) * 100 for a, b in zip(cpu[k], cpu["no-rules"])]
    lo, hi = interval(loss); clo, chi = interval(more)
    print(f"{k:9s} throughput loss median {st.median(loss):5.1f}% 90% [{lo:.1f},{hi:.1f}]   CPU/block more median {st.median(more):5.1f}% 90% [{clo:.1f},{chi:.1f}]")
    out[k] = (st.median(loss), st.median(more))
print("(per-round paired ratios against the round's no-rules run; setup order rotated per round; intervals: bootstrap over rounds)")
print(f"offset_overhead_pct={out['offset'][0]:.1f} content_overhead_pct={out['content'][0]:.1f} offset_cpu_overhead_pct={out['offset'][1]:.1f} content_cpu_overhead_pct={out['content'][1]:.1f}")
PY
