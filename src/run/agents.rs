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
//! 3. at T (every agent ready) arms the faults: the disk's clock restarts and its rules go in,
//!    host faults start on the target's agent;
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
//! steps 1-2, arm step 3, drive and collect step 4, crash step 5, teardown step 6.

use super::crash::{CutDisk, Cutter, Running, Victims};
use super::hosts::{client_series, windows};
use super::pipeline::{FaultControl, Outcome, Placement, Rep, arm_faults, check_windows_only, collect_faults};
use crate::cluster::jsonl::{Interval, JsonLine};
use crate::cluster::netfaults::{NetPlan, NftChain};
use crate::cluster::proto::{Event, Op, now_ns};
use crate::cluster::{Agent, Channel, ClockOffset, install};
use crate::fault::Rule;
use crate::frontend::control::{Client, Request, Transport};
use crate::report::networked::{AgentLoss, ClientPoint, ClientSeries, NetworkedAgent, NetworkedHost, NetworkedRun, Probe};
use crate::run::probe::HostSample;
use crate::spec::experiment::{Experiment, Setup};
use crate::spec::networked::{AgentChannel, HostAgent, NetworkedHosts, OnAgentLoss, TargetKind};
use crate::spec::workload::config::{ErrorPolicy, Interface, IoEngine, Pattern, SyncMode, Workload};
use crate::workload::WorkloadResult;
use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Time each call to an agent gets (a heartbeat's answer, a spawn, a control request).
const CALL_LIMIT: Duration = Duration::from_secs(10);
/// How often the heartbeat asks each agent the time, and how long it waits for the answer.
const HEARTBEAT: Duration = Duration::from_millis(500);
const HEARTBEAT_LIMIT: Duration = Duration::from_secs(3);
/// From choosing the start instant to it: time to spawn every workload and prober and for
/// the workloads to connect and wait (plus `START_LEAD_PER_HOST` per host: spawns go one by one).
const START_LEAD: Duration = Duration::from_millis(1500);
const START_LEAD_PER_HOST: Duration = Duration::from_millis(20);
/// How long the target gets to listen.
const TARGET_START_LIMIT: Duration = Duration::from_secs(30);
/// How long a client's durability oracle may take to reread what it wrote after power-on.
const ORACLE_LIMIT: Duration = Duration::from_secs(3600);

/// One host reached through its agent.
struct Remote {
    spec: HostAgent,
    role: &'static str,
    agent: Mutex<Agent>,
    hello_host: String,
    version: String,
    agent_pid: u32,
    run_dir: String,
    offset: ClockOffset,
    /// What the host is doing, for the loss report.
    doing: Mutex<String>,
    lost: Mutex<Option<AgentLoss>>,
}

impl Remote {
    fn call(&self, op: Op, limit: Duration) -> Result<Value> {
        self.agent.lock().unwrap().call(op, limit)
    }
    fn spawn(&self, name: &str, argv: Vec<String>) -> Result<u32> {
        let r = self.call(Op::Spawn { name: name.into(), argv }, CALL_LIMIT).with_context(|| format!("host {}: cannot start {name}", self.spec.host))?;
        r["pid"].as_u64().map(|p| p as u32).context("spawn: no pid in the answer")
    }
    fn exec(&self, argv: &[&str], stdin: Option<String>) -> Result<(bool, String)> {
        let r = self.call(Op::Exec { argv: argv.iter().map(|s| s.to_string()).collect(), stdin }, Duration::from_secs(30))?;
        let text = format!("{}{}", r["stdout"].as_str().unwrap_or(""), r["stderr"].as_str().unwrap_or(""));
        Ok((r["code"] == json!(0), text))
    }
    /// The typed client of the disk server at `socket` on this agent's host.
    fn control<'a>(&'a self, socket: &'a str) -> Client<Via<'a>> {
        Client(Via { agent: self, socket })
    }
    fn set_doing(&self, what: &str) {
        *self.doing.lock().unwrap() = what.to_string();
    }
    fn is_lost(&self) -> bool {
        self.lost.lock().unwrap().is_some()
    }
    /// The agent's clock (ns) on the controller's clock.
    fn to_local(&self, t_ns: u64) -> i128 {
        t_ns as i128 - self.offset.offset_ns as i128
    }
}

/// A disk server's control socket on an agent's host, reached through the agent.
struct Via<'a> {
    agent: &'a Remote,
    socket: &'a str,
}

