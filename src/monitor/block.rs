//! Loader of src/monitor/bpf/block.bpf.c: block-layer queue and service time per device and
//! op, aggregated in the kernel. `BlockMonitor::start` loads and attaches the programs on a
//! thread of their own (the skeleton borrows its object, so it lives on that thread's stack),
//! which drains the per-interval counters as intervals end; `stop` detaches and returns
//! the results.

use super::hist;
use super::model::{BLOCK_LAYERS, Depth, DeviceResults, Interval, IntervalOp, LayerOp, MonitorResults, OPS, SCHEMA};
use anyhow::{Context, Result, anyhow, bail};
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{Link, MapCore, MapFlags};
use std::mem::MaybeUninit;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::mpsc;
use std::time::{Duration, Instant};

#[allow(
    clippy::all,
    clippy::pedantic,
    clippy::undocumented_unsafe_blocks,
    dead_code,
    unused_imports,
    unsafe_op_in_unsafe_fn,
    non_camel_case_types,
    non_snake_case,
    non_upper_case_globals
)]
mod skel {
    include!(concat!(env!("OUT_DIR"), "/block.skel.rs"));
}
use skel::{BlockSkel, BlockSkelBuilder, OpenBlockSkel};

// block.h
const MAX_DEVS: usize = 16;
const NR_LAYERS: usize = 2;
const NR_OPS: usize = 5;
const DEPTH_BUCKETS: usize = 129;
const NR_SLOTS: u64 = 128;

/// A watched block device.
#[derive(Clone, Debug)]
pub struct Watched {
    pub path: PathBuf,
    pub major: u32,
    pub minor: u32,
}

impl Watched {
    pub fn new(path: &Path) -> Result<Watched> {
        let md = std::fs::metadata(path).with_context(|| format!("cannot stat {}", path.display()))?;
        if !md.file_type().is_block_device() {
            bail!("{} is not a block device", path.display());
        }
        let (major, minor) = crate::sys::loopdev::dev_number(path).context("no device number")?;
        Ok(Watched { path: path.to_path_buf(), major, minor })
    }

    /// dev_t as the kernel encodes it inside (MKDEV: major << 20 | minor).
    fn kernel_dev(&self) -> u32 {
        (self.major << 20) | self.minor
    }
}

/// A running block monitor.
pub type BlockMonitor = super::Running<MonitorResults>;

impl BlockMonitor {
    /// Load and attach; returns once the programs run, or with the reason they cannot.
    pub fn start(devices: &[PathBuf], interval: Duration) -> Result<BlockMonitor> {
        if devices.is_empty() || devices.len() > MAX_DEVS {
            bail!("the block monitor watches 1 to {MAX_DEVS} devices, not {}", devices.len());
        }
        let watched = devices.iter().map(|d| Watched::new(d)).collect::<Result<Vec<_>>>()?;
        let interval = interval.max(Duration::from_millis(10));
        BlockMonitor::spawn("monitor-block", Box::new(move |ready, stop| run(&watched, interval, ready, stop)))
    }
}

/// libbpf's messages of the current load attempt, to name the reason when it fails.
pub(super) static LIBBPF_LOG: Mutex<Vec<String>> = Mutex::new(Vec::new());

pub(super) fn libbpf_print(_level: libbpf_rs::PrintLevel, msg: String) {
    if let Ok(mut v) = LIBBPF_LOG.lock()
        && v.len() < 200
    {
        v.push(msg.trim_end().to_string());
    }
}

pub(super) fn libbpf_log_tail() -> String {
    let v = LIBBPF_LOG.lock().map(|mut v| std::mem::take(&mut *v)).unwrap_or_default();
    let tail: Vec<_> = v.iter().rev().take(6).rev().cloned().collect();
    if tail.is_empty() { String::new() } else { format!("\nlibbpf: {}", tail.join("\nlibbpf: ")) }
}

