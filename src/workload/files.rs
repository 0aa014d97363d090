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
pub fn prepare(dir: &Path, count: u32, size: u64, durable: bool) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create directory {}", dir.display()))?;
    for i in 0..count as usize {
        let p = dir.join(file_name(i));
        let f = OpenOptions::new().create(true).truncate(false).write(true).open(&p).with_context(|| format!("cannot create {}", p.display()))?;
        if f.metadata()?.len() != size {
            f.set_len(size).with_context(|| format!("cannot size {} to {size} bytes", p.display()))?;
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

/// Open for the workload: block devices always O_DIRECT (plus O_DSYNC for dsync); files by
/// sync mode.
pub fn open(path: &Path, sync: SyncMode, is_device: bool) -> Result<File> {
    let mut flags = 0;
    if is_device || sync == SyncMode::Direct {
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
        .with_context(|| format!("cannot open {} ({sync:?}{})", path.display(), if flags & libc::O_DIRECT != 0 { ", O_DIRECT" } else { "" }))
}
