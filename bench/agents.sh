#!/usr/bin/env bash
# bench/agents.sh [AGENTS] [RATE] [SECONDS] -- one controller, AGENTS agents (each in a network
# namespace of its own, reached by `ip netns exec`), each streaming RATE probe samples per
# second for SECONDS (`faultline agent --probe`), as the experiment runner's probers do. The
# controller (`faultline agent --bench-netns ...`) counts the samples it receives and reads its
# own CPU time (/proc/self/stat) over the streaming. Last line:
# agents=N samples_lost=L controller_cpu_pct=C   (targets: L=0, C<=5 with 16 agents)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
n=${1:-16}
rate=${2:-10}
secs=${3:-20}
fl="$top/target/release/faultline"
[ -x "$fl" ] || { echo "build first: cargo build --release" >&2; exit 1; }
prefix="fl-bench-agents-$$"
spaces=()
cleanup() { for s in "${spaces[@]}"; do ip netns del "$s" 2>/dev/null || true; done; }
trap cleanup EXIT INT TERM
args=()
for i in $(seq 1 "$n"); do
  s="$prefix-$i"
  ip netns add "$s"
  spaces+=("$s")
  args+=(--bench-netns "$s")
done
# the agents' ledgers go to a run directory of the bench's own
export FAULTLINE_RUN_DIR="/run/faultline-bench-agents-$$"
"$fl" agent "${args[@]}" --bench-rate "$rate" --bench-seconds "$secs"
rm -rf "$FAULTLINE_RUN_DIR"
