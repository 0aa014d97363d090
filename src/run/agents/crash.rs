//! A power cut of the target through agents (docs/crash.md, "Through agents"): the cutter
//! watches the clients' workloads from their interval lines and cuts through the target's
//! agent; after it, the disk powers on and each client's own durability oracle rereads its
//! slice of the disk.

use super::remote::{Remote, Shared, failed_ios};
use super::target::RemoteDisk;
use super::{CALL_LIMIT, ORACLE_LIMIT};
use crate::cluster::jsonl::Interval;
use crate::cluster::proto::Op;
use crate::report::model::{ClientOracle, CrashRecord};
use crate::run::crash::{CutDisk, Cutter, Running, Victims, client_oracle};
use crate::run::pipeline::Rep;
use crate::spec::rule::yaml::PowerCutSpec;
use crate::spec::workload::config::Workload;
use anyhow::{Context, Result, bail};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

/// A client's `faultline workload --crash-oracle` as a power cut's cutter sees it: its ops and
/// errors are what its interval lines said so far (they come once an interval), and it is
/// stopped with SIGUSR1 through its agent.
struct RemoteWorkload {
    client: Arc<Remote>,
    gathered: Shared,
}

impl RemoteWorkload {
    fn sum(&self, f: impl Fn(&Interval) -> u64) -> u64 {
        self.gathered.lock().unwrap().live.get(&self.client.spec.host).map_or(0, |v| v.iter().map(f).sum())
    }
}

impl Running for RemoteWorkload {
    fn ops(&self) -> u64 {
        self.sum(|l| l.ops)
    }
    fn errors(&self) -> u64 {
        let g = self.gathered.lock().unwrap();
        // the last interval's errors may come only with the result
        match g.results.get(&self.client.spec.host) {
            Some(r) => r.errors.values().sum(),
            None => g.live.get(&self.client.spec.host).map_or(0, |v| v.iter().map(|l| l.errors).sum()),
        }
    }
    fn stopped(&self) -> bool {
        let g = self.gathered.lock().unwrap();
        let h = &self.client.spec.host;
        g.results.contains_key(h) || g.exits.contains_key(&(h.clone(), "workload".into())) || self.client.is_lost()
    }
    fn stop(&self) {
        // (a workload that ended meanwhile has nothing to stop: the error is of no use)
        let _ = self.client.call(Op::Kill { name: "workload".into(), signal: Some(libc::SIGUSR1) }, CALL_LIMIT);
    }
}

/// The cutter of a power cut of `disk` (its trigger from `t0`, the start instant T on this
/// clock) and the record the crash phase completes. The client hosts keep their power: each
/// runs on into the dead target until one of its I/Os fails, at most `give_up` (its NBD
/// policy's time to give up on one request, plus an interval), and is stopped then.
pub(super) fn start_cutter(
    pc: &PowerCutSpec,
    disk: &RemoteDisk,
    clients: &[Arc<Remote>],
    gathered: &Shared,
    give_up: Duration,
    t0: Instant,
) -> Result<(Cutter, CrashRecord)> {
    let seed = pc.seed.unwrap_or_else(rand::random);
    let victims = Victims {
        progress: clients.iter().map(|c| Arc::new(RemoteWorkload { client: c.clone(), gathered: gathered.clone() }) as Arc<dyn Running>).collect(),
        until_error: Some(give_up),
        ..Default::default()
    };
    let cutter = Cutter::start_from(pc, seed, Arc::new(disk.clone()) as Arc<dyn CutDisk>, victims, t0)?;
    Ok((cutter, crate::run::crash_record(pc, seed)))
}

/// After the cut: the target's disk powers on through its agent (every client stopped at the
/// cut), then each client's workload, waiting since its result line, is told to reread
/// (SIGUSR2 through its agent): its durability oracle rereads every block it wrote in its
/// slice over a fresh NBD connection from its host and prints what it found. One record per
/// client, in `clients` order; a lost agent fails the repetition, naming its host.
pub(super) fn reread(r: &mut Rep, disk: &RemoteDisk, clients: &[Arc<Remote>], workloads: &[Workload], gathered: &Shared) -> Result<Vec<ClientOracle>> {
    let target = &disk.target;
    if let Some(l) = target.loss_text() {
        bail!("{l}: the target's disk cannot be powered on (crash phase)");
    }
    target.set_doing("powering the target's disk on after the power cut");
    disk.power_on().with_context(|| format!("host {}: cannot power the target's disk on through its agent", target.spec.host))?;
    target.set_doing("serving the disk");
    if let Some(l) = clients.iter().find_map(|c| c.loss_text()) {
        bail!("{l}: no durability oracle (crash phase)");
    }
    let names = clients.iter().map(|c| c.spec.host.as_str()).collect::<Vec<_>>().join(", ");
    let their = if clients.len() == 1 { "its agent" } else { "their agents" };
    r.phase(&format!("crash: durability oracle (over NBD, from {names} through {their})"));
    // every client rereads its own slice at once (separate hosts, separate blocks)
    for c in clients {
        c.set_doing("rereading what it wrote (durability oracle)");
        c.call(Op::Kill { name: "workload".into(), signal: Some(libc::SIGUSR2) }, CALL_LIMIT)
            .with_context(|| format!("host {}: cannot tell the client's workload to reread", c.spec.host))?;
    }
    let t = Instant::now();
    let mut reports: Vec<Option<crate::verify::crash::OracleReport>> = vec![None; clients.len()];
    while reports.iter().any(|x| x.is_none()) {
        if r.stop.load(Relaxed) {
            bail!("interrupted");
        }
        if let Some(l) = std::iter::once(target).chain(clients).find_map(|rm| rm.loss_text()) {
            bail!("{l}: no durability oracle (crash phase)");
        }
        {
            let mut g = gathered.lock().unwrap();
            for (c, rep) in clients.iter().zip(reports.iter_mut()).filter(|(_, x)| x.is_none()) {
                let key = (c.spec.host.clone(), "workload".to_string());
                if let Some(x) = g.oracles.remove(&c.spec.host) {
                    *rep = Some(x);
                    c.set_doing("waiting for the teardown");
                } else if let Some((code, sig)) = g.exits.get(&key) {
                    let why = g.stderr.get(&key).map(|v| v.join(" | ")).unwrap_or_default();
                    bail!("client {}: its workload ended (code {code:?}, signal {sig:?}) without the durability oracle's report: {why}", c.spec.host);
                }
            }
        }
        if t.elapsed() > ORACLE_LIMIT {
            let late: Vec<&str> = clients.iter().zip(&reports).filter(|(_, x)| x.is_none()).map(|(c, _)| c.spec.host.as_str()).collect();
            bail!("client(s) {}: no durability oracle's report within {} s of power-on", late.join(", "), ORACLE_LIMIT.as_secs());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let g = gathered.lock().unwrap();
    Ok(clients
        .iter()
        .zip(workloads)
        .zip(reports)
        .map(|((c, w), x)| client_oracle(&c.spec.host, w, failed_ios(&g, &c.spec.host), x.expect("every report came")))
        .collect())
}
