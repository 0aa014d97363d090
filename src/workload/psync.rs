//! The psync engine: one pread/pwrite at a time per thread.
//!
//! Large writes have their content generated ahead: while write k is in flight, a filler thread
//! writes the bytes of write k+1 into a second buffer. For large writes at queue depth 1 the
//! fill is a large part of the time per I/O (it writes cache lines the loop worker on another
//! core has just read; BENCHMARKS.md); done beside the I/O it leaves the critical path. The
//! I/O stays strictly synchronous: one pwrite at a time, the next issued only after the
//! previous returned. Smaller writes are filled inline: 4 KiB ones each into its pool segment's
//! own buffer (`run_homes`), others into a ring of buffers that keeps each block on the pool
//! segment it will hold next (`ring_slots`).

use super::direct::AlignedBuf;
use super::op::{Op, Worker, fill_for, fills_ahead, forget_held, segment_buffers};
use crate::content::{HELD_NONE, SEGMENTS};
use crate::spec::workload::config::{CONTENT_BLOCK, Workload};
use anyhow::Result;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

pub fn run_thread(wk: &mut Worker, files: &[File]) -> Result<()> {
    if fills_ahead(wk.sh.w) {
        return run_prefilled(wk, files);
    }
    let bs = wk.sh.w.block_size as usize;
    let per = bs / CONTENT_BLOCK as usize;
    if segment_buffers(wk.sh.w) {
        return run_homes(wk, files);
    }
    let n = ring_slots(wk.sh.w);
    let mut buf = AlignedBuf::try_new(n * bs)?;
    let mut ids = vec![0u64; n * per];
    let mut held = vec![HELD_NONE; n * per];
    let mut k = 0;
    loop {
        let (b, i, h) = (&mut buf[k * bs..(k + 1) * bs], &mut ids[k * per..(k + 1) * per], &mut held[k * per..(k + 1) * per]);
        let Some(op) = wk.next_op(b, i, h) else { break };
        issue(wk, files, &op, b, i);
        k = (k + 1) % n;
    }
    Ok(())
}

/// Buffers the inline path cycles through. One thread writes sequential content ids, so with
/// `SEGMENTS` blocks of buffer (1 MiB) every block is written again with the same pool segment
/// it holds and gets only its stamps (8 of 64 cache lines) instead of a 4 KiB copy. With more
/// threads a thread's ids are interleaved with the others': one buffer.
fn ring_slots(w: &Workload) -> usize {
    if w.threads != 1 {
        return 1;
    }
    (SEGMENTS * CONTENT_BLOCK / w.block_size).max(1) as usize
}

/// 4 KiB writes: one buffer per pool segment, each write into its segment's, so it gets only its
/// stamps whatever order the content ids come in (duplicates, several threads); reads into one
/// more.
struct Homes {
    buf: AlignedBuf,
    held: Vec<u32>,
    id: [u64; 1],
}

impl Homes {
    fn new() -> Result<Homes> {
        let n = SEGMENTS as usize + 1;
        Ok(Homes { buf: AlignedBuf::try_new(n * CONTENT_BLOCK as usize)?, held: vec![HELD_NONE; n], id: [0] })
    }

    /// The next op, announced, its content id (a write's) and its buffer, filled for a write.
    fn next(&mut self, wk: &mut Worker) -> Option<(Op, [u64; 1], &mut [u8])> {
        let mut op = wk.draw(&mut self.id)?;
        let bs = CONTENT_BLOCK as usize;
        // (the id is a write's; a read leaves the last one, which nothing reads)
        let k = if op.is_write { (self.id[0] % SEGMENTS) as usize } else { SEGMENTS as usize };
        let b = &mut self.buf[k * bs..(k + 1) * bs];
        fill_for(&op, wk.sh.maps.seed, &self.id, b, &mut self.held[k..k + 1]);
        wk.announce(&mut op, &self.id);
        Some((op, self.id, b))
    }
}

fn run_homes(wk: &mut Worker, files: &[File]) -> Result<()> {
    let mut h = Homes::new()?;
    while let Some((op, id, b)) = h.next(wk) {
        issue(wk, files, &op, b, &id);
    }
    Ok(())
}

/// One synchronous I/O with the retry policy, then its accounting (and fsync:N).
fn issue(wk: &mut Worker, files: &[File], op: &Op, buf: &mut [u8], ids: &[u64]) {
    let f = &files[op.slot];
    let io = |buf: &mut [u8]| if op.is_write { f.write_all_at(buf, op.offset) } else { f.read_exact_at(buf, op.offset) };
    let first = io(buf);
    let res = if first.is_err() { wk.retry(first, || io(buf)) } else { first };
    if wk.complete(op, ids, res, op.t0.elapsed()) {
        super::runner::sync_file(wk, f, op.slot, op.file);
    }
}

