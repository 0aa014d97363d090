//! The latency model of a disk (`disk: {latency: ...}`, `serve --latency FILE`): a service time
//! for every request, per op, so a RAM disk behaves like a device of known speed. docs/latency.md
//! has every key. The model is data here; the disk layer (`disk::latency`) samples and applies it.
//!
//! ```yaml
//! read: 50us                                       # fixed
//! write: {distribution: lognormal, median: 30us, sigma: 0.3, per_kib: 0.5us}
//! flush: {distribution: empirical, percentiles: {p1: 10us, p50: 20us, p99: 80us}}
//! discard: {distribution: histogram, bins: [{from: 10us, to: 20us, count: 5}]}
//! channels: 4                                      # at most 4 requests in service at once
//! seed: 7
//! ```

use super::rule::yaml::{RawDelay, WordOr, parse_delay};
use super::rule::{DelayDist, Op};
use super::units::Dur;
use serde::{Deserialize, Serialize};
use serde_saphyr::Spanned;
use std::collections::BTreeMap;
use std::time::Duration;

/// One op's base service time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ServiceDist {
    /// The forms delay rules take (fixed, uniform, normal, lognormal, pareto).
    Dist(DelayDist),
    /// An empirical distribution as its CDF: (cumulative fraction in [0, 1], time) points,
    /// both non-decreasing; sampled by linear interpolation between points, clamped to the
    /// first and last. A percentile table is these points; a histogram's bins become them.
    Empirical(Vec<(f64, Duration)>),
    /// A histogram as given (bins: from, to, count), kept for printing; sampled through
    /// `points`, its CDF (uniform within each bin).
    Histogram { bins: Vec<(Duration, Duration, u64)>, points: Vec<(f64, Duration)> },
}

impl ServiceDist {
    /// The CDF points of an empirical form.
    pub fn points(&self) -> Option<&[(f64, Duration)]> {
        match self {
            ServiceDist::Dist(_) => None,
            ServiceDist::Empirical(p) | ServiceDist::Histogram { points: p, .. } => Some(p),
        }
    }
}

/// One op's model: a base time plus a size term.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OpLatency {
    pub base: ServiceDist,
    /// Added per KiB of the request (a 128 KiB read takes 128 x this more).
    pub per_kib: Duration,
}

#[derive(Clone, Debug, PartialEq, Default, Serialize, Deserialize)]
pub struct LatencyModel {
    /// Per op, indexed by `Op as usize`; an op without a model is served at once.
    pub ops: [Option<OpLatency>; 4],
    /// At most this many requests in service at once (FIFO); `None`: unlimited.
    pub channels: Option<u32>,
    /// Requests each channel admits (in service plus queued in the device); the device holds
    /// at most `channels` x `depth`. `None`: no limit. Needs `channels`.
    #[serde(default)]
    pub depth: Option<u32>,
    pub seed: u64,
}

impl LatencyModel {
    pub fn op(&self, op: Op) -> Option<&OpLatency> {
        self.ops[op as usize].as_ref()
    }

    /// The model in the YAML form `parse_latency` reads (exact to the nanosecond): what
    /// `faultline calibrate` writes and what `run` hands its disk servers.
    pub fn to_yaml(&self) -> String {
        let mut s = String::new();
        for op in Op::ALL {
            let Some(m) = self.op(op) else { continue };
            s += &format!("{}:\n", op.name());
            match &m.base {
                ServiceDist::Dist(d) => {
                    let kv: Vec<(&str, String)> = match *d {
                        DelayDist::Fixed(v) => vec![("distribution", "fixed".into()), ("mean", ns(v))],
                        DelayDist::Uniform { min, max } => vec![("distribution", "uniform".into()), ("min", ns(min)), ("max", ns(max))],
                        DelayDist::Normal { mean, stddev } => vec![("distribution", "normal".into()), ("mean", ns(mean)), ("stddev", ns(stddev))],
                        DelayDist::Lognormal { median, sigma } => {
                            vec![("distribution", "lognormal".into()), ("median", ns(median)), ("sigma", format!("{sigma}"))]
                        }
                        DelayDist::Pareto { scale, shape } => vec![("distribution", "pareto".into()), ("scale", ns(scale)), ("shape", format!("{shape}"))],
                    };
                    for (k, v) in kv {
                        s += &format!("  {k}: {v}\n");
                    }
                }
                ServiceDist::Histogram { bins, .. } => {
                    s += "  distribution: histogram\n  bins:\n";
                    for (from, to, count) in bins {
                        s += &format!("    - {{from: {}, to: {}, count: {count}}}\n", ns(*from), ns(*to));
                    }
                }
                ServiceDist::Empirical(points) => {
                    s += "  distribution: empirical\n  percentiles:\n";
                    for (q, v) in points {
                        s += &format!("    p{}: {}\n", fmt_pct(q * 100.0), ns(*v));
                    }
                }
            }
            if !m.per_kib.is_zero() {
                s += &format!("  per_kib: {}\n", ns(m.per_kib));
            }
        }
        if let Some(c) = self.channels {
            s += &format!("channels: {c}\n");
        }
        if let Some(d) = self.depth {
            s += &format!("depth: {d}\n");
        }
        s += &format!("seed: {}\n", self.seed);
        s
    }
}

