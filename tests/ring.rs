//! The two transports, FUSE over io_uring (`--ring on`, the default where the kernel has it)
//! and classic /dev/fuse reads (`--ring off`): the same bytes and the same faults through the
//! real device, and the kernel's io_uring switch left as it was found.

mod common;
use common::*;
use faultline::workload::direct::AlignedBuf;
use std::io::{BufRead, BufReader};
use std::os::fd::AsRawFd;
use std::process::{Command, Stdio};
use std::time::Instant;

/// Names of the serve process's threads.
fn threads(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|s| s.trim().to_string())
        .collect()
}

const RULES: &str = "rules:
  - {type: bitflip, op: read, target: {block: 7}}
  - {type: error, errno: EIO, op: read, target: {block: 9}}
  - {type: delay, op: read, delay: 3ms, target: {block: 11}}
  - {type: bitflip, op: write, target: {block: 13}}
";

/// What the client saw of each block: (block, errno, bytes).
type Seen = Vec<(u64, Option<i32>, Vec<u8>)>;

/// Everything a request can carry, through one transport; returns what the client saw.
fn exercise(ring: &str) -> Seen {
    // and a content rule: writes of block 15's bytes are flipped (hashed after the reply over
    // the ring, Disk::write_then_copied; before it on the classic path)
    let h15 = faultline::content::hash_hex(faultline::content::block_hash(&expected(15, 3)));
    let rules = format!("{RULES}  - {{type: bitflip, op: write, target: {{hash: \"{h15}\"}}}}\n");
    let s = Serve::start_ring("64MiB", ring, &rules);
    let ring_threads: Vec<String> = threads(s.pid()).into_iter().filter(|t| t.starts_with("faultline-ring")).collect();
    let want = match ring {
        "on" => vec!["faultline-ring".to_string()],
        // one per CPU queue (possible CPUs), named by their queue
        "per-cpu" => (0..possible_cpus()).map(|q| format!("faultline-ring{q}")).collect(),
        _ => vec![],
    };
    let mut got = ring_threads.clone();
    got.sort();
    assert_eq!(got, want, "--ring {ring}: ring threads");
    let d = s.open();
    write_blocks(&d, 0, 32, 3, |b| b);
    // a 1 MiB request: the largest the kernel sends, the whole payload buffer of an entry
    let mut big = AlignedBuf::new(1 << 20);
    for (i, c) in big.chunks_mut(BS as usize).enumerate() {
        faultline::content::fill_block(1000 + i as u64, 3, c);
    }
    d.write_at(&big, 4 << 20).unwrap();
    let mut back = AlignedBuf::new(1 << 20);
    d.read_at(&mut back, 4 << 20).unwrap();
    assert!(back[..] == big[..], "--ring {ring}: a 1 MiB write did not read back");

    let mut seen = Vec::new();
    for b in 0..16 {
        let t = Instant::now();
        let r = read_block(&d, b);
        if b == 11 {
            assert!(t.elapsed().as_micros() >= 3000, "--ring {ring}: delay not applied ({:?})", t.elapsed());
        }
        let e = r.as_ref().err().map(|e| e.raw_os_error().unwrap_or(-1));
        seen.push((b, e, r.unwrap_or_default()));
    }
    // fsync of the block device reaches the daemon as FSYNC of the loop's file
    d.sync().unwrap_or_else(|e| panic!("--ring {ring}: fsync failed: {e}"));
    drop(d);
    s.stop();
    seen
}

fn possible_cpus() -> usize {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap();
    s.trim().split(',').map(|p| p.rsplit('-').next().unwrap().parse::<usize>().unwrap() + 1).max().unwrap()
}

#[test]
fn both_transports_serve_the_same_bytes_and_faults() {
    let mut ways = transports();
    // the ring served by one thread per CPU queue as well
    if ways.contains(&"on") {
        ways.insert(1, "per-cpu");
    }
    let seen: Vec<(&str, Seen)> = ways.into_iter().map(|ring| (ring, exercise(ring))).collect();
    for (ring, blocks) in &seen {
        for (b, e, d) in blocks {
            match b {
                9 => assert_eq!(*e, Some(libc::EIO), "--ring {ring}: block 9 must fail with EIO"),
                7 | 13 | 15 => {
                    assert_eq!(*e, None, "--ring {ring}: block {b} failed");
                    let want = expected(*b, 3);
                    let diff: Vec<usize> = (0..want.len()).filter(|&i| want[i] != d[i]).collect();
                    assert_eq!(diff, vec![0], "--ring {ring}: block {b}: exactly the first byte flipped");
                    assert_eq!(want[0] ^ d[0], 1, "--ring {ring}: block {b}: the lowest bit");
                }
                _ => assert!(e.is_none() && d == &expected(*b, 3), "--ring {ring}: block {b} corrupted or failed ({e:?})"),
            }
        }
    }
    // and all agree request by request with the classic path, where they ran
    let (classic_name, classic) = seen.last().expect("the classic path always runs");
    for (ring, blocks) in &seen[..seen.len() - 1] {
        for ((b, e1, d1), (_, e2, d2)) in blocks.iter().zip(classic) {
            assert_eq!(e1, e2, "block {b}: errno over --ring {ring} {e1:?}, --ring {classic_name} {e2:?}");
            assert!(d1 == d2, "block {b}: different bytes over --ring {ring} and --ring {classic_name}");
        }
    }
}