impl Transport for Via<'_> {
    fn exchange(&self, req: &Request) -> Result<Value> {
        self.agent.call(Op::Control { socket: self.socket.into(), request: req.clone() }, Duration::from_secs(30))
    }
}

fn channel_of(a: &HostAgent) -> Channel {
    match &a.channel {
        AgentChannel::Ssh { dest, options } => Channel::Ssh { dest: dest.clone(), options: options.clone() },
        AgentChannel::Exec(p) => Channel::Exec(p.clone()),
    }
}

/// What the event threads gathered, per host.
#[derive(Default)]
struct Gathered {
    /// (host, sample) from the probers.
    probes: Vec<(String, HostSample)>,
    /// client -> its workload's first I/O on the agent's clock, live lines, final result.
    start_ns: HashMap<String, u64>,
    live: HashMap<String, Vec<Interval>>,
    results: HashMap<String, WorkloadResult>,
    /// client -> what its durability oracle found after a power cut (`--crash-oracle`).
    oracles: HashMap<String, crate::verify::crash::OracleReport>,
    /// (host, command) -> ended (exit code, signal).
    exits: HashMap<(String, String), (Option<i32>, Option<i32>)>,
    /// (host, command) -> stdout lines (the target's URI line, host faults' JSON).
    stdout: HashMap<(String, String), Vec<String>>,
    /// (host, command) -> its last stderr lines, for errors.
    stderr: HashMap<(String, String), Vec<String>>,
}

type Shared = Arc<Mutex<Gathered>>;

fn gather(r: Arc<Remote>, events: std::sync::mpsc::Receiver<Event>, g: Shared, t_ref: Arc<Mutex<Option<Instant>>>) {
    let host = r.spec.host.clone();
    for e in events {
        let mut g = g.lock().unwrap();
        match e {
            Event::Output { name, stream, line, .. } if stream == "stderr" => {
                let v = g.stderr.entry((host.clone(), name)).or_default();
                v.push(line);
                if v.len() > 20 {
                    v.remove(0);
                }
            }
            Event::Output { name, line, .. } if name == "probe" => {
                if let Ok(s) = serde_json::from_str::<HostSample>(&line) {
                    g.probes.push((host.clone(), s));
                }
            }
            Event::Output { name, line, .. } if name == "workload" => match serde_json::from_str::<JsonLine>(&line) {
                Ok(JsonLine::Start { start_ns }) => {
                    g.start_ns.insert(host.clone(), start_ns);
                }
                Ok(JsonLine::Interval(i)) => g.live.entry(host.clone()).or_default().push(i),
                Ok(JsonLine::Result { result }) => {
                    g.results.insert(host.clone(), *result);
                }
                Ok(JsonLine::Oracle { oracle }) => {
                    g.oracles.insert(host.clone(), *oracle);
                }
                // kept with its stderr: said if the workload then fails
                Err(e) => g.stderr.entry((host.clone(), name)).or_default().push(format!("unreadable output line ({e}): {line}")),
            },
            Event::Output { name, line, .. } => g.stdout.entry((host.clone(), name)).or_default().push(line),
            Event::Exit { name, code, signal, .. } => {
                g.exits.insert((host.clone(), name), (code, signal));
            }
        }
    }
    // the channel closed: unless the run already let it go, the agent is lost
    lose(&r, "its channel closed", &t_ref);
}

fn lose(r: &Remote, reason: &str, t_ref: &Mutex<Option<Instant>>) {
    let mut l = r.lost.lock().unwrap();
    if l.is_some() {
        return;
    }
    let doing = r.doing.lock().unwrap().clone();
    if doing == "done" {
        return;
    }
    let t_s = t_ref.lock().unwrap().map_or(0.0, |t| Instant::now().saturating_duration_since(t).as_secs_f64());
    *l = Some(AgentLoss { t_s, doing, reason: reason.to_string() });
}

