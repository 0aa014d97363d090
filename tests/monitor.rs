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
    /// None once stopped.
    child: Option<Child>,
    out: tempfile::TempDir,
}

impl Monitor {
    /// Started and attached, or None (reported skipped) where BPF is not permitted.
    fn start(dev: &std::path::Path) -> Option<Monitor> {
        Monitor::start_with(dev, &[])
    }

    fn start_with(dev: &std::path::Path, args: &[&str]) -> Option<Monitor> {
        Monitor::start_env(dev, args, None)
    }

    /// With `FAULTLINE_MONITOR_ATTACH` set to `attach` (forcing a fallback attach type).
    fn start_env(dev: &std::path::Path, args: &[&str], attach: Option<&str>) -> Option<Monitor> {
        let out = tempfile::tempdir().unwrap();
        let mut cmd = Command::new(bin());
        if let Some(a) = attach {
            cmd.env("FAULTLINE_MONITOR_ATTACH", a);
        }
        let mut child = cmd
            .args(["monitor"])
            .args(args)
            .arg("--device")
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
        Some(Monitor { child: Some(child), out })
    }

    /// SIGINT, then its monitor.json.
    fn stop(mut self) -> MonitorResults {
        let child = self.child.take().unwrap();
        sigint(&child);
        let o = child.wait_with_output().unwrap();
        assert!(o.status.success(), "monitor failed: {}", String::from_utf8_lossy(&o.stderr));
        let text = std::fs::read_to_string(self.out.path().join("monitor.json")).unwrap();
        serde_json::from_str(&text).unwrap()
    }
}

impl Drop for Monitor {
    /// A test that failed before `stop` does not leave its monitor (and its programs) running.
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            sigint(&c);
            let _ = c.wait();
        }
    }
}

/// SIGINT to a child of this test (how a user stops `faultline monitor`).
fn sigint(child: &Child) {
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).expect("SIGINT to the child");
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

/// `got` equals `want`, or falls short by at most the requests the monitor reports it did not
/// time (4 KiB each): events the kernel skipped (BPF's recursion guard) and requests without an
/// issue time; plus one request in 200 (at least one): completions the kernel did not run the
/// program for leave no trace (docs/monitor.md, blind spots; about one in a thousand in the
/// suite's runs on a loaded machine).
fn assert_counted(got: (u64, u64), want: (u64, u64), m: &MonitorResults, what: &str) {
    let short = want.0.saturating_sub(got.0);
    let lost = not_timed(m);
    let unseen = (want.0 / 200).max(1);
    assert!(
        got.0 <= want.0 && short <= m.missed_events + lost + unseen && want.1 - got.1.min(want.1) == short * 4096 && got.1 <= want.1,
        "{what}: monitor {got:?} vs {want:?} ({} events skipped by the kernel, {lost} requests not timed; completion events the program ran for, dataless, the kernel's completed requests: {:?})\n{}notes: {:?}",
        m.missed_events,
        m.devices.iter().map(|d| (d.completions_seen, d.dataless, &d.kernel_completed)).collect::<Vec<_>>(),
        m.table(),
        m.notes
    );
}

