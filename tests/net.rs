//! The emulated network (docs/net.md) with real namespaces and real traffic: ping, iperf3, and
//! our NBD server in the target host read by libnbd's nbdinfo/nbdcopy from the client host.
//! Asserts the mechanics: delay realized per packet, loss ratios within binomial bounds,
//! bursts from Gilbert-Elliott loss, duplicates, reordering and jitter, partition and its
//! clearing, windows on time, the rate
//! cap, reset, and nothing left after teardown or after kill -9 and `faultline cleanup`.

mod common;

use common::{RunDir, need_net, which};

use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A `faultline net up` child.
struct NetUp {
    child: Child,
    /// (host, namespace, address)
    hosts: Vec<(String, String, String)>,
    socket: PathBuf,
    /// The run directory its ledger is in.
    run_root: PathBuf,
    _dir: tempfile::TempDir,
}

impl NetUp {
    fn start(hosts: &str) -> NetUp {
        NetUp::start_with(hosts, &[])
    }

    fn start_with(hosts: &str, extra: &[&str]) -> NetUp {
        NetUp::start_at(hosts, extra, &common::run_root())
    }

    /// In a run directory of the test's own, for a test that runs `cleanup`.
    fn start_in(hosts: &str, run: &RunDir) -> NetUp {
        NetUp::start_at(hosts, &[], &run.0)
    }

    fn start_at(hosts: &str, extra: &[&str], run_root: &Path) -> NetUp {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("net.sock");
        let mut child = Command::new(common::bin())
            .args(["net", "up", "--hosts", hosts, "--socket"])
            .arg(&socket)
            .args(extra)
            .env("FAULTLINE_RUN_DIR", run_root)
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn faultline net up");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut hosts = Vec::new();
        loop {
            let mut l = String::new();
            assert!(out.read_line(&mut l).unwrap() > 0, "faultline net up ended before it was ready");
            let w: Vec<&str> = l.split_whitespace().collect();
            if w.first() == Some(&"host") {
                hosts.push((w[1].to_string(), w[3].to_string(), w[5].to_string()));
            }
            if l.starts_with("relay ready") {
                break;
            }
        }
        NetUp { child, hosts, socket, run_root: run_root.to_owned(), _dir: dir }
    }

    fn ns(&self, host: &str) -> &str {
        &self.hosts.iter().find(|h| h.0 == host).unwrap().1
    }

    fn exec(&self, host: &str, prog: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", self.ns(host), prog]);
        c
    }

    /// `faultline net set ARGS` through the CLI; returns the rule id.
    fn set(&self, args: &[&str]) -> u64 {
        let out = Command::new(common::bin()).args(["net", "set", "--socket"]).arg(&self.socket).args(args).output().unwrap();
        assert!(out.status.success(), "net set {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        v["id"].as_u64().unwrap()
    }

    fn clear(&self) {
        faultline::net::control::call(&self.socket, &json!({"cmd": "clear"})).unwrap();
    }

    fn show(&self) -> Value {
        faultline::net::control::call(&self.socket, &json!({"cmd": "show"})).unwrap()
    }

    fn link(&self, from: &str, to: &str) -> Value {
        self.show()["links"].as_array().unwrap().iter().find(|l| l["from"] == from && l["to"] == to).unwrap().clone()
    }

    /// SIGINT, as Ctrl-C; the exit status must be success.
    fn stop(mut self) -> Vec<String> {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), nix::sys::signal::Signal::SIGINT).unwrap();
        assert!(self.child.wait().unwrap().success());
        self.hosts.iter().map(|h| h.1.clone()).collect()
    }
}

impl Drop for NetUp {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), nix::sys::signal::Signal::SIGINT);
            let _ = self.child.wait();
        }
    }
}

/// One ping reply: (icmp_seq, rtt ms, unix time s).
fn ping(net: &NetUp, from: &str, to_addr: &str, count: u32, interval: &str) -> Vec<(u32, f64, f64)> {
    let out = net.exec(from, "ping").args(["-D", "-n", "-W", "1", "-i", interval, "-c", &count.to_string(), to_addr]).output().unwrap();
    parse_ping(&String::from_utf8_lossy(&out.stdout))
}

fn parse_ping(text: &str) -> Vec<(u32, f64, f64)> {
    text.lines()
        .filter_map(|l| {
            let ts: f64 = l.strip_prefix('[')?.split(']').next()?.parse().ok()?;
            let seq: u32 = l.split("icmp_seq=").nth(1)?.split_whitespace().next()?.parse().ok()?;
            let rtt: f64 = l.split("time=").nth(1)?.split_whitespace().next()?.parse().ok()?;
            Some((seq, rtt, ts))
        })
        .collect()
}