/// How many times the kernel skipped `prog` because it was already running on the same CPU
/// (BPF's recursion guard: e.g. a completion interrupt arriving while the completion program
/// runs for another request); each skip may be an event not counted.
pub(super) fn recursion_misses(prog: &impl std::os::fd::AsFd) -> u64 {
    use std::os::fd::AsRawFd;
    let mut info = libbpf_rs::libbpf_sys::bpf_prog_info::default();
    let mut len = std::mem::size_of_val(&info) as u32;
    // SAFETY: `info` is a writable bpf_prog_info of `len` bytes, which the kernel fills (up to
    // len) for the program behind the valid fd; no pointers in it are set for it to follow.
    let rc = unsafe { libbpf_rs::libbpf_sys::bpf_prog_get_info_by_fd(prog.as_fd().as_raw_fd(), &mut info, &mut len) };
    if rc == 0 { info.recursion_misses } else { 0 }
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC is bpf_ktime_get_ns's clock.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC)");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Which program set to load: tp_btf (BTF-typed arguments, cheapest) or raw_tp.
#[derive(Clone, Copy, PartialEq)]
enum Flavor {
    TpBtf,
    RawTp,
}

fn open_flavor<'o>(storage: &'o mut MaybeUninit<libbpf_rs::OpenObject>, flavor: Flavor, t0: u64, interval: Duration) -> Result<OpenBlockSkel<'o>> {
    let mut open = BlockSkelBuilder::default().open(storage).context("cannot open the block-layer BPF object")?;
    let rodata = open.maps.rodata_data.as_deref_mut().context("no rodata in the BPF object")?;
    rodata.t0_ns = t0;
    rodata.interval_ns = interval.as_nanos() as u64;
    let btf = flavor == Flavor::TpBtf;
    let p = &mut open.progs;
    for prog in [&mut p.btf_bio_queue, &mut p.btf_rq_insert, &mut p.btf_rq_issue, &mut p.btf_rq_complete, &mut p.btf_rq_requeue] {
        prog.set_autoload(btf);
    }
    for prog in [&mut p.raw_bio_queue, &mut p.raw_rq_insert, &mut p.raw_rq_issue, &mut p.raw_rq_complete, &mut p.raw_rq_requeue] {
        prog.set_autoload(!btf);
    }
    Ok(open)
}

fn load_attach<'o>(open: OpenBlockSkel<'o>, flavor: Flavor, devs: &[Watched]) -> Result<(BlockSkel<'o>, Vec<Link>)> {
    let skel = open.load().context("cannot load the block-layer BPF programs")?;
    for (i, d) in devs.iter().enumerate() {
        skel.maps.devs.update(&d.kernel_dev().to_ne_bytes(), &(i as u32).to_ne_bytes(), MapFlags::ANY).context("cannot set the watched devices")?;
    }
    let p = &skel.progs;
    let progs = match flavor {
        Flavor::TpBtf => [&p.btf_bio_queue, &p.btf_rq_insert, &p.btf_rq_issue, &p.btf_rq_complete, &p.btf_rq_requeue],
        Flavor::RawTp => [&p.raw_bio_queue, &p.raw_rq_insert, &p.raw_rq_issue, &p.raw_rq_complete, &p.raw_rq_requeue],
    };
    let links = progs.iter().map(|p| p.attach().with_context(|| format!("cannot attach {}", p.name().to_string_lossy()))).collect::<Result<Vec<_>>>()?;
    Ok((skel, links))
}

