//! Networked experiments across machines (`hosts: {agents: ...}`, docs/cluster.md): the same
//! experiment as run::hosts, but every host is reached through its own channel (ssh, `ip
//! netns exec`, `kubectl exec -i`) where an agent (`faultline agent --stdio`) runs; faultline
//! builds no namespaces. One repetition:
//!
//! 1. starts the agents and estimates each one's clock offset (`preflight`, once before any
//!    setup, has checked that every host can apply its faults: nftables for
//!    partition/reset, a TUN device for the user-space engine (delay, jitter, rate,
//!    duplicate, reorder, loss));
//! 2. spawns the target (`faultline serve --nbd tcp://0.0.0.0:PORT --no-loop`, or the
//!    command), then each client's workload (`faultline workload --nbd URI --jsonl
//!    --start-at-ns T`), all waiting for one instant T, a prober on every host
//!    (`faultline agent --probe`), and the network faults' helper on every sending host
//!    (`faultline agent --net-faults`, cluster::netfaults: in place before T, windows from T);
//! 3. arms the faults (every agent ready): the disk's rules go in before T, its clock starting
//!    at T on the target's clock (`reset_epoch` with `at_ns`); at T host faults start on the
//!    target's agent;
//! 4. collects every line on the controller's clock (agent time minus its offset) while a
//!    heartbeat (`time`) watches each agent; a lost agent aborts the run or is marked
//!    (`on_agent_loss`);
//! 5. after a power cut of the target (docs/crash.md, "A power cut in a networked
//!    experiment"): powers its disk on through its agent and has each client's workload, which
//!    kept its own durability record (`--crash-oracle`) of its own slice of the disk, reread
//!    what it wrote;
//! 6. tears down on every host; the repetition gets its `networked`, the same structures as the
//!    namespace run.
//!
//! `Agents` is this placement's part of the repetition pipeline (run::pipeline): build is
//! steps 1-2, arm step 3, drive and collect step 4, crash step 5, teardown step 6. Beside it:
//! `remote` (one host through its agent, the thread gathering its events), `argv` (the
//! command lines sent), `net` (network fault plans and reports), `target` (the target's disk,
//! waiting for it, `kill` host faults), `crash` (the power cut's cutter and the reread).

mod argv;
mod crash;
mod net;
mod remote;
mod target;

use super::hosts::{client_series, windows};
use super::pipeline::{FaultControl, Outcome, Placement, Rep, arm_static, check_windows_only, collect_faults};
use crate::cluster::Agent;
use crate::cluster::jsonl::Interval;
use crate::cluster::proto::Op;
use crate::report::networked::{ClientPoint, ClientSeries, NetworkedAgent, NetworkedHost, NetworkedRun, Probe};
use crate::spec::experiment::Experiment;
use crate::spec::networked::{NetworkedHosts, OnAgentLoss, TargetKind};
use crate::spec::workload::config::{Interface, Workload};
use crate::sys::now_ns;
use anyhow::{Context, Result, bail};
use argv::{host_fault_yaml, workload_argv};
use net::{NetPlan, net_reports, nft_table, plan_net_faults, wait_net_ready};
use remote::{Gathered, Remote, Shared, channel_of, connect_all, failed_ios, gather, heartbeat};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use target::{RemoteDisk, kill_target, wait_target};

/// Time each call to an agent gets (a heartbeat's answer, a spawn, a control request).
pub(super) const CALL_LIMIT: Duration = Duration::from_secs(10);
/// From choosing the start instant to it: time to spawn every workload and prober and for
/// the workloads to connect and wait (plus `START_LEAD_PER_HOST` per host: spawns go one by one).
const START_LEAD: Duration = Duration::from_millis(1500);
const START_LEAD_PER_HOST: Duration = Duration::from_millis(20);
/// How long the target gets to listen.
pub(super) const TARGET_START_LIMIT: Duration = Duration::from_secs(30);
/// How long a client's durability oracle may take to reread what it wrote after power-on.
pub(super) const ORACLE_LIMIT: Duration = Duration::from_secs(3600);

