//! Where the disk's bytes live: sparse RAM (default), a file, or a real block device.

use anyhow::{Context, Result, bail};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::RwLock;

pub trait Store: Send + Sync {
    fn read(&self, off: u64, buf: &mut [u8]) -> io::Result<()>;
    fn write(&self, off: u64, data: &[u8]) -> io::Result<()>;
    fn flush(&self) -> io::Result<()>;
    /// Forget [off, off+len): reads return zeroes afterwards.
    fn discard(&self, off: u64, len: u64) -> io::Result<()>;
    fn size(&self) -> u64;
    fn describe(&self) -> String;
    /// Make every byte resident now, so the store does not change speed as it fills (RAM:
    /// `RamStore::populate`); other stores have nothing to do.
    fn populate(&self) -> anyhow::Result<()> {
        Ok(())
    }
    /// Store `data` at `off` under locks that keep every other request off [off, off+len), for
    /// stores nobody can observe except through later requests (RAM). `locked` runs exactly
    /// once while the locks are held: for `Src::Borrowed` before the copy (the caller may
    /// acknowledge the write there: any later request waits for the locks), for `Src::Lent`
    /// once the bytes are stored, and it gets the lent buffer back; the store reads nothing of
    /// it afterwards. The `Hashed` blocks are hashed on the way in, and `edit` gets the hashes
    /// and the stored bytes before the locks are released. `Err(data)`: this store cannot (or
    /// the range is not inside it); nothing ran, write (after hashing) with `write`.
    fn write_locked<'a>(
        &self,
        off: u64,
        data: Src<'a>,
        hashed: Option<Hashed>,
        locked: &mut dyn FnMut(Option<Lent<'a>>),
        edit: &mut dyn FnMut(&[u128], &mut [u8]),
    ) -> Result<(), Src<'a>> {
        let _ = (off, hashed, locked, edit);
        Err(data)
    }
    /// Let `f` change the `len` stored bytes at `off` (read, changed, stored back if `f` says
    /// so) under the locks this store's writes take, so no write lands in between: a bit rotted
    /// at rest must not undo a client write. Returns what `f` returned.
    fn update(&self, off: u64, len: usize, f: &mut dyn FnMut(&mut [u8]) -> bool) -> io::Result<bool>;
}

