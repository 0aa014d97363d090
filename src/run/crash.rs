//! Power cuts inside `faultline run` (docs/crash.md, "Crash and check in a run"): the cutter
//! thread that cuts the disk's power when the fault's trigger comes due and stops what ran on
//! it, and the application check of a `command` stack after power-on.

use super::disks::DiskServer;
use crate::disk::cache::{CutReport, SurvivalModel};
use crate::report::model as rm;
use crate::spec::rule::yaml::{CutTrigger, PowerCutSpec};
use crate::workload::Progress;
use anyhow::Result;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often the cutter looks at its trigger: time and op counts are cheap; the flush count
/// is one `stats` request to the disk server.
const POLL: Duration = Duration::from_millis(1);
const POLL_FLUSHES: Duration = Duration::from_millis(2);

/// A cut that happened.
pub(crate) struct Cut {
    pub t_s: f64,
    pub report: CutReport,
}

/// The disk a cutter cuts: one of the run's own disk servers, or a target's reached through
/// its agent (run::agents).
pub(crate) trait CutDisk: Send + Sync {
    /// Flushes the volatile cache completed (None: the disk has no such cache).
    fn flushes(&self) -> Result<Option<u64>>;
    /// Cut the power: the cache keeps what `model` says; every request fails until power-on.
    fn power_cut(&self, model: SurvivalModel, seed: u64) -> Result<CutReport>;
}

impl CutDisk for DiskServer {
    fn flushes(&self) -> Result<Option<u64>> {
        DiskServer::flushes(self)
    }
    fn power_cut(&self, model: SurvivalModel, seed: u64) -> Result<CutReport> {
        DiskServer::power_cut(self, model, seed)
    }
}

/// A running workload as the cutter sees it: a local one's `Progress`, or a client's
/// `faultline workload` on another host (run::agents: its figures from its interval lines).
pub(crate) trait Running: Send + Sync {
    /// Completed ops.
    fn ops(&self) -> u64;
    /// Failed I/Os.
    fn errors(&self) -> u64;
    /// Whether it ended or was told to.
    fn stopped(&self) -> bool;
    /// End it: its threads let their in-flight I/Os complete and stop.
    fn stop(&self);
}

impl Running for Progress {
    fn ops(&self) -> u64 {
        Progress::ops(self)
    }
    fn errors(&self) -> u64 {
        Progress::errors(self)
    }
    fn stopped(&self) -> bool {
        self.stop.load(Relaxed)
    }
    fn stop(&self) {
        self.stop.store(true, Relaxed)
    }
}

/// What the power took along with the disk.
#[derive(Default, Clone)]
pub(crate) struct Victims {
    /// The workloads (one per workload: a local run's, or each client's of a networked
    /// experiment): each is stopped once the power is gone and it has seen its errors;
    /// `after_ops` counts their ops together.
    pub progress: Vec<Arc<dyn Running>>,
    /// A `command` stack's process group, killed at once (SIGKILL): the application lost
    /// power too.
    pub pgid: Option<i32>,
    /// The durability oracle's switch (`Durability::power_off`): set before the power goes,
    /// so no sync that returns after the cut is credited.
    pub power_off: Option<Arc<AtomicBool>>,
    /// Workloads on other hosts (a networked experiment's clients): they lost no power and
    /// each goes on until it has seen an I/O fail against the dead disk, then it is stopped;
    /// at most this long after the cut (their NBD policy's time to give up on one request).
    pub until_error: Option<Duration>,
}

/// The cutter thread of one repetition.
pub(crate) struct Cutter {
    handle: JoinHandle<Result<Option<Cut>>>,
    /// Set when the workload ended: a cut not yet due never comes.
    done: Arc<AtomicBool>,
    /// Set just before the power goes: whatever runs after the workload knows.
    pub fired: Arc<AtomicBool>,
}

impl Cutter {
    /// Start watching `spec`'s trigger, counted from now (the workload's start).
    pub(crate) fn start(spec: &PowerCutSpec, seed: u64, disk: Arc<dyn CutDisk>, victims: Victims) -> Result<Cutter> {
        Self::start_from(spec, seed, disk, victims, Instant::now())
    }