/// Requests the monitor reports it did not time: completions without an issue time, issue times
/// it could not store, and (older results) issues whose completion never reached it.
fn not_timed(m: &MonitorResults) -> u64 {
    m.devices.iter().map(|d| d.lost_completions + d.inflight_at_end + d.unmatched + d.untracked).sum()
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
    let Some(m) = Monitor::start_with(&s.dev, &["--layers", "journal,driver"]) else { return };
    let before = daemon_counts(&s);
    let w = fio(&node, "randwrite", "2MiB");
    let r = fio(&node, "randread", "1MiB");
    let after = daemon_counts(&s);
    let res = m.stop();
    let dev = s.dev.display().to_string();
    println!("{}", res.table());
    let row = |op| res.row(&dev, "block_service", op).cloned().unwrap_or_default();
    let missed = res.missed_events;
    // the kernel's own count: every write fio made, nothing else wrote (its private node)
    let kernel = &res.devices[0].kernel_completed;
    assert_eq!(kernel.get("write").copied(), Some(w.0), "the kernel's completed requests {kernel:?} vs fio's {w:?} writes");
    // a request the program did not see is noted
    let counted = row("write").count + row("read").count;
    if kernel.get("read").is_some_and(|r| r + w.0 > counted + not_timed(&res) + res.devices[0].early) {
        assert!(res.notes.iter().any(|n| n.contains("more than the block program saw")), "no note of the unseen: {:?}", res.notes);
    }
    assert_counted((row("write").count, row("write").bytes), w, &res, "block writes vs fio's");
    assert_counted((row("read").count, row("read").bytes), r, &res, "block reads vs fio's");
    let d = &res.devices[0];
    let all = |f: fn(&faultline::monitor::model::LayerOp) -> u64| d.layers.iter().filter(|l| l.layer == "block_service").map(f).sum::<u64>();
    let daemon = (after.0 - before.0, after.1 - before.1);
    assert_counted((all(|l| l.count), all(|l| l.bytes)), daemon, &res, "block requests and bytes vs the daemon's counters");
    // every request reported not timed is really missing from the counts
    let short = daemon.0 - all(|l| l.count);
    assert!(short >= not_timed(&res), "{short} requests short, {} reported not timed", not_timed(&res));
    // the driver layer (FUSE requests of the loop device's file) saw each block request: one
    // FUSE read or write per 4 KiB request, both ends inside the monitor's window
    let fuse = |op| res.pair("driver", op).map_or(0, |r| r.count);
    for (op, want) in [("fuse:write", w.0), ("fuse:read", r.0)] {
        assert!(fuse(op) <= want && want - fuse(op) <= missed, "{op}: {} FUSE requests vs fio's {want}\n{}", fuse(op), res.table());
    }
    // each block request's service contains its FUSE request (the daemon's service and the
    // hand-off): where both layers timed every request, the block layer's total is the larger
    for op in ["write", "read"] {
        let (b, f) = (row(op), res.pair("driver", &format!("fuse:{op}")).cloned().unwrap_or_default());
        if b.count == f.count {
            assert!(b.mean_us >= f.mean_us, "{op}: block service mean {:.1} us below the FUSE layer's {:.1} us", b.mean_us, f.mean_us);
        }
    }
    // one request at a time: the sampled depth never saw more than one in flight
    assert!(d.depth.max <= 1 && !d.depth.histogram.is_empty(), "depth {:?}", d.depth);
    // each request waited in the queue a little, and was counted there too
    assert_eq!(res.row(&dev, "block_queue", "write").map(|l| l.count), Some(row("write").count));
    // the time series adds up to the totals
    let series_writes: u64 = d.series.iter().filter_map(|i| i.ops.get("write")).map(|o| o.count).sum();
    assert_eq!(series_writes, row("write").count);
    s.stop();
}

/// A 200 µs delay on every write shows at block service time for writes and at the driver
/// layer (the loop device's FUSE write requests, which wait for the daemon), and neither in
/// reads' service time nor in writes' queue time (at queue depth 1 nothing waits behind it).
/// Reads and writes interleave in one fio job, so both see the same machine at the same time:
/// the figure compared is the writes' median minus the reads' median, delayed phase against
/// baseline, which cancels how busy the machine was in either phase (a loaded machine moves
/// both medians by hundreds of µs between phases). The disk runs without busy polling and CPU
/// latency hold, whose on/off regimes would move the baseline between phases.
#[test]
fn a_write_delay_shows_at_block_service_time_only() {
    let s = Serve::start_args(&["--size", "256MiB", "--busy-poll", "0", "--cpu-latency", "keep"], "rules: []\n");
    settle();
    let mut last = String::new();
    // a machine busy enough to hold the daemon's timer or its threads for a millisecond
    // spoils a round; the delay must show right in one of five
    for round in 0..5 {
        let phase = |delay: bool| {
            if delay {
                s.add("rules:\n  - {type: delay, op: write, delay: 200us}\n");
            }
            let m = Monitor::start_with(&s.dev, &["--layers", "driver"])?;
            fio(&s.dev, "randrw", "4MiB");
            let res = m.stop();
            s.clear();
            Some(res)
        };
        let Some(base) = phase(false) else { return };
        let Some(del) = phase(true) else { return };
        let dev = s.dev.display().to_string();
        let p50 = |r: &MonitorResults, layer: &str, op: &str| -> f64 {
            if layer == "driver" { r.pair(layer, &format!("fuse:{op}")).unwrap().p50_us } else { r.row(&dev, layer, op).unwrap().p50_us }
        };
        // writes' median over reads', delayed phase minus baseline
        let shift = |layer| (p50(&del, layer, "write") - p50(&del, layer, "read")) - (p50(&base, layer, "write") - p50(&base, layer, "read"));
        let (block, fuse) = (shift("block_service"), shift("driver"));
        let dq = del.row(&dev, "block_queue", "write").unwrap().mean_us - base.row(&dev, "block_queue", "write").unwrap().mean_us;
        last = format!(
            "round {round}: write-over-read median shift: block service {block:+.1} us, FUSE {fuse:+.1} us; write queue mean {dq:+.1} us\n{}\n{}",
            base.table(),
            del.table()
        );
        println!("{last}");
        if (block - 200.0).abs() <= 30.0 && (fuse - 200.0).abs() <= 30.0 && dq.abs() <= 20.0 {
            s.stop();
            return;
        }
    }
    panic!("the delay did not show as expected in five rounds; last: {last}");
}

