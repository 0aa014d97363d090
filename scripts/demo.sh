#!/usr/bin/env bash
# The main job: `faultline run examples/quickstart.yaml` on the built-in RAM-backed faulty disk:
# 256 MiB of sequential writes with realistic duplicate content, a bit flip on the last block of
# every 64 MiB and a latent read error, then an integrity check. Prints the result table and
# writes results/quickstart-<time>/ (results.json, CSVs, report.html). Extra arguments go to
# `faultline run` (e.g. another experiment file: scripts/demo.sh examples/study.yaml).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. scripts/env.sh
file=examples/quickstart.yaml
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then file=$1; shift; fi
exec ./target/release/faultline run "$file" "$@"
