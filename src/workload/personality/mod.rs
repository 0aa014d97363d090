//! filebench's personalities (`personality: fileserver | webserver | varmail`, docs/workload.md):
//! the file sets of `fileset` are created and `prealloc`% of their files written, then each
//! thread runs the personality's flowop sequence (filebench's workloads/*.f) in a loop with
//! ordinary buffered file syscalls until a bound. Every flowop type has its own latency
//! histogram; each read/write syscall also counts in `read`/`write` and the time series.
//!
//! Files are picked like filebench's `fileset_pick`: in rotation over the existing (or the
//! not existing) files of the set, skipping busy ones; a file is busy only while a thread
//! creates, opens, deletes, stats or (varmail's `replace`) replaces it, so several threads may
//! hold one file open.
//!
//! Content map: per file, the content id of each 4 KiB block (`Live`). File sizes and appends
//! are multiples of 4 KiB, so every write covers whole blocks. Writes to one file are
//! serialized by its `Live` lock (write + map update together), so the map says exactly what
//! the file holds; a write through a descriptor opened before the file was deleted (and maybe
//! re-created: `generation` differs) goes to the unlinked inode and is not mapped; a delete drops the
//! file's blocks. At the end the files that exist are returned as the run's `Maps`.

mod flowop;
mod replace;
mod shared;
mod worker;

pub use flowop::{Flowop, Kind, append_size, flowops, reported};
pub use replace::temp_name;
use shared::{Live, Picks, Shared};
use worker::{IoBuf, Worker, options};

use super::content_map::ContentMap;
use super::entries::EntryOracle;
use super::fileset::layout;
use super::maps::{Maps, Target};
use super::op::fill;
use super::runner::{IoError, WorkloadResult};
use super::stats::{IntervalAcc, OpAcc, cpu_time, flowop_summary, sampler, summary};
use super::{Progress, WriteObserver};
use crate::spec::workload::config::{CONTENT_BLOCK, Interface, Workload};
use anyhow::{Context, Result, bail};
use std::collections::BTreeMap;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Instant;

/// Create the directories and write the preallocated files (before the timed phase, on a
/// few threads); failed writes are failed I/Os and leave their blocks unknown.
fn prealloc(sh: &Shared, failed: &Mutex<Vec<IoError>>) -> Result<()> {
    for s in &sh.layout.sets {
        let root = sh.dir.join(s.name);
        // a previous run's tree: start from an empty file set, as filebench does
        if root.exists() {
            std::fs::remove_dir_all(&root).with_context(|| format!("cannot remove {}", root.display()))?;
        }
    }
    for d in &sh.layout.dirs {
        let p = sh.dir.join(d);
        std::fs::create_dir_all(&p).with_context(|| format!("cannot create {}", p.display()))?;
    }
    let workers = sh.w.threads.clamp(1, 4) as usize;
    let chunk = (1u64 << 20).min(sh.p.iosize.max(CONTENT_BLOCK));
    std::thread::scope(|sc| -> Result<()> {
        let hs: Vec<_> = (0..workers)
            .map(|k| {
                sc.spawn(move || -> Result<()> {
                    let mut buf = IoBuf::new(chunk as usize, sh.w.o_direct())?;
                    let mut ids = Vec::new();
                    for (i, e) in sh.layout.entries.iter().enumerate().skip(k).step_by(workers) {
                        if !e.prealloc {
                            continue;
                        }
                        let p = sh.path(i);
                        let f = options(sh.w.o_direct())
                            .write(true)
                            .create(true)
                            .truncate(true)
                            .open(&p)
                            .map_err(|e| super::files::refused_direct(e, &p, sh.w.o_direct()))
                            .with_context(|| format!("cannot create {}", p.display()))?;
                        let generation = sh.renew(i);
                        if let Some(o) = &sh.oracle {
                            o.created(i, generation);
                        }
                        let mut live = sh.live[i].lock().unwrap();
                        let mut off = 0;
                        while off < e.size {
                            let n = chunk.min(e.size - off);
                            sh.draw_ids(n, &mut ids);
                            fill(sh.seed, &ids, &mut buf[..n as usize]);
                            let r = f.write_all_at(&buf[..n as usize], off);
                            live.record(off / CONTENT_BLOCK, &ids, r.is_ok());
                            if let Some(o) = &sh.oracle {
                                o.wrote(i, generation, off / CONTENT_BLOCK, &ids, r.is_ok());
                            }
                            if let Err(e) = r {
                                failed.lock().unwrap().push(IoError {
                                    op: "write".into(),
                                    file: Some(i),
                                    offset: off,
                                    len: n,
                                    errno: e.raw_os_error().unwrap_or(libc::EIO),
                                });
                            }
                            off += n;
                        }
                        drop(live);
                        sh.picks.lock().unwrap().exists[i] = true;
                    }
                    Ok(())
                })
            })
            .collect();
        for h in hs {
            h.join().map_err(|_| anyhow::anyhow!("a prealloc thread panicked"))??;
        }
        Ok(())
    })?;
    // the timed phase starts with the file set on disk, not in dirty pages
    crate::sys::mount::syncfs(&sh.dir)?;
    // syncfs wrote back the file set and flushed the disk: entries and contents are durable
    if let Some(o) = &sh.oracle {
        o.synced_all();
    }
    Ok(())
}

