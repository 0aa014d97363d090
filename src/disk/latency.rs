//! The latency model applied (`spec::latency` holds the model; docs/latency.md): at a request's
//! arrival the disk samples its service time and, with `channels: N`, books it on the channel
//! that frees first. The reply is due at max(arrival, channel free) + service. Nothing sleeps:
//! the disk returns the time left as the outcome's delay and the front end's late-reply
//! machinery sends it, so no thread is held: requests wait for each other only in virtual time,
//! on the channels, and a held delay (`hold: device`) books its channel for the delay too. The
//! model is not a fault: it is not in the fault log; its figures are in `stats`.

use super::Outcome;
use super::layer::Layer;
use super::store::{Lent, Src};
use crate::fault::Op;
use crate::spec::latency::{LatencyModel, OpLatency, ServiceDist, empirical_at};
use hdrhistogram::Histogram;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// N channels as the times (since the model's start) at which each is next free. A request
/// takes the channel that frees first: requests start in arrival order (FIFO), each as soon as
/// any channel is free, which is a virtual-time M/G/N queue with no thread per channel.
///
/// With a depth the device admits at most `slots` requests (in service or queued in it); one
/// arriving beyond that is admitted when the earliest of them finishes. In FIFO order that never
/// moves a start (a request starts only once all before it have started, and then fewer than
/// `channels` are in the device): the depth only says how much of a wait a real device would
/// have left outside itself, in the kernel's queue (`Booking::admitted`, docs/latency.md).
#[derive(Debug, Clone)]
pub struct Channels {
    free: Vec<Duration>,
    /// With a depth: the limit, and the finish times of the admitted requests (earliest first).
    slots: Option<(usize, BinaryHeap<Reverse<Duration>>)>,
}

/// Where one request's time went: admitted by the device at `admitted` (its arrival, or later
/// when the device was full), its service started at `start`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Booking {
    pub admitted: Duration,
    pub start: Duration,
}

impl Channels {
    pub fn new(n: u32) -> Channels {
        Channels { free: vec![Duration::ZERO; n.max(1) as usize], slots: None }
    }

    /// `n` channels admitting `depth` requests each.
    pub fn with_depth(n: u32, depth: Option<u32>) -> Channels {
        let mut c = Channels::new(n);
        c.slots = depth.map(|d| (c.free.len() * d.max(1) as usize, BinaryHeap::new()));
        c
    }

    /// Book a channel for `busy` (the service time, plus a held delay) for a request arriving at
    /// `arrival`.
    pub fn book(&mut self, arrival: Duration, busy: Duration) -> Booking {
        let admitted = match &mut self.slots {
            None => arrival,
            Some((limit, done)) => {
                while done.peek().is_some_and(|Reverse(f)| *f <= arrival) {
                    done.pop();
                }
                if done.len() >= *limit { done.pop().map_or(arrival, |Reverse(f)| f.max(arrival)) } else { arrival }
            }
        };
        let (i, f) = self.free.iter().copied().enumerate().min_by_key(|&(_, f)| f).expect("at least one channel");
        let start = admitted.max(f);
        self.free[i] = start + busy;
        if let Some((_, done)) = &mut self.slots {
            done.push(Reverse(start + busy));
        }
        Booking { admitted, start }
    }
}

/// The channel a held delay occupies on a disk whose model sets no `channels` (or that has no
/// model): one, which only held delays occupy; every request waits while it is held, none
/// other occupies it (their service, if modelled, is unlimited). As the published injector: a
/// `udelay()` busy-waits the one CPU that serves the RAM disk, so what comes behind it waits,
/// and the RAM disk's own work is not queued. Lock-free: the time (ns since `t0`) it is next
/// free; one load per request, one update per held request.
struct HoldChannel {
    t0: Instant,
    free_ns: AtomicU64,
}

