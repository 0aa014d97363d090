//! Slowdown of injected runs against their paired baselines (`baseline: true`), or of the
//! armed windows of each run against their paired unarmed windows (`baseline: windows`).
//!
//! Every repetition yields named series values, (source, op, metric) -> number: the
//! workload's read/write, a personality's flowops, and the BPF monitor's per-layer rows when
//! present. Pair k is baseline run k and injected run k (run one after the other). For a
//! latency the slowdown is (mean injected - mean baseline) / mean baseline over the pairs;
//! its 95% interval is the Student t interval of the paired differences (injected_k -
//! baseline_k), divided by the mean baseline. Throughput is turned around so that both read
//! "how much slower": (mean baseline - mean injected) / mean injected, i.e. the growth of the
//! time per op (half the rate is +100%, as twice the latency is). The interval treats the
//! denominator as fixed. Distinguishable from zero: the interval excludes zero. Pairs where
//! a value is missing, zero or not finite are left out.
//!
//! Windows (`method` says which): pair j of a run is its windows 2j and 2j+1, one unarmed
//! and one armed (spec::windows); each window's workload and flowop figures, and the
//! monitor's figures in the same span (`MonitorResults::windows`), are the series of a run,
//! and every pair of every repetition is one pair above, in repetition then pair order. A
//! pair with a window missing (the run ended in it) is left out, and so is a layer's pair
//! where a window saw none of its events.

use super::model::Repetition;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The metric name of a throughput series (ops/s); every other metric is a latency.
pub const THROUGHPUT: &str = "throughput";

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SlowdownRow {
    /// `workload` (the workload's reads and writes), `flowop` (a personality's flowops), or a
    /// monitor layer: `syscall`, `fs`, `journal`, `block_queue`, `block_service`, `driver`,
    /// `user`, and `daemon` (the disk daemon's own service time).
    pub source: String,
    /// read, write, a flowop name (appendfilerand, fsync, ...), or a monitor op.
    pub op: String,
    /// mean_us, p50_us, p95_us, p99_us, throughput (ops/s), or for `block_queue`
    /// `interval_sd_us` (how much its queue time swings between the monitor's intervals).
    pub metric: String,
    /// Pairs that had the series in both runs.
    pub pairs: u32,
    /// Mean over those pairs of the baseline's and the injected run's value.
    pub baseline: f64,
    pub injected: f64,
    /// (injected - baseline) / baseline of the means (0.12 = 12% slower); for throughput
    /// (baseline - injected) / injected.
    pub slowdown: f64,
    /// 95% t interval of that mean; None with fewer than two pairs.
    pub ci_low: Option<f64>,
    pub ci_high: Option<f64>,
    /// The interval excludes zero.
    pub distinguishable: bool,
    /// Each pair's difference over the mean denominator, in repetition order (their mean is
    /// `slowdown`, their t interval the interval).
    pub per_pair: Vec<f64>,
}

/// Two-sided 95% critical value of Student's t with `df` degrees of freedom: the table for
/// df <= 30, a Cornish-Fisher expansion above (within 0.001 of the exact value there).
pub fn t_975(df: u32) -> f64 {
    const T: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080,
        2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
    ];
    match df {
        0 => f64::INFINITY,
        1..=30 => T[df as usize - 1],
        _ => {
            let z = 1.959_963_985f64;
            let n = df as f64;
            z + (z.powi(3) + z) / (4.0 * n) + (5.0 * z.powi(5) + 16.0 * z.powi(3) + 3.0 * z) / (96.0 * n * n)
        }
    }
}

