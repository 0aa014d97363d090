//! The volatile write cache (`disk: {write_cache: volatile}`, `serve --write-cache volatile`):
//! the layer between the faults and the store that remembers what a power cut can still take
//! away, and the power switch itself. docs/crash.md is the reference for the models.
//!
//! Writes go through to the store at once (reads need no lookup, and a flush has nothing to
//! write back). For each write since the last completed flush (the epoch) the layer keeps its
//! range and the bytes it replaced (an undo copy), taken under the store's range locks
//! together with the write (`Layer::update`) and appended to the epoch log inside them, so
//! overlapping writes are logged in the order they reached the store. The undo copies live one
//! after another in one mapping of the bound's size used round and round (`Ring`): a copy is a
//! bump of an index into memory touched before, and retiring an epoch moves another index. A
//! fresh allocation per copy cost several times the copy itself in page faults, and a drain
//! freed tens of thousands of them (BENCHMARKS.md, bench/micro/cachecost.rs). At a cut the log is
//! walked back from the store: the store's bytes in write n's range are write n's data, and
//! putting n's undo copy back gives the state before n; at the end the store holds the durable
//! state and each entry holds its write's data. The survival model then picks what is written
//! again, forward in completion order, at 512-byte sector granularity.
//!
//! A flush ends the epoch for the writes that completed before it started. A FUA write is
//! marked in the log and every model keeps it (`Disk::with_fua`). The undo copies are bounded
//! (`write_cache_size`): at the bound the cache writes everything back as a flush would (a
//! `drain`).

use super::Outcome;
use super::layer::Layer;
use super::store::{Hashed, Lent, Src};
use rand::{Rng, SeedableRng, rngs::StdRng};
use serde::{Deserialize, Serialize};
use std::cell::Cell;
use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard};

pub use crate::spec::disk::{CacheMode, SurvivalModel};

/// What a power cut did (reply to `power_cut`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CutReport {
    pub model: Option<SurvivalModel>,
    pub seed: u64,
    /// Flushes completed before the cut (the epoch number the cut ended).
    pub epoch: u64,
    /// Writes (and discard pieces) acknowledged since the last completed flush, FUA writes
    /// included.
    pub unflushed: u64,
    /// Of those, kept whole, lost whole, and torn (some sectors kept): kept + lost + torn =
    /// unflushed.
    pub kept: u64,
    pub lost: u64,
    pub torn: u64,
    /// Bytes of the unflushed writes kept and lost (a torn write's sectors count where they
    /// went).
    pub kept_bytes: u64,
    pub lost_bytes: u64,
    /// Of the unflushed writes, those written with FUA: every model keeps them (in `kept`).
    #[serde(default)]
    pub fua: u64,
}

/// The cache's counters (`stats`' `write_cache` section).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CacheStats {
    pub mode: Option<CacheMode>,
    /// Completed flushes (epochs ended).
    pub flushes: u64,
    /// Unflushed writes and their bytes now.
    pub unflushed: u64,
    pub unflushed_bytes: u64,
    /// Times the cache reached its size and wrote everything back on its own.
    pub drains: u64,
    pub powered: bool,
    pub cuts: u64,
    /// Memory the undo copies take now, and the bound (`write_cache_size`).
    #[serde(default)]
    pub held_bytes: u64,
    #[serde(default)]
    pub limit_bytes: u64,
    /// FUA writes (and discards) served.
    #[serde(default)]
    pub fua_writes: u64,
}

/// The sector a survival model keeps or loses whole.
pub const SECTOR: u64 = 512;
/// A discard is logged in pieces of at most this size, each a write of zeroes: its undo copy
/// is taken in one buffer per piece (a file store reads it into memory).
pub const DISCARD_PIECE: u64 = 1 << 20;

thread_local! {
    /// Set by `Disk::with_fua` while a FUA request goes down the chain (which runs on the
    /// calling thread): the cache marks the writes it logs durable, and the flush that follows
    /// keeps the epoch.
    static FUA: Cell<bool> = const { Cell::new(false) };
}

/// Run `f` with the requests it makes down the chain marked FUA if `on` (docs/crash.md).
pub fn as_fua<R>(on: bool, f: impl FnOnce() -> R) -> R {
    if !on {
        return f();
    }
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            FUA.set(self.0);
        }
    }
    let _reset = Reset(FUA.replace(true));
    f()
}

/// Whether every byte of `b` is zero (64 bytes at a time: the inner fold vectorises, and the
/// scan stops at the first block with a non-zero byte).
fn all_zero(b: &[u8]) -> bool {
    let mut blocks = b.chunks_exact(64);
    blocks.all(|c| c.iter().fold(0u8, |a, x| a | x) == 0) && blocks.remainder().iter().all(|x| *x == 0)
}

/// A write's data after the walk back of a cut: all zero ones are not kept.
enum Bytes {
    Zero,
    Copy(Box<[u8]>),
}

impl Bytes {
    fn of(b: &[u8]) -> Bytes {
        if all_zero(b) { Bytes::Zero } else { Bytes::Copy(b.into()) }
    }
}

/// `Entry::copy` of a write that replaced zeroes only: no undo copy is kept.
const ZERO: usize = usize::MAX;

#[derive(Clone, Copy)]
struct Entry {
    off: u64,
    len: u64,
    fua: bool,
    /// Where the bytes the write replaced are in the ring, or `ZERO`.
    copy: usize,
}

/// The undo copies, one after another in log order, in one anonymous mapping of `cap` bytes
/// (the bound) used round and round: live copies are [tail, head), or [tail, cap) and [0, head)
/// once `head` has wrapped (a copy that does not fit before the end starts at 0; the bytes it
/// skipped are free again when `tail` passes them). The mapping is made at the first copy and
/// reserves no memory: pages are touched as copies first reach them and then stay with the
/// daemon for reuse (at most `cap` bytes).
struct Ring {
    base: *mut u8,
    cap: usize,
    head: usize,
    tail: usize,
    /// Where the copies before the last wrap end (`cap` when none is pending): the tail goes
    /// to 0 when it gets there.
    end: usize,
    /// Bytes of live copies.
    live: usize,
}

