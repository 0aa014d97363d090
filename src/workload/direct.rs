//! O_DIRECT access to a block device with aligned buffers: every read reaches the disk, never
//! the page cache.

use crate::mem;
use anyhow::{Context, Result};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

/// A zeroed buffer aligned for O_DIRECT; 2 MiB and more on huge pages (`crate::mem`).
pub struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
    mapped: usize,
}

unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    pub fn new(len: usize) -> AlignedBuf {
        // 64 KiB and more: round up to a whole huge page, the pinning win is per request
        let mapped = if len >= 64 << 10 { len.next_multiple_of(mem::HUGE) } else { len.max(1).next_multiple_of(4096) };
        let ptr = mem::map(mapped);
        assert!(!ptr.is_null(), "out of memory mapping a {mapped} byte I/O buffer");
        AlignedBuf { ptr, len, mapped }
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}
impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}
impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: our own mapping, no slices outlive self
        unsafe { mem::unmap(self.ptr, self.mapped) }
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
