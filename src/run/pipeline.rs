//! One repetition, whatever the placement. The pipeline runs the phases in this order and
//! owns what they have in common; a [`Placement`] (local, namespaces, agents) says where each
//! phase's work happens:
//!
//! 1. **build**: the disk servers and the stack (local), the hosts, the target's server and
//!    (agents) the clients waiting for their start instant;
//! 2. **arm**: the disks' fault clocks restart and the static faults go in ([`arm_faults`]);
//! 3. **drive**: the workload (or the stack's command) with its scheduled, network and host
//!    faults and whatever samples it (monitor, probers);
//! 4. **crash + check**: after a power cut (`type: power-cut`, docs/crash.md) the workload
//!    has seen its errors and stopped; the placement takes the stack down without flushing,
//!    powers the disk on, lets the journal replay, runs the file system's check, mounts again
//!    and classifies what survived with the durability oracle (and the application's check);
//!    the local placement, and the networked placements' target (power on, then the oracle
//!    over NBD: from the client's namespace, or, through agents, in the client's own
//!    workload process);
//! 5. **verify**: reread what the workload wrote and classify it (local stacks only);
//! 6. **collect**: every disk's fault log and rule counters ([`collect_faults`]) and the
//!    placement's own figures;
//! 7. **teardown**: always, on success and on error, in reverse order of building; Ctrl-C
//!    reaches it through the workload's early end, a crash through `faultline cleanup` and the
//!    ledgers the built parts keep.
//!
//! The repetition's record is assembled once, here, from what the phases gathered
//! ([`Outcome`]).

use super::disks::DiskServer;
use crate::fault::Rule;
use crate::fault::engine::RuleStatus;
use crate::fault::log::LogEntry;
use crate::report::collect;
use crate::report::model as rm;
use crate::spec::experiment::{Experiment, Setup};
use crate::spec::rule::yaml::FaultSpec;
use crate::workload::{Progress, WorkloadResult};
use anyhow::{Result, bail};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// Where a repetition's parts run; the pipeline calls its phases in order (module doc).
/// Every phase may fail; `teardown` is then still called, once, with whatever was built.
pub(crate) trait Placement {
    /// Build the disk(s) and what stands on them, or the hosts and the target's server.
    fn build(&mut self, r: &mut Rep) -> Result<()>;
    /// Restart the disks' fault clocks and arm the static faults.
    fn arm(&mut self, r: &mut Rep) -> Result<()>;
    /// Run the workload with its faults; its figures, host fault records, monitor and networked figures
    /// go into `o`.
    fn drive(&mut self, r: &mut Rep, o: &mut Outcome) -> Result<()>;
    /// After a power cut in the drive: take the stack down without flushing, power on, check,
    /// mount and classify what survived (`o.crash`). Nothing to do without a cut.
    fn crash(&mut self, _r: &mut Rep, _o: &mut Outcome) -> Result<()> {
        Ok(())
    }
    /// Reread and classify what the workload wrote (`o.verified`), where that is possible.
    /// Nothing by default: a networked run's clients keep their maps on their hosts (after a
    /// power cut each client's own oracle read them back: `crash`).
    fn verify(&mut self, _r: &mut Rep, _o: &mut Outcome) -> Result<()> {
        Ok(())
    }
    /// Gather the disks' fault logs, rule counters and the placement's own figures, while
    /// everything is still up.
    fn collect(&mut self, r: &mut Rep, o: &mut Outcome) -> Result<()>;
    /// Tear down everything built, on success and on error; what it says goes to `r.notes`.
    fn teardown(&mut self, r: &mut Rep) -> Result<()>;
}

