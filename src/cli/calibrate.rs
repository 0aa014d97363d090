//! `faultline calibrate`: fit a latency model (docs/latency.md) to a real device, write it as
//! YAML, then serve a faultline disk with it, run the same fio job there and compare.
//!
//! The fit, per op the job measured: an empirical percentile table of the completion latencies
//! fio saw (every I/O from fio's latency log when we run fio; the percentiles of a JSON result
//! the user brings). From every point we subtract one constant: the median completion latency
//! of the same job on a faultline disk without a model (its own path: kernel, FUSE, loop
//! device), because the model's time runs from the request's arrival at the daemon and that
//! path comes on top. Nothing cleverer (no deconvolution): the shape of the real device's
//! distribution is kept as measured, shifted by the base path's median. That first fit is then
//! served and measured once, and whatever its median still differs from the device's (a
//! modelled reply goes out from a timer while the client sleeps, which costs more than the
//! base path's immediate reply) is taken off too, bounded by half the device's median: one
//! correction step, still one constant for the whole table. `--no-subtract` keeps
//! the raw table. With two block sizes (`--bs 4k,128k`), the size term is the difference of
//! the medians per KiB (base path's own difference taken off), and the table is the smaller
//! size's, less its size term.

use crate::run::disks::DiskServer;
use crate::spec::disk::{DiskConfig, DiskSpec};
use crate::spec::latency::{LatencyModel, OpLatency, ServiceDist};
use crate::spec::rule::Op;
use anyhow::{Context, Result, bail};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

#[derive(clap::Args, Debug)]
pub struct CalibrateArgs {
    /// The real device (or a file on it) to measure with fio. Read-only unless --destructive
    /// names it.
    target: Option<PathBuf>,
    /// Fit to a fio result instead of running fio: a JSON output (`--output-format=json`,
    /// clat percentiles) or a completion-latency log (`--write_lat_log`, the `_clat` file).
    #[arg(long, value_name = "FILE", conflicts_with = "target")]
    from_fio: Option<PathBuf>,
    /// fio's `rw` (randread, read, randwrite, write, randrw).
    #[arg(long, default_value = "randread")]
    rw: String,
    /// Block size; two, comma-separated (e.g. 4k,128k), also fit the size term.
    #[arg(long, default_value = "4k")]
    bs: String,
    #[arg(long, default_value_t = 1)]
    iodepth: u32,
    /// Seconds per fio run.
    #[arg(long, default_value_t = 10)]
    runtime: u32,
    /// The region the job covers (fio `size`), and the faultline disk's size.
    #[arg(long, default_value = "1GiB", value_parser = crate::cli::calibrate::size_arg)]
    size: u64,
    /// Allow a job that writes, on this device only (it must be the target).
    #[arg(long, value_name = "DEVICE")]
    destructive: Option<PathBuf>,
    /// `channels` of the written model (default: none, unlimited).
    #[arg(long)]
    channels: Option<u32>,
    /// Keep the measured table as it is (do not take off the faultline disk's own path).
    #[arg(long)]
    no_subtract: bool,
    /// Write the model and stop (no comparison run).
    #[arg(long)]
    no_compare: bool,
    /// Where the model goes.
    #[arg(short, long, default_value = "calibrated.yaml")]
    out: PathBuf,
}

pub fn size_arg(s: &str) -> std::result::Result<u64, String> {
    crate::spec::units::parse_size(s)
}

/// The fio job, run on the real device and on faultline disks alike.
#[derive(Clone, Debug)]
struct Job {
    rw: String,
    bs: u64,
    iodepth: u32,
    runtime: u32,
    size: u64,
}

/// One op's measured completion latencies (ns).
#[derive(Clone, Debug, Default)]
struct Measured {
    mean: f64,
    /// percentile (0..100) -> ns
    pct: BTreeMap<u64, f64>,
    /// every completion, when fio's latency log was read
    samples: Vec<u64>,
}

impl Measured {
    fn at(&self, p: f64) -> f64 {
        if !self.samples.is_empty() {
            return quantile(&self.samples, p / 100.0);
        }
        self.pct.get(&key(p)).copied().unwrap_or(f64::NAN)
    }
}