// SAFETY: the ring owns its mapping; the pointer is only used through `&mut Ring` (inside the
// cache's log mutex) or dropped with it, so it may move to another thread
unsafe impl Send for Ring {}

impl Ring {
    fn new(cap: u64) -> Ring {
        let cap = usize::try_from(cap).unwrap_or(usize::MAX);
        Ring { base: std::ptr::null_mut(), cap, head: 0, tail: 0, end: cap, live: 0 }
    }
    /// Room for `n` bytes: where they go, or None when the ring is full (or cannot be mapped).
    fn take(&mut self, n: usize) -> Option<usize> {
        if n > self.cap {
            return None;
        }
        if self.base.is_null() {
            // SAFETY: a fresh private anonymous mapping, checked for failure; NORESERVE: memory
            // is only taken as pages are touched
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    self.cap,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                return None;
            }
            self.base = p as *mut u8;
        }
        if self.live == 0 {
            // empty: start over at the front (its pages are the ones touched most recently)
            (self.head, self.tail, self.end) = (0, 0, self.cap);
        }
        let at = if self.live == 0 || self.tail < self.head {
            if self.head + n <= self.cap {
                self.head
            } else if n <= self.tail {
                self.end = self.head;
                0
            } else {
                return None;
            }
        } else if self.head + n <= self.tail {
            self.head
        } else {
            return None;
        };
        self.head = at + n;
        self.live += n;
        Some(at)
    }
    /// The `n` bytes at `at` (from `take`).
    fn bytes(&mut self, at: usize, n: usize) -> &mut [u8] {
        assert!(!self.base.is_null() && at + n <= self.cap, "a ring range outside the ring");
        // SAFETY: [at, at+n) lies in the mapping (checked); `&mut self` makes it the only view
        unsafe { std::slice::from_raw_parts_mut(self.base.add(at), n) }
    }
    /// The copy at [at, at+n) is no longer needed (copies retire in the order taken).
    fn give(&mut self, at: usize, n: usize) {
        self.live -= n;
        self.tail = at + n;
        if self.tail >= self.end {
            (self.tail, self.end) = (0, self.cap);
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        if !self.base.is_null() {
            // SAFETY: our mapping of `cap` bytes; no slice into it outlives `&mut self`
            unsafe { libc::munmap(self.base as *mut libc::c_void, self.cap) };
        }
    }
}

/// The writes of the current epoch, in completion order.
struct Epoch {
    entries: VecDeque<Entry>,
    /// Sequence number of `entries[0]` (every logged write gets the next one).
    base: u64,
    /// The unflushed writes' bytes.
    bytes: u64,
    ring: Ring,
}

impl Epoch {
    fn new(limit: u64) -> Epoch {
        Epoch { entries: VecDeque::new(), base: 0, bytes: 0, ring: Ring::new(limit) }
    }
    fn end(&self) -> u64 {
        self.base + self.entries.len() as u64
    }
    /// Undo bytes held.
    fn held(&self) -> u64 {
        self.ring.live as u64
    }
    /// Log a write of [off, off+old.len()) that replaces `old`. False (nothing logged) when its
    /// undo copy finds no room in the ring.
    fn push(&mut self, off: u64, fua: bool, old: &[u8]) -> bool {
        let copy = if all_zero(old) {
            ZERO
        } else {
            let Some(at) = self.ring.take(old.len()) else { return false };
            super::store::copy_in(self.ring.bytes(at, old.len()), old);
            at
        };
        self.bytes += old.len() as u64;
        self.entries.push_back(Entry { off, len: old.len() as u64, fua, copy });
        true
    }
    /// The writes logged before sequence `upto` are durable now.
    fn retire(&mut self, upto: u64) {
        let n = (upto.saturating_sub(self.base) as usize).min(self.entries.len());
        for e in self.entries.drain(..n) {
            if e.copy != ZERO {
                self.ring.give(e.copy, e.len as usize);
            }
            self.bytes -= e.len;
        }
        self.base += n as u64;
    }
}

/// What a model keeps of one write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Keep {
    All,
    Nothing,
    /// Per sector of the write (`sectors`), in order.
    Sectors(Vec<bool>),
}

/// The 512-byte sectors [off, off+len) touches, as (offset, length) pieces: a partial first or
/// last sector is a piece of its own.
pub fn sectors(off: u64, len: u64) -> impl Iterator<Item = (u64, u64)> {
    let end = off + len;
    let mut at = off;
    std::iter::from_fn(move || {
        if at >= end {
            return None;
        }
        let next = ((at / SECTOR + 1) * SECTOR).min(end);
        let piece = (at, next - at);
        at = next;
        Some(piece)
    })
}

/// What `model` keeps of the epoch's writes (each given by its range and FUA flag, in
/// completion order), drawn from `seed`: the same seed gives the same survivors. FUA writes
/// are always kept and take no part in the draw; the rules below are over the others (n of
/// them, in order):
/// - lose-all: none;
/// - keep-prefix: the first k, k uniform in 0..=n;
/// - random-subset: each with probability 1/2;
/// - torn: each sector of each with probability 1/2;
/// - reorder: k of them, 1 <= k < n, never the first k (a later write kept, an earlier one
///   lost); with n < 2 there is no such choice and none is kept, as lose-all.
pub fn plan(model: SurvivalModel, seed: u64, writes: &[(u64, u64, bool)]) -> Vec<Keep> {
    let mut rng = StdRng::seed_from_u64(seed);
    let volatile: Vec<usize> = (0..writes.len()).filter(|&i| !writes[i].2).collect();
    let n = volatile.len();
    let mut keep: Vec<Keep> = writes.iter().map(|w| if w.2 { Keep::All } else { Keep::Nothing }).collect();
    match model {
        SurvivalModel::LoseAll => {}
        SurvivalModel::KeepPrefix => {
            let k = rng.random_range(0..=n);
            for &i in &volatile[..k] {
                keep[i] = Keep::All;
            }
        }
        SurvivalModel::RandomSubset => {
            for &i in &volatile {
                if rng.random_bool(0.5) {
                    keep[i] = Keep::All;
                }
            }
        }
        SurvivalModel::Torn => {
            for &i in &volatile {
                let (off, len, _) = writes[i];
                let s: Vec<bool> = sectors(off, len).map(|_| rng.random_bool(0.5)).collect();
                keep[i] = if s.iter().all(|k| *k) {
                    Keep::All
                } else if s.iter().all(|k| !*k) {
                    Keep::Nothing
                } else {
                    Keep::Sectors(s)
                };
            }
        }
        SurvivalModel::Reorder if n >= 2 => loop {
            let k = rng.random_range(1..n);
            let mut pick = rand::seq::index::sample(&mut rng, n, k).into_vec();
            pick.sort_unstable();
            // the first k in order is a prefix: draw again (at most 1 in n draws is)
            if pick.iter().enumerate().all(|(a, b)| a == *b) {
                continue;
            }
            for p in pick {
                keep[volatile[p]] = Keep::All;
            }
            break;
        },
        SurvivalModel::Reorder => {}
    }
    keep
}

