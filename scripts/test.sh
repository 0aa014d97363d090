#!/usr/bin/env bash
# The whole test suite: unit tests and real-kernel integration tests (FUSE, loop devices, fio),
# then a check that nothing was left behind. Two passes: with the default transport (FUSE over
# io_uring where the kernel has it), then with FAULTLINE_RING=off, which makes the machine look
# like one whose kernel lacks it (Linux before 6.14): everything over classic /dev/fuse, and the
# tests that need the ring report themselves skipped. Both passes must pass.
#
# The second pass runs only what the transport changes, which is every test but those listed
# below (a new test is in both passes until it is listed), each list checked in the first pass:
# - TRANSPORT_FREE: tests that never serve a disk over FUSE. The first pass runs them with
#   FAULTLINE_RING set to a value faultline refuses, so one that serves a FUSE disk after all
#   fails there, loudly, instead of going untested over classic /dev/fuse.
# - TRANSPORT_PINNED: tests each of whose disks names its transport (`--ring`, `ring:` in an
#   experiment): the first pass has run their classic /dev/fuse half already. The first pass
#   runs them with FAULTLINE_TEST_PINNED=1, and tests/common fails a disk that leaves it to
#   the default there.
# A `binary::test` entry names one test of a binary; a renamed or removed one is an error.
#
# Each pass gives its faultline processes a run directory of their own (FAULTLINE_RUN_DIR), so
# the leftover check sees the suite's loop devices and mounts only, not those of other users of
# the machine; tests with a RunDir of their own make it beside that one, under the same prefix.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. scripts/env.sh

# Test binaries (tests/NAME.rs; `lib` is the library's unit tests, `bin` the CLI's) and tests
# that never expose a disk over FUSE: specs and reports, the module graph, NBD without a loop
# device, network emulation, networked experiments (the target serves over NBD, clients read
# over NBD), host faults on plain processes, bad input refused before a disk is made.
TRANSPORT_FREE=(
  agents_run cluster layering lib bin net net_cut performability profile report
  bad_input::bad_units_and_values
  bad_input::control_socket_path_is_checked_before_anything_is_built
  bad_input::device_store_needs_destructive_and_refuses_signatures
  bad_input::failed_run_leaves_no_results_directory
  bad_input::host_faults_on_faultline_itself
  bad_input::malformed_yaml
  bad_input::missing_dev_fuse
  bad_input::monitor_and_host_duration_of_zero
  bad_input::monitor_interval_and_out
  bad_input::not_root
  bad_input::output_paths_are_checked_before_the_work
  bad_input::profile_of_no_data
  bad_input::unknown_key_names_line_and_key
  bad_input::workload_bound_of_zero
  bad_input::workload_out_that_is_a_file
  bad_input::workload_span_below_one_block_per_thread
  crash_run::bad_power_cuts_are_refused_with_their_place
  host::a_cpu_quota_caps_busy_processes
  host::a_freeze_stops_processes_until_the_window_ends
  host::a_memory_limit_is_hit_by_an_allocating_process
  host::bad_faults_are_refused_before_anything_runs
  host::cleanup_thaws_what_a_killed_faultline_froze
  host::held_memory_is_resident_while_held
  host::kill_and_restart_replaces_the_process
  host::spinners_take_at_most_their_share
  nbd::faults_reach_libnbd_clients
  nbd::hostile_clients_get_errors_or_closed_connections_never_a_crash
  nbd::nbdcopy_in_and_out_over_tcp_and_unix_with_several_connections
  nbd::nbdinfo_shows_size_flags_and_exports
  nbd::qemu_clients_copy_and_compare
  nbd::stats_count_connections_and_requests_in_flight
  nbd_client::interface_nbd_workload_and_verify_against_nbdkit
  nbd_client::interface_nbd_workload_and_verify_against_ours_with_retries
  nbd_client::one_connection_shared_by_threads_out_of_order_replies_and_a_timeout_among_them
  nbd_client::target_queue_depth_is_probed_in_networked_experiments
  power_cut::a_seed_repeats_its_survivors
  power_cut::bad_power_requests_are_refused_clearly
  power_cut::flush_and_fua_over_nbd
  slowdown::bad_matrices_say_where_and_what_is_allowed
  slowdown::matrix_expands_to_named_merged_setups_in_order
  slowdown::matrix_faults_from_several_axes_are_joined_and_baseline_parses
  slowdown::matrices_concatenate_their_setups
)

