//! Loader of src/monitor/bpf/block.bpf.c: block-layer queue and service time per device and
//! op, aggregated in the kernel. `BlockMonitor::start` loads and attaches the programs on a
//! thread of their own (the skeleton borrows its object, so it lives on that thread's stack),
//! which drains the per-interval counters as intervals end; `stop` detaches and returns
//! the results.

use super::hist;
use super::model::{BLOCK_LAYERS, Depth, DeviceResults, Interval, IntervalOp, LayerOp, MonitorResults, MonitorWindow, OPS, SCHEMA, WindowDevice};
use super::window::Windows;
use anyhow::{Context, Result, anyhow, bail};
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{Link, MapCore, MapFlags};
use std::collections::BTreeMap;
use std::mem::MaybeUninit;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

bpf_skeleton!("block.skel.rs");
use skel::{BlockSkel, BlockSkelBuilder, OpenBlockSkel};

// block.h
use super::defines::{MAX_DEVS, NR_LAYERS, NR_OPS};
const NR_SLOTS: u64 = super::defines::NR_SLOTS as u64;
// a slot is read as words: its epoch, then five per-op arrays (block.h `struct slot`)
const _: () = assert!(size_of::<skel::types::slot>() == 8 * (1 + 5 * NR_OPS));

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
    /// With `windows`, the figures of each window of a `baseline: windows` run too
    /// (`MonitorResults::windows`).
    pub fn start(devices: &[PathBuf], interval: Duration, windows: Option<Arc<Windows>>) -> Result<BlockMonitor> {
        if devices.is_empty() || devices.len() > MAX_DEVS {
            bail!("the block monitor watches 1 to {MAX_DEVS} devices, not {}", devices.len());
        }
        let watched = devices.iter().map(|d| Watched::new(d)).collect::<Result<Vec<_>>>()?;
        let interval = interval.max(Duration::from_millis(10));
        BlockMonitor::spawn("monitor-block", Box::new(move |ready, stop| run(&watched, interval, windows.as_deref(), ready, stop)))
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

/// Which program set to load (block and syscall layers): tp_btf (BTF-typed arguments, cheapest), raw_tp, or classic
/// tracepoints (the perf-event path; matched by device and sector, no queue time).
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Flavor {
    TpBtf,
    RawTp,
    Tracepoint,
}

impl Flavor {
    pub fn name(self) -> &'static str {
        match self {
            Flavor::TpBtf => "tp_btf",
            Flavor::RawTp => "raw_tp",
            Flavor::Tracepoint => "tracepoint",
        }
    }
}

/// The attach types to try, best first: all of them, or the one `FAULTLINE_MONITOR_ATTACH`
/// (tp_btf, raw_tp or tracepoint) forces, e.g. to test a fallback on a kernel that has better.
pub(super) fn flavors(have_tracepoint: bool) -> Result<Vec<Flavor>> {
    let all = if have_tracepoint { vec![Flavor::TpBtf, Flavor::RawTp, Flavor::Tracepoint] } else { vec![Flavor::TpBtf, Flavor::RawTp] };
    match std::env::var("FAULTLINE_MONITOR_ATTACH") {
        Ok(v) if !v.is_empty() => match all.iter().find(|f| f.name() == v) {
            Some(f) => Ok(vec![*f]),
            None => bail!("FAULTLINE_MONITOR_ATTACH={v}: allowed: {}", all.iter().map(|f| f.name()).collect::<Vec<_>>().join(", ")),
        },
        _ => Ok(all),
    }
}

