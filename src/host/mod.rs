//! Host faults on a set of processes (docs/host.md): CPU taken away (a cgroup quota, or
//! spinning threads), memory pressure (a cgroup limit, or memory held by us), freeze (the
//! cgroup freezer) and kill with an optional restart, each sticky or in a time window.
//!
//! A `Schedule` applies and reverts them on its own thread at their window's edges, measured
//! from one start instant, and records when each really began and ended and what it did
//! (CPU the processes got, memory peak, time frozen). Every cgroup it makes is in the ledger
//! before a process is moved into it, so `faultline cleanup` thaws and removes it after a crash.

mod hog;

use crate::spec::host::{CpuMethod, HostAction, HostFault};
use crate::sys::cgroup::{self, Group};
use crate::sys::ledger::LedgerFile;
use anyhow::{Context, Result, bail};
use serde::Serialize;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Restarts the target after a kill; returns its new processes.
pub type Restart = Box<dyn FnMut() -> Result<Vec<u32>> + Send>;

/// The processes host faults act on.
pub struct Targets {
    pub pids: Vec<u32>,
    pub restart: Option<Restart>,
}

/// What a host fault did, for results.
#[derive(Clone, Debug, Default, PartialEq, Serialize, serde::Deserialize)]
#[serde(default)]
pub struct HostFaultRecord {
    pub name: Option<String>,
    pub host: Option<String>,
    #[serde(rename = "type")]
    pub kind: String,
    pub description: String,
    /// Planned window, seconds from the start.
    pub from_s: f64,
    pub to_s: Option<f64>,
    /// When it was really applied and reverted (None: never, e.g. the run ended first).
    pub applied_at_s: Option<f64>,
    pub reverted_at_s: Option<f64>,
    /// CPUs' worth of time the target processes used while it was applied (cpu faults).
    pub target_cpus_used: Option<f64>,
    /// CPUs' worth of time the spinning threads took (method spin).
    pub cpus_taken: Option<f64>,
    /// Peak memory charged to the limited group, and how often the limit was hit.
    pub memory_peak: Option<u64>,
    pub memory_limit_hits: Option<u64>,
    /// Memory held (type memory with hold).
    pub held: Option<u64>,
    /// Processes killed, and those the restart started.
    pub killed: Vec<u32>,
    pub restarted: Vec<u32>,
    pub notes: Vec<String>,
    pub error: Option<String>,
}

/// Where the machine's support for the faults falls short: said before anything runs.
pub fn check(faults: &[HostFault], can_restart: bool) -> Result<()> {
    for (i, f) in faults.iter().enumerate() {
        let what = || format!("host fault #{} ({})", i + 1, f.action);
        let need = |c: &str| cgroup::hierarchy(c).map(|_| ()).with_context(|| format!("{}: no cgroup hierarchy has the {c} controller here", what()));
        match &f.action {
            HostAction::Cpu { method: CpuMethod::Quota, .. } => need("cpu")?,
            HostAction::Cpu { method: CpuMethod::Spin, .. } => {}
            HostAction::Memory { limit: Some(_), .. } => need("memory")?,
            HostAction::Memory { hold: Some(h), .. } => {
                let avail = mem_available().unwrap_or(u64::MAX);
                if *h > avail {
                    bail!(
                        "{}: {} is more than the {} this host has available",
                        what(),
                        crate::spec::units::format_size(*h),
                        crate::spec::units::format_size(avail)
                    );
                }
            }
            HostAction::Memory { .. } => {}
            HostAction::Freeze => need("freezer")?,
            HostAction::Kill if f.to.is_some() && !can_restart => {
                bail!("{}: the window ends with a restart, and nothing here knows how to restart the target", what())
            }
            HostAction::Kill => {}
        }
    }
    Ok(())
}

fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: u64 = text.lines().find_map(|l| l.strip_prefix("MemAvailable:"))?.trim().strip_suffix("kB")?.trim().parse().ok()?;
    kib.checked_mul(1024)
}

/// A fault while applied: what must be undone.
enum Active {
    Group { group: Group, cpu0: Option<CpuClock> },
    Spin { hog: hog::Spinners, cpu0: CpuClock },
    Hold(hog::Held),
    Killed,
}

/// CPU time used by processes: the cgroup's own counter where it has one, else /proc.
struct CpuClock {
    at: Instant,
    used: Duration,
}

fn proc_cpu(pids: &[u32]) -> Duration {
    pids.iter().filter_map(|&p| crate::sys::process::cpu_time(p)).sum()
}

struct Shared {
    stop: bool,
}

/// Host faults being applied on their schedule.
pub struct Schedule {
    shared: Arc<(Mutex<Shared>, Condvar)>,
    thread: Option<std::thread::JoinHandle<Vec<HostFaultRecord>>>,
}