/// The cache layer over `next`.
pub struct WriteCache<L> {
    next: L,
    mode: CacheMode,
    limit: u64,
    /// Requests hold it shared while they run, a cut exclusively: a request is wholly before
    /// the cut or sees the power off.
    gate: RwLock<()>,
    powered: AtomicBool,
    log: Mutex<Epoch>,
    /// One drain at a time; writes that find one under way go on.
    draining: Mutex<()>,
    flushes: AtomicU64,
    drains: AtomicU64,
    cuts: AtomicU64,
    fua_writes: AtomicU64,
    /// The write log of `faultline crash explore` (disk::record), fed at each completion.
    record: super::record::Slot,
}

fn eio() -> Outcome {
    Outcome { errno: Some(libc::EIO), delay: None }
}

/// What the cache's locks answer when a thread panicked holding one: the state they guard may
/// be half changed, so every request that needs it fails with EIO (rather than panicking in
/// turn), and cuts and power-on are refused.
const POISONED: &str = "the write cache's state is lost (a request panicked while changing it); restart the daemon";

impl<L: Layer> WriteCache<L> {
    pub fn new(mode: CacheMode, limit: u64, next: L) -> WriteCache<L> {
        WriteCache {
            next,
            mode,
            limit,
            gate: RwLock::new(()),
            powered: AtomicBool::new(true),
            log: Mutex::new(Epoch::new(limit)),
            draining: Mutex::new(()),
            flushes: AtomicU64::new(0),
            drains: AtomicU64::new(0),
            cuts: AtomicU64::new(0),
            fua_writes: AtomicU64::new(0),
            record: Default::default(),
        }
    }
    pub fn mode(&self) -> CacheMode {
        self.mode
    }
    /// The write recorder's slot (`record`, `mark` requests).
    pub fn recorder(&self) -> &super::record::Slot {
        &self.record
    }

    pub fn powered(&self) -> bool {
        self.powered.load(Relaxed)
    }