/// Mean and 95% t interval of paired values (None for the interval with fewer than two).
pub fn mean_ci(xs: &[f64]) -> (f64, Option<(f64, f64)>) {
    let n = xs.len();
    if n == 0 {
        return (0.0, None);
    }
    let mean = xs.iter().sum::<f64>() / n as f64;
    if n < 2 {
        return (mean, None);
    }
    let sd = (xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt();
    let half = t_975(n as u32 - 1) * sd / (n as f64).sqrt();
    (mean, Some((mean - half, mean + half)))
}

/// A pair both of whose values can be compared (finite and above zero).
fn usable(base: f64, inj: f64) -> bool {
    base.is_finite() && inj.is_finite() && base > 0.0 && inj > 0.0
}

/// Series key: (source, op, metric).
pub type Key = (String, String, String);

/// The slowdown of one series from its per-pair (baseline, injected) values.
pub fn row(key: &Key, pairs: &[(f64, f64)]) -> SlowdownRow {
    let thr = key.2 == THROUGHPUT;
    let kept: Vec<(f64, f64)> = pairs.iter().copied().filter(|&(b, i)| usable(b, i)).collect();
    let n = kept.len().max(1) as f64;
    let baseline = kept.iter().map(|k| k.0).sum::<f64>() / n;
    let injected = kept.iter().map(|k| k.1).sum::<f64>() / n;
    // latency: (inj - base) / mean base; throughput: (base - inj) / mean inj
    let per_pair: Vec<f64> = if thr { kept.iter().map(|(b, i)| (b - i) / injected).collect() } else { kept.iter().map(|(b, i)| (i - b) / baseline).collect() };
    let (slowdown, ci) = mean_ci(&per_pair);
    SlowdownRow {
        source: key.0.clone(),
        op: key.1.clone(),
        metric: key.2.clone(),
        pairs: kept.len() as u32,
        baseline,
        injected,
        slowdown,
        ci_low: ci.map(|c| c.0),
        ci_high: ci.map(|c| c.1),
        distinguishable: ci.is_some_and(|(lo, hi)| lo > 0.0 || hi < 0.0),
        per_pair,
    }
}

/// Every series one repetition measured.
pub fn series(r: &Repetition) -> BTreeMap<Key, f64> {
    let mut out = BTreeMap::new();
    let mut put = |source: &str, op: &str, metric: &str, v: f64| {
        out.insert((source.to_string(), op.to_string(), metric.to_string()), v);
    };
    for (op, s) in [("read", &r.read), ("write", &r.write)] {
        if s.ops > 0 {
            put("workload", op, "mean_us", s.mean_us);
            put("workload", op, "p50_us", s.p50_us);
            put("workload", op, "p95_us", s.p95_us);
            put("workload", op, "p99_us", s.p99_us);
            put("workload", op, THROUGHPUT, s.iops);
        }
    }
    for (op, f) in &r.flowops {
        if f.ops > 0 {
            put("flowop", op, "mean_us", f.mean_us);
            put("flowop", op, "p50_us", f.p50_us);
            put("flowop", op, "p95_us", f.p95_us);
            put("flowop", op, "p99_us", f.p99_us);
            put("flowop", op, THROUGHPUT, f.ops_s);
        }
    }
    if let Some(m) = &r.monitor {
        let secs = m.duration_s;
        // a layer's row: its latencies, and its count over the monitored span as a rate
        let layer = |put: &mut dyn FnMut(&str, &str, &str, f64), source: &str, op: &str, l: &crate::monitor::model::LayerOp| {
            if l.count > 0 {
                put(source, op, "mean_us", l.mean_us);
                put(source, op, "p50_us", l.p50_us);
                put(source, op, "p95_us", l.p95_us);
                put(source, op, "p99_us", l.p99_us);
                if secs > 0.0 {
                    put(source, op, THROUGHPUT, l.count as f64 / secs);
                }
            }
        };
        // the tracepoint pairs: fs, journal (the commit and its phases), driver, user
        for l in m.syscalls.iter().chain(&m.stack) {
            layer(&mut put, &l.layer, &l.op, l);
        }
        // jbd2_run_stats: per commit, the kernel's own phase times (jiffies, so coarse)
        for sm in &m.summed {
            let event = sm.event.split(':').next_back().unwrap_or(&sm.event);
            for f in sm.fields.iter().filter(|f| f.unit == "ms") {
                if sm.count > 0 {
                    put(&sm.layer, &format!("{event}:{}", f.name), "mean_us", f.mean * 1000.0);
                }
            }
        }
        let several = m.devices.len() > 1;
        for (i, d) in m.devices.iter().enumerate() {
            // stacks over two disks (btrfs raid1): one series per disk
            let name = |op: &str| if several { format!("disk{i}:{op}") } else { op.to_string() };
            for l in &d.layers {
                layer(&mut put, &l.layer, &name(&l.op), l);
            }
            for (op, q) in queue_swings(d) {
                put("block_queue", &name(&op), QUEUE_SWING, q);
            }
            for (op, o) in &d.daemon {
                if o.count > 0 {
                    put("daemon", &name(op), "mean_us", o.service_mean_us);
                }
            }
        }
    }
    out
}

/// The metric of the block layer's queue time swinging from interval to interval: the
/// standard deviation over the monitor's intervals of each interval's mean queue time. A slow
/// device whose delays come in bursts fills the queue during a burst and drains it after, so
/// the swings grow while the run's mean queue time may hardly move.
pub const QUEUE_SWING: &str = "interval_sd_us";

/// Per op, the sample standard deviation of the per-interval mean queue time over the
/// intervals that completed requests of that op (at least two of them).
pub fn queue_swings(d: &crate::monitor::model::DeviceResults) -> BTreeMap<String, f64> {
    let mut by: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for iv in &d.series {
        for (op, o) in &iv.ops {
            if o.count > 0 && o.queue_mean_us.is_finite() {
                by.entry(op.clone()).or_default().push(o.queue_mean_us);
            }
        }
    }
    by.into_iter().filter(|(_, v)| v.len() >= 2).map(|(op, v)| (op, super::model::MeanSd::of(&v).sd)).collect()
}

/// The block layer's queue time over a repetition for `op` on its first device: (start of
/// the interval in seconds after the monitor attached, mean queue time µs) for every
/// interval that completed requests of that op.
pub fn queue_over_time(r: &Repetition, op: &str) -> Vec<(f64, f64)> {
    let Some(d) = r.monitor.as_ref().and_then(|m| m.devices.first()) else { return Vec::new() };
    d.series.iter().filter_map(|iv| iv.ops.get(op).filter(|o| o.count > 0).map(|o| (iv.t_s, o.queue_mean_us))).collect()
}

/// The block layer's queue time over a `baseline: windows` repetition, on the workload's
/// clock: `queue_over_time` moved by where the workload started on the monitor's series,
/// from the workload's start on; None where the monitor has no window start.
pub fn queue_over_workload(r: &Repetition, op: &str) -> Option<Vec<(f64, f64)>> {
    let off = r.monitor.as_ref()?.window_start.as_ref()?.series_offset_s;
    Some(queue_over_time(r, op).into_iter().map(|(t, q)| (t - off, q)).filter(|p| p.0 >= 0.0).collect())
}

/// `runs` (paired runs), `windows` (paired windows) or None (no slowdown).
pub fn method(baseline: &[Repetition], injected: &[Repetition]) -> Option<&'static str> {
    if !baseline.is_empty() {
        Some("runs")
    } else if injected.iter().any(|r| !r.windows.is_empty()) {
        Some("windows")
    } else {
        None
    }
}