fn target_addr(net: &NetUp) -> String {
    net.hosts.iter().find(|h| h.0 == "target").unwrap().2.clone()
}

#[test]
fn delay_is_realized_per_packet() {
    if !need_net(&["ping"]) {
        return;
    }
    // through the relay both times, so the difference is the delay and not the relay's own path
    // against the kernel's veth (which moves with the machine's load)
    let net = NetUp::start_with("client,target", &["--always-relay"]);
    let t = target_addr(&net);
    let base = ping(&net, "client", &t, 60, "0.01").into_iter().map(|p| p.1).fold(f64::INFINITY, f64::min);
    net.set(&["--from", "client", "--to", "target", "--both", "--delay", "1ms"]);
    let with = ping(&net, "client", &t, 60, "0.01");
    // A delay loses nothing itself. The relay drops a delayed packet only when it was kept off the
    // CPU for more than 10 ms past the packet's due time (`overdue`, docs/net.md), which a busy VM
    // does now and then; every missing ping must be one of those.
    let (out, back) = (net.link("client", "target"), net.link("target", "client"));
    let overdue = out["overdue"].as_u64().unwrap() + back["overdue"].as_u64().unwrap();
    let dropped = out["dropped"].as_u64().unwrap() + back["dropped"].as_u64().unwrap();
    let missing: Vec<u32> = (1..=60).filter(|s| !with.iter().any(|p| p.0 == *s)).collect();
    assert!(missing.len() as u64 == overdue && dropped == overdue && overdue <= 3, "missing icmp_seq {missing:?}: {out} {back}");
    // 1 ms each way: every round trip is at least 2 ms longer than the fastest one without the
    // delay. Minima, not medians: other tests running beside this one only ever add time, so the
    // fastest round trips are the ones that show the relay's precision (timer lateness adds tens of
    // microseconds).
    let added = with.iter().map(|p| p.1 - base).fold(f64::INFINITY, f64::min);
    assert!((1.95..2.6).contains(&added), "added round-trip time {added:.3} ms at least, expected ~2 ms: {with:?}");
    let l = net.link("client", "target");
    assert!(l["delayed"].as_u64().unwrap() >= 60, "{l}");
    assert!(l["lateness_us"]["p50"].as_f64().is_some(), "{l}");
    let hosts = net.show()["hosts"].clone();
    assert!(hosts.as_array().unwrap().iter().all(|h| h["device_tx_dropped"].as_u64().is_some()), "the TUN devices' drop counters: {hosts}");
    net.stop();
}

