//! The latency model applied (`spec::latency` holds the model; docs/latency.md): at a request's
//! arrival the disk samples its service time and, with `channels: N`, books it on the channel
//! that frees first. The reply is due at max(arrival, channel free) + service. Nothing sleeps:
//! the disk returns the time left as the outcome's delay and the front end's late-reply
//! machinery sends it, so a modelled request never holds up another. The model is not a fault:
//! it is not in the fault log; its figures are in `stats`.

use super::Outcome;
use super::layer::Layer;
use super::store::{Lent, Src};
use crate::fault::Op;
use crate::spec::latency::{LatencyModel, OpLatency, ServiceDist, empirical_at};
use hdrhistogram::Histogram;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// N channels as the times (since the model's start) at which each is next free. A request
/// takes the channel that frees first: requests start in arrival order (FIFO), each as soon as
/// any channel is free, which is a virtual-time M/G/N queue with no thread per channel.
#[derive(Debug, Clone)]
pub struct Channels {
    free: Vec<Duration>,
}

impl Channels {
    pub fn new(n: u32) -> Channels {
        Channels { free: vec![Duration::ZERO; n.max(1) as usize] }
    }

    /// Book `service` for a request arriving at `arrival`; returns when its service starts.
    pub fn book(&mut self, arrival: Duration, service: Duration) -> Duration {
        let (i, f) = self.free.iter().copied().enumerate().min_by_key(|&(_, f)| f).expect("at least one channel");
        let start = arrival.max(f);
        self.free[i] = start + service;
        start
    }
}

struct OpHists {
    service: Histogram<u64>,
    wait: Histogram<u64>,
}

fn hist() -> Histogram<u64> {
    // 1 ns .. 1 h at 3 significant digits
    Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid bounds")
}

pub struct Latency {
    model: LatencyModel,
    t0: Instant,
    n: AtomicU64,
    channels: Option<Mutex<Channels>>,
    hists: [Mutex<OpHists>; 4],
}

