//! The volatile write cache (`disk: {write_cache: volatile}`, `serve --write-cache volatile`):
//! the layer between the faults and the store that remembers what a power cut can still take
//! away, and the power switch itself. docs/crash.md is the reference for the models.
//!
//! SKELETON (issue #37): the API the rest of the tree codes against. The layer passes every
//! request through and `power_cut` refuses, until the cache itself is built.

use super::Outcome;
use super::layer::Layer;
use super::store::{Hashed, Lent, Src};
use serde::{Deserialize, Serialize};
use std::io;

/// Whether the disk has a volatile write cache (`write_cache`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum CacheMode {
    /// every acknowledged write is durable (no cache; today's behaviour, costs nothing)
    #[default]
    None,
    /// writes are durable once a flush (or FUA) after them completes; a power cut loses
    /// what the survival model says
    Volatile,
}
crate::spec::disk::keyword!(CacheMode, "write_cache", ["none", "volatile"]);

/// What survives of the unflushed writes when the power is cut (docs/crash.md, each with the
/// tool whose behaviour it matches).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SurvivalModel {
    /// none of them (LazyFS `clear-cache`, Jepsen's `lose-unfsynced-writes!`)
    LoseAll,
    /// a prefix in completion order (dm-log-writes + replay-log to an entry)
    KeepPrefix,
    /// any subset (CrashMonkey's random subsets of the last epoch)
    RandomSubset,
    /// each write keeps some of its 512 B sectors (CrashMonkey per sector, LazyFS torn-op)
    Torn,
    /// a later write survives an earlier one that is lost (a cache writing back out of order)
    Reorder,
}
crate::spec::disk::keyword!(SurvivalModel, "survival model", ["lose-all", "keep-prefix", "random-subset", "torn", "reorder"]);

/// What a power cut did (reply to `power_cut`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CutReport {
    pub model: Option<SurvivalModel>,
    pub seed: u64,
    /// Flushes completed before the cut (the epoch number the cut ended).
    pub epoch: u64,
    /// Writes (and discards) acknowledged since the last completed flush.
    pub unflushed: u64,
    /// Of those, kept whole, lost whole, and torn (some sectors kept).
    pub kept: u64,
    pub lost: u64,
    pub torn: u64,
    /// Bytes of the unflushed writes kept and lost.
    pub kept_bytes: u64,
    pub lost_bytes: u64,
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
}

/// The cache layer over `next`.
pub struct WriteCache<L> {
    next: L,
    mode: CacheMode,
    /// The write log of `faultline crash explore` (disk::record), fed at each completion.
    record: super::record::Slot,
}

impl<L: Layer> WriteCache<L> {
    pub fn new(mode: CacheMode, _limit: u64, next: L) -> WriteCache<L> {
        WriteCache { next, mode, record: Default::default() }
    }
    pub fn mode(&self) -> CacheMode {
        self.mode
    }
    /// The write recorder's slot (`record`, `mark` requests).
    pub fn recorder(&self) -> &super::record::Slot {
        &self.record
    }
    /// Cut the power: apply `model` (seeded) to the unflushed writes, then fail every request
    /// until `power_on`.
    pub fn power_cut(&self, model: SurvivalModel, seed: u64) -> anyhow::Result<CutReport> {
        let _ = (model, seed);
        anyhow::bail!("power cuts are not built yet (issue #37)")
    }
    /// Power on: requests are served again. Err if the power is on.
    pub fn power_on(&self) -> anyhow::Result<()> {
        anyhow::bail!("the power is on")
    }
    pub fn stats(&self) -> CacheStats {
        CacheStats { mode: Some(self.mode), powered: true, ..Default::default() }
    }
}

impl<L: Layer> Layer for WriteCache<L> {
    fn size(&self) -> u64 {
        self.next.size()
    }
    fn read(&self, off: u64, buf: &mut [u8]) -> Outcome {
        self.next.read(off, buf)
    }
    fn write<'a>(&self, off: u64, data: Src<'a>, ack: impl FnOnce(Outcome, Option<Lent<'a>>)) {
        // recording: the write is logged as it completes, before the client hears of it
        match self.record.get() {
            None => self.next.write(off, data, ack),
            Some(r) => {
                let copy = data.bytes().to_vec();
                self.next.write(off, data, move |o, lent| {
                    if o.errno.is_none() {
                        r.write(off, &copy);
                    }
                    ack(o, lent)
                })
            }
        }
    }
    fn flush(&self) -> Outcome {
        let o = self.next.flush();
        if o.errno.is_none()
            && let Some(r) = self.record.get()
        {
            r.flush();
        }
        o
    }
    fn discard(&self, off: u64, len: u64) -> Outcome {
        let o = self.next.discard(off, len);
        if o.errno.is_none()
            && let Some(r) = self.record.get()
        {
            r.discard(off, len);
        }
        o
    }
    fn write_locked<'a>(
        &self,
        off: u64,
        data: Src<'a>,
        hashed: Option<Hashed>,
        locked: &mut dyn FnMut(Option<Lent<'a>>),
        edit: &mut dyn FnMut(&[u128], &mut [u8]),
    ) -> Result<(), Src<'a>> {
        // the early acknowledgement would come before the log has the write: refused while
        // recording, so the write takes `write` above
        if self.record.get().is_some() {
            return Err(data);
        }
        self.next.write_locked(off, data, hashed, locked, edit)
    }
    fn update(&self, off: u64, len: usize, f: &mut dyn FnMut(&mut [u8]) -> bool) -> io::Result<bool> {
        self.next.update(off, len, f)
    }
}
