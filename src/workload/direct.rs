//! O_DIRECT access to a block device with aligned buffers: every read reaches the disk, never
//! the page cache.

use anyhow::{Context, Result};
use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

/// A heap buffer aligned for O_DIRECT (4 KiB).
pub struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
}

unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    pub fn new(len: usize) -> AlignedBuf {
        let layout = Layout::from_size_align(len.max(1), 4096).unwrap();
        // SAFETY: non-zero size
        let ptr = unsafe { alloc_zeroed(layout) };
        assert!(!ptr.is_null(), "out of memory");
        AlignedBuf { ptr, len }
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
        unsafe { dealloc(self.ptr, Layout::from_size_align(self.len.max(1), 4096).unwrap()) }
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
