//! The io_uring engine: per thread a ring holding up to `iodepth` I/Os, on buffers and files
//! registered with the ring (fixed buffers and files; plain ones if registration is refused). Failed I/Os are
//! retried synchronously with pread/pwrite (`Worker::retry`). Two writes to the same block are
//! never in flight together: the device could apply them in either order, and the content map
//! could not say which one the block holds. (Reads are not tracked: whatever a read returns,
//! the map is unaffected.) With large writes, while the queue is full the next op is drawn and
//! its content filled into a spare slot (`staged`), so the fill overlaps the I/Os in flight; it
//! is announced to the write observer and submitted only when a slot frees. With 4 KiB blocks
//! every pool segment has a home slot besides the spares: a write goes to its segment's home
//! when that is free, where only its stamps are written (8 of 64 cache lines), not a 4 KiB copy.

use super::direct::AlignedBuf;
use super::op::{Op, Worker, fill_for, fills_ahead, io_result, segment_buffers};
use crate::content::{HELD_NONE, SEGMENTS};
use crate::spec::workload::config::CONTENT_BLOCK;
use anyhow::{Context, Result};
use io_uring::{IoUring, opcode, types};
use std::collections::{HashSet, VecDeque};
use std::fs::File;
use std::hash::{BuildHasherDefault, Hasher};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::time::Instant;

struct Slots {
    bs: usize,
    per: usize,
    bufs: AlignedBuf,
    ids: Vec<u64>,
    /// What each buffer block holds (`fill_held`).
    held: Vec<u32>,
    ops: Vec<Option<Op>>,
    /// Slots below `homes` are the home of the pool segment of their number (4 KiB writes
    /// only, else 0): free or not in `home_free`. The others, the spares, when free in `free`.
    homes: usize,
    home_free: Vec<bool>,
    free: Vec<usize>,
    /// (file slot, offset) of every write in flight (ops are block-aligned and equal-sized).
    busy: HashSet<(usize, u64), BuildHasherDefault<SlotHasher>>,
    /// Completions reaped but not yet accounted (slot, result, when reaped): `account` runs
    /// each one when its slot is wanted again, so the first refill goes out before the rest
    /// of a batch is accounted.
    done: VecDeque<(usize, i32, Instant)>,
    /// SQEs pushed and not yet reaped (submitted or not), and of those the ones not submitted.
    flight: usize,
    unsub: usize,
}

impl Slots {
    /// SQEs the kernel has and has not completed (as far as we have reaped).
    fn submitted(&self) -> usize {
        self.flight - self.unsub
    }

    fn release(&mut self, s: usize) {
        if s < self.homes {
            self.home_free[s] = true;
        } else {
            self.free.push(s);
        }
    }
}

/// Hashes the (file slot, offset) keys of `Slots::busy`: one multiply per word instead of
/// SipHash (the keys are ours, not an attacker's).
#[derive(Default)]
struct SlotHasher(u64);

impl Hasher for SlotHasher {
    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 29)
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(*b as u64);
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(23) ^ x).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
    fn write_usize(&mut self, x: usize) {
        self.write_u64(x as u64);
    }
}

/// Submit what is queued, wait for at least one completion, and queue every completion ready
/// for `account`.
fn reap(ring: &mut IoUring, sl: &mut Slots) -> Result<()> {
    match ring.submit_and_wait(1) {
        Ok(_) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
        Err(e) => return Err(e).context("io_uring_enter"),
    }
    sl.unsub = 0;
    let now = Instant::now();
    let n = sl.done.len();
    sl.done.extend(ring.completion().map(|c| (c.user_data() as usize, c.result(), now)));
    sl.flight -= sl.done.len() - n;
    Ok(())
}

/// Submit what is queued, without waiting.
fn submit(ring: &mut IoUring, sl: &mut Slots) -> Result<()> {
    match ring.submit() {
        Ok(_) => {}
        Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
        Err(e) => return Err(e).context("io_uring_enter"),
    }
    sl.unsub = 0;
    Ok(())
}

/// Account the oldest reaped completion (retries, stats, content map) and free its slot;
/// false when none is waiting.
fn account(sl: &mut Slots, wk: &mut Worker, files: &[File]) -> bool {
    let Some((s, res, at)) = sl.done.pop_front() else { return false };
    let (bs, per) = (sl.bs, sl.per);
    let op = sl.ops[s].take().expect("completion for an issued slot");
    let f = &files[op.slot];
    let buf = &mut sl.bufs[s * bs..(s + 1) * bs];
    let first = io_result(res, op.len);
    let retried = first.is_err();
    let res = if retried {
        let mut io = || if op.is_write { f.write_all_at(buf, op.offset) } else { f.read_exact_at(buf, op.offset) };
        wk.retry(first, &mut io)
    } else {
        first
    };
    let lat = if retried { op.t0.elapsed() } else { at - op.t0 };
    if wk.complete(&op, &sl.ids[s * per..(s + 1) * per], res, lat) {
        super::runner::sync_file(wk, f, op.slot, op.file);
    }
    if op.is_write {
        sl.busy.remove(&(op.slot, op.offset));
    }
    sl.release(s);
    true
}