/// Service and channel-wait times of one op (µs), as `fault stats` and results show them.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct TimeSummary {
    pub mean_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct OpModelStats {
    pub count: u64,
    /// The sampled service time (the device's own time, size term included).
    pub service: TimeSummary,
    /// How long requests waited for a channel (zero without `channels`).
    pub wait: TimeSummary,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct LatencyStats {
    pub channels: Option<u32>,
    /// Per op that has a model and saw requests.
    pub ops: BTreeMap<String, OpModelStats>,
}

impl Latency {
    pub fn new(model: LatencyModel) -> Latency {
        let channels = model.channels.map(|n| Mutex::new(Channels::new(n)));
        Latency {
            model,
            t0: Instant::now(),
            n: AtomicU64::new(0),
            channels,
            hists: std::array::from_fn(|_| Mutex::new(OpHists { service: hist(), wait: hist() })),
        }
    }

    pub fn model(&self) -> &LatencyModel {
        &self.model
    }

    /// When the reply to a request of `len` bytes arriving at `arrival` is due; `None` for an
    /// op the model leaves alone.
    pub fn admit(&self, op: Op, len: u64, arrival: Instant) -> Option<Instant> {
        let m = self.model.op(op)?;
        let n = self.n.fetch_add(1, Ordering::Relaxed);
        let service = sample(m, len, self.model.seed, n);
        let wait = match &self.channels {
            None => Duration::ZERO,
            Some(c) => {
                let at = arrival.saturating_duration_since(self.t0);
                c.lock().unwrap().book(at, service) - at
            }
        };
        let mut h = self.hists[op as usize].lock().unwrap();
        // hdrhistogram refuses 0 with a lower bound of 1: count zeros as 1 ns
        let _ = h.service.record((service.as_nanos() as u64).max(1));
        let _ = h.wait.record((wait.as_nanos() as u64).max(1));
        drop(h);
        Some(arrival + wait + service)
    }

    pub fn stats(&self) -> LatencyStats {
        let mut ops = BTreeMap::new();
        for op in Op::ALL {
            let h = self.hists[op as usize].lock().unwrap();
            if h.service.is_empty() {
                continue;
            }
            let t = |x: &Histogram<u64>| TimeSummary {
                mean_us: round3(x.mean() / 1e3),
                p50_us: round3(x.value_at_quantile(0.5) as f64 / 1e3),
                p99_us: round3(x.value_at_quantile(0.99) as f64 / 1e3),
            };
            ops.insert(op.name().to_string(), OpModelStats { count: h.service.len(), service: t(&h.service), wait: t(&h.wait) });
        }
        LatencyStats { channels: self.model.channels, ops }
    }

    /// Forget the figures so far (a new repetition's epoch); channels keep their bookings.
    pub fn reset(&self) {
        for h in &self.hists {
            let mut h = h.lock().unwrap();
            h.service.reset();
            h.wait.reset();
        }
    }
}

/// The latency model as a layer: every request the device gets is admitted on arrival (also one
/// a fault below fails or drops: the device spent its time on it), goes down, and its reply is
/// due at the model's time, plus whatever delay came from below (a delay rule).
pub struct Modelled<L> {
    model: Option<Latency>,
    next: L,
}

impl<L: Layer> Modelled<L> {
    /// `model: None`: requests pass straight through.
    pub fn new(model: Option<Latency>, next: L) -> Modelled<L> {
        Modelled { model, next }
    }
    pub fn model(&self) -> Option<&Latency> {
        self.model.as_ref()
    }
    pub fn next(&self) -> &L {
        &self.next
    }
    /// When the model wants this request answered (measured from now, its arrival).
    fn admit(&self, op: Op, len: u64) -> Option<Instant> {
        self.model.as_ref().and_then(|l| l.admit(op, len, Instant::now()))
    }
}

impl<L: Layer> Layer for Modelled<L> {
    fn size(&self) -> u64 {
        self.next.size()
    }
    fn read(&self, off: u64, buf: &mut [u8]) -> Outcome {
        let due = self.admit(Op::Read, buf.len() as u64);
        self.next.read(off, buf).due(due)
    }
    fn write<'a>(&self, off: u64, data: Src<'a>, ack: impl FnOnce(Outcome, Option<Lent<'a>>)) {
        let due = self.admit(Op::Write, data.len() as u64);
        self.next.write(off, data, move |o, lent| ack(o.due(due), lent))
    }
    fn flush(&self) -> Outcome {
        let due = self.admit(Op::Flush, 0);
        self.next.flush().due(due)
    }
    fn discard(&self, off: u64, len: u64) -> Outcome {
        let due = self.admit(Op::Discard, len);
        self.next.discard(off, len).due(due)
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// One request's service time: the base drawn from (seed, n), plus the size term.
pub fn sample(m: &OpLatency, len: u64, seed: u64, n: u64) -> Duration {
    let base = match &m.base {
        ServiceDist::Dist(d) => crate::fault::engine::sample_delay(d, seed, n),
        ServiceDist::Empirical(points) | ServiceDist::Histogram { points, .. } => {
            let mut rng = rand::rngs::SmallRng::seed_from_u64(seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            empirical_at(points, rng.random::<f64>())
        }
    };
    base + m.per_kib.mul_f64(len as f64 / 1024.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::latency::parse_latency;

    #[test]
    fn channels_hand_computed() {
        // 2 channels, service 10 each; arrivals at 0, 1, 2, 3, 25 (µs)
        // r0: ch A 0..10; r1: ch B 1..11; r2: waits for A, 10..20; r3: waits for B, 11..21;
        // r4: arrives after both are free, 25..35
        let us = Duration::from_micros;
        let mut c = Channels::new(2);
        let starts: Vec<Duration> = [0, 1, 2, 3, 25].iter().map(|&a| c.book(us(a), us(10))).collect();
        assert_eq!(starts, vec![us(0), us(1), us(10), us(11), us(25)]);
        // one channel: strictly one after another, FIFO
        let mut c = Channels::new(1);
        let starts: Vec<Duration> = [(0, 5), (0, 7), (1, 2), (30, 1)].iter().map(|&(a, s)| c.book(us(a), us(s))).collect();
        assert_eq!(starts, vec![us(0), us(5), us(12), us(30)]);
    }

    #[test]
    fn size_term_and_empirical_sampling() {
        let m = parse_latency(
            "read: {distribution: fixed, mean: 10us, per_kib: 1us}\nwrite: {distribution: empirical, percentiles: {p0: 10us, p100: 20us}}\n",
            "t",
        )
        .unwrap();
        let r = m.op(Op::Read).unwrap();
        assert_eq!(sample(r, 4096, 0, 0), Duration::from_micros(14));
        assert_eq!(sample(r, 128 << 10, 0, 1), Duration::from_micros(138));
        // uniform between 10 and 20 µs: the sample mean is near 15
        let w = m.op(Op::Write).unwrap();
        let mean = (0..20_000).map(|n| sample(w, 4096, 3, n).as_secs_f64()).sum::<f64>() / 20_000.0;
        assert!((mean * 1e6 - 15.0).abs() < 0.2, "{mean}");
    }

    #[test]
    fn admit_books_channels_and_counts() {
        let m = parse_latency("read: 100us\nchannels: 1\n", "t").unwrap();
        let l = Latency::new(m);
        let t = Instant::now();
        let d: Vec<Instant> = (0..3).map(|_| l.admit(Op::Read, 4096, t).unwrap()).collect();
        assert_eq!(d[1] - d[0], Duration::from_micros(100));
        assert_eq!(d[2] - d[1], Duration::from_micros(100));
        assert!(l.admit(Op::Write, 4096, t).is_none());
        let s = l.stats();
        assert_eq!(s.ops["read"].count, 3);
        assert!((s.ops["read"].service.p50_us - 100.0).abs() < 0.2);
        assert!(s.ops["read"].wait.mean_us > 50.0, "{:?}", s.ops["read"]);
    }
}
