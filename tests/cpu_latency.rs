//! CPU wake-up latency (`serve --cpu-latency`, frontend/cpu_latency.rs): the machine's limit
//! (/dev/cpu_dma_latency) is 0 while the disk has requests or a reply is still due, back to
//! what it was soon after; `hold` keeps it for the disk's life, and nothing is left after
//! kill -9; `keep` never asks.

mod common;
use common::*;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The limit is machine-wide: one test at a time.
static TURN: Mutex<()> = Mutex::new(());

/// The machine's current CPU latency limit (µs).
fn limit() -> i32 {
    faultline::frontend::cpu_latency::current_limit().unwrap()
}

/// The limit with no faultline disk asking: must not be 0, or a hold cannot be told apart.
fn baseline() -> i32 {
    let v = limit();
    assert_ne!(v, 0, "something else on this machine holds a 0 us CPU latency request (tuned? a benchmark?): a hold cannot be observed");
    v
}

fn becomes(want: i32, within: Duration) -> bool {
    let end = Instant::now() + within;
    while Instant::now() < end {
        if limit() == want {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    limit() == want
}

/// Serial 4 KiB reads on another thread while `f` runs.
fn while_reading<T>(s: &Serve, f: impl FnOnce() -> T) -> T {
    let stop = AtomicBool::new(false);
    let d = s.open();
    std::thread::scope(|sc| {
        let reader = sc.spawn(|| {
            let mut b = 0;
            while !stop.load(Ordering::Relaxed) {
                read_block(&d, b % 256).unwrap();
                b += 1;
            }
            b
        });
        std::thread::sleep(Duration::from_millis(100));
        let out = f();
        stop.store(true, Ordering::Relaxed);
        assert!(reader.join().unwrap() > 0);
        out
    })
}

#[test]
fn auto_holds_while_requests_come_or_a_reply_is_due() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let base = baseline();
    for ring in transports() {
        let s = Serve::start_args(&["--size", "64MiB", "--ring", ring], "rules: []\n");
        // start-up's own requests (udev probing the new device) end: released
        assert!(becomes(base, Duration::from_secs(2)), "--ring {ring}: still held 2 s after start-up");
        // the reader's first requests may take a moment to come (a fresh device): once the
        // hold is on, it must stay on for as long as the client reads
        let (on, held): (bool, Vec<i32>) = while_reading(&s, || {
            let on = becomes(0, Duration::from_secs(1));
            let held = (0..10)
                .map(|_| {
                    std::thread::sleep(Duration::from_millis(20));
                    limit()
                })
                .collect();
            (on, held)
        });
        assert!(on, "--ring {ring}: not held within 1 s of a client's reads");
        assert!(held.iter().all(|&v| v == 0), "--ring {ring}: not held while a client reads: {held:?}");
        assert!(becomes(base, Duration::from_millis(500)), "--ring {ring}: still held 0.5 s after the last request");

        // one read delayed 400 ms: no new request comes, but its reply is due, so the limit
        // stays held (the delayed reply's own wake-up is one the hold is for)
        s.add("rules:\n  - {type: delay, op: read, delay: 400ms, target: {block: 7}}\n");
        let d = s.open();
        std::thread::scope(|sc| {
            let r = sc.spawn(|| read_block(&d, 7).unwrap());
            std::thread::sleep(Duration::from_millis(200));
            assert_eq!(limit(), 0, "--ring {ring}: released while a delayed reply was due");
            r.join().unwrap();
        });
        drop(d);
        assert!(becomes(base, Duration::from_millis(500)), "--ring {ring}: still held after the delayed reply");
        s.stop();
        assert_eq!(limit(), base, "--ring {ring}: teardown left a request");
    }
}

#[test]
fn hold_lasts_the_disk_life_keep_never_asks() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let base = baseline();
    let run = RunDir::new("hold");
    let mut s = Serve::start_in(&run, &["--size", "64MiB", "--cpu-latency", "hold"], "rules: []\n");
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(limit(), 0, "--cpu-latency hold: not held while idle");
    let (dev, pid) = (s.dev.clone(), s.pid());
    // the request belongs to the process's open file: the kernel drops it with the process
    s.kill9();
    assert!(becomes(base, Duration::from_secs(2)), "--cpu-latency hold: the request outlived kill -9");
    run.cleanup();
    assert_gone_in(&run.0, &dev, pid);

    let s = Serve::start_args(&["--size", "64MiB", "--cpu-latency", "keep"], "rules: []\n");
    let seen: Vec<i32> = while_reading(&s, || {
        (0..10)
            .map(|_| {
                std::thread::sleep(Duration::from_millis(20));
                limit()
            })
            .collect()
    });
    assert!(seen.iter().all(|&v| v == base), "--cpu-latency keep: the limit changed while a client read: {seen:?}");
    s.stop();
}

/// In a private mount namespace where /dev/cpu_dma_latency is a read-only file: `auto` serves
/// without it and says why; `hold` fails, naming the file.
#[test]
fn auto_serves_without_the_device_hold_fails() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("fake");
    std::fs::write(&fake, b"").unwrap();
    let shell = |args: &str| {
        let script = format!(
            "mount --bind {f} /dev/cpu_dma_latency && mount -o remount,bind,ro /dev/cpu_dma_latency && exec {bin} serve --size 64MiB --socket {dir}/s.sock {args}",
            f = fake.display(),
            bin = bin(),
            dir = dir.path().display()
        );
        let mut c = Command::new("unshare");
        c.args(["-m", "--propagation", "private", "sh", "-c", &script]);
        c
    };
    let out = shell("--cpu-latency hold").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("/dev/cpu_dma_latency") && err.contains("keep"), "{err}");

    let mut child = shell("").stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert!(line.starts_with("/dev/loop"), "serve did not start: {line:?}");
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut start = String::new();
    while !start.contains("serving") && err.read_line(&mut start).unwrap() > 0 {}
    assert!(start.contains("cpu latency auto (unavailable: cannot open /dev/cpu_dma_latency"), "{start}");
    // SAFETY: kill takes no pointers; our child, not yet waited for (its pid is not reused)
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert!(child.wait().unwrap().success(), "serve without /dev/cpu_dma_latency did not tear down cleanly");
}
