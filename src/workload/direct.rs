//! O_DIRECT access to a block device with aligned buffers: every read reaches the disk, never
//! the page cache.

use crate::mem;
use anyhow::{Context, Result};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

/// A zeroed buffer aligned for O_DIRECT; 2 MiB and more on huge pages (`crate::mem`).
pub struct AlignedBuf {
    map: mem::Mapping,
    len: usize,
}

impl AlignedBuf {
    pub fn new(len: usize) -> AlignedBuf {
        // 64 KiB and more: round up to a whole huge page, the pinning win is per request
        let mapped = if len >= 64 << 10 { len.next_multiple_of(mem::HUGE) } else { len };
        let map = mem::Mapping::new(mapped).unwrap_or_else(|e| panic!("out of memory mapping a {mapped} byte I/O buffer: {e}"));
        AlignedBuf { map, len }
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.map[..self.len]
    }
}
impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.map[..self.len]
    }
}

pub struct DirectDev {
    f: File,
}

impl DirectDev {
    pub fn open(path: &Path) -> Result<DirectDev> {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .with_context(|| format!("cannot open {} with O_DIRECT", path.display()))?;
        Ok(DirectDev { f })
    }
    pub fn read_at(&self, buf: &mut [u8], off: u64) -> std::io::Result<()> {
        self.f.read_exact_at(buf, off)
    }
    pub fn write_at(&self, buf: &[u8], off: u64) -> std::io::Result<()> {
        self.f.write_all_at(buf, off)
    }
    pub fn sync(&self) -> std::io::Result<()> {
        self.f.sync_all()
    }
}
