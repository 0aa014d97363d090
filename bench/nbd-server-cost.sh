#!/usr/bin/env bash
# bench/nbd-server-cost.sh CLIENT_BIN NAME=SERVER... -- what each NBD server costs per request,
# robust to a loaded machine. SERVER: a faultline binary (or a script that execs one, e.g. with
# FAULTLINE_NBD_BUSY_POLL_US=0 set), or `nbdkit` for nbdkit memory; each serves 1 GiB on a Unix
# socket, filled with the same random bytes, under a client disk of CLIENT_BIN
# (`serve --store nbd+unix://...`). fio runs N requests (default 20000) per job on each in turn,
# order rotated per round (ROUNDS, default 3); per request: the server's and the client disk's
# CPU time, voluntary and involuntary context switches (all threads alive at both ends of the
# job, from /proc), fio's mean and median completion latency, IOPS and fio's own CPU.
# JOBS="randread,4k,1 d:randread,4k,1": rw,bs,iodepth; `d:` runs fio's nbd engine straight at
# the server instead of the client disk (the server's context switches then read 0: its
# connection threads have exited when counted).
set -euo pipefail
client=$1; shift
n=${N:-20000}; rounds=${ROUNDS:-3}
work=$(mktemp -d /dev/shm/fl-nbdsrv.XXXXXX)
pids=()
cleanup() { local i; for ((i=${#pids[@]}-1;i>=0;i--)); do kill -TERM ${pids[$i]} 2>/dev/null || true; while kill -0 ${pids[$i]} 2>/dev/null; do sleep 0.1; done; done; rm -rf "$work"; }
trap cleanup EXIT INT TERM
head -c 1073741824 /dev/urandom > "$work/src"
declare -A dev spid cpid
names=()
for arg in "$@"; do
  nm=${arg%%=*}; cmd=${arg#*=}; names+=($nm)
  if [ "$cmd" = nbdkit ]; then nbdkit -f -U "$work/$nm.nbd" memory 1073741824 &
  else $cmd serve --size 1GiB --no-loop --nbd "unix:$work/$nm.nbd" --socket "$work/$nm.ctl" >/dev/null 2>&1 & fi
  pids+=($!); spid[$nm]=$!
  for _ in $(seq 300); do [ -S "$work/$nm.nbd" ] && break; sleep 0.1; done
  # the same random bytes in every server: reads hit allocated storage
  nbdcopy "$work/src" "nbd+unix:///?socket=$work/$nm.nbd"
  "$client" serve --store "nbd+unix:///?socket=$work/$nm.nbd" --socket "$work/c$nm.ctl" > "$work/c$nm.out" 2>"$work/c$nm.err" & pids+=($!); cpid[$nm]=$!
  for _ in $(seq 300); do [ -s "$work/c$nm.out" ] && break; sleep 0.1; done
  dev[$nm]=$(head -1 "$work/c$nm.out")
  case ${dev[$nm]} in /dev/loop*) ;; *) echo "client disk over $nm did not start: $(cat "$work/c$nm.err")" >&2; exit 1 ;; esac
done
cost() { local p=$1 t=0 v=0 iv=0
  read -r t < <(awk '{print $14+$15}' /proc/$p/stat)
  for s in /proc/$p/task/*/status; do v=$((v + $(awk '/^voluntary_ctxt_switches/{print $2}' $s))); iv=$((iv + $(awk '/^nonvoluntary_ctxt_switches/{print $2}' $s))); done
  echo "$t $v $iv"; }
for job in ${JOBS:-"randread,4k,1" "randwrite,4k,1"}; do
  set -- ${job//,/ }
  for r in $(seq $rounds); do
    k=0
    for i in $(seq 0 $((${#names[@]}-1))); do
      nm=${names[$(( (i + r) % ${#names[@]} ))]}
      sa=$(cost ${spid[$nm]}); ca=$(cost ${cpid[$nm]})
      case $1 in
        d:*) fio --name=p --ioengine=nbd --uri="nbd+unix:///?socket=$work/$nm.nbd" --rw=${1#d:} --bs=$2 --iodepth=$3 --size=1GiB --number_ios=$n --output-format=json --output=$work/f.json >/dev/null 2>&1 ;;
        *) fio --name=p --ioengine=libaio --direct=1 --filename=${dev[$nm]} --rw=$1 --bs=$2 --iodepth=$3 --size=1GiB --number_ios=$n --output-format=json --output=$work/f.json >/dev/null 2>&1 ;;
      esac
      sb=$(cost ${spid[$nm]}); cb=$(cost ${cpid[$nm]})
      python3 - "$sa" "$sb" "$ca" "$cb" "$n" "$job" "$nm" "$work/f.json" <<'PY'
import sys,json
sa,sb,ca,cb=[list(map(int,x.split())) for x in sys.argv[1:5]]; n=int(sys.argv[5])
j=json.load(open(sys.argv[8]))["jobs"][0]
io=j["read"] if j["read"]["total_ios"] else j["write"]
fio_cpu=(j["usr_cpu"]+j["sys_cpu"])/100*(j["job_runtime"]/1e3)*1e6/n
print(f"{sys.argv[6]:<16} {sys.argv[7]:<10} srv cpu_us={(sb[0]-sa[0])*1e4/n:6.2f} vcs={(sb[1]-sa[1])/n:5.2f} ivcs={(sb[2]-sa[2])/n:5.2f}  cli cpu_us={(cb[0]-ca[0])*1e4/n:6.2f} vcs={(cb[1]-ca[1])/n:5.2f} ivcs={(cb[2]-ca[2])/n:5.2f}  lat_us={io['clat_ns']['mean']/1e3:7.1f} p50={io['clat_ns']['percentile']['50.000000']/1e3:6.1f} iops={io['iops']:7.0f} fio_cpu_us={fio_cpu:5.1f}", flush=True)
PY
    done
  done
done
