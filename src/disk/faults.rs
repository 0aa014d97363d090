//! The fault layer: the fault engine (`fault::Engine`) applied to each request on its way to
//! the layers below. Reads go down first and the engine edits or fails what comes back; writes
//! are planned first and go down as planned (edited, cut short, redirected, dropped or failed);
//! flush and discard go down unless a rule fails them. A delay rule's delay is added to the
//! outcome; nothing sleeps here.
//!
//! Content rules hash each block of a write. Where the layer below can (`Layer::write_locked`:
//! the RAM store) and the rules can only edit bytes or delay, the hashing happens while the
//! bytes are copied in and the edits land on the stored copy under the same locks (one pass);
//! otherwise the write is hashed, then planned, then written (two passes). Both give the same
//! stored bytes, log and delays (`one_pass_content_writes_match_two_pass`).

use super::Outcome;
use super::layer::{Layer, write_now};
use super::store::{Hashed, Lent, Src};
use crate::fault::engine::{ArmedRule, Edit, Planning, block_span, flip_position};
use crate::fault::log::{LogEntry, runs};
use crate::fault::{Action, Engine, Op, Plan, Rule, StoreMode, Target};
use anyhow::{Result, bail};
use std::cell::Cell;
use std::sync::Arc;
use std::time::Duration;

thread_local! {
    /// The held part (`hold: device`) of the delay of the outcome this thread's fault layer
    /// passed up last. It travels beside the outcome, not in it: every layer call runs on the
    /// calling thread, and only the latency layer above (`Modelled`) reads it, to book the
    /// device for it; the layers in between and the transports never see it.
    static HELD: Cell<Option<Duration>> = const { Cell::new(None) };
}

/// Take the held delay of the outcome the fault layer gave last on this thread.
pub(super) fn take_held() -> Option<Duration> {
    HELD.with(|h| h.take())
}

pub(super) fn give_held(d: Option<Duration>) {
    HELD.with(|h| h.set(d));
}

pub struct Faults<L> {
    pub engine: Engine,
    block_size: u32,
    next: L,
}

impl<L: Layer> Faults<L> {
    pub fn new(block_size: u32, next: L) -> Faults<L> {
        Faults { engine: Engine::new(block_size), block_size, next }
    }

    pub fn next(&self) -> &L {
        &self.next
    }

    fn in_range(&self, off: u64, len: u64) -> bool {
        off.checked_add(len).is_some_and(|e| e <= self.next.size())
    }

    /// Hash first (content rules), then store as planned.
    fn write_two_pass(&self, off: u64, data: &[u8], mut p: Planning) -> Outcome {
        p.match_data(data);
        let plan = p.plan;
        give_held(plan.held);
        if plan.errno.is_some() {
            return Outcome { errno: plan.errno, delay: plan.delay };
        }
        let edited;
        let bytes = if plan.edits.is_empty() {
            data
        } else {
            let mut copy = data.to_vec();
            apply_edits(&plan.edits, &mut copy);
            edited = copy;
            &edited
        };
        let o = match plan.store {
            StoreMode::Normal => write_now(&self.next, off, bytes),
            StoreMode::Skip => Outcome::OK,
            StoreMode::Prefix(n) => write_now(&self.next, off, &bytes[..n as usize]),
            // a target beyond the disk loses the write (a misdirected write off the end)
            StoreMode::Redirect(to) if self.in_range(to, bytes.len() as u64) => write_now(&self.next, to, bytes),
            StoreMode::Redirect(_) => Outcome::OK,
        };
        o.after(plan.delay)
    }

    /// A flush or discard as `plan` says: failed by a rule, or passed down.
    fn finish(&self, plan: Plan, down: impl FnOnce(&L) -> Outcome) -> Outcome {
        if plan.errno.is_some() {
            give_held(plan.held);
            return Outcome { errno: plan.errno, delay: plan.delay };
        }
        let o = down(&self.next).after(plan.delay);
        give_held(plan.held);
        o
    }

    /// Arm rules; `rot` rules corrupt the stored data now (and stay listed with their counts).
    pub fn arm(&self, rules: Vec<Rule>) -> Result<Vec<Arc<ArmedRule>>> {
        let armed = self.engine.add(rules);
        for r in &armed {
            if let Action::Rot { at } = &r.rule.action {
                self.rot(r, at)?;
            }
        }
        Ok(armed)
    }

