# Shared by the bench scripts (sourced): settings every candidate of a run gets alike.

# HOLD_CPU_LATENCY=1: hold a 0 us CPU wake-up latency (/dev/cpu_dma_latency) for the rest of
# the calling script, so idle CPUs poll instead of halting for every candidate alike. The
# request lives as long as fd 9 (text "0": a 0 us limit), i.e. the script.
hold_cpu_latency() { # who: what the message says is measured with the hold
  [ "${HOLD_CPU_LATENCY:-0}" = 1 ] || return 0
  exec 9>/dev/cpu_dma_latency
  printf 0 >&9
  echo "HOLD_CPU_LATENCY=1: $1 measured with the CPU latency limit held at 0 us" >&2
}

# The peers (../shared/bench, or FAULTLINE_PEERS): `need_peers SCRIPT` stops with the reason
# when the caller's $peers is not there.
need_peers() {
  [ -d "$peers" ] || { echo "$1: peer scripts not found at $peers (expected in the shared folder beside the repository; set FAULTLINE_PEERS to its bench/)" >&2; exit 2; }
}

# POINTS="w128k-qd1 rr4k-qd32": keep only the named entries of the array `points`
# ("name|fio args" each); an error naming the choices if none matches.
select_points() { # script name, for the error
  [ -n "${POINTS:-}" ] || return 0
  local p sel=() all=()
  for p in "${points[@]}"; do
    all+=("${p%%|*}")
    [[ " $POINTS " == *" ${p%%|*} "* ]] && sel+=("$p")
  done
  [ ${#sel[@]} -gt 0 ] || { echo "$1: POINTS=\"$POINTS\" names none of ${all[*]}" >&2; exit 2; }
  points=("${sel[@]}")
}

# CPU time of a process's threads in ns, from their schedstat (exact, not in clock ticks);
# 0 for no pid or a process gone.
cpu_ns() { [ -n "$1" ] && cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{s += $1} END {printf "%.0f\n", s}' || echo 0; }

# One long fio run whose throughput is read in windows (bench/windows.py): fio with ARGS in the
# background, its IOPS log (100 ms averages, Unix-epoch stamps) in DIR; sets fpid. Then
# stop_window_fio DIR DEST ends it and gathers its threads' logs into DEST.
start_window_fio() { # DIR fio-args...
  local dir=$1; shift
  rm -f "$dir"/io_iops.*.log
  fio --name=p "$@" --runtime=100000 --time_based --write_iops_log="$dir/io" \
    --log_avg_msec=100 --log_unix_epoch=1 > /dev/null 2> "$dir/fio.err" &
  fpid=$!
}
stop_window_fio() { # DIR DEST
  kill -INT "$fpid"; end_or_kill "$fpid" fio
  fpid=""
  cat "$1"/io_iops.*.log > "$2"
}

# `micro_build NAME` builds the micro-benchmark bench/micro/NAME.rs (release) and prints the path
# of its program, which runs like any other (`cargo bench --bench NAME` runs it once).
micro_build() {
  (cd "$top" && cargo bench --quiet --no-run --bench "$1" --message-format=json) |
    python3 -c 'import json, sys
exe = [m["executable"] for m in map(json.loads, sys.stdin) if m.get("executable") and m["target"]["name"] == sys.argv[1]]
print(exe[0]) if exe else sys.exit(1)' "$1"
}

# Where the host placed this VM's CPUs: the cross-CPU cache-line round trip in ns
# (bench/micro/xcpu.rs), "-" where it cannot run (one CPU). On the VMs here it is tens of ns while
# the two vCPUs share a cache and several hundred while they do not; the host moves them between
# the two every few seconds to minutes, and every candidate slows down in the second (by
# different amounts: BENCHMARKS.md, "Host placement"), so take_turns records it each round.
# `xcpu_build` (the caller's $top) builds it; take_turns calls `xcpu_ns`.
xcpu_bin=""
xcpu_build() {
  xcpu_bin=$(micro_build xcpu)
}
xcpu_ns() { { [ -n "$xcpu_bin" ] && "$xcpu_bin" 2>/dev/null; } || echo -; }

# Stopped runs in turns: `take_turns FILE ROUNDS SECS NAME...`, each NAME's process ${qpid[NAME]}
# stopped (SIGSTOP) beforehand; each round lets every NAME run alone for SECS (SIGCONT, 50 ms to
# settle, the window, SIGSTOP), the order reversed every other round, and appends "round name
# t0 t1 cpu_ns" to FILE, cpu_ns being the CPU time of process ${pid[NAME]} in the window (0 where
# pid has no NAME), and "round ns" to FILE.xcpu (`xcpu_ns` before the round's windows). Uses the
# caller's associative arrays qpid and pid.
take_turns() {
  local file=$1 rounds=$2 secs=$3 n r i c0 c1 t0 t1
  shift 3
  local names=("$@") order
  : > "$file"
  : > "$file.xcpu"
  for r in $(seq "$rounds"); do
    echo "$r $(xcpu_ns)" >> "$file.xcpu"
    if (( r % 2 )); then order=("${names[@]}"); else order=(); for ((i = ${#names[@]} - 1; i >= 0; i--)); do order+=("${names[$i]}"); done; fi
    for n in "${order[@]}"; do
      kill -CONT "${qpid[$n]}"
      sleep 0.05
      c0=$(cpu_ns "${pid[$n]:-}")
      t0=$EPOCHREALTIME
      sleep "$secs"
      t1=$EPOCHREALTIME
      c1=$(cpu_ns "${pid[$n]:-}")
      kill -STOP "${qpid[$n]}"
      echo "$r $n $t0 $t1 $((c1 - c0))" >> "$file"
    done
  done
}

# Candidates in turns at one fio point: `fio_turns DIR ROUNDS SECS NAME...` starts one
# time-based fio run per NAME on ${dev[NAME]} with the caller's array fio_args (IOPS log in
# DIR/q.NAME), lets each run 0.3 s (its start-up stays out of the first window) and stops it,
# takes turns (`take_turns` into DIR/windows) and ends the runs; their logs end in
# DIR/iops.NAME (bench/windows.py reads them). Uses the caller's associative arrays dev, pid
# (whose CPU a window counts) and qpid (the stopped fio runs, for the caller's cleanup; emptied
# at the end).
fio_turns() {
  local dir=$1 rounds=$2 secs=$3 n
  shift 3
  mkdir -p "$dir"
  [ -n "$xcpu_bin" ] || xcpu_build || echo "fio_turns: bench/micro/xcpu.rs did not build; host placement not recorded" >&2
  for n in "$@"; do
    mkdir -p "$dir/q.$n"
    fio --name=p --thread --filename="${dev[$n]}" --direct=1 --size=512M "${fio_args[@]}" \
      --runtime=100000 --time_based --write_iops_log="$dir/q.$n/io" --log_avg_msec=100 --log_unix_epoch=1 > /dev/null 2> "$dir/q.$n/err" &
    qpid[$n]=$!
    sleep 0.3
    kill -STOP "${qpid[$n]}"
  done
  take_turns "$dir/windows" "$rounds" "$secs" "$@"
  for n in "$@"; do
    kill -CONT "${qpid[$n]}"; kill -INT "${qpid[$n]}"
    end_or_kill "${qpid[$n]}" "fio on $n"
    cat "$dir/q.$n"/io_iops.*.log > "$dir/iops.$n"
  done
  qpid=()
}

# Wait for a child that was told to end (`end_or_kill PID WHAT`): after 30 s it is killed, with
# a message (once, a fio run sat in its final sleep for minutes after SIGINT).
end_or_kill() {
  local i
  for i in $(seq 300); do
    running "$1" || break
    sleep 0.1
  done
  if running "$1"; then
    echo "$2 did not end 30 s after it was told to; killed" >&2
    kill -KILL "$1" 2>/dev/null || true
  fi
  wait "$1" 2>/dev/null || true
}
# Whether a child still runs: one that exited stays a zombie (state Z) until waited for.
running() { [ -e "/proc/$1" ] && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]; }

# The FUSE background limit of the connection a faultline loop device reads through:
# `set_max_background DEV N` (congestion threshold at 3/4 of it, as the kernel's defaults).
set_max_background() {
  local back conn
  # the connection's id is the minor device number of the FUSE mount the loop device reads
  back=$(losetup -nO BACK-FILE "$1")
  conn=/sys/fs/fuse/connections/$(python3 -c 'import os, sys; print(os.minor(os.stat(sys.argv[1]).st_dev))' "$back")
  echo "$2" > "$conn/max_background"
  echo $(( $2 * 3 / 4 )) > "$conn/congestion_threshold"
  echo "$conn"
}
