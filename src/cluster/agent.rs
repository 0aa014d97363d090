//! `faultline agent --stdio`: the agent side of the protocol (proto.rs). Requests are read
//! from stdin on the main thread; each is answered from its own thread where it may take long
//! (`exec`), so a slow command never holds up a `time` round trip. Spawned commands run in
//! their own process groups, recorded in this process's ledger, so `faultline cleanup` on this
//! host ends them if the agent is killed; when stdin closes (the controller or its channel is
//! gone) or on `shutdown` the agent ends them itself and exits.

use super::proto::{Event, FromAgent, Hello, Op, PROTOCOL, Request, Response};
use crate::frontend::control::{Socket, Transport};
use crate::sys::ledger::LedgerFile;
use crate::sys::now_ns;
use anyhow::{Context, Result};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

type Out = Arc<Mutex<std::io::Stdout>>;

fn send(out: &Out, msg: &impl serde::Serialize) {
    let mut line = serde_json::to_string(msg).expect("protocol messages serialize");
    line.push('\n');
    let mut o = out.lock().unwrap_or_else(|e| e.into_inner());
    // a closed stdout means the controller is gone: stdin's EOF ends the agent
    let _ = o.write_all(line.as_bytes()).and_then(|()| o.flush());
}

fn reply(out: &Out, id: u64, r: Result<serde_json::Value>) {
    let resp = match r {
        Ok(result) => Response { id, ok: true, result, error: None },
        Err(e) => Response { id, ok: false, result: serde_json::Value::Null, error: Some(format!("{e:#}")) },
    };
    send(out, &FromAgent::Response(resp));
}

/// A spawned command: its process group and start time (the ledger's record of it).
struct Spawned {
    pgid: i32,
    start: u64,
}

struct Agent {
    out: Out,
    /// None once removed at exit (a spawned command's wait thread may still hold the agent).
    ledger: Mutex<Option<LedgerFile>>,
    spawned: Mutex<HashMap<String, Spawned>>,
}

pub fn run_stdio() -> Result<()> {
    // the controller's channel may deliver a SIGHUP when it closes; stdin's EOF handles that
    // case, so the signal must not kill the agent before it has ended its commands
    // SAFETY: setting a signal's disposition to SIG_IGN installs no handler code
    unsafe {
        libc::signal(libc::SIGHUP, libc::SIG_IGN);
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    let out: Out = Arc::new(Mutex::new(std::io::stdout()));
    let agent = Arc::new(Agent { out: out.clone(), ledger: Mutex::new(Some(LedgerFile::create()?)), spawned: Mutex::new(HashMap::new()) });
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_default();
    send(
        &out,
        &Hello {
            protocol: PROTOCOL,
            version: env!("CARGO_PKG_VERSION").into(),
            host,
            pid: std::process::id(),
            run_dir: crate::sys::ledger::run_dir().display().to_string(),
        },
    );
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        if line.trim().is_empty() {
            continue;
        }
        let req: Request = match serde_json::from_str(&line) {
            Ok(r) => r,
            Err(e) => {
                // answer with the id if there is one, so the controller's call fails at once
                let id = serde_json::from_str::<serde_json::Value>(&line).ok().and_then(|v| v["id"].as_u64()).unwrap_or(0);
                reply(&out, id, Err(anyhow::anyhow!("bad request: {e}")));
                continue;
            }
        };
        match req.op {
            Op::Time => reply(&out, req.id, Ok(serde_json::json!(now_ns()))),
            Op::Exec { argv, stdin } => {
                let out = out.clone();
                std::thread::spawn(move || reply(&out, req.id, exec(&argv, stdin.as_deref())));
            }
            Op::Spawn { name, argv } => {
                let r = agent.spawn(&name, &argv).map(|pid| serde_json::json!({"pid": pid}));
                reply(&out, req.id, r);
            }
            Op::Control { socket, request } => {
                let out = out.clone();
                std::thread::spawn(move || reply(&out, req.id, control(&socket, &request)));
            }
            Op::Kill { name, signal } => reply(&out, req.id, agent.kill(&name, signal.unwrap_or(libc::SIGTERM))),
            Op::Shutdown => {
                agent.end_all();
                reply(&out, req.id, Ok(serde_json::Value::Null));
                break;
            }
        }
    }
    agent.end_all();
    if let Some(l) = agent.ledger.lock().unwrap_or_else(|e| e.into_inner()).take() {
        l.remove();
    }
    Ok(())
}