impl HoldChannel {
    /// When a request arriving at `arrival` may start, having booked `held` (zero: it occupies
    /// nothing, it only waits).
    fn book(&self, arrival: Instant, held: Duration) -> Instant {
        let at = arrival.saturating_duration_since(self.t0).as_nanos() as u64;
        if held.is_zero() {
            let f = self.free_ns.load(Ordering::Acquire);
            return self.t0 + Duration::from_nanos(f.max(at));
        }
        let h = held.as_nanos() as u64;
        let prev = self.free_ns.fetch_update(Ordering::AcqRel, Ordering::Acquire, |f| Some(f.max(at) + h)).expect("always Some");
        self.t0 + Duration::from_nanos(prev.max(at))
    }
}

/// What held delays did (`fault stats`' `held`): requests that held the device, for how long in
/// all, and the requests that waited behind a hold and how long in all.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct HoldStats {
    /// `model` (the model's channels) or `implicit` (one channel only held delays occupy).
    pub channels: String,
    pub held: u64,
    pub held_us: f64,
    /// Requests that waited for the implicit channel (with the model's channels, waiting is
    /// in `latency_model`'s `wait`).
    pub waited: u64,
    pub waited_us: f64,
}

#[derive(Default)]
struct HoldCounters {
    held: AtomicU64,
    held_ns: AtomicU64,
    waited: AtomicU64,
    waited_ns: AtomicU64,
}

struct OpHists {
    service: Histogram<u64>,
    wait: Histogram<u64>,
    /// With a depth: how long requests waited to be admitted (part of `wait`).
    outside: Histogram<u64>,
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
    /// With `depth`: the part of `wait` before the device admitted the request (it arrived
    /// with `channels` x `depth` requests in the device): what a real device leaves waiting in
    /// the kernel's queue. `beyond_depth` counts those requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outside: Option<TimeSummary>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub beyond_depth: Option<u64>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct LatencyStats {
    pub channels: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub depth: Option<u32>,
    /// Per op that has a model and saw requests.
    pub ops: BTreeMap<String, OpModelStats>,
}

/// A request as the model saw it arrive: its op, arrival, and sampled service time (`None`:
/// an op the model leaves alone).
#[derive(Debug, Clone, Copy)]
pub struct Arrival {
    op: Op,
    at: Instant,
    service: Option<Duration>,
}

impl Latency {
    pub fn new(model: LatencyModel) -> Latency {
        let channels = model.channels.map(|n| Mutex::new(Channels::with_depth(n, model.depth)));
        Latency {
            model,
            t0: Instant::now(),
            n: AtomicU64::new(0),
            channels,
            hists: std::array::from_fn(|_| Mutex::new(OpHists { service: hist(), wait: hist(), outside: hist() })),
        }
    }

    pub fn model(&self) -> &LatencyModel {
        &self.model
    }

    /// The model books requests on channels (`channels: N`).
    pub fn has_channels(&self) -> bool {
        self.channels.is_some()
    }

    /// Sample the service time of a request of `len` bytes arriving at `at`.
    pub fn arrive(&self, op: Op, len: u64, at: Instant) -> Arrival {
        let service = self.model.op(op).map(|m| sample(m, len, self.model.seed, self.n.fetch_add(1, Ordering::Relaxed)));
        Arrival { op, at, service }
    }

