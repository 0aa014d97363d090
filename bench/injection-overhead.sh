#!/usr/bin/env bash
# bench/injection-overhead.sh [ROUNDS] [SIZE] -- the study's question, side by side in one run:
# throughput of the raw sequential-write experiment (4 KiB O_DIRECT writes, psync, SIZE
# written, default 1GiB) with no rules, with an offset bit-flip rule on the last block of each
# 64 MiB, and with the same rules matched by content (every written block is hashed).
# Each round runs the three setups back to back (interleaved, so drift hits all alike); the
# overhead is the median over rounds of each round's throughput loss against that round's
# no-rules run (paired: slow drift of the machine cancels). Last line:
#   offset_overhead_pct=A content_overhead_pct=B
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
rounds=${1:-10}
size=${2:-512MiB}
bash "$top/scripts/setup.sh" >&2
fl="$top/target/release/faultline"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/exp.yaml" <<YAML
name: injection-overhead
disk: { size: 2GiB }
stack: raw
workload:
  pattern: sequential
  mix: { write: 100 }
  block_size: 4KiB
  size: $size
  content: { profile: debian12-usr, seed: 5 }
repeat: $rounds
setups:
  - name: no-rules
    faults: []
  - name: offset
    faults: [ { type: bitflip, op: write, times: 1, target: last_written_block, by: offset, when: { every: 64MiB } } ]
  - name: content
    faults: [ { type: bitflip, op: write, times: 1, target: last_written_block, by: content, when: { every: 64MiB } } ]
YAML
# repeat: N runs each setup N times in a row; interleave instead by running rounds of 1
sed -i "s/^repeat: .*/repeat: 1/" "$work/exp.yaml"
for r in $(seq "$rounds"); do
  "$fl" run "$work/exp.yaml" --out "$work/r$r" -q > "$work/r$r.txt"
  echo "round $r: $(grep -E '^(no-rules|offset|content) ' "$work/r$r.txt" | awk '{printf "%s %s MiB/s  ", $1, $4}')" >&2
done
python3 - "$work" "$rounds" <<'PY'
import json, sys, statistics as st
work, rounds = sys.argv[1], int(sys.argv[2])
v = {"no-rules": [], "offset": [], "content": []}
for r in range(1, rounds + 1):
    res = json.load(open(f"{work}/r{r}/results.json"))
    for s in res["setups"]:
        v[s["name"]].append(s["repetitions"][0]["write"]["mib_s"])
m = {k: st.mean(x) for k, x in v.items()}
for k, x in v.items():
    print(f"{k:9s} mean {m[k]:8.1f} MiB/s  sd {st.pstdev(x):6.1f}  runs {' '.join(f'{y:.1f}' for y in x)}")
loss = {k: [(1 - a / b) * 100 for a, b in zip(v[k], v["no-rules"])] for k in ("offset", "content")}
for k, x in loss.items():
    print(f"{k:9s} loss per round (%): {' '.join(f'{y:.1f}' for y in x)}  median {st.median(x):.1f}  mean {st.mean(x):.1f}")
print(f"offset_overhead_pct={st.median(loss['offset']):.1f} content_overhead_pct={st.median(loss['content']):.1f}")
PY
