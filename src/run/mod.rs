//! `faultline run FILE`: one experiment in, one results directory out. Per setup and
//! repetition: start the faultline disk(s), build the stack, arm the faults, run the workload
//! with scheduled faults, make verification read the disk, verify, collect, tear down. Teardown
//! happens on success, error and Ctrl-C (Drop of every part), and `faultline cleanup` after a crash.

pub mod disks;
pub mod schedule;

use crate::report::model as rm;
use crate::spec::experiment::{Experiment, Setup, StackChoice};
use crate::workload::{Maps, Progress, WorkloadResult};
use anyhow::{Context, Result, bail};
use disks::DiskServer;
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
    std::fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
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
    };
    let total: u32 = exp.setups.iter().map(|s| s.repeat).sum();
    let mut n = 0;
    for setup in &exp.setups {
        let mut reps = Vec::new();
        for rep in 0..setup.repeat {
            n += 1;
            if stop.load(Relaxed) {
                bail!("interrupted; everything built was torn down; partial results not written");
            }
            let label = format!("[{n}/{total}] {} rep {}", setup.name, rep + 1);
            if !opts.quiet {
                eprintln!("faultline: {label}: {} stack, {} fault(s)", setup.stack.label(), setup.faults.len());
            }
            let t = Instant::now();
            let r = run_one(exp, setup, rep, &out, &label, &stop, opts.quiet).with_context(|| format!("setup `{}`, repetition {}", setup.name, rep + 1))?;
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
            reps.push(r);
        }
        let mut s = rm::SetupResult {
            name: setup.name.clone(),
            stack: setup.stack.label(),
            description: setup.description.clone(),
            repetitions: reps,
            aggregate: Default::default(),
        };
        s.aggregate_now();
        results.setups.push(s);
    }
    crate::report::write_dir(&out, &results)?;
    print!("{}", crate::report::summary_table(&results));
    println!("results: {}", out.display());
    Ok(out)
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

/// Everything one repetition builds, dropped (torn down) in reverse order of creation.
struct Built {
    stack: Option<crate::stack::fs::Built>,
    disks: Vec<Arc<DiskServer>>,
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
}

