//! Disks with 512 B and 64 KiB blocks (`serve --block-size`) on the real device: the loop
//! device's logical block size, O_DIRECT I/O at that size (ours and fio's), rules by block
//! number landing on that block's bytes, and a file system on each.

mod common;
use common::*;
use faultline::disk::{DiskConfig, StoreSpec};
use faultline::stack::fs::{BuiltStack, FsKind, StackSpec};
use faultline::stack::served::ServedDisk;
use faultline::workload::direct::AlignedBuf;
use std::path::Path;
use std::process::Command;

/// The loop device's logical block size, as the kernel reports it.
fn logical_block_size(dev: &Path) -> u64 {
    let name = dev.file_name().unwrap().to_string_lossy().to_string();
    std::fs::read_to_string(format!("/sys/block/{name}/queue/logical_block_size")).unwrap().trim().parse().unwrap()
}

/// Deterministic bytes, different at every offset (an xorshift stream).
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Positions inside a block: past 4 KiB in a 64 KiB block, past the first half of a 512 B one,
/// so a rule that took the wrong block size would flip other bytes.
fn read_flip_byte(bs: u64) -> u64 {
    bs * 3 / 4 + 7
}
fn write_flip_byte(bs: u64) -> u64 {
    bs / 2 + 9
}

/// Rules by block number over one transport: block 5 fails reads, block 10's reads come back
/// with one bit flipped, block 12's stored copy gets one bit flipped when written (numbers
/// counted from `base`, 24 MiB into the disk, away from where udev's probe of a new device
/// reads). Written a block per request, read back one logical block (the smallest O_DIRECT
/// request) at a time.
fn rules_land_on_the_blocks_bytes(bs: u64, ring: &str) {
    let s = Serve::start_args(&["--size", "64MiB", "--block-size", &bs.to_string(), "--ring", ring], "rules: []\n");
    let lbs = logical_block_size(&s.dev);
    // the disk's block size, at most 4 KiB (the largest logical block size a loop device takes)
    assert_eq!(lbs, bs.min(4096), "bs {bs} --ring {ring}: logical block size of {}", s.dev.display());
    let _ = Command::new("udevadm").arg("settle").status();
    let base = (24 << 20) / bs;
    s.add(&format!(
        "rules:\n  - {{type: error, op: read, target: {{block: {}}}}}\n  - {{type: bitflip, op: read, byte: {}, bit: 6, target: {{block: {}}}}}\n  - {{type: bitflip, op: write, byte: {}, bit: 1, target: {{block: {}}}}}\n",
        base + 5,
        read_flip_byte(bs),
        base + 10,
        write_flip_byte(bs),
        base + 12
    ));
    let d = s.open();
    let n = 32;
    let data = pattern((n * bs) as usize, bs);
    let mut buf = AlignedBuf::new(bs as usize);
    for b in 0..n {
        buf.copy_from_slice(&data[(b * bs) as usize..((b + 1) * bs) as usize]);
        d.write_at(&buf, (base + b) * bs).unwrap_or_else(|e| panic!("bs {bs} --ring {ring}: write of block {b}: {e}"));
    }
    // offsets from here on are relative to `base`
    let mut stored = data.clone();
    stored[(12 * bs + write_flip_byte(bs)) as usize] ^= 1 << 1;
    let read_flip = 10 * bs + read_flip_byte(bs);
    let mut chunk = AlignedBuf::new(lbs as usize);
    let mut failed = 0;
    for c in 0..n * bs / lbs {
        let (s0, e0) = (c * lbs, (c + 1) * lbs);
        let r = d.read_at(&mut chunk, base * bs + s0);
        if s0 < 6 * bs && e0 > 5 * bs {
            assert_eq!(r.map_err(|e| e.raw_os_error()), Err(Some(libc::EIO)), "bs {bs} --ring {ring}: read at +{s0}, inside block 5");
            failed += 1;
            continue;
        }
        r.unwrap_or_else(|e| panic!("bs {bs} --ring {ring}: read at +{s0}: {e}"));
        let mut want = stored[s0 as usize..e0 as usize].to_vec();
        if (s0..e0).contains(&read_flip) {
            want[(read_flip - s0) as usize] ^= 1 << 6;
        }
        let diff: Vec<u64> = (0..lbs as usize).filter(|&i| chunk[i] != want[i]).map(|i| s0 + i as u64).collect();
        assert!(diff.is_empty(), "bs {bs} --ring {ring}: bytes +{diff:?} differ from the expected ones");
    }
    // one firing per request into block 5, each logged as that one disk block
    assert_eq!(failed, bs.div_ceil(lbs));
    let r = s.rules();
    assert_eq!((r[0]["fired"].as_u64(), r[0]["blocks"].as_u64()), (Some(failed), Some(failed)), "{r:?}");
    let log = s.log();
    let mine: Vec<_> = log.iter().filter(|e| e["rule"] == r[0]["id"]).collect();
    assert_eq!(mine.len() as u64, failed, "{log:?}");
    assert!(mine.iter().all(|e| e["blocks"] == serde_json::json!([[base + 5, 1]])), "{mine:?}");
    // without rules: the read flip was in the reply only, the write flip is in the store
    s.clear();
    let mut all = AlignedBuf::new((n * bs) as usize);
    d.read_at(&mut all, base * bs).unwrap();
    assert!(all[..] == stored[..], "bs {bs} --ring {ring}: the stored data is not the data written with block 12's flip");
    drop(d);
    s.stop();
}

