#!/bin/bash
# bench/crash-states.sh [RUNS] -- crash states checked per second by `faultline crash explore`
# on a small fsync-heavy ext4 workload (examples/crash-explore.yaml: 4 files of 256 KiB, 64
# random 4 KiB writes, an fsync every 4): each state is served from the RAM base + overlay,
# mounted (journal recovery), checked by the oracle, unmounted and checked by `e2fsck -fn`.
# S counts the checking phase only (summary.json's states / seconds; the one recording run
# before it is not in it). RUNS explorations (default 3), each with its own seed; S is their
# median. PER_EPOCH (default 2) subsets and torn variants per epoch.
# Last line: crash_states_per_s=S (target >= 20; CrashMonkey's published figure is ~100,000
# states in ~10 min for tiny workloads, ~170/s, with its own checks).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/env.sh
runs=${1:-3}
per_epoch=${PER_EPOCH:-2}
cargo build --release --quiet --bin faultline
bin=target/release/faultline
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM
printf "%-4s %7s %8s %8s %9s\n" run states failing seconds states/s
rates=()
for i in $(seq 1 "$runs"); do
  out=$tmp/run$i
  "$bin" crash explore examples/crash-explore.yaml --per-epoch "$per_epoch" --seed "$i" --out "$out" -q >/dev/null
  read -r n f s r < <(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d['states'], d['failing'], round(d['seconds'],2), round(d['states_per_s'],1))" "$out/summary.json")
  printf "%-4s %7s %8s %8s %9s\n" "$i" "$n" "$f" "$s" "$r"
  rates+=("$r")
done
S=$(printf "%s\n" "${rates[@]}" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
echo "crash_states_per_s=$S"