    /// Flip one bit in every stored block the rule's target selects. Each flip is a
    /// read-modify-write under the locks of the layers below (`Layer::update`): a client write
    /// that lands meanwhile comes before or after it, never in between (which would undo the
    /// write).
    pub fn rot(&self, r: &ArmedRule, at: &crate::spec::rule::FlipAt) -> Result<()> {
        let bs = self.block_size as u64;
        let size = self.next.size();
        let mut hit = Vec::new();
        // false once the rule's `times` are used up; `want`: the content the block must still
        // have (a content target's block may have been rewritten since the scan saw it)
        let mut rot_one = |b: u64, want: Option<u128>| -> Result<bool> {
            if r.rule.times.is_some_and(|t| hit.len() as u64 >= t) {
                return Ok(false);
            }
            let (byte, bit) = flip_position(at, r.rule.seed, b, hit.len() as u64, bs);
            let flipped = self.next.update(b * bs, bs as usize, &mut |block| {
                if want.is_some_and(|h| crate::content::block_hash(block) != h) {
                    return false;
                }
                block[byte as usize] ^= 1 << bit;
                true
            })?;
            if flipped {
                hit.push(b);
            }
            Ok(true)
        };
        match r.rule.target {
            Target::Range { start, end } => {
                for b in block_span(start, end, bs) {
                    if !rot_one(b, None)? {
                        break;
                    }
                }
            }
            Target::Content { hash } => {
                // scan the whole store: rot selects data by what it is, wherever it lives
                let mut big = vec![0u8; 1 << 20];
                let mut off = 0u64;
                'scan: while off < size {
                    let n = (size - off).min(big.len() as u64) as usize;
                    if let Some(e) = self.next.read(off, &mut big[..n]).errno {
                        bail!("rot: cannot read the store at byte {off}: {}", std::io::Error::from_raw_os_error(e));
                    }
                    for (i, c) in big[..n].chunks_exact(bs as usize).enumerate() {
                        if crate::content::block_hash(c) == hash && !rot_one(off / bs + i as u64, Some(hash))? {
                            break 'scan;
                        }
                    }
                    off += n as u64;
                }
            }
            Target::Any => bail!("rot needs a target"),
        }
        let n = hit.len() as u64;
        r.matched.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        r.fired.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        r.blocks.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        for b in hit {
            self.engine.log.push(LogEntry {
                seq: 0,
                t_us: self.engine.elapsed_us(),
                rule: r.id,
                action: "rot".into(),
                op: None,
                offset: b * bs,
                len: bs,
                blocks: runs([b]),
                detail: "bit flipped at rest".into(),
            });
        }
        Ok(())
    }
}

impl<L: Layer> Layer for Faults<L> {
    fn size(&self) -> u64 {
        self.next.size()
    }

    /// Read-side corruption edits only the returned buffer; a failed read below is not planned.
    fn read(&self, off: u64, buf: &mut [u8]) -> Outcome {
        let o = self.next.read(off, buf);
        if o.errno.is_some() {
            give_held(None);
            return o;
        }
        let plan = self.engine.plan(Op::Read, off, buf.len() as u64, Some(buf));
        if plan.errno.is_none() {
            apply_edits(&plan.edits, buf);
        }
        give_held(plan.held);
        Outcome { errno: plan.errno, delay: plan.delay }.after(o.delay)
    }

    /// Write-side corruption lands in the stored copy.
    fn write<'a>(&self, off: u64, data: Src<'a>, ack: impl FnOnce(Outcome, Option<Lent<'a>>)) {
        let mut p = self.engine.begin(Op::Write, off, data.len() as u64);
        let mut ack = Some(ack);
        // No failed/dropped/redirected request so far, and content rules (if any) can only edit
        // bytes or delay: the layer below hashes each block as it copies it in (one pass; the
        // hashing hides behind the copy) and the edits land on the stored bytes under the same
        // locks.
        let data = if p.plan.errno.is_none() && p.plan.store == StoreMode::Normal && p.content_edits_only() {
            let hashed = p.wants_content().then(|| {
                let (start, blocks) = p.hashed_blocks();
                Hashed { bs: self.block_size as usize, start, blocks }
            });
            let early = p.reply_known().then_some((p.plan.delay, p.plan.held));
            // a lent buffer whose acknowledgement waits for the hashes (a content delay)
            let mut back = None;
            let r = self.next.write_locked(
                off,
                data,
                hashed,
                &mut |lent| match early {
                    Some((delay, held)) => {
                        give_held(held);
                        (ack.take().unwrap())(Outcome { errno: None, delay }, lent)
                    }
                    None => back = lent,
                },
                &mut |hashes, stored| {
                    p.match_hashes(hashes);
                    apply_edits(&p.plan.edits, stored);
                },
            );
            match r {
                Ok(()) => {
                    if let Some(ack) = ack.take() {
                        give_held(p.plan.held);
                        ack(Outcome { errno: None, delay: p.plan.delay }, back);
                    }
                    return;
                }
                Err(data) => data,
            }
        } else {
            data
        };
        let outcome = self.write_two_pass(off, data.bytes(), p);
        (ack.take().unwrap())(outcome, data.lent());
    }

    fn flush(&self) -> Outcome {
        let plan = self.engine.plan(Op::Flush, 0, 0, None);
        self.finish(plan, |next| next.flush())
    }

    fn discard(&self, off: u64, len: u64) -> Outcome {
        let plan = self.engine.plan(Op::Discard, off, len, None);
        self.finish(plan, |next| next.discard(off, len))
    }
}

fn apply_edits(edits: &[Edit], buf: &mut [u8]) {
    for e in edits {
        e.apply(buf);
    }
}