/// `interface: nbd`: one request at a time per thread through the shared client (its
/// connections carry the threads' requests side by side); fsync:N becomes an NBD FLUSH.
pub fn run_thread_nbd(wk: &mut Worker, c: &crate::nbd::client::Client) -> Result<()> {
    let bs = wk.sh.w.block_size as usize;
    if segment_buffers(wk.sh.w) {
        let mut h = Homes::new()?;
        while let Some((op, id, b)) = h.next(wk) {
            issue_nbd(wk, c, &op, b, &id);
        }
        return Ok(());
    }
    let mut buf = AlignedBuf::try_new(bs)?;
    let mut ids = vec![0u64; bs / CONTENT_BLOCK as usize];
    let mut held = vec![HELD_NONE; ids.len()];
    while let Some(op) = wk.next_op(&mut buf, &mut ids, &mut held) {
        issue_nbd(wk, c, &op, &mut buf, &ids);
    }
    Ok(())
}

fn issue_nbd(wk: &mut Worker, c: &crate::nbd::client::Client, op: &Op, buf: &mut [u8], ids: &[u64]) {
    // `sync: dsync` is durable at completion (the oracle counts it so): over NBD that is a FUA
    // write (or a write and a flush where the server takes no FUA)
    let fua = wk.sh.w.sync == crate::spec::workload::config::SyncMode::Dsync;
    // the request goes to the workload's region of the export (`Workload::base`); what is
    // recorded (maps, errors) stays in the workload's own offsets
    let off = op.offset + wk.sh.w.base;
    let io = |buf: &mut [u8]| if op.is_write { c.write(off, buf, fua) } else { c.read(off, buf) };
    let first = io(buf);
    let res = if first.is_err() { wk.retry(first, || io(buf)) } else { first };
    if wk.complete(op, ids, res, op.t0.elapsed()) {
        match c.flush() {
            Ok(()) => wk.synced(None),
            Err(e) => wk.fail("fsync", None, 0, 0, e.raw_os_error().unwrap_or(libc::EIO)),
        }
    }
}

/// A batch of drawn ops with their buffers and content ids, handed between the I/O thread and
/// the filler (moved, never shared). Batches amortise the hand-over: one wake per batch.
struct Batch {
    buf: AlignedBuf,
    ids: Vec<u64>,
    /// What each block of `buf` holds (`fill_held`).
    held: Vec<u32>,
    ops: Vec<Op>,
}

/// Ahead-filled bytes per batch: about 1 MiB (8 x 128 KiB), at least one op.
const BATCH_BYTES: u64 = 1 << 20;

fn run_prefilled(wk: &mut Worker, files: &[File]) -> Result<()> {
    let bs = wk.sh.w.block_size as usize;
    let per = bs / CONTENT_BLOCK as usize;
    let n = (BATCH_BYTES / bs as u64).max(1) as usize;
    let seed = wk.sh.maps.seed;
    let fill_batch = move |b: &mut Batch| {
        for (k, op) in b.ops.iter().enumerate() {
            fill_for(op, seed, &b.ids[k * per..(k + 1) * per], &mut b.buf[k * bs..(k + 1) * bs], &mut b.held[k * per..(k + 1) * per]);
        }
    };
    let draw_batch = |wk: &mut Worker, b: &mut Batch| {
        b.ops.clear();
        while b.ops.len() < n {
            let k = b.ops.len();
            match wk.draw(&mut b.ids[k * per..(k + 1) * per]) {
                Some(op) => b.ops.push(op),
                None => break,
            }
        }
    };
    let new_batch = || -> Result<Batch> {
        Ok(Batch { buf: AlignedBuf::try_new(n * bs)?, ids: vec![0; n * per], held: vec![HELD_NONE; n * per], ops: Vec::with_capacity(n) })
    };
    let (mut cur, mut spare) = (new_batch()?, Some(new_batch()?));
    let (to_filler, jobs): (SyncSender<Batch>, Receiver<Batch>) = sync_channel(1);
    let (filled_tx, filled): (SyncSender<Batch>, Receiver<Batch>) = sync_channel(1);
    std::thread::scope(|sc| {
        sc.spawn(move || {
            for mut b in jobs {
                fill_batch(&mut b);
                if filled_tx.send(b).is_err() {
                    break;
                }
            }
        });
        draw_batch(wk, &mut cur);
        fill_batch(&mut cur);
        while !cur.ops.is_empty() {
            // draw the next batch now (draws stay in op order) and let the filler write its
            // bytes while this batch's I/Os run
            let mut next = spare.take().expect("a spare batch between batches");
            draw_batch(wk, &mut next);
            let ahead = next.ops.iter().any(|o| o.is_write);
            if ahead {
                to_filler.send(next).expect("the filler thread is alive");
            } else {
                // reads only: they will land in its buffer
                forget_held(&mut next.held);
                spare = Some(next);
            }
            for (k, mut op) in std::mem::take(&mut cur.ops).into_iter().enumerate() {
                // drawn ahead: a stop or the duration may have come since
                if wk.stopping() {
                    break;
                }
                let ids = &cur.ids[k * per..(k + 1) * per];
                wk.announce(&mut op, ids);
                issue(wk, files, &op, &mut cur.buf[k * bs..(k + 1) * bs], ids);
            }
            let mut next = if ahead { filled.recv().expect("the filler thread is alive") } else { spare.take().unwrap() };
            if wk.stopping() {
                next.ops.clear();
            }
            spare = Some(std::mem::replace(&mut cur, next));
        }
        drop(to_filler);
    });
    Ok(())
}