fn open_flavor<'o>(
    storage: &'o mut MaybeUninit<libbpf_rs::OpenObject>,
    flavor: Flavor,
    t0: u64,
    interval: Duration,
    devs: &[Watched],
    windows: Option<&Windows>,
) -> Result<OpenBlockSkel<'o>> {
    let mut open = BlockSkelBuilder::default().open(storage).context("cannot open the block-layer BPF object")?;
    let rodata = open.maps.rodata_data.as_deref_mut().context("no rodata in the BPF object")?;
    rodata.t0_ns = t0;
    rodata.interval_ns = interval.as_nanos() as u64;
    rodata.ndevs = devs.len() as u32;
    for (i, d) in devs.iter().enumerate() {
        rodata.devts[i] = d.kernel_dev();
    }
    if let Some(w) = windows {
        (rodata.win_n, rodata.win_len_ns, rodata.win_settle_ns) = w.rodata();
        w.size_map(&mut open.maps.whists, (devs.len() * NR_LAYERS * NR_OPS) as u32)?;
    }
    open.progs.win_probe.set_autoload(false);
    // per-CPU maps: sized for the watched devices only
    let n = devs.len() as u32;
    open.maps.hists.set_max_entries(n * (NR_LAYERS * NR_OPS) as u32)?;
    open.maps.devstats.set_max_entries(n)?;
    open.maps.slots.set_max_entries(n * NR_SLOTS as u32)?;
    let p = &mut open.progs;
    p.btf_rq_complete.set_autoload(flavor == Flavor::TpBtf);
    p.btf_rq_issue.set_autoload(flavor == Flavor::TpBtf);
    p.raw_rq_complete.set_autoload(flavor == Flavor::RawTp);
    p.raw_rq_issue.set_autoload(flavor == Flavor::RawTp);
    p.tp_rq_complete.set_autoload(flavor == Flavor::Tracepoint);
    p.tp_rq_issue.set_autoload(flavor == Flavor::Tracepoint);
    Ok(open)
}

/// Load, attach the completion program (and the issue program where the kernel's issue
/// stamps cannot be relied on: classic tracepoints, or `issue`).
fn load_attach<'o>(open: OpenBlockSkel<'o>, flavor: Flavor, issue: bool) -> Result<(BlockSkel<'o>, Vec<Link>)> {
    let skel = open.load().context("cannot load the block-layer BPF programs")?;
    let mut links = vec![complete_prog(&skel, flavor).attach().context("cannot attach the completion program")?];
    if issue || flavor == Flavor::Tracepoint {
        links.push(issue_prog(&skel, flavor).attach().context("cannot attach the issue program")?);
    }
    Ok((skel, links))
}

fn complete_prog<'a>(skel: &'a BlockSkel<'_>, flavor: Flavor) -> &'a libbpf_rs::ProgramMut<'a> {
    match flavor {
        Flavor::TpBtf => &skel.progs.btf_rq_complete,
        Flavor::RawTp => &skel.progs.raw_rq_complete,
        Flavor::Tracepoint => &skel.progs.tp_rq_complete,
    }
}

fn issue_prog<'a>(skel: &'a BlockSkel<'_>, flavor: Flavor) -> &'a libbpf_rs::ProgramMut<'a> {
    match flavor {
        Flavor::TpBtf => &skel.progs.btf_rq_issue,
        Flavor::RawTp => &skel.progs.raw_rq_issue,
        Flavor::Tracepoint => &skel.progs.tp_rq_issue,
    }
}

/// Whether the kernel stamps the device's requests with their issue time: it does where the
/// queue keeps blk-stat statistics, which writeback throttling (present where
/// queue/wbt_lat_usec reads) turns on. Elsewhere an issue program stores the time.
fn stamps_issue(d: &Watched) -> bool {
    std::fs::read_to_string(format!("/sys/dev/block/{}:{}/queue/wbt_lat_usec", d.major, d.minor)).is_ok()
}

/// The device's requests in flight (reads + writes) from sysfs, re-read through one open file
/// (a read at offset 0 regenerates it: no path walk per sample).
struct Inflight(Option<std::fs::File>);

impl Inflight {
    fn open(d: &Watched) -> Inflight {
        Inflight(std::fs::File::open(format!("/sys/dev/block/{}:{}/inflight", d.major, d.minor)).ok())
    }

