//! A panic on the request path never leaves a request unanswered (frontend/guard.rs): with the
//! test-only `FAULTLINE_TEST_PANIC_AT=BYTE`, every read or write covering that byte panics in
//! the disk. Over each transport the request must fail promptly (EIO through the loop device;
//! over NBD the connection ends and the client gets an error), the daemon must say so on
//! stderr, keep serving every other request (and the same block again), and tear down cleanly.

mod common;
use common::*;
use faultline::workload::direct::DirectDev;
use serde_json::json;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The block whose byte 17 panics.
const PANIC_BLOCK: u64 = 100;
/// A request that is answered at all is answered well within this.
const PROMPT: Duration = Duration::from_secs(10);

/// A `faultline serve` child with the panic armed; `first` is its first stdout line (the loop
/// device, or the NBD URI with `--no-loop`).
struct Panicky {
    child: Option<Child>,
    first: String,
    stderr: PathBuf,
    dir: tempfile::TempDir,
}

impl Panicky {
    fn start(args: &[&str]) -> Panicky {
        let dir = tempfile::tempdir().unwrap();
        let stderr = dir.path().join("stderr");
        let args: Vec<String> = args.iter().map(|a| a.replace("DIR", &dir.path().display().to_string())).collect();
        let mut child = Command::new(bin())
            .args(["serve", "--size", "16MiB"])
            .args(&args)
            .arg("--socket")
            .arg(dir.path().join("ctl.sock"))
            .env("FAULTLINE_TEST_PANIC_AT", (PANIC_BLOCK * BS + 17).to_string())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .expect("spawn faultline serve");
        let mut first = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
        let first = first.trim().to_string();
        assert!(!first.is_empty(), "serve printed nothing: {}", std::fs::read_to_string(&stderr).unwrap_or_default());
        Panicky { child: Some(child), first, stderr, dir }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    fn stats(&self) -> serde_json::Value {
        faultline::frontend::control::call(&self.dir.path().join("ctl.sock"), &json!({"cmd": "stats"})).unwrap()
    }

    /// SIGTERM; the server must exit successfully within `PROMPT` (no request left hanging
    /// holds it), leaving nothing behind.
    fn stop(mut self) -> String {
        let mut c = self.child.take().unwrap();
        let pid = c.id();
        // SAFETY: kill takes no pointers; our child, not yet waited for (its pid is not reused)
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        let t = Instant::now();
        let st = loop {
            if let Some(st) = c.try_wait().unwrap() {
                break st;
            }
            assert!(t.elapsed() < Duration::from_secs(30), "serve did not exit 30 s after SIGTERM: {}", self.stderr());
            std::thread::sleep(Duration::from_millis(20));
        };
        let err = self.stderr();
        assert!(st.success(), "serve exited with {st}: {err}");
        if self.first.starts_with("/dev/loop") {
            assert_gone(Path::new(&self.first), pid);
        }
        err
    }
}

impl Drop for Panicky {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: as in `stop`
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let _ = c.wait();
        }
    }
}