    /// The gate held shared for a request: None (answer EIO) with the power off or the gate
    /// poisoned.
    fn on(&self) -> Option<RwLockReadGuard<'_, ()>> {
        let g = self.gate.read().ok()?;
        self.powered().then_some(g)
    }
    /// The epoch log: None (answer EIO) when poisoned.
    fn epoch(&self) -> Option<MutexGuard<'_, Epoch>> {
        self.log.lock().ok()
    }

    /// Cut the power: apply `model` (seeded) to the unflushed writes, then fail every request
    /// until `power_on`.
    pub fn power_cut(&self, model: SurvivalModel, seed: u64) -> anyhow::Result<CutReport> {
        if self.mode == CacheMode::None {
            anyhow::bail!("the disk has no volatile write cache; serve --write-cache volatile / disk: {{write_cache: volatile}}");
        }
        // waits for the requests in flight; later ones see the power off
        let Ok(_off) = self.gate.write() else { anyhow::bail!("{POISONED}") };
        let Ok(mut log) = self.log.lock() else { anyhow::bail!("{POISONED}") };
        if !self.powered.swap(false, Relaxed) {
            anyhow::bail!("the power is already off; power on first (faultline fault power-on)");
        }
        self.cuts.fetch_add(1, Relaxed);
        let end = log.end();
        let entries = std::mem::take(&mut log.entries);
        // walk back: put each write's undo copy over what the store holds in its range (the
        // write's data, later writes being undone already), keeping that data
        let mut data: Vec<Bytes> = Vec::with_capacity(entries.len());
        for e in entries.iter().rev() {
            let undo = (e.copy != ZERO).then(|| &*log.ring.bytes(e.copy, e.len as usize));
            self.next.update(e.off, e.len as usize, &mut |b| {
                data.push(Bytes::of(b));
                match undo {
                    None => b.fill(0),
                    Some(u) => b.copy_from_slice(u),
                }
                true
            })?;
        }
        data.reverse();
        // the epoch is over: its copies are free
        (log.base, log.bytes, log.ring.live) = (end, 0, 0);
        drop(log);
        // the store holds the durable state: write what the model keeps, in completion order
        let writes: Vec<(u64, u64, bool)> = entries.iter().map(|e| (e.off, e.len, e.fua)).collect();
        let keep = plan(model, seed, &writes);
        let mut r = CutReport { model: Some(model), seed, epoch: self.flushes.load(Relaxed), unflushed: entries.len() as u64, ..Default::default() };
        let zeroes = vec![0u8; entries.iter().map(|e| e.len).max().unwrap_or(0) as usize];
        for ((e, k), bytes) in entries.iter().zip(&keep).zip(&data) {
            let data: &[u8] = match bytes {
                Bytes::Zero => &zeroes[..e.len as usize],
                Bytes::Copy(d) => d,
            };
            let put = |off: u64, len: u64| -> anyhow::Result<()> {
                let at = (off - e.off) as usize;
                let o = super::layer::write_now(&self.next, off, &data[at..at + len as usize]);
                if let Some(errno) = o.errno {
                    anyhow::bail!("power cut: cannot write back a kept write at byte {off}: {}", io::Error::from_raw_os_error(errno));
                }
                Ok(())
            };
            r.fua += e.fua as u64;
            match k {
                Keep::All => {
                    put(e.off, e.len)?;
                    r.kept += 1;
                    r.kept_bytes += e.len;
                }
                Keep::Nothing => {
                    r.lost += 1;
                    r.lost_bytes += e.len;
                }
                Keep::Sectors(s) => {
                    r.torn += 1;
                    for ((off, len), kept) in sectors(e.off, e.len).zip(s) {
                        if *kept {
                            put(off, len)?;
                            r.kept_bytes += len;
                        } else {
                            r.lost_bytes += len;
                        }
                    }
                }
            }
        }
        // what is on the store now is what the device would hold after power-up
        let _ = self.next.flush();
        Ok(r)
    }

    /// Power on: requests are served again. Err if the power is on.
    pub fn power_on(&self) -> anyhow::Result<()> {
        if self.mode == CacheMode::None {
            anyhow::bail!("the disk has no volatile write cache (and no power switch); serve --write-cache volatile / disk: {{write_cache: volatile}}");
        }
        let Ok(_g) = self.gate.write() else { anyhow::bail!("{POISONED}") };
        if self.powered.swap(true, Relaxed) {
            anyhow::bail!("the power is on; power-on follows a power-cut");
        }
        Ok(())
    }

    pub fn stats(&self) -> CacheStats {
        // the figures of a poisoned log are still worth showing
        let log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        CacheStats {
            mode: Some(self.mode),
            flushes: self.flushes.load(Relaxed),
            unflushed: log.entries.len() as u64,
            unflushed_bytes: log.bytes,
            drains: self.drains.load(Relaxed),
            powered: self.powered(),
            cuts: self.cuts.load(Relaxed),
            held_bytes: log.held(),
            limit_bytes: self.limit,
            fua_writes: self.fua_writes.load(Relaxed),
        }
    }

    /// Store through `put` (under the store's locks for [off, off+len)) and log the write with
    /// the bytes it replaced. The caller holds the gate, with the power on.
    fn logged(&self, off: u64, len: u64, put: &mut dyn FnMut(&mut [u8])) -> Outcome {
        let fua = FUA.get();
        if fua {
            self.fua_writes.fetch_add(1, Relaxed);
        }
        if len == 0 {
            return Outcome::OK;
        }
        // a write whose undo copy finds no room is not logged: what came before it is written
        // back (`over`: up to which sequence), and it is durable
        let (mut over, mut full, mut lost) = (None, false, false);
        let r = self.next.update(off, len as usize, &mut |b| {
            let Some(mut log) = self.epoch() else {
                // nothing stored: the write fails whole
                lost = true;
                return false;
            };
            if !log.push(off, fua, b) {
                over = Some(log.end());
            }
            full = log.held() >= self.limit;
            drop(log);
            // the range stays locked: no request sees the store between the log and the copy
            put(b);
            true
        });
        if lost {
            return eio();
        }
        let o = r.map_or_else(Outcome::io, |_| Outcome::OK);
        if let Some(upto) = over {
            self.drain(Some(upto));
        } else if full {
            self.drain(None);
        }
        o
    }

    /// The bound is reached: write everything back as a flush would (up to `upto`, or all).
    /// A write not logged (`upto` given) must wait for its turn: the writes before it must be
    /// durable before its acknowledgement, or a cut would put their undo copies over it.
    fn drain(&self, upto: Option<u64>) {
        let _one = match upto {
            Some(_) => match self.draining.lock() {
                Ok(g) => g,
                Err(_) => return,
            },
            None => match self.draining.try_lock() {
                Ok(g) => g,
                Err(_) => return,
            },
        };
        let upto = match upto.filter(|u| *u != u64::MAX) {
            Some(u) => u,
            None => match self.epoch() {
                Some(log) => log.end(),
                None => return,
            },
        };
        if self.next.flush().errno.is_none()
            && let Some(mut log) = self.epoch()
        {
            log.retire(upto);
            self.drains.fetch_add(1, Relaxed);
        }
    }
}

