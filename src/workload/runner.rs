//! `run`: set up files and threads, run the I/O engine (psync or uring) per thread, sample the time series, and
//! merge the threads' results. `run_block` runs a `BlockWorkload` (a flat psync block
//! workload that tests build directly).

use super::maps::Maps;
use super::op::{Region, Shared, ThreadOut, Worker};
use super::stats::{LatencySummary as Summary, Sample, hist, sampler, summary};
use super::{Progress, WriteObserver, files};
pub use crate::spec::workload::config::{CONTENT_BLOCK, ErrorPolicy};
use crate::spec::workload::config::{Interface, IoEngine, SyncMode, Workload};
use crate::workload::pattern::Pattern;
use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::Duration;

pub use super::stats::LatencySummary;

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct IoError {
    /// read | write | fsync
    pub op: std::borrow::Cow<'static, str>,
    /// File index (file interface).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<usize>,
    pub offset: u64,
    pub len: u64,
    pub errno: i32,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct WorkloadResult {
    pub seconds: f64,
    pub read: Summary,
    pub write: Summary,
    /// "op:ERRNO" -> count ("read:EIO").
    pub errors: BTreeMap<String, u64>,
    pub failed_ios: Vec<IoError>,
    pub retries: u64,
    pub retry_seconds: f64,
    /// `interface: nbd`: what the NBD client's own retry policy did (below `retries`, which
    /// counts the workload's `on_error: retry:N`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nbd_client: Option<crate::nbd::client::CounterSnapshot>,
    /// The NBD client's counters per interval (`interface: nbd`; `faultline run` puts its
    /// disks' `nbd://` stores' here).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nbd_client_intervals: Vec<crate::nbd::client::IntervalCounts>,
    pub stopped_on_error: bool,
    /// User + system CPU seconds of this process during the run (all threads).
    pub cpu_seconds: f64,
    pub timeseries: Vec<Sample>,
    /// Personality runs: latency and rate per flowop type (filebench's flowop names).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub flowops: BTreeMap<String, super::stats::FlowopSummary>,
    /// Personality runs: flowops skipped because no file of the kind they need (existing or
    /// not, not busy) turned up within a second, or their descriptor was not open.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub flowops_skipped: u64,
    /// Personality runs: the content maps of the files that exist at the end, replacing the
    /// caller's (files are created and deleted, so the maps are only known afterwards).
    #[serde(skip)]
    pub maps: Option<Maps>,
    /// `baseline: windows`: the run's whole windows (`workload::windows`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub windows: Vec<super::windows::WindowSummary>,
}

/// Run a workload. `maps` (from `Maps::new(spec)`) receive the content id of every block
/// written; `observer` is called before each write; `progress` is updated live.
pub fn run(spec: &Workload, maps: &Maps, observer: Option<Arc<dyn WriteObserver>>, progress: Option<&Progress>) -> Result<WorkloadResult> {
    spec.check()?;
    if spec.personality.is_some() {
        return super::personality::run(spec, maps.seed, maps.durability.as_ref(), observer.as_deref(), progress);
    }
    let own = Progress::new();
    let progress = progress.unwrap_or(&own);
    let w = spec;
    // per thread: its open files and where its block indexes land
    let mut plans: Vec<(Vec<File>, Region, u64)> = Vec::new();
    // interface: nbd: one client, its connections shared by the threads
    let mut nbd: Option<crate::nbd::client::Client> = None;
    match &w.interface {
        Interface::Nbd { target } => {
            let c = crate::nbd::client::Client::connect(target).with_context(|| format!("cannot reach {target}"))?;
            let span = maps.maps[0].len() * CONTENT_BLOCK;
            let total = span / w.block_size;
            if total < w.threads as u64 {
                bail!("the export's span ({span} bytes) is too small for {} threads of {}-byte blocks", w.threads, w.block_size);
            }
            for t in 0..w.threads as u64 {
                let first = total * t / w.threads as u64;
                let len = total * (t + 1) / w.threads as u64 - first;
                plans.push((vec![], Region::Device { first }, len));
            }
            let _ = progress.nbd.set(c.counters.clone());
            nbd = Some(c);
        }
        Interface::Block { device } => {
            let span = maps.maps[0].len() * CONTENT_BLOCK;
            let total = span / w.block_size;
            if total < w.threads as u64 {
                bail!("the device span ({span} bytes) is too small for {} threads of {}-byte blocks", w.threads, w.block_size);
            }
            for t in 0..w.threads as u64 {
                let first = total * t / w.threads as u64;
                let len = total * (t + 1) / w.threads as u64 - first;
                plans.push((vec![files::open(device, w.sync, true, true)?], Region::Device { first }, len));
            }
        }
        Interface::File { dir, count, size } => {
            if maps.maps.len() != *count as usize {
                bail!("the maps hold {} files, the workload has {count}", maps.maps.len());
            }
            files::prepare(dir, *count, *size, maps.durability.is_some(), w.layout)?;
            let per_file = size / w.block_size;
            for t in 0..w.threads as usize {
                let mine: Vec<usize> = (t..*count as usize).step_by(w.threads as usize).collect();
                let fs = mine.iter().map(|i| files::open(&dir.join(files::file_name(*i)), w.sync, w.direct, false)).collect::<Result<Vec<_>>>()?;
                if t == 0 && w.o_direct() && fs.first().and_then(files::dio_supported) == Some(false) {
                    eprintln!(
                        "faultline: {} takes O_DIRECT but serves it through the page cache (the kernel reports no direct I/O alignment: ext4 data=journal does this); the run's I/O is buffered",
                        dir.display()
                    );
                }
                let n = mine.len() as u64 * per_file;
                plans.push((fs, Region::Files { files: mine, per_file }, n));
            }
        }
    }
    let nbd_ref = nbd.as_ref();
    let sh = Shared::new(w, maps, observer.as_deref(), progress);
    let _ = progress.start.set(sh.start);
    let cpu0 = super::stats::cpu_time();
    let done = AtomicBool::new(false);
    let mut nbd_intervals = Vec::new();
    let (outs, timeseries, secs) = std::thread::scope(|sc| -> Result<(Vec<ThreadOut>, Vec<Sample>, f64)> {
        let sampler = sc.spawn(|| sampler(&sh.intervals, sh.start, w.interval, &done));
        let nbd_sampler = nbd_ref.map(|c| {
            let (sh, done) = (&sh, &done);
            sc.spawn(move || crate::nbd::client::sample_intervals(sh.start, w.interval, done, || Some(c.counters.snapshot())))
        });
        let handles: Vec<_> = plans
            .into_iter()
            .enumerate()
            .map(|(t, (fs, region, blocks))| {
                let sh = &sh;
                sc.spawn(move || -> Result<ThreadOut> {
                    let mut wk = Worker::new(sh, t, region, blocks);
                    let r = match (sh.w.engine, nbd_ref) {
                        (_, Some(c)) => super::psync::run_thread_nbd(&mut wk, c),
                        (IoEngine::Psync, None) => super::psync::run_thread(&mut wk, &fs),
                        (IoEngine::IoUring, None) => super::uring::run_thread(&mut wk, &fs),
                    };
                    wk.flush_progress();
                    if r.is_err() {
                        sh.stop.store(true, Relaxed);
                    }
                    // buffered and fsync:N files: make the data durable before the run counts as done
                    if r.is_ok()
                        && matches!(sh.w.sync, SyncMode::None | SyncMode::Fsync(_))
                        && let Region::Files { files, .. } = wk.region()
                    {
                        let idx = files.clone();
                        for (slot, f) in fs.iter().enumerate() {
                            sync_file(&mut wk, f, slot, Some(idx[slot]));
                        }
                    }
                    wk.hand_over_unsynced();
                    r?;
                    Ok(wk.out)
                })
            })
            .collect();
        let mut outs = Vec::new();
        let mut first_err = None;
        for h in handles {
            match h.join().map_err(|_| anyhow::anyhow!("a workload thread panicked")).and_then(|r| r) {
                Ok(o) => outs.push(o),
                Err(e) => first_err = first_err.or(Some(e)),
            }
        }
        // the run ends when the last I/O does, not when the sampler notices
        let secs = sh.start.elapsed().as_secs_f64();
        done.store(true, Relaxed);
        sampler.thread().unpark();
        let ts = sampler.join().map_err(|_| anyhow::anyhow!("the sampler thread panicked"))?;
        if let Some(s) = nbd_sampler {
            nbd_intervals = s.join().map_err(|_| anyhow::anyhow!("the NBD sampler thread panicked"))?;
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok((outs, ts, secs)),
        }
    })?;
    let cpu = super::stats::cpu_time().saturating_sub(cpu0);
    let (mut read, mut write) = (hist(), hist());
    let (mut rb, mut wb, mut retries, mut rt) = (0, 0, 0, Duration::ZERO);
    let mut failed = Vec::new();
    let mut windows = super::windows::WindowAcc::new(w.windows, super::windows::FLOWOPS);
    for o in outs {
        if let (Some(all), Some(mine)) = (windows.as_mut(), o.windows) {
            all.merge(mine);
        }
        read.add(&o.read.h).unwrap();
        write.add(&o.write.h).unwrap();
        rb += o.read.bytes;
        wb += o.write.bytes;
        retries += o.retries;
        rt += o.retry_time;
        failed.extend(o.failed);
    }
    failed.sort_by_key(|f| (f.file, f.offset));
    let mut errors = BTreeMap::new();
    for f in &failed {
        *errors.entry(format!("{}:{}", f.op, crate::spec::rule::errno_name(f.errno))).or_insert(0) += 1;
    }
    Ok(WorkloadResult {
        seconds: secs,
        read: summary(&read, rb, secs),
        write: summary(&write, wb, secs),
        errors,
        failed_ios: failed,
        retries,
        retry_seconds: rt.as_secs_f64(),
        nbd_client: nbd.as_ref().map(|c| c.counters.snapshot()),
        nbd_client_intervals: nbd_intervals,
        stopped_on_error: sh.stopped_on_error.load(Relaxed),
        cpu_seconds: cpu.as_secs_f64(),
        timeseries,
        flowops: BTreeMap::new(),
        flowops_skipped: 0,
        maps: None,
        windows: windows.map(|a| a.summaries(secs, w.duration, &[])).unwrap_or_default(),
    })
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// fsync (fdatasync on a device) one open file; a failure is a failed I/O of op "fsync".
pub fn sync_file(wk: &mut Worker, f: &File, _slot: usize, file: Option<usize>) {
    let r = if file.is_some() { f.sync_all() } else { f.sync_data() };
    match r {
        Ok(()) => wk.synced(file),
        Err(e) => wk.fail("fsync", file, 0, 0, e.raw_os_error().unwrap_or(libc::EIO)),
    }
}

/// A psync workload on one block device, as flat fields (tests build these directly);
/// `run_block` turns it into a `Workload`.
#[derive(Clone, Debug)]
pub struct BlockWorkload {
    pub device: PathBuf,
    pub pattern: Pattern,
    pub write_pct: u8,
    pub block_size: u64,
    pub threads: u32,
    pub size: Option<u64>,
    pub ops: Option<u64>,
    pub duration: Option<Duration>,
    pub seed: u64,
    pub on_error: ErrorPolicy,
    pub span: Option<u64>,
}

/// Run a psync block workload, recording into `map` (one map covering the device).
pub fn run_block(b: &BlockWorkload, map: Arc<super::content_map::ContentMap>) -> Result<WorkloadResult> {
    let mut w = Workload::new(Interface::Block { device: b.device.clone() });
    w.pattern = b.pattern;
    w.write_pct = b.write_pct;
    w.block_size = b.block_size;
    w.threads = b.threads;
    (w.size, w.ops, w.duration) = (b.size, b.ops, b.duration);
    w.seed = b.seed;
    w.on_error = b.on_error;
    w.span = b.span;
    w.fit_profile();
    // a private map sized to the span, copied back into the caller's map
    let span = b.span.unwrap_or(map.len() * CONTENT_BLOCK);
    let maps = Maps {
        target: super::maps::Target::Block { device: b.device.clone() },
        seed: map.seed,
        maps: vec![super::content_map::ContentMap::new(span / CONTENT_BLOCK, CONTENT_BLOCK as u32, map.seed)],
        durability: None,
    };
    let r = run(&w, &maps, None, None).with_context(|| format!("workload on {}", b.device.display()))?;
    for blk in 0..maps.maps[0].len() {
        match maps.maps[0].get(blk) {
            Some(id) => map.set(blk, id),
            None if r.failed_ios.iter().any(|f| f.op == "write" && blk * CONTENT_BLOCK >= f.offset && blk * CONTENT_BLOCK < f.offset + f.len) => {
                map.forget(blk)
            }
            None => {}
        }
    }
    Ok(r)
}