fn run(devs: &[Watched], interval: Duration, ready: mpsc::Sender<Result<&'static str>>, stop: mpsc::Receiver<()>) -> Result<MonitorResults> {
    libbpf_rs::set_print(Some((libbpf_rs::PrintLevel::Warn, libbpf_print)));
    let t0 = monotonic_ns();
    let started = Instant::now();
    let mut notes = Vec::new();
    let mut first = MaybeUninit::uninit();
    let mut second = MaybeUninit::uninit();
    let attempt = open_flavor(&mut first, Flavor::TpBtf, t0, interval).and_then(|o| load_attach(o, Flavor::TpBtf, devs));
    let (skel, links, attach) = match attempt {
        Ok((s, l)) => {
            libbpf_log_tail();
            (s, l, "tp_btf")
        }
        Err(e) => {
            let why = format!("{e:#}{}", libbpf_log_tail());
            match open_flavor(&mut second, Flavor::RawTp, t0, interval).and_then(|o| load_attach(o, Flavor::RawTp, devs)) {
                Ok((s, l)) => {
                    notes.push(format!("tp_btf programs unavailable, raw_tp used: {}", why.lines().next().unwrap_or("")));
                    (s, l, "raw_tp")
                }
                Err(e2) => {
                    let msg = format!("{e2:#}{}", libbpf_log_tail());
                    let hint = if msg.contains("Operation not permitted") || msg.contains("EPERM") {
                        " (BPF needs root, or CAP_BPF and CAP_PERFMON, and no lockdown forbidding it)"
                    } else {
                        ""
                    };
                    let err = anyhow!("BPF block monitor unavailable{hint}: {msg}\n(tp_btf attempt: {why})");
                    let _ = ready.send(Err(anyhow!("{err:#}")));
                    return Err(err);
                }
            }
        }
    };
    let _ = ready.send(Ok(attach));
    let mut reader = SlotReader::new(devs.len(), interval);
    // until stopped (or the monitor dropped)
    while let Err(mpsc::RecvTimeoutError::Timeout) = stop.recv_timeout(interval.min(Duration::from_millis(250))) {
        let done = (monotonic_ns() - t0) / interval.as_nanos() as u64;
        reader.drain(&skel, done, &mut notes);
    }
    drop(links);
    let duration = started.elapsed();
    let p = &skel.progs;
    let missed: u64 = match attach {
        "tp_btf" => [&p.btf_bio_queue, &p.btf_rq_insert, &p.btf_rq_issue, &p.btf_rq_complete, &p.btf_rq_requeue].iter().map(|p| recursion_misses(*p)).sum(),
        _ => [&p.raw_bio_queue, &p.raw_rq_insert, &p.raw_rq_issue, &p.raw_rq_complete, &p.raw_rq_requeue].iter().map(|p| recursion_misses(*p)).sum(),
    };
    if missed > 0 {
        notes.push(format!("{missed} block events skipped by the kernel (a program of ours already running on that CPU): as many requests may be uncounted"));
    }
    // the interval in progress at detach, too
    let done = (monotonic_ns() - t0) / interval.as_nanos() as u64 + 1;
    reader.drain(&skel, done, &mut notes);
    let mut out = MonitorResults {
        schema: SCHEMA,
        attach: attach.into(),
        interval_s: interval.as_secs_f64(),
        duration_s: duration.as_secs_f64(),
        notes,
        missed_events: missed,
        ..Default::default()
    };
    for (i, d) in devs.iter().enumerate() {
        out.devices.push(device_results(&skel, i, d, std::mem::take(&mut reader.series[i]))?);
    }
    Ok(out)
}

pub(super) fn words(v: &[u8]) -> Vec<u64> {
    v.chunks_exact(8).map(|c| u64::from_ne_bytes(c.try_into().expect("8 bytes"))).collect()
}

pub(super) fn lookup(map: &libbpf_rs::MapMut<'_>, key: u32) -> Result<Vec<u64>> {
    Ok(words(&map.lookup(&key.to_ne_bytes(), MapFlags::ANY)?.with_context(|| format!("no entry {key} in map {}", map.name().to_string_lossy()))?))
}

pub(super) fn ns_to_us(ns: f64) -> f64 {
    ns / 1000.0
}

