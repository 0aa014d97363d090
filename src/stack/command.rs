//! A user command as the workload: run in its own process group with the stack in its
//! environment, killed as a group on timeout, on cancel (the caller's Ctrl-C flag), when
//! unwound, and by `faultline cleanup` after a crash (the group is in the ledger).

pub use crate::spec::stack::{Cmdline, CommandSpec};
use crate::sys::ledger::LedgerFile;
use crate::sys::process;
use anyhow::{Result, bail};
use serde::Serialize;
use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the command sees: FAULTLINE_DEVICE, FAULTLINE_DEVICES (space-separated),
/// FAULTLINE_MOUNT (only for file-system stacks), FAULTLINE_ACKS (with `acks: true`).
#[derive(Clone, Debug, Default)]
pub struct CommandEnv {
    pub device: Option<PathBuf>,
    pub devices: Vec<PathBuf>,
    pub mount: Option<PathBuf>,
    /// FAULTLINE_ACKS: where the command appends its acknowledged commits (`acks: true`).
    pub acks: Option<PathBuf>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct CommandOutcome {
    pub exit_code: Option<i32>,
    /// The signal that ended the command's main process.
    pub signal: Option<i32>,
    pub seconds: f64,
    pub timed_out: bool,
    pub cancelled: bool,
    /// Last 4 KiB of each stream.
    pub stdout_tail: String,
    pub stderr_tail: String,
}

impl CommandOutcome {
    pub fn success(&self) -> bool {
        self.exit_code == Some(0) && !self.timed_out && !self.cancelled
    }
}

const TAIL: usize = 4096;

/// Kills the group when dropped (error paths, panics) and forgets it in the ledger.
struct Group {
    pgid: i32,
    /// Seen empty: its number may be reused by someone else's group, never signal it again.
    gone: bool,
    ledger: Option<LedgerFile>,
}

impl Group {
    fn kill(&mut self, sig: i32) {
        if !self.gone {
            // SAFETY: kill takes no pointers; the group is ours (`gone` tells when it has ended)
            unsafe { libc::kill(-self.pgid, sig) };
        }
    }
    fn exists(&mut self) -> bool {
        // SAFETY: signal 0 only checks that the group exists
        self.gone = self.gone || unsafe { libc::kill(-self.pgid, 0) } != 0;
        !self.gone
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.kill(libc::SIGKILL);
        if let Some(l) = self.ledger.take() {
            l.remove();
        }
    }
}

fn tail_reader(mut r: impl Read + Send + 'static) -> (Arc<Mutex<Vec<u8>>>, std::thread::JoinHandle<()>) {
    let buf = Arc::new(Mutex::new(Vec::new()));
    let b = buf.clone();
    let h = std::thread::spawn(move || {
        let mut chunk = [0u8; 8192];
        while let Ok(n) = r.read(&mut chunk) {
            if n == 0 {
                break;
            }
            let mut v = b.lock().unwrap();
            v.extend_from_slice(&chunk[..n]);
            if v.len() > 4 * TAIL {
                let cut = v.len() - TAIL;
                v.drain(..cut);
            }
        }
    });
    (buf, h)
}

fn tail(b: &Mutex<Vec<u8>>) -> String {
    let v = b.lock().unwrap();
    String::from_utf8_lossy(&v[v.len().saturating_sub(TAIL)..]).into_owned()
}

/// Run `spec` with `env` to the end: `spawn_command` + `RunningCommand::wait`.
pub fn run_command(spec: &CommandSpec, env: &CommandEnv, cancel: Option<&AtomicBool>) -> Result<CommandOutcome> {
    spawn_command(spec, env)?.wait(cancel)
}

/// A started command. Dropping it kills its whole process group.
pub struct RunningCommand {
    child: std::process::Child,
    group: Group,
    start: Instant,
    timeout: Option<Duration>,
    out: (Arc<Mutex<Vec<u8>>>, std::thread::JoinHandle<()>),
    err: (Arc<Mutex<Vec<u8>>>, std::thread::JoinHandle<()>),
    reaped: bool,
}

/// Start `spec` with `env` in its own process group, recorded in the ledger. Call it from a
/// thread that lives until the command ends: the main process gets SIGKILL when the spawning
/// thread exits (PR_SET_PDEATHSIG, which also covers faultline being killed -9).
pub fn spawn_command(spec: &CommandSpec, env: &CommandEnv) -> Result<RunningCommand> {
    let mut c = match &spec.command {
        Cmdline::Shell(s) => {
            let mut c = Command::new("/bin/sh");
            c.arg("-c").arg(s);
            c
        }
        Cmdline::Argv(v) => {
            let Some((prog, args)) = v.split_first() else { bail!("the command is empty") };
            let mut c = Command::new(prog);
            c.args(args);
            c
        }
    };
    if let Some(d) = &env.device {
        c.env("FAULTLINE_DEVICE", d);
    }
    c.env("FAULTLINE_DEVICES", env.devices.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(" "));
    match &env.mount {
        Some(m) => c.env("FAULTLINE_MOUNT", m),
        None => c.env_remove("FAULTLINE_MOUNT"),
    };
    match &env.acks {
        Some(a) => c.env("FAULTLINE_ACKS", a),
        None => c.env_remove("FAULTLINE_ACKS"),
    };
    if let Some(d) = spec.cwd.as_ref().or(env.mount.as_ref()) {
        c.current_dir(d);
    }
    c.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    // its own group: killed as a whole, and a terminal's Ctrl-C reaches faultline, which
    // decides (cancel flag)
    use std::os::unix::process::CommandExt;
    c.process_group(0);
    // SAFETY: the hook runs in the forked child before exec and makes one async-signal-safe
    // call (prctl), allocating nothing
    unsafe {
        c.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    let mut ledger = LedgerFile::create()?;
    let start = Instant::now();
    let mut child = match c.spawn() {
        Ok(c) => c,
        Err(e) => {
            ledger.remove();
            return Err(anyhow::Error::from(e).context(format!("cannot start {:?}", spec.command)));
        }
    };
    let pgid = child.id() as i32;
    let mut group = Group { pgid, gone: false, ledger: None };
    ledger.update(|l| l.procs.push((pgid, process::start_time(pgid as u32).unwrap_or(0))))?;
    group.ledger = Some(ledger);
    let out = tail_reader(child.stdout.take().unwrap());
    let err = tail_reader(child.stderr.take().unwrap());
    Ok(RunningCommand { child, group, start, timeout: spec.timeout, out, err, reaped: false })
}

impl RunningCommand {
    /// The process group (= the main process's pid).
    pub fn pgid(&self) -> i32 {
        self.group.pgid
    }

    /// Wait for the end; `cancel` is polled (set it from your SIGINT/SIGTERM handler). On
    /// timeout or cancel the group gets SIGTERM, then SIGKILL 2 s later. Members left when the
    /// main process exits are killed too, so nothing keeps the file system busy.
    pub fn wait(mut self, cancel: Option<&AtomicBool>) -> Result<CommandOutcome> {
        let mut res = CommandOutcome::default();
        let mut term_at: Option<Instant> = None;
        let status = loop {
            if let Some(st) = self.child.try_wait()? {
                break st;
            }
            if term_at.is_none() {
                if self.timeout.is_some_and(|to| self.start.elapsed() >= to) {
                    res.timed_out = true;
                } else if cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
                    res.cancelled = true;
                }
                if res.timed_out || res.cancelled {
                    self.group.kill(libc::SIGTERM);
                    term_at = Some(Instant::now());
                }
            } else if term_at.is_some_and(|t| t.elapsed() > Duration::from_secs(2)) {
                self.group.kill(libc::SIGKILL);
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        self.reaped = true;
        res.seconds = self.start.elapsed().as_secs_f64();
        use std::os::unix::process::ExitStatusExt;
        res.exit_code = status.code();
        res.signal = status.signal();
        // stragglers (daemons the command started) would keep the file system busy
        if self.group.exists() {
            self.group.kill(libc::SIGKILL);
            let w = Instant::now();
            while self.group.exists() && w.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        // the pipes close when the last holder is gone; don't wait forever for one that escaped
        let w = Instant::now();
        while !(self.out.1.is_finished() && self.err.1.is_finished()) && w.elapsed() < Duration::from_secs(1) {
            std::thread::sleep(Duration::from_millis(5));
        }
        res.stdout_tail = tail(&self.out.0);
        res.stderr_tail = tail(&self.err.0);
        Ok(res)
    }
}

impl Drop for RunningCommand {
    fn drop(&mut self) {
        if !self.reaped {
            self.group.kill(libc::SIGKILL);
            let _ = self.child.wait();
        }
        // Group's own drop forgets the ledger entry
    }
}