    fn read(&self) -> Option<u64> {
        use std::os::unix::fs::FileExt;
        let mut buf = [0u8; 64];
        let n = self.0.as_ref()?.read_at(&mut buf, 0).ok()?;
        Some(std::str::from_utf8(&buf[..n]).ok()?.split_whitespace().filter_map(|w| w.parse::<u64>().ok()).sum())
    }
}

/// The kernel's completed-request counters of a device (`/sys/dev/block/M:m/stat`: reads,
/// writes, discards, flushes; counted where the queue keeps I/O statistics).
struct DiskStat([u64; 4]);

impl DiskStat {
    fn read(d: &Watched) -> Option<DiskStat> {
        Some(DiskStat::parse(&std::fs::read_to_string(format!("/sys/dev/block/{}:{}/stat", d.major, d.minor)).ok()?))
    }

    /// Fields 1, 5, 12 and 16 (1-based, the kernel's Documentation/block/stat.rst): each op's
    /// I/Os completed (older kernels lack the last two: 0).
    fn parse(text: &str) -> DiskStat {
        let f: Vec<u64> = text.split_whitespace().filter_map(|w| w.parse().ok()).collect();
        DiskStat([0, 4, 11, 15].map(|i| f.get(i).copied().unwrap_or(0)))
    }

    /// Completed since `before`, by op (the ops that completed any).
    fn since(&self, before: &DiskStat) -> BTreeMap<String, u64> {
        ["read", "write", "discard", "flush"]
            .iter()
            .zip(self.0.iter().zip(before.0.iter()))
            .map(|(op, (a, b))| (op.to_string(), a.saturating_sub(*b)))
            .filter(|(_, n)| *n > 0)
            .collect()
    }
}

/// A note when the kernel completed more reads and writes in the programs' span than the
/// block program ran for (counted, or seen and left out: issued before attach, no issue
/// time): completions the kernel did not run the program for (docs/monitor.md, blind spots).
fn unseen_note(d: &DeviceResults) -> Option<String> {
    let kernel: u64 = ["read", "write"].iter().filter_map(|op| d.kernel_completed.get(*op)).sum();
    let counted: u64 = d.layers.iter().filter(|l| l.layer == "block_service" && (l.op == "read" || l.op == "write")).map(|l| l.count).sum();
    let unseen = kernel.saturating_sub(counted + d.early + d.unmatched + d.untracked);
    (unseen > 0).then(|| {
        format!(
            "{}: the kernel completed {kernel} reads and writes while the monitor ran, {unseen} more than the block program saw: at least as many requests are missing from its figures",
            d.device
        )
    })
}

/// How often the queue depth is sampled (its maximum and histogram; the mean comes from the
/// service times, exactly): a tenth of the interval, from 10 to 100 ms. Each sample wakes the
/// loader's thread, which is most of what the monitor costs in user space.
fn depth_every(interval: Duration) -> Duration {
    (interval / 10).clamp(Duration::from_millis(10), Duration::from_millis(100))
}

