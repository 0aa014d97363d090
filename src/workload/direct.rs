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
    /// Panics if the buffer cannot be mapped: for fixed small sizes; sizes from the user go
    /// through `try_new`.
    pub fn new(len: usize) -> AlignedBuf {
        AlignedBuf::try_new(len).unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// A failed mapping is an error naming the size.
    pub fn try_new(len: usize) -> Result<AlignedBuf> {
        // 64 KiB and more: round up to a whole huge page, the pinning win is per request
        let mapped = if len >= 64 << 10 { len.checked_next_multiple_of(mem::HUGE) } else { Some(len) };
        let map = mapped
            .ok_or_else(|| std::io::Error::from_raw_os_error(libc::ENOMEM))
            .and_then(mem::Mapping::new)
            .with_context(|| format!("cannot map a {} I/O buffer", crate::spec::units::format_size(len as u64)))?;
        Ok(AlignedBuf { map, len })
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

#[cfg(test)]
mod tests {
    /// A buffer that cannot be mapped is an error naming its size, not a panic.
    #[test]
    fn unmappable_buffer_is_an_error() {
        let e = super::AlignedBuf::try_new(usize::MAX - 4096).err().expect("no such buffer").to_string();
        assert!(e.starts_with("cannot map a ") && e.ends_with(" I/O buffer"), "{e}");
    }
}
