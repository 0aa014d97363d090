#!/usr/bin/env bash
# bench/nbd.sh [ROUNDS] [SECONDS] -- faultline's NBD server vs nbdkit memory (and qemu-nbd on a
# tmpfs file where qemu-utils is installed), same clients, side by side in one run.
# `nbdkit null` runs beside them as a reference, not a peer: nbdkit's server with a plugin that
# does no storage work (reads return zeroes, writes are dropped). Row `null/nbdkit`: what nbdkit
# gains without its storage work (near 1: the client, the socket and the server's framework
# bound the point, not the storage); `vs null` >= 1: faultline, storage included, is as fast
# as nbdkit doing nothing.
#
# Every server listens on a Unix socket in a temp dir and holds SIZE (default 1GiB) in RAM:
# `faultline serve --no-loop --nbd unix:...` (no rules), `nbdkit memory SIZE`, `qemu-nbd -t` on
# a raw file in /dev/shm. Each is filled once with the same random SIZE (nbdcopy), so every
# round reads allocated, steady-state storage. Points, each the same client command for every
# server:
#   copy-in    nbdcopy FILE -> server (MB/s; the file is in /dev/shm, nbdcopy's defaults:
#              multi-conn where advertised, 64 requests of 256 KiB in flight per connection)
#   copy-out   nbdcopy --no-extents server -> null: (MB/s; every byte read, whatever the server
#              says of its extents: nbdkit null would otherwise report all zeroes)
#   rr4k-qd1 rw4k-qd1 rr4k-qd32 rw4k-qd32 w128k-qd1   fio --ioengine=nbd (IOPS)
#   cs-rr4k-qd1 cs-rw4k-qd1 cs-rr4k-qd32 cs-w128k-qd1   fio --ioengine=libaio --direct=1 on the
#              /dev/loopN of a faultline client disk whose store is that server
#              (`faultline serve --store nbd+unix://...`, default client policy) (IOPS)
# Each round runs every point on every server back to back, in an order rotated per round, so
# the machine's drift (other tenants) lands on all servers alike. Ratios are the median over
# rounds of the per-round ratio (paired); tables are medians. The machine is left as it is for
# every candidate; HOLD_CPU_LATENCY=1 holds a 0 us CPU wake-up latency for the whole run
# (every candidate measured with polling CPUs). POINTS="rr4k-qd1 rw4k-qd1" runs only those
# points; BASE=PATH adds another faultline binary (e.g. the previous commit's) as candidate
# `base`, served the same way, for a paired A/B of a change; CLIENT_BASE=PATH adds, per server, a
# client disk of that binary (`NAME~cb` columns of the cs-* points) for a paired A/B of the
# client store (`client vs base`: our client / that one, over the same server). Last line:
# min_ratio_vs_nbdkit=R
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
rounds=${1:-5}
secs=${2:-3}
size=${SIZE:-1GiB}
bash "$top/scripts/setup.sh"
fl="$top/target/release/faultline"
. "$here/lib.sh"
hold_cpu_latency "every candidate"
work=$(mktemp -d /dev/shm/faultline-nbd-bench.XXXXXX)
pids=()
cleanup() {
  # newest first: the client disks go before the servers they use
  local i p
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    p=${pids[$i]}
    kill -TERM "$p" 2>/dev/null || true
    while kill -0 "$p" 2>/dev/null; do sleep 0.1; done
  done
  rm -rf "$work"
}
trap cleanup EXIT INT TERM
bytes=$(python3 -c "import sys; u={'K':1<<10,'M':1<<20,'G':1<<30}; s=sys.argv[1].rstrip('iB'); print(int(s[:-1])*u[s[-1]] if s[-1] in u else int(s))" "$size")

wait_sock() { for _ in $(seq 300); do [ -S "$1" ] && return 0; sleep 0.1; done; echo "no socket $1" >&2; exit 1; }
declare -A uri
"$fl" serve --size "$size" --no-loop --nbd "unix:$work/fl.nbd" --socket "$work/fl.ctl" > "$work/fl.out" 2> "$work/fl.err" &
pids+=($!)
wait_sock "$work/fl.nbd"
uri[faultline]="nbd+unix:///?socket=$work/fl.nbd"
nbdkit -f -U "$work/kit.nbd" memory "$bytes" &
pids+=($!)
wait_sock "$work/kit.nbd"
uri[nbdkit]="nbd+unix:///?socket=$work/kit.nbd"
nbdkit -f -U "$work/null.nbd" null "$bytes" &
pids+=($!)
wait_sock "$work/null.nbd"
uri[null]="nbd+unix:///?socket=$work/null.nbd"
names=(faultline nbdkit)
if [ -n "${BASE:-}" ]; then
  "$BASE" serve --size "$size" --no-loop --nbd "unix:$work/base.nbd" --socket "$work/base.ctl" > "$work/base.out" 2> "$work/base.err" &
  pids+=($!)
  wait_sock "$work/base.nbd"
  uri[base]="nbd+unix:///?socket=$work/base.nbd"
  names+=(base)
