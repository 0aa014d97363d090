#!/usr/bin/env bash
# Record a write log with the kernel's own dm-log-writes, for the interop fixtures in
# tests/fixtures/dm-log-writes (see its README.md):
#   scripts/record-dm-log-writes.sh OUTDIR [SECTOR_SIZE]
# SECTOR_SIZE (512 or 4096, default 512) is the data disk's logical block size, which
# dm-log-writes takes as the log's sector size. The script boots Debian's kernel (the
# linux-image-amd64 package, unpacked here, not installed) under qemu on a busybox initramfs
# whose init creates a log-writes target over two virtio disks (a 4 MiB data disk, an 8 MiB log
# disk), runs the operations of tests/fixtures/dm-log-writes/ops-SECTOR_SIZE on it with
# scripts/dm-log-writes-io.c, removes the target cleanly (the kernel then logs the writes it
# still held and the mark "dm-log-writes-end") and powers off. It leaves in OUTDIR:
#   log-SECTOR_SIZE.gz      the log disk, cut after its last counted entry
#   data-SECTOR_SIZE.gz     the data disk as the kernel left it
#   console-SECTOR_SIZE.txt the machine's console (kernel version, the operations, dmsetup status)
# It needs root only to apt-get what is missing (qemu-system-x86, busybox-static, kmod, gcc,
# cpio) and no KVM: qemu emulates the CPU (a minute or two). QEMU_TIMEOUT (seconds, default
# 900) bounds the boot. KERNEL_DEB names a linux-image .deb to use instead of downloading one.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
[ $# -ge 1 ] && [ $# -le 2 ] || { echo "usage: $0 OUTDIR [512|4096]" >&2; exit 2; }
out=$1
ss=${2:-512}
case $ss in 512 | 4096) ;; *) echo "$0: sector size $ss: expected 512 or 4096" >&2; exit 2 ;; esac
ops=$repo/tests/fixtures/dm-log-writes/ops-$ss
[ -f "$ops" ] || { echo "$0: no operations file $ops" >&2; exit 1; }
mkdir -p "$out"
out=$(cd "$out" && pwd)

need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
[ -x /bin/busybox ] && file -L /bin/busybox | grep -q 'statically linked' || need+=(busybox-static)
command -v depmod >/dev/null || need+=(kmod)
command -v dmsetup >/dev/null || need+=(dmsetup)
command -v cc >/dev/null || need+=(gcc libc6-dev)
command -v cpio >/dev/null || need+=(cpio)
command -v file >/dev/null || need+=(file)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing ${need[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
fi

work=$(mktemp -d /tmp/record-dm-log-writes.XXXXXX)
qemu_pid=
cleanup() {
  # a qemu still running (Ctrl-C, a failed step) is ended before its disks are removed
  [ -n "$qemu_pid" ] && kill "$qemu_pid" 2>/dev/null && wait "$qemu_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# the kernel: Debian's linux-image-amd64 names the image package of the day
if [ -n "${KERNEL_DEB:-}" ]; then
  deb=$KERNEL_DEB
else
  pkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-/ {print $2; exit}')
  [ -n "$pkg" ] || { echo "$0: apt-cache names no image for linux-image-amd64 (run apt-get update)" >&2; exit 1; }
  (cd "$work" && apt-get download "$pkg" >/dev/null 2>&1) || { echo "$0: apt-get download $pkg failed" >&2; exit 1; }
  deb=$(ls "$work"/linux-image-*.deb)
fi
dpkg-deb -x "$deb" "$work/k"
kver=$(ls "$work/k/lib/modules")
depmod -b "$work/k" "$kver"
moddir=$work/k/lib/modules/$kver
vmlinuz=$work/k/boot/vmlinuz-$kver

# the initramfs: busybox, dmsetup with its libraries, the I/O program, modules in load order
root=$work/root
mkdir -p "$root"/{bin,sbin,proc,sys,dev,run,tmp,lib/modules}
cp /bin/busybox "$root/bin/busybox"
for a in sh mount insmod poweroff cat sleep ls mknod echo grep; do ln -s busybox "$root/bin/$a"; done
cp "$(command -v dmsetup)" "$root/sbin/dmsetup"
for lib in $(ldd "$(command -v dmsetup)" | grep -o '/[^ ]*'); do
  mkdir -p "$root$(dirname "$lib")"
  cp -L "$lib" "$root$lib"
done
cc -O2 -static -Wall -o "$root/bin/dm-log-writes-io" scripts/dm-log-writes-io.c
grep -v '^#' "$ops" >"$root/ops"

# modules.dep lists a module's dependencies; each is loaded before the modules that need it
declare -A seen=()
order=()
visit() {
  local m=$1 d
  [ -n "${seen[$m]:-}" ] && return
  seen[$m]=1
  for d in $(awk -v m="$m:" '$1 == m {for (i = 2; i <= NF; i++) print $i}' "$moddir/modules.dep"); do visit "$d"; done
  order+=("$m")
}
for want in virtio_pci virtio_blk dm-log-writes; do
  path=$(awk -F: -v w="/$want.ko" 'index($1, w) {print $1; exit}' "$moddir/modules.dep")
  [ -n "$path" ] || { echo "$0: $kver has no module $want (modules.dep)" >&2; exit 1; }
  visit "$path"
done
: >"$root/modules"
for m in "${order[@]}"; do
  name=$(basename "$m")
  case $name in
    *.ko.xz) xz -dc "$moddir/$m" >"$root/lib/modules/${name%.xz}"; name=${name%.xz} ;;
    *.ko.zst) zstd -dqc "$moddir/$m" >"$root/lib/modules/${name%.zst}"; name=${name%.zst} ;;
    *) cp "$moddir/$m" "$root/lib/modules/$name" ;;
  esac
  echo "$name" >>"$root/modules"
