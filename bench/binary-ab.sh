#!/usr/bin/env bash
# bench/binary-ab.sh BIN_A BIN_B [ROUNDS] [SECONDS] [FIO-ARGS...] -- two builds of faultline
# (say main's and a branch's) serving side by side with the same settings, one fio point run on
# both back to back per round, order alternating by round. Per round: IOPS and the daemon's CPU
# time per I/O (user+system of the serve process / I/Os), which varies far less than IOPS on a
# loaded machine. Default point: w128k-qd1 (`--rw=write --bs=128k --ioengine=psync`). Beside them,
# the rest of the round trip's CPU per I/O: fio's own (user+system, from its report) and the
# machine's ksoftirqd threads (the block completions of a loop device run there; machine-wide, so
# other tenants' softirq work lands in it too), and the daemon's context switches per I/O.
#   RULES=1       arm device.sh's 100k never-matching rules (50k content, 50k offset) on both
#   SERVE_ARGS=.. extra `serve` arguments for both (e.g. "--busy-poll 0 --cpu-latency keep",
#                 so the CPU figure counts work, not polling)
#   MAX_BACKGROUND_A=N / MAX_BACKGROUND_B=N  set that candidate's FUSE connection's
#                 max_background (/sys/fs/fuse/connections/ID/; faultline asks for 12 over
#                 io_uring, 256 on the classic path) after it starts, with congestion_threshold at 3/4 of it;
#                 with BIN_A = BIN_B this compares the setting alone
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
  mb_var=MAX_BACKGROUND_${n^^}
  if [ -n "${!mb_var:-}" ]; then
    # the connection's id is the minor device number of the FUSE mount the loop device reads
    back=$(losetup -nO BACK-FILE "${dev[$n]}")
    conn=/sys/fs/fuse/connections/$(python3 -c 'import os, sys; print(os.minor(os.stat(sys.argv[1]).st_dev))' "$back")
    echo "${!mb_var}" > "$conn/max_background"
    echo $(( ${!mb_var} * 3 / 4 )) > "$conn/congestion_threshold"
    echo "$n: $conn max_background=$(cat "$conn/max_background") congestion_threshold=$(cat "$conn/congestion_threshold")" >&2
  fi
done
# CPU time in ns (schedstat) and context switches of every thread of a process, and of the
# machine's ksoftirqd threads: "daemon_ns daemon_switches softirq_ns"
snap() {
  python3 - "$1" <<'PY'
import os, sys
def threads(pid):
    for t in os.listdir(f"/proc/{pid}/task"):
        yield f"/proc/{pid}/task/{t}"
ns = sw = 0
for t in threads(sys.argv[1]):
    try:
        ns += int(open(f"{t}/schedstat").read().split()[0])
        for l in open(f"{t}/status"):
            if "ctxt_switches" in l:  # voluntary and nonvoluntary
                sw += int(l.split()[1])
    except OSError:
        pass
soft = 0
for p in os.listdir("/proc"):
    if p.isdigit():
        try:
            if open(f"/proc/{p}/comm").read().startswith("ksoftirqd/"):
                soft += int(open(f"/proc/{p}/schedstat").read().split()[0])
        except OSError:
            pass
print(ns, sw, soft)
PY
}
for r in $(seq "$rounds"); do
  if (( r % 2 )); then order=(a b); else order=(b a); fi
  line="$r"
  for n in "${order[@]}"; do
    s0=$(snap "${pid[$n]}")
    out=$(fio --name=p --filename="${dev[$n]}" --direct=1 --size=512M --runtime="$secs" --time_based --output-format=json "${fio_args[@]}" 2>/dev/null)
    s1=$(snap "${pid[$n]}")
    # name=IOPS/daemon CPU us/fio CPU us/ksoftirqd CPU us/daemon switches, all per I/O
    line="$line $n=$(python3 -c '
import json, sys
j = json.loads(sys.argv[1])["jobs"][0]
ios = max(j["read"]["total_ios"] + j["write"]["total_ios"], 1)
iops = int(j["read"]["iops"] + j["write"]["iops"])
(d0, w0, k0), (d1, w1, k1) = (map(int, s.split()) for s in sys.argv[2:4])
fio_us = (j["usr_cpu"] + j["sys_cpu"]) / 100 * j["job_runtime"] * 1e3 / ios
print(f"{iops}/{(d1 - d0) / 1e3 / ios:.2f}/{fio_us:.2f}/{(k1 - k0) / 1e3 / ios:.2f}/{(w1 - w0) / ios:.3f}")' "$out" "$s0" "$s1")"
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
med = lambda n, i: statistics.median(r[n][i] for r in rows)
print("(per round above: IOPS/daemon CPU us/fio CPU us/ksoftirqd CPU us/daemon context switches, per I/O)")
for i, what in [(2, "fio CPU us per I/O"), (3, "ksoftirqd CPU us per I/O"), (4, "daemon context switches per I/O")]:
    print(f"{what}: a={med('a', i):.3f} b={med('b', i):.3f}")
print(f"iops_ratio_b_vs_a={ratio:.2f} cpu_per_io_a_us={med('a', 1):.2f} cpu_per_io_b_us={med('b', 1):.2f}")
PY
