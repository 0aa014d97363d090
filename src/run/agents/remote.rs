//! One host reached through its agent: its calls, the thread that gathers its events (every
//! command's output lines and exits), and its loss.

use super::CALL_LIMIT;
use crate::cluster::jsonl::{Interval, JsonLine};
use crate::cluster::proto::{Event, Op};
use crate::cluster::{Agent, Channel, ClockOffset, install};
use crate::frontend::control::{Client, Request, Transport};
use crate::report::networked::AgentLoss;
use crate::run::probe::HostSample;
use crate::spec::networked::{AgentChannel, HostAgent, NetworkedHosts};
use crate::workload::WorkloadResult;
use anyhow::{Context, Result};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One host reached through its agent.
pub(super) struct Remote {
    pub(super) spec: HostAgent,
    pub(super) role: &'static str,
    pub(super) agent: Mutex<Agent>,
    pub(super) hello_host: String,
    pub(super) version: String,
    pub(super) agent_pid: u32,
    pub(super) run_dir: String,
    pub(super) offset: ClockOffset,
    /// What the host is doing, for the loss report.
    pub(super) doing: Mutex<String>,
    pub(super) lost: Mutex<Option<AgentLoss>>,
}

impl Remote {
    pub(super) fn call(&self, op: Op, limit: Duration) -> Result<Value> {
        self.agent.lock().unwrap().call(op, limit)
    }
    pub(super) fn spawn(&self, name: &str, argv: Vec<String>) -> Result<u32> {
        let r = self.call(Op::Spawn { name: name.into(), argv }, CALL_LIMIT).with_context(|| format!("host {}: cannot start {name}", self.spec.host))?;
        r["pid"].as_u64().map(|p| p as u32).context("spawn: no pid in the answer")
    }
    pub(super) fn exec(&self, argv: &[&str], stdin: Option<String>) -> Result<(bool, String)> {
        let r = self.call(Op::Exec { argv: argv.iter().map(|s| s.to_string()).collect(), stdin }, Duration::from_secs(30))?;
        let text = format!("{}{}", r["stdout"].as_str().unwrap_or(""), r["stderr"].as_str().unwrap_or(""));
        Ok((r["code"] == json!(0), text))
    }
    /// The typed client of the disk server at `socket` on this agent's host.
    pub(super) fn control<'a>(&'a self, socket: &'a str) -> Client<Via<'a>> {
        Client(Via { agent: self, socket })
    }
    pub(super) fn set_doing(&self, what: &str) {
        *self.doing.lock().unwrap() = what.to_string();
    }
    pub(super) fn is_lost(&self) -> bool {
        self.lost.lock().unwrap().is_some()
    }
    /// The agent's clock (ns) on the controller's clock.
    pub(super) fn to_local(&self, t_ns: u64) -> i128 {
        t_ns as i128 - self.offset.offset_ns as i128
    }
    /// "agent on host H lost at T s while DOING: REASON", once it is lost.
    pub(super) fn loss_text(&self) -> Option<String> {
        self.lost.lock().unwrap().as_ref().map(|l| format!("agent on host {} lost at {:+.1} s while {}: {}", self.spec.host, l.t_s, l.doing, l.reason))
    }
}

/// A disk server's control socket on an agent's host, reached through the agent.
pub(super) struct Via<'a> {
    agent: &'a Remote,
    socket: &'a str,
}

impl Transport for Via<'_> {
    fn exchange(&self, req: &Request) -> Result<Value> {
        self.agent.call(Op::Control { socket: self.socket.into(), request: req.clone() }, Duration::from_secs(30))
    }
}

pub(super) fn channel_of(a: &HostAgent) -> Channel {
    match &a.channel {
        AgentChannel::Ssh { dest, options } => Channel::Ssh { dest: dest.clone(), options: options.clone() },
        AgentChannel::Exec(p) => Channel::Exec(p.clone()),
    }
}

/// What the event threads gathered, per host.
#[derive(Default)]
pub(super) struct Gathered {
    /// (host, sample) from the probers.
    pub(super) probes: Vec<(String, HostSample)>,
    /// client -> its workload's first I/O on the agent's clock, live lines, final result.
    pub(super) start_ns: HashMap<String, u64>,
    pub(super) live: HashMap<String, Vec<Interval>>,
    pub(super) results: HashMap<String, WorkloadResult>,
    /// client -> what its durability oracle found after a power cut (`--crash-oracle`).
    pub(super) oracles: HashMap<String, crate::verify::crash::OracleReport>,
    /// (host, command) -> ended (exit code, signal).
    pub(super) exits: HashMap<(String, String), (Option<i32>, Option<i32>)>,
    /// (host, command) -> stdout lines (the target's URI line, host faults' JSON).
    pub(super) stdout: HashMap<(String, String), Vec<String>>,
    /// (host, command) -> its last stderr lines, for errors.
    pub(super) stderr: HashMap<(String, String), Vec<String>>,
}

pub(super) type Shared = Arc<Mutex<Gathered>>;

pub(super) fn gather(r: Arc<Remote>, events: std::sync::mpsc::Receiver<Event>, g: Shared, t_ref: Arc<Mutex<Option<Instant>>>) {
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

pub(super) fn lose(r: &Remote, reason: &str, t_ref: &Mutex<Option<Instant>>) {
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

pub(super) fn connect_all(hosts: &NetworkedHosts) -> Result<Vec<Arc<Remote>>> {
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

/// The I/Os that failed for a client: its result's errors (0 without a result).
pub(super) fn failed_ios(g: &Gathered, host: &str) -> u64 {
    g.results.get(host).map_or(0, |x| x.errors.values().sum())
}

/// How often the heartbeat asks each agent the time, and how long it waits for the answer.
const HEARTBEAT: Duration = Duration::from_millis(500);
const HEARTBEAT_LIMIT: Duration = Duration::from_secs(3);

/// The heartbeat: asks every agent the time every `HEARTBEAT` until its flag is set; an agent
/// whose channel closed or that does not answer within `HEARTBEAT_LIMIT` is lost (a hung one
/// is let go: its channel ends, and with it what it ran).
pub(super) fn heartbeat(remotes: Vec<Arc<Remote>>, t_ref: Arc<Mutex<Option<Instant>>>) -> (Arc<AtomicBool>, std::thread::JoinHandle<()>) {
    let done = Arc::new(AtomicBool::new(false));
    let d2 = done.clone();
    let t = std::thread::spawn(move || {
        while !d2.load(Relaxed) {
            for r in &remotes {
                if r.is_lost() || d2.load(Relaxed) {
                    continue;
                }
                let alive = r.agent.lock().unwrap().alive();
                if !alive {
                    lose(r, "its channel closed", &t_ref);
                } else if let Err(e) = r.call(Op::Time, HEARTBEAT_LIMIT) {
                    lose(r, &format!("it stopped answering ({e:#})"), &t_ref);
                    r.agent.lock().unwrap().kill_channel();
                }
            }
            std::thread::sleep(HEARTBEAT);
        }
    });
    (done, t)
}
