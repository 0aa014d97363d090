//! The relay's control socket: JSON lines over a Unix socket, one request per line, one reply
//! per line (like the disk's, docs/control.md; this one is docs/net.md).
//!
//! Requests: {"cmd":"set","rule":<NetRule>} -> {"id":N} | {"cmd":"clear"} or
//! {"cmd":"clear","ids":[1,2]} -> {"removed":N} | {"cmd":"show"} -> hosts, rules, counters.
//! Replies: {"ok":true,"result":...} or {"ok":false,"error":"..."}.

use super::relay::Relay;
use crate::spec::net::NetRule;
use anyhow::{Context, Result};
use serde::Deserialize;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Arc;

#[derive(Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case", deny_unknown_fields)]
enum Request {
    Set {
        rule: Box<NetRule>,
    },
    Clear {
        #[serde(default)]
        ids: Option<Vec<u64>>,
    },
    Show,
}

/// Serve the socket on a background thread for the life of the process.
pub fn start(path: &Path, relay: Arc<Relay>) -> Result<()> {
    let _ = std::fs::remove_file(path);
    let l = UnixListener::bind(path).with_context(|| format!("cannot bind control socket {}", path.display()))?;
    std::thread::Builder::new().name("fl-net-control".into()).spawn(move || {
        for s in l.incoming().flatten() {
            let r = relay.clone();
            let _ = std::thread::Builder::new().name("fl-net-client".into()).spawn(move || serve_client(s, &r));
        }
    })?;
    Ok(())
}

fn serve_client(s: UnixStream, relay: &Relay) {
    let Ok(mut w) = s.try_clone() else { return };
    for line in BufReader::new(s).lines() {
        let Ok(line) = line else { return };
        if line.trim().is_empty() {
            continue;
        }
        let reply = match handle(&line, relay) {
            Ok(v) => json!({"ok": true, "result": v}),
            Err(e) => json!({"ok": false, "error": format!("{e:#}")}),
        };
        if crate::sys::write_json_line(&mut w, &reply).is_err() {
            return;
        }
    }
}

fn handle(line: &str, relay: &Relay) -> Result<Value> {
    let req: Request = serde_json::from_str(line).context("bad request (see docs/net.md)")?;
    Ok(match req {
        Request::Set { rule } => json!({"id": relay.set(*rule)?}),
        Request::Clear { ids } => json!({"removed": relay.clear(ids.as_deref())?}),
        Request::Show => relay.show(),
    })
}

/// Client side: send one request, return its result.
pub fn call(path: &Path, req: &Value) -> Result<Value> {
    crate::sys::json_call(path, req, "the network relay", "is `faultline net up` running?", None)
}
