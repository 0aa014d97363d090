//! `faultline run FILE`: one experiment in, one results directory out. Every repetition goes
//! through one pipeline (`pipeline`: build, arm, drive, crash + check, verify, collect,
//! teardown); where its parts run is the placement: `Local` (disk servers and the stack on
//! this machine, the workload in this process, timed layer by layer by the BPF monitor unless
//! `monitor: off`), `hosts::Namespaces` (hosts as network namespaces) or `agents::Agents`
//! (hosts reached through agents). Teardown happens on success, error and Ctrl-C (Drop of
//! every part too), and `faultline cleanup` after a crash.
//! Setups run interleaved (repetition 1 of each, then 2, ...); with `baseline: true` each
//! repetition is first run with no fault armed, then with the setup's faults; with
//! `baseline: windows` each run arms them in alternating windows (`windows`).

pub mod agents;
mod crash;
pub mod disks;
pub mod hosts;
pub mod pipeline;
pub mod probe;
pub mod schedule;
mod windows;

use crate::report::collect;
use crate::report::model as rm;
use crate::spec::experiment::{Experiment, Setup};
use crate::spec::stack::StackSpec;
use crate::spec::workload::config::CONTENT_BLOCK;
use crate::workload::{Maps, Progress, WorkloadResult};
use anyhow::{Context, Result, bail};
use disks::DiskServer;
use pipeline::{FaultControl, Outcome, Placement, Rep};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

pub struct RunOptions {
    /// Results directory; default `results/<name>-<unix time>`.
    pub out: Option<PathBuf>,
    /// No progress bar (also when stderr is not a terminal).
    pub quiet: bool,
}

/// Run every setup and repetition; returns the results directory.
pub fn run(exp: &Experiment, opts: &RunOptions) -> Result<PathBuf> {
    crate::frontend::preflight()?;
    let started = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs();
    let out = opts.out.clone().unwrap_or_else(|| PathBuf::from("results").join(format!("{}-{started}", exp.name)));
    if out.exists() && std::fs::read_dir(&out).map(|mut d| d.next().is_some()).unwrap_or(false) {
        bail!("results directory {} exists and is not empty; choose another with --out (nothing is overwritten)", out.display());
    }
    // a run that fails before any repetition finished takes its directory away again (or, given
    // empty, empties it): it holds nothing of use. Once one finished, its maps (if any) are kept.
    let made = out.ancestors().take_while(|a| !a.as_os_str().is_empty() && !a.exists()).last().map(Path::to_path_buf);
    std::fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
    let mut finished = 0;
    let r = run_in(exp, opts, &out, started, &mut finished);
    let holds_files = std::fs::read_dir(&out).is_ok_and(|mut d| d.next().is_some());
    if r.is_err() && finished > 0 && holds_files {
        return r.map(|()| out.clone()).with_context(|| format!("what the {finished} repetition(s) that finished left is kept in {}", out.display()));
    }
    if r.is_err() {
        match &made {
            Some(m) => {
                let _ = std::fs::remove_dir_all(m);
            }
            None => {
                for e in std::fs::read_dir(&out).into_iter().flatten().flatten() {
                    let _ = if e.file_type().is_ok_and(|t| t.is_dir()) { std::fs::remove_dir_all(e.path()) } else { std::fs::remove_file(e.path()) };
                }
            }
        }
    }
    r.map(|()| out)
}

