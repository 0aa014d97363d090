//! The control socket: JSON lines over a Unix socket, one request per line, one reply per line
//! (docs/control.md is the reference). The types here are the protocol: the daemon reads a
//! `Request` and answers its typed reply; the runner, the CLI and agents send `Request`s
//! through a `Client` and get the typed reply back. Every reply line is
//! `{"ok":true,"result":<reply>}` or `{"ok":false,"error":"<message>"}`.

use crate::disk::Disk;
use crate::disk::cache::{CacheMode, CacheStats, CutReport, SurvivalModel};
use crate::disk::latency::LatencyStats;
use crate::disk::service::OpService;
use crate::fault::Rule;
use crate::fault::engine::{EngineStats, RuleStatus};
use crate::fault::log::LogEntry;
use crate::nbd::client::CounterSnapshot;
use crate::nbd::{ServerCounters, ServerSnapshot};
use crate::spec::rule::RuleId;
use anyhow::{Context, Result, bail};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// One request, as `{"cmd":"<name>", ...}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Arm the rules of a YAML rules document (docs/rules.md). Reply: `Armed`.
    Add { rules: String },
    /// Arm rules as `fault::Rule` serializes them (as `list` prints them). Reply: `Armed`.
    Arm { rules: Vec<Rule> },
    /// Restart the fault clock and request counters (a run's workload starts); with `at_ns`
    /// the clock starts at that CLOCK_REALTIME instant of the server's host (a start agreed
    /// ahead: the rules can go in before it) and reads 0 until then. Reply: `Epoch`.
    ResetEpoch {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        at_ns: Option<u64>,
    },
    /// What the server was started with. Reply: `ServerInfo`.
    Info,
    /// The armed rules with their counters. Reply: `[RuleStatus]`.
    List,
    /// Disarm rules by id. Reply: `Removed`.
    Remove { ids: Vec<RuleId> },
    /// Disarm every rule. Reply: `Removed`.
    Clear,
    /// Stop matching rules, keeping them (`Engine::pause`). Reply: `Paused`.
    Pause,
    /// Match the paused rules again. Reply: `Resumed`.
    Resume,
    /// Fault log entries from sequence number `since`, at most `max`. Reply: `[LogEntry]`.
    Log {
        #[serde(default)]
        since: u64,
        #[serde(default = "default_max")]
        max: usize,
    },
    /// The disk's counters. Reply: `Stats`.
    Stats,
    /// Cut the power (docs/crash.md): the volatile cache applies `model` to the unflushed
    /// writes (random choices from `seed`, drawn when absent), then every request fails until
    /// `power_on`. Reply: `CutReport`.
    PowerCut {
        model: SurvivalModel,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        seed: Option<u64>,
    },
    /// Serve requests again after a cut. Reply: `PoweredOn`.
    PowerOn,
    /// Record every write, discard and flush to a dm-log-writes log at `path` from now on;
    /// without `path`, stop recording (docs/crash.md). Reply: `Recording`.
    Record {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        path: Option<PathBuf>,
    },
    /// Add a MARK entry named `name` to the recording. Reply: `Marked` (entry null when
    /// not recording).
    Mark { name: String },
}

/// Reply to `mark`: the MARK entry's index in the log, none when nothing is recording.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Marked {
    pub entry: Option<u64>,
}

/// Reply to `power_on`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PoweredOn {
    pub powered: bool,
}

/// Reply to `add` and `arm`: the new rules' ids, in the order given.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Armed {
    pub ids: Vec<RuleId>,
}

/// Reply to `reset_epoch`: the fault log's sequence number when the new epoch began.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Epoch {
    pub log_total: u64,
}

/// Reply to `remove` and `clear`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Removed {
    pub removed: usize,
}

/// Reply to `pause`: how many rules were set aside.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Paused {
    pub paused: usize,
}

/// Reply to `resume`: how many rules match again.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Resumed {
    pub resumed: usize,
}

/// Reply to `info`: where and how the disk is served.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ServerInfo {
    /// The loop device; none when served over NBD only.
    pub device: Option<PathBuf>,
    /// How requests reach the server ("io_uring", or "/dev/fuse" and why).
    pub transport: Option<String>,
    /// Why the idle CPUs' wake-up latency could not be set, if it could not.
    pub cpu_latency_unavailable: Option<String>,
    /// The NBD export's URI when served over NBD.
    pub nbd: Option<String>,
    pub block_size: u32,
    pub size: u64,
}

