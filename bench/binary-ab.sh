#!/usr/bin/env bash
# bench/binary-ab.sh BIN_A BIN_B [ROUNDS] [SECONDS] [FIO-ARGS...] -- two builds of faultline
# (say main's and a branch's) serving side by side with the same settings, one fio point run on
# both back to back per round, order alternating by round. Per round: IOPS and the daemon's CPU
# time per I/O (user+system of the serve process / I/Os), which varies far less than IOPS on a
# loaded machine. Default point: w128k-qd1 (`--rw=write --bs=128k --ioengine=psync`).
#   RULES=1       arm device.sh's 100k never-matching rules (50k content, 50k offset) on both
#   SERVE_ARGS=.. extra `serve` arguments for both (e.g. "--busy-poll 0 --cpu-latency keep",
#                 so the CPU figure counts work, not polling)
# Last line: iops_ratio_b_vs_a=R cpu_per_io_a_us=X cpu_per_io_b_us=Y (medians over rounds)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
[ $# -ge 2 ] || { echo "usage: bench/binary-ab.sh BIN_A BIN_B [ROUNDS] [SECONDS] [FIO-ARGS...]" >&2; exit 2; }
declare -A bin=([a]="$1" [b]="$2")
rounds=${3:-8}
secs=${4:-2}
shift $(( $# < 4 ? $# : 4 ))
fio_args=("$@")
[ ${#fio_args[@]} -gt 0 ] || fio_args=(--rw=write --bs=128k --ioengine=psync)
work=$(mktemp -d)
declare -A dev pid
cleanup() {
  for n in a b; do
    [ -n "${pid[$n]:-}" ] || continue
    kill -TERM "${pid[$n]}" 2>/dev/null || true
    while kill -0 "${pid[$n]}" 2>/dev/null; do sleep 0.1; done
  done
  rm -rf "$work"
}
trap cleanup EXIT INT TERM
rules=()
if [ "${RULES:-0}" = 1 ]; then
  python3 "$here/gen-rules.py" 50000 > "$work/rules.yaml"
  rules=(--rules "$work/rules.yaml")
fi
for n in a b; do
  # shellcheck disable=SC2086
  "${bin[$n]}" serve --size 1GiB --socket "$work/$n.sock" "${rules[@]}" ${SERVE_ARGS:-} > "$work/$n.out" 2> "$work/$n.err" &
  pid[$n]=$!
  for _ in $(seq 600); do [ -s "$work/$n.out" ] && break; sleep 0.1; done
  dev[$n]=$(head -1 "$work/$n.out")
  [ -b "${dev[$n]}" ] || { echo "$n (${bin[$n]}) did not start: $(tail -1 "$work/$n.err")" >&2; exit 1; }
  # steady state: the measured 512 MiB written once
  fio --name=pre --filename="${dev[$n]}" --direct=1 --size=512M --rw=write --bs=1M --ioengine=psync --output-format=terse >/dev/null 2>&1
done
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)
for r in $(seq "$rounds"); do
  if (( r % 2 )); then order=(a b); else order=(b a); fi
  line="$r"
  for n in "${order[@]}"; do
    c0=$(cpu_ticks "${pid[$n]}")
    out=$(fio --name=p --filename="${dev[$n]}" --direct=1 --size=512M --runtime="$secs" --time_based --output-format=json "${fio_args[@]}" 2>/dev/null)
    c1=$(cpu_ticks "${pid[$n]}")
    line="$line $n=$(python3 -c '
import json, sys
j = json.loads(sys.argv[1])["jobs"][0]
ios = j["read"]["total_ios"] + j["write"]["total_ios"]
iops = int(j["read"]["iops"] + j["write"]["iops"])
cpu_us = (int(sys.argv[3]) - int(sys.argv[2])) / int(sys.argv[4]) / max(ios, 1) * 1e6
print(f"{iops}/{cpu_us:.1f}")' "$out" "$c0" "$c1" "$hz")"
  done
  echo "$line" | tee -a "$work/results" >&2
done
python3 - "$work/results" <<'PY'
import sys, statistics
rows = []
for line in open(sys.argv[1]):
    _, *kv = line.split()
    rows.append({k: tuple(map(float, v.split("/"))) for k, v in (x.split("=") for x in kv)})
ratio = statistics.median(r["b"][0] / r["a"][0] for r in rows if r["a"][0] > 0)
ca = statistics.median(r["a"][1] for r in rows)
cb = statistics.median(r["b"][1] for r in rows)
print("(IOPS/daemon CPU us per I/O per round above; medians over rounds below)")
print(f"iops_ratio_b_vs_a={ratio:.2f} cpu_per_io_a_us={ca:.1f} cpu_per_io_b_us={cb:.1f}")
PY