/// A write's bytes as the store gets them.
pub enum Src<'a> {
    /// Borrowed for the whole call (the classic front end and every other caller).
    Borrowed(&'a [u8]),
    /// Lent until the store has copied them, then handed back (the ring front end).
    Lent(Lent<'a>),
}

impl<'a> Src<'a> {
    pub fn bytes(&self) -> &[u8] {
        match self {
            Src::Borrowed(b) => b,
            Src::Lent(l) => l.bytes(),
        }
    }
    pub fn len(&self) -> usize {
        self.bytes().len()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The lent buffer, to hand back with the acknowledgement (None for a borrowed one).
    pub fn lent(self) -> Option<Lent<'a>> {
        match self {
            Src::Borrowed(_) => None,
            Src::Lent(l) => Some(l),
        }
    }
}

/// A buffer whose first `len` bytes are a write, lent exclusively to the store: it moves into
/// the write and comes back with the acknowledgement, once the store has its own copy. The ring
/// front end's payload buffer: the reply is written into it and its commit lets the kernel
/// reuse it, which the borrow checker now allows only after the store gave it back.
pub struct Lent<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl<'a> Lent<'a> {
    pub fn new(buf: &'a mut [u8], len: usize) -> Lent<'a> {
        assert!(len <= buf.len(), "a write of {len} bytes in a {}-byte buffer", buf.len());
        Lent { buf, len }
    }
    pub fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
    /// The whole buffer, for the reply.
    pub fn into_buf(self) -> &'a mut [u8] {
        self.buf
    }
}

/// The whole blocks of a write to hash: `blocks` blocks of `bs` bytes, the first at byte `start`.
#[derive(Clone, Copy)]
pub struct Hashed {
    pub bs: usize,
    pub start: usize,
    pub blocks: usize,
}

// BLKGETSIZE64 = _IOR(0x12, 114, size_t): a block device's size in bytes
nix::ioctl_read!(blkgetsize64, 0x12, 114, u64);
// BLKDISCARD = _IO(0x12, 119), though it reads a {start, length} pair of u64: a "bad" encoding
nix::ioctl_write_ptr_bad!(blkdiscard, nix::request_code_none!(0x12, 119), [u64; 2]);

const CHUNK_SHIFT: u32 = 16; // 64 KiB lock granularity
const STRIPES: usize = 1024;
const HUGE_PAGE: usize = 2 << 20;

/// Whether a RAM store of `size` bytes goes on transparent huge pages: a random 4 KiB read
/// on 4 KiB pages pays a TLB miss, a two-level page walk in a VM, before its copy. Only where
/// the store fits in the machine's memory (the room `populate` allows), since a sparse store
/// on huge pages takes 2 MiB for the first 4 KiB written into each 2 MiB of it.
fn huge_pages_for(size: u64) -> bool {
    let Some(total) = crate::sys::mem_total() else { return false };
    size >= HUGE_PAGE as u64 && size <= total.saturating_sub((total / 8).max(256 << 20))
}

/// Sparse RAM: an anonymous NORESERVE mapping. Untouched pages read as zeroes and cost no
/// memory; discard gives pages back (MADV_DONTNEED). Concurrent requests to the same 64 KiB
/// chunk are serialised by striped locks (one lock at a time, except `write_locked`, which takes
/// a request's locks in stripe order: no deadlock).
pub struct RamStore {
    base: *mut u8,
    size: u64,
    locks: Vec<RwLock<()>>,
    /// Populated (`populate`): discard zeroes instead of giving pages back, so the store stays
    /// resident (mkfs discards the whole device).
    populated: std::sync::atomic::AtomicBool,
}

// SAFETY: the store owns its mapping (a raw pointer, so not Send by itself); nothing else
// refers to it, so another thread may own the store
unsafe impl Send for RamStore {}
// SAFETY: shared access goes through the stripe locks: every access to the mapping holds the
// lock of each chunk it touches (shared to read, exclusive to write)
unsafe impl Sync for RamStore {}

impl RamStore {
    pub fn new(size: u64) -> Result<RamStore> {
        let huge = huge_pages_for(size);
        // over-map by one huge page so the start can be aligned to it, then trim
        let extra = if huge { HUGE_PAGE } else { 0 };
        // SAFETY: fresh anonymous mapping, checked for failure.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size as usize + extra,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            bail!("cannot reserve {size} bytes of address space for the RAM store: {}", io::Error::last_os_error());
        }
        let raw = p as usize;
        let base = if huge { raw.next_multiple_of(HUGE_PAGE) } else { raw };
        // SAFETY: trimming the unused head and tail of our own fresh mapping; the advice is a
        // hint on it (without THP the store stays on 4 KiB pages)
        unsafe {
            if base > raw {
                libc::munmap(p, base - raw);
            }
            let tail = raw + size as usize + extra - (base + size as usize);
            if tail > 0 {
                libc::munmap((base + size as usize) as *mut libc::c_void, tail);
            }
            if huge {
                libc::madvise(base as *mut libc::c_void, size as usize, libc::MADV_HUGEPAGE);
            }
        }
        Ok(RamStore { base: base as *mut u8, size, locks: stripe_locks(), populated: false.into() })
    }

    /// Run `f` holding the write locks of every stripe [off, off+len) touches (len > 0). The
    /// only place that holds several stripe locks: taken in ascending stripe order, so two such
    /// callers cannot deadlock (everyone else holds one lock at a time). Consecutive chunks have
    /// consecutive stripes modulo STRIPES, so that order is at most two ranges, and the guards
    /// live on the stack: no allocation per request.
    fn with_write_locks<R>(&self, off: u64, len: u64, f: impl FnOnce() -> R) -> R {
        hold_in_order(&self.locks, false, stripe_order(off, len), f)
    }

    /// Visit [off, off+len) chunk by chunk under the chunk's lock.
    fn chunks(&self, off: u64, len: u64, write: bool, mut f: impl FnMut(*mut u8, usize, usize)) -> io::Result<()> {
        if off.checked_add(len).is_none_or(|e| e > self.size) {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let mut done = 0u64;
        while done < len {
            let pos = off + done;
            let chunk_end = ((pos >> CHUNK_SHIFT) + 1) << CHUNK_SHIFT;
            let n = (chunk_end - pos).min(len - done);
            let stripe = &self.locks[(pos >> CHUNK_SHIFT) as usize % STRIPES];
            // SAFETY: pos + n <= size, checked above.
            let ptr = unsafe { self.base.add(pos as usize) };
            if write {
                let _g = stripe.write().unwrap();
                f(ptr, done as usize, n as usize);
            } else {
                let _g = stripe.read().unwrap();
                f(ptr, done as usize, n as usize);
            }
            done += n;
        }
        Ok(())
    }
}

/// Run `f` holding `stripes` of `locks` (shared or exclusive), taken in the order given.
fn hold_in_order<R>(locks: &[RwLock<()>], shared: bool, mut stripes: impl Iterator<Item = usize>, f: impl FnOnce() -> R) -> R {
    match stripes.next() {
        None => f(),
        Some(s) if shared => {
            let _g = locks[s].read().unwrap();
            hold_in_order(locks, shared, stripes, f)
        }
        Some(s) => {
            let _g = locks[s].write().unwrap();
            hold_in_order(locks, shared, stripes, f)
        }
    }
}

fn stripe_locks() -> Vec<RwLock<()>> {
    (0..STRIPES).map(|_| RwLock::new(())).collect()
}

/// The stripes [off, off+len) touches (len > 0), ascending, each once.
fn stripe_order(off: u64, len: u64) -> std::iter::Chain<std::ops::Range<usize>, std::ops::Range<usize>> {
    let first = off >> CHUNK_SHIFT;
    let n = (((off + len - 1) >> CHUNK_SHIFT) - first + 1).min(STRIPES as u64) as usize;
    let s0 = first as usize % STRIPES;
    let wrapped = (s0 + n).saturating_sub(STRIPES);
    (0..wrapped).chain(s0..(s0 + n).min(STRIPES))
}

/// Writes at least this big are copied into the RAM store with non-temporal stores.
const STREAM_MIN: usize = 64 << 10;

/// Copy with non-temporal stores where the destination is 16-byte aligned (always, for block
/// aligned offsets into the page-aligned mapping); a plain copy otherwise. 32-byte stores where
/// the CPU has AVX2 (checked at run time; the build stays portable): fewer instructions per
/// line, which leaves more room for the hashing interleaved with the copy (BENCHMARKS.md).
/// Callers pick it for large writes only (`STREAM_MIN`) and must `store_fence` before others
/// may read the bytes.
///
/// # Safety
/// `src` readable and `dst` writable for `n` bytes, not overlapping.
unsafe fn copy_streaming(src: *const u8, dst: *mut u8, n: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        if (dst as usize).is_multiple_of(32) && std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the caller's contract; AVX2 checked just above
            unsafe { copy_streaming_avx2(src, dst, n) };
            return;
        }
        // SAFETY: the caller's contract on src/dst; every 16-byte access lies below n, and the
        // stores are aligned (checked); SSE2 is part of x86_64
        unsafe {
            use std::arch::x86_64::*;
            if (dst as usize).is_multiple_of(16) {
                let k = n / 16;
                for i in 0..k {
                    let v = _mm_loadu_si128(src.add(i * 16) as *const __m128i);
                    _mm_stream_si128(dst.add(i * 16) as *mut __m128i, v);
                }
                std::ptr::copy_nonoverlapping(src.add(k * 16), dst.add(k * 16), n - k * 16);
                return;
            }
        }
    }
    // SAFETY: the caller's contract on src/dst
    unsafe { std::ptr::copy_nonoverlapping(src, dst, n) }
}

