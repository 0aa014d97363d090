//! kill -9 of `faultline run` at several points of an ext4 and a raw experiment (mkfs, the
//! workload, verification): the run's process ends (no thread left waiting for its disk), and
//! `faultline cleanup` then leaves no loop device, mount, FUSE mount, directory or ledger, and
//! puts back the loop device's rq_affinity. Each case uses its own run directory.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

struct Case {
    name: &'static str,
    stack: &'static str,
    /// the phase line to kill on, and how long after it
    on: &'static str,
    after: Duration,
}

fn experiment(dir: &Path, c: &Case) -> PathBuf {
    let workload = if c.stack == "raw" {
        "  pattern: sequential\n  size: 768MiB\n".to_string()
    } else {
        "  interface: file\n  files: 4\n  file_size: 192MiB\n  sync: direct\n  pattern: sequential\n  size: 768MiB\n".to_string()
    };
    // 768 MiB keep the workload and the verification long enough to be killed in; a case
    // killed in verification writes them in large requests, as it need not be killed earlier
    // (4 KiB writes took a minute per case)
    let block_size = if c.on == "verify" { "128KiB" } else { "4KiB" };
    let text = format!(
        "name: {}\ndisk: {{ size: 1GiB, store: ram }}\nstack: {}\nworkload:\n{workload}  mix: {{ write: 100 }}\n  block_size: {block_size}\n  engine: psync\nfaults: []\n",
        c.name, c.stack
    );
    let p = dir.join(format!("{}.yaml", c.name));
    std::fs::write(&p, text).unwrap();
    p
}

/// Ledgers under `run`: (loop devices, rq_affinity found, pids).
fn ledgers(run: &Path) -> (Vec<PathBuf>, Vec<(PathBuf, u8)>, Vec<u32>) {
    let (mut loops, mut rq, mut pids) = (vec![], vec![], vec![]);
    for e in std::fs::read_dir(run.join("runs")).into_iter().flatten().flatten() {
        let Ok(t) = std::fs::read_to_string(e.path()) else { continue };
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&t) else { continue };
        pids.push(v["pid"].as_u64().unwrap() as u32);
        for l in v["loops"].as_array().into_iter().flatten() {
            loops.push(PathBuf::from(l[0].as_str().unwrap()));
        }
        for r in v["rq_affinity"].as_array().into_iter().flatten() {
            rq.push((PathBuf::from(r[0].as_str().unwrap()), r[1].as_u64().unwrap() as u8));
        }
    }
    (loops, rq, pids)
}

/// Running, not a zombie (a zombie's state is Z; init may reap it late).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.rfind(')').is_some_and(|i| !s[i + 2..].starts_with('Z')))
}

fn kill9_then_cleanup(c: Case) {
    let tmp = tempfile::tempdir().unwrap();
    let run = PathBuf::from(format!("{}-kill9test-{}", common::run_root().display(), common::unique(c.name)));
    let _ = std::fs::remove_dir_all(&run);
    std::fs::create_dir_all(&run).unwrap();
    let exp = experiment(tmp.path(), &c);
    let mut child = Command::new(common::bin())
        .args(["run", "--out"])
        .arg(tmp.path().join("out"))
        .arg(&exp)
        .env("FAULTLINE_RUN_DIR", &run)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    loop {
        let mut line = String::new();
        if err.read_line(&mut line).unwrap() == 0 {
            panic!("{}: the run ended before `{}`:\n{seen}", c.name, c.on);
        }
        seen.push_str(&line);
        if line.contains(&format!(": {}", c.on)) {
            break;
        }
    }
    std::thread::sleep(c.after);
    let (loops, rq, pids) = ledgers(&run);
    assert!(!loops.is_empty(), "{}: no loop device recorded at kill time", c.name);
    child.kill().unwrap(); // SIGKILL
    // keep draining stderr so the run's server never blocks on a full pipe
    let drain = std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut err, &mut rest);
        rest
    });
    let t = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "{}: the killed run did not end within 20 s (a thread stuck on its disk?)", c.name);
        std::thread::sleep(Duration::from_millis(20));
    }
    let t = Instant::now();
    let out = Command::new(common::bin()).arg("cleanup").env("FAULTLINE_RUN_DIR", &run).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{}: cleanup failed: {text}{}", c.name, String::from_utf8_lossy(&out.stderr));
    assert!(t.elapsed() < Duration::from_secs(15), "{}: cleanup took {:?}", c.name, t.elapsed());
    let rest = drain.join().unwrap();
    let all = format!("{seen}{rest}\ncleanup:\n{text}");
    // the kill landed in the phase the case names, not after the run had finished it
    assert!(!rest.contains(": done in"), "{}: the run finished `{}` before it was killed\n{all}", c.name, c.on);
    for p in &pids {
        assert!(!running(*p), "{}: process {p} still running after cleanup\n{all}", c.name);
    }
    let me = run.to_string_lossy().to_string();
    let losetup = String::from_utf8_lossy(&Command::new("losetup").arg("-a").output().unwrap().stdout).to_string();
    assert!(!losetup.contains(&me), "{}: loop device left: {losetup}\n{all}", c.name);
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!info.contains(&me), "{}: mount left under {me}\n{all}", c.name);
    let left: Vec<_> = std::fs::read_dir(&run).unwrap().flatten().map(|e| e.file_name()).filter(|n| n != "runs" && n != "fuse-uring.lock").collect();
    assert!(left.is_empty(), "{}: left in {me}: {left:?}\n{all}", c.name);
    let ledgers_left = std::fs::read_dir(run.join("runs")).map(|r| r.count()).unwrap_or(0);
    assert_eq!(ledgers_left, 0, "{}: ledgers left\n{all}", c.name);
    for (dev, v) in rq {
        let now = faultline::sys::loopdev::rq_affinity(&dev).unwrap();
        assert_eq!(now, v, "{}: rq_affinity of {} not put back\n{all}", c.name, dev.display());
    }
    let _ = std::fs::remove_dir_all(&run);
}

#[test]
fn kill9_during_ext4_mkfs() {
    // -c: mkfs reads the whole device for bad blocks first, long enough to be killed in
    kill9_then_cleanup(Case { name: "ext4-mkfs", stack: "{ fs: ext4, mkfs: [\"-c\"] }", on: "build", after: Duration::from_millis(700) });
}

#[test]
fn kill9_during_ext4_workload() {
    kill9_then_cleanup(Case { name: "ext4-workload", stack: "ext4", on: "workload", after: Duration::from_millis(1500) });
}

#[test]
fn kill9_during_ext4_verify() {
    kill9_then_cleanup(Case { name: "ext4-verify", stack: "ext4", on: "verify", after: Duration::from_millis(150) });
}

#[test]
fn kill9_during_raw_workload() {
    kill9_then_cleanup(Case { name: "raw-workload", stack: "raw", on: "workload", after: Duration::from_millis(1000) });
}

#[test]
fn kill9_during_raw_verify() {
    kill9_then_cleanup(Case { name: "raw-verify", stack: "raw", on: "verify", after: Duration::from_millis(100) });
}
