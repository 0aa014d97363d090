//! `faultline workload` and `faultline verify`: flags or a YAML spec, a progress bar on stderr
//! (hidden when stderr is not a terminal), a result table on stdout, results in --out DIR.

use crate::spec::units::{parse_duration, parse_size};
use crate::spec::workload::config::Pattern;
use crate::spec::workload::config::{ErrorPolicy, Interface, IoEngine, SyncMode, Workload};
use crate::workload::{Maps, Progress, WorkloadResult, run};
use anyhow::{Context, Result, bail};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::Duration;

fn size_arg(s: &str) -> Result<u64, String> {
    parse_size(s)
}

#[derive(clap::Args, Debug)]
pub struct WorkloadArgs {
    /// YAML spec with a `workload:` mapping (docs/workload.md); flags given too override it.
    #[arg(long)]
    spec: Option<PathBuf>,
    /// Block interface: the device (O_DIRECT).
    #[arg(long)]
    device: Option<PathBuf>,
    /// File interface: the directory holding the files.
    #[arg(long, conflicts_with = "device")]
    dir: Option<PathBuf>,
    /// File interface: number of files.
    #[arg(long)]
    files: Option<u32>,
    /// File interface: size of each file.
    #[arg(long, value_parser = size_arg)]
    file_size: Option<u64>,
    /// sequential | uniform | hotspot | zipf:THETA
    #[arg(long)]
    pattern: Option<Pattern>,
    /// Percentage of writes (the rest are reads).
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=100))]
    write_pct: Option<u8>,
    #[arg(long, value_parser = size_arg)]
    bs: Option<u64>,
    /// psync | io_uring
    #[arg(long)]
    engine: Option<IoEngine>,
    #[arg(long)]
    iodepth: Option<u32>,
    #[arg(long)]
    threads: Option<u32>,
    /// Stop after this many bytes (reads + writes).
    #[arg(long, value_parser = size_arg)]
    size: Option<u64>,
    /// Block interface: bytes of the device used from offset 0.
    #[arg(long, value_parser = size_arg)]
    span: Option<u64>,
    /// NBD interface: the byte of the export where the workload's offset 0 lies (default 0):
    /// every request goes BASE bytes further, and --span counts from it. A networked power
    /// cut gives each client its own slice of the disk this way (docs/crash.md).
    #[arg(long, value_parser = size_arg, requires = "nbd")]
    base: Option<u64>,
    /// Stop after this many operations.
    #[arg(long)]
    ops: Option<u64>,
    /// Stop after this long, e.g. 30s.
    #[arg(long, value_parser = parse_duration)]
    duration: Option<Duration>,
    /// Target IOPS (all threads); default: peak.
    #[arg(long)]
    rate_iops: Option<u64>,
    /// none | direct | dsync | fsync:N (files; devices are always O_DIRECT)
    #[arg(long)]
    sync: Option<SyncMode>,
    /// O_DIRECT for file data whatever --sync says (a spec's `direct: true`, filebench's
    /// `directio`): with --sync dsync or fsync:N, or a personality; files and devices only.
    #[arg(long)]
    direct: bool,
    /// Write zeros into the files' holes before the run (fio's lay-out), so reads reach the
    /// device; files (--dir) only.
    #[arg(long)]
    layout: bool,
    /// continue | stop | retry:N
    #[arg(long)]
    on_error: Option<ErrorPolicy>,
    /// Time series interval (>= 10ms).
    #[arg(long, value_parser = parse_duration)]
    interval: Option<Duration>,
    /// Duplicate profile: none, a shipped profile name, or a profile file.
    #[arg(long)]
    profile: Option<String>,
    #[arg(long)]
    seed: Option<u64>,
    /// Results directory: result.json, timeseries.csv, maps.json + map files.
    #[arg(long, default_value = "faultline-workload")]
    out: PathBuf,
    /// NBD interface: the export's URI (nbd://HOST:PORT/[?timeout=..&retries=..], docs/nbd.md).
    #[arg(long, conflicts_with_all = ["device", "dir"])]
    nbd: Option<String>,
    /// Start at this CLOCK_REALTIME instant (ns since the epoch): clients on several hosts
    /// start together (the agents' controller picks it).
    #[arg(long)]
    start_at_ns: Option<u64>,
    /// Machine-readable output on stdout instead of the table, one JSON object a line:
    /// `{"start_ns"}` when the first I/O is issued, `{"t_s","ops","bytes","errors"}` every
    /// interval (deltas), `{"result": ...}` at the end (result.json's content); nothing is
    /// written to --out.
    #[arg(long)]
    jsonl: bool,
    /// With --jsonl and --nbd, for a power cut of the export's disk (the agents' controller
    /// passes it): record what each sync made durable; SIGUSR1 ends the drive (the controller
    /// saw the client fail against the dead disk); after the result line, wait for SIGUSR2
    /// (the disk powered on), reread every block written over a fresh NBD connection and
    /// print what the durability oracle found as `{"oracle": {...}}`. MODEL is the cut's
    /// survival model (`torn` allows sector-wise mixes). docs/crash.md.
    #[arg(long, value_enum, value_name = "MODEL", requires_all = ["jsonl", "nbd"])]
    crash_oracle: Option<crate::spec::disk::SurvivalModel>,
}

