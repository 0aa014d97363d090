#!/usr/bin/env bash
# bench/monitor-progs.sh ROUNDS LAYER BIN... -- what each BPF program of the monitor costs per
# event, for faultline binaries side by side (e.g. a build of main and one of a branch):
# `kernel.bpf_stats_enabled=1` (restored after), then per round, for each binary (order
# reversed every other round), `BIN monitor --device DEV` with LAYER's options on one faultline
# disk while fio does 3 s of 4 KiB random reads (QD1 with psync, or IODEPTH=N with io_uring); prints each program's run time per run
# (run_time_ns / run_cnt over the fio run, from `bpftool prog show`) and its run count, beside
# fio's I/O count and IOPS. LAYER: block (the default monitor), driver (`--layers driver`) or
# syscall (`--pid` of fio's launcher: fio is forked after attach and timed).
# A program that runs for every device's or every process's events (the block and syscall
# programs) shows the other engineers' events too: compare rounds where its run count is close
# to the I/O count for a request's own cost. BIN may be a wrapper script that sets
# FAULTLINE_MONITOR_ATTACH to compare attach types.
set -euo pipefail
rounds=${1:-4}
layer=${2:-block}
shift 2
[ $# -ge 1 ] || { echo "usage: $0 ROUNDS block|driver|syscall BIN..." >&2; exit 2; }
work=$(mktemp -d)
spid=""
mpid=""
stats0=$(cat /proc/sys/kernel/bpf_stats_enabled)
cleanup() {
  [ -n "$mpid" ] && kill -INT "$mpid" 2>/dev/null && wait "$mpid" 2>/dev/null
  [ -n "$spid" ] && kill -TERM "$spid" 2>/dev/null && while kill -0 "$spid" 2>/dev/null; do sleep 0.1; done
  sysctl -q kernel.bpf_stats_enabled="$stats0"
  rm -rf "$work"
}
trap cleanup EXIT INT TERM
"$1" serve --size 1GiB --socket "$work/ctl.sock" > "$work/serve.out" 2> "$work/serve.err" &
spid=$!
for _ in $(seq 600); do [ -s "$work/serve.out" ] && break; sleep 0.1; done
dev=$(head -1 "$work/serve.out")
[ -b "$dev" ] || { echo "serve did not start: $(cat "$work/serve.err")" >&2; exit 1; }
fio --name=pre --filename="$dev" --direct=1 --size=512M --rw=write --bs=1M --ioengine=psync >/dev/null 2>&1
sysctl -q kernel.bpf_stats_enabled=1
qd=${IODEPTH:-1}
engine=(--ioengine=psync)
(( qd > 1 )) && engine=(--ioengine=io_uring --iodepth="$qd")
fio_args=(--name=p --filename="$dev" --direct=1 --size=512M --runtime=3 --time_based --rw=randread --bs=4k "${engine[@]}" --output-format=json)
# "ID NAME RUN_TIME_NS RUN_CNT" of the programs loaded since the ids in file $1 were listed
# (the monitor's: bpftool may not name a program's process)
progs() {
  bpftool prog show | awk -v old="$1" '
    BEGIN { while ((getline l < old) > 0) skip[l] = 1 }
    /^[0-9]+:/ { id = $1; sub(":", "", id); if (id in skip) next; name = ""; t = 0; c = 0
                 for (i = 1; i <= NF; i++) { if ($i == "name") name = $(i + 1); if ($i == "run_time_ns") t = $(i + 1); if ($i == "run_cnt") c = $(i + 1) }
                 print id, name, t, c }'
}
for r in $(seq "$rounds"); do
  bins=("$@")
  (( r % 2 )) || bins=($(printf '%s\n' "$@" | tac))
  for b in "${bins[@]}"; do
    extra=()
    fp=""
    rm -f "$work/go"
    case $layer in
      block) ;;
      driver) extra=(--layers driver) ;;
      syscall)
        bash -c 'while [ ! -e "$1/go" ]; do sleep 0.05; done; shift; exec fio "$@" > "$0" 2>/dev/null' "$work/fio.json" "$work" "${fio_args[@]}" &
        fp=$!
        extra=(--pid "$fp") ;;
      *) echo "LAYER: block, driver or syscall, not $layer" >&2; exit 2 ;;
    esac
    bpftool prog show | awk '/^[0-9]+:/ { sub(":", "", $1); print $1 }' > "$work/ids"
    "$b" monitor --device "$dev" "${extra[@]}" > "$work/mon.out" 2> "$work/mon.err" &
    mpid=$!
    for _ in $(seq 200); do grep -q '^monitoring' "$work/mon.out" 2>/dev/null && break; sleep 0.05; done
    progs "$work/ids" > "$work/p0"
    if [ -n "$fp" ]; then touch "$work/go"; wait "$fp"; else fio "${fio_args[@]}" > "$work/fio.json" 2>/dev/null; fi
    progs "$work/ids" > "$work/p1"
    kill -INT "$mpid"; wait "$mpid" 2>/dev/null || true
    mpid=""
    ios=$(python3 -c "import json,sys; j=json.load(open(sys.argv[1]))['jobs'][0]; print(j['read']['total_ios'], round(j['read']['iops']))" "$work/fio.json")
    out=$(join <(sort "$work/p0") <(sort "$work/p1") | awk '{ c = $7 - $4; if (c > 0) printf " %s=%dns/%d", $2, ($6 - $3) / c, c }')
    echo "$r $(basename "$b") ios/iops $ios$out"
  done
done
