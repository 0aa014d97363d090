#!/usr/bin/env bash
# bench/net-loss.sh [LOSS] [SECONDS] -- packet loss done by the relay (`faultline net set
# --loss`) against nftables in the sending host (`numgen random mod 100000 < N drop` on its
# output hook, relay without rules), one TCP stream client -> target (iperf3), side by side.
# Prints per way: throughput, TCP retransmissions as a share of the segments sent (what loss
# the sender saw), and the drops as counted by each mechanism. Last line:
# relay_retrans_pct=R nft_retrans_pct=N (the asked loss is LOSS).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
loss=${1:-1%}
secs=${2:-5}
fl="$top/target/release/faultline"
work=$(mktemp -d /tmp/faultline-net-loss.XXXXXX)
"$fl" net up --hosts client,target --socket "$work/net.sock" > "$work/out" 2> "$work/err" &
pid=$!
trap 'kill -TERM $pid; wait $pid; rm -rf "$work"' EXIT INT TERM
for _ in $(seq 100); do grep -q "Ctrl-C" "$work/out" 2>/dev/null && break; sleep 0.1; done
c=$(awk '$2=="client"{print $4}' "$work/out")
t=$(awk '$2=="target"{print $4}' "$work/out")
frac=$(python3 -c "s='$loss'; v=float(s[:-1])/100 if s.endswith('%') else float(s); print(v)")
run() { # label
  ip netns exec "$t" iperf3 -s -1 -D
  sleep 0.3
  ip netns exec "$c" iperf3 -c 10.77.0.2 -t "$secs" -J > "$work/$1.json"
  python3 - "$work/$1.json" "$1" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
s = j['end']['sum_sent']
segs = s['bytes'] / 1448
print(f"{sys.argv[2]}: {j['end']['sum_received']['bits_per_second']/1e9:.2f} Gbit/s, retransmits {s['retransmits']} = {100*s['retransmits']/segs:.3f}% of {segs:.0f} segments")
open(sys.argv[1] + '.pct', 'w').write(f"{100*s['retransmits']/segs:.3f}")
PY
}
"$fl" net set --socket "$work/net.sock" --from client --to target --loss "$loss" >/dev/null
run relay
echo "client TUN: $(ip -n "$c" -s link show fl0 | awk '/TX:/{getline; print "tx packets " $2 ", dropped at the device " $4}')"
"$fl" net show --socket "$work/net.sock" | python3 -c "import json,sys; l=[l for l in json.load(sys.stdin)['links'] if l['from']=='client'][0]; print(f\"relay dropped {l['dropped']} of {l['packets']} packets\")"
# without the relay's rule the link goes back to its veth fast path: nftables then drops in a
# purely kernel path, as it would between hosts joined by a wire
"$fl" net clear --socket "$work/net.sock" >/dev/null
n=$(python3 -c "print(round($frac*100000))")
ip netns exec "$t" nft add table inet fl
ip netns exec "$t" nft add chain inet fl in '{ type filter hook prerouting priority 0; }'
ip netns exec "$t" nft add rule inet fl in ip saddr 10.77.0.1 numgen random mod 100000 '<' "$n" counter drop
run nft
echo "nft dropped: $(ip netns exec "$t" nft list chain inet fl in | grep -o 'packets [0-9]* bytes [0-9]*')"
echo "relay_retrans_pct=$(cat "$work/relay.json.pct") nft_retrans_pct=$(cat "$work/nft.json.pct")"