/// What one repetition passes from phase to phase, whatever the placement.
pub(crate) struct Rep<'a> {
    pub exp: &'a Experiment,
    pub setup: &'a Setup,
    /// Repetition number from 0.
    pub index: u32,
    /// The setup run with no fault armed (`baseline: true`).
    pub baseline: bool,
    /// The results directory.
    pub out: &'a Path,
    pub label: &'a str,
    /// Set by Ctrl-C / SIGTERM.
    pub stop: &'a Arc<AtomicBool>,
    pub quiet: bool,
    /// The repetition's notes, in the order the phases add them.
    pub notes: Vec<String>,
}

impl Rep<'_> {
    /// Say which phase starts ("faultline: LABEL: WHAT") unless quiet.
    pub fn phase(&self, what: &str) {
        if !self.quiet {
            eprintln!("faultline: {}: {what}", self.label);
        }
    }
}

/// What the phases gathered for the repetition's record.
#[derive(Default)]
pub(crate) struct Outcome {
    /// The repetition's own figures: its workload's (networked: the first client's).
    pub workload: Option<WorkloadResult>,
    pub verified: Option<crate::verify::VerifyReport>,
    pub faults: Vec<rm::InjectedFault>,
    pub rules: Vec<rm::RuleCount>,
    pub host_faults: Vec<crate::host::HostFaultRecord>,
    pub monitor: Option<crate::monitor::MonitorResults>,
    pub latency_model: Vec<rm::DiskLatencyModel>,
    pub drive_cpu_s: Option<rm::DriveCpu>,
    /// What the disks' `nbd://` stores' clients did over the repetition, summed.
    pub nbd_client: Option<crate::nbd::client::CounterSnapshot>,
    /// Networked placements: every host's series, probes and fault windows.
    pub networked: Option<crate::report::networked::NetworkedRun>,
    /// The power cut and what the crash + check phase found.
    pub crash: Option<rm::CrashRecord>,
    /// `baseline: windows`: where the windows sat on the fault clocks.
    pub window_clock: Option<rm::WindowClock>,
}

/// Run one repetition on `placement`.
pub(crate) fn run_repetition(placement: &mut dyn Placement, mut r: Rep) -> Result<rm::Repetition> {
    let t = Instant::now();
    let mut o = Outcome::default();
    let phases = (|| -> Result<()> {
        placement.build(&mut r)?;
        placement.arm(&mut r)?;
        placement.drive(&mut r, &mut o)?;
        placement.crash(&mut r, &mut o)?;
        placement.verify(&mut r, &mut o)?;
        placement.collect(&mut r, &mut o)
    })();
    let down = placement.teardown(&mut r);
    phases?;
    down?;
    Ok(record(r, o, t.elapsed()))
}

/// The repetition's record from what its phases gathered.
fn record(r: Rep, o: Outcome, took: Duration) -> rm::Repetition {
    let mut rep = collect::repetition(r.index, took.as_secs_f64(), o.workload, o.verified, o.faults, o.rules, r.notes);
    rep.monitor = o.monitor;
    rep.latency_model = o.latency_model;
    for h in o.host_faults.iter().filter(|h| h.error.is_some()) {
        rep.notes.push(format!("host fault {}: {}", h.description, h.error.as_deref().unwrap_or_default()));
    }
    rep.host_faults = o.host_faults;
    rep.drive_cpu_s = o.drive_cpu_s;
    if let Some(totals) = o.nbd_client {
        let intervals = rep.nbd_client.take().map(|c| c.intervals).unwrap_or_default();
        rep.nbd_client = Some(rm::NbdClient { totals, intervals });
    }
    rep.networked = o.networked.map(Box::new);
    rep.crash = o.crash.map(Box::new);
    rep.window_clock = o.window_clock;
    rep
}

/// A disk's fault engine, wherever its server runs: one of the run's own disk servers, or a
/// target's reached through its agent (run::agents).
pub(crate) trait FaultControl {
    fn block_size(&self) -> u64;
    /// Restart the fault clock now; returns the log's sequence number at that moment.
    fn reset_epoch(&self) -> Result<u64>;
    fn arm(&self, rules: Vec<Rule>) -> Result<()>;
    fn list(&self) -> Result<Vec<RuleStatus>>;
    /// Every log entry from sequence number `seq` on.
    fn log_since(&self, seq: u64) -> Result<Vec<LogEntry>>;
    /// Entries the log could not keep (its cap).
    fn log_dropped(&self) -> Result<u64>;
}

