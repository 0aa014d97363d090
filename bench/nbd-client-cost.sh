#!/usr/bin/env bash
# bench/nbd-client-cost.sh NEW_BIN BASE_BIN SERVER -- what the NBD client store costs per request,
# robust to a loaded machine: two client disks (`faultline serve --store nbd+unix://...`), one of
# each binary, over one server (SERVER: a faultline binary, or `nbdkit` for nbdkit memory); fio
# (libaio, O_DIRECT) runs N requests (default 20000) per job on each disk in turn, order
# alternated per round (ROUNDS, default 3), and the client process's CPU time, voluntary and
# involuntary context switches (all its threads, /proc) are divided by N. Wall IOPS are printed
# too (noise on a loaded machine). JOBS="randread,4k,1 write,128k,1" picks jobs (rw,bs,iodepth).
set -euo pipefail
new=$1; base=$2; server_bin=$3; n=${N:-20000}; rounds=${ROUNDS:-3}
work=$(mktemp -d /dev/shm/fl-nbdcpu.XXXXXX)
pids=()
cleanup() { local i; for ((i=${#pids[@]}-1;i>=0;i--)); do kill -TERM ${pids[$i]} 2>/dev/null || true; while kill -0 ${pids[$i]} 2>/dev/null; do sleep 0.1; done; done; rm -rf "$work"; }
trap cleanup EXIT INT TERM
if [ "$server_bin" = nbdkit ]; then
  nbdkit -f -U "$work/s.nbd" memory 1073741824 & pids+=($!)
else
  "$server_bin" serve --size 1GiB --no-loop --nbd "unix:$work/s.nbd" --socket "$work/s.ctl" >/dev/null 2>&1 & pids+=($!)
fi
for _ in $(seq 300); do [ -S "$work/s.nbd" ] && break; sleep 0.1; done
declare -A dev pid
for c in new base; do
  bin=$new; [ $c = base ] && bin=$base
  "$bin" serve --store "nbd+unix:///?socket=$work/s.nbd" --socket "$work/$c.ctl" > "$work/$c.out" 2>"$work/$c.err" & pids+=($!); pid[$c]=$!
  for _ in $(seq 300); do [ -s "$work/$c.out" ] && break; sleep 0.1; done
  dev[$c]=$(head -1 "$work/$c.out")
done
cost() { # pid -> "cpu_ticks vol_cs invol_cs"
  local p=$1 t=0 v=0 iv=0
  read -r t < <(awk '{print $14+$15}' /proc/$p/stat)
  for s in /proc/$p/task/*/status; do
    v=$((v + $(awk '/^voluntary_ctxt_switches/{print $2}' $s)))
    iv=$((iv + $(awk '/^nonvoluntary_ctxt_switches/{print $2}' $s)))
  done
  echo "$t $v $iv"
}
for job in ${JOBS:-"randread,4k,1" "randwrite,4k,1" "randread,4k,32" "write,128k,1"}; do
  job=${job//,/ }
  set -- $job
  for r in $(seq $rounds); do
    for c in new base; do
      a=$(cost ${pid[$c]})
      t0=$(date +%s.%N)
      fio --name=p --ioengine=libaio --direct=1 --filename=${dev[$c]} --rw=$1 --bs=$2 --iodepth=$3 --size=1GiB --number_ios=$n --output-format=json --output=$work/f.json >/dev/null 2>&1
      t1=$(date +%s.%N)
      b=$(cost ${pid[$c]})
      python3 - "$a" "$b" "$n" "$job" "$c" "$t0" "$t1" <<'PY'
import sys
a=list(map(int,sys.argv[1].split())); b=list(map(int,sys.argv[2].split())); n=int(sys.argv[3])
print(f"{sys.argv[4]:<16} {sys.argv[5]:<5} cpu_us/req={(b[0]-a[0])*1e4/n:7.2f} vol_cs/req={(b[1]-a[1])/n:5.2f} invol_cs/req={(b[2]-a[2])/n:5.2f} wall_iops={n/(float(sys.argv[7])-float(sys.argv[6])):8.0f}")
PY
    done
  done
done
