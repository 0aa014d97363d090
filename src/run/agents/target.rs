//! The target through its agent: its disk server's control socket (faults, the power cut),
//! waiting until it listens, and `kill` host faults (kill, restart, faults armed again).

use super::remote::{Remote, Shared};
use super::{CALL_LIMIT, TARGET_START_LIMIT};
use crate::cluster::proto::Op;
use crate::fault::Rule;
use crate::run::crash::CutDisk;
use crate::run::pipeline::FaultControl;
use crate::spec::networked::{NetworkedHosts, TargetKind};
use anyhow::{Context, Result, bail};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// The target's disk server reached through its agent (a faultline target).
#[derive(Clone)]
pub(super) struct RemoteDisk {
    pub(super) target: Arc<Remote>,
    pub(super) socket: String,
    pub(super) block_size: u64,
}

impl FaultControl for RemoteDisk {
    fn block_size(&self) -> u64 {
        self.block_size
    }
    fn reset_epoch(&self) -> Result<u64> {
        self.target.control(&self.socket).reset_epoch(None)
    }
    fn arm(&self, rules: Vec<Rule>) -> Result<()> {
        self.target.control(&self.socket).arm(rules).map(drop)
    }
    fn list(&self) -> Result<Vec<crate::fault::engine::RuleStatus>> {
        self.target.control(&self.socket).list()
    }
    fn log_since(&self, since: u64) -> Result<Vec<crate::fault::log::LogEntry>> {
        self.target.control(&self.socket).log_since(since)
    }
    fn log_dropped(&self) -> Result<u64> {
        Ok(self.target.control(&self.socket).stats()?.faults.log_dropped)
    }
}

impl RemoteDisk {
    /// Restart the fault clock at `at_ns` (CLOCK_REALTIME on the target's host): the rules
    /// can then go in before the clients' agreed start, and their first I/Os meet them.
    pub(super) fn reset_epoch_at(&self, at_ns: u64) -> Result<u64> {
        self.target.control(&self.socket).reset_epoch(Some(at_ns))
    }
    /// Power on after a cut: the disk serves again.
    pub(super) fn power_on(&self) -> Result<()> {
        self.target.control(&self.socket).power_on()
    }
}

impl CutDisk for RemoteDisk {
    /// One `stats` request through the agent.
    fn flushes(&self) -> Result<Option<u64>> {
        Ok(self.target.control(&self.socket).stats()?.write_cache.map(|c| c.flushes))
    }
    fn power_cut(&self, model: crate::disk::cache::SurvivalModel, seed: u64) -> Result<crate::disk::cache::CutReport> {
        self.target.control(&self.socket).power_cut(model, Some(seed)).with_context(|| format!("host {}: power cut through its agent", self.target.spec.host))
    }
}

/// Arm the setup's disk faults on a restarted faultline target: its clock starts now, so each
/// window moves back by the time the run has already gone (`elapsed`); a window that is over
/// is left out. Counts (`times`, `after_requests`) start again on the fresh disk.
fn rearm_restarted(disk: &RemoteDisk, rules: &[crate::spec::rule::Rule], elapsed: Duration, notes: &mut Vec<String>) {
    if let Err(e) = disk.reset_epoch() {
        notes.push(format!("the restarted target's clock: {e:#}"));
        return;
    }
    for r in rules {
        let mut r = r.clone();
        if let Some(w) = r.window.as_mut() {
            if w.to.is_some_and(|t| t <= elapsed) {
                continue;
            }
            w.from = w.from.saturating_sub(elapsed);
            w.to = w.to.map(|t| t - elapsed);
        }
        let name = r.name.clone();
        if let Err(e) = disk.arm(vec![r]) {
            notes.push(format!("disk fault {} not armed again on the restarted target: {e:#}", name.as_deref().unwrap_or("(unnamed)")));
        }
    }
}

