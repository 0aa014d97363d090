//! The controller's side: start an agent through an exec channel and talk to it.
//!
//! A channel is a command prefix that runs a program on the host and connects its standard
//! input and output: `ssh [OPTIONS] DEST` (OpenSSH: its authentication, host-key checking and
//! config, nothing of ours to secure), `ip netns exec NAME`, `kubectl exec -i POD --`, `docker
//! exec -i C`. The agent is `faultline agent --stdio` run through it.

use super::proto::{Event, FromAgent, Hello, Op, PROTOCOL, Request, Response};
use crate::sys::now_ns;
use anyhow::{Context, Result, bail};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How the controller reaches a host.
#[derive(Clone, Debug, PartialEq)]
pub enum Channel {
    /// `ssh OPTIONS... DEST COMMAND`; BatchMode is always on (no password prompt can hang us).
    Ssh { dest: String, options: Vec<String> },
    /// Any command prefix: `[ip, netns, exec, NAME]`, `[kubectl, exec, -i, POD, --]`.
    Exec(Vec<String>),
}

impl Channel {
    /// The command that runs `argv` on the host.
    pub fn command(&self, argv: &[String]) -> Command {
        match self {
            Channel::Ssh { dest, options } => {
                let mut c = Command::new("ssh");
                c.args(["-T", "-o", "BatchMode=yes"]).args(options).arg(dest);
                // ssh joins its arguments into one shell command line on the remote side
                c.arg(argv.iter().map(|a| shell_quote(a)).collect::<Vec<_>>().join(" "));
                c
            }
            Channel::Exec(prefix) => {
                let mut c = Command::new(&prefix[0]);
                c.args(&prefix[1..]).args(argv);
                c
            }
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Channel::Ssh { dest, .. } => format!("ssh {dest}"),
            Channel::Exec(p) => p.join(" "),
        }
    }
}

fn shell_quote(s: &str) -> String {
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./=:,@%+".contains(&b)) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// The agent's clock minus the controller's, from the round trip with the least delay.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct ClockOffset {
    pub offset_ns: i64,
    /// Half the best round trip: the offset is right within this (the reply was stamped
    /// somewhere inside the round trip).
    pub error_ns: u64,
    pub rtt_ns: u64,
}

type Pending = Arc<Mutex<Option<HashMap<u64, Sender<Response>>>>>;

/// A connected agent.
pub struct Agent {
    pub hello: Hello,
    pub channel: Channel,
    child: Child,
    stdin: Option<ChildStdin>,
    pending: Pending,
    events: Receiver<Event>,
    next_id: u64,
}

/// Time the agent gets to say hello (an ssh connection included).
const HELLO_LIMIT: Duration = Duration::from_secs(30);

