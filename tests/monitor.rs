//! The BPF monitor (docs/monitor.md) against ground truth on a served disk: fio's own counts,
//! the daemon's request counters, and a known delay rule.

mod common;
use common::*;
use faultline::monitor::MonitorResults;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// `faultline monitor` on one device until stopped.
struct Monitor {
    child: Child,
    out: tempfile::TempDir,
}

impl Monitor {
    /// Started and attached, or None (reported skipped) where BPF is not permitted.
    fn start(dev: &std::path::Path) -> Option<Monitor> {
        let out = tempfile::tempdir().unwrap();
        let mut child = Command::new(bin())
            .args(["monitor", "--device"])
            .arg(dev)
            .arg("--out")
            .arg(out.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn faultline monitor");
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
        if !line.starts_with("monitoring ") {
            let o = child.wait_with_output().unwrap();
            let err = String::from_utf8_lossy(&o.stderr).to_string();
            if err.contains("not permitted") {
                skip("", &format!("BPF not permitted here: {err}"));
                return None;
            }
            panic!("faultline monitor did not start: {line}{err}");
        }
        Some(Monitor { child, out })
    }

    /// SIGINT, then its monitor.json.
    fn stop(self) -> MonitorResults {
        // SAFETY: kill(2) on our own child's pid; no memory is involved.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let o = self.child.wait_with_output().unwrap();
        assert!(o.status.success(), "monitor failed: {}", String::from_utf8_lossy(&o.stderr));
        let text = std::fs::read_to_string(self.out.path().join("monitor.json")).unwrap();
        serde_json::from_str(&text).unwrap()
    }
}

/// fio on the device, O_DIRECT 4 KiB at random offsets, one at a time (no merges possible):
/// returns (ios, bytes) fio reports for the direction.
fn fio(dev: &std::path::Path, rw: &str, size: &str) -> (u64, u64) {
    let cwd = tempfile::tempdir().unwrap();
    let out = Command::new("fio")
        .current_dir(cwd.path())
        .args(["--name=m", "--bs=4k", "--direct=1", "--ioengine=psync", "--output-format=json", "--randrepeat=1"])
        .arg(format!("--rw={rw}"))
        .arg(format!("--size={size}"))
        .arg(format!("--filename={}", dev.display()))
        .output()
        .expect("fio is not installed (apt-get install fio); the README's test command installs it");
    assert!(out.status.success(), "fio: {}", String::from_utf8_lossy(&out.stderr));
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();
    let dir = if rw.contains("write") { "write" } else { "read" };
    let d = &j["jobs"][0][dir];
    (d["total_ios"].as_u64().unwrap(), d["io_bytes"].as_u64().unwrap())
}

/// `got` equals `want`, or falls short by at most the events the kernel skipped (BPF's
/// recursion guard, reported by the monitor: none on a machine where our programs never
/// nest), 4 KiB each.
fn assert_counted(got: (u64, u64), want: (u64, u64), missed: u64, what: &str) {
    let short = want.0.saturating_sub(got.0);
    assert!(
        got.0 <= want.0 && short <= missed && want.1 - got.1.min(want.1) == short * 4096 && got.1 <= want.1,
        "{what}: monitor {got:?} vs {want:?} ({missed} events skipped by the kernel)"
    );
}

fn daemon_counts(s: &Serve) -> (u64, u64) {
    let v = s.call(json!({"cmd": "stats"}));
    (v["requests"].as_u64().unwrap(), v["bytes"].as_u64().unwrap())
}

/// A private node of the same block device: fio writes through it, so udev's watch of
/// /dev/loopN (a close after writing makes udev probe the device) is not triggered and no
/// reads but fio's reach the disk.
fn private_node(dev: &std::path::Path, dir: &std::path::Path) -> std::path::PathBuf {
    use std::os::unix::fs::MetadataExt;
    let rdev = std::fs::metadata(dev).unwrap().rdev();
    let node = dir.join("disk");
    nix::sys::stat::mknod(&node, nix::sys::stat::SFlag::S_IFBLK, nix::sys::stat::Mode::from_bits_truncate(0o600), rdev).unwrap();
    node
}

fn settle() {
    let _ = Command::new("udevadm").args(["settle", "--timeout=10"]).status();
}

#[test]
fn block_counts_equal_fio_and_the_daemon() {
    let s = Serve::start("256MiB", "rules: []\n");
    settle();
    let node = private_node(&s.dev, s.dir.path());
    let Some(m) = Monitor::start(&s.dev) else { return };
    let before = daemon_counts(&s);
    let w = fio(&node, "randwrite", "2MiB");
    let r = fio(&node, "randread", "1MiB");
    let after = daemon_counts(&s);
    let res = m.stop();
    let dev = s.dev.display().to_string();
    println!("{}", res.table());
    let row = |op| res.row(&dev, "block_service", op).cloned().unwrap_or_default();
    let missed = res.missed_events;
    assert_counted((row("write").count, row("write").bytes), w, missed, "block writes vs fio's");
    assert_counted((row("read").count, row("read").bytes), r, missed, "block reads vs fio's");
    let d = &res.devices[0];
    let all = |f: fn(&faultline::monitor::model::LayerOp) -> u64| d.layers.iter().filter(|l| l.layer == "block_service").map(f).sum::<u64>();
    assert_counted((all(|l| l.count), all(|l| l.bytes)), (after.0 - before.0, after.1 - before.1), missed, "block requests and bytes vs the daemon's counters");
    // one request at a time: every issue saw itself alone
    assert_eq!(d.depth.max, 1);
    // each request waited in the queue a little, and was counted there too
    assert_eq!(res.row(&dev, "block_queue", "write").map(|l| l.count), Some(row("write").count));
    // the time series adds up to the totals
    let series_writes: u64 = d.series.iter().filter_map(|i| i.ops.get("write")).map(|o| o.count).sum();
    assert_eq!(series_writes, row("write").count);
    s.stop();
}

/// A 200 µs delay on every write shows at block service time for writes, and neither in
/// reads' service time nor in writes' queue time (at queue depth 1 nothing waits behind it).
/// Reads and writes interleave in one fio job, so both see the same machine; the disk runs
/// without busy polling and CPU latency hold, whose on/off regimes would move the baseline
/// between phases by more than the tolerance.
#[test]
fn a_write_delay_shows_at_block_service_time_only() {
    let s = Serve::start_args(&["--size", "256MiB", "--busy-poll", "0", "--cpu-latency", "keep"], "rules: []\n");
    settle();
    let mut last = String::new();
    // a busy machine can spoil one round's means; the delay must show right in one of five
    for round in 0..5 {
        let phase = |delay: bool| {
            if delay {
                s.add("rules:\n  - {type: delay, op: write, delay: 200us}\n");
            }
            let m = Monitor::start(&s.dev)?;
            fio(&s.dev, "randrw", "4MiB");
            let res = m.stop();
            s.clear();
            Some(res)
        };
        let Some(base) = phase(false) else { return };
        let Some(del) = phase(true) else { return };
        let dev = s.dev.display().to_string();
        let row = |r: &MonitorResults, layer, op| r.row(&dev, layer, op).cloned().unwrap();
        // the change of a statistic between the two phases
        let delta = |layer, op, f: fn(&faultline::monitor::model::LayerOp) -> f64| f(&row(&del, layer, op)) - f(&row(&base, layer, op));
        let (mw, mr) = (delta("block_service", "write", |l| l.mean_us), delta("block_service", "read", |l| l.mean_us));
        let (pw, pr) = (delta("block_service", "write", |l| l.p50_us), delta("block_service", "read", |l| l.p50_us));
        let dq = delta("block_queue", "write", |l| l.mean_us);
        last = format!(
            "round {round}: write service mean {mw:+.1} us, p50 {pw:+.1} us; read service mean {mr:+.1} us, p50 {pr:+.1} us; write queue mean {dq:+.1} us\n{}\n{}",
            base.table(),
            del.table()
        );
        println!("{last}");
        // means, as asked; on a machine busy enough to put milliseconds in the tail of either
        // phase, the medians (a few outliers move a mean of ~500 requests by more than 30 µs)
        let near = |w: f64, r: f64| (w - 200.0).abs() <= 30.0 && r.abs() <= 30.0;
        if (near(mw, mr) || near(pw, pr)) && dq.abs() <= 20.0 {
            s.stop();
            return;
        }
    }
    panic!("the delay did not show as expected in five rounds; last: {last}");
}

/// `faultline run` monitors the drive phase by default: the block layer's write requests are
/// the workload's writes (O_DIRECT 4 KiB, one at a time), embedded in results.json and shown
/// in the report; `monitor: off` leaves them out.
#[test]
fn experiments_embed_the_block_figures() {
    let run = |monitor: &str| {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("exp.yaml");
        std::fs::write(
            &f,
            format!(
                "name: mon\ndisk: {{size: 64MiB}}\nstack: raw\n{monitor}workload: {{pattern: sequential, mix: {{write: 100}}, block_size: 4KiB, engine: psync, size: 4MiB, sync: direct}}\n"
            ),
        )
        .unwrap();
        let out = dir.path().join("results");
        let o = Command::new(bin()).arg("run").arg(&f).arg("--out").arg(&out).arg("-q").output().unwrap();
        assert!(o.status.success(), "faultline run failed:\n{}", String::from_utf8_lossy(&o.stderr));
        let html = std::fs::read_to_string(out.join("report.html")).unwrap();
        (faultline::report::load_dir(&out).unwrap(), html)
    };
    let (r, html) = run("");
    let rep = &r.setups[0].repetitions[0];
    let Some(m) = &rep.monitor else {
        let why = rep.notes.iter().find(|n| n.starts_with("monitor:")).cloned().unwrap_or_default();
        assert!(why.contains("not permitted"), "no monitor figures and no reason it could not run: {:?}", rep.notes);
        skip("", &why);
        return;
    };
    let d = &m.devices[0];
    let w = d.layers.iter().find(|l| l.layer == "block_service" && l.op == "write").expect("block writes");
    assert_counted((w.count, w.bytes), (rep.write.ops, rep.write.bytes), m.missed_events, &format!("block writes vs the workload's\n{}", m.table()));
    assert_eq!(rep.write.ops, 1024);
    assert!(html.contains("Block layer (BPF monitor"), "report has no monitor table");
    let (off, html) = run("monitor: off\n");
    assert!(off.setups[0].repetitions[0].monitor.is_none());
    assert!(!html.contains("Block layer (BPF monitor"));
}

/// `--pid`: the I/O system calls of a process and what it forks. fio, started by a shell the
/// monitor watches, writes through its job process: the syscall layer's writes cover fio's
/// (plus its few writes of its own output), and as every write waits for its block request,
/// the time spent in write calls is at least the block layer's service time for them.
#[test]
fn syscall_layer_follows_forks_and_covers_the_block_layer() {
    let s = Serve::start("256MiB", "rules: []\n");
    settle();
    let node = private_node(&s.dev, s.dir.path());
    let go = s.dir.path().join("go");
    nix::unistd::mkfifo(&go, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let json = s.dir.path().join("fio.json");
    let mut sh = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "read x < {}; cd {} && exec fio --name=m --bs=4k --direct=1 --ioengine=psync --rw=randwrite --size=1MiB --randrepeat=1 --output-format=json --filename={} > {}",
            go.display(),
            s.dir.path().display(),
            node.display(),
            json.display()
        ))
        .spawn()
        .unwrap();
    let out = tempfile::tempdir().unwrap();
    let mut mon = Command::new(bin())
        .args(["monitor", "--pid", &sh.id().to_string(), "--device"])
        .arg(&s.dev)
        .arg("--out")
        .arg(out.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(mon.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
    if !line.starts_with("monitoring ") {
        std::fs::write(&go, "x\n").unwrap();
        let _ = sh.wait();
        let o = mon.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr).to_string();
        if err.contains("not permitted") {
            skip("", &format!("BPF not permitted here: {err}"));
            return;
        }
        panic!("faultline monitor did not start: {line}{err}");
    }
    std::fs::write(&go, "go\n").unwrap();
    assert!(sh.wait().unwrap().success(), "fio failed");
    // SAFETY: kill(2) on our own child's pid; no memory is involved.
    unsafe { libc::kill(mon.id() as i32, libc::SIGINT) };
    let o = mon.wait_with_output().unwrap();
    assert!(o.status.success(), "monitor failed: {}", String::from_utf8_lossy(&o.stderr));
    let res: MonitorResults = serde_json::from_str(&std::fs::read_to_string(out.path().join("monitor.json")).unwrap()).unwrap();
    println!("{}", res.table());
    let j: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let (ios, bytes) = (j["jobs"][0]["write"]["total_ios"].as_u64().unwrap(), j["jobs"][0]["write"]["io_bytes"].as_u64().unwrap());
    let w = res.syscalls.iter().find(|l| l.op == "write").expect("write syscalls");
    assert!(w.count >= ios && w.bytes >= bytes && w.bytes - bytes < 256 * 1024, "syscall writes {} / {} B vs fio's {ios} / {bytes} B", w.count, w.bytes);
    assert!(res.syscalls.iter().any(|l| l.op == "open"), "fio's opens were not seen");
    let b = res.row(&s.dev.display().to_string(), "block_service", "write").expect("block writes");
    assert_counted((b.count, b.bytes), (ios, bytes), res.missed_events, "block writes vs fio's");
    assert!(w.mean_us * w.count as f64 >= b.mean_us * b.count as f64, "time in write calls below the block service time they waited for");
    assert_eq!(res.pids, vec![sh.id()]);
    s.stop();
}