fn key(p: f64) -> u64 {
    (p * 1e4).round() as u64
}

/// fio's clat percentiles to ask for (at most 20 by fio's limit).
const FIO_PCTS: &str = "1:5:10:20:30:40:50:60:70:80:90:95:99:99.5:99.9:99.99";
/// The table fitted from a latency log (every completion).
const GRID: &[f64] = &[
    0.0, 0.5, 1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 25.0, 30.0, 35.0, 40.0, 45.0, 50.0, 55.0, 60.0, 65.0, 70.0, 75.0, 80.0, 85.0, 90.0, 92.5, 95.0, 96.0,
    97.0, 98.0, 99.0, 99.5, 99.9, 99.95, 99.99, 100.0,
];

fn quantile(sorted: &[u64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i.min(sorted.len() - 1)] as f64
}

fn writes(rw: &str) -> bool {
    !matches!(rw, "read" | "randread")
}

/// Run fio on `dev`; with `lat_log`, read every completion from fio's latency log too.
fn fio(dev: &Path, job: &Job, lat_log: bool, destructive: bool) -> Result<BTreeMap<Op, Measured>> {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let tmp = std::env::temp_dir().join(format!("faultline-calibrate-{}-{}", std::process::id(), N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)));
    std::fs::create_dir_all(&tmp)?;
    // the latency log goes away with the directory, whatever happens below
    struct Gone(PathBuf);
    impl Drop for Gone {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    let tmp = Gone(tmp);
    let prefix = tmp.0.join("lat");
    let mut c = Command::new("fio");
    c.args(["--name=calibrate", "--direct=1", "--time_based", "--output-format=json", "--randrepeat=0"])
        .arg(format!("--filename={}", dev.display()))
        .arg(format!("--rw={}", job.rw))
        .arg(format!("--bs={}", job.bs))
        .arg(format!("--iodepth={}", job.iodepth))
        .arg(format!("--ioengine={}", if job.iodepth > 1 { "libaio" } else { "psync" }))
        .arg(format!("--runtime={}", job.runtime))
        .arg(format!("--size={}", job.size))
        .arg(format!("--percentile_list={FIO_PCTS}"));
    if !destructive {
        c.arg("--readonly");
    }
    if lat_log {
        c.arg(format!("--write_lat_log={}", prefix.display())).arg("--log_avg_msec=0");
    }
    let out = c.output().context("cannot run fio (is it installed?)")?;
    if !out.status.success() {
        bail!("fio failed on {}: {}", dev.display(), String::from_utf8_lossy(&out.stderr).trim());
    }
    let j: Value = serde_json::from_slice(&out.stdout).context("fio's JSON output")?;
    let mut m = from_json(&j)?;
    if lat_log {
        let log = tmp.0.join("lat_clat.1.log");
        let samples = from_lat_log(&std::fs::read_to_string(&log).with_context(|| format!("fio's latency log {}", log.display()))?)?;
        for (op, s) in samples {
            m.entry(op).or_default().samples = s;
        }
    }
    Ok(m)
}

fn from_json(j: &Value) -> Result<BTreeMap<Op, Measured>> {
    let job = j["jobs"].get(0).context("no job in the fio JSON")?;
    let mut out = BTreeMap::new();
    for (op, dir) in [(Op::Read, "read"), (Op::Write, "write")] {
        let c = &job[dir]["clat_ns"];
        if job[dir]["total_ios"].as_u64().unwrap_or(0) == 0 || c.is_null() {
            continue;
        }
        let pct = c["percentile"]
            .as_object()
            .context("the fio JSON has no clat percentiles (fio was run with clat_percentiles=0?)")?
            .iter()
            .filter_map(|(k, v)| Some((key(k.parse().ok()?), v.as_f64()?)))
            .collect();
        out.insert(op, Measured { mean: c["mean"].as_f64().unwrap_or(f64::NAN), pct, samples: vec![] });
    }
    if out.is_empty() {
        bail!("the fio JSON holds no completed reads or writes");
    }
    Ok(out)
}