/// A window of run `r` as a repetition, for `series`: the workload's figures in it and the
/// monitor's in the same span (its layers' rows, their counts over the span as throughput).
fn window_run(w: &super::model::WindowStats, r: &Repetition) -> Repetition {
    let monitor = r.monitor.as_ref().and_then(|m| m.windows.iter().find(|x| x.index == w.index)).map(|x| x.as_results());
    Repetition { read: w.read.clone(), write: w.write.clone(), flowops: w.flowops.clone(), monitor, ..Default::default() }
}

/// Every (unarmed, armed) pair of windows of the repetitions, in repetition then pair order.
pub fn window_pairs(injected: &[Repetition]) -> Vec<(Repetition, Repetition)> {
    let mut out = Vec::new();
    for r in injected {
        let pairs = r.windows.iter().map(|w| w.pair).max().map_or(0, |m| m + 1);
        for j in 0..pairs {
            let of = |armed: bool| r.windows.iter().find(|w| w.pair == j && w.armed == armed);
            if let (Some(off), Some(on)) = (of(false), of(true)) {
                out.push((window_run(off, r), window_run(on, r)));
            }
        }
    }
    out
}

/// The slowdown of every series: paired runs, pairing `baseline[k]` with `injected[k]`; with
/// no baselines, the paired windows of the injected runs; empty without either. Rows are
/// sorted by source, op and metric.
pub fn rows(baseline: &[Repetition], injected: &[Repetition]) -> Vec<SlowdownRow> {
    let windows;
    let pairs_of: Vec<(&Repetition, &Repetition)> = match method(baseline, injected) {
        None => return Vec::new(),
        Some("runs") => baseline.iter().zip(injected).collect(),
        Some(_) => {
            windows = window_pairs(injected);
            windows.iter().map(|(b, i)| (b, i)).collect()
        }
    };
    let mut pairs: BTreeMap<Key, Vec<(f64, f64)>> = BTreeMap::new();
    for (b, i) in pairs_of {
        let (sb, si) = (series(b), series(i));
        for (k, vb) in sb {
            if let Some(vi) = si.get(&k) {
                pairs.entry(k).or_default().push((vb, *vi));
            }
        }
    }
    pairs.iter().map(|(k, p)| row(k, p)).collect()
}

