#!/usr/bin/env bash
# The whole test suite: unit tests and real-kernel integration tests (FUSE, loop devices, fio),
# then a check that nothing was left behind. Twice: with the default transport (FUSE over
# io_uring where the kernel has it), then with FAULTLINE_RING=off, which makes the machine
# look like one whose kernel lacks it (Linux before 6.14): everything over classic /dev/fuse,
# and the tests that need the ring report themselves skipped. Both passes must pass.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. scripts/env.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
summary=()
failed=0

# One pass: $1 names it, the rest are VAR=value settings for it.
pass() {
  local name=$1; shift
  local log="$work/$name.log" skips="$work/$name.skipped" rc=0 t0=$SECONDS
  : >"$skips"
  echo "test: === pass '$name' ($*) ==="
  # integration test binaries run one after another; two tests at a time inside each; every
  # binary runs even after a failure, so the summary counts them all
  env "$@" FAULTLINE_SKIP_LOG="$skips" cargo test --release --no-fail-fast -- --test-threads=2 2>&1 | tee "$log" || rc=$?
  local secs=$((SECONDS - t0))
  # libtest reports a skipped test as passed; the skips are counted from the tests' own log
  read -r p f < <(awk '/^test result:/ { for (i = 2; i <= NF; i++) { if ($i ~ /^passed/) p += $(i-1); if ($i ~ /^failed/) f += $(i-1) } } END { print p+0, f+0 }' "$log")
  local s; s=$(wc -l <"$skips")
  local left; left=$( (losetup -a | grep /run/faultline/ ; grep " /run/faultline/" /proc/self/mountinfo) || true)
  if [ -n "$left" ]; then
    echo "test: pass '$name': left behind:" >&2; echo "$left" >&2
    ./target/release/faultline cleanup >&2 || true
    rc=1
  fi
  if [ "$rc" != 0 ] || [ "$f" != 0 ]; then failed=1; fi
  summary+=("pass '$name': $p passed, $f failed, skipped: $s (a test, or its io_uring half; libtest counts them as passed), $((secs / 60))m$((secs % 60))s, $([ "$rc" = 0 ] && [ -z "$left" ] && echo ok || echo FAILED)")
  while IFS= read -r line; do summary+=("  $line"); done < <(sort "$skips")
}

pass default FAULTLINE_RING=
pass ring-off FAULTLINE_RING=off

echo "test: === summary ==="
printf 'test: %s\n' "${summary[@]}"
if [ "$failed" != 0 ]; then
  echo "test: FAILED" >&2
  exit 1
fi
echo "test: all passed, nothing left behind"
