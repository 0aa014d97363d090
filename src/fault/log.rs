//! The fault log: one entry per injection, plus exact per-rule counters kept by the engine.
//! The entry list is capped (counters never are) so a persistent rule cannot exhaust memory.

use crate::spec::rule::{Op, RuleId};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

pub const DEFAULT_LOG_CAP: usize = 1_000_000;

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LogEntry {
    pub seq: u64,
    /// Microseconds since the disk started.
    pub t_us: u64,
    pub rule: RuleId,
    pub action: Cow<'static, str>,
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

/// How late delayed replies actually went out (front end measured), in whole µs; the last
/// bucket collects everything >= 1 ms late.
pub struct Lateness {
    buckets: Vec<AtomicU64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LatenessSummary {
    pub count: u64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub max_us_capped: u64,
}

impl Lateness {
    fn new() -> Self {
        Lateness { buckets: (0..1001).map(|_| AtomicU64::new(0)).collect() }
    }
    pub fn record(&self, late: std::time::Duration) {
        let us = (late.as_micros() as usize).min(1000);
        self.buckets[us].fetch_add(1, Ordering::Relaxed);
    }
    pub fn summary(&self) -> LatenessSummary {
        let c: Vec<u64> = self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).collect();
        let count: u64 = c.iter().sum();
        let q = |f: f64| {
            let want = ((count as f64) * f).ceil().max(1.0) as u64;
            let mut acc = 0;
            c.iter()
                .position(|n| {
                    acc += n;
                    acc >= want
                })
                .unwrap_or(0) as u64
        };
        LatenessSummary { count, p50_us: q(0.5), p99_us: q(0.99), max_us_capped: c.iter().rposition(|n| *n > 0).unwrap_or(0) as u64 }
    }
}

pub struct FaultLog {
    pub delay_lateness: Lateness,
    entries: Mutex<Vec<LogEntry>>,
    next_seq: AtomicU64,
    dropped: AtomicU64,
    cap: usize,
}

impl FaultLog {
    pub fn new(cap: usize) -> Self {
        FaultLog { delay_lateness: Lateness::new(), entries: Mutex::new(Vec::new()), next_seq: AtomicU64::new(0), dropped: AtomicU64::new(0), cap }
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