fi
if command -v qemu-nbd >/dev/null; then
  truncate -s "$bytes" "$work/qemu.img"
  # -t: keep serving after a client leaves; -e: nbdcopy may open several connections
  qemu-nbd -t -e 16 -f raw -k "$work/qemu.nbd" "$work/qemu.img" &
  pids+=($!)
  wait_sock "$work/qemu.nbd"
  uri[qemu-nbd]="nbd+unix:///?socket=$work/qemu.nbd"
  names+=(qemu-nbd)
fi
names+=(null)
head -c "$bytes" /dev/urandom > "$work/src"
for n in "${names[@]}"; do nbdcopy "$work/src" "${uri[$n]}"; done
echo "servers: ${names[*]} ($size each, filled)" >&2
# a client disk per server: our NBD client store under a loop device
declare -A dev
for n in "${names[@]}"; do
  "$fl" serve --store "${uri[$n]}" --socket "$work/cs-$n.ctl" > "$work/cs-$n.out" 2> "$work/cs-$n.err" &
  pids+=($!)
  for _ in $(seq 300); do [ -s "$work/cs-$n.out" ] && break; sleep 0.1; done
  dev[$n]=$(head -1 "$work/cs-$n.out")
  case ${dev[$n]} in /dev/loop*) ;; *) echo "client disk over $n did not start: $(cat "$work/cs-$n.err")" >&2; exit 1 ;; esac
done
cs_names=()
if [ -n "${CLIENT_BASE:-}" ]; then
  for n in "${names[@]}"; do
    "$CLIENT_BASE" serve --store "${uri[$n]}" --socket "$work/cb-$n.ctl" > "$work/cb-$n.out" 2> "$work/cb-$n.err" &
    pids+=($!)
    for _ in $(seq 300); do [ -s "$work/cb-$n.out" ] && break; sleep 0.1; done
    dev[$n~cb]=$(head -1 "$work/cb-$n.out")
    case ${dev[$n~cb]} in /dev/loop*) ;; *) echo "base client disk over $n did not start: $(cat "$work/cb-$n.err")" >&2; exit 1 ;; esac
    cs_names+=("$n~cb")
  done
fi
echo "client disks: $(for n in "${names[@]}"; do printf '%s=%s ' "$n" "${dev[$n]}"; done)" >&2