/// A free spare slot, accounting reaped completions until one is. There are depth + 1 spares
/// and fewer than depth I/Os in flight, so one is free or among the reaped.
fn take_slot(sl: &mut Slots, wk: &mut Worker, files: &[File]) -> usize {
    while sl.free.is_empty() {
        assert!(account(sl, wk, files), "a free or reaped spare slot below the queue depth");
    }
    sl.free.pop().expect("a free spare slot")
}

/// Draw the next op into a slot and fill it: a write of one content block into its segment's
/// home slot when that is free, anything else into a spare.
fn next_op(sl: &mut Slots, wk: &mut Worker, files: &[File]) -> Option<(usize, Op)> {
    let (bs, per) = (sl.bs, sl.per);
    let (s, mut op) = if sl.homes == 0 {
        let s = take_slot(sl, wk, files);
        let Some(op) = wk.draw(&mut sl.ids[s * per..(s + 1) * per]) else {
            sl.free.push(s);
            return None;
        };
        (s, op)
    } else {
        let mut id = [0u64; 1];
        let op = wk.draw(&mut id)?;
        let home = (id[0] % SEGMENTS) as usize;
        let s = if op.is_write && sl.home_free[home] {
            sl.home_free[home] = false;
            home
        } else {
            take_slot(sl, wk, files)
        };
        sl.ids[s] = id[0];
        (s, op)
    };
    let ids = &sl.ids[s * per..(s + 1) * per];
    fill_for(&op, wk.sh.maps.seed, ids, &mut sl.bufs[s * bs..(s + 1) * bs], &mut sl.held[s * per..(s + 1) * per]);
    wk.announce(&mut op, ids);
    Some((s, op))
}