fn exec(argv: &[String], input: Option<&str>) -> Result<serde_json::Value> {
    let (prog, args) = argv.split_first().context("exec needs a command")?;
    let mut c = Command::new(prog);
    c.args(args).stdin(if input.is_some() { Stdio::piped() } else { Stdio::null() }).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = c.spawn().with_context(|| format!("cannot run {prog}"))?;
    if let (Some(text), Some(mut si)) = (input, child.stdin.take()) {
        let text = text.to_string();
        std::thread::spawn(move || {
            let _ = si.write_all(text.as_bytes());
        });
    }
    let o = child.wait_with_output()?;
    Ok(serde_json::json!({
        "code": o.status.code(),
        "signal": o.status.signal(),
        "stdout": String::from_utf8_lossy(&o.stdout),
        "stderr": String::from_utf8_lossy(&o.stderr),
    }))
}

/// Send one request to a disk server's control socket on this host and return its result.
pub fn control(socket: &str, request: &crate::frontend::control::Request) -> Result<serde_json::Value> {
    Socket { path: socket.into(), timeout: Some(Duration::from_secs(30)) }.exchange(request)
}

impl Agent {
    fn spawn(self: &Arc<Self>, name: &str, argv: &[String]) -> Result<u32> {
        let (prog, args) = argv.split_first().context("spawn needs a command")?;
        if self.spawned.lock().unwrap().contains_key(name) {
            anyhow::bail!("a command named `{name}` is already running");
        }
        let mut c = Command::new(prog);
        c.args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0);
        // SAFETY: the hook runs in the forked child before exec and makes one async-signal-safe
        // system call (prctl)
        unsafe {
            c.pre_exec(|| crate::sys::process::die_with_parent(nix::sys::signal::Signal::SIGKILL));
        }
        let mut child = c.spawn().with_context(|| format!("cannot start {prog}"))?;
        let pid = child.id();
        let start = crate::sys::process::start_time(pid).unwrap_or(0);
        if let Some(l) = self.ledger.lock().unwrap().as_mut() {
            l.update(|l| l.procs.push((pid as i32, start)))?;
        }
        self.spawned.lock().unwrap().insert(name.to_string(), Spawned { pgid: pid as i32, start });
        let mut readers = Vec::new();
        for (stream, r) in [
            ("stdout", child.stdout.take().map(|s| Box::new(s) as Box<dyn std::io::Read + Send>)),
            ("stderr", child.stderr.take().map(|s| Box::new(s) as Box<dyn std::io::Read + Send>)),
        ] {
            let Some(r) = r else { continue };
            let (out, name) = (self.out.clone(), name.to_string());
            readers.push(std::thread::spawn(move || {
                for line in BufReader::new(r).lines() {
                    let Ok(line) = line else { break };
                    send(&out, &FromAgent::Event(Event::Output { name: name.clone(), stream: stream.into(), line, t_ns: now_ns() }));
                }
            }));
        }
        let (me, name) = (self.clone(), name.to_string());
        std::thread::spawn(move || {
            let status = child.wait();
            for r in readers {
                let _ = r.join();
            }
            let (code, signal) = status.map(|s| (s.code(), s.signal())).unwrap_or((None, None));
            // the group may live on (children of the leader); it stays recorded until ended
            me.spawned.lock().unwrap().remove(&name);
            send(&me.out, &FromAgent::Event(Event::Exit { name, code, signal, t_ns: now_ns() }));
        });
        Ok(pid)
    }

    fn kill(&self, name: &str, sig: i32) -> Result<serde_json::Value> {
        let s = self.spawned.lock().unwrap();
        let p = s.get(name).with_context(|| format!("no running command named `{name}`"))?;
        let sig = nix::sys::signal::Signal::try_from(sig).context("not a signal number")?;
        if crate::sys::process::start_time(p.pgid as u32).is_some_and(|t| t != p.start) {
            anyhow::bail!("`{name}` has ended (its process id now belongs to another process)");
        }
        nix::sys::signal::killpg(nix::unistd::Pid::from_raw(p.pgid), sig).with_context(|| format!("cannot signal `{name}`"))?;
        Ok(serde_json::Value::Null)
    }

    /// SIGTERM every spawned group, SIGKILL what is left after 2 s.
    fn end_all(&self) {
        let groups: Vec<(i32, u64)> = self.ledger.lock().unwrap().as_ref().map(|l| l.data.procs.clone()).unwrap_or_default();
        for &(pgid, _) in &groups {
            let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid), nix::sys::signal::Signal::SIGTERM);
        }
        let t = Instant::now();
        while groups.iter().any(|&(g, _)| crate::sys::process::group_exists(g)) && t.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(10));
        }
        for &(pgid, start) in &groups {
            crate::sys::process::kill_group(pgid, start);
        }
        if let Some(l) = self.ledger.lock().unwrap().as_mut() {
            let _ = l.update(|l| l.procs.clear());
        }
        self.spawned.lock().unwrap().clear();
    }
}