/// fio, an independent O_DIRECT client, writes at the disk's block size with 8 requests in
/// flight and verifies every block it wrote.
fn fio_verifies(bs: u64, size: &str) {
    let s = Serve::start_args(&["--size", "64MiB", "--block-size", &bs.to_string()], "rules: []\n");
    let out = Command::new("fio")
        .args(["--name=v", "--rw=randwrite", "--ioengine=libaio", "--iodepth=8", "--direct=1", "--randrepeat=1"])
        .args(["--verify=crc32c", "--do_verify=1", "--verify_state_save=0"])
        .arg(format!("--bs={bs}"))
        .arg(format!("--size={size}"))
        .arg(format!("--filename={}", s.dev.display()))
        .output()
        .expect("run fio");
    assert!(out.status.success(), "fio at bs {bs} failed: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    s.stop();
}

#[test]
fn block_512_device_io_and_rules() {
    for ring in transports() {
        rules_land_on_the_blocks_bytes(512, ring);
    }
    fio_verifies(512, "2M");
}

#[test]
fn block_64k_device_io_and_rules() {
    for ring in transports() {
        rules_land_on_the_blocks_bytes(65536, ring);
    }
    fio_verifies(65536, "16M");
}

/// A file system on the disk: written, read back from the disk after a remount (cold cache),
/// and checked clean by its own checker.
fn fs_round_trip(bs: u32, size: u64, kind: FsKind, mkfs: &[&str]) {
    let cfg = DiskConfig {
        size: Some(size),
        block_size: bs,
        store: StoreSpec::Ram,
        destructive: false,
        force: false,
        latency: None,
        populate: None,
        ..Default::default()
    };
    let d = ServedDisk::start(&cfg, &Default::default(), |_| Ok(vec![]), None).unwrap();
    let dev = d.device().to_owned();
    let spec = StackSpec::Fs { kind, mkfs: mkfs.iter().map(|s| s.to_string()).collect(), mount: vec![] };
    let mut b = BuiltStack::build(&spec, std::slice::from_ref(&dev)).unwrap_or_else(|e| panic!("bs {bs}: {kind:?} {mkfs:?}: {e:#}"));
    let mnt = b.mountpoint.clone().unwrap();
    // a file not a multiple of any block size, and small files that share blocks
    let big = pattern(3 * (1 << 20) + 12345, 77);
    std::fs::write(mnt.join("big"), &big).unwrap();
    for i in 0..20u64 {
        std::fs::write(mnt.join(format!("small{i}")), pattern(100 + 333 * i as usize, i)).unwrap();
    }
    b.cold_cache().unwrap();
    assert!(std::fs::read(mnt.join("big")).unwrap() == big, "bs {bs}: {kind:?}: the big file read back differs");
    for i in 0..20u64 {
        assert_eq!(std::fs::read(mnt.join(format!("small{i}"))).unwrap(), pattern(100 + 333 * i as usize, i), "bs {bs}: small{i}");
    }
    assert!(b.teardown().unwrap().is_empty());
    let check = match kind {
        FsKind::Ext4 => Command::new("e2fsck").args(["-f", "-n"]).arg(&dev).output().unwrap(),
        FsKind::Xfs => Command::new("xfs_repair").arg("-n").arg(&dev).output().unwrap(),
        FsKind::Btrfs => Command::new("btrfs").args(["check", "--readonly"]).arg(&dev).output().unwrap(),
    };
    assert!(check.status.success(), "bs {bs}: {kind:?} check failed: {}{}", String::from_utf8_lossy(&check.stdout), String::from_utf8_lossy(&check.stderr));
    d.teardown().unwrap();
}

/// ext4 with 1 KiB blocks on the 512 B disk (512 B logical blocks): each file-system block is
/// two disk blocks.
#[test]
fn ext4_on_512_byte_blocks() {
    fs_round_trip(512, 64 << 20, FsKind::Ext4, &["-b", "1024"]);
}

/// XFS with 64 KiB blocks on the 64 KiB disk: one file-system block per disk block, each
/// reaching the disk as 4 KiB logical blocks. XFS blocks larger than the page need Linux 6.12.
#[test]
fn xfs_on_64k_blocks() {
    // SAFETY: sysconf only reads a system constant
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut v = release.trim().split(|c: char| !c.is_ascii_digit()).map(|x| x.parse::<u32>().unwrap_or(0));
    let (major, minor) = (v.next().unwrap_or(0), v.next().unwrap_or(0));
    if page < 65536 && (major, minor) < (6, 12) {
        skip("", &format!("XFS blocks larger than the {page} B page need Linux 6.12+, this is {}", release.trim()));
        return;
    }
    // mkfs.xfs wants more than 300 MB; the RAM store holds only what is written
    fs_round_trip(65536, 320 << 20, FsKind::Xfs, &["-b", "size=65536"]);
}
