//! Shared helpers for integration tests: a real `faultline serve` child process, O_DIRECT I/O
//! on its /dev/loopN, and control-socket calls. Tests need root, /dev/fuse and loop devices.
//!
//! scripts/test.sh runs test binaries side by side and the tests of each in threads of one
//! process, beside other users of the machine. So a test:
//! - names what it makes outside its tempdir (a run directory, a network namespace, a device, a
//!   file) with `unique(tag)`, never the process id alone or a fixed name; a port is bound as 0;
//! - finds the run directory with `run_root()`, never a literal /run/faultline;
//! - runs `faultline cleanup`, or looks for leftovers, in a `RunDir` of its own
//!   (`Serve::start_in`, `RunDir::cmd`): the default one holds other tests' live runs;
//! - waits for the event it needs (poll with a deadline), not a guessed sleep.
//!
//! A new test runs in both passes (default transport, then `FAULTLINE_RING=off`) until
//! scripts/test.sh lists it in TRANSPORT_FREE (it serves no FUSE disk) or TRANSPORT_PINNED
//! (each of its disks names its transport); one that measures time or changes what the whole
//! machine shares goes in ALONE.
#![allow(dead_code)]

use faultline::content::fill_block;
use faultline::workload::direct::{AlignedBuf, DirectDev};
use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

pub const BS: u64 = 4096;

/// A name no other test shares, for anything a test makes outside its own tempdir (a run
/// directory, a network namespace, a file): the process id keeps two test binaries apart, the
/// counter the tests of one binary (libtest runs them as threads of one process), and `tag`
/// says what it is to a reader. A name made of the process id alone is shared by every test of
/// the binary, and one test then removes another's file.
pub fn unique(tag: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!("{}-{}-{tag}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

/// The run directory of the faultline processes tests start without a `RunDir` of their own:
/// `FAULTLINE_RUN_DIR` (scripts/test.sh gives each pass one, so its leftover check sees only
/// the suite's own loop devices and mounts), else the default /run/faultline.
pub fn run_root() -> PathBuf {
    faultline::sys::ledger::run_dir()
}

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_faultline")
}

/// Why FUSE over io_uring cannot be had on this machine (a kernel without it, or
/// `FAULTLINE_RING=off`), by the same check `serve` makes.
pub fn ring_unavailable() -> Option<String> {
    faultline::frontend::uring::unavailable().expect("FAULTLINE_RING")
}

/// Report (part of) a test as skipped, visibly: on the test's stderr, which libtest does not
/// capture when written to directly (unlike `eprintln!`), and as a line appended to the file
/// named by `FAULTLINE_SKIP_LOG`, which scripts/test.sh counts and lists. `part` names the
/// skipped half of a test that runs the rest ("" for the whole test).
pub fn skip(part: &str, why: &str) {
    use std::io::Write;
    let test = std::thread::current().name().unwrap_or("?").to_string();
    let what = if part.is_empty() { format!("{}::{test}", env!("CARGO_CRATE_NAME")) } else { format!("{}::{test} [{part}]", env!("CARGO_CRATE_NAME")) };
    let line = format!("SKIPPED: {what}: {why}\n");
    let _ = std::io::stderr().write_all(line.as_bytes());
    if let Some(path) = std::env::var_os("FAULTLINE_SKIP_LOG") {
        // one write of one short line to an O_APPEND file: lines of concurrent tests do not mix
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(&path).expect("open FAULTLINE_SKIP_LOG");
        f.write_all(line.as_bytes()).expect("write FAULTLINE_SKIP_LOG");
    }
}

/// For a test that needs FUSE over io_uring: true if it can run, else reports it skipped.
pub fn need_ring() -> bool {
    match ring_unavailable() {
        None => true,
        Some(why) => {
            skip("", &format!("needs FUSE over io_uring: {why}"));
            false
        }
    }
}

/// The `--ring` values a test runs over: "on" (FUSE over io_uring) where it can be had, and
/// "off" (classic /dev/fuse) always; a missing "on" is reported skipped.
pub fn transports() -> Vec<&'static str> {
    match ring_unavailable() {
        None => vec!["on", "off"],
        Some(why) => {
            skip("--ring on", &format!("needs FUSE over io_uring: {why}"));
            vec!["off"]
        }
    }
}

/// The `--ring` value of a pinned test (TRANSPORT_PINNED) that runs over one transport and
/// takes FUSE over io_uring where the kernel has it: "on" there, else "off" (classic
/// /dev/fuse), so it runs on every kernel. Its partner tests pin "off".
pub fn ring_where_available() -> &'static str {
    if ring_unavailable().is_none() { "on" } else { "off" }
}