/// Reply to `stats`: the fault engine's figures at the top level (as before the other
/// sections existed), then one section per part of the disk that counts.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Stats {
    /// Requests, bytes, rules, fault log, delayed replies' lateness, per-rule firing.
    #[serde(flatten)]
    pub faults: EngineStats,
    /// The latency model's figures (docs/latency.md), if the disk has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_model: Option<LatencyStats>,
    /// Held delays (`hold: device`, docs/rules.md), once a request held the device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<crate::disk::latency::HoldStats>,
    /// The disk's per-op service times since it started (docs/monitor.md), by op name.
    #[serde(default)]
    pub service: BTreeMap<String, OpService>,
    /// A remote (NBD) store: its client's retries, timeouts and the time they cost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbd_client: Option<CounterSnapshot>,
    /// Served over NBD: the server's connections and requests in flight.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nbd_server: Option<ServerSnapshot>,
    /// The volatile write cache and the power switch (docs/crash.md), if the disk has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_cache: Option<CacheStats>,
}

fn default_max() -> usize {
    10_000
}

/// Serve the socket on a background thread for the life of the process.
/// `info` is the reply to `info`.
pub fn start(path: &Path, disk: Arc<Disk>, nbd_server: Option<Arc<ServerCounters>>, info: ServerInfo) -> Result<()> {
    let info = Arc::new(info);
    let _ = std::fs::remove_file(path);
    let l = UnixListener::bind(path).with_context(|| format!("cannot bind control socket {}", path.display()))?;
    std::thread::Builder::new().name("faultline-control".into()).spawn(move || {
        for s in l.incoming().flatten() {
            let (d, n, i) = (disk.clone(), nbd_server.clone(), info.clone());
            let _ = std::thread::Builder::new().name("faultline-client".into()).spawn(move || serve_client(s, &d, n.as_deref(), &i));
        }
    })?;
    Ok(())
}

fn serve_client(s: UnixStream, disk: &Disk, nbd_server: Option<&ServerCounters>, info: &ServerInfo) {
    let Ok(mut w) = s.try_clone() else { return };
    for line in BufReader::new(s).lines() {
        let Ok(line) = line else { return };
        if line.trim().is_empty() {
            continue;
        }
        let reply = serde_json::from_str::<Request>(&line).context("bad request (see docs/control.md)").and_then(|req| handle(req, disk, nbd_server, info));
        let reply = match reply {
            Ok(v) => json!({"ok": true, "result": v}),
            Err(e) => json!({"ok": false, "error": format!("{e:#}")}),
        };
        if crate::sys::write_json_line(&mut w, &reply).is_err() {
            return;
        }
    }
}

fn handle(req: Request, disk: &Disk, nbd_server: Option<&ServerCounters>, info: &ServerInfo) -> Result<Value> {
    let armed = |rules| -> Result<Armed> { Ok(Armed { ids: disk.arm(rules)?.iter().map(|r| r.id).collect() }) };
    Ok(match req {
        Request::Add { rules } => {
            let rules = crate::spec::rule::yaml::parse_rules(&rules, "rules", disk.geometry()).map_err(anyhow::Error::msg)?;
            serde_json::to_value(armed(rules)?)?
        }
        Request::Arm { rules } => serde_json::to_value(armed(rules)?)?,
        Request::ResetEpoch { at_ns } => {
            let lead = at_ns.map_or(Duration::ZERO, |at| Duration::from_nanos(at.saturating_sub(crate::sys::now_ns())));
            disk.engine().reset_epoch(lead);
            if let Some(l) = disk.latency() {
                l.reset();
            }
            disk.reset_hold_stats();
            serde_json::to_value(Epoch { log_total: disk.engine().log.total() })?
        }
        Request::Info => serde_json::to_value(info)?,
        Request::List => serde_json::to_value(disk.engine().list())?,
        Request::Remove { ids } => {
            let n = disk.engine().remove(&ids);
            if n != ids.len() {
                bail!("removed {n} of {} rules; the others do not exist (see `faultline fault list`)", ids.len());
            }
            serde_json::to_value(Removed { removed: n })?
        }
        Request::Clear => serde_json::to_value(Removed { removed: disk.engine().clear() })?,
        Request::Pause => match disk.engine().pause() {
            Some(n) => serde_json::to_value(Paused { paused: n })?,
            None => bail!("the rules are already paused (`faultline fault resume` resumes them)"),
        },
        Request::Resume => match disk.engine().resume() {
            Some(n) => serde_json::to_value(Resumed { resumed: n })?,
            None => bail!("the rules are not paused (`faultline fault pause` pauses them)"),
        },
        Request::Log { since, max } => serde_json::to_value(disk.engine().log.since(since, max))?,
        Request::Stats => serde_json::to_value(stats(disk, nbd_server))?,
        Request::PowerCut { model, seed } => serde_json::to_value(disk.power_cut(model, seed.unwrap_or_else(rand::random))?)?,
        Request::PowerOn => {
            disk.power_on()?;
            serde_json::to_value(PoweredOn { powered: true })?
        }
        Request::Record { path: Some(p) } => serde_json::to_value(disk.cache().recorder().start(&p)?)?,
        Request::Record { path: None } => serde_json::to_value(disk.cache().recorder().stop()?)?,
        Request::Mark { name } => serde_json::to_value(Marked { entry: disk.cache().recorder().mark(&name)? })?,
    })
}

