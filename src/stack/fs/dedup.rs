//! The dedup step of a dedup stack: exactly the blocks the workload wrote more than once
//! (`dedupe_range`, the kernel's FIDEDUPERANGE ioctl) or the whole file system with
//! duperemove, then fstrim; and FIEMAP, which counts the bytes files share.

use super::dedupe_range::BlockDedupReport;
use super::{BuiltStack, FsKind, run, which};
use crate::sys::mount;
use anyhow::{Context, Result, bail};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

#[derive(Clone, Debug, Default, Serialize)]
pub struct DedupReport {
    /// Bytes of file data in extents shared with another file or offset (FIEMAP), before/after.
    pub shared_before: u64,
    pub shared_after: u64,
    /// btrfs only: `btrfs filesystem du -s` "Set shared" after deduplication.
    pub btrfs_set_shared: Option<u64>,
    /// Free space was discarded afterwards (fstrim), so freed duplicate copies are gone.
    pub trimmed: bool,
    pub seconds: f64,
    /// duperemove's own count: "net change in shared extents of: N" (bytes).
    pub duperemove_net_change: Option<i64>,
    /// duperemove's closing lines.
    pub summary: Vec<String>,
}

impl DedupReport {
    pub fn deduped(&self) -> u64 {
        self.shared_after.saturating_sub(self.shared_before)
    }
}

impl BuiltStack {
    /// Deduplicate exactly the blocks the workload wrote more than once (FIDEDUPERANGE, 4 KiB
    /// granularity; see `dedupe_range`), then `fstrim`, so freed copies leave the disk and only
    /// the shared block carries each content.
    pub fn dedupe_blocks(&mut self, blocks: impl IntoIterator<Item = (PathBuf, u64, u64)>) -> Result<BlockDedupReport> {
        let Some(mnt) = self.mountpoint.clone() else { bail!("dedupe needs a file system (this stack is raw)") };
        if self.kind == Some(FsKind::Ext4) {
            bail!("dedupe needs btrfs or xfs with reflink; this is ext4");
        }
        let _ = mount::syncfs(&mnt);
        let mut rep = super::dedupe_range::dedupe_blocks(blocks, 4096)?;
        let _ = mount::syncfs(&mnt);
        let trim = Command::new(which("fstrim")?).arg("-v").arg(&mnt).output();
        match &trim {
            Ok(o) if o.status.success() => rep.trimmed = String::from_utf8_lossy(&o.stdout).trim().to_string(),
            _ => self.notes.push(format!("fstrim {} failed after dedupe: freed copies may remain on the disk", mnt.display())),
        }
        Ok(rep)
    }

    /// Deduplicate the file system with `duperemove -dr` (btrfs, or xfs with reflink), then
    /// `fstrim` it.
    pub fn dedupe(&mut self) -> Result<DedupReport> {
        let Some(mnt) = self.mountpoint.clone() else { bail!("dedupe needs a file system (this stack is raw)") };
        if self.kind == Some(FsKind::Ext4) {
            bail!("dedupe needs btrfs or xfs with reflink; this is ext4");
        }
        let _ = mount::syncfs(&mnt);
        let t = Instant::now();
        let mut rep = DedupReport { shared_before: shared_bytes(&mnt)?, ..Default::default() };
        // -b 4096: workload duplicates are single 4 KiB blocks scattered in files; the default
        // 128 KiB hashing would only find runs of 32 equal blocks
        let out = run(Command::new(which("duperemove")?).args(["-dr", "-b", "4096"]).arg(&mnt))?;
        let _ = mount::syncfs(&mnt);
        // the copies dedupe freed still hold their bytes on the disk, where content-targeted
        // faults (rot by hash) would find them; discard them so only live blocks carry data
        let trim = Command::new(which("fstrim")?).arg(&mnt).output();
        rep.trimmed = trim.as_ref().is_ok_and(|o| o.status.success());
        if !rep.trimmed {
            self.notes.push(format!(
                "fstrim {} failed after dedupe: freed copies may remain on the disk ({})",
                mnt.display(),
                trim.map(|o| String::from_utf8_lossy(&o.stderr).trim().to_string()).unwrap_or_else(|e| e.to_string())
            ));
        }
        rep.seconds = t.elapsed().as_secs_f64();
        rep.summary = out
            .lines()
            .filter(|l| l.starts_with("Total files") || l.starts_with("Found ") || l.starts_with("Comparison of extent info"))
            .map(str::to_owned)
            .collect();
        rep.duperemove_net_change = out.lines().find_map(|l| l.split_once("net change in shared extents of:")).and_then(|(_, n)| n.trim().parse().ok());
        rep.shared_after = shared_bytes(&mnt)?;
        if self.kind == Some(FsKind::Btrfs) {
            let du = run(Command::new(which("btrfs")?).args(["filesystem", "du", "-s", "--raw"]).arg(&mnt))?;
            rep.btrfs_set_shared = du.lines().nth(1).and_then(|l| l.split_whitespace().nth(2)).and_then(|x| x.parse().ok());
        }
        Ok(rep)
    }
}

