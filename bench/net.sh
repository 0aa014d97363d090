#!/usr/bin/env bash
# bench/net.sh [ROUNDS] [SECONDS] -- the user-space relay (faultline net up) against a plain
# veth pair between two namespaces (faultline net up --veth, no relay), side by side.
#
# Five networks of two hosts (client, target) exist for the whole run: `veth`, `relay` (the
# default: links without rules take the veth fast path, so this is what an experiment's
# fault-free links cost), `relay-always` (--always-relay: every packet through the user-space
# relay), `faulted` (the default network with a rule of 0 delay on both directions: the links
# go through the relay and the rule adds nothing of its own, so what is measured is what a link
# under a rule pays beyond the rule) and `delay-1ms` (a 1 ms delay rule client -> target: the
# round trip beyond the rule's own millisecond, through the relay's timer). Points, the same
# commands on every network (tcp not on delay-1ms):
#   tcp        iperf3 -c TARGET -t SECONDS, one TCP stream client -> target (Gbit/s, receiver)
#   rtt        ping -i 0.005 -c 400 TARGET from the client: round-trip time p50 (us)
# Each round measures every network back to back, in an order rotated per round, so the
# machine's drift (other tenants) lands on all alike. Ratios are medians over rounds of the
# per-round figures. Lines `NAME: throughput_ratio=T added_latency_us_p50=L` for relay-always
# and relay (T: NAME tcp / veth tcp; L: NAME rtt p50 - veth rtt p50, a round trip, which
# crosses the relay twice), `delay-1ms: added_latency_us_p50=L` (rtt p50 - 1000 - veth rtt
# p50), then the last line: faulted_throughput_ratio=T faulted_added_latency_us_p50=L.
#   BEFORE=PATH   another faultline binary (e.g. main's): its `faulted` and `delay-1ms` networks
#                 run in the same rounds (faulted-before, delay-1ms-before), with their lines
#                 before the last, so a change to the relay is compared within one run
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
rounds=${1:-5}
secs=${2:-3}
fl="$top/target/release/faultline"
[ -x "$fl" ] || (cd "$top" && cargo build --release -q)
for t in iperf3 ping ip; do command -v $t >/dev/null || { echo "needs $t (scripts/setup.sh)" >&2; exit 1; }; done
work=$(mktemp -d /tmp/faultline-net-bench.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do while kill -0 "$p" 2>/dev/null; do sleep 0.1; done; done
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

declare -A ns_client ns_target
start() { # name, extra args (the binary: $bin, default $fl)
  local name=$1; shift
  "${bin:-$fl}" net up --hosts client,target --socket "$work/$name.sock" "$@" > "$work/$name.out" 2> "$work/$name.err" &
  local p=$!
  pids+=($p)
  for _ in $(seq 100); do grep -q "Ctrl-C" "$work/$name.out" 2>/dev/null && break; sleep 0.1; done
  grep -q "Ctrl-C" "$work/$name.out" || { cat "$work/$name.err" >&2; exit 1; }
  ns_client[$name]=$(awk '$2=="client"{print $4}' "$work/$name.out")
  ns_target[$name]=$(awk '$2=="target"{print $4}' "$work/$name.out")
  ip netns exec "${ns_target[$name]}" iperf3 -s -D -p 5201 --pidfile "$work/$name.iperf.pid"
}
start veth --veth
start relay
start relay-always --always-relay
start faulted
"$fl" net set --socket "$work/faulted.sock" --from client --to target --both --delay 0ms >/dev/null
start delay-1ms
"$fl" net set --socket "$work/delay-1ms.sock" --from client --to target --delay 1ms >/dev/null
names=(veth relay relay-always faulted delay-1ms)
if [ -n "${BEFORE:-}" ]; then
  bin=$BEFORE start faulted-before
  "$BEFORE" net set --socket "$work/faulted-before.sock" --from client --to target --both --delay 0ms >/dev/null
  bin=$BEFORE start delay-1ms-before
  "$BEFORE" net set --socket "$work/delay-1ms-before.sock" --from client --to target --delay 1ms >/dev/null
  names+=(faulted-before delay-1ms-before)
fi
sleep 0.5

tcp() { ip netns exec "${ns_client[$1]}" iperf3 -c 10.77.0.2 -t "$secs" -J | python3 -c "import json,sys; print(json.load(sys.stdin)['end']['sum_received']['bits_per_second']/1e9)"; }
rtt() {
  ip netns exec "${ns_client[$1]}" ping -q -i 0.005 -c 400 10.77.0.2 >/dev/null # warm
  ip netns exec "${ns_client[$1]}" ping -i 0.005 -c 400 10.77.0.2 | sed -n 's/.*time=\([0-9.]*\) ms/\1/p' | sort -g | awk '{a[NR]=$1} END {printf "%.1f\n", a[int((NR+1)/2)]*1000}'
}

declare -A res
for r in $(seq "$rounds"); do
  n=${#names[@]}
  for k in $(seq 0 $((n - 1))); do
    name=${names[$(((k + r) % n))]}
    [[ "$name" = delay-1ms* ]] && res[$name,tcp,$r]=0 || res[$name,tcp,$r]=$(tcp "$name")
    res[$name,rtt,$r]=$(rtt "$name")
  done
  echo "round $r: $(for name in "${names[@]}"; do printf '%s tcp %.2f Gbit/s rtt p50 %s us; ' "$name" "${res[$name,tcp,$r]}" "${res[$name,rtt,$r]}"; done)" >&2
done

median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
printf '%-12s %12s %14s\n' network "tcp Gbit/s" "rtt p50 us"
for name in "${names[@]}"; do
  t=$(for r in $(seq "$rounds"); do echo "${res[$name,tcp,$r]}"; done | median)
  l=$(for r in $(seq "$rounds"); do echo "${res[$name,rtt,$r]}"; done | median)
  printf '%-12s %12.2f %14s\n' "$name" "$t" "$l"
done
pair() { # name: throughput ratio and added rtt p50 against veth, medians over rounds
  local ratio added
  ratio=$(for r in $(seq "$rounds"); do python3 -c "print(${res[$1,tcp,$r]}/${res[veth,tcp,$r]})"; done | median)
  added=$(for r in $(seq "$rounds"); do python3 -c "print(${res[$1,rtt,$r]}-${res[veth,rtt,$r]})"; done | median)
  echo "$(printf %.2f "$ratio") $(printf %.1f "$added")"
}
for cand in relay-always relay; do
  read -r t l < <(pair "$cand")
  echo "$cand: throughput_ratio=$t added_latency_us_p50=$l"
done
for cand in delay-1ms ${BEFORE:+delay-1ms-before}; do
  l=$(for r in $(seq "$rounds"); do python3 -c "print(${res[$cand,rtt,$r]}-1000-${res[veth,rtt,$r]})"; done | median)
  echo "$cand: added_latency_us_p50=$(printf %.1f "$l") (beyond the rule's 1000 us)"
done
if [ -n "${BEFORE:-}" ]; then
  read -r t l < <(pair faulted-before)
  echo "faulted-before: throughput_ratio=$t added_latency_us_p50=$l"
fi
read -r t l < <(pair faulted)
echo "faulted_throughput_ratio=$t faulted_added_latency_us_p50=$l"
