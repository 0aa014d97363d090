//! The agent protocol (docs/cluster.md): JSON lines over the agent's stdin and stdout.
//!
//! The agent speaks first, one `Hello`; the controller checks the protocol number. Then the
//! controller sends `Request`s (each with its own `id`) and the agent answers each with one
//! `Response` of the same id, in any order, and may send `Event`s in between (output lines of
//! spawned processes, their exits). One JSON object per line, UTF-8, no framing of our own:
//! any exec channel (ssh, `ip netns exec`, `kubectl exec -i`) carries it unchanged.

use serde::{Deserialize, Serialize};

/// Bumped on any incompatible change; both sides must agree.
pub const PROTOCOL: u32 = 1;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    pub protocol: u32,
    /// faultline's version on the agent's host.
    pub version: String,
    pub host: String,
    pub pid: u32,
    /// The agent's run directory (its ledger, sockets): `/run/faultline` unless
    /// FAULTLINE_RUN_DIR says otherwise there.
    #[serde(default)]
    pub run_dir: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// The agent's wall clock (CLOCK_REALTIME, ns since the epoch), for the offset estimate.
    Time,
    /// Run a command to its end; answers its exit code and output.
    Exec { argv: Vec<String>, stdin: Option<String> },
    /// Start a command in its own process group, recorded in the agent's ledger; its output
    /// lines come back as `Event::Output`, its end as `Event::Exit`. `name` identifies it.
    Spawn { name: String, argv: Vec<String> },
    /// Signal a spawned command's process group (default SIGTERM).
    Kill { name: String, signal: Option<i32> },
    /// One request to a `faultline serve` control socket on the host (docs/control.md);
    /// answers its `result`.
    Control { socket: String, request: crate::frontend::control::Request },
    /// End every spawned command and answer; the agent then exits.
    Shutdown,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Request {
    pub id: u64,
    #[serde(flatten)]
    pub op: Op,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Response {
    pub id: u64,
    pub ok: bool,
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub result: serde_json::Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// A line a spawned command wrote (`stream`: stdout or stderr), with the agent's clock.
    Output { name: String, stream: String, line: String, t_ns: u64 },
    /// A spawned command ended (`code`, or the `signal` that ended it).
    Exit { name: String, code: Option<i32>, signal: Option<i32>, t_ns: u64 },
}

/// Anything the agent writes after its hello.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum FromAgent {
    Response(Response),
    Event(Event),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_forms() {
        let r = Request { id: 7, op: Op::Spawn { name: "w".into(), argv: vec!["fio".into()] } };
        let s = serde_json::to_string(&r).unwrap();
        assert_eq!(s, r#"{"id":7,"op":"spawn","name":"w","argv":["fio"]}"#);
        assert_eq!(serde_json::from_str::<Request>(&s).unwrap(), r);
        let t: Request = serde_json::from_str(r#"{"id":1,"op":"time"}"#).unwrap();
        assert_eq!(t.op, Op::Time);
        let resp: FromAgent = serde_json::from_str(r#"{"id":1,"ok":true,"result":5}"#).unwrap();
        assert!(matches!(resp, FromAgent::Response(Response { id: 1, ok: true, .. })));
        let ev: FromAgent = serde_json::from_str(r#"{"event":"exit","name":"w","code":0,"signal":null,"t_ns":3}"#).unwrap();
        assert!(matches!(ev, FromAgent::Event(Event::Exit { code: Some(0), .. })));
        assert!(serde_json::from_str::<Request>(r#"{"id":1,"op":"format_disk"}"#).is_err());
        // a control request travels in the disk server's own wire form
        let c = Request { id: 2, op: Op::Control { socket: "/s".into(), request: crate::frontend::control::Request::Log { since: 5, max: 10 } } };
        let s = serde_json::to_string(&c).unwrap();
        assert_eq!(s, r#"{"id":2,"op":"control","socket":"/s","request":{"cmd":"log","since":5,"max":10}}"#);
        assert_eq!(serde_json::from_str::<Request>(&s).unwrap(), c);
        assert!(serde_json::from_str::<Request>(r#"{"id":3,"op":"control","socket":"/s","request":{"cmd":"explode"}}"#).is_err());
    }
}