/// `faultline workload` flags for a client's block workload (`Experiment::client_workload`:
/// with a power cut its slice of the disk as `--base`/`--span` and its content seed) against
/// `uri`; `oracle`: the power cut's model, for a client whose durability record the cut's
/// oracle reads (`--crash-oracle`).
fn workload_argv(fl: &str, w: &Workload, uri: &str, start_ns: u64, oracle: Option<crate::spec::disk::SurvivalModel>) -> Result<Vec<String>> {
    if w.personality.is_some() {
        bail!("clients through agents run block workloads; a personality cannot be sent");
    }
    if w.profile != crate::content::profile::Profile::none() {
        bail!("clients through agents write unique content (no duplicate `profile`)");
    }
    let us = |d: Duration| format!("{}us", d.as_micros());
    let mut a: Vec<String> = vec![fl.into(), "workload".into(), "--nbd".into(), uri.into(), "--jsonl".into(), format!("--start-at-ns={start_ns}")];
    a.push(format!(
        "--pattern={}",
        match w.pattern {
            Pattern::Sequential => "sequential".to_string(),
            Pattern::Uniform => "uniform".into(),
            Pattern::Hotspot => "hotspot".into(),
            Pattern::Zipf(t) => format!("zipf:{t}"),
        }
    ));
    a.push(format!("--write-pct={}", w.write_pct));
    a.push(format!("--bs={}", w.block_size));
    a.push(format!("--engine={}", if w.engine == IoEngine::IoUring { "io_uring" } else { "psync" }));
    a.push(format!("--iodepth={}", w.iodepth));
    a.push(format!("--threads={}", w.threads));
    a.extend(w.size.map(|s| format!("--size={s}")));
    a.extend(w.ops.map(|s| format!("--ops={s}")));
    a.extend(w.duration.map(|d| format!("--duration={}", us(d))));
    a.extend(w.rate_iops.map(|s| format!("--rate-iops={s}")));
    a.extend(w.span.map(|s| format!("--span={s}")));
    // the slice's first byte on the export (a power cut's client); 0 is the default
    a.extend((w.base > 0).then(|| format!("--base={}", w.base)));
    a.push(format!(
        "--on-error={}",
        match w.on_error {
            ErrorPolicy::Stop => "stop".to_string(),
            ErrorPolicy::Continue => "continue".into(),
            ErrorPolicy::Retry(n) => format!("retry:{n}"),
        }
    ));
    a.push(format!("--interval={}", us(w.interval)));
    a.push(format!("--seed={}", w.seed));
    // over NBD `fsync:N` is a FLUSH every N writes and `dsync` a FUA on each write
    a.push(format!(
        "--sync={}",
        match w.sync {
            SyncMode::None => "none".to_string(),
            SyncMode::Direct => "direct".into(),
            SyncMode::Dsync => "dsync".into(),
            SyncMode::Fsync(n) => format!("fsync:{n}"),
        }
    ));
    a.extend(oracle.map(|m| format!("--crash-oracle={m}")));
    Ok(a)
}

/// A host fault as the inline YAML `faultline host --fault` takes (None: a `kill`, which the
/// controller does through the target's agent, `kill_target`).
fn host_fault_yaml(h: &crate::spec::host::HostFault) -> Result<Option<String>> {
    use crate::spec::host::{CpuMethod, HostAction};
    let what = match &h.action {
        HostAction::Cpu { share, method } => {
            format!("type: cpu, share: {}%, method: {}", share * 100.0, if *method == CpuMethod::Quota { "quota" } else { "spin" })
        }
        HostAction::Memory { limit, hold } => {
            let mut s = "type: memory".to_string();
            if let Some(l) = limit {
                s += &format!(", limit: {l}B");
            }
            if let Some(x) = hold {
                s += &format!(", hold: {x}B");
            }
            s
        }
        HostAction::Freeze => "type: freeze".into(),
        HostAction::Kill => return Ok(None),
    };
    let ms = |d: Duration| format!("{}ms", d.as_millis());
    let window = match h.to {
        Some(to) => format!("{{from: {}, to: {}}}", ms(h.from), ms(to)),
        None => format!("{{from: {}}}", ms(h.from)),
    };
    Ok(Some(format!("{{{what}, window: {window}}}")))
}