/// `faultline run` monitors the drive phase by default: the block layer's write requests are
/// the workload's writes (O_DIRECT 4 KiB, one at a time), embedded in results.json and shown
/// in the report; the disk daemon's figures for the same span sit beside them (its write count
/// is the workload's, its held delay the 200 µs rule's, and its service time is inside the
/// block layer's); `monitor: off` leaves them out.
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
        let csv = std::fs::read_to_string(out.join("monitor.csv")).unwrap_or_default();
        (faultline::report::load_dir(&out).unwrap(), html, csv)
    };
    let (r, html, csv) = run("monitor: {layers: [block, syscall]}\nfaults: [{type: delay, op: write, delay: 200us}]\n");
    let rep = &r.setups[0].repetitions[0];
    let Some(m) = &rep.monitor else {
        let why = rep.notes.iter().find(|n| n.starts_with("monitor:")).cloned().unwrap_or_default();
        assert!(why.contains("not permitted"), "no monitor figures and no reason it could not run: {:?}", rep.notes);
        skip("", &why);
        return;
    };
    let d = &m.devices[0];
    let w = d.layers.iter().find(|l| l.layer == "block_service" && l.op == "write").expect("block writes");
    assert_counted((w.count, w.bytes), (rep.write.ops, rep.write.bytes), m, &format!("block writes vs the workload's\n{}", m.table()));
    assert_eq!(rep.write.ops, 1024);
    // the syscall layer: the run process's write calls are the workload's (with -q nothing
    // else of the run writes during the drive phase but a few control-socket messages)
    let sw = m.syscalls.iter().find(|l| l.op == "write").unwrap_or_else(|| panic!("no syscall writes\n{}", m.table()));
    assert!(
        sw.count >= 1024 && sw.count <= 1024 + 64 && sw.bytes >= rep.write.bytes,
        "syscall writes {} / {} B vs the workload's 1024 / {} B",
        sw.count,
        sw.bytes,
        rep.write.bytes
    );
    assert!(sw.mean_us * sw.count as f64 >= w.mean_us * w.count as f64, "time in write calls below the block service time they waited for");
    assert!(html.contains("Block layer (BPF monitor"), "report has no monitor table");
    // the daemon's part of the block service time, over the same span
    let dw = d.daemon.get("write").unwrap_or_else(|| panic!("no daemon figures for writes\n{}", m.table()));
    assert_eq!(dw.count, rep.write.ops, "daemon writes vs the workload's\n{}", m.table());
    assert!((200.0..201.0).contains(&dw.delay_mean_us), "held delay mean {} µs for a 200 µs rule\n{}", dw.delay_mean_us, m.table());
    assert!(dw.service_mean_us >= dw.delay_mean_us && w.mean_us >= dw.service_mean_us, "daemon service {dw:?} vs block service {} µs", w.mean_us);
    assert!(csv.lines().any(|l| l.contains(",daemon_service,write,1024,")), "monitor.csv has no daemon row:\n{csv}");
    assert!(html.contains("daemon (held delay"), "report has no daemon row");
    let (off, html, _) = run("monitor: off\n");
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
    sigint(&mon);
    let o = mon.wait_with_output().unwrap();
    assert!(o.status.success(), "monitor failed: {}", String::from_utf8_lossy(&o.stderr));
    let res: MonitorResults = serde_json::from_str(&std::fs::read_to_string(out.path().join("monitor.json")).unwrap()).unwrap();
    println!("{}", res.table());
    let j: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let (ios, bytes) = (j["jobs"][0]["write"]["total_ios"].as_u64().unwrap(), j["jobs"][0]["write"]["io_bytes"].as_u64().unwrap());
    let w = res.syscalls.iter().find(|l| l.op == "write").expect("write syscalls");
    assert!(w.count >= ios && w.bytes >= bytes && w.bytes - bytes < 256 * 1024, "syscall writes {} / {} B vs fio's {ios} / {bytes} B", w.count, w.bytes);
    assert!(res.syscalls.iter().any(|l| l.op == "open"), "fio's opens were not seen");
    assert!(res.syscalls.iter().any(|l| l.op == "close"), "fio's closes were not seen");
    // per-syscall tracepoints where the kernel has them (the forced fallbacks: below)
    let events = std::path::Path::new("/sys/kernel/tracing/events/syscalls/sys_enter_read").exists();
    assert_eq!(res.syscall_attach == "syscalls", events, "syscall layer attached as {}", res.syscall_attach);
    let b = res.row(&s.dev.display().to_string(), "block_service", "write").expect("block writes");
    assert_counted((b.count, b.bytes), (ios, bytes), &res, "block writes vs fio's");
    assert!(w.mean_us * w.count as f64 >= b.mean_us * b.count as f64, "time in write calls below the block service time they waited for");
    assert_eq!(res.pids, vec![sh.id()]);
    s.stop();
}