/// Before any setup runs: start every agent once and check that each setup's faults can be
/// applied on its hosts and its workload can be sent (flags), then let the agents go.
pub fn preflight(exp: &Experiment) -> Result<()> {
    let hosts = exp.hosts.as_ref().context("`agents:` needs `hosts:`")?;
    let remotes = connect_all(hosts)?;
    let uri = format!("nbd://{}:{}/", remotes.iter().find(|r| r.role == "target").and_then(|r| r.spec.address.clone()).unwrap_or_default(), hosts.port);
    let mut res = Ok(());
    for s in &exp.setups {
        let r = (|| -> Result<()> {
            let w = exp.workload_for_client(s, &uri).map_err(anyhow::Error::msg)?;
            workload_argv("faultline", &w, &uri, 0, None)?;
            for h in &s.host_faults {
                host_fault_yaml(h)?;
            }
            let (_, paths) = plan_net_faults(s, hosts, &remotes, "check")?;
            for p in paths {
                eprintln!("faultline: setup `{}`: {p}", s.name);
            }
            Ok(())
        })();
        if let Err(e) = r {
            res = Err(e.context(format!("setup `{}`", s.name)));
            break;
        }
    }
    for r in remotes {
        if let Ok(r) = Arc::try_unwrap(r) {
            let _ = r.agent.into_inner().unwrap_or_else(|e| e.into_inner()).shutdown();
        }
    }
    res
}

/// The agents placement (module doc).
pub(crate) struct Agents<'a> {
    hosts: &'a NetworkedHosts,
    /// Names this repetition's sockets and nftables tables: `<run pid>-<repetition>`.
    tag: String,
    remotes: Vec<Arc<Remote>>,
    gathered: Shared,
    /// The start instant T on this clock, once chosen (agent losses are timed from it).
    t_ref: Arc<Mutex<Option<Instant>>>,
    gatherers: Vec<std::thread::JoinHandle<()>>,
    /// Hosts whose nftables table this repetition made.
    nft_hosts: Vec<String>,
    /// Set up by build, for the later phases.
    plan: Option<Plan>,
    /// The heartbeat: its stop flag and thread.
    heart: Option<(Arc<AtomicBool>, std::thread::JoinHandle<()>)>,
    /// The `kill` host faults' thread: its stop flag, the target-is-down flag and the thread.
    kills: Option<(Arc<AtomicBool>, std::thread::JoinHandle<Vec<crate::host::HostFaultRecord>>)>,
    target_down: Arc<AtomicBool>,
    seq0: Vec<u64>,
    /// With a power cut: its record once the drive is over (the crash phase completes it).
    crash: Option<crate::report::model::CrashRecord>,
}

/// What build decided and started, for arm, drive and collect.
struct Plan {
    target: Arc<Remote>,
    /// In `hosts: {clients}` order.
    clients: Vec<Arc<Remote>>,
    /// Each client's workload (its slice of the disk with a power cut).
    workloads: Vec<Workload>,
    /// The target's disk (a faultline target).
    disk: Option<RemoteDisk>,
    target_argv: Vec<String>,
    tpid: u32,
    /// Start instant T, ns on the controller's CLOCK_REALTIME.
    t_start: u64,
    host_yaml: Vec<String>,
    kills: Vec<crate::spec::host::HostFault>,
    net_plans: Vec<NetPlan>,
    /// After a power cut, how long each client may run on before it is stopped: its NBD
    /// policy's time to give up on one request, plus an interval (its errors travel in its
    /// interval lines).
    give_up: Duration,
}

impl<'a> Agents<'a> {
    pub(crate) fn new(hosts: &'a NetworkedHosts) -> Self {
        Agents {
            hosts,
            tag: String::new(),
            remotes: Vec::new(),
            gathered: Arc::new(Mutex::new(Gathered::default())),
            t_ref: Arc::new(Mutex::new(None)),
            gatherers: Vec::new(),
            nft_hosts: Vec::new(),
            plan: None,
            heart: None,
            kills: None,
            target_down: Arc::new(AtomicBool::new(false)),
            seq0: Vec::new(),
            crash: None,
        }
    }

    fn plan(&self) -> &Plan {
        self.plan.as_ref().expect("built before the later phases")
    }

