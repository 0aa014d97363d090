#!/usr/bin/env bash
# bench/latency-precision.sh [ROUNDS] [SECONDS] -- does a 10 us delay arrive as 10 us, and does
# a slow-I/O pattern slow the share of requests it asks for?
#
# One faultline disk (RAM store, defaults; SERVE_ARGS adds `faultline serve` options, e.g.
# SERVE_ARGS="--busy-poll 0"), its measured 512 MiB written once first. Each round
# runs fio 4 KiB random reads at queue depth 1 (psync) for SECONDS on it in three cases, order
# rotated per round so the machine's drift lands on all of them alike:
#   base    no rules
#   fixed   only {type: delay, delay: 10us}: every request 10 us late
#   random  only {type: delay, delay: 10us, pattern: {random: {ratio: 10%}}, seed: ROUND}
# Figures:
#   client error  fio's completion latency p50 (clat) of `fixed` minus that of `base` in the
#                 same round, minus 10 us: what a user of /dev/loopN sees; median over rounds
#                 (paired by round: on a busy machine both cases drift, and drift together)
#   daemon error  `fault stats` delay_lateness: how late the delayed replies left the daemon
#                 after their deadline (whole us, p50 / p99 over all delayed replies of the run)
#   ratio error   |fired / matched - 10%| / 10% of the random rule, over all rounds (the
#                 rule's own counters; a seeded Bernoulli draw, so sampling noise included:
#                 its expected size, one standard deviation, is printed beside it)
# Last line: delay_error_us_p50=X realized_ratio_error_pct=Y (X = |client error|).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
rounds=${1:-5}
secs=${2:-5}
bash "$top/scripts/setup.sh" >/dev/null
. "$top/scripts/env.sh"
fl="$top/target/release/faultline"
work=$(mktemp -d)
sock="$work/s.sock"

cleanup() {
  if [ -f "$work/pid" ]; then
    p=$(cat "$work/pid")
    kill -TERM "$p" 2>/dev/null || true
    while kill -0 "$p" 2>/dev/null; do sleep 0.1; done
  fi
  rm -rf "$work"
}
trap cleanup EXIT INT TERM

# shellcheck disable=SC2086
"$fl" serve ${SERVE_ARGS:-} --size 1GiB --socket "$sock" > "$work/out" 2> "$work/err" &
echo $! > "$work/pid"
for _ in $(seq 600); do [ -s "$work/out" ] && break; sleep 0.1; done
dev=$(head -1 "$work/out")
[ -b "$dev" ] || { echo "faultline serve did not start: $(cat "$work/err")" >&2; exit 1; }
fio --name=pre --filename="$dev" --direct=1 --size=512M --rw=write --bs=1M --ioengine=psync --output-format=terse >/dev/null 2>&1
udevadm settle 2>/dev/null || true

ctl() { "$fl" fault --socket "$sock" "$@"; }
clat_p50_us() { # fio 4 KiB random reads, QD1: completion latency p50 in us
  fio --name=lat --filename="$dev" --direct=1 --size=512M --rw=randread --bs=4k --ioengine=psync \
      --runtime="$secs" --time_based --percentile_list=50:99 --output-format=json 2>/dev/null |
    python3 -c 'import json,sys; r=json.load(sys.stdin)["jobs"][0]["read"]["clat_ns"]["percentile"]; print("%.2f %.2f" % (r["50.000000"] / 1000, r["99.000000"] / 1000))'
}
declare -A rule=(
  [fixed]='rules: [{name: fixed, type: delay, delay: 10us}]'
  [random]='rules: [{name: random, type: delay, delay: 10us, pattern: {random: {ratio: 10%}}, seed: SEED}]'
)
cases=(base fixed random)
for r in $(seq "$rounds"); do
  line="$r"
  for k in 0 1 2; do
    c=${cases[$(( (k + r) % 3 ))]}
    # a new seed per round: each round's random draws are independent of the others'
    [ "$c" = base ] || echo "${rule[$c]/SEED/$r}" | ctl add - >/dev/null
    read -r p50 p99 < <(clat_p50_us)
    line="$line $c=$p50/$p99"
    if [ "$c" = random ]; then
      line="$line $(ctl list | python3 -c 'import json,sys; r=json.load(sys.stdin)[0]; print("matched=%d fired=%d" % (r["matched"], r["fired"]))')"
    fi
    [ "$c" = base ] || ctl clear >/dev/null
  done
  echo "$line" | tee -a "$work/results" >&2
done
ctl stats > "$work/stats.json"

python3 - "$work/results" "$work/stats.json" "$secs" <<'PY'
import json, statistics, sys
rows = [dict(x.split("=", 1) for x in l.split()[1:]) for l in open(sys.argv[1])]
stats = json.load(open(sys.argv[2]))
p50 = lambda r, c: float(r[c].split("/")[0])
p99 = lambda r, c: float(r[c].split("/")[1])
client = [p50(r, "fixed") - p50(r, "base") - 10.0 for r in rows]
matched = sum(int(r["matched"]) for r in rows)
fired = sum(int(r["fired"]) for r in rows)
realized = fired / matched
late = stats["delay_lateness"]
print(f"fio randread 4 KiB QD1, {len(rows)} rounds x {sys.argv[3]} s per case; clat p50 / p99 in us (median over rounds)")
print(f"{'case':<8}{'p50':>9}{'p99':>9}")
for c in ["base", "fixed", "random"]:
    print(f"{c:<8}{statistics.median(p50(r, c) for r in rows):>9.2f}{statistics.median(p99(r, c) for r in rows):>9.2f}")
print(f"client error (fixed - base - 10 us), per round: {' '.join(f'{x:+.2f}' for x in client)}; median {statistics.median(client):+.2f} us")
print(f"daemon error (delay_lateness over {late['count']} delayed replies): p50 {late['p50_us']} us, p99 {late['p99_us']} us")
sd = 100 * (0.9 / (0.1 * matched)) ** 0.5
print(f"random 10%: matched {matched}, fired {fired}, realized {100 * realized:.3f}% (relative error {100 * (realized - 0.1) / 0.1:+.2f}%; binomial sd {sd:.2f}%)")
print(f"delay_error_us_p50={abs(statistics.median(client)):.2f} realized_ratio_error_pct={100 * abs(realized - 0.1) / 0.1:.2f}")
PY