impl Agent {
    /// Start `faultline agent --stdio` (the program `faultline` on the host: a path, or a
    /// name found on its PATH) through `channel` and check its hello.
    pub fn connect(channel: &Channel, faultline: &str) -> Result<Agent> {
        let mut c = channel.command(&[faultline.to_string(), "agent".into(), "--stdio".into()]);
        // its own process group: a Ctrl-C on the terminal reaches the controller only, which
        // then tears down through the agents in order
        c.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0);
        let mut child = c.spawn().with_context(|| format!("cannot start the channel `{}`", channel.describe()))?;
        let stdout = child.stdout.take().expect("piped");
        let stderr = child.stderr.take().expect("piped");
        // the channel's own complaints (ssh: host key, auth) are the error to show
        let err_tail = Arc::new(Mutex::new(Vec::<String>::new()));
        let et = err_tail.clone();
        std::thread::spawn(move || {
            for l in BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut v = et.lock().unwrap();
                v.push(l);
                if v.len() > 20 {
                    v.remove(0);
                }
            }
        });
        let (hello_tx, hello_rx) = mpsc::channel::<Result<Hello>>();
        let pending: Pending = Arc::new(Mutex::new(Some(HashMap::new())));
        let (ev_tx, ev_rx) = mpsc::channel();
        let p2 = pending.clone();
        std::thread::spawn(move || reader(BufReader::new(stdout), hello_tx, p2, ev_tx));
        let hello = match hello_rx.recv_timeout(HELLO_LIMIT) {
            Ok(Ok(h)) => h,
            other => {
                let _ = child.kill();
                let _ = child.wait();
                // give the stderr reader a moment to collect the channel's last words
                std::thread::sleep(Duration::from_millis(50));
                let why = match other {
                    Ok(Err(e)) => format!("{e:#}"),
                    Err(_) => format!("no hello within {HELLO_LIMIT:?}"),
                    Ok(Ok(_)) => unreachable!(),
                };
                bail!("agent via `{}` did not start: {why}; its stderr: {}", channel.describe(), err_tail.lock().unwrap().join(" | "));
            }
        };
        let stdin = child.stdin.take();
        let mut a = Agent { hello, channel: channel.clone(), child, stdin, pending, events: ev_rx, next_id: 1 };
        if a.hello.protocol != PROTOCOL {
            let _ = a.child.kill();
            bail!(
                "agent on {} speaks protocol {}, this faultline {PROTOCOL} (its version {}): install the same faultline there",
                a.hello.host,
                a.hello.protocol,
                a.hello.version
            );
        }
        Ok(a)
    }

    /// Send one request and wait for its answer.
    pub fn call(&mut self, op: Op, limit: Duration) -> Result<serde_json::Value> {
        let id = self.next_id;
        self.next_id += 1;
        let (tx, rx) = mpsc::channel();
        match self.pending.lock().unwrap().as_mut() {
            Some(p) => p.insert(id, tx),
            None => bail!("agent on {} is gone", self.hello.host),
        };
        let mut line = serde_json::to_string(&Request { id, op })?;
        line.push('\n');
        let stdin = self.stdin.as_mut().context("agent's stdin is closed")?;
        stdin.write_all(line.as_bytes()).and_then(|()| stdin.flush()).with_context(|| format!("agent on {} is gone", self.hello.host))?;
        let r = rx.recv_timeout(limit).map_err(|e| match e {
            std::sync::mpsc::RecvTimeoutError::Timeout => anyhow::anyhow!("agent on {} did not answer within {limit:?}", self.hello.host),
            std::sync::mpsc::RecvTimeoutError::Disconnected => anyhow::anyhow!("agent on {} disconnected", self.hello.host),
        })?;
        if r.ok { Ok(r.result) } else { bail!("agent on {}: {}", self.hello.host, r.error.unwrap_or_default()) }
    }

    /// Estimate the agent's clock offset from `rounds` `time` round trips.
    pub fn clock_offset(&mut self, rounds: usize) -> Result<ClockOffset> {
        let mut best: Option<ClockOffset> = None;
        for _ in 0..rounds.max(1) {
            let t0 = now_ns();
            let remote = self.call(Op::Time, Duration::from_secs(10))?.as_u64().context("time: not a number")?;
            let t1 = now_ns();
            let rtt = t1.saturating_sub(t0);
            let mid = t0 as i128 + (rtt / 2) as i128;
            let o = ClockOffset { offset_ns: (remote as i128 - mid) as i64, error_ns: rtt / 2, rtt_ns: rtt };
            if best.is_none_or(|b| o.rtt_ns < b.rtt_ns) {
                best = Some(o);
            }
        }
        Ok(best.expect("at least one round"))
    }

    /// End the channel's process (an agent that stopped answering: its ssh client, or the
    /// agent itself for `ip netns exec`); the agent host's commands die with it or go with
    /// `faultline cleanup` there.
    pub fn kill_channel(&mut self) {
        let _ = self.child.kill();
    }

    /// False once the channel has closed (the agent exited, was killed, or ssh dropped).
    pub fn alive(&self) -> bool {
        self.pending.lock().unwrap().is_some()
    }

    /// Take the event stream (for a thread of its own); this agent's `events()` is then empty.
    pub fn take_events(&mut self) -> Receiver<Event> {
        std::mem::replace(&mut self.events, mpsc::channel().1)
    }

    /// Events (spawned commands' output and exits) as they arrive.
    pub fn events(&self) -> &Receiver<Event> {
        &self.events
    }

    /// Ask the agent to end its commands and exit; then wait for the channel to close.
    pub fn shutdown(mut self) -> Result<()> {
        let r = self.call(Op::Shutdown, Duration::from_secs(30));
        self.stdin.take();
        let _ = self.child.wait();
        r.map(|_| ())
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        // closing stdin is the agent's cue to end its commands and exit
        self.stdin.take();
        let _ = self.child.wait();
    }
}

