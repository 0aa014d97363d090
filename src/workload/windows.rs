//! Per-window statistics for `baseline: windows` (spec::windows): each thread sorts its
//! completed ops into the window whose measured span holds the op from start to end, per
//! slot (reads, writes, a personality's flowop kinds); the run merges the threads and keeps
//! the windows that ended before the run did.

use super::stats::{FlowopSummary, LatencySummary, cdf};
use crate::spec::windows::WindowPlan;
use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// Slot of reads and of writes; a personality's flowop kind `i` is slot `FLOWOPS + i`.
pub const READ: usize = 0;
pub const WRITE: usize = 1;
pub const FLOWOPS: usize = 2;

/// One window of a run: the ops wholly inside its measured span (`results.json`:
/// `repetitions[].windows[]`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct WindowSummary {
    /// Window number from 0, in the workload's time.
    pub index: u32,
    /// The setup's faults were armed in it.
    pub armed: bool,
    /// Its pair (windows 2j and 2j+1 are pair j).
    pub pair: u32,
    /// The measured span (after the settle), seconds since the workload started.
    pub from_s: f64,
    pub to_s: f64,
    pub read: LatencySummary,
    pub write: LatencySummary,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub flowops: BTreeMap<String, FlowopSummary>,
}

/// One slot of one window: latencies (2 significant digits, 1 ns to 100 s: 32 KiB, where a
/// whole-run histogram takes 270 KiB, and a thread may hold a dozen slots per window), the
/// exact sum for the mean, and bytes.
struct Acc {
    h: Histogram<u64>,
    sum_ns: u128,
    bytes: u64,
}

impl Acc {
    fn new() -> Acc {
        Acc { h: Histogram::new_with_bounds(1, 100_000_000_000, 2).expect("valid bounds"), sum_ns: 0, bytes: 0 }
    }
    fn mean_us(&self) -> f64 {
        if self.h.is_empty() { 0.0 } else { self.sum_ns as f64 / self.h.len() as f64 / 1000.0 }
    }
}

/// A thread's (then the run's) ops by window and slot.
pub struct WindowAcc {
    plan: WindowPlan,
    slots: usize,
    /// Per window: its slots, made at the window's first op.
    per: Vec<Option<Vec<Acc>>>,
}

impl WindowAcc {
    /// None without a plan: nothing is recorded.
    pub fn new(plan: Option<WindowPlan>, slots: usize) -> Option<WindowAcc> {
        plan.map(|plan| WindowAcc { plan, slots, per: Vec::new() })
    }

    /// An op of `slot` that started `start` after the workload did and took `lat`.
    pub fn record(&mut self, slot: usize, start: Duration, lat: Duration, bytes: u64) {
        let s = start.as_nanos() as u64;
        let Some(k) = self.plan.window_of(s, s + lat.as_nanos() as u64) else { return };
        let k = k as usize;
        if self.per.len() <= k {
            self.per.resize_with(k + 1, || None);
        }
        let slots = self.slots;
        let a = &mut self.per[k].get_or_insert_with(|| (0..slots).map(|_| Acc::new()).collect())[slot];
        let ns = lat.as_nanos() as u64;
        a.h.saturating_record(ns.max(1));
        a.sum_ns += ns as u128;
        a.bytes += bytes;
    }

    pub fn merge(&mut self, other: WindowAcc) {
        if self.per.len() < other.per.len() {
            self.per.resize_with(other.per.len(), || None);
        }
        for (k, o) in other.per.into_iter().enumerate() {
            let Some(o) = o else { continue };
            match &mut self.per[k] {
                Some(mine) => {
                    for (a, b) in mine.iter_mut().zip(o) {
                        a.h.add(&b.h).expect("same bounds");
                        a.sum_ns += b.sum_ns;
                        a.bytes += b.bytes;
                    }
                }
                slot @ None => *slot = Some(o),
            }
        }
    }