/// Whether a network fault needs the user-space engine on the sending host: all but
/// partition and reset, which nftables does in the kernel. Loss too: a drop in the sender's
/// output hook hits a whole segmentation burst and is reported to the socket, which resends
/// at once (docs/net.md, "Loss in the kernel"); the engine drops single wire packets.
fn needs_engine(f: &crate::spec::net::NetFault) -> bool {
    f.delay.is_some() || f.jitter.is_some() || f.rate.is_some() || f.duplicate.is_some() || f.reorder.is_some() || f.loss.is_some()
}

/// Plan the network faults on the sending hosts (one `faultline agent --net-faults` each),
/// or say why a host cannot apply one (before anything runs). Also says per host which path
/// each fault takes.
fn plan_net_faults(setup: &Setup, hosts: &NetworkedHosts, remotes: &[Arc<Remote>], table: &str) -> Result<(Vec<NetPlan>, Vec<String>)> {
    let addr = |h: &str| -> Result<String> {
        remotes.iter().find(|r| r.spec.host == h).and_then(|r| r.spec.address.clone()).with_context(|| format!("host `{h}` has no `address` in `agents:`"))
    };
    let names = hosts.names();
    let mut plans: Vec<NetPlan> = Vec::new();
    let mut paths: Vec<String> = Vec::new();
    for (i, n) in setup.net_faults.iter().enumerate() {
        let label = format!("net fault #{} ({})", i + 1, n.describe());
        let f = &n.rule.fault;
        let pairs: Vec<(String, String)> = {
            let froms: Vec<String> = n.rule.from.clone().map_or_else(|| names.clone(), |f| vec![f]);
            let tos: Vec<String> = n.rule.to.clone().map_or_else(|| names.clone(), |t| vec![t]);
            let mut p: Vec<(String, String)> = froms.iter().flat_map(|a| tos.iter().filter(move |b| *b != a).map(move |b| (a.clone(), b.clone()))).collect();
            if n.rule.both {
                let rev: Vec<(String, String)> = p.iter().map(|(a, b)| (b.clone(), a.clone())).collect();
                p.extend(rev);
            }
            p.sort();
            p.dedup();
            p
        };
        let window = n.rule.window;
        let (from, to) = (window.map_or(Duration::ZERO, |w| w.from), window.and_then(|w| w.to));
        let engine = needs_engine(f);
        for (a, b) in &pairs {
            let k = match plans.iter().position(|p| p.host == *a) {
                Some(k) => k,
                None => {
                    plans.push(NetPlan { host: a.clone(), address: addr(a)?, table: table.to_string(), ..Default::default() });
                    plans.len() - 1
                }
            };
            let ip = addr(b)?;
            let p = &mut plans[k];
            if engine {
                if ip.parse::<std::net::Ipv4Addr>().is_err() || p.address.parse::<std::net::Ipv4Addr>().is_err() {
                    bail!("{label}: host {a} -> {b}: the user-space path (delay, jitter, rate, duplicate, reorder, loss) takes IPv4 addresses only");
                }
                if !p.peers.iter().any(|x| x.0 == *b) {
                    p.peers.push((b.clone(), ip.clone()));
                }
                p.engine.push(crate::spec::net::NetRule {
                    from: Some(a.clone()),
                    to: Some(b.clone()),
                    both: false,
                    window: Some(crate::spec::rule::Window { from, to }),
                    seed: n.rule.seed,
                    fault: f.clone(),
                });
                paths.push(format!("{label}: {a} -> {b}: user space (TUN + raw socket on {a})"));
                continue;
            }
            let mut stmt: Vec<String> = Vec::new();
            if f.partition {
                stmt.push("drop".into());
            }
            if f.reset {
                stmt.push("meta l4proto tcp reject with tcp reset".into());
            }
            let fam = if ip.contains(':') { "ip6" } else { "ip" };
            let chain = format!("f{i}");
            let rules: Vec<String> = stmt.iter().map(|s| format!("{fam} daddr {ip} {s}")).collect();
            match p.chains.iter_mut().find(|c| c.name == chain) {
                Some(c) => c.rules.extend(rules),
                None => p.chains.push(NftChain { name: chain, rules, from, to }),
            }
            paths.push(format!("{label}: {a} -> {b}: nftables on {a}"));
        }
    }
    // every host checks it has what its path needs
    for p in &plans {
        let r = remotes.iter().find(|r| r.spec.host == p.host).context("host")?;
        if !p.chains.is_empty() {
            let (ok, text) = r.exec(&["nft", "list", "tables"], None).unwrap_or((false, "cannot run nft".into()));
            if !ok {
                bail!("net faults need nftables (`nft`) on host `{}`: {}", p.host, text.trim());
            }
        }
        if !p.engine.is_empty() {
            let (ok, text) =
                r.exec(&["sh", "-c", "test -c /dev/net/tun || { echo no /dev/net/tun; exit 1; }; ip -V"], None).unwrap_or((false, "cannot run sh".into()));
            if !ok {
                bail!(
                    "host `{}`: delay, jitter, rate, duplicate, reorder and loss need a TUN device (/dev/net/tun) and iproute2 there: {}",
                    p.host,
                    text.trim()
                );
            }
        }
    }
    Ok((plans, paths))
}