mbps() { # seconds for $bytes -> MB/s
  python3 -c "import sys; print(int($bytes / 1e6 / float(sys.argv[1])))" "$1"
}
timed() { # command... -> wall seconds
  local t0 t1
  t0=$(date +%s.%N); "$@" >/dev/null 2>&1; t1=$(date +%s.%N)
  python3 -c "print($t1 - $t0)"
}
iops() { # uri fio-args...
  local u=$1; shift
  fio --name=p --ioengine=nbd --uri="$u" --size="$bytes" --runtime="$secs" --time_based \
    --output-format=json --output="$work/fio.json" "$@" >/dev/null 2>&1
  python3 -c 'import json,sys; j=json.load(open(sys.argv[1]))["jobs"][0]; print(int(j["read"]["iops"]+j["write"]["iops"]))' "$work/fio.json"
}
dev_iops() { # device fio-args...
  local d=$1; shift
  fio --name=p --ioengine=libaio --direct=1 --filename="$d" --size="$bytes" --runtime="$secs" --time_based \
    --output-format=json --output="$work/fio.json" "$@" >/dev/null 2>&1
  python3 -c 'import json,sys; j=json.load(open(sys.argv[1]))["jobs"][0]; print(int(j["read"]["iops"]+j["write"]["iops"]))' "$work/fio.json"
}
measure() { # point uri name
  case $1 in
    cs-rr4k-qd1) dev_iops "${dev[$3]}" --rw=randread --bs=4k --iodepth=1 ;;
    cs-rw4k-qd1) dev_iops "${dev[$3]}" --rw=randwrite --bs=4k --iodepth=1 ;;
    cs-rr4k-qd32) dev_iops "${dev[$3]}" --rw=randread --bs=4k --iodepth=32 ;;
    cs-w128k-qd1) dev_iops "${dev[$3]}" --rw=write --bs=128k --iodepth=1 ;;
    copy-in) mbps "$(timed nbdcopy "$work/src" "$2")" ;;
    copy-out) mbps "$(timed nbdcopy --no-extents "$2" null:)" ;;
    rr4k-qd1) iops "$2" --rw=randread --bs=4k --iodepth=1 ;;
    rw4k-qd1) iops "$2" --rw=randwrite --bs=4k --iodepth=1 ;;
    rr4k-qd32) iops "$2" --rw=randread --bs=4k --iodepth=32 ;;
    rw4k-qd32) iops "$2" --rw=randwrite --bs=4k --iodepth=32 ;;
    w128k-qd1) iops "$2" --rw=write --bs=128k --iodepth=1 ;;
  esac
}
points=(copy-in copy-out rr4k-qd1 rw4k-qd1 rr4k-qd32 rw4k-qd32 w128k-qd1 cs-rr4k-qd1 cs-rw4k-qd1 cs-rr4k-qd32 cs-w128k-qd1)
if [ -n "${POINTS:-}" ]; then read -r -a points <<< "$POINTS"; fi
for r in $(seq "$rounds"); do
  echo "== round $r/$rounds" >&2
  for p in "${points[@]}"; do
    line="$p"
    cands=("${names[@]}")
    case $p in cs-*) cands+=("${cs_names[@]}") ;; esac
    for k in $(seq 0 $((${#cands[@]} - 1))); do
      n=${cands[$(( (k + r) % ${#cands[@]} ))]}
      line="$line $n=$(measure "$p" "${uri[${n%~cb}]}" "$n")"
    done
    echo "$r $line" | tee -a "$work/results" >&2
  done
done

python3 - "$work/results" "${names[@]}" <<'PY'
import sys, statistics
from collections import defaultdict
names = sys.argv[2:]
vals = defaultdict(lambda: defaultdict(dict))   # vals[point][round][name]
for line in open(sys.argv[1]):
    r, point, *kv = line.split()
    for x in kv:
        k, v = x.split("=")
        vals[point][r][k] = int(v)
points = [p for p in ["copy-in", "copy-out", "rr4k-qd1", "rw4k-qd1", "rr4k-qd32", "rw4k-qd32", "w128k-qd1", "cs-rr4k-qd1", "cs-rw4k-qd1", "cs-rr4k-qd32", "cs-w128k-qd1"] if p in vals]
med = lambda p, n: statistics.median(v[n] for v in vals[p].values())
paired = lambda p, a, b: statistics.median(v[a] / v[b] for v in vals[p].values())
print("median (copy: MB/s, fio: IOPS)")
print(f"{'':<12}" + "".join(f"{p:>13}" for p in points))
for n in names:
    print(f"{n:<12}" + "".join(f"{med(p, n):>13.0f}" for p in points))
ratios = {}
for peer in names[1:]:
    ratios[peer] = {p: paired(p, "faultline", peer) for p in points}
    print(f"{'vs ' + peer:<12}" + "".join(f"{ratios[peer][p]:>13.2f}" for p in points))
for n in names:
    cb = n + "~cb"
    cps = [p for p in points if all(cb in v for v in vals[p].values())]
    if cps:
        print(f"{cb:<12}" + "".join(f"{med(p, cb):>13.0f}" if p in cps else f"{'':>13}" for p in points))
        r = {p: paired(p, n, cb) for p in cps}
        print(f"{'client/base':<12}" + "".join(f"{r[p]:>13.2f}" if p in cps else f"{'':>13}" for p in points) + f"   (over {n})")
        print(f"min_client_vs_base_over_{n}={min(r.values()):.2f}")
if "null" in names:
    r = {p: paired(p, "null", "nbdkit") for p in points}
    print(f"{'null/nbdkit':<12}" + "".join(f"{r[p]:>13.2f}" for p in points))
print("(ratio: faultline / peer, median over rounds of the per-round ratio; cs-*: the same faultline client store over each server;")
print(" null/nbdkit: nbdkit without storage work (its null plugin) over nbdkit memory, same client)")
if "qemu-nbd" in ratios:
    print(f"min_ratio_vs_qemu_nbd={min(ratios['qemu-nbd'].values()):.2f}")
if "base" in ratios:
    print(f"min_ratio_vs_base={min(ratios['base'].values()):.2f}")
print(f"min_ratio_vs_nbdkit={min(ratios['nbdkit'].values()):.2f}")
PY