fn run(
    devs: &[Watched],
    interval: Duration,
    windows: Option<&Windows>,
    ready: mpsc::Sender<Result<&'static str>>,
    stop: mpsc::Receiver<()>,
) -> Result<MonitorResults> {
    let t0 = monotonic_ns();
    let started = Instant::now();
    let mut notes = Vec::new();
    let flavors = match flavors(true) {
        Ok(f) => f,
        Err(e) => {
            let _ = ready.send(Err(anyhow!("{e:#}")));
            return Err(e);
        }
    };
    let issue_needed = devs.iter().any(|d| !stamps_issue(d));
    let mut storage: Vec<MaybeUninit<libbpf_rs::OpenObject>> = (0..flavors.len()).map(|_| MaybeUninit::uninit()).collect();
    let ((skel, mut links), flavor, tried) = super::load_first("block", &mut storage, &flavors, &ready, |store, flavor| {
        open_flavor(store, flavor, t0, interval, devs, windows).and_then(|o| load_attach(o, flavor, issue_needed))
    })?;
    if let Some(w) = windows {
        w.register(&skel.maps.win_t0)?;
        w.series_origin(t0);
    }
    if !tried.is_empty() {
        notes.push(format!("block layer attached as {}: {}", flavor.name(), tried.join("; ")));
    }
    if flavor == Flavor::Tracepoint {
        notes.push("block layer on classic tracepoints: requests matched by device and sector, no queue time".into());
    }
    let mut issue_attached = issue_needed || flavor == Flavor::Tracepoint;
    if issue_needed && flavor != Flavor::Tracepoint {
        notes.push("a watched device has no writeback throttling (no kernel issue stamps): issue times stored by an issue program".into());
    }
    let attach = flavor.name();
    // the kernel's own completed-request counts, read inside the programs' span (after attach,
    // before detach): any request they hold that the programs did not count was not seen
    let kernel0: Vec<Option<DiskStat>> = devs.iter().map(DiskStat::read).collect();
    let _ = ready.send(Ok(attach));
    let mut reader = SlotReader::new(devs.len(), interval);
    let mut depth = vec![DepthSampler::default(); devs.len()];
    let files: Vec<Inflight> = devs.iter().map(Inflight::open).collect();
    let every = depth_every(interval);
    let mut next_drain = Duration::ZERO;
    // until stopped (or the monitor dropped)
    while let Err(mpsc::RecvTimeoutError::Timeout) = stop.recv_timeout(every) {
        let epoch = ((monotonic_ns() - t0) / interval.as_nanos() as u64) as usize;
        for (f, s) in files.iter().zip(depth.iter_mut()) {
            if let Some(n) = f.read() {
                s.add(epoch, n);
            }
        }
        if started.elapsed() < next_drain {
            continue;
        }
        next_drain = started.elapsed() + interval.min(Duration::from_millis(250));
        let done = (monotonic_ns() - t0) / interval.as_nanos() as u64;
        reader.drain(&skel, done, &mut notes);
        // requests completing without the kernel's issue stamp: time the rest from an issue
        // program of our own
        if !issue_attached && (0..devs.len()).any(|i| devstat(&skel, i).map(|v| v[0]).unwrap_or(0) > 0) {
            match issue_prog(&skel, flavor).attach() {
                Ok(l) => {
                    links.push(l);
                    issue_attached = true;
                    notes.push("requests completed without the kernel's issue stamp: issue times stored by an issue program from then on".into());
                }
                Err(e) => notes.push(format!("cannot attach the issue program: {e:#}")),
            }
        }
    }
    let kernel1: Vec<Option<DiskStat>> = devs.iter().map(DiskStat::read).collect();
    drop(links);
    let duration = started.elapsed();
    let missed = recursion_misses(complete_prog(&skel, flavor)) + recursion_misses(issue_prog(&skel, flavor));
    if missed > 0 {
        notes.push(format!("{missed} block events skipped by the kernel (a program of ours already running on that CPU): as many requests may be uncounted"));
    }
    // the interval in progress at detach, too
    let done = (monotonic_ns() - t0) / interval.as_nanos() as u64 + 1;
    reader.drain(&skel, done, &mut notes);
    let backwards: u64 = (0..devs.len()).filter_map(|i| devstat(&skel, i).ok()).map(|v| v[4]).sum();
    if backwards > 0 {
        notes.push(format!(
            "{backwards} completions read the clock before their issue stamp (BPF's fast clock behind the block layer's): counted with service time 0"
        ));
    }
    let partial: u64 = (0..devs.len()).filter_map(|i| devstat(&skel, i).ok()).map(|v| v[2]).sum();
    if partial > 0 {
        notes.push(format!("{partial} partial completions (their request counted once, at its last)"));
    }
    let early: u64 = (0..devs.len()).filter_map(|i| devstat(&skel, i).ok()).map(|v| v[3]).sum();
    if early > 0 {
        notes.push(format!("{early} requests issued before the monitor started completed while it ran: not counted"));
    }
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
        let mut series = std::mem::take(&mut reader.series[i]);
        for iv in series.iter_mut() {
            let (n, max) = depth[i].interval((iv.t_s / interval.as_secs_f64()).round() as usize);
            iv.issues = n;
            iv.depth_max = max;
            // the interval's length (the last one ends at detach)
            let len_us = (duration.as_secs_f64() - iv.t_s).clamp(0.0, interval.as_secs_f64()) * 1e6;
            iv.depth_mean = littles_law(iv.ops.values().map(|o| o.count as f64 * o.service_mean_us).sum(), len_us);
        }
        let mut dr = device_results(&skel, i, d, series, &depth[i])?;
        if let (Some(a), Some(b)) = (&kernel0[i], &kernel1[i]) {
            dr.kernel_completed = b.since(a);
            out.notes.extend(unseen_note(&dr));
        }
        let busy_us = dr.layers.iter().filter(|l| l.layer == "block_service").map(|l| l.count as f64 * l.mean_us).sum();
        dr.depth.mean = littles_law(busy_us, duration.as_secs_f64() * 1e6);
        out.devices.push(dr);
    }
    if let Some(w) = windows {
        out.windows = window_rows(&skel, devs, w)?;
        out.notes.extend(super::window::lost_note(&skel.maps.win_lost, "block"));
    }
    Ok(out)
}

