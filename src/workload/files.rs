//! The file interface's files: names, creation, and opening with the run's sync mode.

use crate::spec::workload::config::SyncMode;
use anyhow::{Context, Result};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

pub fn file_name(i: usize) -> String {
    format!("faultline-{i:04}.dat")
}

/// Create `dir` and the files that are missing; set every file to `size` bytes (new space is
/// a hole: the workload's writes fill it). Existing files are kept, so a run rewrites them.
/// `durable`: fsync every file and then the directory, so the files' entries and sizes
/// survive a power cut (the durability oracle counts on them).
/// `layout`: the holes are then written with zeros (`lay_out`).
pub fn prepare(dir: &Path, count: u32, size: u64, durable: bool, layout: bool) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create directory {}", dir.display()))?;
    for i in 0..count as usize {
        let p = dir.join(file_name(i));
        let f = OpenOptions::new().create(true).truncate(false).write(true).open(&p).with_context(|| format!("cannot create {}", p.display()))?;
        if f.metadata()?.len() != size {
            f.set_len(size).with_context(|| format!("cannot size {} to {size} bytes", p.display()))?;
        }
        if layout {
            lay_out(&f, size).with_context(|| format!("cannot lay out {}", p.display()))?;
        }
        if durable {
            f.sync_all().with_context(|| format!("cannot fsync {}", p.display()))?;
        }
    }
    if durable {
        File::open(dir).and_then(|d| d.sync_all()).with_context(|| format!("cannot fsync directory {}", dir.display()))?;
    }
    Ok(())
}

/// Write zeros into every hole of `f` (its first `size` bytes), as fio lays out a job's files:
/// a hole reads as zeros without reaching the device, so a read workload over sparse files
/// measures the file system's bookkeeping, not the disk. The data written is what the hole
/// read as, so the content maps stay true. Then the data is synced and dropped from the page
/// cache (fio's `invalidate`), so the run's first reads also reach the device.
fn lay_out(f: &File, size: u64) -> Result<()> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::FileExt;
    let fd = f.as_raw_fd();
    let zeros = vec![0u8; 1 << 20];
    let mut at: u64 = 0;
    while at < size {
        // SAFETY: lseek on an open descriptor; it reads and writes no memory.
        let hole = unsafe { libc::lseek(fd, at as libc::off_t, libc::SEEK_HOLE) };
        if hole < 0 || hole as u64 >= size {
            break;
        }
        // SAFETY: as above.
        let data = unsafe { libc::lseek(fd, hole, libc::SEEK_DATA) };
        let end = if data < 0 { size } else { (data as u64).min(size) };
        let mut o = hole as u64;
        while o < end {
            let n = ((end - o) as usize).min(zeros.len());
            f.write_all_at(&zeros[..n], o)?;
            o += n as u64;
        }
        at = end;
    }
    f.sync_data()?;
    // SAFETY: posix_fadvise on an open descriptor; it reads and writes no memory.
    unsafe { libc::posix_fadvise(fd, 0, 0, libc::POSIX_FADV_DONTNEED) };
    Ok(())
}

/// Open for the workload: block devices always O_DIRECT (plus O_DSYNC for dsync); files by
/// sync mode, O_DIRECT also with `direct`. A file system that refuses O_DIRECT is an error
/// that says so (`refused_direct`).
pub fn open(path: &Path, sync: SyncMode, direct: bool, is_device: bool) -> Result<File> {
    let mut flags = 0;
    if is_device || direct || sync == SyncMode::Direct {
        flags |= libc::O_DIRECT;
    }
    if sync == SyncMode::Dsync {
        flags |= libc::O_DSYNC;
    }
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(flags)
        .open(path)
        .map_err(|e| refused_direct(e, path, flags & libc::O_DIRECT != 0))
        .with_context(|| format!("cannot open {} ({sync:?}{})", path.display(), if flags & libc::O_DIRECT != 0 { ", O_DIRECT" } else { "" }))
}

/// An open with O_DIRECT that failed with EINVAL: the file system does not do direct I/O
/// (e.g. a FUSE file system without it, tmpfs before Linux 6.6). Said as such, with the way
/// out; other errors pass as they are.
pub fn refused_direct(e: std::io::Error, path: &Path, direct: bool) -> anyhow::Error {
    if direct && e.raw_os_error() == Some(libc::EINVAL) {
        let fs = crate::sys::mount::fs_type(path.parent().unwrap_or(path)).unwrap_or_else(|| "this file system".into());
        return anyhow::anyhow!(
            "{}: {fs} refuses O_DIRECT (open: EINVAL); direct I/O needs a file system that does it (ext4, xfs, btrfs); leave `direct` out (and use `sync: none`) to run buffered",
            path.display()
        );
    }
    e.into()
}

/// Whether the file system serves O_DIRECT on `f` from the device: the kernel's
/// STATX_DIOALIGN (Linux 6.1+) is 0 where an O_DIRECT open succeeds but its I/O goes through
/// the page cache (ext4 with `data=journal`, a file with `chattr +j`, btrfs compressed or
/// encrypted files...). `None` where the kernel or file system does not say.
pub fn dio_supported(f: &File) -> Option<bool> {
    use std::os::fd::AsRawFd;
    // SAFETY: statx fills the zeroed struct it is given for this open descriptor (AT_EMPTY_PATH
    // with an empty path: the descriptor itself); nothing else is read or written.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: as above; the path is a valid NUL-terminated empty C string.
    let r = unsafe { libc::statx(f.as_raw_fd(), c"".as_ptr(), libc::AT_EMPTY_PATH, libc::STATX_DIOALIGN, &mut st) };
    if r != 0 || st.stx_mask & libc::STATX_DIOALIGN == 0 {
        return None;
    }
    Some(st.stx_dio_mem_align != 0 && st.stx_dio_offset_align != 0 && st.stx_dio_offset_align as u64 <= crate::spec::workload::config::CONTENT_BLOCK)
}