/// For a test scripts/test.sh lists in TRANSPORT_PINNED (which its second pass, over classic
/// /dev/fuse, leaves out): it sets FAULTLINE_TEST_PINNED for them in the first pass, and then
/// every disk they serve must name its transport (`pinned`), or the first pass did not run
/// their classic half. `what` names the disk in the failure.
pub fn check_pinned(what: &str, pinned: bool) {
    if std::env::var_os("FAULTLINE_TEST_PINNED").is_some() {
        assert!(
            pinned,
            "listed in scripts/test.sh's TRANSPORT_PINNED, but {what} leaves the transport to the default (name it, or take the test off the list)"
        );
    }
}

pub struct Serve {
    child: Option<Child>,
    pub dev: PathBuf,
    pub socket: PathBuf,
    pub dir: tempfile::TempDir,
    /// The run directory the server records its ledger and mounts in.
    pub run_root: PathBuf,
}

impl Serve {
    pub fn start(size: &str, rules: &str) -> Serve {
        Self::start_args(&["--size", size], rules)
    }

    /// Over one transport: `ring` is a `--ring` value (`on`: served by one ring thread,
    /// `--ring-threads 1`), or `per-cpu` for one ring per CPU queue (`--ring on
    /// --ring-threads 0`, the default).
    pub fn start_ring(size: &str, ring: &str, rules: &str) -> Serve {
        match ring {
            "per-cpu" => Self::start_args(&["--size", size, "--ring", "on", "--ring-threads", "0"], rules),
            "on" => Self::start_args(&["--size", size, "--ring", "on", "--ring-threads", "1"], rules),
            _ => Self::start_args(&["--size", size, "--ring", ring], rules),
        }
    }

    pub fn start_args(args: &[&str], rules: &str) -> Serve {
        Self::start_at(&run_root(), args, rules)
    }

    /// In a run directory of the test's own, for a test that runs `cleanup` (which must see
    /// only its runs, not those of the tests running beside it).
    pub fn start_in(run: &RunDir, args: &[&str], rules: &str) -> Serve {
        Self::start_at(&run.0, args, rules)
    }

    fn start_at(run_root: &Path, args: &[&str], rules: &str) -> Serve {
        check_pinned(&format!("a disk served with {args:?}"), args.contains(&"--ring"));
        let dir = tempfile::tempdir().unwrap();
        let rules_path = dir.path().join("rules.yaml");
        std::fs::write(&rules_path, rules).unwrap();
        let socket = dir.path().join("ctl.sock");
        let mut child = Command::new(bin())
            .arg("serve")
            .args(args)
            .arg("--rules")
            .arg(&rules_path)
            .arg("--socket")
            .arg(&socket)
            .env("FAULTLINE_RUN_DIR", run_root)
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn faultline serve");
        let stdout = child.stdout.take().unwrap();
        let mut me = Serve { child: Some(child), dev: PathBuf::new(), socket, dir, run_root: run_root.to_owned() };
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        assert!(line.starts_with("/dev/loop"), "first stdout line must be the device, got {line:?}");
        me.dev = PathBuf::from(line.trim());
        me
    }

    pub fn call(&self, req: Value) -> Value {
        faultline::frontend::control::call(&self.socket, &req).unwrap()
    }

