//! Block-granular deduplication with the kernel's FIDEDUPERANGE ioctl (btrfs, xfs with
//! reflink): every copy of a 4 KiB content is made to share the first copy's physical block.
//! The workload's content map says exactly which blocks are equal, so nothing is hashed here,
//! and the kernel compares the bytes itself before sharing (a block that changed is left
//! alone and counted as "differs"). duperemove, by contrast, hashes whole extents and finds
//! almost none of the scattered single-block duplicates a realistic profile produces.

use anyhow::{Context, Result, bail};
use serde::Serialize;
use std::collections::HashMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use zerocopy::{FromBytes, Immutable, IntoBytes};

const FILE_DEDUPE_RANGE_DIFFERS: i32 = 1;
/// Destinations per ioctl (the kernel caps the argument at one page).
const BATCH: usize = 120;

#[repr(C)]
#[derive(IntoBytes, Immutable)]
struct RangeHeader {
    src_offset: u64,
    src_length: u64,
    dest_count: u16,
    reserved1: u16,
    reserved2: u32,
}

#[repr(C)]
#[derive(Clone, Copy, FromBytes, IntoBytes, Immutable)]
struct RangeInfo {
    dest_fd: i64,
    dest_offset: u64,
    bytes_deduped: u64,
    status: i32,
    reserved: u32,
}

// FIDEDUPERANGE = _IOWR(0x94, 54, struct file_dedupe_range) from linux/fs.h: the number
// encodes the header's size, the destinations follow it in the same buffer
nix::ioctl_readwrite_bad!(fideduperange, nix::request_code_readwrite!(0x94, 54, size_of::<RangeHeader>()), RangeHeader);
// struct file_dedupe_range and struct file_dedupe_range_info
const _: () = assert!(size_of::<RangeHeader>() == 24 && size_of::<RangeInfo>() == 32);

#[derive(Clone, Debug, Default, Serialize)]
pub struct BlockDedupReport {
    /// Contents with more than one copy.
    pub groups: u64,
    /// Copies now sharing their group's first block.
    pub shared_blocks: u64,
    pub bytes_deduped: u64,
    /// Copies the kernel found different (changed since the map was made) or refused.
    pub differs: u64,
    pub errors: u64,
    pub seconds: f64,
    /// `fstrim -v` afterwards: how much freed space was discarded from the disk.
    pub trimmed: String,
}

/// Share every copy of each content with its first copy. `blocks` yields (file, byte offset,
/// content id) for every written 4 KiB block.
pub fn dedupe_blocks(blocks: impl IntoIterator<Item = (PathBuf, u64, u64)>, block: u64) -> Result<BlockDedupReport> {
    let t = std::time::Instant::now();
    let mut by_id: HashMap<u64, Vec<(PathBuf, u64)>> = HashMap::new();
    for (p, off, id) in blocks {
        by_id.entry(id).or_default().push((p, off));
    }
    let mut files: HashMap<PathBuf, File> = HashMap::new();
    let mut open = |p: &PathBuf| -> Result<i64> {
        if !files.contains_key(p) {
            // the destination must be open for writing (or owned by us, as root it is)
            let f = std::fs::OpenOptions::new().read(true).write(true).open(p).with_context(|| format!("cannot open {}", p.display()))?;
            files.insert(p.clone(), f);
        }
        Ok(files[p].as_raw_fd() as i64)
    };
    let mut rep = BlockDedupReport::default();
    let mut groups: Vec<_> = by_id.into_values().filter(|v| v.len() > 1).collect();
    // deterministic order: by the first copy's location
    for g in &mut groups {
        g.sort();
    }
    groups.sort();
    rep.groups = groups.len() as u64;
    let hdr = std::mem::size_of::<RangeHeader>();
    let isz = std::mem::size_of::<RangeInfo>();
    for g in groups {
        let (src_path, src_off) = &g[0];
        let src_fd = open(src_path)?;
        for chunk in g[1..].chunks(BATCH) {
            // u64s: the header and records are 8-byte aligned in it
            let mut buf = vec![0u64; (hdr + chunk.len() * isz).div_ceil(8)];
            let h = RangeHeader { src_offset: *src_off, src_length: block, dest_count: chunk.len() as u16, reserved1: 0, reserved2: 0 };
            h.write_to_prefix(buf.as_mut_bytes()).expect("room for the header");
            for (i, (p, off)) in chunk.iter().enumerate() {
                let info = RangeInfo { dest_fd: open(p)?, dest_offset: *off, bytes_deduped: 0, status: 0, reserved: 0 };
                info.write_to_prefix(&mut buf.as_mut_bytes()[hdr + i * isz..]).expect("room for the record");
            }
            let base = buf.as_mut_ptr() as *mut RangeHeader;
            // SAFETY: an open fd; `buf` (8-byte aligned) holds the header and the `dest_count`
            // destination records after it, which the kernel reads and fills in
            if let Err(e) = unsafe { fideduperange(src_fd as i32, base) } {
                let e = std::io::Error::from(e);
                if e.raw_os_error() == Some(libc::EOPNOTSUPP) || e.raw_os_error() == Some(libc::ENOTTY) {
                    bail!("this file system cannot share blocks (FIDEDUPERANGE: {e}); use btrfs or xfs with reflink");
                }
                rep.errors += chunk.len() as u64;
                continue;
            }
            for i in 0..chunk.len() {
                let (info, _) = RangeInfo::read_from_prefix(&buf.as_bytes()[hdr + i * isz..]).expect("the record is in the buffer");
                match info.status {
                    0 => {
                        rep.shared_blocks += 1;
                        rep.bytes_deduped += info.bytes_deduped;
                    }
                    FILE_DEDUPE_RANGE_DIFFERS => rep.differs += 1,
                    _ => rep.errors += 1,
                }
            }
        }
    }
    for f in files.values() {
        let _ = f.sync_all();
    }
    rep.seconds = t.elapsed().as_secs_f64();
    Ok(rep)
}
