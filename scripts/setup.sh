#!/usr/bin/env bash
# Everything faultline needs on a fresh Debian/Ubuntu machine (run as root): apt packages,
# a Rust toolchain if none is installed (and rustfmt + clippy, which CI runs, where rustup manages
# it), and a release build. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

[ "$(id -u)" = 0 ] || { echo "setup: run as root (faultline mounts FUSE and attaches loop devices)" >&2; exit 1; }

PKGS=(fuse3 libfuse3-dev pkg-config clang libelf-dev zlib1g-dev fio nbdkit libnbd-bin python3-libnbd qemu-utils xfsprogs btrfs-progs e2fsprogs util-linux udev duperemove curl ca-certificates build-essential openssh-server openssh-client iperf3 iputils-ping nftables iproute2 bpftool python3 postgresql)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null 2>&1; then
  [ -x "$HOME/.cargo/bin/cargo" ] || {
    echo "setup: installing Rust with rustup" >&2
    curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal >/dev/null
  }
fi
. scripts/env.sh
# CI checks formatting and lints; a minimal rustup profile has neither tool
if command -v rustup >/dev/null 2>&1; then
  comps=()
  cargo fmt --version >/dev/null 2>&1 || comps+=(rustfmt)
  cargo clippy --version >/dev/null 2>&1 || comps+=(clippy)
  if [ ${#comps[@]} -gt 0 ]; then
    echo "setup: adding Rust components ${comps[*]}" >&2
    rustup component add "${comps[@]}" >/dev/null
  fi
fi

[ -e /dev/fuse ] || { echo "setup: /dev/fuse is missing: FUSE is not available on this machine" >&2; exit 1; }
cargo build --release --quiet