/// One extent of a file, from FIEMAP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub logical: u64,
    pub physical: u64,
    pub length: u64,
    pub flags: u32,
}

pub const FIEMAP_EXTENT_SHARED: u32 = 0x2000;

/// The extents of a file (FS_IOC_FIEMAP, after syncing it).
pub fn extents(path: &Path) -> Result<Vec<Extent>> {
    #[repr(C)]
    struct FiemapHead {
        start: u64,
        length: u64,
        flags: u32,
        mapped: u32,
        count: u32,
        reserved: u32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct FiemapExtent {
        logical: u64,
        physical: u64,
        length: u64,
        reserved64: [u64; 2],
        flags: u32,
        reserved: [u32; 3],
    }
    const FIEMAP_FLAG_SYNC: u32 = 1;
    const FIEMAP_EXTENT_LAST: u32 = 1;
    const N: usize = 256;
    #[repr(C)]
    struct Req {
        head: FiemapHead,
        ext: [FiemapExtent; N],
    }
    // FS_IOC_FIEMAP = _IOWR('f', 11, struct fiemap): the number encodes the header's size, the
    // extents follow it in the same buffer
    nix::ioctl_readwrite_bad!(fiemap, nix::request_code_readwrite!(b'f', 11, size_of::<FiemapHead>()), Req);
    // struct fiemap and struct fiemap_extent (include/uapi/linux/fiemap.h)
    const _: () = assert!(size_of::<FiemapHead>() == 32 && size_of::<FiemapExtent>() == 56);
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut out = Vec::new();
    let mut start = 0u64;
    loop {
        let mut req = Req {
            head: FiemapHead { start, length: u64::MAX - start, flags: FIEMAP_FLAG_SYNC, mapped: 0, count: N as u32, reserved: 0 },
            ext: [FiemapExtent::default(); N],
        };
        // SAFETY: our open fd; `req` is a fiemap header with room for the `count` extents it names
        if let Err(e) = unsafe { fiemap(f.as_raw_fd(), &mut req) } {
            bail!("FIEMAP on {}: {e}", path.display());
        }
        let n = req.head.mapped as usize;
        if n == 0 {
            break;
        }
        for e in &req.ext[..n] {
            out.push(Extent { logical: e.logical, physical: e.physical, length: e.length, flags: e.flags });
        }
        let last = req.ext[n - 1];
        if last.flags & FIEMAP_EXTENT_LAST != 0 {
            break;
        }
        start = last.logical + last.length;
    }
    Ok(out)
}

/// Bytes of regular-file data in shared extents under `dir`.
pub fn shared_bytes(dir: &Path) -> Result<u64> {
    let mut total = 0;
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).with_context(|| format!("cannot list {}", d.display()))?.flatten() {
            let ft = e.file_type()?;
            if ft.is_dir() {
                stack.push(e.path());
            } else if ft.is_file() {
                total += extents(&e.path())?.iter().filter(|x| x.flags & FIEMAP_EXTENT_SHARED != 0).map(|x| x.length).sum::<u64>();
            }
        }
    }
    Ok(total)
}
