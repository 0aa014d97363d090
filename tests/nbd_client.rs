//! The NBD client: a faultline disk whose store is a remote export (`--store nbd://...`), over
//! our own server, `nbdkit` and `qemu-nbd` (where installed), with real file systems on the
//! client's loop device; errors, stalls and a target that goes away and comes back; and the
//! workload's `interface: nbd`. Needs root, /dev/fuse, loop devices, nbdkit (scripts/setup.sh).

mod common;

use common::*;
use faultline::nbd::client::Client;
use faultline::spec::nbd::NbdTarget;
use faultline::verify::verify_device;
use faultline::workload::content_map::ContentMap;
use faultline::workload::pattern::Pattern;
use faultline::workload::runner::{BlockWorkload, ErrorPolicy, run_block};
use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

/// A remote NBD target: our `faultline serve --nbd --no-loop`, or another server.
struct Target {
    child: Child,
    uri: String,
    /// Our server's control socket.
    socket: Option<PathBuf>,
    _dir: tempfile::TempDir,
}

impl Target {
    /// `faultline serve --nbd tcp://127.0.0.1:0 --no-loop` with `rules`.
    fn ours(rules: &str) -> Target {
        let dir = tempfile::tempdir().unwrap();
        let rp = dir.path().join("rules.yaml");
        std::fs::write(&rp, rules).unwrap();
        let socket = dir.path().join("ctl.sock");
        let mut child = Command::new(bin())
            .args(["serve", "--size", "64MiB", "--nbd", "tcp://127.0.0.1:0", "--no-loop", "--rules"])
            .arg(&rp)
            .arg("--socket")
            .arg(&socket)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut l = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut l).unwrap();
        assert!(l.starts_with("nbd://"), "first line is the URI: {l:?}");
        Target { child, uri: l.trim().to_string(), socket: Some(socket), _dir: dir }
    }

    /// Another server, started by `cmd` (given the temp dir) listening on `uri`.
    fn other(cmd: impl FnOnce(&Path) -> Command, uri: impl FnOnce(&Path) -> String) -> Option<Target> {
        let dir = tempfile::tempdir().unwrap();
        let mut c = cmd(dir.path());
        let child = c.stdout(Stdio::null()).stderr(Stdio::null()).spawn().ok()?;
        let uri = uri(dir.path());
        let t = Target { child, uri, socket: None, _dir: dir };
        // up when a client gets through the handshake
        let deadline = Instant::now() + Duration::from_secs(10);
        while Client::connect(&t.uri.parse().unwrap()).is_err() {
            assert!(Instant::now() < deadline, "{} did not come up", t.uri);
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(t)
    }

    fn nbdkit_memory() -> Option<Target> {
        if !have("nbdkit") {
            skip("nbdkit", "nbdkit is not installed (scripts/setup.sh)");
            return None;
        }
        Self::other(
            |d| {
                let mut c = Command::new("nbdkit");
                c.args(["-f", "--exit-with-parent", "-U"]).arg(d.join("nbd.sock")).args(["memory", "64M"]);
                c
            },
            |d| format!("nbd+unix:///?socket={}", d.join("nbd.sock").display()),
        )
    }

    fn qemu_nbd() -> Option<Target> {
        if !have("qemu-nbd") {
            skip("qemu-nbd", "qemu-nbd is not installed (apt qemu-utils, scripts/setup.sh)");
            return None;
        }
        Self::other(
            |d| {
                let img = d.join("disk.img");
                std::fs::File::create(&img).unwrap().set_len(64 * MIB).unwrap();
                let mut c = Command::new("qemu-nbd");
                c.args(["-f", "raw", "-t", "-e", "8", "-k"]).arg(d.join("nbd.sock")).arg(&img);
                c
            },
            |d| format!("nbd+unix:///?socket={}", d.join("nbd.sock").display()),
        )
    }

    fn call(&self, req: Value) -> Value {
        faultline::frontend::control::call(self.socket.as_ref().unwrap(), &req).unwrap()
    }

    /// Ours: SIGTERM and a clean exit. Others: SIGKILL (nbdkit waits for its clients to
    /// leave on SIGTERM; a target that dies is what the tests want anyway).
    fn stop(mut self) {
        if self.socket.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
            return;
        }
        // SAFETY: signalling our own child by its pid
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let st = self.child.wait().unwrap();
        assert!(st.success(), "the target server exited with {st}");
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn have(cmd: &str) -> bool {
    Command::new("sh").args(["-c", &format!("command -v {cmd}")]).stdout(Stdio::null()).status().is_ok_and(|s| s.success())
}

fn with_policy(uri: &str, q: &str) -> String {
    format!("{uri}{}{q}", if uri.contains('?') { "&" } else { "?" })
}

/// The client's counters from the client disk's control socket.
fn client_stats(s: &Serve) -> Value {
    s.call(json!({"cmd": "stats"}))["nbd_client"].clone()
}

fn sh(cmd: &str) {
    let o = Command::new("sh").args(["-c", cmd]).output().unwrap();
    assert!(o.status.success(), "{cmd}: {}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
}

/// Unmounts on drop (a failed assertion must not leave the mount behind).
struct Mounted(PathBuf);
impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// Through a client disk over `t`: a workload written and verified on the raw device, then
/// ext4 made, mounted, written, unmounted and checked.
fn raw_and_ext4_on_client(t: &Target) {
    let s = Serve::start_args(&["--store", &t.uri], "rules: []\n");
    let size = faultline::sys::file_size(&s.dev).unwrap();
    assert_eq!(size, 64 * MIB, "the client disk has the export's size");
    let map = Arc::new(ContentMap::new(size / BS, 4096, 9));
    let w = BlockWorkload {
        device: s.dev.clone(),
        pattern: Pattern::Uniform,
        write_pct: 70,
        block_size: 16384,
        threads: 4,
        size: Some(16 * MIB),
        ops: None,
        duration: None,
        seed: 9,
        on_error: ErrorPolicy::Stop,
        span: Some(size),
    };
    let r = run_block(&w, map.clone()).unwrap();
    assert!(r.failed_ios.is_empty() && r.write.ops > 0, "{:?}", r.failed_ios);
    let rep = verify_device(&s.dev, &map).unwrap();
    assert!(rep.is_clean() && rep.counts.ok > 0, "{:?}", rep.counts);
    // what the client wrote is on the target: read it back with a client of our own
    let direct = Client::connect(&t.uri.parse().unwrap()).unwrap();
    let (b, id) = map.written().next().unwrap();
    let mut got = vec![0u8; BS as usize];
    direct.read(b * BS, &mut got).unwrap();
    assert_eq!(got, expected(id, 9), "block {b} on the target");
    drop(direct);

    let mnt = s.dir.path().join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    sh(&format!("mkfs.ext4 -q -F {}", s.dev.display()));
    sh(&format!("mount {} {}", s.dev.display(), mnt.display()));
    let m = Mounted(mnt.clone());
    let data: Vec<u8> = (0..3 * MIB as usize).map(|i| (i * 31 % 251) as u8).collect();
    std::fs::write(mnt.join("f"), &data).unwrap();
    sh(&format!("sync -f {}", mnt.display()));
    drop(m);
    sh(&format!("mount -o ro {} {}", s.dev.display(), mnt.display()));
    let m = Mounted(mnt.clone());
    assert!(std::fs::read(mnt.join("f")).unwrap() == data, "the file reads back after a remount");
    drop(m);
    sh(&format!("fsck.ext4 -n -f {}", s.dev.display()));
    let st = client_stats(&s);
    assert!(st["requests"].as_u64().unwrap() > 0 && st["failed"] == 0, "{st}");
    s.stop();
}

#[test]
fn client_store_over_our_server() {
    let t = Target::ours("rules: []\n");
    raw_and_ext4_on_client(&t);
    // every request of the client disk reached our server
    let st = t.call(json!({"cmd": "stats"}));
    assert!(st["requests"].as_u64().unwrap() > 1000, "{st}");
    t.stop();
}

#[test]
fn client_store_over_nbdkit() {
    let Some(t) = Target::nbdkit_memory() else { return };
    raw_and_ext4_on_client(&t);
    t.stop();
}

#[test]
fn client_store_over_qemu_nbd() {
    let Some(t) = Target::qemu_nbd() else { return };
    raw_and_ext4_on_client(&t);
    t.stop();
}

#[test]
fn remote_eio_surfaces_at_the_client_loop_device_after_retries() {
    let t = Target::ours("rules:\n  - {type: error, op: read, target: {block: 100}}\n");
    let s = Serve::start_args(&["--store", &with_policy(&t.uri, "retries=2&backoff_initial=1ms")], "rules: []\n");
    let d = s.open();
    write_blocks(&d, 90, 20, 3, |b| b);
    assert_eq!(read_block(&d, 99).unwrap(), expected(99, 3));
    assert_eq!(errno(read_block(&d, 100)), Some(libc::EIO), "the remote rule's EIO at the client's loop device");
    assert_eq!(read_block(&d, 101).unwrap(), expected(101, 3));
    let st = client_stats(&s);
    let (failed, retries, remote) = (st["failed"].as_u64().unwrap(), st["retries"].as_u64().unwrap(), st["remote_errors"].as_u64().unwrap());
    assert!(failed >= 1, "{st}");
    // each failed request: the first attempt and 2 retries, all answered with the error
    assert_eq!((remote, retries), (3 * failed, 2 * failed), "{st}");
    // the target's fault log has one entry per attempt
    let log = t.call(json!({"cmd": "log", "since": 0, "max": 1000}));
    assert_eq!(log.as_array().unwrap().len() as u64, remote, "{log}");
    drop(d);
    s.stop();
    t.stop();
}

#[test]
fn stalled_target_times_out_reconnects_and_retries() {
    // the first read of block 50 is answered 2 s late; the client gives up after 300 ms
    let t = Target::ours("rules: []\n");
    let s = Serve::start_args(&["--store", &with_policy(&t.uri, "timeout=300ms&retries=3&backoff_initial=5ms")], "rules: []\n");
    let d = s.open();
    write_blocks(&d, 48, 4, 4, |b| b);
    t.call(json!({"cmd": "add", "rules": "rules:\n  - {type: delay, op: read, delay: 2s, times: 1, target: {block: 50}}\n"}));
    let before = client_stats(&s);
    assert_eq!(read_block(&d, 50).unwrap(), expected(50, 4), "the retry on a fresh connection got the data");
    let st = client_stats(&s);
    let n = |k: &str| st[k].as_u64().unwrap() - before[k].as_u64().unwrap();
    assert_eq!(n("timeouts"), 1, "{st}");
    assert!(n("retries") >= 1 && n("reconnects") >= 1 && n("failed") == 0, "{st}");
    // the time the timeout cost is counted (at least the timeout itself)
    assert!(n("retry_ns") >= 300_000_000, "{st}");
    let rules = t.call(json!({"cmd": "list"}));
    assert_eq!(rules[0]["fired"], 1, "the delay fired once: {rules}");
    drop(d);
    s.stop();
    t.stop();
}

/// A free TCP port on 127.0.0.1 (bound and released).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
fn target_that_goes_away_and_comes_back_is_survived() {
    if !have("nbdkit") {
        skip("", "nbdkit is not installed (scripts/setup.sh)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("disk.img");
    std::fs::File::create(&img).unwrap().set_len(64 * MIB).unwrap();
    let port = free_port();
    let start = || -> Target {
        let img = img.clone();
        Target::other(
            move |_| {
                let mut c = Command::new("nbdkit");
                c.args(["-f", "--exit-with-parent", "-i", "127.0.0.1", "-p", &port.to_string(), "file"]).arg(&img);
                c
            },
            |_| format!("nbd://127.0.0.1:{port}/"),
        )
        .expect("nbdkit starts")
    };
    let t = start();
    let s = Serve::start_args(&["--store", &with_policy(&t.uri, "timeout=2s&retries=40&backoff_initial=10ms&backoff_max=100ms")], "rules: []\n");
    let d = s.open();
    write_blocks(&d, 10, 8, 6, |b| b);
    t.stop();
    // the target is gone: a read now waits in the client's retries...
    let dev = s.dev.clone();
    let reader = std::thread::spawn(move || {
        let d = faultline::workload::direct::DirectDev::open(&dev).unwrap();
        read_block(&d, 12)
    });
    std::thread::sleep(Duration::from_millis(500));
    // ...until it is back on the same port
    let t = start();
    assert_eq!(reader.join().unwrap().unwrap(), expected(12, 6), "the read made during the outage completes");
    write_blocks(&d, 20, 4, 6, |b| b);
    assert_eq!(read_block(&d, 21).unwrap(), expected(21, 6));
    let st = client_stats(&s);
    assert!(st["connection_errors"].as_u64().unwrap() >= 1 && st["retries"].as_u64().unwrap() >= 1, "{st}");
    assert!(st["reconnects"].as_u64().unwrap() >= 1 && st["failed"] == 0, "{st}");
    drop(d);
    s.stop();
    t.stop();
}

/// `interface: nbd`: a workload straight to the export, verified through NBD; a block changed
/// behind its back is found. 4 KiB writes are filled in their pool segment's own buffer.
fn interface_nbd(uri: &str, block_size: &str) {
    let y = format!(
        "workload:\n  interface: nbd\n  target: '{uri}'\n  pattern: uniform\n  mix: {{read: 30, write: 70}}\n  block_size: {block_size}\n  threads: 3\n  size: 8MiB\n  content: {{seed: 11, profile: linux-6.1-source}}\n"
    );
    let w = faultline::spec::workload::parse_workload(&y, "w.yaml", None).unwrap();
    let maps = faultline::workload::maps::Maps::new(&w).unwrap();
    let r = faultline::workload::runner::run(&w, &maps, None, None).unwrap();
    assert!(r.failed_ios.is_empty() && r.write.ops > 0 && r.read.ops > 0, "{:?}", r.failed_ios);
    assert!(r.nbd_client.is_some_and(|c| c.requests == r.write.ops + r.read.ops), "{:?}", r.nbd_client);
    let rep = faultline::verify::verify(&maps).unwrap();
    assert!(rep.is_clean() && rep.counts.ok == maps.written_blocks(), "{:?}", rep.counts);
    // overwrite one written block directly
    let (b, _) = maps.maps[0].written().next().unwrap();
    let c = Client::connect(&uri.parse::<NbdTarget>().unwrap()).unwrap();
    c.write(b * BS, &vec![0x5a; BS as usize], true).unwrap();
    drop(c);
    let rep = faultline::verify::verify(&maps).unwrap();
    let bad: Vec<u64> = rep.bad.iter().map(|x| x.block()).collect();
    assert_eq!(bad, vec![b], "{:?}", rep.counts);
}

#[test]
fn interface_nbd_workload_and_verify_against_nbdkit() {
    let Some(t) = Target::nbdkit_memory() else { return };
    interface_nbd(&t.uri, "16KiB");
    interface_nbd(&t.uri, "4KiB");
    t.stop();
}

#[test]
fn interface_nbd_workload_and_verify_against_ours_with_retries() {
    let t = Target::ours("rules: []\n");
    interface_nbd(&t.uri, "4KiB");
    // transient remote errors are retried away by the client's policy
    t.call(json!({"cmd": "add", "rules": "rules:\n  - {type: error, op: write, times: 2}\n"}));
    let y = format!(
        "workload:\n  interface: nbd\n  target: '{}'\n  mix: {{write: 100}}\n  block_size: 4KiB\n  ops: 200\n",
        with_policy(&t.uri, "retries=3&backoff_initial=1ms")
    );
    let w = faultline::spec::workload::parse_workload(&y, "w.yaml", None).unwrap();
    let maps = faultline::workload::maps::Maps::new(&w).unwrap();
    let r = faultline::workload::runner::run(&w, &maps, None, None).unwrap();
    assert!(r.failed_ios.is_empty(), "{:?}", r.failed_ios);
    let c = r.nbd_client.unwrap();
    assert_eq!((c.retries, c.remote_errors, c.failed), (2, 2, 0), "{c:?}");
    // and the workload's own retries did not see them
    assert_eq!(r.retries, 0);
    // the per-interval series adds up to the totals
    let per: u64 = r.nbd_client_intervals.iter().map(|i| i.counts.retries).sum();
    assert_eq!(per, 2, "{:?}", r.nbd_client_intervals);
    t.stop();
}

#[test]
fn experiment_on_a_client_store_reports_nbd_client_counters() {
    // the target fails two writes; the run's disk (store: the target) retries them away
    let t = Target::ours("rules:\n  - {type: error, op: write, times: 2}\n");
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("e.yaml");
    std::fs::write(
        &f,
        format!(
            "name: nbd-client\ndisk: {{store: '{}', size: 64MiB, nbd: {{retries: 3, backoff: {{initial: 1ms, max: 10ms}}}}}}\nstack: raw\nworkload: {{size: 4MiB, block_size: 64KiB, mix: {{write: 100}}, interval: 100ms}}\n",
            t.uri
        ),
    )
    .unwrap();
    let out = dir.path().join("r");
    let o = Command::new(bin()).arg("run").arg(&f).arg("--out").arg(&out).arg("-q").output().unwrap();
    assert!(o.status.success(), "faultline run failed: {}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    let j: Value = serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    let rep = &j["setups"][0]["repetitions"][0];
    let c = &rep["nbd_client"];
    assert_eq!((c["retries"].as_u64(), c["remote_errors"].as_u64(), c["failed"].as_u64()), (Some(2), Some(2), Some(0)), "{c}");
    assert!(c["requests"].as_u64().unwrap() >= 64, "{c}");
    let per: u64 = c["intervals"].as_array().unwrap().iter().map(|i| i["retries"].as_u64().unwrap()).sum();
    assert_eq!(per, 2, "{c}");
    assert!(rep["integrity"]["corrupted"] == 0 && rep["failed_ios"] == 0, "{rep}");
    t.stop();
}

/// An experiment whose disk is a client disk over `t` (store: the target) with ext4 on its
/// loop device: the file workload writes and verifies through the file system, the client's
/// requests reach the target, and the target holds the ext4 file system afterwards.
fn ext4_experiment_over(t: &Target) {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("e.yaml");
    std::fs::write(
        &f,
        format!(
            "name: nbd-ext4\ndisk: {{store: '{}', size: 64MiB, nbd: {{timeout: 10s, retries: 3}}}}\nstack: ext4\n\
workload: {{pattern: uniform, mix: {{write: 70}}, size: 8MiB, files: 2, file_size: 4MiB, block_size: 16KiB}}\n",
            t.uri
        ),
    )
    .unwrap();
    let out = dir.path().join("r");
    let o = Command::new(bin()).arg("run").arg(&f).arg("--out").arg(&out).arg("-q").output().unwrap();
    assert!(o.status.success(), "faultline run failed: {}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    let j: Value = serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    let rep = &j["setups"][0]["repetitions"][0];
    let i = &rep["integrity"];
    assert!(i["ok"].as_u64().unwrap() > 0 && i["corrupted"] == 0 && i["unreadable"] == 0 && i["missing"] == 0, "{i}");
    assert!(rep["write"]["ops"].as_u64().unwrap() > 0 && rep["failed_ios"] == 0, "{rep}");
    let c = &rep["nbd_client"];
    assert!(c["requests"].as_u64().unwrap() > 100, "the client disk's requests went to the target: {c}");
    assert_eq!(c["failed"], 0, "{c}");
    // the file system is on the target: ext4's superblock magic at 1024 + 56
    let direct = Client::connect(&t.uri.parse().unwrap()).unwrap();
    let mut sb = vec![0u8; 2];
    direct.read(1024 + 56, &mut sb).unwrap();
    assert_eq!(sb, [0x53, 0xef], "ext4 superblock magic on the target");
}

#[test]
fn experiment_with_ext4_on_a_client_disk_over_our_server() {
    let t = Target::ours("rules: []\n");
    ext4_experiment_over(&t);
    let st = t.call(json!({"cmd": "stats"}));
    assert!(st["requests"].as_u64().unwrap() > 100, "{st}");
    assert_eq!(st["nbd_server"]["in_flight"], 0, "{st}");
    t.stop();
}

#[test]
fn experiment_with_ext4_on_a_client_disk_over_nbdkit() {
    let Some(t) = Target::nbdkit_memory() else { return };
    ext4_experiment_over(&t);
    t.stop();
}

/// A networked experiment whose target disk delays reads in a window: the target's probes
/// show the requests piling up in our server (its queue depth) inside the window.
#[test]
fn target_queue_depth_is_probed_in_networked_experiments() {
    if !Path::new("/dev/net/tun").exists() {
        skip("target_queue_depth_is_probed_in_networked_experiments", "needs /dev/net/tun");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("e.yaml");
    std::fs::write(
        &f,
        "name: queue\nhosts: {clients: [client], target: faultline, interval: 250ms}\ndisk: {size: 64MiB}\nmonitor: off\n\
workload: {pattern: uniform, block_size: 8KiB, mix: {read: 100}, threads: 4, duration: 4s}\n\
faults:\n  - {type: delay, op: read, delay: 20ms, window: {from: 1500ms, to: 3s}}\n",
    )
    .unwrap();
    let out = dir.path().join("r");
    let o = Command::new(bin()).arg("run").arg(&f).arg("--out").arg(&out).arg("-q").output().unwrap();
    assert!(o.status.success(), "faultline run failed: {}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    let j: Value = serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    let probes = j["setups"][0]["repetitions"][0]["networked"]["probes"].as_array().unwrap().clone();
    let target: Vec<&Value> = probes.iter().filter(|p| p["host"] == "target").collect();
    let inside: Vec<f64> =
        target.iter().filter(|p| (1.9..=2.9).contains(&p["t_s"].as_f64().unwrap())).map(|p| p["target_queue_depth"].as_f64().unwrap()).collect();
    // four client threads, each with a read held 20 ms by the target: about 4 in flight
    assert!(!inside.is_empty() && inside.iter().all(|q| *q >= 2.0), "queue depth inside the delay window: {inside:?}");
    assert!(target.iter().any(|p| p["target_in_flight"].as_u64().unwrap() >= 1), "no request in flight at any sample: {target:?}");
    // client hosts have no target queue
    assert!(probes.iter().filter(|p| p["host"] == "client").all(|p| p["target_queue_depth"] == 0.0));
    let csv = std::fs::read_to_string(out.join("hosts_timeseries.csv")).unwrap();
    let head: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    let col = head.iter().position(|c| *c == "target_queue_depth").expect("a target_queue_depth column");
    let deepest = csv.lines().skip(1).filter_map(|l| l.split(',').nth(col)?.parse::<f64>().ok()).fold(0.0, f64::max);
    assert!(deepest >= 2.0, "hosts_timeseries.csv's deepest target queue: {deepest}");
}

/// Block `b`'s content for generation `g` (distinct per block and generation).
fn pattern(b: u64, g: u64) -> Vec<u8> {
    (0..BS).map(|i| (b.wrapping_mul(31) ^ g.wrapping_mul(7) ^ (i / 8)) as u8).collect()
}

/// Threads sharing one connection (`connections=1`): requests in flight together, replies out
/// of order (one block's reads answered late), each caller gets its own data; then a request
/// that times out among others in flight on the connection: it is retried on a fresh
/// connection and the others, failed with the old one, are re-sent and complete.
#[test]
fn one_connection_shared_by_threads_out_of_order_replies_and_a_timeout_among_them() {
    let t = Target::ours("rules:\n  - {type: delay, op: read, delay: 5ms, target: {block: 3}}\n");
    let c = Arc::new(Client::connect(&with_policy(&t.uri, "connections=1&timeout=5s").parse::<NbdTarget>().unwrap()).unwrap());
    assert_eq!(c.pool_size(), 1);
    let run = |c: &Arc<Client>, rounds: u64| {
        let hs: Vec<_> = (0..6u64)
            .map(|th| {
                let c = c.clone();
                std::thread::spawn(move || {
                    let mut b = vec![0u8; BS as usize];
                    for g in 0..rounds {
                        for k in 0..4 {
                            let blk = th * 4 + k;
                            c.write(blk * BS, &pattern(blk, g), false).unwrap();
                            c.read(blk * BS, &mut b).unwrap();
                            assert!(b == pattern(blk, g), "block {blk} generation {g}: another request's data");
                        }
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
    };
    run(&c, 40);
    let s = c.counters.snapshot();
    assert_eq!((s.requests, s.failed, s.timeouts, s.connection_errors), (6 * 40 * 4 * 2, 0, 0, 0), "{s:?}");
    drop(c);
    // block 100's next read is answered after 2 s; the client gives up after 300 ms
    let c = Arc::new(Client::connect(&with_policy(&t.uri, "connections=1&timeout=300ms&retries=5&backoff_initial=1ms").parse::<NbdTarget>().unwrap()).unwrap());
    c.write(100 * BS, &pattern(100, 9), false).unwrap();
    t.call(json!({"cmd": "add", "rules": "rules:\n  - {type: delay, op: read, delay: 2s, times: 1, target: {block: 100}}\n"}));
    let late = {
        let c = c.clone();
        std::thread::spawn(move || {
            let mut b = vec![0u8; BS as usize];
            c.read(100 * BS, &mut b).map(|()| b)
        })
    };
    // requests in flight beside it until it is done
    run(&c, 5);
    while !late.is_finished() {
        run(&c, 5);
    }
    assert!(late.join().unwrap().unwrap() == pattern(100, 9), "the timed-out read, retried, got its data");
    let s = c.counters.snapshot();
    assert_eq!((s.timeouts, s.failed), (1, 0), "{s:?}");
    assert!(s.reconnects >= 1 && s.retries >= 1, "{s:?}");
    drop(c);
    t.stop();
}