/// `run` once its results directory `out` exists; `finished` counts the repetitions that ended well.
fn run_in(exp: &Experiment, opts: &RunOptions, out: &Path, started: u64, finished: &mut u32) -> Result<()> {
    // Ctrl-C / SIGTERM stop the workload; everything built is then torn down in order
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone())?;
    }
    let experiment_json: serde_json::Value = serde_saphyr::from_str(&exp.text).unwrap_or(serde_json::Value::Null);
    let mut results = rm::Results {
        schema: rm::SCHEMA,
        faultline_version: env!("CARGO_PKG_VERSION").to_string(),
        name: exp.name.clone(),
        started_unix: started,
        experiment: experiment_json,
        setups: Vec::new(),
        failed: Vec::new(),
    };
    // with `baseline: true` every repetition is a pair: the setup without faults, then with
    let runs_per_rep: u32 = if exp.baseline { 2 } else { 1 };
    let total: u32 = exp.setups.iter().map(|s| s.repeat).sum::<u32>() * runs_per_rep;
    let max_repeat = exp.setups.iter().map(|s| s.repeat).max().unwrap_or(0);
    let mut done: Vec<(Vec<rm::Repetition>, Vec<rm::Repetition>)> = vec![Default::default(); exp.setups.len()];
    let mut n = 0;
    let mut failed_setups = std::collections::BTreeSet::new();
    // through agents: every setup's faults and workload are checked on the hosts before any
    // setup runs (a host that cannot apply a fault says so now, not halfway through)
    if exp.hosts.as_ref().is_some_and(|h| !h.agents.is_empty()) {
        agents::preflight(exp)?;
    }
    // interleaved: repetition 1 of every setup, then repetition 2, ..., so slow drift of the
    // machine spreads over all setups instead of hitting the last ones
    for rep in 0..max_repeat {
        for (si, setup) in exp.setups.iter().enumerate() {
            if rep >= setup.repeat || failed_setups.contains(&si) {
                continue;
            }
            for baseline in [true, false].into_iter().skip(if exp.baseline { 0 } else { 1 }) {
                n += 1;
                if stop.load(Relaxed) {
                    bail!("interrupted; everything built was torn down; partial results not written");
                }
                let unarmed;
                let (s, kind) = if baseline {
                    unarmed = Setup { faults: Vec::new(), power_cut: None, host_faults: Vec::new(), net_faults: Vec::new(), ..setup.clone() };
                    (&unarmed, " baseline")
                } else {
                    (setup, "")
                };
                let label = format!("[{n}/{total}] {} rep {}{kind}", setup.name, rep + 1);
                if !opts.quiet {
                    let cut = s.power_cut.as_ref().map(|c| format!(", power cut {} {}", c.model, crash::trigger_text(c.trigger))).unwrap_or_default();
                    eprintln!("faultline: {label}: {} stack, {} fault(s){cut}", s.stack.label(), s.faults.len());
                }
                let t = Instant::now();
                let cx = Rep { exp, setup: s, index: rep, baseline, out, label: &label, stop: &stop, quiet: opts.quiet, notes: Vec::new() };
                let r = match &exp.hosts {
                    Some(h) if !h.agents.is_empty() => pipeline::run_repetition(&mut agents::Agents::new(h), cx),
                    Some(h) => pipeline::run_repetition(&mut hosts::Namespaces::new(h), cx),
                    None => pipeline::run_repetition(&mut Local::default(), cx),
                };
                // a failed repetition (a stack that would not build, a tool's error) is recorded
                // and the run goes on with the next setup: one bad setup of a long study must not
                // cost the results of the others. Ctrl-C still ends the run.
                let mut r = match r {
                    Ok(r) => r,
                    Err(e) if !stop.load(Relaxed) => {
                        let error = format!("{e:#}");
                        eprintln!("faultline: {label}: failed: {error}; going on with the next setup");
                        results.failed.push(rm::FailedRun { setup: setup.name.clone(), repetition: rep + 1, baseline, error });
                        failed_setups.insert(si);
                        break;
                    }
                    Err(e) => return Err(e.context(format!("setup `{}`, repetition {}{kind}", setup.name, rep + 1))),
                };
                r.sequence = n;
                r.baseline = baseline;
                if !opts.quiet {
                    let c = r.counts();
                    eprintln!(
                        "faultline: {label}: done in {:.1} s: write {:.1} MiB/s, {} fault(s) injected, {} failure(s) ({} silent)",
                        t.elapsed().as_secs_f64(),
                        r.write.mib_s,
                        c.faults_injected,
                        c.failures,
                        c.silent
                    );
                }
                if stop.load(Relaxed) {
                    bail!("interrupted during {label}; everything built was torn down");
                }
                *finished += 1;
                if baseline { done[si].0.push(r) } else { done[si].1.push(r) }
            }
        }
    }
    // nothing finished: there is nothing to write, and the failures are the run's error
    if *finished == 0 && !results.failed.is_empty() {
        let each: Vec<String> = results.failed.iter().map(|f| format!("setup `{}`, repetition {}: {}", f.setup, f.repetition, f.error)).collect();
        bail!("{}", each.join("; "));
    }
    for (si, (setup, (baseline, reps))) in exp.setups.iter().zip(done).enumerate() {
        // a failed setup is left out whole (`failed` says why): its finished repetitions would
        // stand for the setup as if complete, or leave a baseline run without its pair
        if failed_setups.contains(&si) {
            continue;
        }
        let mut s = rm::SetupResult {
            name: setup.name.clone(),
            stack: setup.stack.label(),
            description: setup.description.clone(),
            repetitions: reps,
            baseline,
            axes: setup.axes.clone(),
            window_plan: exp.windows,
            ..Default::default()
        };
        s.aggregate_now();
        results.setups.push(s);
    }
    crate::report::write_dir(out, &results)?;
    print!("{}", crate::report::summary_table(&results));
    println!("results: {}", out.display());
    if !results.failed.is_empty() {
        let which: Vec<String> = results.failed.iter().map(|f| format!("`{}` repetition {}", f.setup, f.repetition)).collect();
        bail!(
            "{} of {} setup(s) failed ({}); the others' results are in {} (results.json `failed` and report.html say why)",
            failed_setups.len(),
            exp.setups.len(),
            which.join(", "),
            out.display()
        );
    }
    Ok(())
}

