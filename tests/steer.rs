//! Completion steering (`serve --rq-affinity`, frontend/steer.rs): the loop device's
//! queue/rq_affinity is 2 while requests come one at a time and the device's own value while
//! they overlap, and the value found is put back at teardown and by `cleanup` after kill -9.

mod common;
use common::*;
use std::path::Path;
use std::sync::Mutex;

/// Both tests predict which loop device serve will take: one at a time.
static TURN: Mutex<()> = Mutex::new(());

fn rq_affinity(dev: &Path) -> String {
    let name = dev.file_name().unwrap().to_string_lossy().to_string();
    std::fs::read_to_string(format!("/sys/block/{name}/queue/rq_affinity")).unwrap().trim().to_string()
}

/// The next free loop device starts at 1 (not 2, so forcing can be told from the device's own
/// value); its value is put back when the guard drops.
struct NextLoop {
    dev: std::path::PathBuf,
    was: String,
}

impl NextLoop {
    fn prepare() -> NextLoop {
        let out = std::process::Command::new("losetup").arg("-f").output().unwrap();
        let dev = std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        let name = dev.file_name().unwrap().to_string_lossy().to_string();
        // a free loop device node may not exist yet (losetup creates it on attach)
        let was = std::fs::read_to_string(format!("/sys/block/{name}/queue/rq_affinity")).map(|s| s.trim().to_string()).unwrap_or_default();
        if was == "2" {
            std::fs::write(format!("/sys/block/{name}/queue/rq_affinity"), "1").unwrap();
        }
        NextLoop { dev, was }
    }
}

impl Drop for NextLoop {
    fn drop(&mut self) {
        if self.was == "2" {
            let name = self.dev.file_name().unwrap().to_string_lossy().to_string();
            let _ = std::fs::write(format!("/sys/block/{name}/queue/rq_affinity"), "2");
        }
    }
}

/// The value the run found on its loop device, as its ledger recorded it.
fn recorded(run_dir: &Path, pid: u32, dev: &Path) -> String {
    let l: serde_json::Value = serde_json::from_slice(&std::fs::read(run_dir.join(format!("runs/{pid}-0.json"))).unwrap()).unwrap();
    let e = l["rq_affinity"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e[0].as_str() == Some(&dev.to_string_lossy()))
        .expect("the ledger records the device's rq_affinity");
    let v = e[1].as_u64().unwrap().to_string();
    assert_ne!(v, "2", "{} started at 2: something else changed it; forcing cannot be observed", dev.display());
    v
}

fn serial_reads(s: &Serve, n: u64) {
    let d = s.open();
    for b in 0..n {
        read_block(&d, b % 256).unwrap();
    }
}

/// Serial reads until the device is forced to 2 (checked every 50), at most 2,000. A stray
/// overlap restarts the daemon's serial count: udev probing a fresh device, or, on the
/// classic path, the next request reaching the second FUSE thread a moment before the first
/// has dropped the previous one's guard.
fn serial_reads_until_forced(s: &Serve, dev: &Path) -> bool {
    for _ in 0..40 {
        serial_reads(s, 50);
        if rq_affinity(dev) == "2" {
            return true;
        }
    }
    false
}

/// A deep queue: fio, 32 random reads in flight for half a second. (A few synchronous clients
/// are not enough over the ring: its one thread serves each request as it comes, so it may
/// still see them one at a time, and then forcing is what it should do.)
fn overlapping_reads(s: &Serve) {
    let out = std::process::Command::new("fio")
        .args(["--name=qd32", "--rw=randread", "--bs=4k", "--ioengine=libaio", "--iodepth=32", "--direct=1", "--size=32M", "--runtime=0.5", "--time_based"])
        .arg(format!("--filename={}", s.dev.display()))
        .output()
        .expect("run fio");
    assert!(out.status.success(), "fio failed: {}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn auto_forces_while_serial_and_puts_the_value_back() {
    if !need_ring() {
        return;
    }
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let _next = NextLoop::prepare();
    let s = Serve::start_args(&["--size", "64MiB", "--ring", "on"], "rules: []\n");
    let dev = s.dev.clone();
    let own = recorded(&s.run_root, s.pid(), &dev);
    assert!(serial_reads_until_forced(&s, &dev), "not forced after 2,000 serial reads");
    overlapping_reads(&s);
    assert_eq!(rq_affinity(&dev), own, "still forced after reads at queue depth 32");
    assert!(serial_reads_until_forced(&s, &dev), "not forced again after 2,000 serial reads");
    s.stop();
    assert_eq!(rq_affinity(&dev), own, "teardown did not put the device's value back");
}

/// The classic path has no reliable overlap signal: `auto` leaves the device alone there, both
/// when asked for (`--ring off`) and when `--ring auto` ends up on it (a kernel without the
/// ring, or FAULTLINE_RING=off).
#[test]
fn auto_leaves_the_device_alone_on_the_classic_path() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let mut rings = vec!["off"];
    if ring_unavailable().is_some() {
        rings.push("auto");
    }
    for ring in rings {
        let _next = NextLoop::prepare();
        let s = Serve::start_args(&["--size", "64MiB", "--ring", ring], "rules: []\n");
        let before = rq_affinity(&s.dev);
        serial_reads(&s, 200);
        assert_eq!(rq_affinity(&s.dev), before, "--ring {ring}: auto changed the device");
        s.stop();
    }
}

#[test]
fn keep_never_touches_it_and_cleanup_restores_a_fixed_value() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let _next = NextLoop::prepare();
    let s = Serve::start_args(&["--size", "64MiB", "--rq-affinity", "keep"], "rules: []\n");
    let before = rq_affinity(&s.dev);
    serial_reads(&s, 100);
    assert_eq!(rq_affinity(&s.dev), before, "--rq-affinity keep changed the device");
    s.stop();

    let _next = NextLoop::prepare();
    let run = RunDir::new("rqaff");
    let mut s = Serve::start_in(&run, &["--size", "64MiB", "--rq-affinity", "2"], "rules: []\n");
    let (dev, pid) = (s.dev.clone(), s.pid());
    let own = recorded(&run.0, pid, &dev);
    assert_eq!(rq_affinity(&dev), "2", "--rq-affinity 2 not applied");
    s.kill9();
    let (text, _) = run.cleanup();
    assert!(text.contains(&format!("restored rq_affinity {own} on {}", dev.display())), "{text}");
    assert_eq!(rq_affinity(&dev), own, "cleanup did not put the device's value back");
    assert_gone_in(&run.0, &dev, pid);
}