    /// 1-2: agents, the target, then every client's workload, the network faults' helpers and
    /// the probers, all waiting for T; the heartbeat from here on.
    fn start(&mut self, r: &mut Rep) -> Result<()> {
        let (hosts, setup, exp) = (self.hosts, r.setup, r.exp);
        let remotes = self.remotes.clone();
        let target = remotes.iter().find(|r| r.role == "target").context("no agent for the target")?.clone();
        // in `hosts: {clients}` order: client i's workload is `client_workload(.., i)` (with a
        // power cut, its slice of the disk), as in the namespace run
        let mut clients: Vec<Arc<Remote>> = remotes.iter().filter(|r| r.role == "client").cloned().collect();
        clients.sort_by_key(|c| hosts.clients.iter().position(|h| *h == c.spec.host));
        let taddr = target.spec.address.clone().context("the target needs `address`")?;
        let q = hosts.nbd_query_for(setup);
        let q = if q.is_empty() { q } else { format!("?{q}") };
        let host_part = if taddr.contains(':') { format!("[{taddr}]") } else { taddr.clone() };
        let uri = format!("nbd://{host_part}:{}/{q}", hosts.port);
        let ws = (0..clients.len()).map(|i| exp.client_workload(setup, &uri, i).map_err(anyhow::Error::msg)).collect::<Result<Vec<_>>>()?;
        let give_up = match &ws.first().context("no client host")?.interface {
            Interface::Nbd { target } => {
                let p = &target.policy;
                (p.timeout + p.backoff_max) * (p.retries + 1) + Duration::from_secs(1) + hosts.interval
            }
            _ => bail!("the clients' workload is not an NBD workload"),
        };
        // a power cut of faultline's target: each client keeps its durability record
        let oracle = setup.power_cut.as_ref().filter(|_| hosts.kind == TargetKind::Faultline).map(|pc| pc.model);
        // checks before anything runs: faults every host can apply, flags the workloads can travel as
        for w in &ws {
            workload_argv("faultline", w, &uri, 0, oracle)?;
        }
        let host_yaml: Vec<String> = setup.host_faults.iter().map(host_fault_yaml).collect::<Result<Vec<_>>>()?.into_iter().flatten().collect();
        let kills: Vec<crate::spec::host::HostFault> =
            setup.host_faults.iter().filter(|h| matches!(h.action, crate::spec::host::HostAction::Kill)).cloned().collect();
        check_windows_only(setup)?;
        let (net_plans, net_paths) = plan_net_faults(setup, hosts, &remotes, &nft_table(&self.tag))?;
        for p in &net_paths {
            r.phase(p);
        }
        // the target, in its own run directory (it tells in its hello)
        let run_dir = if target.run_dir.is_empty() { "/run/faultline".to_string() } else { target.run_dir.clone() };
        let socket = format!("{run_dir}/agent-{}.sock", self.tag);
        target.set_doing("starting the target");
        let target_argv = match &hosts.kind {
            TargetKind::Faultline => {
                let mut argv = vec![target.spec.faultline.clone(), "serve".into(), format!("--nbd=tcp://0.0.0.0:{}", hosts.port), "--no-loop".into()];
                argv.extend(super::disks::serve_args(&setup.disk));
                argv.extend(["--socket".into(), socket.clone(), format!("--owned-by={}", target.agent_pid)]);
                argv
            }
            TargetKind::Command(cmd) => vec!["env".into(), format!("FAULTLINE_PORT={}", hosts.port), "sh".into(), "-c".into(), cmd.clone()],
        };
        let tpid = target.spawn("target", target_argv.clone())?;
        wait_target(&target, &clients[0], hosts, &taddr, &self.gathered)?;
        target.set_doing("serving the disk");
        // every client waits for the agreed instant T (its own clock: T plus its offset)
        let max_err = remotes.iter().map(|r| r.offset.error_ns).max().unwrap_or(0);
        let lead = START_LEAD + START_LEAD_PER_HOST * remotes.len() as u32;
        let t_start = now_ns() + lead.as_nanos() as u64 + 2 * max_err;
        let mut groups: HashMap<String, u32> = HashMap::from([(target.spec.host.clone(), tpid)]);
        for (c, w) in clients.iter().zip(&ws) {
            let at = (t_start as i128 + c.offset.offset_ns as i128).max(0) as u64;
            groups.insert(c.spec.host.clone(), c.spawn("workload", workload_argv(&c.spec.faultline, w, &uri, at, oracle)?)?);
            c.set_doing("running the workload");
        }
        // the network faults of each sending host, windows from T on its clock; in place (TUN
        // device, nftables table) before T
        for p in &net_plans {
            let r = remotes.iter().find(|r| r.spec.host == p.host).context("host")?;
            let plan = NetPlan { start_at_ns: (t_start as i128 + r.offset.offset_ns as i128).max(0) as u64, ..p.clone() };
            self.nft_hosts.push(p.host.clone());
            r.spawn("net-faults", vec![r.spec.faultline.clone(), "agent".into(), "--net-faults".into(), serde_json::to_string(&plan)?])?;
        }
        wait_net_ready(&net_plans, &self.gathered)?;
        r.notes.extend(net_paths.iter().map(|p| format!("network: {p}")));
        // probers everywhere, each also sampling its host's server or workload process group
        let interval = format!("{}us", hosts.interval.as_micros());
        for rm in &remotes {
            let mut argv = vec![rm.spec.faultline.clone(), "agent".into(), "--probe".into(), interval.clone()];
            argv.extend(groups.get(&rm.spec.host).map(|g| format!("--probe-group={g}")));
            if rm.role == "target" && hosts.kind == TargetKind::Faultline {
                argv.push(format!("--probe-socket={socket}"));
            }
            rm.spawn("probe", argv)?;
        }
        // the heartbeat watches every agent from here on
        self.heart = Some(heartbeat(remotes.clone(), self.t_ref.clone()));
        let disk = (hosts.kind == TargetKind::Faultline).then(|| RemoteDisk {
            target: target.clone(),
            socket: socket.clone(),
            block_size: setup.disk.disk.block_size as u64,
        });
        self.plan = Some(Plan { target, clients, workloads: ws, disk, target_argv, tpid, t_start, host_yaml, kills, net_plans, give_up });
        Ok(())
    }

