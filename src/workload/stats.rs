//! Latency statistics: whole-run HDR histograms per op, and the time series (per-interval
//! histograms swapped out by a sampler thread, with this process's CPU% and RSS on the same clock).

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// Per-op latency and throughput summary; also the `read`/`write` of results.json
/// (`report::model::OpStats`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LatencySummary {
    pub ops: u64,
    pub bytes: u64,
    pub mean_us: f64,
    pub stddev_us: f64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    pub iops: f64,
    pub mib_s: f64,
    pub p95_us: f64,
    /// [quantile, latency µs] at `CDF_QUANTILES` (empty without ops): the report's CDFs.
    pub cdf: Vec<[f64; 2]>,
}

/// One flowop type's latency and rate over a personality run (`flowops` in result.json and
/// results.json, `report::model::FlowopStats`). Latency is the whole flowop: a whole-file read
/// or write with all its chunks.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct FlowopSummary {
    pub ops: u64,
    pub bytes: u64,
    pub ops_s: f64,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p95_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
    /// [quantile, latency µs] at `CDF_QUANTILES` (empty without ops).
    pub cdf: Vec<[f64; 2]>,
}

/// The quantiles a summary keeps of its histogram, enough to draw a latency CDF.
pub const CDF_QUANTILES: [f64; 21] = [0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.93, 0.95, 0.97, 0.98, 0.99, 0.995, 0.998, 0.999, 1.0];

/// [quantile, µs] of a histogram in ns at `CDF_QUANTILES`.
pub fn cdf(h: &Histogram<u64>) -> Vec<[f64; 2]> {
    if h.is_empty() {
        return Vec::new();
    }
    CDF_QUANTILES.iter().map(|&q| [q, h.value_at_quantile(q) as f64 / 1000.0]).collect()
}

pub fn flowop_summary(h: &Histogram<u64>, bytes: u64, secs: f64) -> FlowopSummary {
    let us = |v: u64| v as f64 / 1000.0;
    FlowopSummary {
        ops: h.len(),
        bytes,
        ops_s: h.len() as f64 / secs,
        mean_us: h.mean() / 1000.0,
        p50_us: us(h.value_at_quantile(0.5)),
        p95_us: us(h.value_at_quantile(0.95)),
        p99_us: us(h.value_at_quantile(0.99)),
        max_us: us(h.max()),
        cdf: cdf(h),
    }
}

/// 1 ns .. 1 h at 3 significant digits. (`Histogram::new` starts with a max of 2 and only
/// grows on `record`; `saturating_record` would clamp every latency to 2 ns.)
pub fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000_000, 3).unwrap()
}

pub fn summary(h: &Histogram<u64>, bytes: u64, secs: f64) -> LatencySummary {
    let us = |v: u64| v as f64 / 1000.0;
    LatencySummary {
        ops: h.len(),
        bytes,
        mean_us: h.mean() / 1000.0,
        stddev_us: h.stdev() / 1000.0,
        p50_us: us(h.value_at_quantile(0.5)),
        p90_us: us(h.value_at_quantile(0.9)),
        p99_us: us(h.value_at_quantile(0.99)),
        p999_us: us(h.value_at_quantile(0.999)),
        max_us: us(h.max()),
        iops: h.len() as f64 / secs,
        mib_s: bytes as f64 / secs / (1 << 20) as f64,
        p95_us: us(h.value_at_quantile(0.95)),
        cdf: cdf(h),
    }
}

/// One op type's completions in an interval.
pub struct OpAcc {
    pub h: Histogram<u64>,
    pub bytes: u64,
}

impl OpAcc {
    pub fn new() -> OpAcc {
        OpAcc { h: hist(), bytes: 0 }
    }
    #[inline]
    pub fn record(&mut self, ns: u64, bytes: u64) {
        self.h.saturating_record(ns);
        self.bytes += bytes;
    }
    fn take_into(&mut self, into: &mut OpAcc) {
        into.h.add(&self.h).unwrap();
        into.bytes += self.bytes;
        self.h.reset();
        self.bytes = 0;
    }
}

impl Default for OpAcc {
    fn default() -> Self {
        OpAcc::new()
    }
}