/// `copy_streaming` with 32-byte non-temporal stores.
///
/// # Safety
/// As `copy_streaming`, with `dst` 32-byte aligned and a CPU with AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn copy_streaming_avx2(src: *const u8, dst: *mut u8, n: usize) {
    use std::arch::x86_64::*;
    let k = n / 32;
    // SAFETY: every 32-byte access lies below n (the caller's contract), the stores are
    // 32-byte aligned (the caller's contract); the tail is a plain copy of the rest
    unsafe {
        for i in 0..k {
            let v = _mm256_loadu_si256(src.add(i * 32) as *const __m256i);
            _mm256_stream_si256(dst.add(i * 32) as *mut __m256i, v);
        }
        std::ptr::copy_nonoverlapping(src.add(k * 32), dst.add(k * 32), n - k * 32);
    }
}

/// Copy `src` into `dst` (of the same length) as the RAM store copies a write in: with
/// non-temporal stores from `STREAM_MIN` bytes (cold destination memory, which an ordinary copy
/// would first read line by line), fenced before it returns; a plain copy below that.
pub fn copy_in(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "copy_in: lengths differ");
    if src.len() >= STREAM_MIN {
        // SAFETY: both slices are valid for len bytes, and a shared and a mutable borrow never
        // overlap
        unsafe { copy_streaming(src.as_ptr(), dst.as_mut_ptr(), src.len()) };
        store_fence();
    } else {
        dst.copy_from_slice(src);
    }
}

/// Order the non-temporal stores before what follows (they are weakly ordered: without it
/// another thread taking the chunk lock next could read stale bytes).
fn store_fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a fence touches no memory; SSE is part of x86_64
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

impl Drop for RamStore {
    fn drop(&mut self) {
        // SAFETY: our mapping of `size` bytes (`new`); no reference into it outlives the store
        unsafe { libc::munmap(self.base as *mut _, self.size as usize) };
    }
}

