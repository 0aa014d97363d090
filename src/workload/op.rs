//! The per-op logic both engines share: `Worker::next_op` (`draw`: rate gate, bound claiming,
//! pattern, mix, content ids; `fill`: the bytes; `announce`: write observer) and
//! `Worker::complete` (stats, content map, errors, policy), plus `Worker::retry` (synchronous
//! retries with backoff). Engines only move bytes.

use super::maps::Maps;
use super::pattern::PatternGen;
use super::runner::IoError;
use super::stats::{IntervalAcc, OpAcc};
use super::{Progress, WriteEvent, WriteObserver};
use crate::content::stream::Stream;
use crate::content::{HELD_NONE, with_pool};
use crate::spec::workload::config::{CONTENT_BLOCK, ErrorPolicy, SyncMode, Workload};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// State all threads of one run share.
pub struct Shared<'a> {
    pub w: &'a Workload,
    pub maps: &'a Maps,
    pub stream: Stream,
    pub observer: Option<&'a dyn WriteObserver>,
    pub progress: &'a Progress,
    pub start: Instant,
    claimed_bytes: AtomicU64,
    claimed_ops: AtomicU64,
    /// Content blocks handed to writes so far: write n carries stream.id_at(n).
    write_blocks: AtomicU64,
    /// Stop issuing: an error under the stop policy, or a failed thread.
    pub stop: AtomicBool,
    /// A size/ops/duration bound was reached: draw no more (ops already drawn still run).
    exhausted: AtomicBool,
    pub stopped_on_error: AtomicBool,
    pub intervals: Vec<Mutex<IntervalAcc>>,
}

impl<'a> Shared<'a> {
    pub fn new(w: &'a Workload, maps: &'a Maps, observer: Option<&'a dyn WriteObserver>, progress: &'a Progress) -> Shared<'a> {
        Shared {
            w,
            maps,
            stream: w.stream(),
            observer,
            progress,
            start: Instant::now(),
            claimed_bytes: AtomicU64::new(0),
            claimed_ops: AtomicU64::new(0),
            write_blocks: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            exhausted: AtomicBool::new(false),
            stopped_on_error: AtomicBool::new(false),
            intervals: (0..w.threads).map(|_| Mutex::new(IntervalAcc::default())).collect(),
        }
    }
}

/// Where a thread's block index lands: one region of the device, or its own file set
/// (`files[i]` is a global file index; each holds `per_file` blocks).
pub enum Region {
    Device { first: u64 },
    Files { files: Vec<usize>, per_file: u64 },
}

/// One issued I/O.
pub struct Op {
    pub is_write: bool,
    /// Index into the thread's open files (0 on a device).
    pub slot: usize,
    /// Global file index (file interface).
    pub file: Option<usize>,
    pub offset: u64,
    pub len: u64,
    pub t0: Instant,
    /// Ops (all threads) drawn before this one, and bytes of writes before it.
    ops_before: u64,
    written_before: u64,
}

/// What one thread accumulated over the run.
pub struct ThreadOut {
    pub read: OpAcc,
    pub write: OpAcc,
    pub failed: Vec<IoError>,
    pub retries: u64,
    pub retry_time: Duration,
    /// `baseline: windows`: the thread's ops by window.
    pub windows: Option<super::windows::WindowAcc>,
}

pub struct Worker<'s, 'a> {
    pub sh: &'s Shared<'a>,
    t: usize,
    pattern: PatternGen,
    rng: SmallRng,
    region: Region,
    pub out: ThreadOut,
    /// Rate gate: time of the next op, and the gap between ops of this thread.
    next_at: Option<(Instant, Duration)>,
    writes_since_sync: u64,
    /// The durability oracle (maps.durability): this thread's writes since its last sync.
    pending: Vec<super::maps::Pending>,
    /// Completed ops and bytes not yet added to `Progress` (`flush_progress`), and when it was
    /// last done: one shared atomic update per batch, not two per op.
    unflushed: (u64, u64, Instant),
}

impl<'s, 'a> Worker<'s, 'a> {
    pub fn new(sh: &'s Shared<'a>, t: usize, region: Region, blocks: u64) -> Worker<'s, 'a> {
        let w = sh.w;
        let gap = w.rate_iops.map(|r| Duration::from_secs_f64(w.threads as f64 / r as f64));
        Worker {
            sh,
            t,
            pattern: PatternGen::new(w.pattern, blocks, w.seed ^ (t as u64 + 1).wrapping_mul(0x9E37_79B9)),
            rng: SmallRng::seed_from_u64(w.seed.wrapping_add(t as u64)),
            region,
            out: ThreadOut {
                read: OpAcc::new(),
                write: OpAcc::new(),
                failed: Vec::new(),
                retries: 0,
                retry_time: Duration::ZERO,
                windows: super::windows::WindowAcc::new(w.windows, super::windows::FLOWOPS),
            },
            next_at: gap.map(|g| (sh.start, g)),
            writes_since_sync: 0,
            pending: Vec::new(),
            unflushed: (0, 0, Instant::now()),
        }
    }

