//! A run's disks, each served by a child process (`faultline serve --owned-by <run pid>`),
//! never by the process that does I/O on them: when the run is killed (kill -9, the OOM
//! killer) while its threads wait for the disk, the server still answers, the run's threads
//! finish, and the server then releases what the run built on the disk and tears itself down.
//! When the server dies instead, the run's I/O fails with errors rather than hanging for good
//! (the kernel aborts a FUSE connection whose server is gone). docs/architecture.md has the why.

use crate::fault::Rule;
use crate::fault::engine::RuleStatus;
use crate::fault::log::LogEntry;
use crate::frontend::control::{Client, Request, Stats, Transport};
use crate::spec::disk::DiskSpec;
use crate::spec::rule::RuleId;
use anyhow::{Context, Result, bail};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a server gets to tear down after it was asked to (unmount, detach, join threads).
const STOP_LIMIT: Duration = Duration::from_secs(60);

pub struct DiskServer {
    pub device: PathBuf,
    /// How requests reach the server ("io_uring", or "/dev/fuse" and why).
    pub transport: String,
    pub cpu_latency_unavailable: Option<String>,
    pub block_size: u64,
    child: Mutex<Option<Child>>,
    client: Client<Kept>,
}

/// The server's control socket over one connection, made at the first request and kept.
struct Kept {
    socket: PathBuf,
    conn: Mutex<Option<(BufReader<UnixStream>, UnixStream)>>,
}

impl Transport for Kept {
    fn exchange(&self, req: &Request) -> Result<Value> {
        let mut conn = self.conn.lock().unwrap();
        if conn.is_none() {
            let s = UnixStream::connect(&self.socket).with_context(|| format!("cannot connect to the disk server at {}", self.socket.display()))?;
            *conn = Some((BufReader::new(s.try_clone()?), s));
        }
        let (r, w) = conn.as_mut().unwrap();
        crate::sys::json_exchange(w, r, &serde_json::to_value(req)?, "the disk server")
    }
}

/// `faultline serve` arguments for the disk `d`: its whole spec as one typed document (size,
/// store, front end, latency model); the caller adds where it serves and its control socket
/// (also run::agents on remote hosts).
pub(crate) fn serve_args(d: &DiskSpec) -> Vec<String> {
    vec![format!("--spec-json={}", serde_json::to_string(d).expect("a disk spec serializes"))]
}