impl<L: Layer> Layer for WriteCache<L> {
    fn size(&self) -> u64 {
        self.next.size()
    }
    fn read(&self, off: u64, buf: &mut [u8]) -> Outcome {
        if self.mode == CacheMode::None {
            return self.next.read(off, buf);
        }
        let Some(_on) = self.on() else { return eio() };
        self.next.read(off, buf)
    }
    fn write<'a>(&self, off: u64, data: Src<'a>, ack: impl FnOnce(Outcome, Option<Lent<'a>>)) {
        if self.mode == CacheMode::None {
            if !self.record.on() {
                return self.next.write(off, data, ack);
            }
            let Some(r) = self.record.get() else { return self.next.write(off, data, ack) };
            // recording: the write is logged as it completes, before the client hears of it,
            // from the caller's bytes (borrowed for the whole call, or lent and handed back
            // with the acknowledgement): no copy
            let borrowed = match &data {
                Src::Borrowed(b) => Some(*b),
                Src::Lent(_) => None,
            };
            return self.next.write(off, data, move |o, lent| {
                if o.errno.is_none()
                    && let Some(bytes) = lent.as_ref().map(|l| l.bytes()).or(borrowed)
                {
                    r.write(off, bytes);
                }
                ack(o, lent)
            });
        }
        let o = match self.on() {
            None => eio(),
            Some(_on) => {
                let src = data.bytes();
                let o = self.logged(off, src.len() as u64, &mut |b| super::store::copy_in(b, src));
                if o.errno.is_none()
                    && let Some(r) = self.record.get()
                {
                    r.write(off, src);
                }
                o
            }
        };
        ack(o, data.lent())
    }
    /// Ends the epoch for the writes that completed before it started (later ones may or may
    /// not be covered by it, as on a device); the flush of a FUA request keeps the epoch.
    fn flush(&self) -> Outcome {
        let recorded = |o: Outcome| {
            if o.errno.is_none()
                && let Some(r) = self.record.get()
            {
                r.flush();
            }
            o
        };
        if self.mode == CacheMode::None {
            return recorded(self.next.flush());
        }
        let Some(_on) = self.on() else { return eio() };
        if FUA.get() {
            return recorded(self.next.flush());
        }
        let Some(upto) = self.epoch().map(|l| l.end()) else { return eio() };
        let o = self.next.flush();
        if o.errno.is_none() {
            let Some(mut log) = self.epoch() else { return eio() };
            log.retire(upto);
            self.flushes.fetch_add(1, Relaxed);
        }
        recorded(o)
    }
    /// A write of zeroes, logged in pieces of `DISCARD_PIECE` (only sectors not zero already
    /// are written: zeroing untouched RAM would take memory).
    fn discard(&self, off: u64, len: u64) -> Outcome {
        let recorded = |o: Outcome| {
            if o.errno.is_none()
                && let Some(r) = self.record.get()
            {
                r.discard(off, len);
            }
            o
        };
        if self.mode == CacheMode::None {
            return recorded(self.next.discard(off, len));
        }
        let Some(_on) = self.on() else { return eio() };
        let mut at = off;
        while at < off + len {
            let n = (off + len - at).min(DISCARD_PIECE - at % DISCARD_PIECE);
            let o = self.logged(at, n, &mut |b| {
                for s in b.chunks_mut(4096) {
                    if !all_zero(s) {
                        s.fill(0);
                    }
                }
            });
            if o.errno.is_some() {
                return o;
            }
            at += n;
        }
        recorded(Outcome::OK)
    }
    /// Declined with the cache on: the fault layer hashes first, then writes through `write`.
    fn write_locked<'a>(
        &self,
        off: u64,
        data: Src<'a>,
        hashed: Option<Hashed>,
        locked: &mut dyn FnMut(Option<Lent<'a>>),
        edit: &mut dyn FnMut(&[u128], &mut [u8]),
    ) -> Result<(), Src<'a>> {
        // the early acknowledgement would come before the log has the write: refused while
        // recording (and with the cache on), so the write takes `write` above
        if self.mode == CacheMode::None && !self.record.on() {
            return self.next.write_locked(off, data, hashed, locked, edit);
        }
        Err(data)
    }
    /// A change at rest (`rot`): logged like a FUA write of the range (every model keeps it),
    /// so a cut neither undoes it nor misplaces the writes around it.
    fn update(&self, off: u64, len: usize, f: &mut dyn FnMut(&mut [u8]) -> bool) -> io::Result<bool> {
        if self.mode == CacheMode::None {
            return self.next.update(off, len, f);
        }
        let eio = || io::Error::from_raw_os_error(libc::EIO);
        let Some(_on) = self.on() else { return Err(eio()) };
        let (mut over, mut lost) = (false, false);
        let changed = self.next.update(off, len, &mut |b| {
            // rare: the bytes before the change are kept aside first, as `f` changes them in place
            let before = b.to_vec();
            if !f(b) {
                return false;
            }
            let Some(mut log) = self.epoch() else {
                b.copy_from_slice(&before);
                lost = true;
                return false;
            };
            over = !log.push(off, true, &before);
            true
        })?;
        if lost {
            return Err(eio());
        }
        if over {
            self.drain(Some(u64::MAX));
        }
        Ok(changed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::disk::layer::{StoreLayer, write_now};
    use crate::disk::store::{FileStore, RamStore, Store};
    use rand::Rng;
    use std::sync::atomic::AtomicU64;

    const MODELS: [SurvivalModel; 5] =
        [SurvivalModel::LoseAll, SurvivalModel::KeepPrefix, SurvivalModel::RandomSubset, SurvivalModel::Torn, SurvivalModel::Reorder];

    fn cache_over(store: Box<dyn Store>, limit: u64) -> WriteCache<StoreLayer> {
        WriteCache::new(CacheMode::Volatile, limit, StoreLayer(store))
    }

    fn image(c: &WriteCache<StoreLayer>) -> Vec<u8> {
        let mut b = vec![0u8; c.size() as usize];
        assert!(c.next.read(0, &mut b).errno.is_none());
        b
    }

    /// Each model's choice obeys its documented rule, over random epochs (FUA writes mixed
    /// in), and the same seed gives the same choice.
    #[test]
    fn plans_follow_the_documented_rules() {
        let mut rng = StdRng::seed_from_u64(7);
        let (mut prefixes, mut subsets) = (std::collections::HashSet::new(), 0u32);
        for round in 0..400u64 {
            let n = rng.random_range(0..12);
            let writes: Vec<(u64, u64, bool)> = (0..n).map(|_| (rng.random_range(0..1 << 20), rng.random_range(1..5000), rng.random_bool(0.2))).collect();
            let vol: Vec<usize> = (0..n).filter(|&i| !writes[i].2).collect();
            for m in MODELS {
                let seed = round * 31 + m as u64;
                let k = plan(m, seed, &writes);
                assert_eq!(k, plan(m, seed, &writes), "{m}: same seed, same survivors");
                assert_eq!(k.len(), writes.len());
                for (i, w) in writes.iter().enumerate() {
                    if w.2 {
                        assert_eq!(k[i], Keep::All, "{m}: a FUA write is always kept");
                    }
                }
                let kept: Vec<bool> = vol.iter().map(|&i| k[i] == Keep::All).collect();
                let whole = vol.iter().all(|&i| matches!(k[i], Keep::All | Keep::Nothing));
                match m {
                    SurvivalModel::LoseAll => assert!(kept.iter().all(|x| !x) && whole),
                    SurvivalModel::KeepPrefix => {
                        let c = kept.iter().filter(|x| **x).count();
                        assert!(whole && kept.iter().take(c).all(|x| *x), "{m}: not a prefix: {kept:?}");
                        prefixes.insert((vol.len(), c));
                    }
                    SurvivalModel::RandomSubset => {
                        assert!(whole);
                        subsets += (kept.iter().any(|x| *x) && kept.iter().any(|x| !*x)) as u32;
                    }
                    SurvivalModel::Torn => {
                        for &i in &vol {
                            let (off, len, _) = writes[i];
                            if let Keep::Sectors(s) = &k[i] {
                                assert_eq!(s.len(), sectors(off, len).count());
                                assert!(s.iter().any(|x| *x) && s.iter().any(|x| !*x), "a torn write keeps some sectors, not all or none");
                            }
                        }
                    }
                    SurvivalModel::Reorder => {
                        assert!(whole);
                        let c = kept.iter().filter(|x| **x).count();
                        if vol.len() < 2 {
                            assert_eq!(c, 0, "reorder with fewer than two writes keeps none");
                        } else {
                            assert!(c >= 1 && c < vol.len(), "reorder keeps 1..n-1 writes: {kept:?}");
                            let first_lost = kept.iter().position(|x| !*x).unwrap();
                            assert!(kept[first_lost..].iter().any(|x| *x), "reorder kept a prefix: {kept:?}");
                        }
                    }
                }
            }
        }
        // the draws cover the range: every prefix length of 5-write epochs, and mixed subsets
        assert!((0..=5).all(|c| prefixes.contains(&(5, c))), "{prefixes:?}");
        assert!(subsets > 100, "{subsets}");
        // sector pieces: partial first and last sectors are pieces of their own
        assert_eq!(sectors(500, 1100).collect::<Vec<_>>(), vec![(500, 12), (512, 512), (1024, 512), (1536, 64)]);
        assert_eq!(sectors(1024, 512).collect::<Vec<_>>(), vec![(1024, 512)]);
    }

    /// An independent model of the disk: the durable image and the epoch's writes (data
    /// kept whole), flushed by applying them; at a cut the plan's survivors go over the
    /// durable image sector by sector. Random overlapping writes at any byte offset, discards
    /// (some over a piece boundary), FUA writes and flushes, on the RAM and the file store,
    /// for every model and several seeds.
    #[test]
    fn cuts_leave_what_an_oracle_says() {
        let dir = tempfile::tempdir().unwrap();
        let size = 3u64 << 20;
        for store in ["ram", "file"] {
            for m in MODELS {
                for seed in 0..4u64 {
                    let s: Box<dyn Store> = match store {
                        "ram" => Box::new(RamStore::new(size).unwrap()),
                        _ => Box::new(FileStore::open(&dir.path().join(format!("{m}-{seed}")), Some(size)).unwrap()),
                    };
                    let c = cache_over(s, 64 << 20);
                    let mut rng = StdRng::seed_from_u64(seed * 1000 + m as u64);
                    let mut cur = vec![0u8; size as usize];
                    let mut durable = cur.clone();
                    let mut epoch: Vec<(u64, Vec<u8>, bool)> = Vec::new();
                    let ops = rng.random_range(1..60);
                    for _ in 0..ops {
                        let r = rng.random_range(0..100);
                        if r < 8 {
                            assert!(c.flush().errno.is_none());
                            durable = cur.clone();
                            epoch.clear();
                            continue;
                        }
                        let off = rng.random_range(0..size - 300_000);
                        let max = [5000, 70_000, 300_000][rng.random_range(0..3)];
                        let len = rng.random_range(1..max);
                        if r < 18 {
                            // a discard crossing a piece boundary now and then
                            let off = if r < 11 { DISCARD_PIECE - len / 2 } else { off };
                            assert!(c.discard(off, len).errno.is_none());
                            let mut at = off;
                            while at < off + len {
                                let n = (off + len - at).min(DISCARD_PIECE - at % DISCARD_PIECE);
                                epoch.push((at, vec![0; n as usize], false));
                                at += n;
                            }
                            cur[off as usize..(off + len) as usize].fill(0);
                            continue;
                        }
                        let data: Vec<u8> = (0..len).map(|_| rng.random::<u8>() | 1).collect();
                        let fua = r < 25;
                        let o = as_fua(fua, || write_now(&c, off, &data));
                        assert!(o.errno.is_none());
                        cur[off as usize..(off + len) as usize].copy_from_slice(&data);
                        epoch.push((off, data, fua));
                    }
                    assert_eq!(image(&c), cur, "{store} {m} {seed}: the store holds every write before the cut");
                    let st = c.stats();
                    assert_eq!(st.unflushed, epoch.len() as u64);
                    let seed_cut = seed ^ 0xabc;
                    let r = c.power_cut(m, seed_cut).unwrap();
                    let keep = plan(m, seed_cut, &epoch.iter().map(|(o, d, f)| (*o, d.len() as u64, *f)).collect::<Vec<_>>());
                    let mut want = durable.clone();
                    let (mut kept, mut lost, mut torn, mut kb, mut lb) = (0, 0, 0, 0, 0);
                    for ((off, data, _), k) in epoch.iter().zip(&keep) {
                        let at = *off as usize;
                        match k {
                            Keep::All => {
                                want[at..at + data.len()].copy_from_slice(data);
                                kept += 1;
                                kb += data.len() as u64;
                            }
                            Keep::Nothing => {
                                lost += 1;
                                lb += data.len() as u64;
                            }
                            Keep::Sectors(s) => {
                                torn += 1;
                                // sector by sector, by hand: [a, b) within the sector grid
                                let mut a = *off;
                                for keep_it in s {
                                    let b = ((a / 512 + 1) * 512).min(off + data.len() as u64);
                                    if *keep_it {
                                        want[a as usize..b as usize].copy_from_slice(&data[(a - off) as usize..(b - off) as usize]);
                                        kb += b - a;
                                    } else {
                                        lb += b - a;
                                    }
                                    a = b;
                                }
                                assert_eq!(a, off + data.len() as u64);
                            }
                        }
                    }
                    assert!(image(&c) == want, "{store} {m} {seed}: the store after the cut is not what the model keeps");
                    let fua = epoch.iter().filter(|e| e.2).count() as u64;
                    assert_eq!(
                        (r.unflushed, r.kept, r.lost, r.torn, r.kept_bytes, r.lost_bytes, r.fua),
                        (epoch.len() as u64, kept, lost, torn, kb, lb, fua),
                        "{store} {m} {seed}"
                    );
                    // off: every request fails; power-on twice fails the second time
                    let mut b = [0u8; 512];
                    assert_eq!(c.read(0, &mut b).errno, Some(libc::EIO));
                    assert_eq!(write_now(&c, 0, &b).errno, Some(libc::EIO));
                    assert_eq!(c.flush().errno, Some(libc::EIO));
                    assert_eq!(c.discard(0, 512).errno, Some(libc::EIO));
                    assert!(c.power_cut(m, 1).unwrap_err().to_string().contains("already off"));
                    c.power_on().unwrap();
                    assert!(c.power_on().unwrap_err().to_string().contains("the power is on"));
                    assert!(c.read(0, &mut b).errno.is_none());
                    assert_eq!(c.stats().unflushed, 0, "a cut ends the epoch");
                }
            }
        }
    }

    /// The bound: at `limit` bytes of undo copies the cache writes everything back (a drain)
    /// and those writes survive any cut; a write whose undo copy alone is over the bound is
    /// durable at once, with everything before it.
    #[test]
    fn drains_at_the_bound() {
        let c = cache_over(Box::new(RamStore::new(1 << 20).unwrap()), 16 << 10);
        let blk = |v: u8| vec![v; 4096];
        // durable non-zero content, so undo copies are held (zero ones cost nothing)
        for b in 0..64u64 {
            write_now(&c, b * 4096, &blk(1));
        }
        assert!(c.flush().errno.is_none());
        for b in 0..4u64 {
            write_now(&c, b * 4096, &blk(2));
        }
        let s = c.stats();
        assert_eq!((s.drains, s.unflushed, s.held_bytes), (1, 0, 0), "{s:?}");
        write_now(&c, 4 * 4096, &blk(3));
        write_now(&c, 5 * 4096, &blk(3));
        // 32 KiB over held content: beyond the bound alone
        assert!(write_now(&c, 20 * 4096, &vec![4u8; 32 << 10]).errno.is_none());
        let s = c.stats();
        assert_eq!((s.drains, s.unflushed), (2, 0), "{s:?}");
        write_now(&c, 6 * 4096, &blk(5));
        let r = c.power_cut(SurvivalModel::LoseAll, 0).unwrap();
        assert_eq!((r.unflushed, r.lost), (1, 1));
        let img = image(&c);
        let at = |b: usize| img[b * 4096];
        assert_eq!((at(0), at(3), at(4), at(5), at(6), at(7), at(20), at(27), at(28)), (2, 2, 3, 3, 1, 1, 4, 4, 1));
    }

    /// Writes racing each other over the same blocks and a cut racing the writes: every
    /// acknowledged write is in the log (the report counts them all), and lose-all puts back
    /// exactly the state of the last flush, so the log's order matched the store's.
    #[test]
    fn concurrent_writes_and_a_cut() {
        for round in 0..6u64 {
            let c = cache_over(Box::new(RamStore::new(1 << 20).unwrap()), 256 << 20);
            let base: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
            write_now(&c, 0, &base);
            assert!(c.flush().errno.is_none());
            let acked = AtomicU64::new(0);
            let r = std::thread::scope(|s| {
                for t in 0..3u64 {
                    let (c, acked) = (&c, &acked);
                    s.spawn(move || {
                        let mut rng = StdRng::seed_from_u64(round * 10 + t);
                        for _ in 0..3000 {
                            let off = rng.random_range(0..64) * 1024 + rng.random_range(0..600);
                            let len = rng.random_range(1..20_000);
                            if write_now(c, off, &vec![t as u8 + 7; len]).errno.is_none() {
                                acked.fetch_add(1, Relaxed);
                            }
                        }
                    });
                }
                std::thread::sleep(std::time::Duration::from_millis(5 + round * 3));
                c.power_cut(SurvivalModel::LoseAll, 0).unwrap()
            });
            assert_eq!(r.unflushed, acked.load(Relaxed), "round {round}: every acknowledged write is in the log");
            assert!(r.unflushed > 0 && r.unflushed < 9000, "round {round}: the cut came while the writers wrote ({})", r.unflushed);
            assert!(image(&c) == base, "round {round}: lose-all did not restore the flushed state");
        }
    }

    /// The ring reuses its space round and round: live copies never overlap each other or
    /// leave the ring, each keeps its bytes until given back (in the order taken), space is
    /// refused only when no gap of that size is free, and an empty ring takes anything up to
    /// its size.
    #[test]
    fn the_ring_never_overlaps_live_copies() {
        let cap = 64 << 10;
        let mut ring = Ring::new(cap as u64);
        let mut live: VecDeque<(usize, usize, u8)> = VecDeque::new();
        let mut rng = StdRng::seed_from_u64(3);
        let (mut wraps, mut refused) = (0, 0);
        for i in 0..50_000u32 {
            if rng.random_bool(0.55) {
                let n = rng.random_range(1..20_000);
                match ring.take(n) {
                    Some(at) => {
                        assert!(at + n <= cap);
                        for &(a, m, _) in &live {
                            assert!(at + n <= a || a + m <= at, "take {at}+{n} overlaps live {a}+{m}");
                        }
                        wraps += (at == 0 && !live.is_empty()) as u32;
                        let tag = i as u8;
                        ring.bytes(at, n).fill(tag);
                        live.push_back((at, n, tag));
                    }
                    None => {
                        refused += 1;
                        assert!(!live.is_empty(), "an empty ring refused {n} bytes");
                        // no free gap of n bytes: the free space is [head, end) and [0, first)
                        // when not wrapped, or [head, first) when wrapped
                        let (first, last) = (live.front().unwrap(), live.back().unwrap());
                        let head = last.0 + last.1;
                        let gaps = if first.0 < head { vec![cap - head, first.0] } else { vec![first.0 - head] };
                        assert!(gaps.iter().all(|g| *g < n), "refused {n} bytes with gaps {gaps:?} free");
                    }
                }
            } else if let Some((at, n, tag)) = live.pop_front() {
                assert!(ring.bytes(at, n).iter().all(|b| *b == tag), "a live copy was overwritten");
                ring.give(at, n);
            }
            assert_eq!(ring.live, live.iter().map(|l| l.1).sum::<usize>());
        }
        assert!(wraps > 100 && refused > 100, "the sequence exercised wrapping ({wraps}) and a full ring ({refused})");
        while let Some((at, n, _)) = live.pop_front() {
            ring.give(at, n);
        }
        assert_eq!(ring.take(cap), Some(0), "an empty ring takes its whole size");
    }

    /// A flush that covers only part of the epoch (as one racing later writes does) retires
    /// the front of the log, so later copies wrap round the ring past live ones; with a small
    /// bound drains come in between. After all of it, lose-all still restores exactly the
    /// durable state, and keep-prefix the writes it keeps.
    #[test]
    fn partial_retires_wrap_the_ring_and_cuts_stay_exact() {
        for seed in 0..6u64 {
            for m in [SurvivalModel::LoseAll, SurvivalModel::KeepPrefix] {
                let size = 1u64 << 20;
                let c = cache_over(Box::new(RamStore::new(size).unwrap()), 96 << 10);
                let mut cur: Vec<u8> = (0..size as usize).map(|i| (i % 253) as u8 | 1).collect();
                write_now(&c, 0, &cur);
                assert!(c.flush().errno.is_none());
                let mut durable = cur.clone();
                let mut epoch: Vec<(u64, Vec<u8>)> = Vec::new();
                let mut rng = StdRng::seed_from_u64(seed);
                for i in 0..400u32 {
                    if rng.random_range(0..10) == 0 && !epoch.is_empty() {
                        let k = rng.random_range(0..=epoch.len());
                        let base = c.log.lock().unwrap().base;
                        c.log.lock().unwrap().retire(base + k as u64);
                        for (off, d) in epoch.drain(..k) {
                            durable[off as usize..off as usize + d.len()].copy_from_slice(&d);
                        }
                        continue;
                    }
                    let off = rng.random_range(0..size - 20_000);
                    let data = vec![(i % 250) as u8 + 2; rng.random_range(1..20_000)];
                    let drains = c.stats().drains;
                    assert!(write_now(&c, off, &data).errno.is_none());
                    cur[off as usize..off as usize + data.len()].copy_from_slice(&data);
                    if c.stats().drains > drains {
                        durable = cur.clone();
                        epoch.clear();
                    } else {
                        epoch.push((off, data));
                    }
                }
                assert!(c.stats().drains > 3, "seed {seed}: the bound was reached");
                let r = c.power_cut(m, seed).unwrap();
                assert_eq!(r.unflushed, epoch.len() as u64);
                let keep = plan(m, seed, &epoch.iter().map(|(o, d)| (*o, d.len() as u64, false)).collect::<Vec<_>>());
                for ((off, d), k) in epoch.iter().zip(&keep) {
                    if *k == Keep::All {
                        durable[*off as usize..*off as usize + d.len()].copy_from_slice(d);
                    }
                }
                assert!(image(&c) == durable, "seed {seed} {m}: the cut did not leave the durable state and the kept writes");
            }
        }
    }

    /// A thread that panicked holding the cache's log or gate leaves requests failing with
    /// EIO (nothing stored), not panicking in turn; cuts and power-on are refused with a reason.
    #[test]
    fn a_poisoned_lock_answers_eio() {
        let c = cache_over(Box::new(RamStore::new(1 << 20).unwrap()), 1 << 20);
        assert!(write_now(&c, 0, &[1; 4096]).errno.is_none());
        let poisoned = std::thread::scope(|s| {
            s.spawn(|| {
                let _g = c.log.lock().unwrap();
                panic!("test: a panic holding the log");
            })
            .join()
        });
        assert!(poisoned.is_err() && c.log.is_poisoned());
        assert_eq!(write_now(&c, 0, &[2; 4096]).errno, Some(libc::EIO));
        assert_eq!(image(&c)[..4096], [1; 4096], "a write that could not be logged stored nothing");
        assert_eq!(c.flush().errno, Some(libc::EIO));
        assert_eq!(c.discard(0, 4096).errno, Some(libc::EIO));
        assert!(c.power_cut(SurvivalModel::LoseAll, 0).unwrap_err().to_string().contains("state is lost"));
        assert_eq!(c.stats().unflushed, 1, "stats still answer");

        let c = cache_over(Box::new(RamStore::new(1 << 20).unwrap()), 1 << 20);
        let poisoned = std::thread::scope(|s| {
            s.spawn(|| {
                let _g = c.gate.write().unwrap();
                panic!("test: a panic holding the gate");
            })
            .join()
        });
        assert!(poisoned.is_err() && c.gate.is_poisoned());
        let mut b = [0u8; 512];
        assert_eq!(c.read(0, &mut b).errno, Some(libc::EIO));
        assert_eq!(write_now(&c, 0, &b).errno, Some(libc::EIO));
        assert_eq!(c.flush().errno, Some(libc::EIO));
        assert!(c.power_on().unwrap_err().to_string().contains("state is lost"));
    }

    /// Without the cache nothing is logged and there is no switch.
    #[test]
    fn none_has_no_switch() {
        let c = WriteCache::new(CacheMode::None, 0, StoreLayer(Box::new(RamStore::new(1 << 20).unwrap())));
        write_now(&c, 0, &[1; 4096]);
        assert!(c.power_cut(SurvivalModel::LoseAll, 0).unwrap_err().to_string().contains("no volatile write cache"));
        assert!(c.power_on().is_err());
        assert_eq!(c.log.lock().unwrap().entries.len(), 0);
    }
}