#[derive(clap::Args, Debug)]
pub struct VerifyArgs {
    /// Results directory of a workload (its maps.json), or an old-style map.bin with --device.
    #[arg(long)]
    map: PathBuf,
    /// The device, overriding the one recorded (it may have a new /dev/loopN after a restart).
    #[arg(long)]
    device: Option<PathBuf>,
    /// The directory of the files, overriding the one recorded (e.g. a new mount point).
    #[arg(long, conflicts_with = "device")]
    dir: Option<PathBuf>,
    /// Write the report as JSON here.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// Flags on top of the spec (or of the defaults).
fn build(a: &WorkloadArgs) -> Result<Workload> {
    let mut w = match &a.spec {
        Some(p) => {
            use crate::spec::workload::Where;
            let target = a.device.clone().map(Where::Device).or(a.dir.clone().map(Where::Dir));
            crate::spec::workload::parse_workload_file(p, target).map_err(anyhow::Error::msg)?
        }
        None => match (&a.device, &a.dir) {
            _ if a.nbd.is_some() => {
                let uri = a.nbd.as_deref().unwrap_or_default();
                Workload::new(Interface::Nbd { target: uri.parse().map_err(|e: String| anyhow::anyhow!("--nbd {uri}: {e}"))? })
            }
            (Some(d), _) => Workload::new(Interface::Block { device: d.clone() }),
            (None, Some(d)) => {
                let (Some(count), Some(size)) = (a.files.or(Some(1)), a.file_size) else { bail!("--dir needs --file-size (and --files, default 1)") };
                Workload::new(Interface::File { dir: d.clone(), count, size })
            }
            (None, None) => bail!("give --device DEV, --dir DIR, or --spec FILE"),
        },
    };
    // a flag of the other interface is an error, as a spec file's foreign keys are
    match &mut w.interface {
        Interface::File { count, size, .. } => {
            if a.span.is_some() {
                bail!("--span applies to a device (--device, --nbd); the files' bytes are --files x --file-size");
            }
            *count = a.files.unwrap_or(*count);
            *size = a.file_size.unwrap_or(*size);
        }
        _ if a.files.is_some() || a.file_size.is_some() => {
            bail!("--files and --file-size apply to files in a directory (--dir); a device's bytes used are bounded by --span")
        }
        _ => {}
    }
    macro_rules! set {
        ($($f:ident => $t:ident),*) => { $( if let Some(v) = a.$f.clone() { w.$t = v; } )* };
    }
    set!(pattern => pattern, write_pct => write_pct, bs => block_size, engine => engine, iodepth => iodepth, threads => threads,
         sync => sync, on_error => on_error, interval => interval, seed => seed);
    if a.size.is_some() || a.ops.is_some() || a.duration.is_some() {
        (w.size, w.ops, w.duration) = (a.size.or(w.size), a.ops.or(w.ops), a.duration.or(w.duration));
    }
    w.span = a.span.or(w.span);
    if let Some(b) = a.base {
        if !matches!(w.interface, Interface::Nbd { .. }) {
            bail!("--base places the workload on an NBD export (--nbd); a device or a directory is used from its offset 0");
        }
        w.base = b;
    }
    w.rate_iops = a.rate_iops.or(w.rate_iops);
    if a.layout {
        if !matches!(w.interface, Interface::File { .. }) || w.personality.is_some() {
            bail!("--layout fills the holes of the files of --dir; a device, an NBD export or a personality's file set has none to fill");
        }
        w.layout = true;
    }
    if a.direct {
        match &w.interface {
            Interface::Nbd { .. } => bail!("--direct does not apply to --nbd (requests go straight to the export, no page cache)"),
            // a device is always opened O_DIRECT
            Interface::Block { .. } => {}
            Interface::File { .. } if a.sync == Some(SyncMode::None) => {
                bail!("--sync none is buffered I/O, but --direct asks for O_DIRECT; allowed with it: --sync direct, dsync or fsync:N (or leave --sync out)")
            }
            Interface::File { .. } => {
                w.direct = true;
                if w.sync == SyncMode::None {
                    w.sync = SyncMode::Direct;
                }
            }
        }
    }
    if let Some(p) = &a.profile {
        w.profile =
            crate::spec::workload::load_profile(p, a.spec.as_ref().map(|p| p.display().to_string()).as_deref().unwrap_or("")).map_err(anyhow::Error::msg)?;
    }
    // the profile as this run's stream uses it (resolve fitted the spec's; flags may change the bounds)
    w.fit_profile();
    if a.iodepth.is_some_and(|q| q > 1) && w.engine == IoEngine::Psync {
        bail!("--iodepth > 1 needs --engine io_uring (psync has one I/O in flight per thread)");
    }
    Ok(w)
}

pub fn workload(a: WorkloadArgs) -> Result<()> {
    let w = build(&a)?;
    // the signals are the controller's words from the start: one may come early (a cut due
    // at once), and their default action would end the process and its record with it
    let oracle = match a.crash_oracle {
        Some(model) => {
            let (stop, reread) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
            signal_hook::flag::register(signal_hook::consts::SIGUSR1, stop.clone())?;
            signal_hook::flag::register(signal_hook::consts::SIGUSR2, reread.clone())?;
            Some(CrashOracle { model, stop, reread })
        }
        None => None,
    };
    if let Some(t) = a.start_at_ns {
        let now = crate::sys::now_ns();
        std::thread::sleep(Duration::from_nanos(t.saturating_sub(now)));
    }
    if a.jsonl {
        return workload_jsonl(&w, oracle.as_ref());
    }
    // every output path is checked before the workload writes anything
    if a.out.exists() && !a.out.is_dir() {
        bail!("--out {}: exists and is not a directory; give a directory for the results (created if missing)", a.out.display());
    }
    let mut maps = Maps::new(&w)?;
    let progress = Progress::new();
    let total = w.size.map(|s| (s, "bytes")).or(w.ops.map(|o| (o, "ops"))).or(w.duration.map(|d| (d.as_millis() as u64, "ms")));
    let done = std::sync::atomic::AtomicBool::new(false);
    let res = std::thread::scope(|sc| {
        let bar = sc.spawn(|| progress_bar(&progress, total, &done));
        let r = run(&w, &maps, None, Some(&progress));
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = bar.join();
        r
    })?;
    let mut res = res;
    if let Some(m) = res.maps.take() {
        maps = m;
    }
    std::fs::create_dir_all(&a.out).with_context(|| format!("cannot create {}", a.out.display()))?;
    maps.save(&a.out)?;
    std::fs::write(a.out.join("result.json"), serde_json::to_vec_pretty(&res)?)?;
    let mut csv = String::from(crate::workload::Sample::CSV_HEADER);
    csv.push('\n');
    for s in &res.timeseries {
        csv.push_str(&s.csv_row());
        csv.push('\n');
    }
    std::fs::write(a.out.join("timeseries.csv"), csv)?;
    print_table(&res);
    println!("results in {}", a.out.display());
    Ok(())
}

/// `--crash-oracle`: the cut's model and the controller's two words (signal flags).
struct CrashOracle {
    model: crate::spec::disk::SurvivalModel,
    /// SIGUSR1: end the drive.
    stop: Arc<AtomicBool>,
    /// SIGUSR2: the disk is powered on, reread.
    reread: Arc<AtomicBool>,
}

/// `--jsonl`: the workload with live per-interval lines and the result as the last line
/// (`cluster::jsonl::JsonLine`, the type run::agents reads them as); with `--crash-oracle`
/// the oracle's line after it.
fn workload_jsonl(w: &Workload, oracle: Option<&CrashOracle>) -> Result<()> {
    use crate::cluster::jsonl::{Interval, JsonLine};
    let mut maps = Maps::new(w)?;
    if oracle.is_some() {
        maps.track_durability()?;
    }
    let progress = Progress::new();
    let done = std::sync::atomic::AtomicBool::new(false);
    let line = |l: JsonLine| {
        let mut o = std::io::stdout().lock();
        let _ = writeln!(o, "{}", l.to_line()).and_then(|()| o.flush());
    };
    let res = std::thread::scope(|sc| {
        let live = sc.spawn(|| {
            while progress.start.get().is_none() && !done.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(1));
            }
            let Some(start) = progress.start.get() else { return };
            // the first I/O's instant on this host's clock
            let start_ns = crate::sys::now_ns().saturating_sub(start.elapsed().as_nanos() as u64);
            line(JsonLine::Start { start_ns });
            let (mut ops, mut bytes, mut errors) = (0, 0, 0);
            for k in 1.. {
                let due = w.interval * k;
                while start.elapsed() < due && !done.load(std::sync::atomic::Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(5).min(due.saturating_sub(start.elapsed())));
                }
                if done.load(std::sync::atomic::Ordering::Relaxed) {
                    return;
                }
                let (o, b, e) = (progress.ops(), progress.bytes(), progress.errors());
                line(JsonLine::Interval(Interval { t_s: due.as_secs_f64(), ops: o - ops, bytes: b - bytes, errors: e - errors }));
                (ops, bytes, errors) = (o, b, e);
            }
        });
        // SIGUSR1 ends the drive as Ctrl-C would: in-flight I/Os complete, every thread hands
        // its unsynced writes to the record
        let stopper = oracle.map(|o| {
            let (stop, done, progress) = (o.stop.clone(), &done, &progress);
            sc.spawn(move || {
                while !done.load(Relaxed) {
                    if stop.load(Relaxed) {
                        progress.stop.store(true, Relaxed);
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
            })
        });
        let r = run(w, &maps, None, Some(&progress));
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = live.join();
        if let Some(s) = stopper {
            let _ = s.join();
        }
        r
    })?;
    line(JsonLine::Result { result: Box::new(res) });
    if let Some(o) = oracle {
        // the controller powers the disk on, then says so; until then every read would fail.
        // (Its teardown ends this process if the word never comes.)
        while !o.reread.load(Relaxed) {
            std::thread::sleep(Duration::from_millis(10));
        }
        let report = crate::verify::crash::verify_crash(&maps, o.model == crate::spec::disk::SurvivalModel::Torn)?;
        line(JsonLine::Oracle { oracle: Box::new(report) });
    }
    Ok(())
}