    /// Wait for every client's workload to end (its result, its exit, or its agent lost);
    /// why the run must stop instead, if it must.
    fn await_clients(&self, r: &Rep) -> Option<String> {
        let (hosts, p, gathered) = (self.hosts, self.plan.as_ref().expect("built before the drive"), &self.gathered);
        let (target, clients) = (&p.target, &p.clients);
        let limit = Duration::from_secs(3600);
        let waited = Instant::now();
        loop {
            if r.stop.load(Relaxed) {
                return Some("interrupted".to_string());
            }
            if hosts.on_agent_loss == OnAgentLoss::Abort
                && let Some(l) = self.remotes.iter().find_map(|r| r.loss_text())
            {
                return Some(format!("{l} (on_agent_loss: abort)"));
            }
            if target.is_lost() {
                return Some(format!("agent on the target host {} lost: nothing left to measure", target.spec.host));
            }
            let g = gathered.lock().unwrap();
            if let Some(((h, _), (code, sig))) = g.exits.iter().find(|((h, n), _)| h == &target.spec.host && n == "target" && !self.target_down.load(Relaxed)) {
                let why = g.stderr.get(&(h.clone(), "target".into())).map(|v| v.join(" | ")).unwrap_or_default();
                return Some(format!("the target on {h} ended during the run (code {code:?}, signal {sig:?}): {why}"));
            }
            let ended =
                clients.iter().all(|c| c.is_lost() || g.results.contains_key(&c.spec.host) || g.exits.contains_key(&(c.spec.host.clone(), "workload".into())));
            drop(g);
            if ended {
                return None;
            }
            if waited.elapsed() > limit {
                return Some("the clients did not finish within an hour".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The target's host faults end now and print what they did.
    fn end_host_faults(&self, r: &mut Rep) -> Vec<crate::host::HostFaultRecord> {
        let (p, gathered) = (self.plan.as_ref().expect("built before the drive"), &self.gathered);
        let target = &p.target;
        let mut records = Vec::new();
        if !p.host_yaml.is_empty() {
            let _ = target.call(Op::Kill { name: "host-faults".into(), signal: Some(libc::SIGINT) }, CALL_LIMIT);
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(10) && !gathered.lock().unwrap().exits.contains_key(&(target.spec.host.clone(), "host-faults".into())) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let key = (target.spec.host.clone(), "host-faults".to_string());
            let g = gathered.lock().unwrap();
            let text = g.stdout.get(&key).map(|v| v.join("\n")).unwrap_or_default();
            match serde_json::from_str::<Vec<crate::host::HostFaultRecord>>(&text) {
                Ok(r) => records = r,
                Err(e) => r.notes.push(format!(
                    "host faults on {}: no records ({e}): {}",
                    target.spec.host,
                    g.stderr.get(&key).map(|v| v.join(" | ")).unwrap_or_default()
                )),
            }
        }
        records
    }
}

impl Placement for Agents<'_> {
    /// Steps 1-2: agents, in parallel (an ssh handshake each), the threads that gather their
    /// events, then the target, the clients waiting for T, the probers.
    fn build(&mut self, r: &mut Rep) -> Result<()> {
        self.tag = format!("{}-{}", std::process::id(), r.index);
        self.remotes = connect_all(self.hosts)?;
        for rm in &self.remotes {
            r.phase(&format!(
                "agent on {} ({}, via `{}`): clock offset {:+.3} ms ± {:.3} ms",
                rm.spec.host,
                rm.hello_host,
                channel_of(&rm.spec).describe(),
                rm.offset.offset_ns as f64 / 1e6,
                rm.offset.error_ns as f64 / 1e6
            ));
        }
        for rm in &self.remotes {
            let ev = rm.agent.lock().unwrap().take_events();
            let (rm, g, t) = (rm.clone(), self.gathered.clone(), self.t_ref.clone());
            self.gatherers.push(std::thread::spawn(move || gather(rm, ev, g, t)));
        }
        self.start(r)
    }

    /// Step 3 (every agent ready): the disk's rules go in before T, its clock starting at T;
    /// at T host faults start on the target's agent.
    fn arm(&mut self, r: &mut Rep) -> Result<()> {
        let p = self.plan.as_ref().expect("built before arm");
        // every agent reported ready (its spawns answered); a loss before T aborts whatever the policy
        if let Some(rm) = self.remotes.iter().find(|r| r.is_lost()) {
            bail!("agent on host {} was lost before the start", rm.spec.host);
        }
        // the disk's rules go in before T, its clock starting at T on the target's clock: the
        // clients' first I/Os at T meet them (armed at T through the agent, they came late)
        if let Some(d) = &p.disk {
            let at = (p.t_start as i128 + p.target.offset.offset_ns as i128).max(0) as u64;
            self.seq0 = vec![d.reset_epoch_at(at)?];
            arm_static(&[d as &dyn FaultControl], &r.setup.faults)?;
        }
        let t0 = Instant::now() + Duration::from_nanos(p.t_start.saturating_sub(now_ns()));
        *self.t_ref.lock().unwrap() = Some(t0);
        std::thread::sleep(t0.saturating_duration_since(Instant::now()));
        let target = &p.target;
        if !p.host_yaml.is_empty() {
            let mut argv = vec![target.spec.faultline.clone(), "host".into(), "--pid".into(), p.tpid.to_string(), "--json".into()];
            for y in &p.host_yaml {
                argv.extend(["--fault".into(), y.clone()]);
            }
            target.spawn("host-faults", argv)?;
        }
        if !p.kills.is_empty() {
            let kill_done = Arc::new(AtomicBool::new(false));
            let (target, g, down, done, kills, argv, tpid) =
                (target.clone(), self.gathered.clone(), self.target_down.clone(), kill_done.clone(), p.kills.clone(), p.target_argv.clone(), p.tpid);
            // a restarted faultline target gets the setup's disk faults again
            let rearm = p.disk.clone().map(|d| (d, super::schedule::split(&r.setup.faults).0.into_iter().map(|f| f.rule).collect::<Vec<_>>()));
            let t = std::thread::spawn(move || kill_target(&target, &g, &down, &done, &kills, &argv, tpid, t0, rearm.as_ref()));
            self.kills = Some((kill_done, t));
        }
        r.phase(&format!("{} client(s) started together against {}", p.clients.len(), target.spec.address.as_deref().unwrap_or("")));
        Ok(())
    }

    /// Step 4: wait until every client's workload ends or its agent is lost; then the network
    /// and host faults end and say what they did.
    fn drive(&mut self, r: &mut Rep, o: &mut Outcome) -> Result<()> {
        let (hosts, p, gathered) = (self.hosts, self.plan.as_ref().expect("built before the drive"), &self.gathered);
        let (target, clients) = (&p.target, &p.clients);
        // a power cut of the target (the spec allows it with faultline's target): the cutter
        // watches its trigger from T on this clock; each client's own process keeps the
        // durability record of its slice (`--crash-oracle`)
        let (cutter, crash_rec) = match (&r.setup.power_cut, &p.disk) {
            (Some(pc), Some(d)) => {
                let t0 = self.t_ref.lock().unwrap().unwrap_or_else(Instant::now);
                let (c, rec) = crash::start_cutter(pc, d, clients, gathered, p.give_up, t0)?;
                (Some(c), Some(rec))
            }
            (Some(_), None) => bail!("a power cut needs `target: faultline` (the spec refuses it otherwise)"),
            _ => (None, None),
        };
        let abort = self.await_clients(r);
        // the cutter stops with the workload, whatever else failed
        let cut = cutter.map(|c| c.finish());
        r.notes.extend(net_reports(&self.remotes, &p.net_plans, gathered));
        let kill_records = match self.kills.take() {
            Some((done, t)) => {
                done.store(true, Relaxed);
                t.join().unwrap_or_default()
            }
            None => vec![],
        };
        if let Some(why) = abort {
            // the other clients stop now; teardown ends the rest
            for c in clients.iter().filter(|c| !c.is_lost()) {
                let _ = c.call(Op::Kill { name: "workload".into(), signal: Some(libc::SIGTERM) }, CALL_LIMIT);
            }
            bail!("{why}");
        }
        // a client's workload that failed (not lost) fails the run, as in the namespace run
        {
            let g = gathered.lock().unwrap();
            for c in clients.iter().filter(|c| !c.is_lost()) {
                if !g.results.contains_key(&c.spec.host) {
                    let why = g.stderr.get(&(c.spec.host.clone(), "workload".into())).map(|v| v.join(" | ")).unwrap_or_default();
                    bail!("client {}: its workload failed: {why}", c.spec.host);
                }
            }
        }
        if let Some(mut rec) = crash_rec {
            super::crash_fired(&mut rec, cut.transpose()?.flatten());
            if rec.fired {
                let g = gathered.lock().unwrap();
                let failed: Vec<(String, u64)> = clients.iter().map(|c| (c.spec.host.clone(), failed_ios(&g, &c.spec.host))).collect();
                r.notes.push(super::crash::lost_power_note(rec.t_s, &format!(" (host {}, through its agent)", target.spec.host), &failed));
                if let Some(crate::spec::rule::yaml::CutTrigger::AfterOps(n)) = r.setup.power_cut.as_ref().map(|c| c.trigger) {
                    r.notes.push(format!(
                        "after_ops through agents: the clients' ops are counted from their interval lines (every {} s): the cut came at the first line that made their sum {n} or more",
                        hosts.interval.as_secs_f64()
                    ));
                }
            }
            self.crash = Some(rec);
        }
        let mut records = self.end_host_faults(r);
        records.extend(kill_records);
        if records.iter().any(|r| !r.restarted.is_empty()) {
            // a new server: its log starts again
            self.seq0 = vec![0];
            r.notes.push(format!(
                "the target on {} was killed and started again: a fresh disk (its data gone, the fault log from the restart on) with the setup's disk faults armed again on the run's clock",
                target.spec.host
            ));
        }
        o.host_faults = records;
        Ok(())
    }

    /// Step 5, after a power cut of the target: each client's own oracle rereads its slice
    /// (crash::reread); the record gets each client's (`clients`) and their sum (`oracle`), as
    /// the namespace run builds them.
    fn crash(&mut self, r: &mut Rep, o: &mut Outcome) -> Result<()> {
        let Some(mut rec) = self.crash.take().and_then(|rec| super::crash::begin(rec, r, o, " of the target")) else { return Ok(()) };
        let t = Instant::now();
        let p = self.plan.as_ref().expect("built before the crash");
        let disk = p.disk.as_ref().context("a power cut needs faultline's target")?;
        let records = crash::reread(r, disk, &p.clients, &p.workloads, &self.gathered)?;
        super::crash::set_client_oracles(&mut rec, records);
        rec.phase_s = t.elapsed().as_secs_f64();
        o.crash = Some(rec);
        Ok(())
    }

    /// Step 4: the target's fault log, and every line on the controller's clock, from T.
    fn collect(&mut self, r: &mut Rep, o: &mut Outcome) -> Result<()> {
        let (hosts, p, remotes) = (self.hosts, self.plan(), &self.remotes);
        if let Some(d) = &p.disk {
            if self.target_down.load(Relaxed) {
                r.notes.push(format!("the target on {} was killed (host fault `kill`): no disk figures", p.target.spec.host));
            } else {
                (o.faults, o.rules) = collect_faults(&[d as &dyn FaultControl], &self.seq0, &mut r.notes)?;
            }
        }
        let g = self.gathered.lock().unwrap();
        let rel = |rm: &Remote, t_ns: u64| (rm.to_local(t_ns) - p.t_start as i128) as f64 / 1e9;
        let mut series = Vec::new();
        let mut first_result = None;
        let mut start_lag: Option<f64> = None;
        for c in &p.clients {
            let h = &c.spec.host;
            let shift = g.start_ns.get(h).map(|s| rel(c, *s));
            if let Some(s) = shift {
                start_lag = Some(start_lag.map_or(s, |l: f64| l.min(s)));
            }
            let shift = shift.unwrap_or(0.0);
            let s = match g.results.get(h) {
                Some(res) => {
                    first_result = first_result.or(Some(h));
                    client_series(h, res, shift)
                }
                // no result (its agent was lost): what its live lines said, up to the loss
                None => live_series(h, g.live.get(h).map(|v| v.as_slice()).unwrap_or(&[]), shift, hosts.interval),
            };
            series.push(s);
        }
        let mut probes: Vec<Probe> = Vec::new();
        for (host, s) in &g.probes {
            let rm = remotes.iter().find(|r| r.spec.host == *host).context("host")?;
            let t_s = rel(rm, s.t_ns);
            if t_s <= 0.0 {
                continue;
            }
            if let Some(l) = rm.lost.lock().unwrap().as_ref()
                && t_s > l.t_s
            {
                continue;
            }
            probes.push(Probe { t_s, host: host.clone(), sys: s.sys.clone(), ..Default::default() });
        }
        probes.sort_by(|a, b| a.t_s.total_cmp(&b.t_s));
        // a client's ops and errors per probe interval, from its workload's live lines
        let mut last_t: HashMap<String, f64> = HashMap::new();
        for pr in probes.iter_mut() {
            let Some(c) = p.clients.iter().find(|c| c.spec.host == pr.host) else { continue };
            let shift = g.start_ns.get(&pr.host).map_or(0.0, |s| rel(c, *s));
            let from = last_t.insert(pr.host.clone(), pr.t_s).unwrap_or(f64::MIN);
            for l in g.live.get(&pr.host).map(|v| v.as_slice()).unwrap_or(&[]) {
                let t = l.t_s + shift;
                if t > from && t <= pr.t_s {
                    pr.ops += l.ops;
                    pr.errors += l.errors;
                }
            }
        }
        r.notes.extend(remotes.iter().filter_map(|rm| rm.loss_text()));
        let mut networked = NetworkedRun {
            hosts: remotes
                .iter()
                .map(|r| NetworkedHost {
                    name: r.spec.host.clone(),
                    role: r.role.into(),
                    address: r.spec.address.clone().unwrap_or_default(),
                    namespace: String::new(),
                })
                .collect(),
            interval_s: hosts.interval.as_secs_f64(),
            cpu_source: CPU_SOURCE.into(),
            clients: series,
            probes,
            windows: windows(r.setup, hosts),
            window_stats: vec![],
            links: Value::Null,
            start_lag_s: start_lag.unwrap_or(0.0).max(0.0),
            agents: remotes
                .iter()
                .map(|r| NetworkedAgent {
                    host: r.spec.host.clone(),
                    channel: channel_of(&r.spec).describe(),
                    version: r.version.clone(),
                    offset_ms: r.offset.offset_ns as f64 / 1e6,
                    offset_error_ms: r.offset.error_ns as f64 / 1e6,
                    lost: r.lost.lock().unwrap().clone(),
                })
                .collect(),
        };
        networked.analyse();
        o.networked = Some(networked);
        // the repetition's own figures are the first client's (all clients are in `networked`)
        let first = first_result.cloned();
        drop(g);
        o.workload = first.and_then(|h| self.gathered.lock().unwrap().results.remove(&h));
        Ok(())
    }

    /// Step 6: teardown on every host still there; a lost host gets `faultline cleanup`
    /// through a fresh agent (what its lost agent left).
    fn teardown(&mut self, r: &mut Rep) -> Result<()> {
        if let Some((done, t)) = self.heart.take() {
            done.store(true, Relaxed);
            let _ = t.join();
        }
        if let Some((done, t)) = self.kills.take() {
            done.store(true, Relaxed);
            let _ = t.join();
        }
        let table = nft_table(&self.tag);
        for rm in &self.remotes {
            rm.set_doing("done");
            if rm.is_lost() {
                match Agent::connect(&channel_of(&rm.spec), &rm.spec.faultline) {
                    Ok(mut a) => {
                        let res = a.call(Op::Exec { argv: vec![rm.spec.faultline.clone(), "cleanup".into()], stdin: None }, Duration::from_secs(60));
                        if self.nft_hosts.contains(&rm.spec.host) {
                            let _ = a.call(
                                Op::Exec { argv: vec!["nft".into(), "delete".into(), "table".into(), "inet".into(), table.clone()], stdin: None },
                                CALL_LIMIT,
                            );
                        }
                        let _ = a.shutdown();
                        if let Err(e) = res {
                            r.notes.push(format!("host {}: cleanup after its lost agent failed: {e:#}", rm.spec.host));
                        }
                    }
                    Err(e) => {
                        r.notes.push(format!("host {}: cannot reach it to clean up after its lost agent (run `faultline cleanup` there): {e:#}", rm.spec.host))
                    }
                }
                continue;
            }
            if self.nft_hosts.contains(&rm.spec.host) {
                let _ = rm.exec(&["nft", "delete", "table", "inet", &table], None);
            }
        }
        for rm in self.remotes.iter().filter(|r| !r.is_lost()) {
            // ends every spawned command (SIGTERM, then SIGKILL after 2 s) and the agent
            let a = rm.agent.lock().unwrap().call(Op::Shutdown, Duration::from_secs(30));
            if let Err(e) = a {
                r.notes.push(format!("host {}: shutdown: {e:#}", rm.spec.host));
            }
        }
        self.plan = None;
        self.remotes.clear();
        for g in self.gatherers.drain(..) {
            let _ = g.join();
        }
        Ok(())
    }
}

pub const CPU_SOURCE: &str =
    "every host's own /proc: target: its server's process group, clients: their workload's (/proc/PID/stat); machine_*: the host's /proc/stat";

/// A lost client's series from its live lines (ops per interval; no latency).
fn live_series(host: &str, live: &[Interval], shift: f64, interval: Duration) -> ClientSeries {
    let secs = interval.as_secs_f64().max(1e-3);
    let seconds = live.last().map_or(0.0, |l| l.t_s);
    let bytes: u64 = live.iter().map(|l| l.bytes).sum();
    ClientSeries {
        host: host.into(),
        seconds,
        mib_s: if seconds > 0.0 { bytes as f64 / seconds / 1048576.0 } else { 0.0 },
        ops: live.iter().map(|l| l.ops).sum(),
        failed_ios: live.iter().map(|l| l.errors).sum(),
        points: live
            .iter()
            .map(|l| ClientPoint { t_s: l.t_s + shift, iops: l.ops as f64 / secs, mib_s: l.bytes as f64 / secs / 1048576.0, ..Default::default() })
            .collect(),
        ..Default::default()
    }
}