/// Loss runs in a ping sequence: lengths of the runs of missing icmp_seq values.
#[test]
fn duplicate_reorder_and_jitter_act_per_packet() {
    if !need_net(&["ping"]) {
        return;
    }
    let net = NetUp::start_with("client,target", &["--always-relay"]);
    let t = target_addr(&net);
    // duplicate 100% of the requests: the target answers each twice, ping reports the second
    // answer as a duplicate
    net.set(&["--from", "client", "--to", "target", "--duplicate", "100%"]);
    let out = net.exec("client", "ping").args(["-n", "-W", "1", "-i", "0.01", "-c", "20", &t]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let dups = text.lines().filter(|l| l.contains("(DUP!)")).count();
    let l = net.link("client", "target");
    // ping ends at the 20th answer, before the last duplicate can arrive
    assert!((19..=20).contains(&dups), "{dups} duplicates: {text}\n{l}");
    assert!(l["duplicated"].as_u64() == l["packets"].as_u64() && l["delivered"].as_u64() == Some(2 * l["packets"].as_u64().unwrap()), "{l}");
    net.clear();
    // reorder half the requests by 30 ms: those answers come after later ones, and exactly the
    // reordered ones take 30 ms or more
    net.set(&["--from", "client", "--to", "target", "--reorder", "50%:30ms", "--seed", "7"]);
    let got = ping(&net, "client", &t, 40, "0.005");
    let l = net.link("client", "target");
    let held = got.iter().filter(|p| p.1 >= 30.0).count() as u64;
    let inversions = got.windows(2).filter(|w| w[1].0 < w[0].0).count();
    assert!(
        got.len() == 40 && held == l["reordered"].as_u64().unwrap() && (8..=32).contains(&held) && inversions > 0,
        "held {held}, inversions {inversions}: {l} {got:?}"
    );
    net.clear();
    // 5 ms +- 4 ms: the round trips spread over most of [1, 9] ms (plus the path's own time)
    net.set(&["--from", "client", "--to", "target", "--delay", "5ms", "--jitter", "4ms", "--seed", "7"]);
    let rtts: Vec<f64> = ping(&net, "client", &t, 100, "0.005").into_iter().map(|p| p.1).collect();
    let (lo, hi) = (rtts.iter().copied().fold(f64::INFINITY, f64::min), rtts.iter().copied().fold(0.0, f64::max));
    assert!(rtts.len() >= 97 && (1.0..2.5).contains(&lo) && hi > 7.5 && hi < 20.0, "jittered rtts from {lo} to {hi} ms: {rtts:?}");
    net.stop();
}

fn loss_runs(got: &[(u32, f64, f64)], n: u32) -> Vec<u32> {
    let mut have = vec![false; n as usize + 1];
    for p in got {
        if (p.0 as usize) <= n as usize {
            have[p.0 as usize] = true;
        }
    }
    let mut runs = Vec::new();
    let mut run = 0;
    for h in &have[1..] {
        if *h {
            if run > 0 {
                runs.push(run);
            }
            run = 0;
        } else {
            run += 1;
        }
    }
    if run > 0 {
        runs.push(run);
    }
    runs
}

#[test]
fn loss_ratio_is_within_binomial_bounds_and_gilbert_elliott_loses_in_bursts() {
    if !need_net(&["ping"]) {
        return;
    }
    let net = NetUp::start("client,target");
    let t = target_addr(&net);
    let n = 3000u32;
    // random 10% on the way out only: a missing reply is a lost request
    let id = net.set(&["--from", "client", "--to", "target", "--loss", "10%", "--seed", "7"]);
    let got = ping(&net, "client", &t, n, "0.001");
    let lost = n - got.len() as u32;
    let ratio = lost as f64 / n as f64;
    let sd = (0.1f64 * 0.9 / n as f64).sqrt();
    assert!((ratio - 0.1).abs() < 5.0 * sd, "realized loss {ratio:.4}, expected 0.1 +- {:.4}", 5.0 * sd);
    let l = net.link("client", "target");
    assert_eq!(l["dropped"].as_u64().unwrap(), lost as u64, "the relay's count is the pings lost: {l}");
    let runs = loss_runs(&got, n);
    let random_mean_run = runs.iter().sum::<u32>() as f64 / runs.len() as f64;
    faultline::net::control::call(&net.socket, &json!({"cmd": "clear", "ids": [id]})).unwrap();

    // Gilbert: enter bursts with 2%, leave with 20%: long-run 2/22 = 9.1%, bursts of 5 on average
    net.set(&["--from", "client", "--to", "target", "--loss-ge", "2%,20%", "--seed", "11"]);
    let got = ping(&net, "client", &t, n, "0.001");
    let ratio = (n - got.len() as u32) as f64 / n as f64;
    assert!((ratio - 2.0 / 22.0).abs() < 0.05, "Gilbert-Elliott loss {ratio:.4}, expected ~0.091");
    let runs = loss_runs(&got, n);
    let ge_mean_run = runs.iter().sum::<u32>() as f64 / runs.len() as f64;
    assert!(random_mean_run < 1.6 && ge_mean_run > 2.5, "mean loss run: random {random_mean_run:.2}, Gilbert-Elliott {ge_mean_run:.2}");
    net.stop();
}

/// `faultline serve --nbd tcp://ADDR:10809 --no-loop` in the target host.
struct NbdTarget {
    child: Child,
    uri: String,
    _dir: tempfile::TempDir,
}

impl NbdTarget {
    fn start(net: &NetUp) -> NbdTarget {
        let dir = tempfile::tempdir().unwrap();
        let addr = target_addr(net);
        let mut child = net
            .exec("target", common::bin())
            .args(["serve", "--size", "64MiB", "--no-loop", "--nbd", &format!("tcp://{addr}:10809"), "--socket"])
            .arg(dir.path().join("ctl.sock"))
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut l = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut l).unwrap();
        NbdTarget { child, uri: l.trim().to_string(), _dir: dir }
    }
}

impl Drop for NbdTarget {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), nix::sys::signal::Signal::SIGTERM);
        let _ = self.child.wait();
    }
}