# Tests whose every disk names its transport: each of actions' tests runs as NAME::classic,
# NAME::ring and NAME::ring_per_cpu; delay's over `transports()`; the paired slowdown study
# over classic /dev/fuse (`ring: off`); the crash recipes (a minute each for PostgreSQL), the
# crash explorations and the latency model's timing tests each over one transport (half
# classic, half io_uring where the kernel has it: `common::ring_where_available`).
TRANSPORT_PINNED=(
  actions
  crash_explore
  crash_recipes
  delay
  latency_model::fixed_service_time_and_size_term
  latency_model::one_channel_queues_requests
  latency_model::held_delay_queues_the_reads_behind_it
  latency_model::calibrate_recovers_a_known_model
  power_cut::each_model_keeps_what_it_says_over_the_loop_device
  power_cut::the_page_cache_above_the_device_does_not_leak_pre_cut_data
  slowdown::paired_runs_alternate_and_show_the_write_slowdown
  slowdown::paired_windows_pair_exactly_and_find_a_held_delay
  slowdown::monitor_layers_place_a_delay_held_in_the_device
  slowdown::monitor_layers_in_paired_windows_place_a_held_delay
)

# Binaries that run with no other binary beside them, one after another once the others are
# done: they compare rates, latencies or windows with what they asked for and need the CPU time
# they ask for (beside other binaries, pings and NBD connects missed their windows, and block
# service times grew by half); they keep processes in mount namespaces of their own (`ip netns
# exec`), whose copies of every FUSE mount of the moment stall other binaries' disk teardowns
# (the server aborts the connection after 5 s, then finds its loop device still held); or they
# change what the whole machine shares (the CPU latency limit, the next free loop device's
# settings). run's dedup study counted no failure for its rotten shared block twice beside
# other binaries over classic /dev/fuse (btrfs saw the corruption), and passed alone.
# crash_recipes cuts the power a fixed time into database runs (initdb, start-up, commits):
# beside other binaries, fewer or no commits come before the cut.
ALONE=(agents_run busy_poll cleanup cluster cpu_latency crash_recipes delay latency_model monitor nbd_client net net_cut performability run steer)
# Other binaries run this many at a time, each with this many tests at a time.
JOBS=${FAULTLINE_TEST_JOBS:-3}
THREADS=${FAULTLINE_TEST_THREADS:-2}
# Binaries whose tests run one at a time. monitor: its tests compare the block layer's counts
# with the workload's, and with two of them at once (each with its own monitor, disk and
# workload) the block layer came up short beyond its allowance in 3 of 12 runs of the binary
# on a loaded machine, against 0 of 8 one at a time (docs/monitor.md, blind spots).
SERIAL=(monitor)
# What FAULTLINE_RING is set to for TRANSPORT_FREE tests in the first pass: not a value
# faultline accepts, so a FUSE disk there fails to start, naming it.
NOT_A_TRANSPORT=transport-free-test-serves-no-fuse-disk

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
summary=()
failed=0

# Build everything `cargo test` builds; list the test executables as "NAME PATH".
cargo test --release --no-run --message-format=json 2>"$work/build.err" \
  | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        kind = m["target"]["kind"][0]
        print(m["target"]["name"] if kind == "test" else kind, m["executable"])
' >"$work/bins" || { cat "$work/build.err" >&2; exit 1; }
declare -A exe
while read -r name path; do exe[$name]=$path; done <"$work/bins"