    /// When the reply to `a` is due, its channel (if the model has channels) busy for its
    /// service plus `held` (a held delay: docs/rules.md). Without channels `held` is the
    /// caller's (`Modelled`'s implicit channel). `None`: an op the model leaves alone that held
    /// nothing.
    pub fn book(&self, a: &Arrival, held: Duration) -> Option<Instant> {
        let held = if self.channels.is_some() { held } else { Duration::ZERO };
        if a.service.is_none() && held.is_zero() {
            return None;
        }
        let service = a.service.unwrap_or_default();
        let (wait, outside) = match &self.channels {
            None => (Duration::ZERO, Duration::ZERO),
            Some(c) => {
                let at = a.at.saturating_duration_since(self.t0);
                let b = c.lock().unwrap().book(at, service + held);
                (b.start - at, b.admitted - at)
            }
        };
        if a.service.is_some() {
            let mut h = self.hists[a.op as usize].lock().unwrap();
            // hdrhistogram refuses 0 with a lower bound of 1: count zeros as 1 ns
            let _ = h.service.record((service.as_nanos() as u64).max(1));
            let _ = h.wait.record((wait.as_nanos() as u64).max(1));
            if !outside.is_zero() {
                let _ = h.outside.record(outside.as_nanos() as u64);
            }
        }
        Some(a.at + wait + service + held)
    }

    /// When the reply to a request of `len` bytes arriving at `arrival` is due; `None` for an
    /// op the model leaves alone.
    pub fn admit(&self, op: Op, len: u64, arrival: Instant) -> Option<Instant> {
        self.book(&self.arrive(op, len, arrival), Duration::ZERO)
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
            let depth = self.model.depth.is_some();
            ops.insert(
                op.name().to_string(),
                OpModelStats {
                    count: h.service.len(),
                    service: t(&h.service),
                    wait: t(&h.wait),
                    outside: (depth && !h.outside.is_empty()).then(|| t(&h.outside)),
                    beyond_depth: depth.then(|| h.outside.len()),
                },
            );
        }
        LatencyStats { channels: self.model.channels, depth: self.model.depth, ops }
    }

    /// Forget the figures so far (a new repetition's epoch); channels keep their bookings.
    pub fn reset(&self) {
        for h in &self.hists {
            let mut h = h.lock().unwrap();
            h.service.reset();
            h.wait.reset();
            h.outside.reset();
        }
    }
}

/// The latency model as a layer: every request the device gets is sampled on arrival (also one
/// a fault below fails or drops: the device spent its time on it), goes down, and its reply is
/// due at the model's time, plus whatever delay came from below: a delay rule's path delay on
/// top, and a held delay (`hold: device`) booked on the request's channel so that the requests
/// behind it wait (on the model's channels, or on the implicit one: `HoldChannel`).
/// The booking is made once the layers below have answered (the held delay is decided there);
/// the times booked are still the request's arrival.
pub struct Modelled<L> {
    model: Option<Latency>,
    hold: HoldChannel,
    holds: HoldCounters,
    next: L,
}

impl<L: Layer> Modelled<L> {
    /// `model: None`: requests pass straight through, but for held delays.
    pub fn new(model: Option<Latency>, next: L) -> Modelled<L> {
        let t0 = model.as_ref().map_or_else(Instant::now, |l| l.t0);
        Modelled { model, hold: HoldChannel { t0, free_ns: AtomicU64::new(0) }, holds: HoldCounters::default(), next }
    }
    pub fn model(&self) -> Option<&Latency> {
        self.model.as_ref()
    }
    pub fn next(&self) -> &L {
        &self.next
    }

    /// What held delays did so far.
    pub fn hold_stats(&self) -> HoldStats {
        let c = &self.holds;
        let us = |a: &AtomicU64| round3(a.load(Ordering::Relaxed) as f64 / 1e3);
        HoldStats {
            channels: if self.model.as_ref().is_some_and(|l| l.has_channels()) { "model" } else { "implicit" }.into(),
            held: c.held.load(Ordering::Relaxed),
            held_us: us(&c.held_ns),
            waited: c.waited.load(Ordering::Relaxed),
            waited_us: us(&c.waited_ns),
        }
    }

    /// Forget the held-delay figures so far (a new repetition's epoch).
    pub fn reset_hold_stats(&self) {
        for a in [&self.holds.held, &self.holds.held_ns, &self.holds.waited, &self.holds.waited_ns] {
            a.store(0, Ordering::Relaxed);
        }
    }