/// fio's latency log: `time_ms, value_ns, ddir, bs, ...` per completion.
fn from_lat_log(text: &str) -> Result<BTreeMap<Op, Vec<u64>>> {
    let mut out: BTreeMap<Op, Vec<u64>> = BTreeMap::new();
    for (i, l) in text.lines().enumerate() {
        let f: Vec<&str> = l.split(',').map(|s| s.trim()).collect();
        if l.trim().is_empty() {
            continue;
        }
        let (Some(v), Some(d)) = (f.get(1).and_then(|v| v.parse::<u64>().ok()), f.get(2).and_then(|v| v.parse::<u8>().ok())) else {
            bail!("line {}: not a fio latency log line (time, latency ns, direction, block size): {l:?}", i + 1);
        };
        let op = match d {
            0 => Op::Read,
            1 => Op::Write,
            _ => continue,
        };
        out.entry(op).or_default().push(v);
    }
    for v in out.values_mut() {
        v.sort_unstable();
    }
    if out.is_empty() {
        bail!("the latency log holds no reads or writes");
    }
    Ok(out)
}

fn measured_from_file(p: &Path) -> Result<(BTreeMap<Op, Measured>, Option<Job>)> {
    let text = std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))?;
    if text.trim_start().starts_with('{') {
        let j: Value = serde_json::from_str(&text).with_context(|| format!("{}: not valid JSON", p.display()))?;
        let o = |k: &str| j["jobs"][0]["job options"][k].as_str().or(j["global options"][k].as_str()).map(str::to_string);
        let job = Job {
            rw: o("rw").unwrap_or_else(|| "randread".into()),
            bs: o("bs").and_then(|b| crate::spec::units::parse_size(&b).ok()).unwrap_or(4096),
            iodepth: o("iodepth").and_then(|d| d.parse().ok()).unwrap_or(1),
            runtime: 0,
            size: 0,
        };
        Ok((from_json(&j).with_context(|| p.display().to_string())?, Some(job)))
    } else {
        let s = from_lat_log(&text).with_context(|| p.display().to_string())?;
        let m = s
            .into_iter()
            .map(|(op, samples)| {
                let mean = samples.iter().map(|&x| x as f64).sum::<f64>() / samples.len() as f64;
                (op, Measured { mean, pct: BTreeMap::new(), samples })
            })
            .collect();
        Ok((m, None))
    }
}

/// The table for one op: each measured point (percentile p) less `shift(p)` ns, clamped at 0.
fn table(m: &Measured, shift: impl Fn(f64) -> f64) -> Vec<(f64, Duration)> {
    let pts: Vec<(f64, f64)> =
        if m.samples.is_empty() { m.pct.iter().map(|(k, v)| (*k as f64 / 1e4, *v)).collect() } else { GRID.iter().map(|&p| (p, m.at(p))).collect() };
    let mut out: Vec<(f64, Duration)> = pts.into_iter().map(|(p, v)| (p / 100.0, Duration::from_nanos((v - shift(p)).max(0.0).round() as u64))).collect();
    // fio's histogram percentiles are non-decreasing; keep them so after rounding
    for i in 1..out.len() {
        if out[i].1 < out[i - 1].1 {
            out[i].1 = out[i - 1].1;
        }
    }
    out
}

fn serve(size: u64, model: Option<LatencyModel>) -> Result<DiskServer> {
    let d = DiskSpec { disk: DiskConfig { size: Some(size), latency: model, populate: Some(true), ..DiskConfig::default() }, front: Default::default() };
    DiskServer::start(&d, 0)
}

fn on_faultline(size: u64, model: Option<LatencyModel>, job: &Job) -> Result<BTreeMap<Op, Measured>> {
    let s = serve(size, model)?;
    let r = fio(&s.device, job, false, true);
    s.stop()?;
    r
}

/// Like `on_faultline`, with every completion (fio's latency log).
fn on_faultline_logged(size: u64, model: Option<LatencyModel>, job: &Job) -> Result<BTreeMap<Op, Measured>> {
    let s = serve(size, model)?;
    let r = fio(&s.device, job, true, true);
    s.stop()?;
    r
}