impl Schedule {
    /// Start applying `faults` to `targets`, windows counted from `t0`. Call `check` first.
    pub fn start(faults: Vec<HostFault>, targets: Targets, t0: Instant) -> Result<Schedule> {
        let ledger = LedgerFile::create()?;
        let shared = Arc::new((Mutex::new(Shared { stop: false }), Condvar::new()));
        let s2 = shared.clone();
        let thread = std::thread::Builder::new().name("host-faults".into()).spawn(move || Runner::new(faults, targets, t0, ledger).run(&s2))?;
        Ok(Schedule { shared, thread: Some(thread) })
    }

    /// Revert what is applied and return the records.
    pub fn stop(mut self) -> Vec<HostFaultRecord> {
        self.halt()
    }

    fn halt(&mut self) -> Vec<HostFaultRecord> {
        {
            let (m, c) = &*self.shared;
            m.lock().unwrap_or_else(|e| e.into_inner()).stop = true;
            c.notify_all();
        }
        self.thread.take().and_then(|t| t.join().ok()).unwrap_or_default()
    }
}

impl Drop for Schedule {
    fn drop(&mut self) {
        if self.thread.is_some() {
            self.halt();
        }
    }
}

struct Runner {
    faults: Vec<HostFault>,
    targets: Targets,
    t0: Instant,
    ledger: LedgerFile,
    records: Vec<HostFaultRecord>,
    active: Vec<Option<Active>>,
}

impl Runner {
    fn new(faults: Vec<HostFault>, targets: Targets, t0: Instant, ledger: LedgerFile) -> Runner {
        let records = faults
            .iter()
            .map(|f| HostFaultRecord {
                name: f.name.clone(),
                host: f.host.clone(),
                kind: f.action.kind().into(),
                description: f.action.to_string(),
                from_s: f.from.as_secs_f64(),
                to_s: f.to.map(|d| d.as_secs_f64()),
                ..Default::default()
            })
            .collect();
        let active = faults.iter().map(|_| None).collect();
        Runner { faults, targets, t0, ledger, records, active }
    }

    fn run(mut self, shared: &(Mutex<Shared>, Condvar)) -> Vec<HostFaultRecord> {
        // (when, fault, apply?) in time order; a revert sorts before an apply at the same instant
        let mut events: Vec<(Duration, usize, bool)> = Vec::new();
        for (i, f) in self.faults.iter().enumerate() {
            events.push((f.from, i, true));
            if let Some(to) = f.to {
                events.push((to, i, false));
            }
        }
        events.sort_by_key(|&(t, i, apply)| (t, apply, i));
        let (m, c) = shared;
        for (at, i, apply) in events {
            let mut g = m.lock().unwrap_or_else(|e| e.into_inner());
            while !g.stop && self.t0.elapsed() < at {
                let left = at.saturating_sub(self.t0.elapsed());
                g = c.wait_timeout(g, left).unwrap_or_else(|e| e.into_inner()).0;
            }
            if g.stop {
                break;
            }
            drop(g);
            if apply { self.apply(i) } else { self.revert(i) }
        }
        // wait for the end of the run, then undo what is still applied
        let mut g = m.lock().unwrap_or_else(|e| e.into_inner());
        while !g.stop {
            g = c.wait(g).unwrap_or_else(|e| e.into_inner());
        }
        drop(g);
        for i in 0..self.faults.len() {
            if self.active[i].is_some() {
                self.revert(i);
            }
        }
        self.ledger.remove();
        self.records
    }

    fn now(&self) -> f64 {
        self.t0.elapsed().as_secs_f64()
    }

    fn live_pids(&self) -> Vec<u32> {
        self.targets.pids.iter().copied().filter(|p| std::path::Path::new(&format!("/proc/{p}")).exists()).collect()
    }

    fn apply(&mut self, i: usize) {
        match self.try_apply(i) {
            Ok(a) => {
                self.records[i].applied_at_s = Some(self.now());
                self.active[i] = Some(a);
            }
            Err(e) => self.records[i].error = Some(format!("{e:#}")),
        }
    }

    fn group(&mut self, controller: &'static str, i: usize, pids: &[u32]) -> Result<Group> {
        let name = format!("faultline-{}-{}-{i}", std::process::id(), self.ledger.seq);
        let g = Group::create(controller, &name, pids)?;
        let rec = g.record.clone();
        self.ledger.update(|l| l.cgroups.push(rec))?;
        if let Err(e) = g.adopt(pids) {
            self.drop_group(g);
            return Err(e);
        }
        Ok(g)
    }

    fn drop_group(&mut self, g: Group) {
        let rec = g.record.clone();
        match g.release() {
            Ok(()) => {
                let _ = self.ledger.update(|l| l.cgroups.retain(|c| *c != rec));
            }
            Err(e) => eprintln!("faultline: {e:#} (left for `faultline cleanup`)"),
        }
    }