    /// A request arrives: now, and the model's sample.
    fn arrive(&self, op: Op, len: u64) -> (Instant, Option<Arrival>) {
        // a held delay left by a request whose reply never came up here is not this one's
        let _ = super::faults::take_held();
        let at = Instant::now();
        (at, self.model.as_ref().map(|l| l.arrive(op, len, at)))
    }

    /// The layers below have answered: when the reply is due (the held delay below, if any,
    /// booked now).
    fn due(&self, at: Instant, a: Option<Arrival>) -> Option<Instant> {
        let held = super::faults::take_held().unwrap_or_default();
        if !held.is_zero() {
            self.holds.held.fetch_add(1, Ordering::Relaxed);
            self.holds.held_ns.fetch_add(held.as_nanos() as u64, Ordering::Relaxed);
        }
        if let (Some(l), Some(a)) = (&self.model, &a)
            && l.has_channels()
        {
            return l.book(a, held);
        }
        let start = self.hold.book(at, held);
        let modelled = match (&self.model, &a) {
            (Some(l), Some(a)) => l.book(a, Duration::ZERO),
            _ => None,
        };
        if start <= at && held.is_zero() {
            return modelled;
        }
        if start > at {
            self.holds.waited.fetch_add(1, Ordering::Relaxed);
            self.holds.waited_ns.fetch_add((start - at).as_nanos() as u64, Ordering::Relaxed);
        }
        // wait for the channel, then the held delay, then the model's service
        Some(start + held + modelled.map_or(Duration::ZERO, |d| d.saturating_duration_since(at)))
    }
}

impl<L: Layer> Layer for Modelled<L> {
    fn size(&self) -> u64 {
        self.next.size()
    }
    fn read(&self, off: u64, buf: &mut [u8]) -> Outcome {
        let (at, a) = self.arrive(Op::Read, buf.len() as u64);
        let o = self.next.read(off, buf);
        o.due(self.due(at, a))
    }
    fn write<'a>(&self, off: u64, data: Src<'a>, ack: impl FnOnce(Outcome, Option<Lent<'a>>)) {
        let (at, a) = self.arrive(Op::Write, data.len() as u64);
        self.next.write(off, data, move |o, lent| ack(o.due(self.due(at, a)), lent))
    }
    fn flush(&self) -> Outcome {
        let (at, a) = self.arrive(Op::Flush, 0);
        let o = self.next.flush();
        o.due(self.due(at, a))
    }
    fn discard(&self, off: u64, len: u64) -> Outcome {
        let (at, a) = self.arrive(Op::Discard, len);
        let o = self.next.discard(off, len);
        o.due(self.due(at, a))
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
        let starts: Vec<Duration> = [0, 1, 2, 3, 25].iter().map(|&a| c.book(us(a), us(10)).start).collect();
        assert_eq!(starts, vec![us(0), us(1), us(10), us(11), us(25)]);
        // one channel: strictly one after another, FIFO
        let mut c = Channels::new(1);
        let starts: Vec<Duration> = [(0, 5), (0, 7), (1, 2), (30, 1)].iter().map(|&(a, s)| c.book(us(a), us(s)).start).collect();
        assert_eq!(starts, vec![us(0), us(5), us(12), us(30)]);
    }

