#!/usr/bin/env bash
# bench/study-power.sh -- the power of the latency study's method (issue #38, "Bench"), not its
# findings. Three runs of `faultline run`, paired windows throughout (docs/experiment.md):
#   1. the quick study (examples/latency-quick.yaml) as it is: M = its minutes, start to end;
#   2. an A/A control: the same setups, each delay replaced by a 0 us one (still armed in the
#      windows, held, with its pattern: it fires and is logged, and slows nothing): F = the
#      share of (setup, op) slowdowns of the mean latency (the workload's reads and writes, the
#      personalities' flowops) whose 95% interval excludes 0. With nothing to find, about 5%
#      would by chance;
#   3. a known effect: 4 KiB random reads at queue depth 1 on the quick study's disk (raw
#      stack), 10 us held in the device on a random 10% of the requests. Expected slowdown =
#      requests per read (the monitor's block-layer reads over the workload's) x the realized
#      share (fired / matched of the rule) x 10 us / the unarmed windows' mean read latency.
#      D = 1 when the measured slowdown is above 0 and its 95% interval holds the expected one.
# Last line: aa_false_positive_pct=F known_effect_found=D minutes=M
#   QUICK=FILE       the study (default examples/latency-quick.yaml)
#   DURATION=S       every workload's duration in seconds instead of the file's (a short check of
#                    the script; its figures are then not the bench's)
#   KNOWN_SECONDS=S  the known effect's run (default 40: 10 pairs of 2 s windows)
#   SKIP_STUDY=1     leave step 1 out (minutes=nan)
#   FAULTLINE_BIN=P  the build to run (default target/release/faultline)
# Results directories stay in $OUT (default a temporary directory, printed).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
bin=${FAULTLINE_BIN:-$top/target/release/faultline}
quick=${QUICK:-$top/examples/latency-quick.yaml}
known_s=${KNOWN_SECONDS:-40}
out=${OUT:-$(mktemp -d /tmp/study-power.XXXXXX)}
mkdir -p "$out"
echo "study-power: results in $out" >&2
bash "$top/scripts/setup.sh"

# the study file with its durations replaced (DURATION) and, for the A/A control, its delays
variant() { # SRC DEST aa(0|1)
  python3 - "$1" "$2" "$3" "${DURATION:-}" <<'PY'
import re, sys
src, dest, aa, dur = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4]
s = open(src).read()
if dur:
    s = re.sub(r"duration: [0-9.]+m?s", f"duration: {dur}s", s)
if aa:
    n = len(re.findall(r"delay: 10us", s))
    if n == 0:
        sys.exit(f"{src}: no `delay: 10us` to turn into the A/A control's 0us")
    s = re.sub(r"delay: 10us", "delay: 0us", s)
    s = re.sub(r"^name: (.*)$", r"name: \1-aa", s, count=1, flags=re.M)
open(dest, "w").write(s)
PY
}

minutes=nan
if [ "${SKIP_STUDY:-0}" != 1 ]; then
  variant "$quick" "$out/study.yaml" 0
  t0=$(date +%s.%N)
  "$bin" run "$out/study.yaml" --out "$out/study" -q >"$out/study.txt"
  minutes=$(echo "$t0 $(date +%s.%N)" | awk '{printf "%.1f", ($2 - $1) / 60}')
  echo "study: $minutes min" >&2
fi

variant "$quick" "$out/aa.yaml" 1
"$bin" run "$out/aa.yaml" --out "$out/aa" -q >"$out/aa.txt"

# the known effect: the quick study's disk and windows, a raw device, QD1 reads
python3 - "$quick" "$out/known.yaml" "$known_s" <<'PY'
import re, sys
src, dest, secs = sys.argv[1], sys.argv[2], sys.argv[3]
s = open(src).read()
disk = re.search(r"^disk: .*$", s, re.M).group(0)
base = re.search(r"^baseline: .*$", s, re.M).group(0)
open(dest, "w").write(f"""name: known-effect
{disk}
{base}
monitor: auto
stack: raw
workload: {{ pattern: uniform, mix: {{ read: 100 }}, block_size: 4KiB, span: 256MiB, duration: {secs}s, interval: 250ms }}
faults: [{{name: known, type: delay, delay: 10us, hold: device, pattern: {{random: {{ratio: 10%}}}}, seed: 5}}]
""")
PY
"$bin" run "$out/known.yaml" --out "$out/known" -q >"$out/known.txt"

python3 - "$out" "$minutes" <<'PY'
import json, sys
out, minutes = sys.argv[1], sys.argv[2]
aa = json.load(open(f"{out}/aa/results.json"))
rows = [(s["name"], r) for s in aa["setups"] for r in s.get("slowdown", [])
        if r["source"] in ("workload", "flowop") and r["metric"] == "mean_us" and r.get("ci_low") is not None]
hits = [(n, r) for n, r in rows if r["distinguishable"]]
for n, r in hits:
    print(f"A/A: {n} {r['source']} {r['op']}: {r['slowdown']*100:+.2f}% [{r['ci_low']*100:+.2f}, {r['ci_high']*100:+.2f}] over {r['pairs']} pairs", file=sys.stderr)
f = 100.0 * len(hits) / len(rows) if rows else float("nan")
print(f"A/A: {len(hits)} of {len(rows)} (setup, op) mean slowdowns exclude 0", file=sys.stderr)

k = json.load(open(f"{out}/known/results.json"))["setups"][0]
rep = k["repetitions"][0]
row = next(r for r in k["slowdown"] if r["source"] == "workload" and r["op"] == "read" and r["metric"] == "mean_us")
fired = sum(x["fired"] for x in rep["rules"] if x["name"] == "known")
matched = sum(x["matched"] for x in rep["rules"] if x["name"] == "known")
share = fired / matched if matched else float("nan")
per_read = 1.0
mon = rep.get("monitor") or {}
blk = sum(l["count"] for d in mon.get("devices", []) for l in d.get("layers", []) if l["layer"] == "block_service" and l["op"] == "read")
if blk and rep["read"]["ops"]:
    per_read = blk / rep["read"]["ops"]
expected = per_read * share * 10.0 / row["baseline"]
lo, hi = row.get("ci_low"), row.get("ci_high")
found = int(row["slowdown"] > 0 and lo is not None and lo <= expected <= hi)
print(f"known effect: {per_read:.3f} requests per read, share {share:.4f}, base {row['baseline']:.2f} us: expected {expected*100:+.2f}%, "
      f"measured {row['slowdown']*100:+.2f}% [{(lo or 0)*100:+.2f}, {(hi or 0)*100:+.2f}] over {row['pairs']} pairs "
      f"(+{row['injected'] - row['baseline']:.2f} us against +{per_read * share * 10.0:.2f} expected)", file=sys.stderr)
print(f"aa_false_positive_pct={f:.1f} known_effect_found={found} minutes={minutes}")
PY