/// The `stats` reply from the disk's parts that count. The one place that knows where each
/// section's counters live.
fn stats(disk: &Disk, nbd_server: Option<&ServerCounters>) -> Stats {
    Stats {
        faults: disk.engine().stats(),
        latency_model: disk.latency().map(|l| l.stats()),
        held: Some(disk.hold_stats()).filter(|h| h.held > 0),
        service: disk.service().snapshot(),
        nbd_client: disk.client_counters(),
        nbd_server: nbd_server.map(|c| c.snapshot()),
        write_cache: (disk.cache().mode() != CacheMode::None).then(|| disk.cache().stats()),
    }
}

/// How a request reaches a disk server: one exchange, the reply's `result` (or its error).
pub trait Transport {
    fn exchange(&self, req: &Request) -> Result<Value>;
}

/// A server's socket on this host, connected for each request.
pub struct Socket {
    pub path: PathBuf,
    /// Bound on the wait for a reply; none: wait as long as it takes.
    pub timeout: Option<Duration>,
}

impl Transport for Socket {
    fn exchange(&self, req: &Request) -> Result<Value> {
        crate::sys::json_call(&self.path, &serde_json::to_value(req)?, "the disk server", "is `faultline serve` running?", self.timeout)
    }
}

/// The typed client: each request's reply as its type.
pub struct Client<T: Transport>(pub T);

impl Client<Socket> {
    /// A client of the server whose socket is `path`.
    pub fn socket(path: &Path) -> Client<Socket> {
        Client(Socket { path: path.to_owned(), timeout: None })
    }
}

impl<T: Transport> Client<T> {
    fn call<R: DeserializeOwned>(&self, req: &Request) -> Result<R> {
        let v = self.0.exchange(req)?;
        serde_json::from_value(v).with_context(|| format!("bad reply from the disk server to {}", serde_json::to_string(req).unwrap_or_default()))
    }

    /// Arm a YAML rules document; the server names it `rules` in errors.
    pub fn add(&self, yaml: String) -> Result<Vec<RuleId>> {
        Ok(self.call::<Armed>(&Request::Add { rules: yaml })?.ids)
    }

    pub fn arm(&self, rules: Vec<Rule>) -> Result<Vec<RuleId>> {
        Ok(self.call::<Armed>(&Request::Arm { rules })?.ids)
    }

    /// Restart the fault clock, now or at `at_ns` (CLOCK_REALTIME on the server's host);
    /// returns the log's sequence number when asked.
    pub fn reset_epoch(&self, at_ns: Option<u64>) -> Result<u64> {
        Ok(self.call::<Epoch>(&Request::ResetEpoch { at_ns })?.log_total)
    }

    pub fn info(&self) -> Result<ServerInfo> {
        self.call(&Request::Info)
    }

    pub fn list(&self) -> Result<Vec<RuleStatus>> {
        self.call(&Request::List)
    }

    pub fn remove(&self, ids: Vec<RuleId>) -> Result<usize> {
        Ok(self.call::<Removed>(&Request::Remove { ids })?.removed)
    }

