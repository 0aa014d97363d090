//! The block-interface workload engine (psync): threads, each on its own region of the device,
//! issuing reads and writes by pattern and mix, writing profile-shaped content and recording
//! what went where, latency histograms per op and every failed I/O.

use super::direct::{AlignedBuf, DirectDev};
use super::map::ContentMap;
use super::pattern::{Pattern, PatternGen};
use crate::content::fill_block;
use crate::content::stream::Stream;
use anyhow::{Result, bail};
use hdrhistogram::Histogram;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ErrorPolicy {
    Stop,
    Continue,
    /// Retry a failed I/O up to N times with exponential backoff from 1 ms.
    Retry(u32),
}

#[derive(Clone, Debug)]
pub struct BlockWorkload {
    pub device: PathBuf,
    pub pattern: Pattern,
    /// Percentage of operations that are writes (0..=100).
    pub write_pct: u8,
    pub block_size: u64,
    pub threads: u32,
    /// Bounds: whichever comes first.
    pub size: Option<u64>,
    pub ops: Option<u64>,
    pub duration: Option<Duration>,
    pub stream: Stream,
    pub seed: u64,
    pub on_error: ErrorPolicy,
    /// Bytes of the device used (from offset 0); default the whole device.
    pub span: Option<u64>,
}

pub const CONTENT_BLOCK: u64 = 4096;

#[derive(Clone, Debug, Serialize)]
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
}

#[derive(Clone, Debug, Serialize)]
pub struct IoError {
    pub op: &'static str,
    pub offset: u64,
    pub len: u64,
    pub errno: i32,
}

#[derive(Debug, Serialize)]
pub struct WorkloadResult {
    pub seconds: f64,
    pub read: LatencySummary,
    pub write: LatencySummary,
    /// errno name -> count, per op ("read:EIO").
    pub errors: BTreeMap<String, u64>,
    pub failed_ios: Vec<IoError>,
    pub retries: u64,
    pub retry_seconds: f64,
    pub stopped_on_error: bool,
}

struct ThreadOut {
    read: Histogram<u64>,
    write: Histogram<u64>,
    rbytes: u64,
    wbytes: u64,
    failed: Vec<IoError>,
    retries: u64,
    retry_time: Duration,
}

fn summary(h: &Histogram<u64>, bytes: u64, secs: f64) -> LatencySummary {
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
    }
}