impl FaultControl for DiskServer {
    fn block_size(&self) -> u64 {
        self.block_size
    }
    fn reset_epoch(&self) -> Result<u64> {
        DiskServer::reset_epoch(self)
    }
    fn arm(&self, rules: Vec<Rule>) -> Result<()> {
        DiskServer::arm(self, rules).map(drop)
    }
    fn list(&self) -> Result<Vec<RuleStatus>> {
        DiskServer::list(self)
    }
    fn log_since(&self, seq: u64) -> Result<Vec<LogEntry>> {
        DiskServer::log_since(self, seq)
    }
    fn log_dropped(&self) -> Result<u64> {
        Ok(self.stats()?.faults.log_dropped)
    }
}

/// Arm: every disk's fault clock restarts now (not with mkfs), so windows count from here;
/// the static faults are armed on their disks. Returns each disk's log position (from which
/// [`collect_faults`] reads) and the faults placed by workload progress, for the scheduler.
pub(crate) fn arm_faults(disks: &[&dyn FaultControl], faults: &[FaultSpec]) -> Result<(Vec<u64>, Vec<FaultSpec>)> {
    let seq0: Vec<u64> = disks.iter().map(|d| d.reset_epoch()).collect::<Result<_>>()?;
    Ok((seq0, arm_static(disks, faults)?))
}

/// Arm the static faults on their disks (the fault clocks already restarted); returns the
/// faults placed by workload progress.
pub(crate) fn arm_static(disks: &[&dyn FaultControl], faults: &[FaultSpec]) -> Result<Vec<FaultSpec>> {
    let (static_faults, scheduled) = super::schedule::split(faults);
    for f in static_faults {
        let Some(d) = disks.get(f.disk) else {
            bail!("fault `{}` is for disk {}, but this placement has {} disk(s) (0 to {})", f.label, f.disk, disks.len(), disks.len().saturating_sub(1));
        };
        d.arm(vec![f.rule.clone()])?;
    }
    Ok(scheduled)
}

/// Networked placements arm faults by time only: a fault placed by workload progress needs
/// the workload in this process, beside the scheduler.
pub(crate) fn check_windows_only(setup: &Setup) -> Result<()> {
    if !super::schedule::split(&setup.faults).1.is_empty() {
        bail!("faults placed by workload progress (`at:`/content targets) are not supported with `hosts:`; use windows");
    }
    Ok(())
}

/// Collect what the fault engines did since they were armed (`seq0`, per disk): every logged
/// fault and every rule's counters.
pub(crate) fn collect_faults(disks: &[&dyn FaultControl], seq0: &[u64], notes: &mut Vec<String>) -> Result<(Vec<rm::InjectedFault>, Vec<rm::RuleCount>)> {
    let mut faults = Vec::new();
    let mut rules = Vec::new();
    for (i, d) in disks.iter().enumerate() {
        let listed = d.list()?;
        faults.extend(collect::injected_faults(i as u32, d.block_size(), &listed, &d.log_since(seq0[i])?));
        let dropped = d.log_dropped()?;
        if dropped > 0 {
            notes.push(format!("disk {i}: the fault log dropped {dropped} entries (cap); counters below are exact"));
        }
        rules.extend(collect::rule_counts(&listed));
    }
    Ok((faults, rules))
}