/// `faultline stack-hold`: a file system on a served disk, held until SIGINT.
struct Hold {
    child: Child,
    dev: std::path::PathBuf,
    mount: std::path::PathBuf,
}

impl Hold {
    fn start(stack: &str) -> Hold {
        let mut child =
            Command::new(bin()).args(["stack-hold", "--stack", stack, "--size", "256MiB"]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let mut r = BufReader::new(child.stdout.take().unwrap());
        let (mut dev, mut mount) = (None, None);
        loop {
            let mut line = String::new();
            if r.read_line(&mut line).unwrap() == 0 {
                let o = child.wait_with_output().unwrap();
                panic!("stack-hold exited early: {}", String::from_utf8_lossy(&o.stderr));
            }
            match line.trim().split_once(' ') {
                Some(("device", d)) => dev = Some(d.into()),
                Some(("mount", m)) => mount = Some(m.into()),
                _ if line.trim() == "ready" => break,
                _ => {}
            }
        }
        Hold { child, dev: dev.unwrap(), mount: mount.unwrap() }
    }

    fn stop(mut self) {
        sigint(&self.child);
        assert!(self.child.wait().unwrap().success());
    }
}

impl Drop for Hold {
    /// A test that failed before `stop` still tears its stack down (unmount, loop device).
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            sigint(&self.child);
            let _ = self.child.wait();
        }
    }
}