/// Progress line on stderr: setup, bytes, ops, errors, elapsed.
fn progress_thread(label: String, p: Arc<Progress>, size: Option<u64>, done: Arc<AtomicBool>, quiet: bool) -> Option<std::thread::JoinHandle<()>> {
    use std::io::IsTerminal;
    if quiet || !std::io::stderr().is_terminal() {
        return None;
    }
    Some(std::thread::spawn(move || {
        let bar = match size {
            Some(s) => indicatif::ProgressBar::new(s),
            None => indicatif::ProgressBar::no_length(),
        };
        bar.set_style(
            indicatif::ProgressStyle::with_template("{prefix} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} {binary_bytes_per_sec} {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar.set_prefix(label);
        while !done.load(Relaxed) {
            bar.set_position(p.bytes());
            bar.set_message(format!("{} ops, {} errors", p.ops(), p.errors()));
            std::thread::sleep(Duration::from_millis(100));
        }
        bar.finish_and_clear();
    }))
}

/// The marks a recording disk gets when the workload starts and when it returned (after its
/// own final fsyncs), docs/crash.md.
pub const MARK_START: &str = "workload-start";
pub const MARK_END: &str = "workload-end";

/// Everything one repetition builds, dropped (torn down) in reverse order of creation.
struct Built {
    stack: Option<crate::stack::fs::BuiltStack>,
    disks: Vec<Arc<DiskServer>>,
    devices: Vec<PathBuf>,
    mountpoint: Option<PathBuf>,
}

impl Built {
    /// Tear down in order (stack, then disks); returns notes (e.g. a lazy unmount).
    fn teardown(mut self) -> Result<Vec<String>> {
        let mut first = None;
        let mut notes = Vec::new();
        if let Some(s) = self.stack.take() {
            match s.teardown() {
                Ok(n) => notes.extend(n),
                Err(e) => {
                    first.get_or_insert(e);
                }
            }
        }
        for d in self.disks.drain(..).rev() {
            if let Err(e) = d.stop() {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(notes), Err)
    }

    fn stack(&mut self) -> &mut crate::stack::fs::BuiltStack {
        self.stack.as_mut().expect("built before the workload runs")
    }
}

/// The local placement: one disk server per disk the stack needs, the stack on their
/// devices, the workload in this process (with the scheduler placing faults by its progress),
/// verified after the drive.
#[derive(Default)]
pub(crate) struct Local {
    built: Option<Built>,
    /// Each disk's fault-log position at arm.
    seq0: Vec<u64>,
    /// Faults placed by workload progress, for the scheduler.
    scheduled: Vec<crate::spec::rule::yaml::FaultSpec>,
    /// The disks' `nbd://` store clients' counters at the start of the drive.
    nbd0: Vec<Option<crate::nbd::client::CounterSnapshot>>,
    /// The workload's content maps, once it ran (not for a command stack).
    maps: Option<Maps>,
    /// The power cut of the drive, once it came (crash + check completes the record).
    crash: Option<rm::CrashRecord>,
    /// `acks: true`: the command's acknowledgements file.
    acks: Option<PathBuf>,
    /// `baseline: windows`: the faults armed in the windows once the workload starts, and
    /// when the fault clocks restarted.
    windowed: Option<(Vec<crate::spec::rule::yaml::FaultSpec>, windows::Epoch)>,
}

impl Local {
    fn built(&mut self) -> &mut Built {
        self.built.as_mut().expect("built before the later phases")
    }
}

impl Placement for Local {
    fn build(&mut self, r: &mut Rep) -> Result<()> {
        self.built = Some(build(r)?);
        Ok(())
    }

    fn arm(&mut self, r: &mut Rep) -> Result<()> {
        let built = self.built();
        let disks: Vec<&dyn FaultControl> = built.disks.iter().map(|d| &**d as &dyn FaultControl).collect();
        if r.exp.windows.is_some() {
            // the spec allows only faults armed from the start here; they go in with the windows
            let (seq0, epoch) = windows::restart_clocks(&disks)?;
            self.seq0 = seq0;
            self.windowed = Some((r.setup.faults.clone(), epoch));
            return Ok(());
        }
        (self.seq0, self.scheduled) = pipeline::arm_faults(&disks, &r.setup.faults)?;
        Ok(())
    }

    fn drive(&mut self, r: &mut Rep, o: &mut Outcome) -> Result<()> {
        let scheduled = std::mem::take(&mut self.scheduled);
        let built = self.built.as_mut().expect("built before the drive");
        self.nbd0 = built.disks.iter().map(|d| Ok(d.stats()?.nbd_client)).collect::<Result<_>>()?;
        // `baseline: windows`: the workload's windows, for the monitor to sort into
        let workload = match &r.setup.stack {
            StackSpec::Command { .. } => None,
            _ => {
                let target = built.mountpoint.clone().unwrap_or_else(|| built.devices[0].clone());
                let mut w = r.exp.workload_for(r.setup, &target).map_err(anyhow::Error::msg)?;
                w.windows = r.exp.windows;
                Some(w)
            }
        };
        let windows = workload.as_ref().and_then(|w| w.windows.map(|p| Arc::new(crate::monitor::Windows::new(p, p.count(w.duration.unwrap_or_default())))));
        let mut mon = start_monitor(r, built, windows)?;
        let hosts = start_host_faults(r, built)?;
        let cpu0 = drive_cpu(built);
        if let StackSpec::Command { command, .. } = &r.setup.stack {
            if command.acks {
                let kind = if r.baseline { "-baseline" } else { "" };
                // a matrix setup's name has `/`s: its acks file sits in folders of those names
                let p = r.out.join("acks").join(format!("{}{kind}-{}.txt", r.setup.name, r.index + 1));
                let dir = p.parent().expect("a file in acks/");
                std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
                std::fs::File::create(&p).with_context(|| format!("cannot create {}", p.display()))?;
                self.acks = Some(std::path::absolute(&p)?);
            }
            self.crash = drive_command(r, built, self.acks.as_deref())?;
        } else {
            let w = workload.expect("a workload unless the stack is a command");
            let mut maps = Maps::new(&w)?;
            if r.setup.power_cut.is_some() {
                if matches!(w.interface, crate::workload::Interface::Nbd { .. }) {
                    bail!("a power cut needs the workload on the stack's device or files, not `interface: nbd`");
                }
                maps.track_durability()?;
            }
            let windowed = self.windowed.take();
            let (res, cut, clock) = drive_workload(r, built, &w, &mut maps, scheduled, windowed, mon.as_mut())?;
            o.workload = Some(res);
            o.window_clock = clock;
            self.crash = cut;
            self.maps = Some(maps);
        }
        o.host_faults = hosts.map(|h| h.stop()).unwrap_or_default();
        let cpu1 = drive_cpu(built);
        o.drive_cpu_s = Some(rm::DriveCpu { workload: cpu1.workload - cpu0.workload, disks: cpu1.disks - cpu0.disks });
        // the verifier's reads are not the workload's: they stay out of the figures
        o.monitor = stop_monitor(r, mon.take(), built, o.workload.as_ref().map(|w| w.windows.len()));
        Ok(())
    }

    /// After a cut: the stack comes down without a flush (nothing reaches the powered-off
    /// disk), the disk powers on, the devices' caches are dropped, the file system mounts
    /// (its journal replays) and unmounts, its check runs, it mounts again, and the oracle
    /// and the application's check read what survived.
    fn crash(&mut self, r: &mut Rep, o: &mut Outcome) -> Result<()> {
        let Some(mut rec) = self.crash.take().and_then(|rec| crash::begin(rec, r, o, "")) else { return Ok(()) };
        let t = Instant::now();
        let cut = r.setup.power_cut.as_ref().expect("a cut fired");
        let built = self.built.as_mut().expect("built before the crash");
        let disk = built.disks[cut.disk].clone();
        let stack = built.stack.as_mut().expect("built before the crash");
        if let Some(a) = &self.acks {
            rec.acks = Some(crash::count_lines(a));
            rec.acks_file = Some(a.display().to_string());
        }
        stack.crash_unmount()?;
        // while off: dirty pages of the device's cache fail to write and are dropped
        stack.drop_device_cache()?;
        disk.power_on()?;
        stack.drop_device_cache()?;
        let has_fs = stack.mountpoint.is_some();
        let mut mounted = false;
        if has_fs {
            // the check reads the state a reboot's mount leaves: e2fsck -n and xfs_repair -n
            // do not replay a journal, and report its unreplayed transactions as damage
            match stack.remount() {
                Ok(()) => {
                    rec.mount = Some("ok".into());
                    stack.unmount_kept()?;
                }
                Err(e) => rec.mount = Some(format!("{e:#}")),
            }
            rec.check = stack.fs_check()?;
            if rec.mount.as_deref() == Some("ok") {
                stack.remount()?;
                mounted = true;
            }
        }
        if let Some(maps) = &self.maps
            && (mounted || !has_fs)
        {
            r.phase("crash: durability oracle");
            rec.oracle = Some(crate::verify::crash::verify_crash(maps, rec.model == Some(crate::disk::cache::SurvivalModel::Torn))?);
        }
        if let StackSpec::Command { command, .. } = &r.setup.stack
            && let Some(check) = &command.check
        {
            if mounted || !has_fs {
                r.phase("crash: application check");
                let mut env = stack.command_env();
                env.acks = self.acks.clone();
                rec.app_check = Some(crash::app_check(check, &env, r.stop)?);
            } else {
                r.notes.push("the application check did not run: the file system did not mount after the cut".into());
            }
        }
        rec.phase_s = t.elapsed().as_secs_f64();
        o.crash = Some(rec);
        Ok(())
    }

    /// Reread every mapped block from the disk (not the page cache) and classify it.
    fn verify(&mut self, r: &mut Rep, o: &mut Outcome) -> Result<()> {
        // after a power cut the oracle classified the blocks (crash): unsynced losses are
        // allowed there, and would read as corruption here
        if o.crash.as_ref().is_some_and(|c| c.fired) {
            return Ok(());
        }
        let Some(maps) = &self.maps else { return Ok(()) };
        let built = self.built.as_mut().expect("built before verify");
        built.stack().cold_cache()?;
        r.phase("verify");
        o.verified = Some(crate::verify::verify(maps)?);
        Ok(())
    }

    fn collect(&mut self, r: &mut Rep, o: &mut Outcome) -> Result<()> {
        if let Some(maps) = &self.maps {
            let kind = if r.baseline { "-baseline" } else { "" };
            maps.save(&r.out.join("maps").join(format!("{}{kind}-{}", r.setup.name, r.index + 1)))?;
        }
        let built = self.built.as_mut().expect("built before collect");
        r.notes.extend(built.stack.as_ref().map(|s| s.health()).unwrap_or_default());
        let disks: Vec<&dyn FaultControl> = built.disks.iter().map(|d| &**d as &dyn FaultControl).collect();
        (o.faults, o.rules) = pipeline::collect_faults(&disks, &self.seq0, &mut r.notes)?;
        let stats: Vec<_> = built.disks.iter().map(|d| d.stats()).collect::<Result<_>>()?;
        let mut nbd1 = Vec::new();
        for (i, s) in stats.into_iter().enumerate() {
            // a disk without a model is listed too once a held delay used its implicit channel
            if s.latency_model.is_some() || s.held.is_some() {
                let stats = s.latency_model.unwrap_or_default();
                o.latency_model.push(rm::DiskLatencyModel { disk: i as u32, stats, reply_lateness: Some(s.faults.delay_lateness), held: s.held });
            }
            nbd1.push(s.nbd_client);
        }
        o.nbd_client = collect::nbd_client(&self.nbd0, &nbd1);
        Ok(())
    }

    fn teardown(&mut self, r: &mut Rep) -> Result<()> {
        if let Some(b) = self.built.take() {
            r.notes.extend(b.teardown()?);
        }
        Ok(())
    }
}

/// CPU time used so far by this process and by the disk servers.
fn drive_cpu(built: &Built) -> rm::DriveCpu {
    let secs = |p: u32| crate::sys::process::cpu_time(p).map_or(0.0, |d| d.as_secs_f64());
    rm::DriveCpu { workload: secs(std::process::id()), disks: built.disks.iter().filter_map(|d| d.pid()).map(secs).sum() }
}

/// Start the setup's host faults on its disk servers, windows counted from now (the drive
/// phase); what this host cannot apply fails the repetition before the workload starts.
fn start_host_faults(r: &Rep, built: &Built) -> Result<Option<crate::host::Schedule>> {
    let faults = &r.setup.host_faults;
    if faults.is_empty() {
        return Ok(None);
    }
    crate::host::check(faults, false)?;
    let pids: Vec<u32> = built.disks.iter().filter_map(|d| d.pid()).collect();
    let targets = crate::host::Targets { pids, restart: None };
    Ok(Some(crate::host::Schedule::start(faults.clone(), targets, Instant::now())?))
}

/// Start the BPF monitor on the setup's devices for the drive phase: the block layer, the
/// tracepoint pairs of the layers asked for (`monitor: {layers}`; file-system, journal,
/// driver), the experiment's `extra` pairs, and with `syscall` the run's own I/O calls.
/// `auto`: where it cannot load, the repetition runs without it and its notes say why; `on`:
/// that is an error.
fn start_monitor(r: &mut Rep, built: &Built, windows: Option<Arc<crate::monitor::Windows>>) -> Result<Option<Monitors>> {
    use crate::spec::experiment::MonitorMode;
    let exp = r.exp;
    if exp.monitor.mode == MonitorMode::Off {
        return Ok(None);
    }
    // per-window histograms are hash maps allocated as used, which tracing programs may only
    // hold from Linux 6.1 (earlier kernels warn in their log, or refuse on PREEMPT_RT)
    let windows = match crate::sys::kernel_version() {
        Some(v) if windows.is_some() && v < (6, 1) => {
            r.notes.push(format!("monitor: no per-window figures: they need Linux 6.1+, this is {}.{}; the monitor's figures are the whole run's", v.0, v.1));
            None
        }
        _ => windows,
    };
    let block = match crate::monitor::BlockMonitor::start(&built.devices, exp.monitor.interval, windows.clone()) {
        Ok(m) => m,
        Err(e) if exp.monitor.mode == MonitorMode::Auto => {
            r.notes.push(format!("monitor: off, BPF unavailable (monitor: auto): {}", format!("{e:#}").lines().next().unwrap_or("")));
            return Ok(None);
        }
        Err(e) => return Err(e.context("monitor: on")),
    };
    let extra = exp
        .monitor
        .extra
        .iter()
        .map(|x| crate::monitor::pairs::Pair::user(&x.name, &x.enter, &x.exit, x.key.as_deref()).map_err(anyhow::Error::msg))
        .collect::<Result<Vec<_>>>()?;
    let (pairs, notes) = crate::monitor::start_pairs(&built.devices, &[], extra, &exp.monitor.layers, windows.clone()).context("monitor: extra")?;
    r.notes.extend(notes.into_iter().map(|n| format!("monitor: {n}")));
    // the workload runs in this process's threads: its I/O system calls are this process's
    let sys = if !exp.monitor.layers.iter().any(|l| l == "syscall") {
        None
    } else {
        match crate::monitor::SyscallMonitor::start(&[std::process::id()], windows.clone()) {
            Ok(m) => Some(m),
            Err(e) => {
                r.notes.push(format!("monitor: syscall layer not timed: {}", format!("{e:#}").lines().next().unwrap_or("")));
                None
            }
        }
    };
    // the daemons' service counters, to be differenced at the end (their part of block_service)
    let service0 = built.disks.iter().map(service_counts).collect();
    Ok(Some(Monitors { block, pairs, sys, service0, windows, clock: None }))
}

/// The monitors of one drive phase.
struct Monitors {
    block: crate::monitor::BlockMonitor,
    pairs: Option<crate::monitor::PairMonitor>,
    sys: Option<crate::monitor::SyscallMonitor>,
    service0: Vec<Option<ServiceCounts>>,
    /// `baseline: windows`: the windows the monitors sort into, and what the thread that gave
    /// them the workload's start saw.
    windows: Option<Arc<crate::monitor::Windows>>,
    clock: Option<Result<Option<windows::MonitorClock>>>,
}

/// A disk daemon's service counters: op -> (count, service ns, held delay ns).
pub(crate) type ServiceCounts = std::collections::BTreeMap<String, (u64, u64, u64)>;

/// The daemon's service counters per op since it started (`stats`' `service`); None if the
/// daemon did not answer.
fn service_counts(d: &Arc<DiskServer>) -> Option<ServiceCounts> {
    Some(d.stats().ok()?.service.into_iter().map(|(k, o)| (k, (o.count, o.service_ns, o.delay_ns))).collect())
}

/// Stop the monitors; `windows`: the workload's whole windows (`baseline: windows`).
fn stop_monitor(r: &mut Rep, m: Option<Monitors>, built: &Built, windows: Option<usize>) -> Option<crate::monitor::MonitorResults> {
    let m = m?;
    let service1: Vec<_> = built.disks.iter().map(service_counts).collect();
    let pairs = m.pairs.map(|p| p.stop());
    let sys = m.sys.map(|s| s.stop());
    match m.block.stop() {
        Ok(mut res) => {
            for ((dev, before), after) in built.devices.iter().zip(&m.service0).zip(&service1) {
                let (Some(before), Some(after), Some(d)) = (before, after, res.devices.iter_mut().find(|d| std::path::Path::new(&d.device) == dev)) else {
                    continue;
                };
                d.daemon = after
                    .iter()
                    .filter_map(|(op, a)| crate::monitor::model::DaemonOp::between(before.get(op).copied().unwrap_or_default(), *a).map(|o| (op.clone(), o)))
                    .collect();
            }
            match pairs {
                Some(Ok(p)) => res.add_pairs(p),
                Some(Err(e)) => res.notes.push(format!("tracepoint pairs failed: {e:#}")),
                None => {}
            }
            match sys {
                Some(Ok(s)) => res.add_syscalls(&[std::process::id()], s),
                Some(Err(e)) => res.notes.push(format!("syscall layer failed: {e:#}")),
                None => {}
            }
            if let Some(w) = &m.windows {
                monitor_windows(&mut res, w, m.clock, windows.unwrap_or(0));
            }
            r.notes.extend(res.notes.iter().map(|n| format!("monitor: {n}")));
            Some(res)
        }
        Err(e) => {
            r.notes.push(format!("monitor: failed: {e:#}"));
            None
        }
    }
}

/// `baseline: windows`: keep the monitor's windows that it covered from their measured span's
/// start (the workload's start reached the kernel before it) and that the workload kept
/// (`kept`, its whole windows), with the daemons' figures between the samples at their edges.
fn monitor_windows(res: &mut crate::monitor::MonitorResults, w: &crate::monitor::Windows, clock: Option<Result<Option<windows::MonitorClock>>>, kept: usize) {
    let clock = match clock {
        Some(Ok(Some(c))) => c,
        Some(Err(e)) => {
            res.notes.push(format!("windows: the monitor was not given the workload's start: {e:#}"));
            res.windows.clear();
            return;
        }
        _ => {
            res.windows.clear();
            return;
        }
    };
    res.windows.truncate(kept);
    let before = res.windows.len();
    res.windows.retain(|x| w.covered(x.index, clock.start.set_at_s));
    if res.windows.len() < before {
        res.notes.push(format!(
            "windows: the workload's start reached the monitor {:.3} s into the workload, after {} window(s) began: those have no monitor figures",
            clock.start.set_at_s,
            before - res.windows.len()
        ));
    }
    // the daemons' figures where both reads fell inside the span: then every request counted
    // between them was answered inside it
    let mut outside = 0;
    for (k, from, to) in &clock.edges {
        let Some(win) = res.windows.iter_mut().find(|x| x.index == *k) else { continue };
        if from.from_s < win.from_s || to.to_s > win.to_s {
            outside += 1;
            continue;
        }
        for (i, d) in win.devices.iter_mut().enumerate() {
            let (Some(Some(a)), Some(Some(b))) = (from.counts.get(i), to.counts.get(i)) else { continue };
            d.daemon = b
                .iter()
                .filter_map(|(op, x)| crate::monitor::model::DaemonOp::between(a.get(op).copied().unwrap_or_default(), *x).map(|o| (op.clone(), o)))
                .collect();
            d.daemon_span = Some([from.to_s, to.from_s]);
        }
    }
    if outside > 0 {
        res.notes.push(format!("windows: {outside} window(s) without the daemon's figures: its counters could not be read inside their span"));
    }
    res.window_start = Some(clock.start);
}

/// Build: one disk server per disk the stack needs, then the stack on their devices.
fn build(r: &mut Rep) -> Result<Built> {
    let setup = r.setup;
    let mut built = Built { stack: None, disks: Vec::new(), devices: Vec::new(), mountpoint: None };
    for i in 0..setup.stack.devices_needed() {
        built.disks.push(Arc::new(DiskServer::start(&setup.disk, i)?));
    }
    built.devices = built.disks.iter().map(|d| d.device.clone()).collect();
    let shown: Vec<String> = built.devices.iter().map(|d| d.display().to_string()).collect();
    r.phase(&format!("build: {} stack on {}", setup.stack.label(), shown.join(" ")));
    built.stack = Some(crate::stack::fs::BuiltStack::build(&setup.stack, &built.devices)?);
    built.mountpoint = built.stack.as_ref().and_then(|s| s.mountpoint.clone());
    for (i, d) in built.disks.iter().enumerate() {
        if d.transport != "io_uring" {
            r.notes.push(format!("disk {i}: requests over {}", d.transport));
        }
        if let Some(why) = &d.cpu_latency_unavailable {
            r.notes.push(format!("disk {i}: CPU latency left alone (cpu_latency auto: {why})"));
        }
    }
    Ok(built)
}

/// The record of a power cut about to be watched for (completed by the crash phase).
fn crash_record(spec: &crate::spec::rule::yaml::PowerCutSpec, seed: u64) -> rm::CrashRecord {
    rm::CrashRecord { fault: spec.label.clone(), model: Some(spec.model), seed, trigger: crash::trigger_text(spec.trigger), ..Default::default() }
}

/// A cut's outcome into its record.
fn crash_fired(rec: &mut rm::CrashRecord, cut: Option<crash::Cut>) {
    if let Some(c) = cut {
        rec.fired = true;
        rec.t_s = c.t_s;
        rec.cut = Some(c.report);
    }
}

/// Drive a `command` stack: the user's command is the workload. With a power cut, its
/// process group dies with the power.
fn drive_command(r: &mut Rep, built: &Built, acks: Option<&Path>) -> Result<Option<rm::CrashRecord>> {
    let StackSpec::Command { command, .. } = &r.setup.stack else { unreachable!("a command stack") };
    r.phase("command");
    let stack = built.stack.as_ref().expect("built");
    let mut env = stack.command_env();
    env.acks = acks.map(Path::to_path_buf);
    let running = crate::stack::command::spawn_command(command, &env)?;
    let mut crash_rec = None;
    let cutter = match &r.setup.power_cut {
        Some(pc) => {
            let seed = pc.seed.unwrap_or_else(rand::random);
            crash_rec = Some(crash_record(pc, seed));
            let victims = crash::Victims { pgid: Some(running.pgid()), ..Default::default() };
            Some(crash::Cutter::start(pc, seed, built.disks[pc.disk].clone(), victims)?)
        }
        None => None,
    };
    let o = running.wait(Some(r.stop));
    let cut = cutter.map(|c| c.finish()).transpose()?.flatten();
    let o = o?;
    if let Some(rec) = &mut crash_rec {
        crash_fired(rec, cut);
    }
    let how = match (o.exit_code, o.signal, o.timed_out, o.cancelled) {
        (_, _, true, _) => "timed out (process group killed)".to_string(),
        (_, _, _, true) => "cancelled".to_string(),
        (Some(c), ..) => format!("exit code {c}"),
        (None, Some(sig), ..) => format!("signal {sig}"),
        _ => "unknown status".to_string(),
    };
    let shown = match &command.command {
        crate::spec::stack::Cmdline::Shell(s) => s.clone(),
        crate::spec::stack::Cmdline::Argv(v) => v.join(" "),
    };
    r.notes.push(format!("command `{shown}`: {how} after {:.1} s", o.seconds));
    if !o.stderr_tail.trim().is_empty() {
        r.notes.push(format!("command stderr (tail): {}", o.stderr_tail.trim()));
    }
    if crash_rec.as_ref().is_some_and(|c| c.fired) {
        r.notes.push("the command's process group was killed by the power cut".into());
    } else if !o.success() {
        r.notes.push("the command failed: see its status above".into());
    }
    Ok(crash_rec)
}

/// Drive the workload, with scheduled faults armed by its progress; then sync, deduplicate
/// (dedup stacks) and let the scheduler arm what waits for the end of the workload.
fn drive_workload(
    r: &mut Rep,
    built: &mut Built,
    w: &crate::workload::Workload,
    maps: &mut Maps,
    scheduled: Vec<crate::spec::rule::yaml::FaultSpec>,
    windowed: Option<(Vec<crate::spec::rule::yaml::FaultSpec>, windows::Epoch)>,
    mon: Option<&mut Monitors>,
) -> Result<(WorkloadResult, Option<rm::CrashRecord>, Option<rm::WindowClock>)> {
    let (setup, stop) = (r.setup, r.stop);
    let disks = built.disks.clone();
    let mountpoint = built.mountpoint.clone();
    // no scheduled fault: no observer, so the write path pays nothing for scheduling
    let observe = !scheduled.is_empty();
    let sched = schedule::Scheduler::new(disks, scheduled, w.stream(), w.seed, mountpoint.is_some());
    let progress = Arc::new(Progress::new());
    let done = Arc::new(AtomicBool::new(false));
    let pb = progress_thread(r.label.to_string(), progress.clone(), w.size, done.clone(), r.quiet);
    let p2 = progress.clone();
    let ticker = observe.then(|| schedule::spawn_ticker(sched.clone(), move || p2.ops(), done.clone()));
    let stopper = pipeline::forward_stop(stop, vec![progress.clone()], done.clone());
    // disks whose store is an NBD export: their clients' counters per interval
    let store_sampler = {
        let (disks, done, interval) = (built.disks.clone(), done.clone(), w.interval);
        let start = std::time::Instant::now();
        std::thread::spawn(move || {
            crate::nbd::client::sample_intervals(start, interval, &done, || {
                let now: Vec<_> = disks.iter().map(|d| d.stats().ok().and_then(|s| s.nbd_client)).collect();
                let zero: Vec<_> = now.iter().map(|c| c.map(|_| Default::default())).collect();
                collect::nbd_client(&zero, &now)
            })
        })
    };
    let observer = observe.then(|| sched.clone() as Arc<dyn crate::workload::WriteObserver>);
    let mut crash_rec = None;
    let cutter = match &setup.power_cut {
        Some(pc) => {
            let seed = pc.seed.unwrap_or_else(rand::random);
            crash_rec = Some(crash_record(pc, seed));
            let victims =
                crash::Victims { progress: vec![progress.clone()], power_off: maps.durability.as_ref().map(|d| d.power_off.clone()), ..Default::default() };
            Some(crash::Cutter::start(pc, seed, built.disks[pc.disk].clone(), victims)?)
        }
        None => None,
    };
    let fired = cutter.as_ref().map(|c| c.fired.clone());
    let armer = match (windowed, w.windows) {
        (Some((faults, epoch)), Some(plan)) => {
            let n = plan.count(w.duration.unwrap_or_default());
            r.notes.push(format!("baseline: windows: {}, {n} whole windows in the run ({} pairs)", plan.describe(), n / 2));
            Some(windows::spawn_armer(built.disks.clone(), faults, plan, n, epoch, progress.clone(), done.clone()))
        }
        _ => None,
    };
    // the monitor's windows get the workload's start, the daemons' counters read at their edges
    let mon_clock = mon.as_ref().and_then(|m| m.windows.clone()).map(|win| {
        let disks = built.disks.clone();
        windows::spawn_monitor_clock(win, move || disks.iter().map(service_counts).collect(), progress.clone(), done.clone())
    });
    r.phase("workload");
    // a recording disk (faultline crash explore, `fault record`) gets the workload's bounds as
    // marks; a disk that is not recording ignores them
    for d in &built.disks {
        d.mark(MARK_START)?;
    }
    let res = crate::workload::run(w, maps, observer, Some(&progress));
    let cut = cutter.map(|c| c.finish()).transpose();
    if res.is_ok() {
        for d in &built.disks {
            d.mark(MARK_END)?;
        }
    }
    done.store(true, Relaxed);
    let clock = armer.map(|a| a.join().map_err(|_| anyhow::anyhow!("the windows' arming thread panicked")).and_then(|r| r)).transpose();
    if let (Some(m), Some(t)) = (mon, mon_clock) {
        m.clock = Some(t.join().map_err(|_| anyhow::anyhow!("the monitor's window thread panicked")).and_then(|r| r));
    }
    let store_intervals = store_sampler.join().unwrap_or_default();
    if let Some(t) = ticker {
        let _ = t.join();
    }
    let _ = stopper.join();
    if let Some(h) = pb {
        let _ = h.join();
    }
    let mut res = res?;
    let clock = clock?.flatten();
    if let Some(c) = &clock {
        r.notes.push(format!(
            "baseline: windows: {} rule(s) armed {:.3} s into the workload; the workload started {:.3} s after the fault clock (+- {:.6} s)",
            c.rules,
            c.armed_at_s,
            c.offset_s,
            c.uncertainty_s / 2.0
        ));
    }
    let cut = cut?.flatten();
    if let Some(rec) = &mut crash_rec {
        crash_fired(rec, cut);
    }
    if res.nbd_client_intervals.is_empty() {
        res.nbd_client_intervals = store_intervals;
    }
    // a personality's files came and went: its maps are only known now
    if let Some(m) = res.maps.take() {
        *maps = m;
    }
    let maps = &*maps;
    if stop.load(Relaxed) {
        bail!("interrupted");
    }
    // after a cut the device fails every request: nothing more is written (the crash phase
    // takes over); faults waiting for the end of the workload are not armed
    if fired.is_some_and(|f| f.load(Relaxed)) {
        let (firings, sched_notes) = sched.finish();
        r.notes.extend(sched_notes);
        for fr in &firings {
            r.notes.push(format!("armed {} (rule {}) on disk {} at {:.3} s: {}", fr.fault, fr.rule_id, fr.disk, fr.t_s, fr.target));
        }
        return Ok((res, crash_rec, clock));
    }
    if let Some(m) = &mountpoint {
        crate::sys::mount::syncfs(m)?;
    }
    if let StackSpec::Dedup { with_duperemove, .. } = &setup.stack {
        let stack = built.stack();
        if *with_duperemove {
            let d = stack.dedupe()?;
            r.notes.push(format!("dedup (duperemove): {} bytes newly shared, {:.1} s", d.deduped(), d.seconds));
        } else {
            // one physical block per content: share every copy the map knows of
            let mut blocks = Vec::new();
            for (i, m) in maps.maps.iter().enumerate() {
                let p = maps.file_path(i).context("dedup needs the file interface")?;
                blocks.extend(m.written().map(|(b, id)| (p.clone(), b * CONTENT_BLOCK, id)));
            }
            let d = stack.dedupe_blocks(blocks)?;
            r.notes.push(format!(
                "dedup: {} contents with copies, {} blocks now shared ({} MiB), {} differed, {} errors, {:.1} s; {}",
                d.groups,
                d.shared_blocks,
                d.bytes_deduped >> 20,
                d.differs,
                d.errors,
                d.seconds,
                d.trimmed
            ));
        }
    }
    let fs_layer = mountpoint.is_some();
    sched.after_workload(&|f: &mut dyn FnMut(Option<usize>, u64, u64)| {
        for (i, m) in maps.maps.iter().enumerate() {
            for (block, id) in m.written() {
                f(fs_layer.then_some(i), block * CONTENT_BLOCK, id);
            }
        }
    });
    let (firings, sched_notes) = sched.finish();
    r.notes.extend(sched_notes);
    for fr in &firings {
        r.notes.push(format!("armed {} (rule {}) on disk {} at {:.3} s: {}", fr.fault, fr.rule_id, fr.disk, fr.t_s, fr.target));
    }
    Ok((res, crash_rec, clock))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::monitor::model::{MonitorResults, MonitorWindow, WindowDevice};
    use crate::spec::windows::WindowPlan;

    /// By hand: 1 s windows, no settle, no warm-up; the workload's start reached the monitor
    /// 2 ms in, so window 0 (measured from 0 s) is left out; the workload kept 3 windows of the
    /// monitor's 4. The daemon's read counters for window 1: (10 reads, 5 ms service, 4 ms
    /// held) read over [1.0004, 1.0006] s and (30, 45 ms, 24 ms) over [1.9980, 1.9990] s: 20
    /// reads of 2000 µs, 1000 µs held, over [1.0006, 1.9980]. Window 2's end read ended after
    /// its span: no daemon figures there.
    #[test]
    fn monitor_windows_keep_what_the_monitor_covered_with_the_daemon_between_edges() {
        let plan = WindowPlan { length: Duration::from_secs(1), settle: Duration::ZERO, warmup: Duration::ZERO };
        let w = crate::monitor::Windows::new(plan, 4);
        let mw = |k: u32| MonitorWindow {
            index: k,
            from_s: k as f64,
            to_s: k as f64 + 1.0,
            devices: vec![WindowDevice { device: "/dev/loop9".into(), ..Default::default() }],
            ..Default::default()
        };
        let mut res = MonitorResults { windows: (0..4).map(mw).collect(), ..Default::default() };
        let sample = |from_s: f64, to_s: f64, n: u64, svc_ms: u64, held_ms: u64| windows::DaemonSample {
            from_s,
            to_s,
            counts: vec![Some([("read".to_string(), (n, svc_ms * 1_000_000, held_ms * 1_000_000))].into())],
        };
        let clock = windows::MonitorClock {
            start: crate::monitor::window::WindowStart { set_at_s: 0.002, error_ns: 30, series_offset_s: 0.5 },
            edges: vec![
                (0, sample(0.0021, 0.0022, 0, 0, 0), sample(0.998, 0.999, 10, 5, 4)),
                (1, sample(1.0004, 1.0006, 10, 5, 4), sample(1.998, 1.999, 30, 45, 24)),
                (2, sample(2.0004, 2.0006, 30, 45, 24), sample(2.999, 3.0001, 40, 55, 24)),
            ],
        };
        monitor_windows(&mut res, &w, Some(Ok(Some(clock))), 3);
        assert_eq!(res.windows.iter().map(|x| x.index).collect::<Vec<_>>(), [1, 2], "window 0 began before the start was set; window 3 not kept");
        let d = &res.windows[0].devices[0];
        let r = &d.daemon["read"];
        assert_eq!(r.count, 20);
        assert!((r.service_mean_us - 2000.0).abs() < 1e-9 && (r.delay_mean_us - 1000.0).abs() < 1e-9, "{r:?}");
        assert_eq!(d.daemon_span, Some([1.0006, 1.998]));
        assert!(res.windows[1].devices[0].daemon.is_empty() && res.windows[1].devices[0].daemon_span.is_none(), "window 2's end read ended after it");
        assert!(res.notes.iter().any(|n| n.contains("1 window(s) without the daemon's figures")), "{:?}", res.notes);
        assert_eq!(res.window_start.as_ref().map(|s| s.set_at_s), Some(0.002));
        assert!(res.notes.iter().any(|n| n.contains("1 window(s) began")), "{:?}", res.notes);
        // without the start the monitor's windows are dropped
        let mut res = MonitorResults { windows: (0..4).map(mw).collect(), ..Default::default() };
        monitor_windows(&mut res, &w, Some(Ok(None)), 3);
        assert!(res.windows.is_empty() && res.window_start.is_none());
    }
}