    pub fn add(&self, yaml: &str) -> Vec<u64> {
        let v = self.call(json!({"cmd": "add", "rules": yaml}));
        v["ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect()
    }

    pub fn clear(&self) {
        self.call(json!({"cmd": "clear"}));
    }

    pub fn rules(&self) -> Vec<Value> {
        self.call(json!({"cmd": "list"})).as_array().unwrap().clone()
    }

    pub fn log(&self) -> Vec<Value> {
        self.call(json!({"cmd": "log", "since": 0, "max": 1_000_000})).as_array().unwrap().clone()
    }

    pub fn open(&self) -> DirectDev {
        DirectDev::open(&self.dev).unwrap()
    }

    /// SIGTERM, wait, and check that nothing was left behind.
    pub fn stop(mut self) {
        let mut c = self.child.take().unwrap();
        let pid = c.id();
        // SAFETY: kill takes no pointers; our child, not yet waited for (its pid is not reused)
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        let st = c.wait().unwrap();
        assert!(st.success(), "serve exited with {st}");
        assert_gone_in(&self.run_root, &self.dev, pid);
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    pub fn kill9(&mut self) {
        let mut c = self.child.take().unwrap();
        c.kill().unwrap();
        c.wait().unwrap();
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill takes no pointers; our child, not yet waited for (its pid is not reused)
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let _ = c.wait();
        }
    }
}

/// The loop device of serve process `pid` is detached and none of its FUSE mounts remains.
/// Tests run in parallel, so the same /dev/loopN may already serve another process's disk:
/// only a backing file under this process's own mount point counts.
pub fn assert_gone(dev: &Path, pid: u32) {
    assert_gone_in(&run_root(), dev, pid)
}

/// `assert_gone` for a server recording in run directory `root`.
pub fn assert_gone_in(root: &Path, dev: &Path, pid: u32) {
    let name = dev.file_name().unwrap().to_string_lossy().to_string();
    let backing = std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file")).unwrap_or_default();
    let mine = format!("{}/mnt-{pid}-", root.display());
    assert!(!backing.contains(&mine), "{} still attached to {backing}", dev.display());
    assert!(!mounts_in(root).iter().any(|m| m.starts_with(&mine)), "FUSE mount of pid {pid} left behind");
}

/// The FUSE mounts of disks served from `run_root()`.
pub fn faultline_mounts() -> Vec<String> {
    mounts_in(&run_root())
}

/// The FUSE mounts of disks served from run directory `root`.
pub fn mounts_in(root: &Path) -> Vec<String> {
    let prefix = format!("{}/mnt-", root.display());
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .map(|l| l.split(' ').nth(4).unwrap().to_string())
        .filter(|m| m.starts_with(&prefix))
        .collect()
}

/// Write blocks [first, first+n) with content ids = block numbers (or `id_of`).
pub fn write_blocks(d: &DirectDev, first: u64, n: u64, seed: u64, id_of: impl Fn(u64) -> u64) {
    let mut buf = AlignedBuf::new((n * BS) as usize);
    for i in 0..n {
        fill_block(id_of(first + i), seed, &mut buf[(i * BS) as usize..((i + 1) * BS) as usize]);
    }
    d.write_at(&buf, first * BS).unwrap();
}

pub fn read_block(d: &DirectDev, b: u64) -> std::io::Result<Vec<u8>> {
    let mut buf = AlignedBuf::new(BS as usize);
    d.read_at(&mut buf, b * BS)?;
    Ok(buf.to_vec())
}

pub fn expected(id: u64, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; BS as usize];
    fill_block(id, seed, &mut v);
    v
}

pub fn errno(r: std::io::Result<Vec<u8>>) -> Option<i32> {
    r.err().map(|e| e.raw_os_error().unwrap_or(-1))
}

pub fn count(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("no `{key}` in {v}"))
}

pub mod cut;
pub mod lab;

/// True if the program is on PATH.
pub fn which(p: &str) -> bool {
    Command::new("sh").args(["-c", &format!("command -v {p}")]).stdout(Stdio::null()).status().is_ok_and(|s| s.success())
}

/// For a test that builds hosts as network namespaces (faultline's, with a TUN device each, or
/// a lab's) and runs `tools` in them: true if it can, else reports it skipped.
pub fn need_net(tools: &[&str]) -> bool {
    let mut needs = vec![("/dev/net/tun".to_string(), Path::new("/dev/net/tun").exists()), ("ip (iproute2)".to_string(), which("ip"))];
    needs.extend(tools.iter().map(|t| (t.to_string(), which(t))));
    for (what, ok) in needs {
        if !ok {
            skip("", &format!("needs {what}"));
            return false;
        }
    }
    true
}

/// The namespaces `faultline net`/`run` made for process `pid` (`fl-PID-NAME`).
pub fn namespaces_of(pid: u32) -> Vec<String> {
    namespaces_with(&format!("fl-{pid}-"))
}

/// Network namespaces whose name starts with `prefix`.
pub fn namespaces_with(prefix: &str) -> Vec<String> {
    let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| l.split_whitespace().next()).filter(|n| n.starts_with(prefix)).map(String::from).collect()
}

/// A run directory of a test's own (FAULTLINE_RUN_DIR) for the faultline processes it starts,
/// so its `cleanup` never touches other tests' runs on the machine, and their loop devices and
/// mounts are told from other tests'. Dropped (also after a failed assertion): cleaned up, then
/// removed if nothing is left in it. Named `RUN_ROOT-test-unique(tag)`: a sibling of the run
/// root, so a check of what the suite left under its prefix sees it too.
pub struct RunDir(pub PathBuf);

impl RunDir {
    pub fn new(tag: &str) -> RunDir {
        let p = PathBuf::from(format!("{}-test-{}", run_root().display(), unique(tag)));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        RunDir(p)
    }