# The entries of list $1 (a name) for binary $2: "*" for the whole binary, else its test names.
entries_of() {
  local -n list=$1
  local e
  for e in "${list[@]}"; do
    if [ "$e" = "$2" ]; then echo "*"; elif [ "${e%%::*}" = "$2" ] && [ "$e" != "${e#*::}" ]; then echo "${e#*::}"; fi
  done
}

# A stale entry (a binary or test renamed or removed) is an error: the list says what it covers.
for e in "${TRANSPORT_FREE[@]}" "${TRANSPORT_PINNED[@]}" "${ALONE[@]}" "${SERIAL[@]}"; do
  b=${e%%::*}
  [ -n "${exe[$b]:-}" ] || { echo "test: scripts/test.sh names test binary '$b', which does not exist" >&2; exit 1; }
  if [ "$e" != "$b" ]; then
    grep -qx "${e#*::}: test" <<<"$("${exe[$b]}" --list --format terse 2>/dev/null)" \
      || { echo "test: scripts/test.sh names test '$e', which does not exist" >&2; exit 1; }
  fi
done

# One run of binary $2 in pass directory $1: "$3" is the FAULTLINE_RING value ("-" for empty),
# "$4" FAULTLINE_TEST_PINNED's ("-" for unset), the rest libtest arguments. Output to its own
# log; an exit code other than 0 is recorded in it.
run_bin() {
  local dir=$1 name=$2 ring=${3#-} pinned=${4#-}; shift 4
  local log="$dir/$name.$RANDOM.log" t0=$SECONDS rc=0
  (
    [ -n "$pinned" ] && export FAULTLINE_TEST_PINNED=$pinned
    local threads=$THREADS
    [[ " ${SERIAL[*]} " == *" $name "* ]] && threads=1
    FAULTLINE_RING=$ring exec "${exe[$name]}" --test-threads="$threads" "$@"
  ) >"$log" 2>&1 </dev/null || rc=$?
  local args="$*"
  echo "$((SECONDS - t0))s $name ${args:0:60}${ring:+ FAULTLINE_RING=$ring}${pinned:+ FAULTLINE_TEST_PINNED=1}, exit $rc" | tee -a "$dir/times" | sed 's/^/test: /'
  [ "$rc" = 0 ] || echo "test: $name exited $rc" >>"$log"
}

# The runs of binary $2 in pass $1 ("default" or "ring-off") with FAULTLINE_RING=$3: one line
# per run, "NAME RING PINNED ARGS" ("-" for an empty RING, an unset PINNED).
runs_of() {
  local pass=$1 name=$2 ring=${3:--}
  local free pinned
  free=$(entries_of TRANSPORT_FREE "$name" | tr '\n' ' ')
  pinned=$(entries_of TRANSPORT_PINNED "$name" | tr '\n' ' ')
  if [ "$free" = "* " ]; then
    if [ "$pass" = default ]; then echo "$name $NOT_A_TRANSPORT -"; fi
    return 0
  fi
  if [ "$pinned" = "* " ]; then
    if [ "$pass" = default ]; then echo "$name $ring 1"; fi
    return 0
  fi
  local skips="" t
  for t in $free $pinned; do skips+=" --skip $t"; done
  if [ "$pass" = default ]; then
    if [ -n "$free" ]; then echo "$name $NOT_A_TRANSPORT - --exact $free"; fi
    if [ -n "$pinned" ]; then echo "$name $ring 1 --exact $pinned"; fi
  fi
  echo "$name $ring - --exact$skips"
}

# One pass: $1 names it, $2 is its FAULTLINE_RING value.
pass() {
  local name=$1 ring=$2 dir="$work/$1" t0=$SECONDS
  mkdir -p "$dir"
  local skips="$dir/skipped" run_dir="/run/faultline-suite-$$-$name"
  : >"$skips"
  echo "test: === pass '$name' (FAULTLINE_RING=$ring) ==="
  export FAULTLINE_SKIP_LOG=$skips FAULTLINE_RUN_DIR=$run_dir
  mkdir -p "$run_dir"
  local b runs=() alone=()
  for b in $(printf '%s\n' "${!exe[@]}" | sort); do
    while IFS= read -r r; do
      if printf '%s\n' "${ALONE[@]}" | grep -qx "$b"; then alone+=("$r"); else runs+=("$r"); fi
    done < <(runs_of "$name" "$b" "$ring")
  done
  # the shared ones first, JOBS at a time, then each of the ALONE ones by itself
  local r n=0
  for r in "${runs[@]}"; do
    # shellcheck disable=SC2086
    run_bin "$dir" $r &
    n=$((n + 1))
    if [ "$n" -ge "$JOBS" ]; then wait -n || true; n=$((n - 1)); fi
  done
  wait
  for r in "${alone[@]}"; do
    # shellcheck disable=SC2086
    run_bin "$dir" $r
  done
  # the doc tests (none run, but they compile) once
  if [ "$name" = default ]; then
    cargo test --release --doc >"$dir/doc.log" 2>&1 || echo "test: doc tests exited $?" >>"$dir/doc.log"
  fi
  unset FAULTLINE_SKIP_LOG FAULTLINE_RUN_DIR
  local secs=$((SECONDS - t0))
  cat "$dir"/*.log >"$dir/all"
  # libtest reports a skipped test as passed; the skips are counted from the tests' own log
  read -r p f < <(awk '/^test result:/ { for (i = 2; i <= NF; i++) { if ($i ~ /^passed/) p += $(i-1); if ($i ~ /^failed/) f += $(i-1) } } END { print p+0, f+0 }' "$dir/all")
  local s; s=$(wc -l <"$skips")
  local bad; bad=$(grep -h "^test: .* exited" "$dir"/*.log || true)
  if [ -n "$bad" ]; then
    # each failing binary's failures whole (a test's message may be a long JSON record), up
    # to 400 lines per binary
    for log in "$dir"/*.log; do
      grep -q "^failures:$" "$log" && awk '/^failures:$/ { on = 1 } on && n++ < 400 { print } /^test result:/ { on = 0 }' "$log" >&2
    done
    true
    echo "$bad" >&2
  fi
  # what the suite's faultline processes left: loop devices over files under its run
  # directories, mounts there (the tests' own RunDirs are beside it, under the same prefix)
  local left; left=$( (losetup -a | grep "$run_dir" ; grep " $run_dir" /proc/self/mountinfo) || true)
  if [ -n "$left" ]; then
    echo "test: pass '$name': left behind:" >&2; echo "$left" >&2
    FAULTLINE_RUN_DIR=$run_dir ./target/release/faultline cleanup >&2 || true
  fi
  # a ledger left is the record of a process that ended without releasing it (a serve that
  # failed to start leaves one today): listed, not counted as a failure
  local ledgers; ledgers=$(ls -d "$run_dir"*/runs/* 2>/dev/null || true)
  [ -z "$ledgers" ] || { echo "test: pass '$name': ledgers left (warning):" >&2; echo "$ledgers" >&2; }
  rmdir "$run_dir/runs" "$run_dir" 2>/dev/null || true
  local ok=ok
  if [ -n "$bad" ] || [ "$f" != 0 ] || [ -n "$left" ]; then failed=1; ok=FAILED; fi
  summary+=("pass '$name': $p passed, $f failed, skipped: $s (a test, or its io_uring half; libtest counts them as passed), $((secs / 60))m$((secs % 60))s, $ok")
  while IFS= read -r line; do summary+=("  $line"); done < <(sort "$skips")
  while IFS= read -r line; do summary+=("  slowest: $line"); done < <(sort -n -r "$dir/times" | head -5)
}

pass default ""
pass ring-off off

echo "test: === summary ==="
printf 'test: %s\n' "${summary[@]}"
if [ "$failed" != 0 ]; then
  echo "test: FAILED" >&2
  exit 1
fi
echo "test: all passed, nothing left behind"