/// The block layers' figures per window (every window of the run, empty where nothing
/// completed in it).
fn window_rows(skel: &BlockSkel<'_>, devs: &[Watched], w: &Windows) -> Result<Vec<MonitorWindow>> {
    let mut out: Vec<MonitorWindow> = (0..w.n)
        .map(|k| {
            let (from_s, to_s) = w.span(k);
            MonitorWindow {
                index: k,
                from_s,
                to_s,
                devices: devs.iter().map(|d| WindowDevice { device: d.path.display().to_string(), ..Default::default() }).collect(),
                ..Default::default()
            }
        })
        .collect();
    for (k, idx, v) in super::window::read(&skel.maps.whists)? {
        let idx = idx as usize;
        let (dev, layer, op) = (idx / (NR_LAYERS * NR_OPS), idx / NR_OPS % NR_LAYERS, idx % NR_OPS);
        let Some(d) = out.get_mut(k as usize).and_then(|x| x.devices.get_mut(dev)) else { continue };
        d.layers.extend(super::window::row(BLOCK_LAYERS[layer], OPS[op].to_string(), &v, layer == 1));
    }
    Ok(out)
}

/// Tests only: the window the kernel's `window_of` (win.bpf.h) gives each interval [start,
/// end] (monotonic ns) under windows `w` whose window 0 starts at `t0` (0: not set).
pub fn window_probe(w: &Windows, t0: u64, cases: &[(u64, u64)]) -> Result<Vec<Option<u32>>> {
    let mut storage = MaybeUninit::uninit();
    let mut open = BlockSkelBuilder::default().open(&mut storage).context("cannot open the block-layer BPF object")?;
    let rodata = open.maps.rodata_data.as_deref_mut().context("no rodata in the BPF object")?;
    (rodata.win_n, rodata.win_len_ns, rodata.win_settle_ns) = w.rodata();
    w.size_map(&mut open.maps.whists, 1)?;
    let p = &mut open.progs;
    for prog in [&mut p.btf_rq_complete, &mut p.btf_rq_issue, &mut p.raw_rq_complete, &mut p.raw_rq_issue, &mut p.tp_rq_issue, &mut p.tp_rq_complete] {
        prog.set_autoload(false);
    }
    let skel = open.load().context("cannot load the window probe")?;
    if t0 != 0 {
        skel.maps.win_t0.update(&0u32.to_ne_bytes(), &t0.to_ne_bytes(), MapFlags::ANY)?;
    }
    let mut out = Vec::new();
    for &(start, end) in cases {
        let mut ctx = [start.to_ne_bytes(), end.to_ne_bytes()].concat();
        let input = libbpf_rs::ProgramInput { context_in: Some(&mut ctx), ..Default::default() };
        let r = skel.progs.win_probe.test_run(input).context("cannot run the window probe")?;
        out.push(r.return_value.checked_sub(1));
    }
    Ok(out)
}