    /// A held delay keeps its channel for the delay: the requests behind it finish exactly
    /// when computed by hand; a path delay (the same request late, its channel free) does not
    /// move them.
    #[test]
    fn held_delay_queues_the_requests_behind_it() {
        let us = Duration::from_micros;
        // 2 channels, service 10 µs; arrivals 0, 1, 2, 3, 4; request 1 holds 30 µs.
        // held: r0 A 0..10; r1 B 1..41; r2 A 10..20; r3 A 20..30; r4 A 30..40
        // path: r0 A 0..10; r1 B 1..11 (+30 on the path); r2 A 10..20; r3 B 11..21; r4 A 20..30
        let m = parse_latency("read: 10us\nchannels: 2\n", "t").unwrap();
        for (hold, want) in [(true, [10, 41, 20, 30, 40]), (false, [10, 11, 20, 21, 30])] {
            let l = Latency::new(m.clone());
            let due: Vec<Duration> = (0..5u64)
                .map(|k| {
                    let a = Arrival { op: Op::Read, at: l.t0 + us(k), service: Some(us(10)) };
                    let held = if hold && k == 1 { us(30) } else { Duration::ZERO };
                    l.book(&a, held).unwrap() - l.t0
                })
                .collect();
            assert_eq!(due, want.map(us).to_vec(), "hold: {hold}");
        }
        // one channel: every request behind the held one waits for all of it
        let l = Latency::new(parse_latency("write: 5us\nchannels: 1\n", "t").unwrap());
        let due: Vec<Duration> = [(0, 0), (0, 100), (2, 0), (200, 0)]
            .iter()
            .map(|&(at, held)| l.book(&Arrival { op: Op::Write, at: l.t0 + us(at), service: Some(us(5)) }, us(held)).unwrap() - l.t0)
            .collect();
        // r0 0..5; r1 5..110; r2 110..115; r3 arrives after: 200..205
        assert_eq!(due, [5, 110, 115, 205].map(us).to_vec());
        // an op the model leaves alone still holds (and waits for) the channel when it holds
        let flush = l.book(&Arrival { op: Op::Flush, at: l.t0 + us(201), service: None }, us(50)).unwrap() - l.t0;
        assert_eq!(flush, us(255));
        assert!(l.book(&Arrival { op: Op::Flush, at: l.t0 + us(300), service: None }, Duration::ZERO).is_none());
    }

    /// Without the model's channels a held delay occupies the implicit channel: every request
    /// arriving while it is held waits until it ends, then takes its own service (unlimited).
    #[test]
    fn implicit_channel_holds_every_request() {
        use crate::disk::layer::StoreLayer;
        let us = Duration::from_micros;
        let ram = || StoreLayer(Box::new(crate::disk::store::RamStore::new(1 << 20).unwrap()));
        // a model without channels: read 10 µs
        let m = Modelled::new(Some(Latency::new(parse_latency("read: 10us\n", "t").unwrap())), ram());
        let t0 = m.hold.t0;
        let at = |k: u64| t0 + us(k);
        let arrive = |k: u64| m.model.as_ref().unwrap().arrive(Op::Read, 4096, at(k));
        // r0 at 0: 10; r1 at 1 holds 30: channel 1..31, due 41; r2 at 2 and r3 at 3 wait to 31,
        // due 41; r4 at 50: free, due 60
        let mut due = Vec::new();
        for (k, held) in [(0, 0), (1, 30), (2, 0), (3, 0), (50, 0)] {
            crate::disk::faults::give_held((held > 0).then(|| us(held)));
            due.push(m.due(at(k), Some(arrive(k))).unwrap() - t0);
        }
        assert_eq!(due, [10, 41, 41, 41, 60].map(us).to_vec());
        let h = m.hold_stats();
        assert_eq!((h.channels.as_str(), h.held, h.waited), ("implicit", 1, 2));
        assert!((h.held_us - 30.0).abs() < 1e-9 && (h.waited_us - 57.0).abs() < 1e-9, "{h:?}");
        // no model at all: the held request and those behind it, nothing else delayed
        let m = Modelled::new(None, ram());
        let t0 = m.hold.t0;
        let mut due = Vec::new();
        for (k, held) in [(0, 0), (5, 100), (6, 0), (200, 0)] {
            crate::disk::faults::give_held((held > 0).then(|| us(held)));
            due.push(m.due(t0 + us(k), None).map(|d| d - t0));
        }
        assert_eq!(due, vec![None, Some(us(105)), Some(us(105)), None]);
    }

