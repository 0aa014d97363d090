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
  kill -INT "$fpid"; wait "$fpid" 2>/dev/null || true
  fpid=""
  cat "$1"/io_iops.*.log > "$2"
}