    pub fn region(&self) -> &Region {
        &self.region
    }

    /// Time to wait before the rate limit allows the next op (None: go now).
    pub fn rate_wait(&self) -> Option<Duration> {
        let (at, _) = self.next_at?;
        let now = Instant::now();
        (at > now).then(|| at - now)
    }

    /// The next op, its content filled into `buf` and its ids into `ids`; None when a bound is
    /// reached or the run stops. `held`: what `buf`'s blocks hold (`fill_held`); a read
    /// forgets it. Sleeps for the rate limit (engines with I/O in flight call `rate_wait`
    /// first and wait for completions instead).
    pub fn next_op(&mut self, buf: &mut [u8], ids: &mut [u64], held: &mut [u32]) -> Option<Op> {
        let mut op = self.draw(ids)?;
        fill_for(&op, self.sh.maps.seed, ids, buf, held);
        self.announce(&mut op, ids);
        Some(op)
    }

    /// Step 1 of `next_op`: rate gate, bound claim, pattern, mix, and for a write the content
    /// ids of its blocks (into `ids`). Draws happen in op order, so the data written is the
    /// same whichever engine asks and whoever fills the buffer.
    pub fn draw(&mut self, ids: &mut [u64]) -> Option<Op> {
        let (sh, w) = (self.sh, self.sh.w);
        if let Some(d) = self.rate_wait() {
            std::thread::sleep(d);
        }
        if let Some((at, gap)) = &mut self.next_at {
            // keep the schedule, but never bank more than 10 ms of missed ops as a burst
            *at = (*at + *gap).max(Instant::now() - Duration::from_millis(10));
        }
        if sh.exhausted.load(Relaxed) || self.stopping() {
            return None;
        }
        // claim before issuing, so size/ops bounds are exact across threads
        let b = sh.claimed_bytes.fetch_add(w.block_size, Relaxed);
        let o = sh.claimed_ops.fetch_add(1, Relaxed);
        if w.size.is_some_and(|s| b >= s) || w.ops.is_some_and(|n| o >= n) {
            sh.exhausted.store(true, Relaxed);
            return None;
        }
        let is_write = self.rng.random_range(0..100u8) < w.write_pct;
        let blk = self.pattern.next_block();
        let (slot, file, offset) = match &self.region {
            Region::Device { first } => (0, None, (first + blk) * w.block_size),
            Region::Files { files, per_file } => {
                let s = (blk / per_file) as usize;
                (s, Some(files[s]), (blk % per_file) * w.block_size)
            }
        };
        let mut written_before = 0;
        if is_write {
            let per = w.block_size / CONTENT_BLOCK;
            let n0 = sh.write_blocks.fetch_add(per, Relaxed);
            for (i, id) in ids[..per as usize].iter_mut().enumerate() {
                *id = sh.stream.id_at(n0 + i as u64);
            }
            written_before = n0 * CONTENT_BLOCK;
        }
        // t0 is set by `announce`, right before the I/O (no clock read here)
        Some(Op { is_write, slot, file, offset, len: w.block_size, t0: sh.start, ops_before: o, written_before })
    }

    /// Issue nothing more: a stop (error policy, Ctrl-C) or the duration is up. `draw` checks
    /// it; engines that draw ahead check it again before issuing what they drew.
    pub fn stopping(&self) -> bool {
        let sh = self.sh;
        sh.stop.load(Relaxed) || sh.progress.stop.load(Relaxed) || sh.w.duration.is_some_and(|d| sh.start.elapsed() >= d)
    }

    /// Step 3 of `next_op`, right before the I/O is issued: tell the write observer (it may arm
    /// a fault for exactly this write) and start the op's clock.
    pub fn announce(&self, op: &mut Op, ids: &[u64]) {
        let sh = self.sh;
        if op.is_write
            && let Some(obs) = sh.observer
        {
            obs.before_write(&WriteEvent {
                written_before: op.written_before,
                ops_before: op.ops_before,
                elapsed: sh.start.elapsed(),
                file: op.file,
                offset: op.offset,
                ids: &ids[..(op.len / CONTENT_BLOCK) as usize],
            });
        }
        op.t0 = Instant::now();
    }

