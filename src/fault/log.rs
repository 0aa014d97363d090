//! The fault log: one entry per injection, plus exact per-rule counters kept by the engine.
//! The entry list is capped (counters never are) so a persistent rule cannot exhaust memory.

use super::rule::{Op, RuleId};
use serde::Serialize;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

pub const DEFAULT_LOG_CAP: usize = 1_000_000;

#[derive(Clone, Debug, Serialize)]
pub struct LogEntry {
    pub seq: u64,
    /// Microseconds since the disk started.
    pub t_us: u64,
    pub rule: RuleId,
    pub action: &'static str,
    pub op: Option<Op>,
    /// The request (device bytes) the fault was injected into; for `rot`, the block.
    pub offset: u64,
    pub len: u64,
    /// Affected device blocks as runs of [first block, count].
    pub blocks: Vec<[u64; 2]>,
    /// Action-specific detail (errno, delay, bit position, ...).
    pub detail: String,
}

impl LogEntry {
    pub fn block_count(&self) -> u64 {
        self.blocks.iter().map(|r| r[1]).sum()
    }
}

pub struct FaultLog {
    entries: Mutex<Vec<LogEntry>>,
    next_seq: AtomicU64,
    dropped: AtomicU64,
    cap: usize,
}

impl FaultLog {
    pub fn new(cap: usize) -> Self {
        FaultLog { entries: Mutex::new(Vec::new()), next_seq: AtomicU64::new(0), dropped: AtomicU64::new(0), cap }
    }

    pub fn push(&self, mut e: LogEntry) {
        let mut v = self.entries.lock().unwrap();
        e.seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        if v.len() < self.cap {
            v.push(e);
        } else {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Entries with seq >= since, at most `max`.
    pub fn since(&self, since: u64, max: usize) -> Vec<LogEntry> {
        let v = self.entries.lock().unwrap();
        let start = v.partition_point(|e| e.seq < since);
        v[start..].iter().take(max).cloned().collect()
    }

    pub fn total(&self) -> u64 {
        self.next_seq.load(Ordering::Relaxed)
    }

    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// Compress a sorted list of block numbers into [first, count] runs.
pub fn runs(blocks: impl IntoIterator<Item = u64>) -> Vec<[u64; 2]> {
    let mut out: Vec<[u64; 2]> = Vec::new();
    for b in blocks {
        match out.last_mut() {
            Some(r) if r[0] + r[1] == b => r[1] += 1,
            _ => out.push([b, 1]),
        }
    }
    out
}