impl DiskServer {
    /// The server's process (host faults act on it), while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.lock().unwrap().as_ref().map(|c| c.id())
    }

    /// Start one server for `d` and wait until its device is attached.
    pub fn start(d: &DiskSpec, index: usize) -> Result<DiskServer> {
        DiskServer::start_in(d, index, None)
    }

    /// Start the server inside a network namespace, serving over NBD only (`--nbd ADDR
    /// --no-loop`): `place` = (namespace, tcp://ADDR:PORT). `device` is then the export's URI.
    pub fn start_in(d: &DiskSpec, index: usize, place: Option<(&str, &str)>) -> Result<DiskServer> {
        let exe = std::env::current_exe().context("cannot find the faultline executable")?;
        let socket = crate::sys::ledger::run_dir().join(format!("run-{}-disk{index}.sock", std::process::id()));
        let mut c = match place {
            // `ip netns exec` execs the server: the child's pid is the server's
            Some((ns, _)) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(exe);
                c
            }
            None => Command::new(exe),
        };
        c.arg("serve");
        if let Some((_, addr)) = place {
            c.arg(format!("--nbd={addr}")).arg("--no-loop");
        }
        c.args(serve_args(d))
            .arg("--socket")
            .arg(&socket)
            .arg(format!("--owned-by={}", std::process::id()))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            // the run's own stderr, which outlives the run: a server whose run was killed
            // still has somewhere to say what it released
            // its own group: a Ctrl-C on the terminal reaches the run, which tears down in order
            .process_group(0);
        // SAFETY: the hook runs in the forked child before exec and only makes one
        // async-signal-safe system call (prctl)
        unsafe {
            c.pre_exec(|| crate::sys::process::die_with_parent(nix::sys::signal::Signal::SIGTERM));
        }
        let mut child = c.spawn().context("cannot start the disk server (faultline serve)")?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped stdout")).read_line(&mut line)?;
        let mut me = DiskServer {
            device: PathBuf::new(),
            transport: String::new(),
            cpu_latency_unavailable: None,
            block_size: d.disk.block_size as u64,
            child: Mutex::new(Some(child)),
            client: Client(Kept { socket, conn: Mutex::new(None) }),
        };
        let nbd_only = place.is_some() && line.starts_with("nbd://");
        if !line.starts_with("/dev/") && !nbd_only {
            let status = me.child.lock().unwrap().take().map(|mut c| c.wait());
            match status {
                Some(Ok(s)) => {
                    bail!("disk {index}: the disk server did not start ({s}; its error is above)")
                }
                _ => bail!("disk {index}: the disk server did not start"),
            }
        }
        let info = me.client.info()?;
        me.device = PathBuf::from(line.trim());
        me.transport = info.transport.unwrap_or_default();
        me.cpu_latency_unavailable = info.cpu_latency_unavailable;
        Ok(me)
    }

    pub fn arm(&self, rules: Vec<Rule>) -> Result<Vec<RuleId>> {
        self.client.arm(rules)
    }

    pub fn list(&self) -> Result<Vec<RuleStatus>> {
        self.client.list()
    }

    /// Every log entry from sequence number `since` on, fetched in pages.
    pub fn log_since(&self, since: u64) -> Result<Vec<LogEntry>> {
        self.client.log_since(since)
    }

    /// The server's `stats` reply, typed (docs/control.md): the caller picks its sections.
    pub fn stats(&self) -> Result<Stats> {
        self.client.stats()
    }

    /// Restart the fault clock now; returns the log's sequence number at that moment.
    pub fn reset_epoch(&self) -> Result<u64> {
        self.client.reset_epoch(None)
    }

    /// Cut the disk's power (docs/crash.md): its volatile cache applies `model`, then every
    /// request fails until `power_on`.
    pub fn power_cut(&self, model: crate::disk::cache::SurvivalModel, seed: u64) -> Result<crate::disk::cache::CutReport> {
        self.client.power_cut(model, Some(seed))
    }

    pub fn power_on(&self) -> Result<()> {
        self.client.power_on()
    }

    /// Flushes the disk's volatile cache completed since it started (None without one).
    pub fn flushes(&self) -> Result<Option<u64>> {
        Ok(self.stats()?.write_cache.map(|c| c.flushes))
    }

    /// Record the disk's writes to the log `path` (None: stop), docs/crash.md.
    pub fn record(&self, path: Option<PathBuf>) -> Result<crate::disk::record::Recording> {
        self.client.record(path)
    }

    /// A MARK in the disk's recording (nothing when it is not recording).
    pub fn mark(&self, name: &str) -> Result<Option<u64>> {
        self.client.mark(name)
    }

    /// Ask the server to tear down (SIGTERM) and wait for it, time-limited.
    pub fn stop(&self) -> Result<()> {
        self.client.0.conn.lock().unwrap().take();
        let Some(mut child) = self.child.lock().unwrap().take() else {
            return Ok(());
        };
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGTERM);
        let t = Instant::now();
        loop {
            if let Some(status) = child.try_wait()? {
                if status.success() {
                    return Ok(());
                }
                bail!("the disk server of {} ended with {status} (its error is above)", self.device.display());
            }
            if t.elapsed() > STOP_LIMIT {
                let _ = child.kill();
                let _ = child.wait();
                bail!(
                    "the disk server of {} did not finish its teardown within {} s; killed it (`faultline cleanup` releases what it left)",
                    self.device.display(),
                    STOP_LIMIT.as_secs()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for DiskServer {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            eprintln!("faultline: {e:#}");
        }
    }
}