fn run_one(exp: &Experiment, setup: &Setup, rep: u32, out: &Path, label: &str, stop: &Arc<AtomicBool>, quiet: bool) -> Result<rm::Repetition> {
    let t_rep = Instant::now();
    let mut built = Built { stack: None, disks: Vec::new() };
    for i in 0..setup.stack.disks() {
        built.disks.push(Arc::new(DiskServer::start(&setup.disk, i)?));
    }
    let devices: Vec<PathBuf> = built.disks.iter().map(|d| d.device.clone()).collect();
    let disks = built.disks.clone();
    let stack_spec = stack_spec(&setup.stack);
    let phase = |what: &str| {
        if !quiet {
            eprintln!("faultline: {label}: {what}");
        }
    };
    let shown: Vec<String> = devices.iter().map(|d| d.display().to_string()).collect();
    phase(&format!("build: {} stack on {}", setup.stack.label(), shown.join(" ")));
    built.stack = Some(crate::stack::fs::Built::build(&stack_spec, &devices)?);
    let mountpoint = built.stack.as_ref().and_then(|s| s.mountpoint.clone());

    let mut notes = Vec::new();
    for (i, d) in built.disks.iter().enumerate() {
        if d.transport != "io_uring" {
            notes.push(format!("disk {i}: requests over {}", d.transport));
        }
        if let Some(why) = &d.cpu_latency_unavailable {
            notes.push(format!("disk {i}: CPU latency left alone (cpu_latency auto: {why})"));
        }
    }
    // the faults' clock and counters start with the workload, not with mkfs
    let seq0: Vec<u64> = disks.iter().map(|d| d.reset_epoch()).collect::<Result<_>>()?;
    let (static_faults, scheduled) = schedule::split(&setup.faults);
    for f in static_faults {
        disks[f.disk].arm(vec![f.rule.clone()])?;
    }

    let (wres, verify) = match &setup.stack {
        StackChoice::Command { cmd, timeout, .. } => {
            use crate::stack::command::{Cmdline, CommandSpec};
            let spec = CommandSpec { command: Cmdline::Shell(cmd.clone()), timeout: *timeout, cwd: None };
            let o = built.stack.as_ref().unwrap().run_command(Some(&spec), Some(stop))?;
            let how = match (o.exit_code, o.signal, o.timed_out, o.cancelled) {
                (_, _, true, _) => "timed out (process group killed)".to_string(),
                (_, _, _, true) => "cancelled".to_string(),
                (Some(c), ..) => format!("exit code {c}"),
                (None, Some(sig), ..) => format!("signal {sig}"),
                _ => "unknown status".to_string(),
            };
            notes.push(format!("command `{cmd}`: {how} after {:.1} s", o.seconds));
            if !o.stderr_tail.trim().is_empty() {
                notes.push(format!("command stderr (tail): {}", o.stderr_tail.trim()));
            }
            if !o.success() {
                notes.push("the command failed: see its status above".into());
            }
            (None, None)
        }
        _ => {
            let target = mountpoint.clone().unwrap_or_else(|| devices[0].clone());
            let w = exp.workload_for(setup, &target).map_err(anyhow::Error::msg)?;
            let maps = Maps::new(&w)?;
            let stream = w.stream();
            // no scheduled fault: no observer, so the write path pays nothing for scheduling
            let observe = !scheduled.is_empty();
            let sched = schedule::Scheduler::new(disks.clone(), scheduled, stream, w.seed, mountpoint.is_some());
            let progress = Arc::new(Progress::new());
            let done = Arc::new(AtomicBool::new(false));
            let pb = progress_thread(label.to_string(), progress.clone(), w.size, done.clone(), quiet);
            let p2 = progress.clone();
            let ticker = observe.then(|| schedule::spawn_ticker(sched.clone(), move || p2.ops(), done.clone()));
            let stopper = {
                // Ctrl-C ends the workload early (its threads watch `progress.stop`)
                let (stop, progress, done) = (stop.clone(), progress.clone(), done.clone());
                std::thread::spawn(move || {
                    while !done.load(Relaxed) {
                        if stop.load(Relaxed) {
                            progress.stop.store(true, Relaxed);
                        }
                        std::thread::sleep(Duration::from_millis(20));
                    }
                })
            };
            let observer = observe.then(|| sched.clone() as Arc<dyn crate::workload::WriteObserver>);
            phase("workload");
            let res = crate::workload::run(&w, &maps, observer, Some(&progress));
            done.store(true, Relaxed);
            if let Some(t) = ticker {
                let _ = t.join();
            }
            let _ = stopper.join();
            if let Some(h) = pb {
                let _ = h.join();
            }
            let res = res?;
            if stop.load(Relaxed) {
                built.teardown()?;
                bail!("interrupted");
            }
            let stack = built.stack.as_mut().unwrap();
            if let Some(m) = &mountpoint {
                syncfs(m)?;
            }
            if matches!(setup.stack, StackChoice::Dedup { with_duperemove: true, .. }) {
                let d = stack.dedupe()?;
                notes.push(format!("dedup (duperemove): {} bytes newly shared, {:.1} s", d.deduped(), d.seconds));
            } else if matches!(setup.stack, StackChoice::Dedup { .. }) {
                // one physical block per content: share every copy the map knows of
                let mut blocks = Vec::new();
                for (i, m) in maps.maps.iter().enumerate() {
                    let p = maps.file_path(i).context("dedup needs the file interface")?;
                    blocks.extend(m.written().map(|(b, id)| (p.clone(), b * crate::workload::config::CONTENT_BLOCK, id)));
                }
                let d = stack.dedupe_blocks(blocks)?;
                notes.push(format!(
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
            let fs_layer = mountpoint.is_some();
            sched.after_workload(&|f: &mut dyn FnMut(Option<usize>, u64, u64)| {
                for (i, m) in maps.maps.iter().enumerate() {
                    for (block, id) in m.written() {
                        f(fs_layer.then_some(i), block * crate::workload::config::CONTENT_BLOCK, id);
                    }
                }
            });
            let (firings, sched_notes) = sched.finish();
            notes.extend(sched_notes);
            for fr in &firings {
                notes.push(format!("armed {} (rule {}) on disk {} at {:.3} s: {}", fr.fault, fr.rule_id, fr.disk, fr.t_s, fr.target));
            }
            // verification must read the disk, not the page cache
            built.stack.as_mut().unwrap().cold_cache()?;
            phase("verify");
            let v = crate::verify::verify(&maps)?;
            maps.save(&out.join("maps").join(format!("{}-{}", setup.name, rep + 1)))?;
            (Some(res), Some(v))
        }
    };
    notes.extend(built.stack.as_ref().map(|s| s.health()).unwrap_or_default());

    // what the engine did: every logged fault since the workload started, and rule counters
    let mut faults = Vec::new();
    let mut rules = Vec::new();
    for (i, d) in disks.iter().enumerate() {
        let listed = d.list()?;
        let names: std::collections::HashMap<u64, String> = listed.iter().map(|r| (r.id, r.rule.name.clone().unwrap_or_default())).collect();
        let targets: std::collections::HashMap<u64, crate::fault::Target> = listed.iter().map(|r| (r.id, r.rule.target.clone())).collect();
        let bs = d.block_size;
        let mut seen: std::collections::HashSet<(u64, u64)> = std::collections::HashSet::new();
        for e in d.log_since(seq0[i])? {
            // faulty blocks = the logged blocks inside the rule's offset range (all of them for
            // content and whole-disk rules), each counted once per rule
            let range = match targets.get(&e.rule) {
                Some(crate::fault::Target::Range { start, end }) => Some((start / bs, end.div_ceil(bs))),
                _ => None,
            };
            let mut new = 0;
            for [first, n] in &e.blocks {
                for b in *first..first + n {
                    if range.is_none_or(|(s, t)| b >= s && b < t) && seen.insert((e.rule, b)) {
                        new += 1;
                    }
                }
            }
            let new = if e.blocks.is_empty() { 1 } else { new };
            faults.push(rm::InjectedFault {
                t_s: e.t_us as f64 / 1e6,
                rule_id: e.rule,
                rule: names.get(&e.rule).cloned().unwrap_or_default(),
                action: e.action.to_string(),
                op: e.op.map(|o| o.name().to_string()).unwrap_or_else(|| "at-rest".into()),
                offset: e.offset,
                len: e.len,
                blocks: e.block_count(),
                disk: i as u32,
                new_target_blocks: Some(new),
            });
        }
        let dropped = d.stats()?.log_dropped;
        if dropped > 0 {
            notes.push(format!("disk {i}: the fault log dropped {dropped} entries (cap); counters below are exact"));
        }
        for r in listed {
            rules.push(rm::RuleCount {
                id: r.id,
                name: r.rule.name.clone().unwrap_or_default(),
                action: r.rule.action.name().to_string(),
                op: r.rule.ops.ops().iter().map(|o| o.name()).collect::<Vec<_>>().join("+"),
                fired: r.fired,
                blocks: r.blocks,
            });
        }
    }
    notes.extend(built.teardown()?);
    Ok(repetition(rep, t_rep.elapsed().as_secs_f64(), wres, verify, faults, rules, notes))
}

fn stack_spec(s: &StackChoice) -> crate::stack::fs::StackSpec {
    use crate::stack::fs::StackSpec as S;
    match s.clone() {
        StackChoice::Raw => S::Raw,
        StackChoice::Fs { kind, mkfs, mount } => S::Fs { kind, mkfs, mount },
        StackChoice::BtrfsRaid1 { mkfs, mount } => S::BtrfsRaid1 { mkfs, mount },
        StackChoice::Dedup { kind, mkfs, mount, .. } => S::Dedup { kind, mkfs, mount },
        StackChoice::Command { fs: None, .. } => S::Raw,
        StackChoice::Command { fs: Some((kind, mkfs, mount)), .. } => S::Fs { kind, mkfs, mount },
    }
}

fn syncfs(p: &Path) -> Result<()> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(p).with_context(|| format!("cannot open {}", p.display()))?;
    // SAFETY: an fd we hold open for the call
    if unsafe { libc::syncfs(f.as_raw_fd()) } != 0 {
        bail!("syncfs {}: {}", p.display(), std::io::Error::last_os_error());
    }
    Ok(())
}

fn sample(s: &crate::workload::Sample) -> rm::Sample {
    rm::Sample {
        t_s: s.t,
        read_iops: s.read.iops,
        read_mib_s: s.read.mib_s,
        read_mean_us: s.read.mean_us,
        read_p99_us: s.read.p99_us,
        write_iops: s.write.iops,
        write_mib_s: s.write.mib_s,
        write_mean_us: s.write.mean_us,
        write_p99_us: s.write.p99_us,
        cpu_pct: s.cpu_pct,
        rss_mib: s.rss_mib,
    }
}

fn bad_block(file: Option<String>, b: &crate::verify::BadBlock) -> rm::BadBlock {
    use crate::verify::BadBlock as B;
    let offset = b.block() * crate::workload::config::CONTENT_BLOCK;
    let (kind, errno, expected_id) = match b {
        B::Corrupted { holds: Some(_), expected_id, .. } => ("misdirected", None, *expected_id),
        B::Corrupted { expected_id, .. } => ("corrupted", None, *expected_id),
        B::Unreadable { errno, .. } => ("unreadable", Some(crate::fault::rule::errno_name(*errno)), 0),
        B::Short { .. } => ("short", None, 0),
        B::Missing { .. } => ("missing", None, 0),
    };
    rm::BadBlock { file, offset, kind: kind.to_string(), errno, expected_id }
}

fn integrity(v: &crate::verify::VerifyReport) -> rm::Integrity {
    let mut bad: Vec<rm::BadBlock> = v.bad.iter().map(|b| bad_block(None, b)).collect();
    let mut files_hit = Vec::new();
    for f in &v.files {
        let name = std::path::Path::new(&f.path).file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_else(|| f.path.clone());
        bad.extend(f.bad.iter().map(|b| bad_block(Some(name.clone()), b)));
        if !f.bad.is_empty() {
            files_hit.push(rm::FileHit { file: name, bad_blocks: f.bad.len() as u64 });
        }
    }
    files_hit.sort_by(|a, b| b.bad_blocks.cmp(&a.bad_blocks).then(a.file.cmp(&b.file)));
    let n = &v.counts;
    rm::Integrity {
        blocks_checked: n.checked,
        ok: n.ok,
        // the report counts misdirected apart from other corruption
        corrupted: n.corrupted.saturating_sub(n.misdirected),
        misdirected: n.misdirected,
        unreadable: n.unreadable,
        short: n.short,
        missing: n.missing,
        bad,
        files_hit,
    }
}

fn repetition(
    rep: u32,
    seconds: f64,
    w: Option<WorkloadResult>,
    v: Option<crate::verify::VerifyReport>,
    faults: Vec<rm::InjectedFault>,
    rules: Vec<rm::RuleCount>,
    notes: Vec<String>,
) -> rm::Repetition {
    let mut r = rm::Repetition { index: rep + 1, seconds, faults, rules, notes, ..Default::default() };
    if let Some(w) = w {
        r.read = w.read.clone();
        r.write = w.write.clone();
        r.timeseries = w.timeseries.iter().map(sample).collect();
        r.io_errors = w.errors.clone();
        r.failed_ios = w.failed_ios.len() as u64;
        r.retries = w.retries;
    }
    if let Some(v) = v {
        r.integrity = integrity(&v);
    }
    r
}
