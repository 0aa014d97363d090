#!/usr/bin/env bash
# The whole test suite: unit tests and real-kernel integration tests (FUSE, loop devices, fio),
# then a check that nothing was left behind.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. scripts/env.sh
# integration test binaries run one after another; two tests at a time inside each
cargo test --release -- --test-threads=2
left=$( (losetup -a | grep /run/faultline/ ; grep " /run/faultline/" /proc/self/mountinfo) || true)
if [ -n "$left" ]; then
  echo "test: left behind:" >&2; echo "$left" >&2
  ./target/release/faultline cleanup >&2 || true
  exit 1
fi
echo "test: all passed, nothing left behind"
