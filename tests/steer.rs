//! Completion steering (`serve --rq-affinity`, frontend/steer.rs): the loop device's
//! queue/rq_affinity is 2 while requests come one at a time and the device's own value while
//! they overlap, and the value found is put back at teardown and by `cleanup` after kill -9.

mod common;
use common::*;
use faultline::workload::direct::AlignedBuf;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

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
fn recorded(pid: u32, dev: &Path) -> String {
    let l: serde_json::Value = serde_json::from_slice(&std::fs::read(format!("/run/faultline/runs/{pid}-0.json")).unwrap()).unwrap();
    let e = l["rq_affinity"].as_array().unwrap().iter().find(|e| e[0].as_str() == Some(&dev.to_string_lossy())).expect("the ledger records the device's rq_affinity");
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

/// Four clients reading at once for a while, all stopping together (a lone straggler would
/// make a serial run of its own).
fn overlapping_reads(s: &Serve) {
    let stop = AtomicBool::new(false);
    std::thread::scope(|sc| {
        for t in 0..4u64 {
            let (stop, dev) = (&stop, &s.dev);
            sc.spawn(move || {
                let d = faultline::workload::direct::DirectDev::open(dev).unwrap();
                let mut buf = AlignedBuf::new(BS as usize);
                let mut b = t;
                while !stop.load(Ordering::Relaxed) {
                    d.read_at(&mut buf, (b % 256) * BS).unwrap();
                    b += 4;
                }
            });
        }
        std::thread::sleep(std::time::Duration::from_millis(300));
        stop.store(true, Ordering::Relaxed);
    });
}

#[test]
fn auto_forces_while_serial_and_puts_the_value_back() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    for ring in ["on", "off"] {
        let _next = NextLoop::prepare();
        let s = Serve::start_args(&["--size", "64MiB", "--ring", ring], "rules: []\n");
        let dev = s.dev.clone();
        let own = recorded(s.pid(), &dev);
        serial_reads(&s, 100);
        assert_eq!(rq_affinity(&dev), "2", "--ring {ring}: not forced after 100 serial reads");
        overlapping_reads(&s);
        assert_eq!(rq_affinity(&dev), own, "--ring {ring}: still forced after overlapping reads");
        serial_reads(&s, 100);
        assert_eq!(rq_affinity(&dev), "2", "--ring {ring}: not forced again after serial reads");
        s.stop();
        assert_eq!(rq_affinity(&dev), own, "--ring {ring}: teardown did not put the device's value back");
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
    let mut s = Serve::start_args(&["--size", "64MiB", "--rq-affinity", "2"], "rules: []\n");
    let (dev, pid) = (s.dev.clone(), s.pid());
    let own = recorded(pid, &dev);
    assert_eq!(rq_affinity(&dev), "2", "--rq-affinity 2 not applied");
    s.kill9();
    let out = std::process::Command::new(bin()).arg("cleanup").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&format!("restored rq_affinity {own} on {}", dev.display())), "{text}");
    assert_eq!(rq_affinity(&dev), own, "cleanup did not put the device's value back");
    assert_gone(&dev, pid);
}