fn device_results(skel: &BlockSkel<'_>, i: usize, d: &Watched, series: Vec<Interval>) -> Result<DeviceResults> {
    let mut layers = Vec::new();
    for (layer, lname) in BLOCK_LAYERS.iter().enumerate() {
        for (op, oname) in OPS.iter().enumerate() {
            let v = lookup(&skel.maps.hists, ((i * NR_LAYERS + layer) * NR_OPS + op) as u32)?;
            let (count, sum, bytes, buckets) = (v[0], v[1], v[2], &v[3..]);
            if count == 0 {
                continue;
            }
            let q = |p| ns_to_us(hist::quantile(buckets, p).unwrap_or(0.0));
            let top = buckets.iter().rposition(|&n| n > 0).unwrap_or(0);
            layers.push(LayerOp {
                layer: lname.to_string(),
                op: oname.to_string(),
                count,
                bytes,
                mean_us: ns_to_us(sum as f64 / count as f64),
                p50_us: q(0.5),
                p95_us: q(0.95),
                p99_us: q(0.99),
                max_us: ns_to_us(hist::bucket_high(top) as f64),
                histogram: hist::sparse(buckets),
            });
        }
    }
    let ds = lookup(&skel.maps.devstats, i as u32)?;
    let (inflight, untracked, unmatched, lost, depth) = (ds[0], ds[1], ds[2], ds[3], &ds[4..4 + DEPTH_BUCKETS]);
    let issues: u64 = depth.iter().sum();
    let weighted: u64 = depth.iter().enumerate().map(|(k, n)| k as u64 * n).sum();
    Ok(DeviceResults {
        device: d.path.display().to_string(),
        dev: format!("{}:{}", d.major, d.minor),
        layers,
        depth: Depth {
            mean: if issues > 0 { weighted as f64 / issues as f64 } else { 0.0 },
            max: depth.iter().rposition(|&n| n > 0).unwrap_or(0) as u64,
            histogram: depth.iter().enumerate().filter(|(_, n)| **n > 0).map(|(k, n)| [k as u64, *n]).collect(),
        },
        untracked,
        unmatched,
        lost_completions: lost,
        inflight_at_end: inflight,
        series,
    })
}

/// Drains finished intervals from the kernel's ring of per-interval slots.
struct SlotReader {
    next: u64,
    interval: Duration,
    series: Vec<Vec<Interval>>,
    lost: u64,
}

impl SlotReader {
    fn new(devs: usize, interval: Duration) -> SlotReader {
        SlotReader { next: 0, interval, series: vec![Vec::new(); devs], lost: 0 }
    }

    /// Read intervals [next, done) and zero their slots for reuse.
    fn drain(&mut self, skel: &BlockSkel<'_>, done: u64, notes: &mut Vec<String>) {
        if done > self.next + NR_SLOTS {
            // the ring wrapped before we read it (this thread was held up)
            self.lost += done - NR_SLOTS - self.next;
            self.next = done - NR_SLOTS;
        }
        let zero = vec![0u8; skel.maps.slots.value_size() as usize];
        for e in self.next..done {
            for (dev, series) in self.series.iter_mut().enumerate() {
                let key = (dev as u64 * NR_SLOTS + e % NR_SLOTS) as u32;
                let Ok(v) = lookup(&skel.maps.slots, key) else { continue };
                let _ = skel.maps.slots.update(&key.to_ne_bytes(), &zero, MapFlags::ANY);
                let t_s = (e as f64) * self.interval.as_secs_f64();
                let mut iv = Interval { t_s, ..Default::default() };
                if v[0] == e + 1 {
                    let (issues, depth_sum, depth_max) = (v[1], v[2], v[3]);
                    iv.issues = issues;
                    iv.depth_max = depth_max;
                    iv.depth_mean = if issues > 0 { depth_sum as f64 / issues as f64 } else { 0.0 };
                    let at = |field: usize, op: usize| v[4 + field * NR_OPS + op];
                    for (op, name) in OPS.iter().enumerate() {
                        let (count, bytes, svc, queued, qns) = (at(0, op), at(1, op), at(2, op), at(3, op), at(4, op));
                        if count == 0 {
                            continue;
                        }
                        iv.ops.insert(
                            name.to_string(),
                            IntervalOp {
                                count,
                                bytes,
                                service_mean_us: ns_to_us(svc as f64 / count as f64),
                                queue_mean_us: if queued > 0 { ns_to_us(qns as f64 / queued as f64) } else { 0.0 },
                            },
                        );
                    }
                } else if v[0] > e + 1 {
                    self.lost += 1;
                }
                series.push(iv);
            }
        }
        self.next = self.next.max(done);
        if self.lost > 0 && !notes.iter().any(|n| n.starts_with("series:")) {
            notes.push("series: some intervals were overwritten before they were read and are left empty".into());
        }
    }
}