    pub fn clear(&self) -> Result<usize> {
        Ok(self.call::<Removed>(&Request::Clear)?.removed)
    }

    pub fn pause(&self) -> Result<usize> {
        Ok(self.call::<Paused>(&Request::Pause)?.paused)
    }

    pub fn resume(&self) -> Result<usize> {
        Ok(self.call::<Resumed>(&Request::Resume)?.resumed)
    }

    /// One page of the fault log: at most `max` entries from sequence number `since`.
    pub fn log(&self, since: u64, max: usize) -> Result<Vec<LogEntry>> {
        self.call(&Request::Log { since, max })
    }

    /// Every log entry from sequence number `since` on, fetched in pages.
    pub fn log_since(&self, mut since: u64) -> Result<Vec<LogEntry>> {
        let mut all = Vec::new();
        loop {
            let page = self.log(since, default_max())?;
            let Some(last) = page.last() else { break };
            since = last.seq + 1;
            all.extend(page);
        }
        Ok(all)
    }

    pub fn stats(&self) -> Result<Stats> {
        self.call(&Request::Stats)
    }

    /// Cut the disk's power (`seed` drawn by the server when absent).
    pub fn power_cut(&self, model: SurvivalModel, seed: Option<u64>) -> Result<CutReport> {
        self.call(&Request::PowerCut { model, seed })
    }

    pub fn power_on(&self) -> Result<()> {
        self.call::<PoweredOn>(&Request::PowerOn).map(|_| ())
    }

    /// Start recording writes to the log `path` (docs/crash.md); None stops it.
    pub fn record(&self, path: Option<PathBuf>) -> Result<crate::disk::record::Recording> {
        self.call(&Request::Record { path })
    }

    /// A MARK in the recording; its entry index (None when not recording).
    pub fn mark(&self, name: &str) -> Result<Option<u64>> {
        Ok(self.call::<Marked>(&Request::Mark { name: name.into() })?.entry)
    }
}

/// One request in its wire form, for scripts and tests that speak JSON by hand; programs use
/// `Client`.
pub fn call(path: &Path, req: &Value) -> Result<Value> {
    crate::sys::json_call(path, req, "the disk server", "is `faultline serve` running?", None)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The wire forms docs/control.md shows, both ways.
    #[test]
    fn request_wire_forms() {
        let cases = [
            (r#"{"cmd":"add","rules":"rules: []"}"#, Request::Add { rules: "rules: []".into() }),
            (r#"{"cmd":"reset_epoch"}"#, Request::ResetEpoch { at_ns: None }),
            (r#"{"cmd":"reset_epoch","at_ns":5}"#, Request::ResetEpoch { at_ns: Some(5) }),
            (r#"{"cmd":"remove","ids":[1,2]}"#, Request::Remove { ids: vec![1, 2] }),
            (r#"{"cmd":"log","since":3,"max":10}"#, Request::Log { since: 3, max: 10 }),
            (r#"{"cmd":"stats"}"#, Request::Stats),
        ];
        for (wire, req) in cases {
            assert_eq!(serde_json::from_str::<Request>(wire).unwrap(), req);
            assert_eq!(serde_json::to_string(&req).unwrap(), wire);
        }
        assert_eq!(serde_json::from_str::<Request>(r#"{"cmd":"log"}"#).unwrap(), Request::Log { since: 0, max: 10_000 });
        assert!(serde_json::from_str::<Request>(r#"{"cmd":"remove","ids":[1],"all":true}"#).is_err());
        assert!(serde_json::from_str::<Request>(r#"{"cmd":"format"}"#).is_err());
    }

    /// `stats` keeps the engine's figures at the top level; absent sections stay absent.
    #[test]
    fn stats_sections() {
        let d = crate::disk::Disk::open(&crate::spec::disk::DiskConfig { size: Some(1 << 20), ..Default::default() }).unwrap();
        let v = serde_json::to_value(stats(&d, None)).unwrap();
        assert!(v["requests"].is_u64() && v["delay_lateness"].is_object() && v["service"].is_object(), "{v}");
        assert!(v.get("latency_model").is_none() && v.get("nbd_client").is_none() && v.get("nbd_server").is_none(), "{v}");
        let back: Stats = serde_json::from_value(v).unwrap();
        assert_eq!(back.faults.rules, 0);
    }
}