fn nbdinfo_size(net: &NetUp, uri: &str) -> Option<String> {
    let out = net.exec("client", "timeout").args(["3", "nbdinfo", "--size", uri]).output().unwrap();
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

#[test]
fn nbd_over_the_relay_partition_blocks_and_clearing_restores() {
    if !need_net(&["ping"]) {
        return;
    }
    if !which("nbdinfo") || !which("nbdcopy") {
        common::skip("", "needs libnbd-bin (nbdinfo, nbdcopy)");
        return;
    }
    let net = NetUp::start("client,target");
    let srv = NbdTarget::start(&net);
    assert!(srv.uri.starts_with("nbd://"), "{}", srv.uri);
    assert_eq!(nbdinfo_size(&net, &srv.uri).as_deref(), Some("67108864"));

    // data in and out under delay, loss and duplication: TCP recovers, the bytes are the same
    net.set(&["--both", "--delay", "1ms", "--loss", "1%", "--duplicate", "1%", "--seed", "3"]);
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    let back = dir.path().join("back");
    let data: Vec<u8> = (0..4u32 << 20).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    std::fs::write(&src, &data).unwrap();
    for (a, b) in [(src.to_str().unwrap(), srv.uri.as_str()), (srv.uri.as_str(), back.to_str().unwrap())] {
        let st = net.exec("client", "nbdcopy").args([a, b]).status().unwrap();
        assert!(st.success(), "nbdcopy {a} {b}");
    }
    assert!(std::fs::read(&back).unwrap()[..data.len()] == data[..], "data read back differs");
    let l = net.link("client", "target");
    assert!(l["dropped"].as_u64().unwrap() > 0 && l["duplicated"].as_u64().unwrap() > 0, "{l}");
    net.clear();

    net.set(&["--from", "client", "--to", "target", "--partition"]);
    assert_eq!(nbdinfo_size(&net, &srv.uri), None, "a partitioned target answered");
    assert!(ping(&net, "client", &target_addr(&net), 3, "0.1").is_empty());
    net.clear();
    assert_eq!(nbdinfo_size(&net, &srv.uri).as_deref(), Some("67108864"), "clearing the partition did not restore the target");
    drop(srv);
    net.stop();
}

fn now_unix() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs_f64()
}

#[test]
fn window_begins_and_ends_on_time() {
    if !need_net(&["ping"]) {
        return;
    }
    let net = NetUp::start("client,target");
    let t = target_addr(&net);
    let p = net.exec("client", "ping").args(["-D", "-n", "-W", "1", "-i", "0.01", "-c", "350", &t]).stdout(Stdio::piped()).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let before = now_unix();
    net.set(&["--from", "client", "--to", "target", "--partition", "--window", "1s..2s"]);
    let after = now_unix();
    let out = p.wait_with_output().unwrap();
    let got = parse_ping(&String::from_utf8_lossy(&out.stdout));
    // the longest gap between replies is the window
    let (mut gap_from, mut gap_to) = (0.0, 0.0);
    for w in got.windows(2) {
        if w[1].2 - w[0].2 > gap_to - gap_from {
            (gap_from, gap_to) = (w[0].2, w[1].2);
        }
    }
    // pings go every 10 ms: the last reply comes within ~10 ms before the start (later if
    // the machine is slow), the first after it within ~10 ms after the end
    let tol = 0.06;
    assert!(gap_from > before + 1.0 - tol && gap_from < after + 1.0 + 0.005, "window start: last reply {:.3} s after set", gap_from - before);
    assert!(gap_to > before + 2.0 - 0.005 && gap_to < after + 2.0 + tol, "window end: first reply {:.3} s after set", gap_to - before);
    net.stop();
}

#[test]
fn rate_caps_bandwidth() {
    if !need_net(&["ping"]) {
        return;
    }
    if !which("iperf3") {
        common::skip("", "needs iperf3");
        return;
    }
    let net = NetUp::start("client,target");
    let t = target_addr(&net);
    net.set(&["--from", "client", "--to", "target", "--rate", "20mbit"]);
    let mut srv = net.exec("target", "iperf3").args(["-s", "-1"]).stdout(Stdio::null()).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let out = net.exec("client", "iperf3").args(["-c", &t, "-t", "3", "-J"]).output().unwrap();
    let _ = srv.wait();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let bps = v["end"]["sum_received"]["bits_per_second"].as_f64().unwrap();
    assert!((14e6..21e6).contains(&bps), "received {:.1} Mbit/s through a 20 Mbit/s cap", bps / 1e6);
    net.stop();
}