/// Before a `direct` run: a file system that refuses O_DIRECT is an error now, not a failed
/// open per flowop; one that takes the open but serves it through the page cache (ext4
/// `data=journal`: STATX_DIOALIGN says 0) is said on stderr, since the run is then buffered
/// in all but name.
fn probe_direct(dir: &std::path::Path) -> Result<()> {
    let p = dir.join(".faultline-direct-probe");
    let r = options(true).read(true).write(true).create(true).truncate(true).open(&p);
    let _ = std::fs::remove_file(&p);
    let f = r.map_err(|e| super::files::refused_direct(e, &p, true)).with_context(|| format!("cannot create {}", p.display()))?;
    if super::files::dio_supported(&f) == Some(false) {
        eprintln!(
            "faultline: {} takes O_DIRECT but serves it through the page cache (the kernel reports no direct I/O alignment: ext4 data=journal does this); the run's I/O is buffered",
            dir.display()
        );
    }
    Ok(())
}

/// Run a personality workload (`workload::run` calls this when `spec.personality` is set).
/// `seed` is the content seed of the maps. `durability` (a power cut is planned, or `crash
/// explore` records): follow the files' entries and contents for the durability oracle
/// (`workload::entries`) with its `power_off` switch, handing the changes to its `entry_log`
/// if it has one; the returned maps carry the record.
pub fn run(
    w: &Workload,
    seed: u64,
    durability: Option<&super::maps::Durability>,
    observer: Option<&dyn WriteObserver>,
    progress: Option<&Progress>,
) -> Result<WorkloadResult> {
    let Some(p) = &w.personality else { bail!("not a personality workload") };
    let Interface::File { dir, .. } = &w.interface else { bail!("a personality runs on files (interface: file)") };
    let own = Progress::new();
    let progress = progress.unwrap_or(&own);
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create directory {}", dir.display()))?;
    let layout = layout(p, w.seed);
    let n = layout.entries.len();
    let mut sh = Shared {
        w,
        p,
        dir: dir.clone(),
        live: (0..n).map(|_| Mutex::new(Live::default())).collect(),
        generation: (0..n).map(|_| AtomicU64::new(0)).collect(),
        temp_generation: (0..n).map(|_| AtomicU64::new(0)).collect(),
        picks: Mutex::new(Picks {
            exists: vec![false; n],
            busy: vec![false; n],
            rotor_exists: vec![0; layout.sets.len()],
            rotor_free: vec![0; layout.sets.len()],
        }),
        layout,
        stream: w.stream(),
        seed,
        write_blocks: AtomicU64::new(0),
        claimed_ops: AtomicU64::new(0),
        stop: AtomicBool::new(false),
        stopped_on_error: AtomicBool::new(false),
        observer,
        progress,
        start: Instant::now(),
        intervals: (0..w.threads).map(|_| Mutex::new(IntervalAcc::default())).collect(),
        oracle: None,
    };
    sh.oracle = durability.map(|d| {
        let mut names: Vec<PathBuf> = sh.layout.entries.iter().map(|e| e.path.clone()).collect();
        // `replace`: each file's temp is a path of its own (slot `entries + i`)
        if p.replace {
            names.extend(sh.layout.entries.iter().map(|e| temp_name(&e.path)));
        }
        let o = EntryOracle::new(names, d.power_off.clone());
        match &d.entry_log {
            Some(l) => o.with_log(l.clone()),
            None => o,
        }
    });
    if w.o_direct() {
        probe_direct(dir)?;
    }
    // every thread's buffer up front: a buffer that cannot be mapped fails the run here
    let bufs = (0..w.threads).map(|_| IoBuf::new(p.iosize.max(p.meanappendsize) as usize, w.o_direct())).collect::<Result<Vec<_>>>()?;
    let pre_failed = Mutex::new(Vec::new());
    prealloc(&sh, &pre_failed)?;
    sh.start = Instant::now();
    let sh = sh;
    let _ = progress.start.set(sh.start);
    let cpu0 = cpu_time();
    let seq = flowops(p.kind, p.replace);
    let kinds = reported(&seq);
    let done = AtomicBool::new(false);
    let (outs, timeseries, secs) = std::thread::scope(|sc| {
        let sampler = sc.spawn(|| sampler(&sh.intervals, sh.start, w.interval, &done));
        let hs: Vec<_> = bufs
            .into_iter()
            .enumerate()
            .map(|(t, buf)| {
                let (sh, seq) = (&sh, &seq);
                sc.spawn(move || {
                    let mut wk = Worker::new(sh, t, buf);
                    wk.run(seq);
                    (wk.flow, wk.read, wk.write, wk.failed, wk.skipped, wk.win)
                })
            })
            .collect();
        let outs: Vec<_> = hs.into_iter().map(|h| h.join()).collect();
        let secs = sh.start.elapsed().as_secs_f64();
        done.store(true, Relaxed);
        sampler.thread().unpark();
        let ts = sampler.join();
        (outs, ts, secs)
    });
    let cpu = cpu_time().saturating_sub(cpu0);
    let timeseries = timeseries.map_err(|_| anyhow::anyhow!("the sampler thread panicked"))?;
    let mut flow: Vec<OpAcc> = Kind::ALL.iter().map(|_| OpAcc::new()).collect();
    let (mut read, mut write) = (OpAcc::new(), OpAcc::new());
    let mut failed = pre_failed.into_inner().unwrap();
    let mut skipped_total = 0;
    let mut windows = super::windows::WindowAcc::new(w.windows, super::windows::FLOWOPS + Kind::ALL.len());
    for o in outs {
        let (f, r, wr, fl, skipped, win) = o.map_err(|_| anyhow::anyhow!("a workload thread panicked"))?;
        if let (Some(all), Some(mine)) = (windows.as_mut(), win) {
            all.merge(mine);
        }
        for (a, b) in flow.iter_mut().zip(&f) {
            a.h.add(&b.h).unwrap();
            a.bytes += b.bytes;
        }
        read.h.add(&r.h).unwrap();
        read.bytes += r.bytes;
        write.h.add(&wr.h).unwrap();
        write.bytes += wr.bytes;
        failed.extend(fl);
        skipped_total += skipped;
    }
    failed.sort_by_key(|f| (f.file, f.offset));
    let mut errors = BTreeMap::new();
    for f in &failed {
        *errors.entry(format!("{}:{}", f.op, crate::spec::rule::errno_name(f.errno))).or_insert(0) += 1;
    }
    let mut flowops_out = BTreeMap::new();
    for k in &kinds {
        let a = &flow[*k as usize];
        flowops_out.insert(k.name().to_string(), flowop_summary(&a.h, a.bytes, secs));
    }
    let mut sh = sh;
    let durability = sh.oracle.take().map(super::maps::Durability::of_entries);
    let maps = final_maps(&sh, durability);
    let named: Vec<(usize, &str)> = kinds.iter().map(|k| (super::windows::FLOWOPS + *k as usize, k.name())).collect();
    let windows = windows.map(|a| a.summaries(secs, w.duration, &named)).unwrap_or_default();
    Ok(WorkloadResult {
        windows,
        nbd_client: None,
        nbd_client_intervals: vec![],
        seconds: secs,
        read: summary(&read.h, read.bytes, secs),
        write: summary(&write.h, write.bytes, secs),
        errors,
        failed_ios: failed,
        retries: 0,
        retry_seconds: 0.0,
        stopped_on_error: sh.stopped_on_error.load(Relaxed),
        cpu_seconds: cpu.as_secs_f64(),
        timeseries,
        flowops: flowops_out,
        flowops_skipped: skipped_total,
        maps: Some(maps),
    })
}