/// Run `cmd`, failing the test if it has not finished within `PROMPT` (a request left
/// unanswered holds it in D state: it is left behind, but the test says why).
fn within_prompt(cmd: &mut Command) -> Output {
    let t = Instant::now();
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    while child.try_wait().unwrap().is_none() {
        assert!(t.elapsed() < PROMPT, "{cmd:?} got no answer within {PROMPT:?}: a request was left unanswered");
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

fn dd(dev: &str, block: u64, write: bool) -> Output {
    let (from, to, at, flag) = if write {
        ("if=/dev/urandom".to_string(), format!("of={dev}"), format!("seek={block}"), "oflag=direct")
    } else {
        (format!("if={dev}"), "of=/dev/null".to_string(), format!("skip={block}"), "iflag=direct")
    };
    within_prompt(Command::new("dd").args([from, to, at, "bs=4096".into(), "count=1".into(), flag.into(), "status=none".into()]))
}

fn assert_eio(o: &Output, what: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("Input/output error"), "{what}: want EIO, got {} / {err}", o.status);
}

/// Over the loop device (FUSE over io_uring, or classic /dev/fuse): the panicking read and
/// write fail with EIO, twice (the serving thread survived the first), the blocks beside it
/// are written and read back, and the daemon says what panicked.
fn loop_device(ring: &str) {
    // one ring thread: if a panic took it down, the next request would never be answered
    let args: &[&str] = if ring == "off" { &["--ring", "off"] } else { &["--ring", "on", "--ring-threads", "1"] };
    let s = Panicky::start(args);
    assert!(s.first.starts_with("/dev/loop"), "first line is the device: {}", s.first);
    for round in 0..2 {
        assert_eio(&dd(&s.first, PANIC_BLOCK, false), &format!("read of the panicking block, round {round}"));
        assert_eio(&dd(&s.first, PANIC_BLOCK, true), &format!("write of the panicking block, round {round}"));
    }
    let d = DirectDev::open(Path::new(&s.first)).unwrap();
    write_blocks(&d, PANIC_BLOCK - 4, 4, 3, |b| b);
    write_blocks(&d, PANIC_BLOCK + 1, 4, 3, |b| b);
    for b in (PANIC_BLOCK - 4..PANIC_BLOCK).chain(PANIC_BLOCK + 1..PANIC_BLOCK + 5) {
        assert_eq!(read_block(&d, b).unwrap(), expected(b, 3), "block {b} after the panics");
    }
    drop(d);
    let err = s.stop();
    let said = err.lines().filter(|l| l.contains("panicked (FAULTLINE_TEST_PANIC_AT=") && l.contains("answered with EIO")).count();
    assert!(said >= 4, "the daemon says each panicked request and its answer (said {said}): {err}");
}

#[test]
fn request_panic_ring() {
    if need_ring() {
        loop_device("on");
    }
}

#[test]
fn request_panic_classic() {
    loop_device("off");
}

/// nbdsh runs `python3 -m nbd` from PATH: the system python has the bindings.
fn nbdsh(uri: &str, script: &str) -> String {
    let path = format!("/usr/bin:{}", std::env::var("PATH").unwrap_or_default());
    let o = within_prompt(Command::new("nbdsh").env("PATH", path).args(["-u", uri, "-c", script]));
    assert!(o.status.success(), "nbdsh: {}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

/// Over NBD: the panicking request ends its connection, so the client gets an error at once
/// (for it and every request in flight with it); new connections are served, and the
/// server's counters show nothing left in flight.
#[test]
fn request_panic_nbd() {
    if !which("nbdsh") {
        return skip("", "needs nbdsh (libnbd-bin)");
    }
    let s = Panicky::start(&["--no-loop", "--nbd", "unix:DIR/nbd.sock"]);
    let at = PANIC_BLOCK * BS;
    for op in [format!("h.pread(4096, {at})"), format!("h.pwrite(b'x' * 4096, {at})")] {
        let script = format!("try:\n    {op}\n    print('answered')\nexcept nbd.Error as e:\n    print('error', e)\n");
        let out = nbdsh(&s.first, &script);
        assert!(out.starts_with("error"), "{op}: want an error, got {out:?}");
    }
    let script =
        format!("h.pwrite(b'\\x5a' * 8192, {})\nassert h.pread(8192, {}) == b'\\x5a' * 8192\nprint('ok')\n", (PANIC_BLOCK + 1) * BS, (PANIC_BLOCK + 1) * BS);
    assert_eq!(nbdsh(&s.first, &script).trim(), "ok", "a new connection is served after the panics");
    assert_eq!(s.stats()["nbd_server"]["in_flight"], 0, "a panicked request still counted in flight");
    let err = s.stop();
    let said = err.lines().filter(|l| l.contains("panicked (FAULTLINE_TEST_PANIC_AT=") && l.contains("the connection is closed")).count();
    assert_eq!(said, 2, "the daemon says each panicked request and its answer: {err}");
}
