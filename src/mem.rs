//! I/O buffers on transparent huge pages. For an O_DIRECT request the kernel pins the user
//! buffer and releases it afterwards page by page; on a 2 MiB folio that is one pin and one
//! release, a visible saving for large requests (BENCHMARKS.md). The RAM store maps its own
//! (`disk::store`: on huge pages only where it fits in memory, since a huge page turns a sparse
//! 4 KiB write into 2 MiB of memory).

pub const HUGE: usize = 2 << 20;

/// A private anonymous mapping of `len` bytes (a multiple of 4 KiB), zeroed, starting on a
/// 2 MiB boundary and marked MADV_HUGEPAGE when it is at least that big. Null on failure.
fn map(len: usize) -> *mut u8 {
    let huge = len >= HUGE;
    // over-map by one huge page so the start can be aligned to it, then trim
    let extra = if huge { HUGE } else { 0 };
    // NORESERVE: untouched pages are not charged (the ring's 1 MiB payloads mostly stay so)
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
    // SAFETY: a fresh anonymous mapping; failure checked
    let raw = unsafe { libc::mmap(std::ptr::null_mut(), len + extra, libc::PROT_READ | libc::PROT_WRITE, flags, -1, 0) };
    if raw == libc::MAP_FAILED {
        return std::ptr::null_mut();
    }
    let raw = raw as usize;
    let start = if huge { raw.next_multiple_of(HUGE) } else { raw };
    // SAFETY: trimming the unused head and tail of our own mapping
    unsafe {
        if start > raw {
            libc::munmap(raw as *mut libc::c_void, start - raw);
        }
        let tail = raw + len + extra - (start + len);
        if tail > 0 {
            libc::munmap((start + len) as *mut libc::c_void, tail);
        }
        if huge {
            // best effort: without THP the mapping still works, on 4 KiB pages
            libc::madvise(start as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
        }
    }
    start as *mut u8
}

/// An owned anonymous mapping (`map`), unmapped on drop: I/O buffers and the ring's payloads.
pub struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: plain memory owned by this value; `&`/`&mut` access follows Rust's borrow rules
unsafe impl Send for Mapping {}

impl Mapping {
    /// `len` bytes (rounded up to 4 KiB), zeroed; on huge pages from 2 MiB (`map`).
    pub fn new(len: usize) -> std::io::Result<Mapping> {
        // `map` adds up to a huge page for alignment: lengths that would overflow cannot be had
        let Some(len) = len.max(1).checked_next_multiple_of(4096).filter(|l| l.checked_add(HUGE).is_some()) else {
            return Err(std::io::Error::from_raw_os_error(libc::ENOMEM));
        };
        let ptr = map(len);
        if ptr.is_null() {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Mapping { ptr, len })
    }
}

impl std::ops::Deref for Mapping {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the mapping is `len` bytes and lives as long as self
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl std::ops::DerefMut for Mapping {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` is the only access
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: our own mapping (`map` with this `len`), no slices outlive self
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}
