#!/usr/bin/env bash
# bench/monitor-syscalls.sh [ROUNDS] [CALLS] [BIN] -- what the syscall layer costs a system
# call, the kernel's dispatch to our programs included (which bpf_stats' run times leave out):
# a small C loop times CALLS calls of getppid (a call the layer does not time: what every
# other process on the machine pays, e.g. the disk daemons' busy polls) and CALLS 1-byte
# pread64 of /dev/zero (a timed call) with clock_gettime around each loop, while
#   none:   no monitor
#   raw:    `BIN monitor --pid LOOP` forced onto raw_syscalls (FAULTLINE_MONITOR_ATTACH=tp_btf:
#           two programs on every system call of the machine, the number tested first)
#   events: `BIN monitor --pid LOOP`, the default: per-syscall tracepoints of the timed calls
# The loop is the watched process (started after attach, so its timed calls are timed). Per
# round every mode runs once, the order rotated by round and reversed every other round;
# prints per round ns per call for both loops, then per mode the median over rounds of the
# per-round paired difference against that round's `none` run (ns added per call).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/.." && pwd)
rounds=${1:-8}
calls=${2:-2000000}
fl=${3:-$top/target/release/faultline}
work=$(mktemp -d)
mpid=""
cleanup() {
  [ -n "$mpid" ] && kill -INT "$mpid" 2>/dev/null && wait "$mpid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT INT TERM
cat > "$work/loop.c" <<'C'
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e9 + t.tv_nsec; }
int main(int argc, char **argv) {
  long n = atol(argv[1]);
  int fd = open("/dev/zero", O_RDONLY);
  char b;
  double t0 = now();
  for (long i = 0; i < n; i++) syscall(SYS_getppid);
  double t1 = now();
  for (long i = 0; i < n; i++) if (pread(fd, &b, 1, 0) != 1) return 1;
  double t2 = now();
  printf("%.1f %.1f\n", (t1 - t0) / n, (t2 - t1) / n);
  return 0;
}
C
cc -O2 -o "$work/loop" "$work/loop.c"
modes=(none raw events)
run_mode() { # mode -> "untimed-ns timed-ns" in $work/out
  rm -f "$work/go"
  bash -c 'while [ ! -e "$1/go" ]; do sleep 0.02; done; exec "$1/loop" "$2"' _ "$work" "$calls" > "$work/out" &
  local lp=$!
  if [ "$1" != none ]; then
    local env=()
    [ "$1" = raw ] && env=(FAULTLINE_MONITOR_ATTACH=tp_btf)
    env "${env[@]}" "$fl" monitor --pid "$lp" > "$work/mon.out" 2> "$work/mon.err" &
    mpid=$!
    for _ in $(seq 200); do grep -q '^monitoring' "$work/mon.out" 2>/dev/null && break; sleep 0.05; done
    grep -q '^monitoring' "$work/mon.out" || { echo "monitor did not start: $(cat "$work/mon.err")" >&2; exit 1; }
  fi
  touch "$work/go"
  wait "$lp"
  if [ -n "$mpid" ]; then kill -INT "$mpid"; wait "$mpid" 2>/dev/null || true; mpid=""; fi
}
: > "$work/samples"
for r in $(seq "$rounds"); do
  line="$r"
  for k in $(seq 0 $((${#modes[@]} - 1))); do
    (( r % 2 )) && k=$(( ${#modes[@]} - 1 - k ))
    m=${modes[$(( (k + r) % ${#modes[@]} ))]}
    run_mode "$m"
    read -r u t < "$work/out"
    line="$line $m=$u/$t"
  done
  echo "$line" | tee -a "$work/samples"
done
python3 - "$work/samples" <<'PY'
import sys, statistics as st
rows = [dict(kv.split("=") for kv in l.split()[1:]) for l in open(sys.argv[1]) if l.strip()]
val = lambda r, m, i: float(r[m].split("/")[i])
print(f"none: untimed call {st.median(val(r, 'none', 0) for r in rows):.1f} ns, timed call {st.median(val(r, 'none', 1) for r in rows):.1f} ns (medians)")
for m in ("raw", "events"):
    u = [val(r, m, 0) - val(r, "none", 0) for r in rows]
    t = [val(r, m, 1) - val(r, "none", 1) for r in rows]
    print(f"{m}: untimed call +{st.median(u):.1f} ns [{min(u):.1f}, {max(u):.1f}], timed call +{st.median(t):.1f} ns [{min(t):.1f}, {max(t):.1f}] (median, min, max of per-round differences)")
PY