/// Mean requests in service over a span (Little's law): their service times summed over its
/// length. Exact where requests start and end inside the span; a request's whole service
/// time counts in the span of its completion.
fn littles_law(busy_us: f64, span_us: f64) -> f64 {
    // (an empty sum of f64 is -0.0: written as 0)
    if span_us > 0.0 && busy_us > 0.0 { busy_us / span_us } else { 0.0 }
}

/// Queue-depth samples of one device: a histogram over the whole run, and per interval the
/// samples taken and their maximum.
#[derive(Clone, Default)]
struct DepthSampler {
    hist: std::collections::BTreeMap<u64, u64>,
    /// per interval: (samples, max)
    per: Vec<(u64, u64)>,
}

impl DepthSampler {
    fn add(&mut self, epoch: usize, n: u64) {
        *self.hist.entry(n).or_default() += 1;
        if self.per.len() <= epoch {
            self.per.resize(epoch + 1, (0, 0));
        }
        let e = &mut self.per[epoch];
        e.0 += 1;
        e.1 = e.1.max(n);
    }

    fn interval(&self, epoch: usize) -> (u64, u64) {
        self.per.get(epoch).copied().unwrap_or((0, 0))
    }

    /// The samples' maximum and histogram (the mean is set from the service times).
    fn depth(&self) -> Depth {
        Depth { mean: 0.0, max: self.hist.keys().next_back().copied().unwrap_or(0), histogram: self.hist.iter().map(|(d, c)| [*d, *c]).collect() }
    }
}

/// A per-CPU map's entry, summed over the CPUs, as u64 words.
pub(super) fn lookup_sum(map: &libbpf_rs::MapMut<'_>, key: u32) -> Result<Vec<u64>> {
    let per = map.lookup_percpu(&key.to_ne_bytes(), MapFlags::ANY)?.with_context(|| format!("no entry {key} in map {}", map.name().to_string_lossy()))?;
    let mut sum = vec![0u64; map.value_size() as usize / 8];
    for cpu in per {
        for (s, w) in sum.iter_mut().zip(words(&cpu)) {
            *s += w;
        }
    }
    Ok(sum)
}