fn nft_table(tag: &str) -> String {
    format!("faultline_{}", tag.replace('-', "_"))
}

fn connect_all(hosts: &NetworkedHosts) -> Result<Vec<Arc<Remote>>> {
    let connected: Vec<Result<Remote>> = std::thread::scope(|sc| {
        let hs: Vec<_> = hosts
            .agents
            .iter()
            .map(|a| {
                sc.spawn(move || -> Result<Remote> {
                    let ch = channel_of(a);
                    if a.install {
                        install(&ch, &a.faultline).with_context(|| format!("host {}", a.host))?;
                    }
                    let mut ag = Agent::connect(&ch, &a.faultline).with_context(|| format!("host {}", a.host))?;
                    let offset = ag.clock_offset(16).with_context(|| format!("host {}: clock offset", a.host))?;
                    let role = if a.host == hosts.target { "target" } else { "client" };
                    Ok(Remote {
                        spec: a.clone(),
                        role,
                        hello_host: ag.hello.host.clone(),
                        version: ag.hello.version.clone(),
                        agent_pid: ag.hello.pid,
                        run_dir: ag.hello.run_dir.clone(),
                        agent: Mutex::new(ag),
                        offset,
                        doing: Mutex::new("starting".into()),
                        lost: Mutex::new(None),
                    })
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("connecting panicked")))).collect()
    });
    let mut remotes = Vec::new();
    for c in connected {
        remotes.push(Arc::new(c?));
    }
    Ok(remotes)
}

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

/// The target's disk server reached through its agent (a faultline target).
struct RemoteDisk {
    target: Arc<Remote>,
    socket: String,
    block_size: u64,
}

impl FaultControl for RemoteDisk {
    fn block_size(&self) -> u64 {
        self.block_size
    }
    fn reset_epoch(&self) -> Result<u64> {
        self.target.control(&self.socket).reset_epoch()
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
    /// Power on after a cut: the disk serves again.
    fn power_on(&self) -> Result<()> {
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
        for p in &net_plans {
            let key = (p.host.clone(), "net-faults".to_string());
            let t = Instant::now();
            loop {
                {
                    let g = self.gathered.lock().unwrap();
                    if g.stdout.get(&key).is_some_and(|v| v.iter().any(|l| l == "ready")) {
                        break;
                    }
                    if g.exits.contains_key(&key) || t.elapsed() > CALL_LIMIT {
                        let why = g.stderr.get(&key).map(|v| v.join(" | ")).unwrap_or_default();
                        bail!("host {}: cannot apply its network faults: {why}", p.host);
                    }
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
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
        let done = Arc::new(AtomicBool::new(false));
        let heart = {
            let (rs, done, t_ref) = (remotes.clone(), done.clone(), self.t_ref.clone());
            std::thread::spawn(move || {
                while !done.load(Relaxed) {
                    for r in &rs {
                        if r.is_lost() || done.load(Relaxed) {
                            continue;
                        }
                        let alive = r.agent.lock().unwrap().alive();
                        if !alive {
                            lose(r, "its channel closed", &t_ref);
                        } else if let Err(e) = r.call(Op::Time, HEARTBEAT_LIMIT) {
                            lose(r, &format!("it stopped answering ({e:#})"), &t_ref);
                            // a hung agent is let go: its channel ends, and with it what it ran
                            r.agent.lock().unwrap().kill_channel();
                        }
                    }
                    std::thread::sleep(HEARTBEAT);
                }
            })
        };
        self.heart = Some((done, heart));
        let disk = (hosts.kind == TargetKind::Faultline).then(|| RemoteDisk {
            target: target.clone(),
            socket: socket.clone(),
            block_size: setup.disk.disk.block_size as u64,
        });
        self.plan = Some(Plan { target, clients, workloads: ws, disk, target_argv, tpid, t_start, host_yaml, kills, net_plans, give_up });
        Ok(())
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

    /// Step 3, at T (every agent ready): the disk's clock restarts and its rules go in, host
    /// faults start on the target's agent.
    fn arm(&mut self, r: &mut Rep) -> Result<()> {
        let p = self.plan.as_ref().expect("built before arm");
        // every agent reported ready (its spawns answered); a loss before T aborts whatever the policy
        if let Some(rm) = self.remotes.iter().find(|r| r.is_lost()) {
            bail!("agent on host {} was lost before the start", rm.spec.host);
        }
        let t0 = Instant::now() + Duration::from_nanos(p.t_start.saturating_sub(now_ns()));
        *self.t_ref.lock().unwrap() = Some(t0);
        std::thread::sleep(t0.saturating_duration_since(Instant::now()));
        if let Some(d) = &p.disk {
            self.seq0 = arm_faults(&[d as &dyn FaultControl], &r.setup.faults)?.0;
        }
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
            let rearm = p.disk.as_ref().map(|d| {
                let disk = RemoteDisk { target: d.target.clone(), socket: d.socket.clone(), block_size: d.block_size };
                (disk, super::schedule::split(&r.setup.faults).0.into_iter().map(|f| f.rule).collect::<Vec<_>>())
            });
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
        let mut crash_rec = None;
        let cutter = match (&r.setup.power_cut, &p.disk) {
            (Some(pc), Some(d)) => {
                let seed = pc.seed.unwrap_or_else(rand::random);
                crash_rec = Some(super::crash_record(pc, seed));
                let disk: Arc<dyn CutDisk> = Arc::new(RemoteDisk { target: d.target.clone(), socket: d.socket.clone(), block_size: d.block_size });
                // the client hosts keep their power: each runs on into the dead target until one
                // of its I/Os fails, at most as long as its NBD policy takes to give up on one
                // request, and is stopped then
                let victims = Victims {
                    progress: clients.iter().map(|c| Arc::new(RemoteWorkload { client: c.clone(), gathered: gathered.clone() }) as Arc<dyn Running>).collect(),
                    until_error: Some(p.give_up),
                    ..Default::default()
                };
                let t0 = self.t_ref.lock().unwrap().unwrap_or_else(Instant::now);
                Some(Cutter::start_from(pc, seed, disk, victims, t0)?)
            }
            (Some(_), None) => bail!("a power cut needs `target: faultline` (the spec refuses it otherwise)"),
            _ => None,
        };
        let limit = Duration::from_secs(3600);
        let waited = Instant::now();
        let abort = loop {
            if r.stop.load(Relaxed) {
                break Some("interrupted".to_string());
            }
            if hosts.on_agent_loss == OnAgentLoss::Abort
                && let Some(rm) = self.remotes.iter().find(|r| r.is_lost())
            {
                let l = rm.lost.lock().unwrap().clone().unwrap_or_default();
                break Some(format!("agent on host {} lost at {:+.1} s while {}: {} (on_agent_loss: abort)", rm.spec.host, l.t_s, l.doing, l.reason));
            }
            if target.is_lost() {
                break Some(format!("agent on the target host {} lost: nothing left to measure", target.spec.host));
            }
            let g = gathered.lock().unwrap();
            if let Some(((h, _), (code, sig))) = g.exits.iter().find(|((h, n), _)| h == &target.spec.host && n == "target" && !self.target_down.load(Relaxed)) {
                let why = g.stderr.get(&(h.clone(), "target".into())).map(|v| v.join(" | ")).unwrap_or_default();
                break Some(format!("the target on {h} ended during the run (code {code:?}, signal {sig:?}): {why}"));
            }
            let ended =
                clients.iter().all(|c| c.is_lost() || g.results.contains_key(&c.spec.host) || g.exits.contains_key(&(c.spec.host.clone(), "workload".into())));
            drop(g);
            if ended {
                break None;
            }
            if waited.elapsed() > limit {
                break Some("the clients did not finish within an hour".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        };
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
        // host faults end now and print what they did
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

    /// After a power cut of the target: its disk powers on through the target's agent (every
    /// client stopped at the cut), then each client's workload, waiting since its result line,
    /// is told to reread (SIGUSR2 through its agent): its durability oracle rereads every block
    /// it wrote in its slice over a fresh NBD connection from its host and prints what it
    /// found. The record gets each client's (`clients`) and their sum (`oracle`), as the
    /// namespace run builds them. A lost agent now fails the repetition, naming its host.
    fn crash(&mut self, r: &mut Rep, o: &mut Outcome) -> Result<()> {
        let Some(mut rec) = self.crash.take().and_then(|rec| super::crash::begin(rec, r, o, " of the target")) else { return Ok(()) };
        let t = Instant::now();
        let p = self.plan.as_ref().expect("built before the crash");
        let disk = p.disk.as_ref().context("a power cut needs faultline's target")?;
        let (target, clients) = (&p.target, &p.clients);
        fn lost(rm: &Remote) -> Option<String> {
            rm.lost.lock().unwrap().as_ref().map(|l| format!("agent on host {} lost at {:+.1} s while {}: {}", rm.spec.host, l.t_s, l.doing, l.reason))
        }
        if let Some(l) = lost(target) {
            bail!("{l}: the target's disk cannot be powered on (crash phase)");
        }
        target.set_doing("powering the target's disk on after the power cut");
        disk.power_on().with_context(|| format!("host {}: cannot power the target's disk on through its agent", target.spec.host))?;
        target.set_doing("serving the disk");
        if let Some(l) = clients.iter().find_map(|c| lost(c)) {
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
        let mut reports: Vec<Option<crate::verify::crash::OracleReport>> = vec![None; clients.len()];
        while reports.iter().any(|x| x.is_none()) {
            if r.stop.load(Relaxed) {
                bail!("interrupted");
            }
            for rm in std::iter::once(target).chain(clients) {
                if let Some(l) = lost(rm) {
                    bail!("{l}: no durability oracle (crash phase)");
                }
            }
            {
                let mut g = self.gathered.lock().unwrap();
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
        let g = self.gathered.lock().unwrap();
        let records = clients
            .iter()
            .zip(&p.workloads)
            .zip(reports)
            .map(|((c, w), x)| super::crash::client_oracle(&c.spec.host, w, failed_ios(&g, &c.spec.host), x.expect("every report came")))
            .collect();
        drop(g);
        super::crash::set_client_oracles(&mut rec, records);
        rec.phase_s = t.elapsed().as_secs_f64();
        o.crash = Some(rec);
        Ok(())
    }

    fn verify(&mut self, _: &mut Rep, _: &mut Outcome) -> Result<()> {
        // the clients' maps stay on their hosts: a networked run verifies nothing (after a
        // power cut each client's own oracle read them back: crash)
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
        for rm in remotes {
            if let Some(l) = rm.lost.lock().unwrap().as_ref() {
                r.notes.push(format!("agent on host {} lost at {:+.1} s while {}: {}", rm.spec.host, l.t_s, l.doing, l.reason));
            }
        }
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
fn kill_target(
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

/// End each host's network faults (it removes them) and say what they did.
fn net_reports(remotes: &[Arc<Remote>], plans: &[NetPlan], g: &Shared) -> Vec<String> {
    let mut notes = Vec::new();
    for p in plans {
        let Some(r) = remotes.iter().find(|r| r.spec.host == p.host && !r.is_lost()) else { continue };
        let key = (p.host.clone(), "net-faults".to_string());
        let _ = r.call(Op::Kill { name: "net-faults".into(), signal: Some(libc::SIGINT) }, CALL_LIMIT);
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(10) && !g.lock().unwrap().exits.contains_key(&key) {
            std::thread::sleep(Duration::from_millis(10));
        }
        let g = g.lock().unwrap();
        let Some(v) = g.stdout.get(&key).and_then(|v| v.iter().rev().find_map(|l| serde_json::from_str::<Value>(l).ok())) else {
            notes.push(format!("host {}: network faults: no report: {}", p.host, g.stderr.get(&key).map(|v| v.join(" | ")).unwrap_or_default()));
            continue;
        };
        for e in v["nft_errors"].as_array().into_iter().flatten() {
            notes.push(format!("host {}: {}", p.host, e.as_str().unwrap_or_default()));
        }
        for l in v["engine"]["show"]["links"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|l| l["from"] == json!(p.host) && !l["rules"].as_array().is_none_or(|r| r.is_empty()))
        {
            notes.push(format!(
                "network: user space on {} -> {} (via {}): packets {}, delayed {}, dropped {}, duplicated {}, reordered {}, overdue {}, late route switches {}, lateness p99 {} us",
                l["from"].as_str().unwrap_or_default(),
                l["to"].as_str().unwrap_or_default(),
                v["engine"]["paths"].as_array().into_iter().flatten().find(|x| x["peer"] == l["to"]).and_then(|x| x["dev"].as_str()).unwrap_or("?"),
                l["packets"],
                l["delayed"],
                l["dropped"],
                l["duplicated"],
                l["reordered"],
                l["overdue"],
                l["late_switches"],
                l["lateness_us"]["p99"],
            ));
        }
    }
    notes
}

/// Wait until the target listens: its URI line (faultline), or a TCP connect from the first
/// client host (a command).
fn wait_target(target: &Remote, client: &Remote, hosts: &NetworkedHosts, addr: &str, g: &Shared) -> Result<()> {
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

/// The I/Os that failed for a client: its result's errors (0 without a result).
fn failed_ios(g: &Gathered, host: &str) -> u64 {
    g.results.get(host).map_or(0, |x| x.errors.values().sum())
}

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

#[cfg(test)]
mod tests {
    use super::*;

    /// With a power cut each remote client's command line carries its slice (`--base`,
    /// `--span`), its content seed and the cut's model; client 0's slice starts at byte 0 and
    /// needs no `--base`.
    #[test]
    fn each_client_of_a_cut_gets_its_slice_and_seed_on_its_command_line() {
        let text = "name: t\nhosts: {clients: [a, b], agents: {target: {ssh: root@s, address: 10.0.0.5}, a: {ssh: root@a}, b: {ssh: root@b}}}\ndisk: {size: 64MiB, write_cache: volatile}\nworkload: {block_size: 4KiB, duration: 5s, content: {seed: 4}}\nfaults:\n  - {type: power-cut, model: torn, when: {after_ops: 100}}\n";
        let e = crate::spec::experiment::parse_experiment(text, "e.yaml").unwrap();
        let uri = "nbd://10.0.0.5:10809/";
        let argv = |i: usize| {
            let w = e.client_workload(&e.setups[0], uri, i).unwrap();
            workload_argv("faultline", &w, uri, 7, Some(crate::spec::disk::SurvivalModel::Torn)).unwrap()
        };
        let has = |a: &[String], f: &str| a.iter().any(|x| x == f);
        let (a, b) = (argv(0), argv(1));
        assert!(!a.iter().any(|x| x.starts_with("--base")) && has(&a, "--span=33554432") && has(&a, "--seed=4"), "{a:?}");
        assert!(has(&b, "--base=33554432") && has(&b, "--span=33554432") && has(&b, "--seed=5"), "{b:?}");
        assert!(has(&b, "--crash-oracle=torn") && has(&b, "--start-at-ns=7"), "{b:?}");
    }
}