    /// Start watching `spec`'s trigger, `at` counted from `t0` (the workload's start instant,
    /// which may be a moment away: the agents' start instant T).
    pub(crate) fn start_from(spec: &PowerCutSpec, seed: u64, disk: Arc<dyn CutDisk>, victims: Victims, t0: Instant) -> Result<Cutter> {
        let done = Arc::new(AtomicBool::new(false));
        let fired = Arc::new(AtomicBool::new(false));
        let flushes0 = match spec.trigger {
            CutTrigger::AfterFlushes(_) => disk.flushes()?.unwrap_or(0),
            _ => 0,
        };
        let (trigger, model) = (spec.trigger, spec.model);
        let (d2, f2) = (done.clone(), fired.clone());
        let handle = std::thread::spawn(move || -> Result<Option<Cut>> {
            loop {
                if d2.load(Relaxed) {
                    return Ok(None);
                }
                let due = match trigger {
                    CutTrigger::At(t) => Instant::now().saturating_duration_since(t0) >= t,
                    CutTrigger::AfterOps(n) => !victims.progress.is_empty() && victims.progress.iter().map(|p| p.ops()).sum::<u64>() >= n,
                    CutTrigger::AfterFlushes(n) => disk.flushes()?.unwrap_or(0).saturating_sub(flushes0) >= n,
                };
                if due {
                    break;
                }
                std::thread::sleep(if matches!(trigger, CutTrigger::AfterFlushes(_)) { POLL_FLUSHES } else { POLL });
            }
            f2.store(true, Relaxed);
            if let Some(off) = &victims.power_off {
                off.store(true, std::sync::atomic::Ordering::SeqCst);
            }
            let t_s = Instant::now().saturating_duration_since(t0).as_secs_f64();
            let errors0: Vec<u64> = victims.progress.iter().map(|p| p.errors()).collect();
            let report = disk.power_cut(model, seed);
            if let Some(pg) = victims.pgid {
                // SAFETY: kill takes no pointers; the group is the command's, still running
                // (the cutter stops with the command)
                unsafe { libc::kill(-pg, libc::SIGKILL) };
            }
            // each workload on another host is stopped once it has seen its own error (or was
            // stopped otherwise), all of them at the limit or when the workloads are over
            if let Some(limit) = victims.until_error.filter(|_| report.is_ok()) {
                let t = Instant::now();
                let mut waiting: Vec<usize> = (0..victims.progress.len()).collect();
                while !waiting.is_empty() && t.elapsed() < limit && !d2.load(Relaxed) {
                    waiting.retain(|&i| {
                        let p = &victims.progress[i];
                        let seen = p.errors() != errors0[i] || p.stopped();
                        if seen && !p.stopped() {
                            p.stop();
                        }
                        !seen
                    });
                    std::thread::sleep(POLL);
                }
            }
            for p in victims.progress.iter().filter(|p| !p.stopped()) {
                p.stop();
            }
            Ok(Some(Cut { t_s, report: report? }))
        });
        Ok(Cutter { handle, done, fired })
    }

    /// The workload ended: the cut, if it came.
    pub(crate) fn finish(self) -> Result<Option<Cut>> {
        self.done.store(true, Relaxed);
        self.handle.join().map_err(|_| anyhow::anyhow!("the power-cut thread panicked"))?
    }
}

/// One client's part of a networked experiment's power cut: its slice of the target's disk
/// (`w.base`, and the bytes its content maps cover: `span` in whole content blocks), the I/Os
/// it saw fail and what its oracle found. Both placements build it here (namespaces: the
/// oracle ran in this process; agents: the client's own workload printed it).
pub(crate) fn client_oracle(
    host: &str,
    w: &crate::spec::workload::config::Workload,
    failed_ios: u64,
    oracle: crate::verify::crash::OracleReport,
) -> rm::ClientOracle {
    use crate::spec::workload::config::CONTENT_BLOCK;
    rm::ClientOracle { host: host.to_string(), offset: w.base, length: w.span.unwrap_or(0) / CONTENT_BLOCK * CONTENT_BLOCK, failed_ios, oracle }
}

/// A networked cut's record gets its clients (in `hosts: {clients}` order) and, as its
/// `oracle`, their sum (the figure and the columns read as for one disk).
pub(crate) fn set_client_oracles(rec: &mut rm::CrashRecord, clients: Vec<rm::ClientOracle>) {
    rec.clients = clients;
    rec.oracle = Some(crate::verify::crash::OracleReport::sum(rec.clients.iter().map(|c| &c.oracle)));
}