/// [noissue, untracked, partial, early, backwards] of device `i` (block.h's `struct devstat`).
fn devstat(skel: &BlockSkel<'_>, i: usize) -> Result<Vec<u64>> {
    lookup_sum(&skel.maps.devstats, i as u32)
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

/// A layer x op row from a histogram's words (count, sum ns, bytes, buckets); None when empty.
pub(super) fn layer_row(layer: &str, op: String, v: &[u64], with_bytes: bool) -> Option<LayerOp> {
    let (count, sum, buckets) = (v[0], v[1], &v[3..]);
    if count == 0 {
        return None;
    }
    let q = |p| ns_to_us(hist::quantile(buckets, p).unwrap_or(0.0));
    let top = buckets.iter().rposition(|&n| n > 0).unwrap_or(0);
    Some(LayerOp {
        layer: layer.to_string(),
        op,
        count,
        bytes: if with_bytes { v[2] } else { 0 },
        mean_us: ns_to_us(sum as f64 / count as f64),
        p50_us: q(0.5),
        p95_us: q(0.95),
        p99_us: q(0.99),
        max_us: ns_to_us(hist::bucket_high(top) as f64),
        histogram: hist::sparse(buckets),
    })
}

fn device_results(skel: &BlockSkel<'_>, i: usize, d: &Watched, series: Vec<Interval>, depth: &DepthSampler) -> Result<DeviceResults> {
    let mut layers = Vec::new();
    for (layer, lname) in BLOCK_LAYERS.iter().enumerate() {
        for (op, oname) in OPS.iter().enumerate() {
            let v = lookup_sum(&skel.maps.hists, ((i * NR_LAYERS + layer) * NR_OPS + op) as u32)?;
            layers.extend(layer_row(lname, oname.to_string(), &v, true));
        }
    }
    let ds = devstat(skel, i)?;
    Ok(DeviceResults {
        device: d.path.display().to_string(),
        dev: format!("{}:{}", d.major, d.minor),
        layers,
        depth: depth.depth(),
        untracked: ds[1],
        unmatched: ds[0],
        lost_completions: 0,
        inflight_at_end: 0,
        early: ds[3],
        completions_seen: ds.get(5).copied().unwrap_or(0),
        dataless: ds.get(6).copied().unwrap_or(0),
        series,
        daemon: Default::default(),
        kernel_completed: Default::default(),
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
        let ncpu = libbpf_rs::num_possible_cpus().unwrap_or(1);
        let zero = vec![vec![0u8; skel.maps.slots.value_size() as usize]; ncpu];
        for e in self.next..done {
            for (dev, series) in self.series.iter_mut().enumerate() {
                let key = (dev as u64 * NR_SLOTS + e % NR_SLOTS) as u32;
                let Ok(Some(per)) = skel.maps.slots.lookup_percpu(&key.to_ne_bytes(), MapFlags::ANY) else { continue };
                let _ = skel.maps.slots.update_percpu(&key.to_ne_bytes(), &zero, MapFlags::ANY);
                let t_s = (e as f64) * self.interval.as_secs_f64();
                let mut iv = Interval { t_s, ..Default::default() };
                // this interval's counts, from the CPUs whose copy holds it
                let mut v = [0u64; 1 + 5 * NR_OPS];
                for cpu in per.iter().map(|c| words(c)) {
                    if cpu[0] == e + 1 {
                        for (s, w) in v.iter_mut().zip(cpu.iter()).skip(1) {
                            *s += w;
                        }
                    } else if cpu[0] > e + 1 {
                        self.lost += 1;
                    }
                }
                let at = |field: usize, op: usize| v[1 + field * NR_OPS + op];
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
                series.push(iv);
            }
        }
        self.next = self.next.max(done);
        if self.lost > 0 && !notes.iter().any(|n| n.starts_with("series:")) {
            notes.push("series: some intervals were overwritten before they were read and are left empty".into());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device's stat line (17 fields since Linux 5.5; 11 before 4.18): each op's completed
    /// requests, by field position.
    #[test]
    fn disk_stat_fields() {
        let now = DiskStat::parse(
            "     244        3     1952      120      488        0     3904      310        0      420      430       7        0       56        2       9        1\n",
        );
        let before = DiskStat::parse("4 0 32 1 8 0 64 2 0 3 3 2 0 16 1 4 0");
        let got = now.since(&before);
        let want: BTreeMap<String, u64> = [("read", 240), ("write", 480), ("discard", 5), ("flush", 5)].map(|(k, v)| (k.to_string(), v)).into();
        assert_eq!(got, want);
        // an older kernel's 11 fields: no discards or flushes
        let old = DiskStat::parse("10 0 80 1 20 0 160 2 0 3 3");
        assert_eq!(old.since(&DiskStat::parse("0 0 0 0 0 0 0 0 0 0 0")).keys().collect::<Vec<_>>(), ["read", "write"]);
    }
}