fn reader(r: impl BufRead, hello: Sender<Result<Hello>>, pending: Pending, events: Sender<Event>) {
    let mut lines = r.lines();
    let first = match lines.next() {
        Some(Ok(l)) => {
            serde_json::from_str::<Hello>(&l).with_context(|| format!("expected the agent's hello, got `{}`", l.chars().take(200).collect::<String>()))
        }
        Some(Err(e)) => Err(e.into()),
        None => Err(anyhow::anyhow!("the channel closed before the agent said hello")),
    };
    let ok = first.is_ok();
    let _ = hello.send(first);
    if ok {
        for line in lines.map_while(Result::ok) {
            match serde_json::from_str::<FromAgent>(&line) {
                Ok(FromAgent::Response(r)) => {
                    if let Some(tx) = pending.lock().unwrap().as_mut().and_then(|p| p.remove(&r.id)) {
                        let _ = tx.send(r);
                    }
                }
                Ok(FromAgent::Event(e)) => {
                    let _ = events.send(e);
                }
                Err(_) => {} // a line we do not understand (a newer agent's event): skip it
            }
        }
    }
    // the agent is gone: every call still waiting fails now
    pending.lock().unwrap().take();
}

/// Copy this faultline executable to `path` on the host through the channel (opt-in: for
/// hosts without faultline, or with another version). Written beside and renamed, so a
/// running copy is never overwritten in place.
pub fn install(channel: &Channel, path: &str) -> Result<()> {
    let exe = std::env::current_exe().context("cannot find this faultline executable")?;
    let bytes = std::fs::read(&exe).with_context(|| format!("cannot read {}", exe.display()))?;
    let script = format!("set -e; t={p}.tmp.$$; cat > \"$t\"; chmod 755 \"$t\"; mv -f \"$t\" {p}", p = shell_quote(path));
    let mut c = channel.command(&["sh".into(), "-c".into(), script]);
    c.stdin(Stdio::piped()).stdout(Stdio::null()).stderr(Stdio::piped());
    let mut child = c.spawn().with_context(|| format!("cannot start the channel `{}`", channel.describe()))?;
    let mut si = child.stdin.take().expect("piped");
    let writer = std::thread::spawn(move || si.write_all(&bytes));
    let o = child.wait_with_output()?;
    let _ = writer.join();
    if !o.status.success() {
        bail!("copying faultline to {path} via `{}` failed: {}", channel.describe(), String::from_utf8_lossy(&o.stderr).trim());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ssh_commands_are_quoted_for_the_remote_shell() {
        let c = Channel::Ssh { dest: "root@h".into(), options: vec!["-p".into(), "2222".into()] };
        let cmd = c.command(&["/opt/fl".into(), "a b".into(), "it's".into()]);
        let args: Vec<String> = cmd.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(args, ["-T", "-o", "BatchMode=yes", "-p", "2222", "root@h", "/opt/fl 'a b' 'it'\\''s'"]);
        let e = Channel::Exec(vec!["ip".into(), "netns".into(), "exec".into(), "n1".into()]).command(&["faultline".into(), "agent".into()]);
        assert_eq!(e.get_program(), "ip");
        assert_eq!(e.get_args().count(), 5);
    }
}