/// The note of a networked cut that fired: when the target lost power (`where_`: e.g. its
/// host and path, may be empty) and what each client (host, failed I/Os) saw.
pub(crate) fn lost_power_note(t_s: f64, where_: &str, failed: &[(String, u64)]) -> String {
    let saw = match failed {
        [(_, one)] => format!("the client ran on until an I/O failed and saw {one} failed I/O(s)"),
        _ => format!(
            "each client ran on until an I/O failed: {}",
            failed.iter().map(|(n, f)| format!("{n} saw {f} failed I/O(s)")).collect::<Vec<_>>().join(", ")
        ),
    };
    format!("the target lost power at {t_s:.3} s{where_}: its disk answered every request with EIO until power-on; {saw}")
}

/// "at 2s", "after 5000 ops", "after 40 flushes".
/// The start of a crash phase. A cut whose trigger never came due is recorded as such with a
/// note and ends the phase (`None`); a cut that fired prints the phase line (`what`: where the
/// power went) and is handed back to be checked.
pub(crate) fn begin(rec: rm::CrashRecord, r: &mut super::pipeline::Rep, o: &mut super::pipeline::Outcome, what: &str) -> Option<rm::CrashRecord> {
    if !rec.fired {
        r.notes.push(format!("{}: its trigger ({}) never came due during the workload: no power cut", rec.fault, rec.trigger));
        o.crash = Some(rec);
        return None;
    }
    r.phase(&format!("crash + check ({} cut{what} at {:.3} s)", rec.model.map(|m| m.to_string()).unwrap_or_default(), rec.t_s));
    Some(rec)
}

pub(crate) fn trigger_text(t: CutTrigger) -> String {
    match t {
        CutTrigger::At(d) => format!("at {}", crate::spec::units::format_duration(d)),
        CutTrigger::AfterOps(n) => format!("after {n} ops"),
        CutTrigger::AfterFlushes(n) => format!("after {n} flushes"),
    }
}

/// The numbers of a JSON object on the last non-empty line of `stdout` (an application
/// check's figures); empty when that line is no JSON object.
pub(crate) fn figures(stdout: &str) -> std::collections::BTreeMap<String, f64> {
    let Some(last) = stdout.lines().rev().find(|l| !l.trim().is_empty()) else { return Default::default() };
    match serde_json::from_str::<serde_json::Value>(last.trim()) {
        Ok(serde_json::Value::Object(m)) => m.into_iter().filter_map(|(k, v)| v.as_f64().map(|n| (k, n))).collect(),
        _ => Default::default(),
    }
}

/// Run a command stack's `check` after power-on and remount.
pub(crate) fn app_check(check: &crate::spec::stack::Cmdline, env: &crate::stack::command::CommandEnv, stop: &AtomicBool) -> Result<rm::AppCheck> {
    let spec = crate::spec::stack::CommandSpec { command: check.clone(), timeout: Some(CHECK_LIMIT), cwd: None, acks: false, check: None };
    let o = crate::stack::command::run_command(&spec, env, Some(stop))?;
    Ok(rm::AppCheck {
        command: match check {
            crate::spec::stack::Cmdline::Shell(s) => s.clone(),
            crate::spec::stack::Cmdline::Argv(v) => v.join(" "),
        },
        exit_code: o.exit_code,
        verdict: if o.success() { "consistent" } else { "inconsistent" }.into(),
        figures: figures(&o.stdout_tail),
        stdout_tail: tail_lines(&o.stdout_tail, 12),
        stderr_tail: tail_lines(&o.stderr_tail, 12),
    })
}

/// An application check is killed after this long (and counts as inconsistent).
const CHECK_LIMIT: Duration = Duration::from_secs(600);

fn tail_lines(s: &str, n: usize) -> String {
    let l: Vec<&str> = s.lines().collect();
    l[l.len().saturating_sub(n)..].join("\n")
}

/// Lines in the acknowledgements file (0 when it is missing).
pub(crate) fn count_lines(p: &std::path::Path) -> u64 {
    std::fs::read(p).map(|b| b.iter().filter(|c| **c == b'\n').count() as u64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_come_from_a_json_object_on_the_last_line() {
        let f = figures("checking...\n{\"acked\": 1200, \"present\": 1190, \"lost\": 10, \"note\": \"x\"}\n\n");
        assert_eq!(f.get("acked"), Some(&1200.0));
        assert_eq!(f.get("lost"), Some(&10.0));
        assert_eq!(f.len(), 3, "strings are not figures: {f:?}");
        assert!(figures("{\"lost\": 1}\ndone\n").is_empty(), "only the last line counts");
        assert!(figures("[1, 2]\n").is_empty());
        assert!(figures("").is_empty());
    }
}
