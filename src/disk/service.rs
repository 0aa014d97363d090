//! The disk's own service-time counters per op (docs/monitor.md, "the daemon's figures"): how
//! many requests, and the time from a request reaching the disk to when its reply is due
//! (the store's work plus the delay the reply is held for: delay rules and the latency
//! model), with that held delay also summed alone. A few relaxed atomics per request; read
//! through the control socket's `stats` (`service`), so a monitor's device-layer mean can be
//! checked against the daemon's.

use super::Outcome;
use super::layer::Layer;
use super::store::{Lent, Src};
use crate::fault::Op;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

#[derive(Default)]
struct OpCounters {
    count: AtomicU64,
    service_ns: AtomicU64,
    delay_ns: AtomicU64,
}

/// Per-op counters since the disk started (never reset: callers take differences).
#[derive(Default)]
pub struct ServiceCounters {
    ops: [OpCounters; 4],
}

/// One op's figures.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct OpService {
    pub count: u64,
    /// Sum of service times (work plus held delay), ns.
    pub service_ns: u64,
    /// Sum of the delays replies were held for, ns.
    pub delay_ns: u64,
    pub mean_us: f64,
}

impl ServiceCounters {
    /// One request: `work` the time the disk took to decide and store, `held` the delay its
    /// reply is held for.
    pub fn record(&self, op: Op, work: Duration, held: Option<Duration>) {
        let c = &self.ops[op as usize];
        let held = held.unwrap_or_default().as_nanos() as u64;
        c.count.fetch_add(1, Relaxed);
        c.service_ns.fetch_add(work.as_nanos() as u64 + held, Relaxed);
        if held > 0 {
            c.delay_ns.fetch_add(held, Relaxed);
        }
    }

    /// Ops that saw requests, by name.
    pub fn snapshot(&self) -> BTreeMap<String, OpService> {
        Op::ALL
            .iter()
            .filter_map(|op| {
                let c = &self.ops[*op as usize];
                let count = c.count.load(Relaxed);
                let service_ns = c.service_ns.load(Relaxed);
                (count > 0).then(|| {
                    (
                        op.name().to_string(),
                        OpService { count, service_ns, delay_ns: c.delay_ns.load(Relaxed), mean_us: service_ns as f64 / count as f64 / 1000.0 },
                    )
                })
            })
            .collect()
    }
}

/// The counters as the top layer: each request is counted once it is answered, with the time
/// from reaching the disk to its acknowledgement and the delay its reply is held for.
pub struct Counted<L> {
    counters: ServiceCounters,
    next: L,
}

impl<L: Layer> Counted<L> {
    pub fn new(next: L) -> Counted<L> {
        Counted { counters: ServiceCounters::default(), next }
    }
    pub fn counters(&self) -> &ServiceCounters {
        &self.counters
    }
    pub fn next(&self) -> &L {
        &self.next
    }
    fn timed(&self, op: Op, request: impl FnOnce() -> Outcome) -> Outcome {
        let t0 = Instant::now();
        let o = request();
        self.counters.record(op, t0.elapsed(), o.delay);
        o
    }
}

impl<L: Layer> Layer for Counted<L> {
    fn size(&self) -> u64 {
        self.next.size()
    }
    fn read(&self, off: u64, buf: &mut [u8]) -> Outcome {
        self.timed(Op::Read, || self.next.read(off, buf))
    }
    fn write<'a>(&self, off: u64, data: Src<'a>, ack: impl FnOnce(Outcome, Option<Lent<'a>>)) {
        let t0 = Instant::now();
        self.next.write(off, data, move |o, lent| {
            self.counters.record(Op::Write, t0.elapsed(), o.delay);
            ack(o, lent)
        })
    }
    fn flush(&self) -> Outcome {
        self.timed(Op::Flush, || self.next.flush())
    }
    fn discard(&self, off: u64, len: u64) -> Outcome {
        self.timed(Op::Discard, || self.next.discard(off, len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_work_and_held_delay_per_op() {
        let s = ServiceCounters::default();
        s.record(Op::Write, Duration::from_micros(10), Some(Duration::from_micros(200)));
        s.record(Op::Write, Duration::from_micros(30), None);
        s.record(Op::Read, Duration::from_micros(5), None);
        let m = s.snapshot();
        let w = &m["write"];
        assert_eq!((w.count, w.service_ns, w.delay_ns), (2, 240_000, 200_000));
        assert!((w.mean_us - 120.0).abs() < 1e-9);
        assert_eq!(m["read"].count, 1);
        assert!(!m.contains_key("flush"));
    }
}