fn print_table(res: &WorkloadResult) {
    let mut o = std::io::stdout().lock();
    let _ = writeln!(o, "{:<6} {:>9} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9}", "op", "ops", "IOPS", "MiB/s", "mean us", "p50 us", "p99 us", "max us");
    for (n, l) in [("read", &res.read), ("write", &res.write)] {
        let _ = writeln!(o, "{n:<6} {:>9} {:>10.0} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1}", l.ops, l.iops, l.mib_s, l.mean_us, l.p50_us, l.p99_us, l.max_us);
    }
    if !res.flowops.is_empty() {
        let _ = writeln!(o, "{:<15} {:>9} {:>10} {:>9} {:>9} {:>9} {:>9}", "flowop", "ops", "ops/s", "mean us", "p50 us", "p95 us", "p99 us");
        for (n, f) in &res.flowops {
            let _ = writeln!(o, "{n:<15} {:>9} {:>10.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1}", f.ops, f.ops_s, f.mean_us, f.p50_us, f.p95_us, f.p99_us);
        }
        let _ = writeln!(o, "R:W (readwholefile : writewholefile + appendfilerand) = {:.2}", crate::workload::personality::read_write_ratio(&res.flowops));
    }
    let ops = (res.read.ops + res.write.ops).max(1);
    let _ = writeln!(
        o,
        "{:.2} s, CPU {:.2} s ({:.2} us/op); failed I/Os {} {:?}; retries {}{}",
        res.seconds,
        res.cpu_seconds,
        res.cpu_seconds * 1e6 / ops as f64,
        res.failed_ios.len(),
        res.errors,
        res.retries,
        if res.stopped_on_error { "; stopped on error" } else { "" }
    );
}

