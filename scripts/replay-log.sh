#!/usr/bin/env bash
# Build xfstests' replay-log (src/log-writes: replay-log.c + log-writes.c, GPL-2.0, not part of
# this repository) for the dm-log-writes interop tests and for users replaying our logs.
#   scripts/replay-log.sh [OUT]      prints the path of the binary (default target/replay-log)
# The source: $XFSTESTS_SRC (an xfstests checkout, or a bare git directory of it), else the
# copy in vendor/xfstests-log-writes (its README names the commit).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/replay-log}
files=(log-writes.h log-writes.c replay-log.c)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
src=${XFSTESTS_SRC:-}
for f in "${files[@]}"; do
  if [ -z "$src" ]; then
    cp "vendor/xfstests-log-writes/$f" "$work/$f"
  elif [ -f "$src/src/log-writes/$f" ]; then
    cp "$src/src/log-writes/$f" "$work/$f"
  else
    git --git-dir="$src" show "HEAD:src/log-writes/$f" >"$work/$f" 2>/dev/null ||
      git --git-dir="$src/.git" show "HEAD:src/log-writes/$f" >"$work/$f" ||
      { echo "replay-log.sh: no src/log-writes/$f in $src (XFSTESTS_SRC)" >&2; exit 1; }
  fi
done
mkdir -p "$(dirname "$out")"
cc -O2 -o "$out" "$work/replay-log.c" "$work/log-writes.c"
echo "$out"