done

cat >"$root/init" <<'EOF'
#!/bin/sh
# Creates log-writes over the disks with serial "data" and "log", runs /ops, removes it cleanly.
fail() { echo "RESULT failed: $*"; poweroff -f; }
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
echo "kernel $(cat /proc/sys/kernel/osrelease)"
for m in $(cat /modules); do insmod /lib/modules/$m || fail "insmod $m"; done
data= log=
for i in 1 2 3 4 5 6 7 8 9 10; do
  for d in /sys/block/vd*; do
    [ -e "$d/serial" ] || continue
    case $(cat $d/serial) in data) data=${d##*/} ;; log) log=${d##*/} ;; esac
  done
  [ -n "$data" ] && [ -n "$log" ] && [ -b /dev/$data ] && [ -b /dev/$log ] && break
  sleep 1
done
[ -n "$data" ] && [ -n "$log" ] || fail "no virtio disks with serial data and log"
sectors=$(cat /sys/block/$data/size)
echo "data /dev/$data: $sectors 512 B sectors, logical block $(cat /sys/block/$data/queue/logical_block_size), write cache $(cat /sys/block/$data/queue/write_cache), discard max $(cat /sys/block/$data/queue/discard_max_bytes)"
dmsetup create lw --table "0 $sectors log-writes /dev/$data /dev/$log" || fail "dmsetup create"
if [ ! -b /dev/mapper/lw ]; then
  mkdir -p /dev/mapper
  mknod /dev/mapper/lw b $(dmsetup info -c --noheadings -o major,minor --separator ' ' lw) || fail "mknod"
fi
dm=$(ls /sys/block | grep '^dm-')
echo "lw ($dm): logical block $(cat /sys/block/$dm/queue/logical_block_size), write cache $(cat /sys/block/$dm/queue/write_cache), fua $(cat /sys/block/$dm/queue/fua 2>/dev/null)"
dm-log-writes-io /dev/mapper/lw lw /ops || fail "the operations"
echo "status before remove (logged entries, last log sector): $(dmsetup status lw)"
dmsetup remove lw || fail "dmsetup remove"
echo "RESULT ok"
poweroff -f
EOF
chmod +x "$root/init"
(cd "$root" && find . | cpio -o -H newc --quiet | gzip -1) >"$work/initrd.gz"

truncate -s 4M "$work/data.img"
truncate -s 8M "$work/log.img"
console=$out/console-$ss.txt
echo "booting $kver under qemu (no KVM: a minute or two)" >&2
timeout "${QEMU_TIMEOUT:-900}" qemu-system-x86_64 -accel tcg -m 256 -smp 1 -nographic -no-reboot -nic none \
  -kernel "$vmlinuz" -initrd "$work/initrd.gz" -append "console=ttyS0 panic=-1 loglevel=4" \
  -drive "file=$work/data.img,format=raw,if=none,id=data,cache=writeback,discard=unmap" \
  -device "virtio-blk-pci,drive=data,serial=data,logical_block_size=$ss,physical_block_size=$ss" \
  -drive "file=$work/log.img,format=raw,if=none,id=log,cache=writeback" \
  -device virtio-blk-pci,drive=log,serial=log </dev/null >"$work/console" 2>&1 &
qemu_pid=$!
rc=0
wait "$qemu_pid" || rc=$?
qemu_pid=
# the console without the firmware's terminal escapes and carriage returns
sed -e 's/\x1b\[[0-9;?]*[A-Za-z]//g' -e 's/\x1bc//g' -e 's/\r//g' "$work/console" >"$console"
[ "$rc" = 0 ] || { echo "$0: qemu ended with $rc (124: QEMU_TIMEOUT); console in $console:" >&2; tail -30 "$console" >&2; exit 1; }
grep -q 'RESULT ok' "$console" || { echo "$0: the machine's init failed; console in $console:" >&2; tail -30 "$console" >&2; exit 1; }

# cut the log after its last entry the super block counts (the rest of the disk is zeroes)
le() { od -An -t "u$2" -j "$1" -N "$2" "$work/log.img" | tr -d ' '; }
[ "$(le 0 8)" = $((0x6a736677736872)) ] || { echo "$0: the log disk has no dm-log-writes super block" >&2; exit 1; }
n=$(le 16 8)
lss=$(le 24 4)
[ "$lss" = "$ss" ] || { echo "$0: the log's sector size is $lss, expected $ss" >&2; exit 1; }
pos=$lss
for ((i = 0; i < n; i++)); do
  nr=$(le $((pos + 8)) 8)
  flags=$(le $((pos + 16)) 8)
  pos=$((pos + lss))
  # MARK (8) and DISCARD (4) entries carry no data
  ((flags & 12)) || pos=$((pos + nr * lss))
done
truncate -s "$pos" "$work/log.img"
gzip -9nc "$work/log.img" >"$out/log-$ss.gz"
gzip -9nc "$work/data.img" >"$out/data-$ss.gz"
echo "$out/log-$ss.gz: $n entries, $pos bytes ($kver)"