    fn try_apply(&mut self, i: usize) -> Result<Active> {
        let pids = self.live_pids();
        let action = self.faults[i].action.clone();
        if pids.is_empty() && !matches!(action, HostAction::Memory { hold: Some(_), .. } | HostAction::Cpu { method: CpuMethod::Spin, .. }) {
            bail!("no target process is running");
        }
        let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        Ok(match action {
            HostAction::Cpu { share, method: CpuMethod::Quota } => {
                let g = self.group("cpu", i, &pids)?;
                g.set_cpu_limit((1.0 - share) * cpus as f64, Duration::from_millis(100))?;
                let used = g.cpu_usage().unwrap_or_else(|| proc_cpu(&pids));
                Active::Group { group: g, cpu0: Some(CpuClock { at: Instant::now(), used }) }
            }
            HostAction::Cpu { share, method: CpuMethod::Spin } => {
                let cpu0 = CpuClock { at: Instant::now(), used: proc_cpu(&pids) };
                Active::Spin { hog: hog::Spinners::start(share, cpus)?, cpu0 }
            }
            HostAction::Memory { limit: Some(l), .. } => {
                let g = self.group("memory", i, &pids)?;
                g.set_memory_limit(l)?;
                Active::Group { group: g, cpu0: None }
            }
            HostAction::Memory { hold: Some(h), .. } => {
                let held = hog::Held::take(h)?;
                self.records[i].held = Some(held.len());
                if !held.locked {
                    self.records[i].notes.push("memory held but not locked (mlock refused): the kernel may swap it out".into());
                }
                Active::Hold(held)
            }
            HostAction::Memory { .. } => bail!("type memory without limit or hold"),
            HostAction::Freeze => {
                let g = self.group("freezer", i, &pids)?;
                g.set_frozen(true)?;
                Active::Group { group: g, cpu0: None }
            }
            HostAction::Kill => {
                let killed = kill_all(&pids);
                self.records[i].killed = killed;
                Active::Killed
            }
        })
    }

    fn revert(&mut self, i: usize) {
        let Some(a) = self.active[i].take() else { return };
        let t = self.now();
        let rec = &mut self.records[i];
        let cpu_rate = |c: &CpuClock, now_used: Duration| (now_used.saturating_sub(c.used)).as_secs_f64() / c.at.elapsed().as_secs_f64().max(1e-9);
        match a {
            Active::Group { group, cpu0 } => {
                if let Some(c) = &cpu0 {
                    let used = group.cpu_usage().unwrap_or_else(|| proc_cpu(&cgroup::procs(group.path())));
                    rec.target_cpus_used = Some(cpu_rate(c, used));
                }
                if group.controller == "memory" {
                    let (_, peak) = group.memory_usage();
                    rec.memory_peak = peak;
                    rec.memory_limit_hits = memory_hits(&group);
                }
                self.drop_group(group);
            }
            Active::Spin { hog, cpu0 } => {
                let pids = self.live_pids();
                self.records[i].target_cpus_used = Some(cpu_rate(&cpu0, proc_cpu(&pids)));
                self.records[i].cpus_taken = Some(hog.stop());
            }
            Active::Hold(h) => drop(h),
            Active::Killed => {
                if self.faults[i].to.is_some() {
                    match self.targets.restart.as_mut().map(|r| r()) {
                        Some(Ok(new)) => {
                            self.records[i].restarted = new.clone();
                            self.targets.pids = new;
                        }
                        Some(Err(e)) => self.records[i].error = Some(format!("restart failed: {e:#}")),
                        None => self.records[i].error = Some("no way to restart the target".into()),
                    }
                }
            }
        }
        self.records[i].reverted_at_s = Some(t);
    }
}

/// How often the memory group hit its limit (v1 failcnt, v2 memory.events `max`).
fn memory_hits(g: &Group) -> Option<u64> {
    let read = |f: &str| std::fs::read_to_string(g.path().join(f)).ok();
    match g.record.version {
        cgroup::Version::V1 => read("memory.failcnt")?.trim().parse().ok(),
        cgroup::Version::V2 => read("memory.events")?.lines().find_map(|l| l.strip_prefix("max ")).and_then(|v| v.trim().parse().ok()),
    }
}

/// SIGKILL each process and wait (up to 5 s) until it is gone; returns those killed.
fn kill_all(pids: &[u32]) -> Vec<u32> {
    use crate::sys::process;
    let mut killed = Vec::new();
    for &p in pids {
        if let Some(st) = process::start_time(p)
            && process::signal(p, st, nix::sys::signal::Signal::SIGKILL)
        {
            killed.push(p);
            let t = Instant::now();
            while process::is_running(p, st) && t.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    }
    killed
}