/// Format a slowdown and its interval as percentages: `+12.3% [+4.1, +20.5]`.
pub fn fmt_pct(r: &SlowdownRow) -> String {
    match (r.ci_low, r.ci_high) {
        (Some(lo), Some(hi)) => format!("{:+.1}% [{:+.1}, {:+.1}]", r.slowdown * 100.0, lo * 100.0, hi * 100.0),
        _ => format!("{:+.1}%", r.slowdown * 100.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn t_values_match_the_table_and_the_normal_limit() {
        assert_eq!(t_975(1), 12.706);
        assert_eq!(t_975(4), 2.776);
        // 40 and 120 degrees of freedom: 2.021 and 1.980 in printed tables
        assert!((t_975(40) - 2.021).abs() < 0.001, "{}", t_975(40));
        assert!((t_975(120) - 1.980).abs() < 0.001, "{}", t_975(120));
        assert!((t_975(100_000) - 1.960).abs() < 0.001);
        assert!(t_975(0).is_infinite());
    }

    /// By hand: baselines 100, 200, 100, 100 µs (mean 125) and injected 110, 230, 120, 100
    /// (mean 140): slowdown 15 / 125 = 0.12. Differences 10, 30, 20, 0: mean 15, sample sd
    /// sqrt(500 / 3) = 12.9099; half width 3.182 * 12.9099 / 2 = 20.5397, over 125 = 0.164318.
    #[test]
    fn slowdown_and_interval_hand_computed() {
        let key = ("workload".to_string(), "write".to_string(), "mean_us".to_string());
        let r = row(&key, &[(100.0, 110.0), (200.0, 230.0), (100.0, 120.0), (100.0, 100.0)]);
        assert_eq!(r.pairs, 4);
        assert_eq!((r.baseline, r.injected), (125.0, 140.0));
        assert!((r.slowdown - 0.12).abs() < 1e-12);
        let half = 3.182 * (500.0f64 / 3.0).sqrt() / 2.0 / 125.0;
        assert!((half - 0.164318).abs() < 1e-6, "{half}");
        assert!((r.ci_low.unwrap() - (0.12 - half)).abs() < 1e-12);
        assert!((r.ci_high.unwrap() - (0.12 + half)).abs() < 1e-12);
        assert!(!r.distinguishable, "the interval [-0.044, 0.284] holds zero");
        // the same differences, less spread: distinguishable
        let r = row(&key, &[(100.0, 112.0), (100.0, 115.0), (100.0, 118.0)]);
        assert!((r.slowdown - 0.15).abs() < 1e-12 && r.distinguishable, "{r:?}");
    }

    #[test]
    fn throughput_slowdown_is_time_per_op() {
        let key = ("flowop".to_string(), "fsync".to_string(), THROUGHPUT.to_string());
        // half the rate: +100%. Differences 500, 400, 300 over the injected mean 400:
        // 1.25, 1.0, 0.75; sd 0.25, half width 4.303 * 0.25 / sqrt(3) = 0.62108
        let r = row(&key, &[(1000.0, 500.0), (800.0, 400.0), (600.0, 300.0)]);
        assert!((r.slowdown - 1.0).abs() < 1e-12);
        assert!((r.ci_low.unwrap() - (1.0 - 0.62108)).abs() < 1e-5, "{r:?}");
        assert!(r.distinguishable);
    }

    #[test]
    fn bad_pairs_are_left_out_and_one_pair_has_no_interval() {
        let key = ("workload".to_string(), "read".to_string(), "p99_us".to_string());
        let r = row(&key, &[(0.0, 10.0), (100.0, 150.0), (f64::NAN, 1.0)]);
        assert_eq!(r.pairs, 1);
        assert!((r.slowdown - 0.5).abs() < 1e-12);
        assert_eq!((r.ci_low, r.ci_high, r.distinguishable), (None, None, false));
    }

    #[test]
    fn rows_pair_by_position_and_cover_flowops() {
        use super::super::model::{FlowopStats, OpStats};
        let rep = |w: f64, a: f64| Repetition {
            write: OpStats { ops: 10, mean_us: w, p50_us: w, p95_us: w, p99_us: w, iops: 1e6 / w, ..Default::default() },
            flowops: [("appendfilerand".to_string(), FlowopStats { ops: 5, mean_us: a, p50_us: a, p95_us: a, p99_us: a, ops_s: 1.0, ..Default::default() })]
                .into(),
            ..Default::default()
        };
        let base = [rep(10.0, 20.0), rep(20.0, 20.0)];
        let inj = [rep(15.0, 30.0), rep(20.0, 40.0)];
        let rows = rows(&base, &inj);
        let get = |s: &str, o: &str, m: &str| rows.iter().find(|r| r.source == s && r.op == o && r.metric == m).unwrap();
        // write: baselines 10, 20 (mean 15), injected 15, 20: differences 5, 0 over 15
        assert_eq!(get("workload", "write", "mean_us").per_pair, vec![5.0 / 15.0, 0.0]);
        assert_eq!(get("workload", "write", THROUGHPUT).per_pair.len(), 2);
        assert_eq!(get("flowop", "appendfilerand", "p99_us").per_pair, vec![0.5, 1.0]);
        assert!(rows.iter().all(|r| r.op != "read"), "no reads: no read series");
        assert!(super::rows(&[], &inj).is_empty());
        assert_eq!(method(&[], &inj), None);
        assert_eq!(method(&base, &inj), Some("runs"));
    }

    /// Two runs of windows. Run 1: pair 0 = (off 100, on 110), pair 1 = (on 130, off 100);
    /// run 2: pair 0 = (off 200, on 230), pair 1 has no armed window (the run ended): left
    /// out. Pairs (off, on): (100, 110), (100, 130), (200, 230): mean off 400/3, differences
    /// 10, 30, 30: slowdown (70/3) / (400/3) = 0.175.
    #[test]
    fn windows_pair_unarmed_with_armed_by_pair() {
        use super::super::model::{OpStats, WindowStats};
        let win = |index: u32, armed: bool, mean: f64| WindowStats {
            index,
            armed,
            pair: index / 2,
            read: OpStats { ops: 100, mean_us: mean, p50_us: mean, p95_us: mean, p99_us: mean, iops: 1e6 / mean, ..Default::default() },
            ..Default::default()
        };
        let r1 = Repetition { windows: vec![win(0, false, 100.0), win(1, true, 110.0), win(2, true, 130.0), win(3, false, 100.0)], ..Default::default() };
        let r2 = Repetition { windows: vec![win(0, false, 200.0), win(1, true, 230.0), win(2, true, 1.0)], ..Default::default() };
        let reps = [r1, r2];
        assert_eq!(method(&[], &reps), Some("windows"));
        let rows = rows(&[], &reps);
        let m = rows.iter().find(|r| r.source == "workload" && r.op == "read" && r.metric == "mean_us").unwrap();
        assert_eq!(m.pairs, 3);
        assert!((m.baseline - 400.0 / 3.0).abs() < 1e-9 && (m.injected - 470.0 / 3.0).abs() < 1e-9, "{m:?}");
        assert!((m.slowdown - 0.175).abs() < 1e-12, "{m:?}");
        let d = 400.0 / 3.0;
        assert_eq!(m.per_pair, vec![10.0 / d, 30.0 / d, 30.0 / d]);
        assert!(rows.iter().all(|r| r.op != "write"), "no writes in the windows: no write series");
    }

    /// Windows carry the monitor's layers: each window's rows in its span pair as runs do.
    /// By hand: block_service read means 100 (off) and 1100 (on) in pair 0, 120 and 1120 in
    /// pair 1 (order on, off): differences 1000, 1000 over the mean off 110: +909.1%; 50
    /// requests in a 0.8 s span: 62.5/s. A window whose monitor row is missing (no journal
    /// commit in it) drops that layer's pair only; a window the monitor did not cover (no
    /// entry) drops every layer's pair but keeps the workload's.
    #[test]
    fn windows_carry_the_monitor_layers() {
        use super::super::model::{OpStats, WindowStats};
        use crate::monitor::model::{LayerOp, MonitorResults, MonitorWindow, WindowDevice};
        use crate::spec::windows::WindowPlan;
        let l = |layer: &str, mean: f64| LayerOp {
            layer: layer.into(),
            op: "read".into(),
            count: 50,
            mean_us: mean,
            p50_us: mean,
            p95_us: mean,
            p99_us: mean,
            ..Default::default()
        };
        let mw = |index: u32, svc: f64, journal: bool| MonitorWindow {
            index,
            from_s: index as f64 + 0.2,
            to_s: index as f64 + 1.0,
            stack: if journal { vec![l("journal", 900.0)] } else { vec![] },
            devices: vec![WindowDevice { device: "/dev/loop9".into(), layers: vec![l("block_service", svc)], ..Default::default() }],
            ..Default::default()
        };
        let win = |index: u32, armed: bool| WindowStats {
            index,
            armed,
            pair: index / 2,
            read: OpStats { ops: 10, mean_us: 50.0, p50_us: 50.0, p95_us: 50.0, p99_us: 50.0, iops: 10.0, ..Default::default() },
            ..Default::default()
        };
        let windows = vec![mw(0, 100.0, true), mw(1, 1100.0, true), mw(2, 1120.0, false), mw(3, 120.0, true), mw(5, 1000.0, true)];
        let r = Repetition {
            windows: (0..6).map(|k| win(k, WindowPlan::armed(k))).collect(),
            monitor: Some(MonitorResults { windows, ..Default::default() }),
            ..Default::default()
        };
        let rows = rows(&[], &[r]);
        let get = |s: &str, m: &str| rows.iter().find(|x| x.source == s && x.metric == m).unwrap_or_else(|| panic!("no {s} {m}: {rows:?}"));
        let b = get("block_service", "mean_us");
        assert_eq!(b.pairs, 2, "window 4 has no monitor figures: pair 2 left out");
        assert!((b.baseline - 110.0).abs() < 1e-9 && (b.injected - 1110.0).abs() < 1e-9, "{b:?}");
        assert!((b.slowdown - 1000.0 / 110.0).abs() < 1e-12);
        assert!((get("block_service", THROUGHPUT).baseline - 62.5).abs() < 1e-9);
        assert_eq!(get("journal", "mean_us").pairs, 1, "window 2 saw no commit");
        assert_eq!(get("workload", "mean_us").pairs, 3);
    }

    /// Every layer of the monitor gives series: syscall, the pairs (fs, journal phases,
    /// driver), jbd2_run_stats in ms turned to µs (counts left out), block queue and service,
    /// the daemon, and the queue time's swing over intervals: queue means 2, 10, 6 µs in three
    /// intervals have sample sd sqrt(((2-6)^2 + (10-6)^2 + 0) / 2) = 4.
    #[test]
    fn series_cover_every_monitor_layer() {
        use crate::monitor::model::{DaemonOp, DeviceResults, Interval, IntervalOp, LayerOp, MonitorResults, Summed, SummedField};
        let l = |layer: &str, op: &str, mean: f64| LayerOp {
            layer: layer.into(),
            op: op.into(),
            count: 10,
            mean_us: mean,
            p50_us: mean,
            p95_us: mean,
            p99_us: mean,
            ..Default::default()
        };
        let iv = |t: f64, q: f64| Interval {
            t_s: t,
            ops: [("write".to_string(), IntervalOp { count: 3, queue_mean_us: q, ..Default::default() })].into(),
            ..Default::default()
        };
        let m = MonitorResults {
            duration_s: 2.0,
            syscalls: vec![l("syscall", "write", 50.0)],
            stack: vec![l("fs", "ext4_sync_file", 40.0), l("journal", "commit", 900.0), l("journal", "commit_locked", 30.0), l("driver", "fuse:write", 20.0)],
            summed: vec![Summed {
                layer: "journal".into(),
                event: "jbd2:jbd2_run_stats".into(),
                count: 4,
                hz: 250,
                fields: vec![
                    SummedField { name: "locked".into(), unit: "ms".into(), mean: 4.0, ..Default::default() },
                    SummedField { name: "blocks".into(), unit: "count".into(), mean: 12.0, ..Default::default() },
                ],
            }],
            devices: vec![DeviceResults {
                device: "/dev/loop9".into(),
                layers: vec![l("block_queue", "write", 6.0), l("block_service", "write", 25.0)],
                series: vec![iv(0.0, 2.0), iv(1.0, 10.0), iv(2.0, 6.0)],
                daemon: [("write".to_string(), DaemonOp { count: 10, service_mean_us: 15.0, delay_mean_us: 0.0 })].into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let r = Repetition { monitor: Some(m), ..Default::default() };
        let s = series(&r);
        let get = |a: &str, b: &str, c: &str| s.get(&(a.to_string(), b.to_string(), c.to_string())).copied();
        assert_eq!(get("syscall", "write", "mean_us"), Some(50.0));
        assert_eq!(get("fs", "ext4_sync_file", "p99_us"), Some(40.0));
        assert_eq!(get("journal", "commit", "mean_us"), Some(900.0));
        assert_eq!(get("journal", "commit_locked", THROUGHPUT), Some(5.0));
        assert_eq!(get("driver", "fuse:write", "mean_us"), Some(20.0));
        assert_eq!(get("journal", "jbd2_run_stats:locked", "mean_us"), Some(4000.0));
        assert_eq!(get("journal", "jbd2_run_stats:blocks", "mean_us"), None, "a count is no latency");
        assert_eq!(get("block_service", "write", "mean_us"), Some(25.0));
        assert_eq!(get("daemon", "write", "mean_us"), Some(15.0));
        assert!((get("block_queue", "write", QUEUE_SWING).unwrap() - 4.0).abs() < 1e-12);
        assert_eq!(queue_over_time(&r, "write"), vec![(0.0, 2.0), (1.0, 10.0), (2.0, 6.0)]);
        assert!(queue_over_time(&r, "read").is_empty());
    }
}