    /// Retry a failed op per the policy (synchronously, exponential backoff from 1 ms);
    /// `redo` repeats the I/O. Returns the final result.
    pub fn retry(&mut self, first: std::io::Result<()>, mut redo: impl FnMut() -> std::io::Result<()>) -> std::io::Result<()> {
        let ErrorPolicy::Retry(n) = self.sh.w.on_error else { return first };
        let mut r = first;
        let mut attempt = 0;
        while r.is_err() && attempt < n {
            let tr = Instant::now();
            std::thread::sleep(Duration::from_millis(1 << attempt.min(10)));
            self.out.retries += 1;
            attempt += 1;
            r = redo();
            self.out.retry_time += tr.elapsed();
        }
        r
    }

    /// Account a finished op (after retries). Returns true when the sync mode wants an fsync
    /// of `op.slot` now (fsync:N).
    pub fn complete(&mut self, op: &Op, ids: &[u64], res: std::io::Result<()>, lat: Duration) -> bool {
        let (sh, w) = (self.sh, self.sh.w);
        let map = &sh.maps.maps[op.file.unwrap_or(0)];
        let first = op.offset / CONTENT_BLOCK;
        let per = op.len / CONTENT_BLOCK;
        self.unflushed.0 += 1;
        self.unflushed.1 += op.len;
        // the op's end, without reading the clock again
        if self.unflushed.0 >= PROGRESS_BATCH || (op.t0 + lat).saturating_duration_since(self.unflushed.2) >= PROGRESS_EVERY {
            self.flush_progress();
        }
        match res {
            Ok(()) => {
                let ns = lat.as_nanos() as u64;
                if let Some(win) = &mut self.out.windows {
                    let slot = if op.is_write { super::windows::WRITE } else { super::windows::READ };
                    win.record(slot, op.t0.saturating_duration_since(sh.start), lat, op.len);
                }
                let mut iv = sh.intervals[self.t].lock().unwrap();
                if op.is_write {
                    self.out.write.record(ns, op.len);
                    iv.write.record(ns, op.len);
                    drop(iv);
                    for i in 0..per {
                        map.set(first + i, ids[i as usize]);
                    }
                    self.track(op, ids, false);
                    if let SyncMode::Fsync(n) = w.sync {
                        self.writes_since_sync += 1;
                        if self.writes_since_sync >= n as u64 {
                            self.writes_since_sync = 0;
                            return true;
                        }
                    }
                } else {
                    self.out.read.record(ns, op.len);
                    iv.read.record(ns, op.len);
                }
            }
            Err(e) => {
                if op.is_write {
                    // content unknown after a failed write: nothing to verify there
                    for i in 0..per {
                        map.forget(first + i);
                    }
                    self.track(op, ids, true);
                }
                let errno = e.raw_os_error().unwrap_or(libc::EIO);
                self.fail(if op.is_write { "write" } else { "read" }, op.file, op.offset, op.len, errno);
            }
        }
        false
    }

    /// The oracle's record of a completed write (`failed`: it returned an error): durable at
    /// once with O_DSYNC, else pending until a sync of its file (device) succeeds.
    fn track(&mut self, op: &Op, ids: &[u64], failed: bool) {
        let Some(d) = &self.sh.maps.durability else { return };
        let m = op.file.unwrap_or(0);
        let first = op.offset / CONTENT_BLOCK;
        for (i, id) in ids[..(op.len / CONTENT_BLOCK) as usize].iter().enumerate() {
            if !failed && self.sh.w.sync == SyncMode::Dsync && !self.late(d) {
                d.set_durable(m, first + i as u64, *id);
            } else {
                self.pending.push(super::maps::Pending { map: m as u32, block: first + i as u64, id: *id, failed });
            }
        }
    }

    /// A sync of `file` (None: the device, which flushes every write of it) succeeded: every
    /// write of it this thread completed before is durable.
    pub fn synced(&mut self, file: Option<usize>) {
        let Some(d) = &self.sh.maps.durability else { return };
        if self.late(d) {
            return;
        }
        self.pending.retain(|p| {
            if file.is_some_and(|f| f as u32 != p.map) || p.failed {
                return true;
            }
            d.set_durable(p.map as usize, p.block, p.id);
            false
        });
    }