/// The maps of the files that exist at the end, named by their path below the directory.
fn final_maps(sh: &Shared, durability: Option<super::maps::Durability>) -> Maps {
    let picks = sh.picks.lock().unwrap();
    let mut names = Vec::new();
    let mut maps = Vec::new();
    for (i, e) in sh.layout.entries.iter().enumerate() {
        if !picks.exists[i] {
            continue;
        }
        let live = sh.live[i].lock().unwrap();
        let m = ContentMap::new(live.blocks.len() as u64, CONTENT_BLOCK as u32, sh.seed);
        for (b, id) in live.blocks.iter().enumerate() {
            if let Some(id) = id {
                m.set(b as u64, *id);
            }
        }
        names.push(e.path.display().to_string());
        maps.push(m);
    }
    Maps { target: Target::File { dir: sh.dir.clone(), names }, seed: sh.seed, maps, durability }
}

/// The R:W ratio of flowops the study quotes: reads (readwholefile) per write (writewholefile
/// + appendfilerand), from a result's `flowops`.
pub fn read_write_ratio(flowops: &BTreeMap<String, super::stats::FlowopSummary>) -> f64 {
    let get = |k: Kind| flowops.get(k.name()).map(|s| s.ops).unwrap_or(0) as f64;
    let r = get(Kind::ReadWholeFile);
    let w = get(Kind::WriteWholeFile) + get(Kind::AppendFileRand);
    if w == 0.0 { f64::INFINITY } else { r / w }
}