    /// `faultline ARGS` recording into this run directory.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(bin());
        c.args(args).env("FAULTLINE_RUN_DIR", &self.0);
        c
    }

    /// `faultline run EXPERIMENT --out OUT -q`, its output discarded.
    pub fn spawn_run(&self, experiment: &Path, out: &Path) -> Child {
        self.cmd(&["run"]).arg(experiment).arg("--out").arg(out).arg("-q").stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap()
    }

    /// `faultline run` of `yaml` (written to DIR/exp.yaml, results in DIR/out), which must
    /// succeed.
    pub fn run_ok(&self, dir: &Path, yaml: &str) -> Ran {
        let exp = dir.join("exp.yaml");
        std::fs::write(&exp, yaml).unwrap();
        let out = dir.join("out");
        let child = self.cmd(&["run"]).arg(&exp).arg("--out").arg(&out).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let pid = child.id();
        let o = child.wait_with_output().unwrap();
        let text = format!("{}\n{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        assert!(o.status.success(), "run failed:\n{text}");
        let results = serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
        Ran { pid, results, text, out }
    }

    /// `faultline run` of `yaml` (written to DIR/exp.yaml), which must fail: its stderr.
    pub fn refused(&self, dir: &Path, yaml: &str) -> String {
        let exp = dir.join("exp.yaml");
        std::fs::write(&exp, yaml).unwrap();
        let o = self.cmd(&["run"]).arg(&exp).arg("--out").arg(dir.join("out")).current_dir(dir).output().unwrap();
        assert!(!o.status.success(), "not refused:\n{yaml}");
        String::from_utf8_lossy(&o.stderr).into_owned()
    }

    /// `faultline cleanup` here: what it printed, and how long it took.
    pub fn cleanup(&self) -> (String, std::time::Duration) {
        let t = std::time::Instant::now();
        let out = self.cmd(&["cleanup"]).output().unwrap();
        assert!(out.status.success(), "cleanup failed: {}", String::from_utf8_lossy(&out.stderr));
        (String::from_utf8_lossy(&out.stdout).into_owned(), t.elapsed())
    }

    /// The ledgers of live or dead processes recorded here.
    pub fn ledgers(&self) -> Vec<Value> {
        std::fs::read_dir(self.0.join("runs"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| serde_json::from_str::<Value>(&std::fs::read_to_string(e.path()).ok()?).ok())
            .collect()
    }

    /// What is left of this directory's runs: loop devices over files under it, mounts under
    /// it, ledgers (empty when nothing is).
    pub fn leftovers(&self) -> Vec<String> {
        let me = self.0.to_string_lossy().to_string();
        let loops = Command::new("losetup").arg("-a").output().unwrap();
        let mut left: Vec<String> = String::from_utf8_lossy(&loops.stdout).lines().filter(|l| l.contains(&me)).map(|l| format!("loop device: {l}")).collect();
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        left.extend(info.lines().filter_map(|l| l.split(' ').nth(4)).filter(|m| m.starts_with(&me)).map(|m| format!("mount: {m}")));
        left.extend(std::fs::read_dir(self.0.join("runs")).into_iter().flatten().flatten().map(|e| format!("ledger: {}", e.path().display())));
        left
    }
}

/// A finished `faultline run`: its pid, results.json, stdout and stderr, results directory.
pub struct Ran {
    pub pid: u32,
    pub results: Value,
    pub text: String,
    pub out: PathBuf,
}

impl Drop for RunDir {
    fn drop(&mut self) {
        let _ = self.cmd(&["cleanup"]).output();
        // not recursive: a mount still under it (after a failed test) must not be walked into;
        // a ledger cleanup could not release stays, as the record of what is left
        for e in std::fs::read_dir(&self.0).into_iter().flatten().flatten() {
            if e.file_type().is_ok_and(|t| !t.is_dir()) {
                let _ = std::fs::remove_file(e.path());
            }
        }
        let _ = std::fs::remove_dir(self.0.join("runs"));
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// A loop device over `file` (`losetup -f`), detached when dropped: also when the test fails
/// before its end, so a failed assertion leaves no device behind.
pub struct LoopDev(pub String);

impl LoopDev {
    pub fn attach(file: &Path) -> LoopDev {
        let out = Command::new("losetup").args(["-f", "--show"]).arg(file).output().unwrap();
        let dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert!(dev.starts_with("/dev/loop"), "losetup: {}", String::from_utf8_lossy(&out.stderr));
        LoopDev(dev)
    }
}

impl Drop for LoopDev {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.0).status();
    }
}