    /// A sync that succeeds now promises nothing: the power is going and the sync went
    /// through a file system (`Durability::syncs_through_fs`).
    fn late(&self, d: &super::maps::Durability) -> bool {
        d.syncs_through_fs && d.power_off.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The thread ends: what it wrote and never synced goes to the oracle's record.
    pub fn hand_over_unsynced(&mut self) {
        if let Some(d) = &self.sh.maps.durability {
            d.add_unsynced(std::mem::take(&mut self.pending));
        }
    }

    /// Add the ops and bytes completed since the last call to `Progress` (the engine calls it
    /// once more when its thread ends).
    pub fn flush_progress(&mut self) {
        let (ops, bytes, _) = self.unflushed;
        if ops > 0 {
            self.sh.progress.bytes.fetch_add(bytes, Relaxed);
            self.sh.progress.ops.fetch_add(ops, Relaxed);
        }
        self.unflushed = (0, 0, Instant::now());
    }

    /// Record a failed I/O (also an fsync) and apply the stop policy.
    pub fn fail(&mut self, op: &'static str, file: Option<usize>, offset: u64, len: u64, errno: i32) {
        self.sh.progress.errors.fetch_add(1, Relaxed);
        self.out.failed.push(IoError { op: op.into(), file, offset, len, errno });
        if self.sh.w.on_error == ErrorPolicy::Stop {
            self.sh.stopped_on_error.store(true, Relaxed);
            self.sh.stop.store(true, Relaxed);
        }
    }
}

/// `Progress` is brought up to date every this many ops of a thread, or this often.
const PROGRESS_BATCH: u64 = 64;
const PROGRESS_EVERY: Duration = Duration::from_millis(20);

/// Writes from this size on are drawn and filled ahead of their I/O (psync: on a filler thread;
/// io_uring: while the queue is full): below it the extra hand-over or submit costs more than
/// the fill it hides.
pub const FILL_AHEAD_MIN: u64 = 64 << 10;

/// The engines fill writes ahead for this workload. Not under a rate limit: drawing waits
/// for it, and would hold back the op in hand.
pub fn fills_ahead(w: &Workload) -> bool {
    w.block_size >= FILL_AHEAD_MIN && w.write_pct > 0 && w.rate_iops.is_none()
}

/// The bytes of content ids `ids` into `buf` (`seed`: the maps' seed), for a buffer whose
/// earlier content is unknown.
pub fn fill(seed: u64, ids: &[u64], buf: &mut [u8]) {
    with_pool(seed, |p| {
        for (id, b) in ids.iter().zip(buf.chunks_exact_mut(CONTENT_BLOCK as usize)) {
            let mut h = HELD_NONE;
            p.fill(*id, b, &mut h);
        }
    })
}

/// Step 2 of `next_op` for a write: the bytes of its content ids, into a buffer that keeps
/// what it holds: `held[k]`, the pool segment block k holds (`HELD_NONE` after a read into it),
/// lets a block that already holds the right segment get only its stamps. Needs nothing else
/// of the worker, so another thread can do it.
pub fn fill_held(seed: u64, ids: &[u64], buf: &mut [u8], held: &mut [u32]) {
    with_pool(seed, |p| {
        for ((id, b), h) in ids.iter().zip(buf.chunks_exact_mut(CONTENT_BLOCK as usize)).zip(held.iter_mut()) {
            p.fill(*id, b, h);
        }
    })
}

/// A read lands in this buffer: it no longer holds pool segments.
pub fn forget_held(held: &mut [u32]) {
    held.fill(HELD_NONE);
}

/// Step 2 of `next_op`: a buffer about to carry `op`, filled with a write's bytes
/// (`fill_held`), or for a read marked as holding no segment (`forget_held`).
pub fn fill_for(op: &Op, seed: u64, ids: &[u64], buf: &mut [u8], held: &mut [u32]) {
    if op.is_write {
        fill_held(seed, ids, buf, held);
    } else {
        forget_held(held);
    }
}

/// The engines keep one buffer per pool segment and write each 4 KiB block in its segment's,
/// so it gets only its stamps, not a 4 KiB copy (docs/workload.md).
pub fn segment_buffers(w: &Workload) -> bool {
    w.block_size == CONTENT_BLOCK && w.write_pct > 0
}

/// Map an io_uring / short-transfer result to io::Result.
pub fn io_result(res: i32, len: u64) -> std::io::Result<()> {
    if res < 0 {
        Err(std::io::Error::from_raw_os_error(-res))
    } else if res as u64 != len {
        // a short transfer inside a sized device/file: count it as an I/O error
        Err(std::io::Error::from_raw_os_error(libc::EIO))
    } else {
        Ok(())
    }
}