pub fn run_thread(wk: &mut Worker, files: &[File]) -> Result<()> {
    let qd = wk.sh.w.iodepth as usize;
    let bs = wk.sh.w.block_size as usize;
    let per = bs / CONTENT_BLOCK as usize;
    let entries = qd.next_power_of_two() as u32;
    // COOP_TASKRUN: completions are run when this thread enters the kernel anyway, not by
    // interrupting it, which pays at deep queues (BENCHMARKS.md). SINGLE_ISSUER: only
    // this thread uses the ring. Kernels before 6.0 refuse them: fall back to a plain ring.
    let mut ring =
        IoUring::builder().setup_coop_taskrun().setup_single_issuer().build(entries).or_else(|_| IoUring::new(entries)).context("cannot set up an io_uring")?;
    // one spare more than the depth: the staged op's
    let homes = if segment_buffers(wk.sh.w) { SEGMENTS as usize } else { 0 };
    let slots = homes + qd + 1;
    let mut sl = Slots {
        bs,
        per,
        bufs: AlignedBuf::try_new(slots.checked_mul(bs).context("the I/O buffer size overflows")?)?,
        ids: vec![0u64; slots * per],
        held: vec![HELD_NONE; slots * per],
        ops: (0..slots).map(|_| None).collect(),
        homes,
        home_free: vec![true; homes],
        free: (homes..slots).rev().collect(),
        busy: HashSet::with_capacity_and_hasher(qd * 2, Default::default()),
        done: VecDeque::with_capacity(slots),
        flight: 0,
        unsub: 0,
    };
    // SAFETY: s * bs < slots * bs, the buffer's length: each slot's start lies inside it
    let iov: Vec<libc::iovec> = (0..slots).map(|s| libc::iovec { iov_base: unsafe { sl.bufs.as_mut_ptr().add(s * bs) } as *mut _, iov_len: bs }).collect();
    // SAFETY: the buffers outlive the ring (dropped after it, below) and are not moved
    let fixed = unsafe { ring.submitter().register_buffers(&iov) }.is_ok();
    // the files too (fixed files): no file lookup and reference per I/O; plain fds if refused
    let fds: Vec<i32> = files.iter().map(|f| f.as_raw_fd()).collect();
    let fixed_files = u32::try_from(fds.len()).is_ok() && ring.submitter().register_files(&fds).is_ok();
    let mut exhausted = false;
    let mut staged: Option<(usize, Op)> = None;
    let stage = fills_ahead(wk.sh.w);
    loop {
        // fill the queue
        while (staged.is_some() || !exhausted) && sl.flight < qd {
            if let Some(d) = wk.rate_wait()
                && sl.flight > 0
            {
                // wait for completions rather than sleep with I/O in flight
                let ts = types::Timespec::from(d);
                let args = types::SubmitArgs::new().timespec(&ts);
                let _ = ring.submitter().submit_with_args(1, &args);
                sl.unsub = 0;
                break;
            }
            let (s, mut op) = match staged.take() {
                // drawn ahead: a stop or the duration may have come since
                Some((s, _)) if wk.stopping() => {
                    sl.free.push(s);
                    exhausted = true;
                    break;
                }
                Some((s, mut op)) => {
                    wk.announce(&mut op, &sl.ids[s * per..(s + 1) * per]);
                    (s, op)
                }
                None => {
                    let Some(next) = next_op(&mut sl, wk, files) else {
                        exhausted = true;
                        break;
                    };
                    next
                }
            };
            // a write to the same block is in flight: let it finish first
            if op.is_write && sl.busy.contains(&(op.slot, op.offset)) {
                while account(&mut sl, wk, files) {}
                while sl.busy.contains(&(op.slot, op.offset)) {
                    reap(&mut ring, &mut sl)?;
                    while account(&mut sl, wk, files) {}
                }
                op.t0 = Instant::now();
            }
            let p = sl.bufs[s * bs..].as_mut_ptr();
            macro_rules! sqe {
                ($fd:expr) => {
                    match (op.is_write, fixed) {
                        (true, true) => opcode::WriteFixed::new($fd, p, bs as u32, s as u16).offset(op.offset).build(),
                        (true, false) => opcode::Write::new($fd, p, bs as u32).offset(op.offset).build(),
                        (false, true) => opcode::ReadFixed::new($fd, p, bs as u32, s as u16).offset(op.offset).build(),
                        (false, false) => opcode::Read::new($fd, p, bs as u32).offset(op.offset).build(),
                    }
                };
            }
            let e = if fixed_files { sqe!(types::Fixed(op.slot as u32)) } else { sqe!(types::Fd(files[op.slot].as_raw_fd())) };
            // SAFETY: the buffer stays valid and untouched until its completion is reaped
            unsafe { ring.submission().push(&e.user_data(s as u64)) }.expect("ring has room for iodepth entries");
            if op.is_write {
                sl.busy.insert((op.slot, op.offset));
            }
            sl.ops[s] = Some(op);
            sl.flight += 1;
            sl.unsub += 1;
            // Refilling after a batch of completions (the device has run low): submit as soon
            // as what is queued here is at least what the device still has, so it never waits
            // for the whole refill (the next ones are drawn and the reaped accounted meanwhile).
            // A queue drained to 0 gets its I/Os in 1, 1, 2, 4, ... per io_uring_enter; a full
            // queue refilled one by one (and depth 1) still submits once, with the wait.
            if sl.flight < qd && sl.unsub >= sl.submitted().max(1) {
                submit(&mut ring, &mut sl)?;
            }
        }
        // nothing more to refill: hand the device what is queued, then account what was
        // reaped while the I/Os run
        if sl.unsub > 0 && !sl.done.is_empty() {
            submit(&mut ring, &mut sl)?;
        }
        while account(&mut sl, wk, files) {}
        if sl.flight == 0 {
            if exhausted && staged.is_none() {
                break;
            }
            continue;
        }
        // the queue is full: submit, then draw and fill the next op while the I/Os run
        // (`fills_ahead`: large writes, no rate limit)
        if stage && staged.is_none() && !exhausted {
            submit(&mut ring, &mut sl)?;
            let s = take_slot(&mut sl, wk, files);
            match wk.draw(&mut sl.ids[s * per..(s + 1) * per]) {
                Some(op) => {
                    fill_for(&op, wk.sh.maps.seed, &sl.ids[s * per..(s + 1) * per], &mut sl.bufs[s * bs..(s + 1) * bs], &mut sl.held[s * per..(s + 1) * per]);
                    staged = Some((s, op));
                }
                None => {
                    sl.free.push(s);
                    exhausted = true;
                }
            }
        }
        reap(&mut ring, &mut sl)?;
        // a failed I/O is accounted before anything more is issued (a stop policy stops now)
        if sl.done.iter().any(|&(_, res, _)| res < 0 || res as usize != bs) {
            while account(&mut sl, wk, files) {}
        }
    }
    // a ring's teardown is deferred: release the registered files now, or a file system
    // unmounted right after the run could still be busy
    if fixed_files {
        let _ = ring.submitter().unregister_files();
    }
    drop(ring);
    drop(sl);
    Ok(())
}