    /// Through the whole chain (rule engine, fault layer, latency layer): a held delay on one
    /// block's reads holds the implicit channel, so reads issued behind it are answered when it
    /// ends; the same rule on the path delays only its own read.
    #[test]
    fn held_rule_through_the_disk() {
        use crate::disk::Disk;
        use crate::fault::{Action, Rule, Target};
        use crate::spec::rule::{DelayDist, Hold};
        let ms = Duration::from_millis;
        for hold in [Hold::Device, Hold::Path] {
            let d = Disk::over(Box::new(crate::disk::store::RamStore::new(1 << 20).unwrap()), 4096, None);
            let rule = Rule::new(Action::Delay { delay: DelayDist::Fixed(ms(20)), hold }, &[Op::Read], Target::Range { start: 4096, end: 8192 });
            d.arm(vec![rule]).unwrap();
            let mut b = vec![0u8; 4096];
            // (issued, answered) per read of blocks 0..5, in order from one thread
            let times: Vec<(Instant, Instant)> = (0..5u64)
                .map(|k| {
                    let t = Instant::now();
                    let o = d.read(k * 4096, &mut b);
                    assert!(o.errno.is_none());
                    (t, Instant::now() + o.delay.unwrap_or_default())
                })
                .collect();
            let (held_from, held_to) = times[1];
            assert!(held_to - held_from >= ms(20), "{hold:?}: the delayed read itself");
            for (k, (t, done)) in times.iter().enumerate().skip(2) {
                match hold {
                    // answered when the hold ends (the same instant, up to the clock reads)
                    Hold::Device => assert!(
                        *done >= held_from + ms(20) && done.saturating_duration_since(held_to) < ms(2),
                        "read {k} answered {:?} after the held one",
                        done.saturating_duration_since(held_to)
                    ),
                    Hold::Path => assert!(*done - *t < ms(5), "read {k} waited {:?} behind a path delay", *done - *t),
                }
            }
            assert!(times[0].1 - times[0].0 < ms(5), "the read before the hold waits for nothing");
            assert_eq!(d.hold_stats().held, u64::from(hold == Hold::Device));
        }
    }

    /// A depth admits at most channels x depth requests; those beyond wait to be admitted, and
    /// in FIFO order that moves no start: only the split of the wait changes.
    #[test]
    fn depth_splits_the_wait_and_keeps_the_starts() {
        let us = Duration::from_micros;
        let mut c = Channels::with_depth(1, Some(2));
        let b: Vec<(Duration, Duration)> = [0, 0, 0, 0, 45].iter().map(|&a| c.book(us(a), us(10))).map(|b| (b.admitted, b.start)).collect();
        // finishes 10, 20, 30, 40: r2 admitted when r0 finishes (10), r3 when r1 does (20);
        // r4 arrives at 45 to an empty device
        assert_eq!(b, [(0, 0), (0, 10), (10, 20), (20, 30), (45, 45)].map(|(a, s)| (us(a), us(s))).to_vec());
        let mut plain = Channels::new(1);
        let starts: Vec<Duration> = [0, 0, 0, 0, 45].iter().map(|&a| plain.book(us(a), us(10)).start).collect();
        assert_eq!(starts, b.iter().map(|x| x.1).collect::<Vec<_>>());
        // the model reports the part of the wait spent outside the device
        let l = Latency::new(parse_latency("read: 10us\nchannels: 1\ndepth: 2\n", "t").unwrap());
        for _ in 0..4 {
            l.book(&Arrival { op: Op::Read, at: l.t0, service: Some(us(10)) }, Duration::ZERO);
        }
        let s = l.stats();
        let r = &s.ops["read"];
        assert_eq!((s.depth, r.beyond_depth), (Some(2), Some(2)));
        assert!((r.outside.as_ref().unwrap().mean_us - 15.0).abs() < 0.1, "{r:?}");
        assert!((r.wait.mean_us - 15.0).abs() < 0.1, "{r:?}");
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