fn ns(d: Duration) -> String {
    format!("{}ns", d.as_nanos())
}

/// A percentile as short as it stays exact: 50, 99.9, 99.99.
fn fmt_pct(p: f64) -> String {
    let s = format!("{p:.4}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// The raw YAML of a model (a file's top level, or an experiment's `disk: {latency: {...}}`).
#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLatency {
    read: Option<Spanned<WordOr<RawOp>>>,
    write: Option<Spanned<WordOr<RawOp>>>,
    flush: Option<Spanned<WordOr<RawOp>>>,
    discard: Option<Spanned<WordOr<RawOp>>>,
    channels: Option<Spanned<u64>>,
    depth: Option<Spanned<u64>>,
    seed: Option<u64>,
}

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawOp {
    distribution: Option<String>,
    min: Option<Dur>,
    max: Option<Dur>,
    mean: Option<Dur>,
    stddev: Option<Dur>,
    median: Option<Dur>,
    sigma: Option<f64>,
    scale: Option<Dur>,
    shape: Option<f64>,
    /// `empirical`: `{p50: 20us, p99.9: 80us}`
    percentiles: Option<BTreeMap<String, Dur>>,
    /// `histogram`: `[{from: 10us, to: 20us, count: 5}]`
    bins: Option<Vec<RawBin>>,
    per_kib: Option<Dur>,
}

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawBin {
    from: Dur,
    to: Dur,
    count: u64,
}

pub const DISTRIBUTIONS: &str = "fixed, uniform, normal, lognormal, pareto, empirical, histogram";
/// A device with more channels than this is as good as unlimited; the bound keeps the
/// scheduler's per-request scan short.
pub const MAX_CHANNELS: u64 = 1024;
/// A depth beyond any real device's queue (NVMe allows 64 Ki; the kernel's loop and null_blk
/// default to 128 and 64).
pub const MAX_DEPTH: u64 = 65536;

/// Parse a latency file's text; errors name `source`, line and column.
pub fn parse_latency(text: &str, source: &str) -> Result<LatencyModel, String> {
    let raw: RawLatency = serde_saphyr::from_str(text).map_err(|e| super::yaml_error(source, &e))?;
    validate(raw, source)
}

pub fn parse_latency_file(path: &std::path::Path) -> Result<LatencyModel, String> {
    let text = super::read_text(path, "latency file")?;
    parse_latency(&text, &path.display().to_string())
}

pub(crate) fn validate(raw: RawLatency, source: &str) -> Result<LatencyModel, String> {
    let mut m = LatencyModel { seed: raw.seed.unwrap_or(0), ..Default::default() };
    for (op, r) in [(Op::Read, raw.read), (Op::Write, raw.write), (Op::Flush, raw.flush), (Op::Discard, raw.discard)] {
        if let Some(r) = r {
            let (l, c) = (r.referenced.line(), r.referenced.column());
            m.ops[op as usize] = Some(op_model(r.value).map_err(|e| format!("{source}:{l}:{c}: latency of {}: {e}", op.name()))?);
        }
    }
    if let Some(c) = raw.channels {
        if c.value == 0 || c.value > MAX_CHANNELS {
            return Err(format!(
                "{source}:{}:{}: `channels: {}` is out of range; allowed: 1 to {MAX_CHANNELS} (leave it out for unlimited)",
                c.referenced.line(),
                c.referenced.column(),
                c.value
            ));
        }
        m.channels = Some(c.value as u32);
    }
    if let Some(d) = raw.depth {
        let (l, c) = (d.referenced.line(), d.referenced.column());
        if m.channels.is_none() {
            return Err(format!("{source}:{l}:{c}: `depth` is per channel and needs `channels` (e.g. `channels: 16, depth: 64`)"));
        }
        if d.value == 0 || d.value > MAX_DEPTH {
            return Err(format!("{source}:{l}:{c}: `depth: {}` is out of range; allowed: 1 to {MAX_DEPTH} (leave it out for no limit)", d.value));
        }
        m.depth = Some(d.value as u32);
    }
    Ok(m)
}

fn op_model(r: WordOr<RawOp>) -> Result<OpLatency, String> {
    let r = match r {
        WordOr::Word(w) => return Ok(OpLatency { base: ServiceDist::Dist(parse_delay(WordOr::Word(w))?), per_kib: Duration::ZERO }),
        WordOr::Map(r) => r,
    };
    let per_kib = r.per_kib.map_or(Duration::ZERO, |d| d.0);
    let dist = r.distribution.clone().unwrap_or_else(|| if r.mean.is_some() { "fixed".into() } else { String::new() });
    let only = |allowed: &[&str]| -> Result<(), String> {
        let given = [
            ("min", r.min.is_some()),
            ("max", r.max.is_some()),
            ("mean", r.mean.is_some()),
            ("stddev", r.stddev.is_some()),
            ("median", r.median.is_some()),
            ("sigma", r.sigma.is_some()),
            ("scale", r.scale.is_some()),
            ("shape", r.shape.is_some()),
            ("percentiles", r.percentiles.is_some()),
            ("bins", r.bins.is_some()),
        ];
        match given.iter().find(|(k, set)| *set && !allowed.contains(k)) {
            Some((k, _)) => {
                Err(format!("`{k}` does not belong to distribution `{dist}`; it takes {}", if allowed.is_empty() { "none".into() } else { allowed.join(", ") }))
            }
            None => Ok(()),
        }
    };
    let base = match dist.as_str() {
        // only a size term: no base time
        "" if r.per_kib.is_some() => {
            only(&[])?;
            ServiceDist::Dist(DelayDist::Fixed(Duration::ZERO))
        }
        "" => return Err(format!("give a `distribution` ({DISTRIBUTIONS}), a `mean` (fixed), or a duration such as `50us`")),
        "empirical" => {
            only(&["percentiles"])?;
            ServiceDist::Empirical(percentile_points(r.percentiles.as_ref().ok_or("distribution empirical needs `percentiles`, e.g. {p50: 20us, p99: 80us}")?)?)
        }
        "histogram" => {
            only(&["bins"])?;
            let bins = r.bins.as_ref().ok_or("distribution histogram needs `bins`, e.g. [{from: 10us, to: 20us, count: 5}]")?;
            let points = histogram_points(bins)?;
            ServiceDist::Histogram { bins: bins.iter().map(|b| (b.from.0, b.to.0, b.count)).collect(), points }
        }
        d => {
            let allowed: &[&str] = match d {
                "fixed" => &["mean", "min"],
                "uniform" => &["min", "max"],
                "normal" => &["mean", "stddev"],
                "lognormal" => &["median", "sigma"],
                "pareto" => &["scale", "shape"],
                _ => &[],
            };
            if !allowed.is_empty() {
                only(allowed)?;
            }
            let raw = RawDelay {
                distribution: d.to_string(),
                min: r.min,
                max: r.max,
                mean: r.mean,
                stddev: r.stddev,
                median: r.median,
                sigma: r.sigma,
                scale: r.scale,
                shape: r.shape,
            };
            ServiceDist::Dist(
                parse_delay(WordOr::Map(raw))
                    .map_err(|e| e.replace("allowed: fixed, uniform, normal, lognormal, pareto", &format!("allowed: {DISTRIBUTIONS}")))?,
            )
        }
    };
    Ok(OpLatency { base, per_kib })
}

fn percentile_points(t: &BTreeMap<String, Dur>) -> Result<Vec<(f64, Duration)>, String> {
    let mut v = Vec::with_capacity(t.len());
    for (k, d) in t {
        let p: f64 = k
            .strip_prefix('p')
            .and_then(|n| n.parse().ok())
            .filter(|p: &f64| (0.0..=100.0).contains(p))
            .ok_or_else(|| format!("percentile key `{k}` is not allowed; allowed: p0 to p100, e.g. p50, p99.9"))?;
        v.push((p / 100.0, d.0));
    }
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    if let Some(w) = v.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(format!("percentile p{} is given twice", fmt_pct(w[0].0 * 100.0)));
    }
    if v.is_empty() {
        return Err("`percentiles` is empty; give at least one, e.g. {p50: 20us}".into());
    }
    for w in v.windows(2) {
        if w[1].1 < w[0].1 {
            return Err(format!(
                "percentiles must not decrease: p{} is {:?} but p{} is {:?}",
                fmt_pct(w[0].0 * 100.0),
                w[0].1,
                fmt_pct(w[1].0 * 100.0),
                w[1].1
            ));
        }
    }
    Ok(v)
}