/// A thread's completions since the last sample (its own lock: uncontended but for the sampler).
#[derive(Default)]
pub struct IntervalAcc {
    pub read: OpAcc,
    pub write: OpAcc,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct OpSample {
    pub iops: f64,
    pub mib_s: f64,
    pub mean_us: f64,
    pub p99_us: f64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Sample {
    /// End of the interval, seconds since the workload started.
    pub t: f64,
    pub read: OpSample,
    pub write: OpSample,
    /// CPU time (user + system, all threads) of this process over the interval / its length.
    pub cpu_pct: f64,
    pub rss_mib: f64,
}

impl Sample {
    pub const CSV_HEADER: &str = "t,read_iops,read_mib_s,read_mean_us,read_p99_us,write_iops,write_mib_s,write_mean_us,write_p99_us,cpu_pct,rss_mib";
    pub fn csv_row(&self) -> String {
        let (r, w) = (&self.read, &self.write);
        format!(
            "{:.3},{:.1},{:.2},{:.1},{:.1},{:.1},{:.2},{:.1},{:.1},{:.1},{:.1}",
            self.t, r.iops, r.mib_s, r.mean_us, r.p99_us, w.iops, w.mib_s, w.mean_us, w.p99_us, self.cpu_pct, self.rss_mib
        )
    }
}

fn op_sample(a: &OpAcc, secs: f64) -> OpSample {
    let n = a.h.len();
    OpSample {
        iops: n as f64 / secs,
        mib_s: a.bytes as f64 / secs / (1 << 20) as f64,
        mean_us: if n > 0 { a.h.mean() / 1000.0 } else { 0.0 },
        p99_us: if n > 0 { a.h.value_at_quantile(0.99) as f64 / 1000.0 } else { 0.0 },
    }
}

/// Extend `s` (which started at `start`) to `end`, adding the completions in `sliver`: rates
/// over the longer interval, means weighted by count, p99 the larger of the two.
fn fold_sliver(s: &mut Sample, start: f64, sliver: &IntervalAcc, end: f64) {
    let (old, new) = ((s.t - start).max(1e-9), (end - start).max(1e-9));
    for (o, a) in [(&mut s.read, &sliver.read), (&mut s.write, &sliver.write)] {
        let (n0, n1) = (o.iops * old, a.h.len() as f64);
        if n1 > 0.0 {
            o.mean_us = (o.mean_us * n0 + a.h.mean() / 1000.0 * n1) / (n0 + n1);
            o.p99_us = o.p99_us.max(a.h.value_at_quantile(0.99) as f64 / 1000.0);
        }
        o.iops = (n0 + n1) / new;
        o.mib_s = (o.mib_s * old + a.bytes as f64 / (1 << 20) as f64) / new;
    }
    s.t = end;
}

/// User + system CPU time of this process (all threads). getrusage has microsecond
/// resolution where /proc/self/stat has clock ticks (10 ms), too coarse for 10 ms samples.
pub fn cpu_time() -> Duration {
    // SAFETY: rusage is plain integers, for which all zeroes is a valid value
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid rusage for the kernel to fill
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Resident set size of this process in MiB (procfs: /proc/self/statm, second field, pages).
pub fn rss_mib() -> f64 {
    let pages: u64 = std::fs::read_to_string("/proc/self/statm").ok().and_then(|s| s.split_whitespace().nth(1)?.parse().ok()).unwrap_or(0);
    // SAFETY: sysconf takes a name, no pointer
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64;
    (pages * page) as f64 / (1 << 20) as f64
}

/// Sample every `interval` until `done`, plus a last (partial) sample at the end.
pub fn sampler(accs: &[Mutex<IntervalAcc>], start: Instant, interval: Duration, done: &AtomicBool) -> Vec<Sample> {
    let mut out: Vec<Sample> = Vec::new();
    let mut last_t = Duration::ZERO;
    let mut last_cpu = cpu_time();
    let mut k = 1u32;
    let mut merged = IntervalAcc::default();
    loop {
        let finished = loop {
            if done.load(Relaxed) {
                break true;
            }
            let due = interval * k;
            let now = start.elapsed();
            if now >= due {
                break false;
            }
            // woken early by `unpark` when the run ends
            std::thread::park_timeout(due - now);
        };
        for a in accs {
            let mut a = a.lock().unwrap();
            a.read.take_into(&mut merged.read);
            a.write.take_into(&mut merged.write);
        }
        let t = start.elapsed();
        let cpu = cpu_time();
        let secs = (t - last_t).as_secs_f64().max(1e-9);
        // a final sliver shorter than 1 ms is no interval of its own: its completions (if
        // any) go into the last sample, which then ends with the run
        let n = out.len();
        if finished && secs < 1e-3 && n > 0 {
            let prev_start = if n > 1 { out[n - 2].t } else { 0.0 };
            fold_sliver(&mut out[n - 1], prev_start, &merged, t.as_secs_f64());
        } else if !finished || secs >= 1e-3 || merged.read.h.len() + merged.write.h.len() > 0 {
            out.push(Sample {
                t: t.as_secs_f64(),
                read: op_sample(&merged.read, secs),
                write: op_sample(&merged.write, secs),
                cpu_pct: (cpu - last_cpu).as_secs_f64() / secs * 100.0,
                rss_mib: rss_mib(),
            });
        }
        merged.read.h.reset();
        merged.read.bytes = 0;
        merged.write.h.reset();
        merged.write.bytes = 0;
        (last_t, last_cpu) = (t, cpu);
        if finished {
            return out;
        }
        k += 1;
    }
}
