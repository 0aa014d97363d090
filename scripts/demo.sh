#!/usr/bin/env bash
# The main job: a RAM-backed faulty disk, a bit-flip and an EIO rule, a write + read-back pass;
# prints what was injected next to what the client saw and writes faultline-demo/results.json.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. scripts/env.sh
exec ./target/release/faultline demo "$@"