/// `kill` host faults through the target's agent: at each one's `from` the target's process
/// group gets SIGKILL (`down` set, so its end is expected); at its `to`, if any, the target
/// starts again with the same command, and once it listens `down` clears.
#[allow(clippy::too_many_arguments)]
pub(super) fn kill_target(
    target: &Remote,
    g: &Shared,
    down: &AtomicBool,
    done: &AtomicBool,
    kills: &[crate::spec::host::HostFault],
    argv: &[String],
    mut pid: u32,
    t0: Instant,
    rearm: Option<&(RemoteDisk, Vec<crate::spec::rule::Rule>)>,
) -> Vec<crate::host::HostFaultRecord> {
    let is_fl = rearm.is_some();
    let key = (target.spec.host.clone(), "target".to_string());
    let wait_until = |at: Instant| -> bool {
        while Instant::now() < at {
            if done.load(Relaxed) {
                return false;
            }
            std::thread::sleep(Duration::from_millis(2).min(at.saturating_duration_since(Instant::now())));
        }
        true
    };
    let mut kills = kills.to_vec();
    kills.sort_by_key(|k| k.from);
    let mut out = Vec::new();
    for k in kills {
        let mut rec = crate::host::HostFaultRecord {
            name: k.name.clone(),
            host: Some(target.spec.host.clone()),
            kind: "kill".into(),
            description: format!("kill the target's server{}", if k.to.is_some() { ", then start it again" } else { "" }),
            from_s: k.from.as_secs_f64(),
            to_s: k.to.map(|t| t.as_secs_f64()),
            ..Default::default()
        };
        if !wait_until(t0 + k.from) {
            out.push(rec);
            continue;
        }
        down.store(true, Relaxed);
        match target.call(Op::Kill { name: "target".into(), signal: Some(libc::SIGKILL) }, CALL_LIMIT) {
            Ok(_) => rec.killed = vec![pid],
            Err(e) => rec.error = Some(format!("{e:#}")),
        }
        rec.applied_at_s = Some(t0.elapsed().as_secs_f64());
        // what the killed server left (its ledger, control socket) goes now, before a new
        // one takes the same socket path
        let t = Instant::now();
        while !g.lock().unwrap().exits.contains_key(&key) && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(5));
        }
        match target.exec(&[&target.spec.faultline, "cleanup"], None) {
            Ok((true, _)) => {}
            Ok((false, text)) => rec.notes.push(format!("cleanup after the kill: {}", text.trim())),
            Err(e) => rec.notes.push(format!("cleanup after the kill: {e:#}")),
        }
        if let Some(to) = k.to
            && wait_until(t0 + to)
        {
            {
                let mut g = g.lock().unwrap();
                g.exits.remove(&key);
                g.stdout.remove(&key);
            }
            match target.spawn("target", argv.to_vec()) {
                Ok(p) => {
                    pid = p;
                    rec.restarted = vec![p];
                    // listening again: its URI line (faultline); a command is given a moment
                    let t = Instant::now();
                    while is_fl
                        && t.elapsed() < TARGET_START_LIMIT
                        && !g.lock().unwrap().stdout.get(&key).is_some_and(|v| v.iter().any(|l| l.starts_with("nbd://")))
                    {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    if let Some((disk, rules)) = rearm {
                        rearm_restarted(disk, rules, t0.elapsed(), &mut rec.notes);
                    }
                    down.store(false, Relaxed);
                }
                Err(e) => rec.error = Some(format!("restart failed: {e:#}")),
            }
            rec.reverted_at_s = Some(t0.elapsed().as_secs_f64());
        }
        out.push(rec);
    }
    out
}

/// Wait until the target listens: its URI line (faultline), or a TCP connect from the first
/// client host (a command).
pub(super) fn wait_target(target: &Remote, client: &Remote, hosts: &NetworkedHosts, addr: &str, g: &Shared) -> Result<()> {
    let t = Instant::now();
    let key = (target.spec.host.clone(), "target".to_string());
    while t.elapsed() < TARGET_START_LIMIT {
        {
            let g = g.lock().unwrap();
            if let Some((code, sig)) = g.exits.get(&key) {
                let why = g.stderr.get(&key).map(|v| v.join(" | ")).unwrap_or_default();
                bail!("host {}: the target ended at start (code {code:?}, signal {sig:?}): {why}", target.spec.host);
            }
            if hosts.kind == TargetKind::Faultline && g.stdout.get(&key).is_some_and(|v| v.iter().any(|l| l.starts_with("nbd://"))) {
                return Ok(());
            }
        }
        if let TargetKind::Command(_) = hosts.kind {
            let probe = format!("exec 3<>/dev/tcp/{addr}/{}", hosts.port);
            if client.exec(&["timeout", "1", "bash", "-c", &probe], None)?.0 {
                return Ok(());
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("host {}: the target did not listen on port {} within {} s", target.spec.host, hosts.port, TARGET_START_LIMIT.as_secs())
}