/// Ctrl-C / SIGTERM end the workloads early: until `done`, a set `stop` sets every
/// workload's `progress.stop` (its threads watch it).
pub(crate) fn forward_stop(stop: &Arc<AtomicBool>, progresses: Vec<Arc<Progress>>, done: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    let stop = stop.clone();
    std::thread::spawn(move || {
        while !done.load(Relaxed) {
            if stop.load(Relaxed) {
                for p in &progresses {
                    p.stop.store(true, Relaxed);
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A placement that records the phases it ran and fails in the one it is told to.
    struct Recorder {
        ran: Arc<Mutex<Vec<&'static str>>>,
        fail_in: Option<&'static str>,
    }

    impl Recorder {
        fn step(&self, r: &mut Rep, phase: &'static str) -> Result<()> {
            self.ran.lock().unwrap().push(phase);
            r.notes.push(format!("{phase} ran"));
            if self.fail_in == Some(phase) {
                bail!("{phase} failed");
            }
            Ok(())
        }
    }

    impl Placement for Recorder {
        fn build(&mut self, r: &mut Rep) -> Result<()> {
            self.step(r, "build")
        }
        fn arm(&mut self, r: &mut Rep) -> Result<()> {
            self.step(r, "arm")
        }
        fn drive(&mut self, r: &mut Rep, o: &mut Outcome) -> Result<()> {
            o.host_faults.push(crate::host::HostFaultRecord { description: "freeze".into(), error: Some("no cgroup".into()), ..Default::default() });
            self.step(r, "drive")
        }
        fn verify(&mut self, r: &mut Rep, _: &mut Outcome) -> Result<()> {
            self.step(r, "verify")
        }
        fn collect(&mut self, r: &mut Rep, _: &mut Outcome) -> Result<()> {
            self.step(r, "collect")
        }
        fn teardown(&mut self, r: &mut Rep) -> Result<()> {
            self.step(r, "teardown")
        }
    }

    fn run(fail_in: Option<&'static str>) -> (Result<rm::Repetition>, Vec<&'static str>) {
        let exp = crate::spec::experiment::parse_experiment("name: x\nworkload: {size: 1MiB}\n", "t.yaml").unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let r = Rep {
            exp: &exp,
            setup: &exp.setups[0],
            index: 2,
            baseline: false,
            out: Path::new("/nonexistent"),
            label: "t",
            stop: &stop,
            quiet: true,
            notes: vec![],
        };
        let ran = Arc::new(Mutex::new(Vec::new()));
        let res = run_repetition(&mut Recorder { ran: ran.clone(), fail_in }, r);
        let ran = ran.lock().unwrap().clone();
        (res, ran)
    }

    #[test]
    fn phases_run_in_order_and_the_record_is_assembled_once() {
        let (rep, ran) = run(None);
        assert_eq!(ran, ["build", "arm", "drive", "verify", "collect", "teardown"]);
        let rep = rep.unwrap();
        assert_eq!(rep.index, 3);
        // the phases' notes in order, then what the host faults said
        assert_eq!(rep.notes.first().map(String::as_str), Some("build ran"));
        assert_eq!(rep.notes.get(5).map(String::as_str), Some("teardown ran"));
        assert_eq!(rep.notes.last().map(String::as_str), Some("host fault freeze: no cgroup"));
        assert_eq!(rep.host_faults.len(), 1);
    }

    #[test]
    fn a_failing_phase_stops_the_rest_but_never_the_teardown() {
        for (phase, want) in [("build", 1), ("arm", 2), ("drive", 3), ("verify", 4), ("collect", 5)] {
            let (rep, ran) = run(Some(phase));
            let e = rep.unwrap_err().to_string();
            assert_eq!(e, format!("{phase} failed"));
            assert_eq!(ran.len(), want + 1, "{phase}: {ran:?}");
            assert_eq!(ran.last(), Some(&"teardown"), "{phase}: {ran:?}");
        }
        // a teardown that fails after phases that went well fails the repetition
        let (rep, ran) = run(Some("teardown"));
        assert_eq!(rep.unwrap_err().to_string(), "teardown failed");
        assert_eq!(ran.len(), 6);
    }
}