/// Run the workload; returns its result and the content map of what was written.
pub fn run_block(w: &BlockWorkload, map: Arc<ContentMap>) -> Result<WorkloadResult> {
    if w.block_size % CONTENT_BLOCK != 0 || w.block_size == 0 || w.block_size > 256 * CONTENT_BLOCK {
        bail!("block size {} must be a multiple of {CONTENT_BLOCK} up to 1MiB", w.block_size);
    }
    if w.size.is_none() && w.ops.is_none() && w.duration.is_none() {
        bail!("a workload needs a bound: size, ops or duration");
    }
    let span = w.span.unwrap_or(map.len() * CONTENT_BLOCK);
    let total_blocks = span / w.block_size;
    if total_blocks < w.threads as u64 {
        bail!("the device span ({span} bytes) is too small for {} threads of {}-byte blocks", w.threads, w.block_size);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let done_bytes = Arc::new(AtomicU64::new(0));
    let done_ops = Arc::new(AtomicU64::new(0));
    let write_no = Arc::new(AtomicU64::new(0));
    let stopped_on_error = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let outs: Arc<Mutex<Vec<ThreadOut>>> = Arc::new(Mutex::new(Vec::new()));
    let mut handles = Vec::new();
    for t in 0..w.threads as u64 {
        let (w, map, stop, done_bytes, done_ops, write_no, outs, stopped) =
            (w.clone(), map.clone(), stop.clone(), done_bytes.clone(), done_ops.clone(), write_no.clone(), outs.clone(), stopped_on_error.clone());
        let region_start = total_blocks * t / w.threads as u64;
        let region_len = total_blocks * (t + 1) / w.threads as u64 - region_start;
        handles.push(std::thread::spawn(move || -> Result<()> {
            let dev = DirectDev::open(&w.device)?;
            let mut pattern = PatternGen::new(w.pattern, region_len, w.seed ^ (t + 1).wrapping_mul(0x9E37_79B9));
            let mut rng = rand::rngs::SmallRng::seed_from_u64(w.seed.wrapping_add(t));
            let mut buf = AlignedBuf::new(w.block_size as usize);
            let per = w.block_size / CONTENT_BLOCK;
            let mut out = ThreadOut {
                read: Histogram::new(3).unwrap(),
                write: Histogram::new(3).unwrap(),
                rbytes: 0,
                wbytes: 0,
                failed: Vec::new(),
                retries: 0,
                retry_time: Duration::ZERO,
            };
            while !stop.load(Relaxed) {
                // claim the op before issuing it, so size/ops bounds are exact across threads
                let b = done_bytes.fetch_add(w.block_size, Relaxed);
                let o = done_ops.fetch_add(1, Relaxed);
                if w.size.is_some_and(|s| b >= s) || w.ops.is_some_and(|n| o >= n) || w.duration.is_some_and(|d| start.elapsed() >= d) {
                    stop.store(true, Relaxed);
                    break;
                }
                let is_write = rng.random_range(0..100u8) < w.write_pct;
                let blk = region_start + pattern.next_block();
                let off = blk * w.block_size;
                let first_cblock = off / CONTENT_BLOCK;
                let mut ids = [0u64; 256];
                if is_write {
                    let n0 = write_no.fetch_add(per, Relaxed);
                    for i in 0..per {
                        let id = w.stream.id_at(n0 + i);
                        ids[i as usize] = id;
                        fill_block(id, map.seed, &mut buf[(i * CONTENT_BLOCK) as usize..((i + 1) * CONTENT_BLOCK) as usize]);
                    }
                }
                let mut attempt = 0u32;
                let t0 = Instant::now();
                let res = loop {
                    let r = if is_write { dev.write_at(&buf, off) } else { dev.read_at(&mut buf, off) };
                    match (&r, w.on_error) {
                        (Err(_), ErrorPolicy::Retry(n)) if attempt < n => {
                            let back = Duration::from_millis(1 << attempt.min(10));
                            let tr = Instant::now();
                            std::thread::sleep(back);
                            out.retry_time += tr.elapsed();
                            out.retries += 1;
                            attempt += 1;
                        }
                        _ => break r,
                    }
                };
                let lat = t0.elapsed().as_nanos() as u64;
                match res {
                    Ok(()) => {
                        if is_write {
                            out.write.saturating_record(lat);
                            out.wbytes += w.block_size;
                            for i in 0..per {
                                map.set(first_cblock + i, ids[i as usize]);
                            }
                        } else {
                            out.read.saturating_record(lat);
                            out.rbytes += w.block_size;
                        }
                    }
                    Err(e) => {
                        if is_write {
                            // content unknown after a failed write: nothing to verify there
                            for i in 0..per {
                                map.forget(first_cblock + i);
                            }
                        }
                        out.failed.push(IoError {
                            op: if is_write { "write" } else { "read" },
                            offset: off,
                            len: w.block_size,
                            errno: e.raw_os_error().unwrap_or(libc::EIO),
                        });
                        if w.on_error != ErrorPolicy::Continue && !matches!(w.on_error, ErrorPolicy::Retry(_)) {
                            stopped.store(true, Relaxed);
                            stop.store(true, Relaxed);
                        }
                    }
                }
            }
            outs.lock().unwrap().push(out);
            Ok(())
        }));
    }
    for h in handles {
        h.join().map_err(|_| anyhow::anyhow!("a workload thread panicked"))??;
    }
    let secs = start.elapsed().as_secs_f64();
    let outs = std::mem::take(&mut *outs.lock().unwrap());
    let mut read = Histogram::<u64>::new(3).unwrap();
    let mut write = Histogram::<u64>::new(3).unwrap();
    let (mut rb, mut wb, mut retries, mut rt) = (0, 0, 0, Duration::ZERO);
    let mut failed = Vec::new();
    for o in outs {
        read.add(&o.read).unwrap();
        write.add(&o.write).unwrap();
        rb += o.rbytes;
        wb += o.wbytes;
        retries += o.retries;
        rt += o.retry_time;
        failed.extend(o.failed);
    }
    failed.sort_by_key(|f| f.offset);
    let mut errors = BTreeMap::new();
    for f in &failed {
        *errors.entry(format!("{}:{}", f.op, crate::fault::rule::errno_name(f.errno))).or_insert(0) += 1;
    }
    Ok(WorkloadResult {
        seconds: secs,
        read: summary(&read, rb, secs),
        write: summary(&write, wb, secs),
        errors,
        failed_ios: failed,
        retries,
        retry_seconds: rt.as_secs_f64(),
        stopped_on_error: stopped_on_error.load(Relaxed),
    })
}