#[test]
fn reset_breaks_a_connection_in_use() {
    if !need_net(&["ping"]) {
        return;
    }
    if !which("nbdcopy") {
        common::skip("", "needs libnbd-bin (nbdcopy)");
        return;
    }
    let net = NetUp::start("client,target");
    let srv = NbdTarget::start(&net);
    // slow the copy down so it is still running when the reset comes
    net.set(&["--from", "target", "--to", "client", "--rate", "8mbit"]);
    let mut copy = net.exec("client", "nbdcopy").args([srv.uri.as_str(), "null:"]).stderr(Stdio::null()).spawn().unwrap();
    std::thread::sleep(Duration::from_secs(1));
    assert!(copy.try_wait().unwrap().is_none(), "the copy finished before the reset");
    let t = Instant::now();
    net.set(&["--from", "target", "--to", "client", "--reset"]);
    let st = loop {
        if let Some(st) = copy.try_wait().unwrap() {
            break st;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "nbdcopy still runs 20 s after the reset");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!st.success(), "nbdcopy succeeded through a reset");
    assert!(net.link("target", "client")["reset"].as_u64().unwrap() > 0);
    net.clear();
    assert_eq!(nbdinfo_size(&net, &srv.uri).as_deref(), Some("67108864"), "new connections work again after the reset is cleared");
    drop(srv);
    net.stop();
}

/// Without rules a link takes its veth (the relay sees nothing); a windowed delay moves it to
/// the relay before the window opens, the delay is realized exactly inside the window and not
/// outside it, and the link goes back to the veth after the window.
#[test]
fn bypass_follows_the_window_and_the_delay_is_exact() {
    if !need_net(&["ping"]) {
        return;
    }
    let net = NetUp::start("client,target");
    let t = target_addr(&net);
    assert_eq!(ping(&net, "client", &t, 5, "0.01").len(), 5);
    let l = net.link("client", "target");
    assert_eq!((l["path"].as_str(), l["packets"].as_u64()), (Some("veth"), Some(0)), "no rule: the veth carries the link: {l}");
    assert!(l["bypass_packets"].as_u64().unwrap() >= 5, "{l}");
    let p = net.exec("client", "ping").args(["-D", "-n", "-W", "1", "-i", "0.01", "-c", "300", &t]).stdout(Stdio::piped()).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let before = now_unix();
    net.set(&["--from", "client", "--to", "target", "--delay", "5ms", "--window", "1s..2s"]);
    let after = now_unix();
    assert_eq!(net.link("client", "target")["path"], "veth", "the window opens in 1 s: still on the veth");
    std::thread::sleep(Duration::from_millis(1500) - Duration::from_secs_f64(now_unix() - before));
    let mid = net.link("client", "target");
    assert_eq!(mid["path"], "relay", "inside the window: {mid}");
    assert_eq!(net.link("target", "client")["path"], "veth", "the other direction has no rule");
    let out = p.wait_with_output().unwrap();
    let got = parse_ping(&String::from_utf8_lossy(&out.stdout));
    assert!(got.len() >= 290, "{} of 300 replies", got.len());
    // the request left at reply time - rtt; inside the window it waits 5 ms in the relay
    let tol = 0.02;
    let (mut inside, mut outside) = (0, 0);
    for (seq, rtt, ts) in &got {
        let sent = ts - rtt / 1000.0;
        if sent > after + 1.0 + tol && sent < before + 2.0 - tol {
            assert!(*rtt >= 5.0, "ping {seq} sent {:.3} s after set, in the window: rtt {rtt} ms", sent - before);
            inside += 1;
        } else if sent < before + 1.0 - tol || sent > after + 2.0 + tol {
            assert!(*rtt < 5.0, "ping {seq} sent {:.3} s after set, outside the window: rtt {rtt} ms", sent - before);
            outside += 1;
        }
    }
    assert!(inside >= 50 && outside >= 100, "{inside} pings in the window, {outside} outside");
    let l = net.link("client", "target");
    assert!(l["delayed"].as_u64().unwrap() >= inside, "{l}");
    assert_eq!(l["late_switches"], 0, "the route reached the relay before the window opened: {l}");
    assert_eq!(l["path"], "veth", "after the window: back on the veth: {l}");
    net.stop();
}

/// `--always-relay`: no veths; links without rules go through the relay too.
#[test]
fn always_relay_carries_rule_free_links() {
    if !need_net(&["ping"]) {
        return;
    }
    let net = NetUp::start_with("client,target", &["--always-relay"]);
    assert_eq!(ping(&net, "client", &target_addr(&net), 3, "0.05").len(), 3);
    let l = net.link("client", "target");
    assert_eq!(l["path"], "relay", "{l}");
    assert!(l["delivered"].as_u64().unwrap() >= 3, "{l}");
    assert!(l["bypass_packets"].is_null(), "{l}");
    net.stop();
}