impl Store for RamStore {
    fn read(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        // SAFETY: `chunks` hands out [p, p+n) inside the mapping, read-locked: nobody writes it
        self.chunks(off, buf.len() as u64, false, |p, at, n| buf[at..at + n].copy_from_slice(unsafe { std::slice::from_raw_parts(p, n) }))
    }
    fn write(&self, off: u64, data: &[u8]) -> io::Result<()> {
        // declined only for a range outside the store
        self.write_locked(off, Src::Borrowed(data), None, &mut |_| {}, &mut |_, _| {}).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
    }
    /// Each hashed block is hashed right before it is copied: the hashing runs while the
    /// previous block's non-temporal stores drain, so it costs a fraction of a separate
    /// hashing pass (BENCHMARKS.md). A lent buffer is hashed the same way, on its way in, and
    /// handed back after.
    fn write_locked<'a>(
        &self,
        off: u64,
        data: Src<'a>,
        hashed: Option<Hashed>,
        locked: &mut dyn FnMut(Option<Lent<'a>>),
        edit: &mut dyn FnMut(&[u128], &mut [u8]),
    ) -> Result<(), Src<'a>> {
        let len = data.len();
        let h = hashed.unwrap_or(Hashed { bs: 1, start: len, blocks: 0 });
        let hashed_end = h.blocks.checked_mul(h.bs).and_then(|n| n.checked_add(h.start));
        if off.checked_add(len as u64).is_none_or(|e| e > self.size) || hashed_end.is_none_or(|e| e > len) {
            return Err(data);
        }
        if len == 0 {
            locked(data.lent()); // nothing to lock or copy
            return Ok(());
        }
        // SAFETY: off + len <= size (checked above): inside the mapping
        let dst = unsafe { self.base.add(off as usize) };
        self.with_write_locks(off, len as u64, || {
            // large writes bypass the cache: the store's memory is cold, and an ordinary copy would
            // first read every destination line; small writes gain nothing from it and keep the
            // plain copy (`STREAM_MIN`, BENCHMARKS.md)
            let stream = len >= STREAM_MIN;
            let copy = |src: &[u8], at: usize, n: usize| {
                let src = &src[at..at + n];
                // SAFETY: dst[at..at+n] lies in [off, off+len), inside the mapping and locked for
                // writing (no other access); `src` is a separate buffer of n bytes
                unsafe { if stream { copy_streaming(src.as_ptr(), dst.add(at), n) } else { std::ptr::copy_nonoverlapping(src.as_ptr(), dst.add(at), n) } }
            };
            fn block(base: &[u8], h: Hashed, b: usize) -> &[u8] {
                &base[h.start + b * h.bs..][..h.bs]
            }
            // on the stack up to 128 KiB of 4 KiB blocks: no allocation per request
            let (mut small, mut big) = ([0u128; 32], Vec::new());
            let hashes: &mut [u128] = if h.blocks <= small.len() {
                &mut small[..h.blocks]
            } else {
                big.resize(h.blocks, 0);
                &mut big
            };
            let mut copy_hashing = |src: &[u8]| {
                if h.blocks == 0 {
                    // nothing to hash: one copy
                    copy(src, 0, len);
                    store_fence();
                    return;
                }
                copy(src, 0, h.start);
                // SAFETY: dst + h.start lies in the mapping (h.start <= len, checked above)
                if stream && super::hashcopy::fits(unsafe { dst.add(h.start) }, h.bs) {
                    // each block hashed in the pass that streams it into the store: the hashing
                    // runs while the stores drain
                    for (b, hash) in hashes.iter_mut().enumerate() {
                        let at = h.start + b * h.bs;
                        // SAFETY: fits() checked (the block size, and every block's destination
                        // is dst + h.start plus whole blocks: aligned as the first); src[at..at+bs]
                        // is in the source, dst[at..at+bs] in the locked range, not overlapping
                        *hash = unsafe { super::hashcopy::hash_copy::<true>(src[at..at + h.bs].as_ptr(), dst.add(at), h.bs) };
                    }
                } else {
                    for (b, hash) in hashes.iter_mut().enumerate() {
                        *hash = crate::content::block_hash(block(src, h, b));
                        copy(src, h.start + b * h.bs, h.bs);
                    }
                }
                let tail = h.start + h.blocks * h.bs;
                copy(src, tail, len - tail);
                store_fence();
            };
            match data {
                Src::Borrowed(src) => {
                    locked(None);
                    copy_hashing(src);
                }
                // a lent buffer is still hot from the kernel's copy into it: hash it on the way,
                // not the stored copy (non-temporal stores: read back from memory, several
                // times the cost), and hand it back after
                Src::Lent(lent) => {
                    copy_hashing(lent.bytes());
                    locked(Some(lent));
                }
            }
            // SAFETY: as for the copies: in the mapping, locked for writing, no other view of it
            edit(hashes, unsafe { std::slice::from_raw_parts_mut(dst, len) });
        });
        Ok(())
    }
    fn update(&self, off: u64, len: usize, f: &mut dyn FnMut(&mut [u8]) -> bool) -> io::Result<bool> {
        if off.checked_add(len as u64).is_none_or(|e| e > self.size) {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        if len == 0 {
            return Ok(f(&mut []));
        }
        Ok(self.with_write_locks(off, len as u64, || {
            // SAFETY: [off, off+len) is in the mapping (checked) and locked for writing: this is
            // the only view of it until the locks are released
            f(unsafe { std::slice::from_raw_parts_mut(self.base.add(off as usize), len) })
        }))
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn discard(&self, off: u64, len: u64) -> io::Result<()> {
        let page = 4096usize;
        // SAFETY: `chunks` hands out [p, p+n) inside the mapping, write-locked: the zeroed edges
        // and the dropped pages between them lie in that range, which nobody else accesses
        self.chunks(off, len, true, |p, _, n| unsafe {
            // whole pages go back to the kernel; partial edges are zeroed
            let a = p as usize;
            let first = a.div_ceil(page) * page;
            let last = (a + n) / page * page;
            if self.populated.load(std::sync::atomic::Ordering::Relaxed) {
                std::ptr::write_bytes(p, 0, n);
            } else if first < last {
                std::ptr::write_bytes(p, 0, first - a);
                libc::madvise(first as *mut _, last - first, libc::MADV_DONTNEED);
                std::ptr::write_bytes(last as *mut u8, 0, a + n - last);
            } else {
                std::ptr::write_bytes(p, 0, n);
            }
        })
    }
    fn size(&self) -> u64 {
        self.size
    }
    fn describe(&self) -> String {
        "ram".into()
    }

    /// Fault every page in before the device appears: the first touch of fresh memory is slow
    /// (a page fault and zeroing per 4 KiB; on a VM also the host's own first touch), so a
    /// store that fills as it is written changes speed as it fills. MADV_POPULATE_WRITE
    /// (Linux 5.14) does it in the kernel, in 256 MiB steps with progress on stderr for large
    /// stores; older kernels get one write per page. Fails before touching anything if the
    /// store cannot fit in the machine's memory.
    fn populate(&self) -> anyhow::Result<()> {
        const STEP: u64 = 256 << 20;
        if let Some(total) = crate::sys::mem_total() {
            // leave an eighth of memory (at least 256 MiB) to everything else
            let room = total.saturating_sub((total / 8).max(256 << 20));
            if self.size > room {
                anyhow::bail!(
                    "cannot populate a {} MiB RAM disk: the machine has {} MiB of memory, and at most {} MiB can go to the disk; use a smaller --size or --populate false",
                    self.size >> 20,
                    total >> 20,
                    room >> 20
                );
            }
        }
        let loud = self.size >= 1 << 30;
        let t0 = std::time::Instant::now();
        let mut fallback = false;
        let mut off = 0u64;
        while off < self.size {
            let n = (self.size - off).min(STEP);
            // SAFETY: [off, off+n) lies inside our mapping; populating writes no bytes (pages
            // come in zeroed, as untouched pages read), so no lock is needed before the device
            // exists
            let r = if fallback { -1 } else { unsafe { libc::madvise(self.base.add(off as usize) as *mut _, n as usize, libc::MADV_POPULATE_WRITE) } };
            if r != 0 {
                let e = io::Error::last_os_error();
                if !fallback && e.raw_os_error() != Some(libc::EINVAL) {
                    anyhow::bail!("cannot populate the RAM store (MADV_POPULATE_WRITE): {e}");
                }
                if !fallback {
                    eprintln!("faultline: this kernel has no MADV_POPULATE_WRITE (Linux 5.14+); populating the RAM store by touching every page");
                    fallback = true;
                }
                for p in (off..off + n).step_by(4096) {
                    // SAFETY: p is inside the mapping; a volatile write of 0 keeps the content
                    // (zero) and makes the page resident
                    unsafe { std::ptr::write_volatile(self.base.add(p as usize), 0) };
                }
            }
            off += n;
            if loud {
                eprint!("\rfaultline: populating the RAM store: {} of {} MiB", off >> 20, self.size >> 20);
            }
        }
        if loud {
            eprintln!(" ({:.1} s)", t0.elapsed().as_secs_f64());
        }
        self.populated.store(true, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
}

/// Positioned I/O on an open file: a regular file (`open`: created sparse if missing; discard
/// punches holes) or a real block device (`open_device`: opened O_EXCL, which the kernel
/// refuses while the device is mounted or otherwise claimed; refused if it carries a
/// partition table or file system unless forced; discard is BLKDISCARD, else zeroes).
pub struct FileStore {
    file: File,
    path: PathBuf,
    size: u64,
    device: bool,
    /// Striped like the RAM store's: writes and discards hold theirs shared (they may run
    /// side by side, as pwrite allows), `update` exclusively, so a rot cannot interleave.
    locks: Vec<RwLock<()>>,
}

impl FileStore {
    pub fn open(path: &Path, size: Option<u64>) -> Result<FileStore> {
        let existed = path.exists();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .with_context(|| format!("cannot open store file {}", path.display()))?;
        let meta = file.metadata()?;
        if !meta.file_type().is_file() {
            bail!("{} is not a regular file; use --store device:{} --destructive for block devices", path.display(), path.display());
        }
        let size = match (size, existed) {
            (Some(s), false) => {
                file.set_len(s)?;
                s
            }
            (Some(s), true) if s != meta.len() => bail!(
                "store file {} is {} bytes but --size asks for {s}; leave --size out to use the file's size, or name a new file",
                path.display(),
                meta.len()
            ),
            (_, _) => meta.len(),
        };
        if size == 0 {
            bail!("store file {} is empty; give --size to create it", path.display());
        }
        Ok(FileStore { file, path: path.to_owned(), size, device: false, locks: stripe_locks() })
    }

    pub fn open_device(path: &Path, destructive: bool, force: bool) -> Result<FileStore> {
        if !destructive {
            bail!("--store device:{} overwrites the device; add --destructive to confirm that its contents may be destroyed", path.display());
        }
        let meta = std::fs::metadata(path).with_context(|| format!("cannot stat {}", path.display()))?;
        if !meta.file_type().is_block_device() {
            bail!("{} is not a block device; use --store file:{} for regular files", path.display(), path.display());
        }
        if let Some(m) = mounted_at(path) {
            bail!("{} is mounted on {m}; refusing to use a mounted device", path.display());
        }
        let file = OpenOptions::new().read(true).write(true).custom_flags(libc::O_EXCL).open(path).map_err(|e| match e.raw_os_error() {
            Some(libc::EBUSY) => anyhow::anyhow!("{} is in use (mounted, part of a RAID/LVM, or held by another program); refusing", path.display()),
            _ => anyhow::anyhow!("cannot open {}: {e}", path.display()),
        })?;
        if let Some(sig) = signature(path)?
            && !force
        {
            bail!("{} carries {sig}; refusing to overwrite it (add --force to destroy it)", path.display());
        }
        let mut size = 0u64;
        // SAFETY: our open fd; the kernel writes one u64 into `size`
        if let Err(e) = unsafe { blkgetsize64(file.as_raw_fd(), &mut size) } {
            bail!("cannot read the size of {}: {e}", path.display());
        }
        Ok(FileStore { file, path: path.to_owned(), size, device: true, locks: stripe_locks() })
    }
}

/// Where a block device is mounted, from /proc/self/mountinfo (by device number).
fn mounted_at(path: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let rdev = std::fs::metadata(path).ok()?.rdev();
    let (maj, min) = (libc::major(rdev), libc::minor(rdev));
    let want = format!("{maj}:{min}");
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        (f.get(2) == Some(&want.as_str())).then(|| f.get(4).unwrap_or(&"?").to_string())
    })
}

/// A partition table or file-system signature on the device, as `blkid -p` sees it.
fn signature(path: &Path) -> Result<Option<String>> {
    let out = std::process::Command::new("blkid")
        .args(["-p", "-o", "export"])
        .arg(path)
        .output()
        .context("cannot run blkid (util-linux) to check the device for signatures")?;
    // exit 2 = nothing found
    if out.status.code() == Some(2) {
        return Ok(None);
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let get = |k: &str| text.lines().find_map(|l| l.strip_prefix(k).map(|v| v.to_string()));
    Ok(match (get("PTTYPE="), get("TYPE=")) {
        (Some(pt), _) => Some(format!("a {pt} partition table")),
        (_, Some(t)) => Some(format!("a {t} signature")),
        _ if !out.status.success() => Some(format!("an unreadable signature (blkid exit {:?})", out.status.code())),
        _ => None,
    })
}

impl Store for FileStore {
    fn read(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        self.file.read_exact_at(buf, off)
    }
    fn write(&self, off: u64, data: &[u8]) -> io::Result<()> {
        self.shared(off, data.len() as u64, || self.file.write_all_at(data, off))
    }
    fn flush(&self) -> io::Result<()> {
        self.file.sync_data()
    }
    fn discard(&self, off: u64, len: u64) -> io::Result<()> {
        self.shared(off, len, || self.discard_unlocked(off, len))
    }
    fn update(&self, off: u64, len: usize, f: &mut dyn FnMut(&mut [u8]) -> bool) -> io::Result<bool> {
        if off.checked_add(len as u64).is_none_or(|e| e > self.size) {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let mut buf = vec![0u8; len];
        let mut rmw = || {
            self.file.read_exact_at(&mut buf, off)?;
            let changed = f(&mut buf);
            if changed {
                self.file.write_all_at(&buf, off)?;
            }
            Ok(changed)
        };
        if len == 0 {
            return rmw();
        }
        hold_in_order(&self.locks, false, stripe_order(off, len as u64), rmw)
    }
    fn size(&self) -> u64 {
        self.size
    }
    fn describe(&self) -> String {
        format!("{}:{}", if self.device { "device" } else { "file" }, self.path.display())
    }
}

impl FileStore {
    /// Run `f` holding the stripe locks of [off, off+len) shared (none for an empty or
    /// out-of-range request: the I/O itself then fails or does nothing).
    fn shared<R>(&self, off: u64, len: u64, f: impl FnOnce() -> R) -> R {
        if len == 0 || off.checked_add(len).is_none() {
            return f();
        }
        hold_in_order(&self.locks, true, stripe_order(off, len), f)
    }

    fn discard_unlocked(&self, off: u64, len: u64) -> io::Result<()> {
        if !self.device {
            // SAFETY: a plain syscall on our fd
            let r = unsafe { libc::fallocate(self.file.as_raw_fd(), libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, off as i64, len as i64) };
            return if r == 0 { Ok(()) } else { Err(io::Error::last_os_error()) };
        }
        // BLKDISCARD; if the device cannot discard, write zeroes so reads match RAM/file semantics
        let range = [off, len];
        // SAFETY: our open fd; the kernel reads the two u64 of `range`
        if unsafe { blkdiscard(self.file.as_raw_fd(), &range) }.is_ok() {
            return Ok(());
        }
        let zero = vec![0u8; 1 << 20];
        let mut done = 0;
        while done < len {
            let n = (len - done).min(zero.len() as u64);
            self.file.write_all_at(&zero[..n as usize], off + done)?;
            done += n;
        }
        Ok(())
    }
}

/// A remote NBD export (`nbd://`, `nbd+unix://`) through `nbd::client`: the disk's
/// requests become NBD requests, several in flight (the FUSE threads or ring share the
/// client's connections). Errors come back as the server's errno, EIO once retries of a
/// timed-out or broken connection are used up.
pub struct NbdStore {
    client: crate::nbd::client::Client,
}

impl NbdStore {
    pub fn connect(t: &crate::spec::nbd::NbdTarget) -> Result<NbdStore> {
        let client = crate::nbd::client::Client::connect(t)?;
        if client.read_only() {
            bail!("{t}: the export is read-only; a faultline disk needs a writable store");
        }
        Ok(NbdStore { client })
    }

    /// The client's counters (retries, timeouts, ...), which it keeps while it works.
    pub fn counters(&self) -> std::sync::Arc<crate::nbd::client::Counters> {
        self.client.counters.clone()
    }
}

impl Store for NbdStore {
    fn read(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        self.client.read(off, buf)
    }
    fn write(&self, off: u64, data: &[u8]) -> io::Result<()> {
        self.client.write(off, data, false)
    }
    fn flush(&self) -> io::Result<()> {
        self.client.flush()
    }
    /// Reads must return zeroes afterwards, which TRIM does not promise: WRITE_ZEROES.
    fn discard(&self, off: u64, len: u64) -> io::Result<()> {
        self.client.write_zeroes(off, len)
    }
    fn size(&self) -> u64 {
        self.client.size()
    }
    fn describe(&self) -> String {
        format!("NBD export {} ({} connection(s))", self.client.target, self.client.pool_size())
    }
    /// Read, change, write back: not atomic against other clients' writes (a remote store
    /// has no lock we could hold); `rot` on a remote store is best-effort.
    fn update(&self, off: u64, len: usize, f: &mut dyn FnMut(&mut [u8]) -> bool) -> io::Result<bool> {
        let mut b = vec![0u8; len];
        self.client.read(off, &mut b)?;
        let changed = f(&mut b);
        if changed {
            self.client.write(off, &b, false)?;
        }
        Ok(changed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A RAM store that fits in memory is on huge pages (random reads skip the page walk),
    /// starts on a 2 MiB boundary, and still reads back what was written and zeroes elsewhere.
    #[test]
    fn ram_store_on_huge_pages_where_it_fits() {
        let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
        if !thp.contains("[always]") && !thp.contains("[madvise]") {
            println!("SKIPPED: ram_store_on_huge_pages_where_it_fits: transparent huge pages are off ({})", thp.trim());
            return;
        }
        let size = 64u64 << 20;
        assert!(huge_pages_for(size), "a 64 MiB store should fit in this machine's memory");
        let s = RamStore::new(size).unwrap();
        assert_eq!(s.base as usize % HUGE_PAGE, 0, "the store does not start on a huge page boundary");
        let data = vec![0xa5u8; 4096];
        s.write(3 << 20, &data).unwrap();
        let mut back = vec![0u8; 8192];
        s.read((3 << 20) - 4096, &mut back).unwrap();
        assert!(back[..4096].iter().all(|&b| b == 0) && back[4096..] == data[..]);
        // the mapping's line in smaps, then its AnonHugePages
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let base = s.base as usize;
        let mut inside = false;
        let mut huge_kib = None;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ')
                && let Some((a, b)) = range.split_once('-')
                && let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
            {
                inside = a <= base && base < b;
            } else if inside && let Some(v) = line.strip_prefix("AnonHugePages:") {
                huge_kib = v.trim().trim_end_matches("kB").trim().parse::<u64>().ok();
                break;
            }
        }
        let huge_kib = huge_kib.expect("the store's mapping in /proc/self/smaps");
        if huge_kib == 0 && std::fs::read_to_string("/proc/vmstat").unwrap_or_default().contains("thp_fault_fallback 0") {
            panic!("the written 2 MiB of the store is not on a huge page, and no huge page allocation failed");
        }
        if huge_kib == 0 {
            println!("SKIPPED: ram_store_on_huge_pages_where_it_fits: the kernel had no free huge page for the store");
            return;
        }
        assert!(huge_kib >= 2048, "AnonHugePages {huge_kib} kB");
    }

    /// The lock order of a multi-chunk write: every stripe it touches, once, ascending, also
    /// where the chunk numbers wrap around the stripe count and for writes over all stripes.
    #[test]
    fn stripe_order_is_sorted_and_complete() {
        let chunk = 1u64 << CHUNK_SHIFT;
        let wrap = STRIPES as u64 * chunk;
        for off in [0, 1, chunk - 1, 5 * chunk + 7, wrap - 3 * chunk - 1, wrap - 1, 7 * wrap + 3] {
            for len in [1, 4096, chunk, chunk + 1, 17 * chunk, wrap - chunk, wrap, 3 * wrap] {
                let mut want: Vec<usize> = ((off >> CHUNK_SHIFT)..=((off + len - 1) >> CHUNK_SHIFT)).map(|c| c as usize % STRIPES).collect();
                want.sort_unstable();
                want.dedup();
                assert_eq!(stripe_order(off, len).collect::<Vec<_>>(), want, "off {off} len {len}");
            }
        }
    }

    /// The ioctl numbers nix builds are the kernel's (include/uapi/linux/fs.h).
    #[test]
    fn ioctl_numbers_match_the_kernel() {
        assert_eq!(nix::request_code_read!(0x12, 114, size_of::<u64>()), 0x8008_1272); // BLKGETSIZE64
        assert_eq!(nix::request_code_none!(0x12, 119), 0x1277); // BLKDISCARD
    }

    #[test]
    fn ram_store_sparse_rw_discard() {
        let s = RamStore::new(1 << 30).unwrap();
        let mut b = vec![1u8; 200_000];
        s.read(123, &mut b).unwrap();
        assert!(b.iter().all(|x| *x == 0));
        let d: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8 + 1).collect();
        s.write(70_000, &d).unwrap();
        s.read(70_000, &mut b).unwrap();
        assert_eq!(b, d);
        s.discard(80_000, 100_000).unwrap();
        s.read(70_000, &mut b).unwrap();
        assert_eq!(&b[..10_000], &d[..10_000]);
        assert!(b[10_000..110_000].iter().all(|x| *x == 0));
        assert_eq!(&b[110_000..], &d[110_000..]);
        assert!(s.read((1 << 30) - 10, &mut b).is_err());
    }

    /// Large writes take the streaming copy: at 32-, 16- and 1-byte aligned offsets (the AVX2,
    /// SSE2 and plain paths), with a tail that is not a whole vector, the bytes read back.
    #[test]
    fn streaming_copy_at_every_alignment() {
        let s = RamStore::new(1 << 24).unwrap();
        let n = STREAM_MIN * 2 + 7;
        for (k, off) in [1u64 << 20, (2 << 20) + 16, (3 << 20) + 1].into_iter().enumerate() {
            let d: Vec<u8> = (0..n).map(|i| (i * 7 + k * 13) as u8 | 1).collect();
            s.write(off, &d).unwrap();
            let mut b = vec![0u8; n + 2];
            s.read(off - 1, &mut b).unwrap();
            assert_eq!((b[0], b[n + 1]), (0, 0), "off {off}: bytes outside the write");
            assert_eq!(&b[1..=n], &d[..], "off {off}");
        }
    }
}