    /// The windows wholly inside a run of `secs` seconds and inside its `duration` (the run
    /// armed faults in no window beyond it, however long its last ops took), in order (a
    /// window without ops too); `flowops` names the flowop slots to report (slot, name).
    pub fn summaries(&self, secs: f64, duration: Option<Duration>, flowops: &[(usize, &str)]) -> Vec<WindowSummary> {
        let p = self.plan;
        let n = p.count(Duration::from_secs_f64(secs.max(0.0))).min(duration.map_or(u32::MAX, |d| p.count(d)));
        let measured = (p.length - p.settle).as_secs_f64();
        let empty = Acc::new();
        (0..n)
            .map(|k| {
                let slots = self.per.get(k as usize).and_then(|s| s.as_ref());
                let get = |slot: usize| slots.map_or(&empty, |s| &s[slot]);
                let op = |slot: usize| {
                    let a = get(slot);
                    let mut s = super::stats::summary(&a.h, a.bytes, measured);
                    s.mean_us = a.mean_us();
                    s
                };
                let mut fl = BTreeMap::new();
                for &(slot, name) in flowops {
                    let a = get(slot);
                    if a.h.is_empty() {
                        continue;
                    }
                    let us = |v: u64| v as f64 / 1000.0;
                    fl.insert(
                        name.to_string(),
                        FlowopSummary {
                            ops: a.h.len(),
                            bytes: a.bytes,
                            ops_s: a.h.len() as f64 / measured,
                            mean_us: a.mean_us(),
                            p50_us: us(a.h.value_at_quantile(0.5)),
                            p95_us: us(a.h.value_at_quantile(0.95)),
                            p99_us: us(a.h.value_at_quantile(0.99)),
                            max_us: us(a.h.max()),
                            cdf: cdf(&a.h),
                        },
                    );
                }
                let from = p.start(k) + p.settle;
                WindowSummary {
                    index: k,
                    armed: WindowPlan::armed(k),
                    pair: k / 2,
                    from_s: from.as_secs_f64(),
                    to_s: p.start(k + 1).as_secs_f64(),
                    read: op(READ),
                    write: op(WRITE),
                    flowops: fl,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// By hand: 100 ms windows, 20 ms settle, no warm-up. Window 0 measures [20, 100) ms,
    /// window 1 [120, 200). Ops: a read at 30 ms of 10 µs and one at 50 ms of 30 µs (window 0:
    /// mean 20 µs); a read at 10 ms (settle: dropped); a read from 99.99 ms for 20 µs (ends in
    /// window 1: dropped); a write at 150 ms of 5 µs (window 1). The run lasted 250 ms: window
    /// 2 is not whole and is left out.
    #[test]
    fn ops_are_sorted_into_windows_by_hand() {
        let plan = WindowPlan { length: Duration::from_millis(100), settle: Duration::from_millis(20), warmup: Duration::ZERO };
        let (ms, us) = (Duration::from_millis, Duration::from_micros);
        let mut a = WindowAcc::new(Some(plan), FLOWOPS).unwrap();
        let mut b = WindowAcc::new(Some(plan), FLOWOPS).unwrap();
        a.record(READ, ms(30), us(10), 4096);
        b.record(READ, ms(50), us(30), 4096);
        a.record(READ, ms(10), us(10), 4096);
        a.record(READ, us(99_990), us(20), 4096);
        b.record(WRITE, ms(150), us(5), 8192);
        b.record(WRITE, ms(230), us(5), 8192);
        a.merge(b);
        let w = a.summaries(0.25, None, &[]);
        assert_eq!(a.summaries(0.25, Some(Duration::from_millis(150)), &[]).len(), 1, "no window beyond the duration");
        assert_eq!(w.len(), 2);
        assert_eq!((w[0].index, w[0].armed, w[0].pair), (0, false, 0));
        assert_eq!((w[1].index, w[1].armed, w[1].pair), (1, true, 0));
        assert_eq!((w[0].read.ops, w[0].write.ops, w[1].read.ops, w[1].write.ops), (2, 0, 0, 1));
        assert!((w[0].read.mean_us - 20.0).abs() < 1e-9, "{}", w[0].read.mean_us);
        assert!((w[0].from_s - 0.02).abs() < 1e-12 && (w[0].to_s - 0.1).abs() < 1e-12);
        // 2 reads over the 80 ms measured
        assert!((w[0].read.iops - 25.0).abs() < 1e-9);
        assert_eq!(w[1].write.bytes, 8192);
        assert!(WindowAcc::new(None, 2).is_none());
    }
}
