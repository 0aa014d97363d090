//! The control socket: JSON lines over a Unix socket, one request per line, one reply per line.
//!
//! Requests: {"cmd":"add","rules":"<YAML rules document>"} | {"cmd":"list"} |
//! {"cmd":"remove","ids":[1,2]} | {"cmd":"clear"} | {"cmd":"pause"} | {"cmd":"resume"} |
//! {"cmd":"log","since":0,"max":1000} |
//! {"cmd":"stats"} | {"cmd":"arm","rules":[<Rule as JSON>]} | {"cmd":"reset_epoch"} |
//! {"cmd":"info"}. Replies: {"ok":true,"result":...} or {"ok":false,"error":"..."}.

use crate::disk::Disk;
use crate::nbd_wire::ServerCounters;
use anyhow::{Context, Result, bail};
use serde::Deserialize;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Arc;

#[derive(Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case", deny_unknown_fields)]
enum Request {
    Add {
        rules: String,
    },
    /// Rules already validated (a run's scheduler), as `fault::Rule` serializes them.
    Arm {
        rules: Vec<crate::fault::Rule>,
    },
    /// Restart the fault clock and request counters (a run's workload starts).
    ResetEpoch,
    /// What the server was started with: device, transport, block size.
    Info,
    List,
    Remove {
        ids: Vec<u64>,
    },
    Clear,
    /// Stop matching rules, keeping them (`Engine::pause`).
    Pause,
    Resume,
    Log {
        #[serde(default)]
        since: u64,
        #[serde(default = "default_max")]
        max: usize,
    },
    Stats,
}

fn default_max() -> usize {
    10_000
}

/// Serve the socket on a background thread for the life of the process.
/// `info` is the reply to `{"cmd":"info"}`.
/// `nbd_server`: the NBD server's counters, when the disk is served over NBD.
pub fn start(path: &Path, disk: Arc<Disk>, nbd_server: Option<Arc<ServerCounters>>, info: Value) -> Result<()> {
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

fn serve_client(s: UnixStream, disk: &Disk, nbd_server: Option<&ServerCounters>, info: &Value) {
    let Ok(mut w) = s.try_clone() else { return };
    for line in BufReader::new(s).lines() {
        let Ok(line) = line else { return };
        if line.trim().is_empty() {
            continue;
        }
        let reply = match handle(&line, disk, nbd_server, info) {
            Ok(v) => json!({"ok": true, "result": v}),
            Err(e) => json!({"ok": false, "error": format!("{e:#}")}),
        };
        if crate::sys::write_json_line(&mut w, &reply).is_err() {
            return;
        }
    }
}

fn handle(line: &str, disk: &Disk, nbd_server: Option<&ServerCounters>, info: &Value) -> Result<Value> {
    let req: Request = serde_json::from_str(line).context("bad request (see docs/control.md)")?;
    Ok(match req {
        Request::Add { rules } => {
            let rules = crate::spec::rules::parse_rules(&rules, "rules", disk.geometry()).map_err(anyhow::Error::msg)?;
            let armed = disk.arm(rules)?;
            json!({"ids": armed.iter().map(|r| r.id).collect::<Vec<_>>()})
        }
        Request::Arm { rules } => {
            let armed = disk.arm(rules)?;
            json!({"ids": armed.iter().map(|r| r.id).collect::<Vec<_>>()})
        }
        Request::ResetEpoch => {
            disk.engine().reset_epoch();
            if let Some(l) = disk.latency() {
                l.reset();
            }
            json!({"log_total": disk.engine().log.total()})
        }
        Request::Info => info.clone(),
        Request::List => serde_json::to_value(disk.engine().list())?,
        Request::Remove { ids } => {
            let n = disk.engine().remove(&ids);
            if n != ids.len() {
                bail!("removed {n} of {} rules; the others do not exist (see `faultline fault list`)", ids.len());
            }
            json!({"removed": n})
        }
        Request::Clear => json!({"removed": disk.engine().clear()}),
        Request::Pause => match disk.engine().pause() {
            Some(n) => json!({"paused": n}),
            None => bail!("the rules are already paused (`faultline fault resume` resumes them)"),
        },
        Request::Resume => match disk.engine().resume() {
            Some(n) => json!({"resumed": n}),
            None => bail!("the rules are not paused (`faultline fault pause` pauses them)"),
        },
        Request::Log { since, max } => serde_json::to_value(disk.engine().log.since(since, max))?,
        Request::Stats => {
            let mut v = serde_json::to_value(disk.engine().stats())?;
            // the latency model is not a fault: its own section, beside the engine's figures
            if let Some(l) = disk.latency() {
                v["latency_model"] = serde_json::to_value(l.stats())?;
            }
            // the disk's own per-op service times (docs/monitor.md)
            v["service"] = serde_json::to_value(disk.service().snapshot())?;
            // a remote (NBD) store: its client's retries, timeouts and the time they cost
            if let (Some(c), Some(o)) = (disk.client_counters(), v.as_object_mut()) {
                o.insert("nbd_client".into(), serde_json::to_value(c)?);
            }
            // served over NBD: the server's connections and requests in flight
            if let (Some(c), Some(o)) = (nbd_server, v.as_object_mut()) {
                o.insert("nbd_server".into(), serde_json::to_value(c.snapshot())?);
            }
            v
        }
    })
}

/// Client side: send one request, return its result.
pub fn call(path: &Path, req: &Value) -> Result<Value> {
    crate::sys::json_call(path, req, "the disk server", "is `faultline serve` running?", None)
}