fn histogram_points(bins: &[RawBin]) -> Result<Vec<(f64, Duration)>, String> {
    let mut b: Vec<&RawBin> = bins.iter().collect();
    b.sort_by_key(|b| b.from.0);
    // the total must fit in a u64: a wrapped sum would make the cumulative points go backwards
    let total = b
        .iter()
        .try_fold(0u64, |t, b| t.checked_add(b.count))
        .ok_or("the bins' counts add up to more than 2^64 - 1; allowed: counts whose sum fits in 64 bits (only their ratios matter)")?;
    if total == 0 {
        return Err("`bins` hold no counts; give at least one bin with `count` > 0".into());
    }
    let mut v = Vec::with_capacity(2 * b.len());
    let mut acc = 0u64;
    let mut prev_to = Duration::ZERO;
    for x in b {
        if x.to.0 < x.from.0 {
            return Err(format!("bin from {:?} to {:?}: `to` must be >= `from`", x.from.0, x.to.0));
        }
        if x.from.0 < prev_to {
            return Err(format!("bins overlap at {:?}; bins must not overlap", x.from.0));
        }
        prev_to = x.to.0;
        if x.count == 0 {
            continue;
        }
        v.push((acc as f64 / total as f64, x.from.0));
        acc += x.count;
        v.push((acc as f64 / total as f64, x.to.0));
    }
    Ok(v)
}