/// On ext4 over a faultline disk: a user pair around ext4_sync_file counts exactly the test's
/// fsync calls (and so does the built-in file-system pair); the journal's commits are seen
/// with every phase timed, and jbd2_run_stats summed with its jiffies turned into ms; and the
/// driver layer (the loop device's FUSE requests) saw every block read and write.
#[test]
fn ext4_layers_fsync_pair_journal_and_fuse() {
    let h = Hold::start("ext4");
    let Some(m) = Monitor::start_with(&h.dev, &["--layers", "fs,journal,driver", "--pair", "fsync=ext4:ext4_sync_file_enter,ext4:ext4_sync_file_exit"]) else {
        h.stop();
        return;
    };
    const FSYNCS: u64 = 7;
    {
        use std::io::Write;
        let mut f = std::fs::File::create(h.mount.join("f")).unwrap();
        for _ in 0..FSYNCS {
            f.write_all(&[7u8; 4096]).unwrap();
            f.sync_all().unwrap();
        }
        // a commit of whatever is left, before the monitor stops
        nix::unistd::syncfs(&f).unwrap();
    }
    let res = m.stop();
    println!("{}", res.table());
    let count = |layer, op| res.pair(layer, op).map_or(0, |r| r.count);
    assert_eq!(count("user", "fsync"), FSYNCS, "user pair\n{}", res.table());
    assert_eq!(count("fs", "ext4_sync_file"), FSYNCS);
    let commits = count("journal", "commit");
    assert!(commits >= 1, "no journal commit seen");
    for phase in ["commit_lock", "commit_locked", "commit_flush", "commit_log"] {
        let r = res.pair("journal", phase).unwrap_or_else(|| panic!("no {phase}"));
        assert!(r.count >= 1 && r.mean_us > 0.0, "{phase}: {r:?}");
    }
    let stats = res.summed.iter().find(|s| s.event == "jbd2:jbd2_run_stats").expect("jbd2_run_stats");
    assert!(stats.count >= 1 && stats.hz > 0, "{stats:?}");
    let field = |n| stats.fields.iter().find(|f| f.name == n).unwrap();
    assert_eq!(field("logging").unit, "ms");
    assert!(field("blocks_logged").total > 0.0);
    let dev = h.dev.display().to_string();
    let block = |op| res.row(&dev, "block_service", op).map_or(0, |r| r.count);
    // requests issued before the monitor started are left out of the block layer (`early`)
    // while their FUSE requests, sent later, are timed; and one block completion in 200 (at
    // least one) may go unseen, as in `assert_counted` (docs/monitor.md, blind spots)
    let early: u64 = res.devices.iter().map(|d| d.early).sum();
    let slack = res.missed_events + not_timed(&res) + early;
    for (f, b) in [("fuse:write", block("write")), ("fuse:read", block("read"))] {
        let slack = slack + (count("driver", f).max(b) / 200).max(1);
        assert!(
            count("driver", f).abs_diff(b) <= slack,
            "{f}: {} FUSE requests vs {b} block requests ({slack} not timed); notes: {:?}",
            count("driver", f),
            res.notes
        );
    }
    h.stop();
}

/// A user pair given in an experiment (`monitor: {extra}`) is timed in the drive phase and
/// lands in results.json next to the built-in layers.
#[test]
fn experiments_embed_user_pairs() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("exp.yaml");
    std::fs::write(
        &f,
        "name: pairs\ndisk: {size: 128MiB}\nstack: ext4\nmonitor: {layers: [block, fs, journal], extra: [{name: fsync, enter: \"ext4:ext4_sync_file_enter\", exit: \"ext4:ext4_sync_file_exit\", key: tid}]}\n\
workload: {interface: file, files: 1, file_size: 1MiB, size: 1MiB, mix: {write: 100}, sync: \"fsync:16\", content: {profile: none}}\n",
    )
    .unwrap();
    let out = dir.path().join("results");
    let o = Command::new(bin()).arg("run").arg(&f).arg("--out").arg(&out).arg("-q").output().unwrap();
    assert!(o.status.success(), "faultline run failed:\n{}", String::from_utf8_lossy(&o.stderr));
    let r = faultline::report::load_dir(&out).unwrap();
    let rep = &r.setups[0].repetitions[0];
    let Some(m) = &rep.monitor else {
        let why = rep.notes.iter().find(|n| n.starts_with("monitor:")).cloned().unwrap_or_default();
        assert!(why.contains("not permitted"), "no monitor figures and no reason it could not run: {:?}", rep.notes);
        skip("", &why);
        return;
    };
    // 256 writes of 4 KiB, an fsync after every 16, and one at the end of the run
    let fsync = m.pair("user", "fsync").unwrap_or_else(|| panic!("no user pair in results.json\n{}", m.table()));
    assert!(fsync.count >= 16 && fsync.count <= 17, "{} fsyncs timed\n{}", fsync.count, m.table());
    assert_eq!(m.pair("fs", "ext4_sync_file").map(|r| r.count), Some(fsync.count));
    let text = std::fs::read_to_string(out.join("results.json")).unwrap();
    assert!(text.contains("\"layer\": \"user\"") || text.contains("\"layer\":\"user\""));
    let csv = std::fs::read_to_string(out.join("monitor.csv")).unwrap();
    assert!(csv.lines().any(|l| l.starts_with(&format!("pairs,1,-,user,fsync,{},", fsync.count))), "monitor.csv:\n{csv}");
    assert!(csv.lines().any(|l| l.contains(",block_service,write,")), "monitor.csv:\n{csv}");
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("Stack layers (BPF monitor") && html.contains(">fsync<"), "report has no per-layer table");
}