/// The kernel's switch (a module parameter) read under faultline's own lock, so no other
/// faultline process is between turning it on and putting it back.
fn switch_state() -> String {
    let lock = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open("/run/faultline/fuse-uring.lock").unwrap();
    // SAFETY: flock on an fd this test holds open
    assert_eq!(unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) }, 0);
    std::fs::read_to_string("/sys/module/fuse/parameters/enable_uring").unwrap().trim().to_string()
}

#[test]
fn switch_is_put_back_and_the_ring_keeps_working() {
    if !need_ring() {
        return;
    }
    std::fs::create_dir_all("/run/faultline").unwrap();
    let before = switch_state();
    let s = Serve::start_args(&["--size", "64MiB", "--ring", "on"], "rules: []\n");
    assert_eq!(switch_state(), before, "enable_uring changed while the disk runs");
    // requests still travel over the ring with the switch back as it was
    let d = s.open();
    write_blocks(&d, 0, 64, 9, |b| b);
    for b in 0..64 {
        assert_eq!(read_block(&d, b).unwrap(), expected(b, 9), "block {b}");
    }
    drop(d);
    s.stop();
    assert_eq!(switch_state(), before);
}

/// The switch's lock is one path for the machine: a serve process with a run directory of its
/// own (FAULTLINE_RUN_DIR) still waits for it before touching the switch.
#[test]
fn switch_lock_ignores_the_run_directory() {
    use std::io::BufRead;
    use std::time::Duration;
    if !std::path::Path::new("/sys/module/fuse/parameters/enable_uring").exists() || std::env::var("FAULTLINE_RING").is_ok_and(|v| v == "off") {
        eprintln!("SKIPPED: switch_lock_ignores_the_run_directory: needs FUSE over io_uring");
        return;
    }
    std::fs::create_dir_all("/run/faultline").unwrap();
    let run = tempfile::tempdir().unwrap();
    let lock = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open("/run/faultline/fuse-uring.lock").unwrap();
    // SAFETY: flock on an fd this test owns
    assert_eq!(unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) }, 0);
    let mut child = std::process::Command::new(bin())
        .args(["serve", "--size", "64MiB", "--ring", "on", "--socket"])
        .arg(run.path().join("ctl.sock"))
        .env("FAULTLINE_RUN_DIR", run.path())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::BufReader::new(out).read_line(&mut line);
        let _ = tx.send(line);
    });
    let early = rx.recv_timeout(Duration::from_millis(1500));
    drop(lock);
    let line = early.clone().or_else(|_| rx.recv_timeout(Duration::from_secs(30)));
    // SAFETY: signals our own child
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let st = child.wait().unwrap();
    assert!(early.is_err(), "the disk came up while another process held the switch's lock: {early:?}");
    let line = line.expect("the disk came up once the lock was free");
    assert!(line.starts_with("/dev/loop"), "{line:?}");
    assert!(st.success(), "serve exited with {st}");
    assert!(!run.path().join("fuse-uring.lock").exists(), "a lock file in the run directory");
}

#[test]
fn bad_ring_value_is_refused() {
    let out = std::process::Command::new(bin()).args(["serve", "--size", "64MiB", "--ring", "fast"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("'fast'") && err.contains("possible values: auto, on, off"), "{err}");
}

/// `FAULTLINE_RING=off` makes the machine look like one whose kernel lacks FUSE over io_uring:
/// `--ring on` fails naming the variable, `auto` serves over /dev/fuse and says why, and a
/// value it does not know is refused rather than ignored.
#[test]
fn faultline_ring_off_looks_like_a_kernel_without_it() {
    let dir = tempfile::tempdir().unwrap();
    let serve = |val: &str, ring: &str| {
        let mut c = Command::new(bin());
        c.env("FAULTLINE_RING", val).args(["serve", "--size", "64MiB", "--ring", ring, "--socket"]).arg(dir.path().join("s.sock"));
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        c
    };
    let out = serve("off", "on").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "--ring on served with FAULTLINE_RING=off");
    assert!(err.contains("ring: on") && err.contains("FAULTLINE_RING=off"), "{err}");
    let out = serve("of", "auto").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("FAULTLINE_RING=of is not understood"), "{err}");

    let mut child = serve("off", "auto").spawn().unwrap();
    let pid = child.id();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert!(line.starts_with("/dev/loop"), "serve did not start: {line:?}");
    let dev = std::path::PathBuf::from(line.trim());
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut start = String::new();
    while !start.contains("serving") && err.read_line(&mut start).unwrap() > 0 {}
    assert!(start.contains("requests over /dev/fuse (no io_uring: turned off by FAULTLINE_RING=off)"), "{start}");
    assert!(!threads(pid).iter().any(|t| t.starts_with("faultline-ring")), "a ring thread runs with FAULTLINE_RING=off");
    let d = faultline::workload::direct::DirectDev::open(&dev).unwrap();
    write_blocks(&d, 0, 8, 4, |b| b);
    assert_eq!(read_block(&d, 5).unwrap(), expected(5, 4));
    drop(d);
    // SAFETY: kill takes no pointers; the pid is the child this test started
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    assert!(child.wait().unwrap().success(), "serve with FAULTLINE_RING=off did not tear down cleanly");
    assert_gone(&dev, pid);
}