pub fn calibrate(a: CalibrateArgs) -> Result<()> {
    let sizes: Vec<u64> =
        a.bs.split(',').map(|b| crate::spec::units::parse_size(b.trim())).collect::<std::result::Result<_, _>>().map_err(anyhow::Error::msg)?;
    if sizes.is_empty() || sizes.len() > 2 || sizes.iter().any(|b| *b == 0 || b % 512 != 0) {
        bail!("--bs {}: give one or two block sizes, multiples of 512 (e.g. 4k or 4k,128k)", a.bs);
    }
    let mut job = Job { rw: a.rw.clone(), bs: sizes[0], iodepth: a.iodepth.max(1), runtime: a.runtime.max(1), size: a.size };
    // what was measured, per block size
    let mut real: Vec<(u64, BTreeMap<Op, Measured>)> = Vec::new();
    let source;
    match (&a.target, &a.from_fio) {
        (Some(t), None) => {
            let destructive = a.destructive.as_ref().is_some_and(|d| same_file(d, t));
            if let Some(d) = a.destructive.as_ref().filter(|_| !destructive) {
                bail!("--destructive names {}, not the target {}; a device is written only when --destructive names it", d.display(), t.display());
            }
            if writes(&job.rw) && !destructive {
                bail!("--rw {} writes to {}; calibrate never writes to a device unless --destructive names it (or use --rw randread)", job.rw, t.display());
            }
            for &bs in &sizes {
                eprintln!(
                    "faultline calibrate: measuring {} ({} {} B, QD{}, {} s){}",
                    t.display(),
                    job.rw,
                    bs,
                    job.iodepth,
                    job.runtime,
                    if destructive { "" } else { ", read-only" }
                );
                real.push((bs, fio(t, &Job { bs, ..job.clone() }, true, destructive)?));
            }
            source = format!("fio {} bs={} iodepth={} on {}", job.rw, a.bs, job.iodepth, t.display());
        }
        (None, Some(f)) => {
            if sizes.len() > 1 {
                bail!("--from-fio fits one block size; the size term needs two measured sizes (run calibrate on the device)");
            }
            let (m, j) = measured_from_file(f)?;
            if let Some(j) = j {
                job.rw = j.rw;
                job.bs = j.bs;
                job.iodepth = j.iodepth;
            }
            real.push((job.bs, m));
            source = format!("fio result {}", f.display());
        }
        _ => bail!("give a device (or a file on it) to measure, or --from-fio FILE"),
    }
    // the faultline disk's own path, same job, no model
    let mut base: Vec<(u64, BTreeMap<Op, Measured>)> = Vec::new();
    if !a.no_subtract {
        for &(bs, _) in &real {
            eprintln!("faultline calibrate: measuring a faultline disk without a model ({bs} B)");
            base.push((bs, on_faultline(a.size, None, &Job { bs, runtime: job.runtime.min(5), ..job.clone() })?));
        }
    }
    let p50 = |v: &[(u64, BTreeMap<Op, Measured>)], i: usize, op: Op| v.get(i).and_then(|x| x.1.get(&op)).map_or(0.0, |m| m.at(50.0));
    // `extra`: per op, the first fit served and measured: what its median still costs beyond
    // the device's (a reply due later goes out from a timer, and the client sleeps through it)
    let fit = |extra: &BTreeMap<Op, Measured>| {
        let mut model = LatencyModel { channels: a.channels, ..Default::default() };
        for (op, m) in &real[0].1 {
            let base_p50 = p50(&base, 0, *op);
            let probe = extra.get(op);
            // one constant for all percentiles: the shape stays as measured (a per-percentile
            // correction followed the probe's noise and flattened the table); bounded by half
            // the device's median so that one noisy probe cannot wreck it
            let shift = |_p: f64| {
                let Some(f) = probe else { return base_p50 };
                let r50 = m.at(50.0);
                base_p50 + (f.at(50.0) - r50).clamp(-0.5 * r50, 0.5 * r50)
            };
            let per_kib = if real.len() == 2 {
                let kib = (real[1].0 as f64 - real[0].0 as f64) / 1024.0;
                let d = (p50(&real, 1, *op) - p50(&real, 0, *op)) - (p50(&base, 1, *op) - p50(&base, 0, *op));
                (d / kib).max(0.0)
            } else {
                0.0
            };
            let size_part = per_kib * real[0].0 as f64 / 1024.0;
            model.ops[*op as usize] =
                Some(OpLatency { base: ServiceDist::Empirical(table(m, |p| shift(p) + size_part)), per_kib: Duration::from_nanos(per_kib.round() as u64) });
        }
        model
    };
    let mut extra = BTreeMap::new();
    if !a.no_subtract {
        // one correction step: serve the first fit, and take off what the medians still differ
        let (bs, r) = &real[0];
        eprintln!("faultline calibrate: probing the first fit on a faultline disk ({bs} B)");
        let _ = r;
        extra = on_faultline_logged(a.size, Some(fit(&extra)), &Job { bs: *bs, ..job.clone() })?;
    }
    let model = fit(&extra);
    let text = format!(
        "# faultline latency model (docs/latency.md), fitted by `faultline calibrate` to {source}\n# table: measured completion latencies{}\n{}",
        if a.no_subtract {
            "".to_string()
        } else {
            " less the faultline disk's own path (its median, then per percentile what a served first fit still differed by)".to_string()
        },
        model.to_yaml()
    );
    std::fs::write(&a.out, &text).with_context(|| format!("cannot write {}", a.out.display()))?;
    println!("model: {}", a.out.display());
    if a.no_compare {
        return Ok(());
    }
    let mut all_ok = true;
    for (bs, r) in &real {
        eprintln!("faultline calibrate: the same job on a faultline disk with the model ({bs} B)");
        let f = on_faultline(a.size, Some(model.clone()), &Job { bs: *bs, ..job.clone() })?;
        for (op, rm) in r {
            let Some(fm) = f.get(op) else { continue };
            println!("{} {} B QD{}:  {:>6} {:>12} {:>12} {:>8}", op.name(), bs, job.iodepth, "", "real µs", "faultline µs", "ratio");
            let rows = [
                ("mean", rm.mean, fm.mean, 0.05),
                ("p50", rm.at(50.0), fm.at(50.0), 0.05),
                ("p90", rm.at(90.0), fm.at(90.0), 0.05),
                ("p95", rm.at(95.0), fm.at(95.0), 0.10),
                ("p99", rm.at(99.0), fm.at(99.0), f64::INFINITY),
            ];
            for (name, x, y, tol) in rows {
                let ratio = y / x;
                let ok = (ratio - 1.0).abs() <= tol;
                all_ok &= ok;
                println!(
                    "  {name:>6} {:>12.1} {:>12.1} {:>8.3}{}",
                    x / 1e3,
                    y / 1e3,
                    ratio,
                    if tol.is_finite() { if ok { "  ok" } else { "  OFF" } } else { "" }
                );
            }
        }
    }
    println!("goal (mean, p50, p90 within 5%, p95 within 10%): {}", if all_ok { "met" } else { "not met" });
    Ok(())
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lat_log_and_table() {
        let m = from_lat_log("0, 300, 0, 4096, 0\n1, 100, 0, 4096, 0\n1, 200, 0, 4096, 0\n2, 999, 1, 4096, 0\n").unwrap();
        assert_eq!(m[&Op::Read], vec![100, 200, 300]);
        assert_eq!(m[&Op::Write], vec![999]);
        let me = Measured { mean: 200.0, pct: BTreeMap::new(), samples: m[&Op::Read].clone() };
        let t = table(&me, |_| 50.0);
        assert_eq!(t.first().unwrap(), &(0.0, Duration::from_nanos(50)));
        assert_eq!(t.last().unwrap(), &(1.0, Duration::from_nanos(250)));
        assert!(from_lat_log("x y z\n").unwrap_err().to_string().contains("line 1"));
    }
}