/// The inverse CDF of empirical points at `u` in [0, 1]: linear between points.
pub fn empirical_at(points: &[(f64, Duration)], u: f64) -> Duration {
    let i = points.partition_point(|p| p.0 < u);
    if i == 0 {
        return points[0].1;
    }
    if i == points.len() {
        return points[i - 1].1;
    }
    let (a, b) = (points[i - 1], points[i]);
    if b.0 <= a.0 {
        return b.1;
    }
    let f = (u - a.0) / (b.0 - a.0);
    a.1 + (b.1 - a.1).mul_f64(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms_parse() {
        let m = parse_latency(
            "read: 50us\nwrite: {distribution: lognormal, median: 30us, sigma: 0.3, per_kib: 0.5us}\nflush: {distribution: empirical, percentiles: {p50: 20us, p1: 10us, p99.9: 80us}}\ndiscard: {distribution: histogram, bins: [{from: 10us, to: 20us, count: 3}, {from: 30us, to: 40us, count: 1}]}\nchannels: 4\nseed: 9\n",
            "m.yaml",
        )
        .unwrap();
        assert_eq!(m.op(Op::Read).unwrap().base, ServiceDist::Dist(DelayDist::Fixed(Duration::from_micros(50))));
        assert_eq!(m.op(Op::Write).unwrap().per_kib, Duration::from_nanos(500));
        let ServiceDist::Empirical(f) = &m.op(Op::Flush).unwrap().base else { panic!() };
        let want = [(0.01, 10), (0.5, 20), (0.999, 80)];
        assert_eq!(f.len(), 3);
        for ((q, v), (wq, wv)) in f.iter().zip(want) {
            assert!((q - wq).abs() < 1e-12 && *v == Duration::from_micros(wv), "{f:?}");
        }
        let h = m.op(Op::Discard).unwrap().base.points().unwrap();
        assert_eq!(h.len(), 4);
        assert_eq!(empirical_at(h, 0.375), Duration::from_micros(15));
        assert_eq!(empirical_at(h, 0.875), Duration::from_micros(35));
        assert_eq!((m.channels, m.seed), (Some(4), 9));
        // printed and read back: the same model
        assert_eq!(parse_latency(&m.to_yaml(), "again").unwrap(), m);
    }

    #[test]
    fn interpolation_and_clamping() {
        let p = vec![(0.1, Duration::from_micros(10)), (0.9, Duration::from_micros(90))];
        assert_eq!(empirical_at(&p, 0.0), Duration::from_micros(10));
        assert_eq!(empirical_at(&p, 0.5), Duration::from_micros(50));
        assert_eq!(empirical_at(&p, 1.0), Duration::from_micros(90));
    }

    #[test]
    fn errors_have_line_column_and_what_is_allowed() {
        let e = parse_latency("read: 50us\nwrite: {distribution: gamma, mean: 3us}\n", "m.yaml").unwrap_err();
        assert!(e.starts_with("m.yaml:2:") && e.contains("allowed: fixed, uniform, normal, lognormal, pareto, empirical, histogram"), "{e}");
        let e = parse_latency("read:\n  distribution: empirical\n  percentiles: {p50: 20us, p90: 10us}\n", "m.yaml").unwrap_err();
        assert!(e.starts_with("m.yaml:2:") && e.contains("must not decrease"), "{e}");
        let e = parse_latency("read: {distribution: empirical, percentiles: {x50: 20us}}\n", "m.yaml").unwrap_err();
        assert!(e.contains("m.yaml:1:") && e.contains("p0 to p100"), "{e}");
        let e = parse_latency("channels: 0\n", "m.yaml").unwrap_err();
        assert!(e.starts_with("m.yaml:1:") && e.contains("allowed: 1 to"), "{e}");
        let e = parse_latency("read: 50us\ndepth: 64\n", "m.yaml").unwrap_err();
        assert!(e.starts_with("m.yaml:2:") && e.contains("needs `channels`"), "{e}");
        let e = parse_latency("channels: 16\ndepth: 0\n", "m.yaml").unwrap_err();
        assert!(e.starts_with("m.yaml:2:") && e.contains("allowed: 1 to 65536"), "{e}");
        let m = parse_latency("read: 5us\nchannels: 16\ndepth: 64\n", "m.yaml").unwrap();
        assert_eq!((m.channels, m.depth), (Some(16), Some(64)));
        assert_eq!(parse_latency(&m.to_yaml(), "again").unwrap(), m);
        let e = parse_latency("read: 50us\nreads: 3us\n", "m.yaml").unwrap_err();
        assert!(e.starts_with("m.yaml:2:"), "{e}");
        let e = parse_latency("read: 50\n", "m.yaml").unwrap_err();
        assert!(e.starts_with("m.yaml:1:"), "{e}");
        let e = parse_latency("read: {mean: 50}\n", "m.yaml").unwrap_err();
        assert!(e.contains("m.yaml") && e.contains("no unit"), "{e}");
        let e = parse_latency("read: {distribution: uniform, min: 3us, max: 5us, median: 4us}\n", "m.yaml").unwrap_err();
        assert!(e.contains("`median` does not belong"), "{e}");
        let max = u64::MAX;
        let e = parse_latency(
            &format!("read:\n  distribution: histogram\n  bins: [{{from: 1us, to: 2us, count: {max}}}, {{from: 2us, to: 3us, count: 2}}]\n"),
            "m.yaml",
        )
        .unwrap_err();
        assert!(e.starts_with("m.yaml:2:") && e.contains("add up to more than 2^64 - 1"), "{e}");
    }
}