/// The daemon's own service time (`stats`' `service`: from a request reaching the disk to its
/// reply being due, the injected delay included) and the monitor's block service time agree
/// within 5% for writes held 10 ms each: the block layer adds only the loop device's and
/// FUSE's hand-offs (tens of µs). A busy machine can hold a reply past its due time (the daemon
/// counts the delay asked for): up to three rounds.
#[test]
fn block_service_mean_matches_the_daemons() {
    let s = Serve::start("256MiB", "rules:\n  - {type: delay, op: write, delay: 10ms}\n");
    settle();
    let node = private_node(&s.dev, s.dir.path());
    let svc = |s: &Serve| {
        let v = s.call(json!({"cmd": "stats"}));
        let w = &v["service"]["write"];
        (w["count"].as_u64().unwrap_or(0), w["service_ns"].as_u64().unwrap_or(0), w["delay_ns"].as_u64().unwrap_or(0))
    };
    let mut last = String::new();
    for round in 0..3 {
        let Some(m) = Monitor::start(&s.dev) else { return };
        let before = svc(&s);
        let w = fio(&node, "randwrite", "512KiB");
        let after = svc(&s);
        let res = m.stop();
        let (n, ns, delay_ns) = (after.0 - before.0, after.1 - before.1, after.2 - before.2);
        assert_eq!(n, w.0, "the daemon's write count vs fio's");
        assert!(delay_ns >= n * 10_000_000, "held delay {delay_ns} ns for {n} writes of 10 ms");
        let daemon_us = ns as f64 / n as f64 / 1000.0;
        let b = res.row(&s.dev.display().to_string(), "block_service", "write").cloned().unwrap_or_default();
        assert_counted((b.count, b.bytes), w, &res, "block writes vs fio's");
        last = format!("round {round}: block service mean {:.1} us, daemon's {daemon_us:.1} us\n{}", b.mean_us, res.table());
        println!("{last}");
        // the block layer contains the daemon's service
        assert!(b.mean_us >= daemon_us, "{last}");
        if (b.mean_us - daemon_us) / daemon_us <= 0.05 {
            s.stop();
            return;
        }
    }
    panic!("block service mean not within 5% of the daemon's in three rounds; last: {last}");
}

/// The attach types, forced: tp_btf, raw_tp (BTF-less raw tracepoints, same programs) and
/// classic tracepoints (issue and completion matched by device and sector) count the same
/// requests as fio, and say which attach type ran; the syscall layer (this test process and
/// what it forks: fio), on its raw_syscalls fallback in the same attach type (forcing one
/// skips the per-syscall tracepoints), sees at least fio's writes; the driver layer (the
/// FUSE programs, or the classic pair) one FUSE write per 4 KiB block write.
#[test]
fn fallback_attach_types_count_the_same() {
    let s = Serve::start("256MiB", "rules: []\n");
    settle();
    let node = private_node(&s.dev, s.dir.path());
    let pid = std::process::id().to_string();
    for attach in ["tp_btf", "raw_tp", "tracepoint"] {
        let Some(m) = Monitor::start_env(&s.dev, &["--pid", &pid, "--layers", "driver"], Some(attach)) else { return };
        let w = fio(&node, "randwrite", "1MiB");
        let res = m.stop();
        assert_eq!(res.attach, attach);
        assert_eq!(res.syscall_attach, attach);
        let b = res.row(&s.dev.display().to_string(), "block_service", "write").cloned().unwrap_or_default();
        assert_counted((b.count, b.bytes), w, &res, &format!("{attach}: block writes vs fio's\n{}", res.table()));
        assert!(b.mean_us > 0.0);
        let sw = res.syscalls.iter().find(|l| l.op == "write").map_or(0, |l| l.count);
        assert!(sw >= w.0, "{attach}: {sw} write calls seen, fio made {}", w.0);
        let fw = res.pair("driver", "fuse:write").map_or(0, |r| r.count);
        assert!(fw <= w.0 && w.0 - fw <= res.missed_events, "{attach}: {fw} FUSE writes vs fio's {}\n{}", w.0, res.table());
        // the kernel's stamps give queue time; classic tracepoints have no request to read
        assert_eq!(res.row(&s.dev.display().to_string(), "block_queue", "write").is_some(), attach != "tracepoint", "{}", res.table());
    }
    s.stop();
}