fn ns_exists(ns: &str) -> bool {
    Path::new("/run/netns").join(ns).exists()
}

fn ledgers_of(run_root: &Path, pid: u32) -> usize {
    std::fs::read_dir(run_root.join("runs"))
        .map(|rd| rd.flatten().filter(|e| e.file_name().to_string_lossy().starts_with(&format!("{pid}-"))).count())
        .unwrap_or(0)
}

#[test]
fn ctrl_c_leaves_nothing() {
    if !need_net(&["ping"]) {
        return;
    }
    let net = NetUp::start("client,target,client-2");
    let pid = net.child.id();
    // a second client reaches the target too (no rule: over its veth fast path)
    assert_eq!(ping(&net, "client-2", &target_addr(&net), 3, "0.05").len(), 3);
    let l = net.link("client-2", "target");
    assert_eq!(l["path"], "veth", "{l}");
    assert!(l["bypass_packets"].as_u64().unwrap() >= 3, "{l}");
    let mut sleeper = net.exec("target", "sleep").arg("1000").spawn().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let run_root = net.run_root.clone();
    let ns = net.stop();
    assert_eq!(ns.len(), 3);
    for n in &ns {
        assert!(!ns_exists(n), "{n} left behind");
    }
    assert!(sleeper.try_wait().unwrap().is_some(), "a process in a host survived its teardown");
    assert_eq!(ledgers_of(&run_root, pid), 0, "ledger left behind");
    assert!(!Command::new("ip").args(["link", "show", "fl0"]).stderr(Stdio::null()).status().unwrap().success(), "fl0 in the root namespace");
}

#[test]
fn kill9_then_cleanup_leaves_nothing() {
    if !need_net(&["ping"]) {
        return;
    }
    let run = RunDir::new("netkill9");
    let mut net = NetUp::start_in("client,target", &run);
    let pid = net.child.id();
    let sleeper = net.exec("client", "sleep").arg("1000").spawn().unwrap();
    std::thread::sleep(Duration::from_millis(200));
    net.child.kill().unwrap();
    net.child.wait().unwrap();
    let ns: Vec<String> = net.hosts.iter().map(|h| h.1.clone()).collect();
    assert!(ns.iter().all(|n| ns_exists(n)), "namespaces went with the relay: nothing to test");
    let (text, _) = run.cleanup();
    for n in &ns {
        assert!(!ns_exists(n), "{n} left after cleanup:\n{text}");
        assert!(text.contains(&format!("deleted network namespace {n}")), "{text}");
    }
    let mut s = sleeper;
    assert!(s.try_wait().unwrap().is_some(), "a process in a host survived cleanup");
    assert_eq!(ledgers_of(&net.run_root, pid), 0, "ledger left after cleanup");
    assert!(!net.socket.exists(), "control socket left after cleanup");
}

#[test]
fn bad_input_says_what_is_allowed() {
    let run = |args: &[&str]| {
        let out = Command::new(common::bin()).args(args).output().unwrap();
        assert!(!out.status.success(), "{args:?} was accepted");
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    assert!(run(&["net", "up", "--hosts", "client"]).contains("at least two hosts"));
    assert!(run(&["net", "up", "--hosts", "client,Target"]).contains("a-z, 0-9"));
    assert!(run(&["net", "set", "--socket", "/nonexistent", "--loss", "150%"]).contains("between 0 and 1"));
    assert!(run(&["net", "set", "--socket", "/nonexistent", "--rate", "100"]).contains("mbit"));
    assert!(run(&["net", "set", "--socket", "/nonexistent", "--jitter", "1ms"]).contains("jitter needs a delay"));
    assert!(run(&["net", "set", "--socket", "/nonexistent", "--window", "5s..2s", "--partition"]).contains("after its start"));
    if !need_net(&["ping"]) {
        return;
    }
    let net = NetUp::start("client,target");
    let out = Command::new(common::bin()).args(["net", "set", "--socket"]).arg(&net.socket).args(["--from", "clint", "--partition"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("the hosts are: client, target"));
    let out = Command::new(common::bin()).args(["net", "clear", "--socket"]).arg(&net.socket).arg("99").output().unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("no network rule 99"));
    net.stop();
}