fn progress_bar(p: &Progress, total: Option<(u64, &str)>, done: &std::sync::atomic::AtomicBool) {
    use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
    let bar = ProgressBar::with_draw_target(total.map(|t| t.0), ProgressDrawTarget::stderr());
    if !std::io::stderr().is_terminal() {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    let unit = total.map(|t| t.1).unwrap_or("ops");
    bar.set_style(ProgressStyle::with_template("{elapsed_precise} [{wide_bar}] {percent}% {msg}").unwrap());
    while !done.load(std::sync::atomic::Ordering::Relaxed) {
        let pos = match unit {
            "bytes" => p.bytes(),
            "ms" => p.elapsed().as_millis() as u64,
            _ => p.ops(),
        };
        bar.set_position(pos);
        let secs = p.elapsed().as_secs_f64().max(1e-9);
        bar.set_message(format!("{:.0} IOPS, {:.1} MiB/s, {} errors", p.ops() as f64 / secs, p.bytes() as f64 / secs / 1048576.0, p.errors()));
        std::thread::sleep(Duration::from_millis(100));
    }
    bar.finish_and_clear();
}

pub fn verify(a: VerifyArgs) -> Result<()> {
    if let Some(o) = &a.out {
        crate::sys::check_out_file(o, "--out")?;
    }
    let maps = if a.map.extension().is_some_and(|e| e == "bin") {
        // an old-style single map file: needs the device
        let Some(dev) = &a.device else { bail!("{} is a single map file: give --device", a.map.display()) };
        let m = crate::workload::content_map::ContentMap::load(&a.map)?;
        Maps { target: crate::workload::maps::Target::Block { device: dev.clone() }, seed: m.seed, maps: vec![m], durability: None }
    } else {
        let mut m = Maps::load(&a.map)?;
        match (&mut m.target, &a.device, &a.dir) {
            (crate::workload::maps::Target::Block { device }, Some(d), _) => *device = d.clone(),
            (crate::workload::maps::Target::File { dir, .. }, _, Some(d)) => *dir = d.clone(),
            (_, None, None) => {}
            _ => bail!("--device is for a block workload's maps, --dir for a file workload's"),
        }
        m
    };
    let rep = crate::verify::verify(&maps)?;
    let c = &rep.counts;
    println!(
        "checked {} blocks: ok {}, corrupted {} (misdirected {}), unreadable {}, short {}, missing {}",
        c.checked, c.ok, c.corrupted, c.misdirected, c.unreadable, c.short, c.missing
    );
    for f in rep.files.iter().filter(|f| f.counts.ok != f.counts.checked) {
        let n = &f.counts;
        println!("  {}: ok {}/{}, corrupted {}, unreadable {}, short {}, missing {}", f.path, n.ok, n.checked, n.corrupted, n.unreadable, n.short, n.missing);
    }
    if let Some(o) = a.out {
        std::fs::write(&o, serde_json::to_vec_pretty(&rep)?).with_context(|| format!("cannot write {}", o.display()))?;
    }
    Ok(())
}
