#!/usr/bin/env bash
# bench/busy-poll.sh [ROUNDS] [SECONDS] -- the default busy poll vs `--busy-poll 0` (bench/serve-ab.sh).
exec bash "$(dirname "$0")/serve-ab.sh" "${1:-10}" "${2:-2}" --busy-poll 0
