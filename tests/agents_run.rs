//! Experiments through agents (docs/cluster.md, run::agents): one target and four client hosts
//! built here as network namespaces on a bridge (tests/common/lab.rs, as a user would build a
//! lab: faultline builds no namespaces), reached by `ip netns exec` and by real OpenSSH (an
//! sshd per namespace, keys in a temp dir, host keys checked). Checks that the run works,
//! that the hosts' series line up on the controller's clock (offsets within their bounds on
//! one machine), that throughput equals the namespace run of the same workload, that killing a
//! client's agent mid-run aborts or continues as documented, that a power cut of the target
//! loses no flushed block (one client, and two clients with a slice of the disk and an oracle
//! each) and ends cleanly when its crash phase is cut short, and that nothing is left.

mod common;

use common::lab::Lab;
use common::{bin, need_net, skip, which};
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const CLIENTS: [&str; 4] = ["c1", "c2", "c3", "c4"];
/// Each client asks for this rate; both runs must deliver it (rate-limited, so the comparison
/// does not depend on the relay's or the bridge's speed).
const RATE: u64 = 100;
const SECONDS: u64 = 3;
/// Throughput through agents vs the namespace run: equal within this fraction.
const TOLERANCE: f64 = 0.15;

/// The tests' hosts share this machine's 2 CPUs: a test that checks rates, windows or delays
/// runs alone (`serial`), since it needs the CPU time it asks for; tests that check what
/// happens (losses, cuts, cleanup) and not how fast run two at a time (`shared`).
static CPUS: std::sync::RwLock<()> = std::sync::RwLock::new(());

fn serial() -> std::sync::RwLockWriteGuard<'static, ()> {
    CPUS.write().unwrap_or_else(|e| e.into_inner())
}

fn shared() -> std::sync::RwLockReadGuard<'static, ()> {
    CPUS.read().unwrap_or_else(|e| e.into_inner())
}

fn workload() -> String {
    format!("workload: {{pattern: uniform, block_size: 4KiB, mix: {{read: 100}}, duration: {SECONDS}s, rate_iops: {RATE}}}\n")
}

fn agents_yaml(lab: &Lab, channel: impl Fn(&str) -> String) -> String {
    let mut s = "  agents:\n".to_string();
    for h in std::iter::once("target").chain(CLIENTS) {
        s += &format!("    {h}: {{{}, address: {}, faultline: {}}}\n", channel(h), lab.addr(h), bin());
    }
    s
}

fn experiment(dir: &Path, hosts: &str) -> std::path::PathBuf {
    let f = dir.join("e.yaml");
    let text = format!("name: a\nhosts:\n  clients: [{}]\n  interval: 500ms\n{hosts}disk: {{size: 64MiB}}\nmonitor: off\n{}", CLIENTS.join(", "), workload());
    std::fs::write(&f, text).unwrap();
    f
}

/// `faultline run` with its own run directory (its ledgers and the agents' are there).
fn run(file: &Path, out: &Path, run_dir: &Path, netns: Option<&str>) -> Output {
    let mut c = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, bin()]);
            c
        }
        None => Command::new(bin()),
    };
    c.arg("run").arg(file).arg("--out").arg(out).arg("-q").env("FAULTLINE_RUN_DIR", run_dir).output().unwrap()
}

fn study(out: &Path) -> Value {
    let r: Value = serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    r["setups"][0]["repetitions"][0]["networked"].clone()
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}

fn total_ops(st: &Value) -> f64 {
    st["clients"].as_array().unwrap().iter().map(|c| c["ops"].as_u64().unwrap() as f64).sum()
}

/// Nothing left: no process in any lab host, no ledger, no nftables table of ours.
fn assert_nothing_left(lab: &Lab, run_dir: &Path) {
    let t = Instant::now();
    loop {
        let left: Vec<(String, Vec<i32>)> = lab.hosts.iter().map(|h| (h.0.clone(), lab.pids(&h.0))).filter(|(_, p)| !p.is_empty()).collect();
        let ledgers: Vec<_> = std::fs::read_dir(run_dir.join("runs")).map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect()).unwrap_or_default();
        if left.is_empty() && ledgers.is_empty() {
            break;
        }
        let texts: Vec<String> = ledgers.iter().map(|l| std::fs::read_to_string(l).unwrap_or_default()).collect();
        assert!(t.elapsed() < Duration::from_secs(15), "left behind: processes {left:?}, ledgers {ledgers:?} {texts:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    for h in &lab.hosts {
        let o = Command::new("ip").args(["netns", "exec", &h.1, "nft", "list", "tables"]).output().unwrap();
        assert!(!String::from_utf8_lossy(&o.stdout).contains("faultline_"), "nftables table left on {}", h.0);
        let o = Command::new("ip").args(["-n", &h.1, "link", "show"]).output().unwrap();
        assert!(!String::from_utf8_lossy(&o.stdout).contains("flq"), "the engine's TUN device left on {}", h.0);
        let o = Command::new("ip").args(["-n", &h.1, "route", "show"]).output().unwrap();
        assert!(!String::from_utf8_lossy(&o.stdout).contains("/32"), "a route left on {}", h.0);
    }
}

/// The checks every successful run through agents passes.
fn check_aligned(st: &Value) {
    let agents = st["agents"].as_array().unwrap();
    assert_eq!(agents.len(), 5, "{st}");
    for a in agents {
        // one machine, one clock: the offset is 0 within its error bound
        assert!(f(&a["offset_ms"]).abs() <= f(&a["offset_error_ms"]) + 1.0, "{a}");
        assert!(a["lost"].is_null(), "{a}");
    }
    // the clients started together at the agreed instant T (the series count from T on the
    // controller's clock): the first I/O came `start_lag_s` after T, each series' first
    // interval ends one interval after its client's start, not before the earliest start
    let lag = f(&st["start_lag_s"]);
    assert!((0.0..1.0).contains(&lag), "start lag {lag} s");
    let clients = st["clients"].as_array().unwrap();
    assert_eq!(clients.len(), 4);
    for c in clients {
        let p = c["points"].as_array().unwrap();
        assert!(p.len() >= (SECONDS * 2) as usize, "{c}");
        let start = f(&p[0]["t_s"]) - 0.5;
        assert!(start >= lag - 0.05 && start < lag + 1.0, "{}: starts at {start} s, the first client at {lag} s", c["host"]);
        let last = f(&p[p.len() - 1]["t_s"]);
        assert!((start + SECONDS as f64 - 0.2..start + SECONDS as f64 + 0.5).contains(&last), "{}: last point at {last} s", c["host"]);
        assert_eq!(c["failed_ios"], 0);
    }
    // every host sampled, on the controller's clock, inside the run
    for h in std::iter::once("target").chain(CLIENTS) {
        let ts: Vec<f64> = st["probes"].as_array().unwrap().iter().filter(|p| p["host"] == h).map(|p| f(&p["t_s"])).collect();
        assert!(ts.len() >= SECONDS as usize, "host {h}: {ts:?}");
        assert!(ts.iter().all(|t| *t > 0.0 && *t < SECONDS as f64 + 3.0), "host {h}: {ts:?}");
    }
    // the target's prober saw its server's CPU and the clients' their workload's traffic
    let busy = st["probes"].as_array().unwrap().iter().filter(|p| p["host"] == "target").any(|p| f(&p["cpu_user_pct"]) + f(&p["cpu_system_pct"]) > 0.0);
    assert!(busy, "the target's server used no CPU?");
    let requests: u64 = st["probes"].as_array().unwrap().iter().filter(|p| p["host"] == "target").map(|p| p["requests"].as_u64().unwrap()).sum();
    let ops: u64 = st["clients"].as_array().unwrap().iter().map(|c| c["ops"].as_u64().unwrap()).sum();
    assert!(requests > ops / 2, "the target's prober counted {requests} requests for {ops} client ops");
    let c1_ops: u64 = st["probes"].as_array().unwrap().iter().filter(|p| p["host"] == "c1").map(|p| p["ops"].as_u64().unwrap()).sum();
    assert!(c1_ops > 0, "c1's probes counted no ops");
}

/// Whether this machine can build the lab (namespaces), with OpenSSH and with nftables where
/// asked; else the test is reported skipped.
fn lab_can(ssh: bool, nft: bool) -> bool {
    if !need_net(&[]) {
        return false;
    }
    if ssh && (!Path::new("/usr/sbin/sshd").exists() || !which("ssh")) {
        skip("", "needs OpenSSH (apt-get install openssh-server openssh-client)");
        return false;
    }
    if nft && !which("nft") {
        skip("", "needs nftables (apt-get install nftables)");
        return false;
    }
    true
}

#[test]
fn four_clients_through_exec_line_up_and_match_the_namespace_run() {
    let _one = serial();
    if !need_net(&[]) {
        return;
    }
    let lab = Lab::new("x", &["target", "c1", "c2", "c3", "c4"]);
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    let file = experiment(dir.path(), &agents_yaml(&lab, |h| format!("exec: [ip, netns, exec, {}]", lab.ns(h))));
    let o = run(&file, &dir.path().join("out"), &run_dir, None);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let st = study(&dir.path().join("out"));
    check_aligned(&st);
    assert_nothing_left(&lab, &run_dir);
    // the same file with hosts as faultline's namespaces (no `agents:`)
    let file = experiment(dir.path(), "");
    let o = run(&file, &dir.path().join("out-ns"), &run_dir, None);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let ns = study(&dir.path().join("out-ns"));
    let (a, b) = (total_ops(&st), total_ops(&ns));
    let want = (RATE * SECONDS * 4) as f64;
    assert!((a / b - 1.0).abs() <= TOLERANCE, "through agents {a} ops, namespace run {b} ops (tolerance {TOLERANCE})");
    assert!((a / want - 1.0).abs() <= TOLERANCE, "through agents {a} ops, asked for {want}");
}

/// The pid of the agent (`faultline agent --stdio`) running in a lab host.
fn agent_pid(lab: &Lab, host: &str) -> Option<i32> {
    lab.pids(host).into_iter().find(|p| {
        let c = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
        String::from_utf8_lossy(&c).replace('\0', " ").contains("agent --stdio")
    })
}

/// A run whose c1 agent gets `sig` (SIGKILL: its channel closes; SIGSTOP: it stops answering)
/// a second into the workload.
fn run_and_kill_c1(policy: &str, sig: nix::sys::signal::Signal) -> (Output, Lab, tempfile::TempDir) {
    let lab = Lab::new(&format!("{}{}", &policy[..1], sig as i32), &["target", "c1", "c2", "c3", "c4"]);
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    let hosts = format!("  on_agent_loss: {policy}\n{}", agents_yaml(&lab, |h| format!("exec: [ip, netns, exec, {}]", lab.ns(h))));
    let file = experiment(dir.path(), &hosts);
    let child = Command::new(bin())
        .arg("run")
        .arg(&file)
        .arg("--out")
        .arg(dir.path().join("out"))
        .arg("-q")
        .env("FAULTLINE_RUN_DIR", &run_dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // the workload runs once c1 has a process besides its agent and prober... wait for it
    let t = Instant::now();
    let mut pid = None;
    while t.elapsed() < Duration::from_secs(30) {
        let procs = lab.pids("c1");
        let workload = procs.iter().any(|p| String::from_utf8_lossy(&std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default()).contains("workload"));
        if workload {
            pid = agent_pid(&lab, "c1");
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid = pid.expect("c1's workload never started");
    // into the workload (it waits for the agreed start, at most ~1.5 s)
    std::thread::sleep(Duration::from_millis(2500));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), sig).unwrap();
    let o = child.wait_with_output().unwrap();
    assert_nothing_left(&lab, &run_dir);
    (o, lab, dir)
}

#[test]
fn killing_a_client_agent_aborts_the_run() {
    let _two = shared();
    if !need_net(&[]) {
        return;
    }
    let (o, _lab, _dir) = run_and_kill_c1("abort", nix::sys::signal::Signal::SIGKILL);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "the run went on after losing an agent with on_agent_loss: abort");
    assert!(err.contains("agent on host c1 lost") && err.contains("running the workload") && err.contains("on_agent_loss: abort"), "{err}");
}

#[test]
fn killing_a_client_agent_with_continue_finishes_without_it() {
    let _two = shared();
    if !need_net(&[]) {
        return;
    }
    let (o, _lab, dir) = run_and_kill_c1("continue", nix::sys::signal::Signal::SIGKILL);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let st = study(&dir.path().join("out"));
    let c1 = st["agents"].as_array().unwrap().iter().find(|a| a["host"] == "c1").unwrap().clone();
    let lost = &c1["lost"];
    assert!(!lost.is_null(), "c1's loss is not in the results: {c1}");
    let t_lost = f(&lost["t_s"]);
    assert!(t_lost > 0.0 && t_lost < SECONDS as f64, "{lost}");
    assert_eq!(lost["doing"], "running the workload");
    let html = std::fs::read_to_string(dir.path().join("out").join("report.html")).unwrap();
    assert!(html.contains("<h3>Agents</h3>") && html.contains("while running the workload"), "the report does not show the loss");
    // no samples of c1 after its loss; the others ran to the end
    assert!(st["probes"].as_array().unwrap().iter().filter(|p| p["host"] == "c1").all(|p| f(&p["t_s"]) <= t_lost), "c1 sampled after its loss");
    for c in st["clients"].as_array().unwrap() {
        let last = c["points"].as_array().unwrap().last().map_or(0.0, |p| f(&p["t_s"]));
        if c["host"] == "c1" {
            assert!(last <= t_lost + 0.6, "c1's series goes past its loss: {last} > {t_lost}");
        } else {
            assert!(last >= SECONDS as f64 - 0.2, "{} stopped early at {last}", c["host"]);
        }
    }
}

#[test]
fn a_client_agent_that_stops_answering_is_lost_by_the_heartbeat() {
    let _two = shared();
    if !need_net(&[]) {
        return;
    }
    let (o, _lab, dir) = run_and_kill_c1("continue", nix::sys::signal::Signal::SIGSTOP);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let st = study(&dir.path().join("out"));
    let c1 = st["agents"].as_array().unwrap().iter().find(|a| a["host"] == "c1").unwrap().clone();
    assert!(c1["lost"]["reason"].as_str().is_some_and(|r| r.contains("stopped answering")), "{c1}");
    let others: Vec<&Value> = st["agents"].as_array().unwrap().iter().filter(|a| a["host"] != "c1").collect();
    assert!(others.iter().all(|a| a["lost"].is_null()), "{others:?}");
}

/// An sshd inside each of `hosts` (keys made in `d`, host keys checked by the client; the
/// agents' run directory passed along): the `ssh_options` that reach them, and the sshds.
fn sshd_lab(d: &Path, lab: &Lab, hosts: &[&str], run_dir: &Path) -> (String, Vec<std::process::Child>) {
    for k in ["host", "client"] {
        assert!(Command::new("ssh-keygen").args(["-q", "-t", "ed25519", "-N", "", "-f"]).arg(d.join(k)).status().unwrap().success());
    }
    std::fs::copy(d.join("client.pub"), d.join("authorized_keys")).unwrap();
    std::fs::create_dir_all("/run/sshd").unwrap();
    let host_pub = std::fs::read_to_string(d.join("host.pub")).unwrap();
    let mut known = String::new();
    let mut sshds = Vec::new();
    for h in hosts {
        let cfg = d.join(format!("sshd-{h}"));
        std::fs::write(
            &cfg,
            format!(
                "Port 22\nListenAddress {}\nHostKey {}\nAuthorizedKeysFile {}\nPermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nPidFile none\nAcceptEnv FAULTLINE_RUN_DIR\n",
                lab.addr(h),
                d.join("host").display(),
                d.join("authorized_keys").display()
            ),
        )
        .unwrap();
        known += &format!("{} {host_pub}", lab.addr(h));
        // nsenter enters only the network namespace: `ip netns exec` would also mount a /sys of
        // its own, without the cgroup file system the host faults need
        sshds.push(
            Command::new("nsenter")
                .args([&format!("--net=/run/netns/{}", lab.ns(h)), "/usr/sbin/sshd", "-D", "-e", "-f"])
                .arg(&cfg)
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
    }
    std::fs::write(d.join("known_hosts"), known).unwrap();
    let opts = format!(
        "[-i, {}, -o, UserKnownHostsFile={}, -o, StrictHostKeyChecking=yes, -o, SetEnv=FAULTLINE_RUN_DIR={}]",
        d.join("client").display(),
        d.join("known_hosts").display(),
        run_dir.display()
    );
    // sshd needs a moment to listen
    std::thread::sleep(Duration::from_millis(500));
    (opts, sshds)
}

/// An sshd inside each lab host (keys made here, host keys checked by the client), and a
/// controller namespace on the same bridge from which `faultline run` reaches them.
#[test]
fn four_clients_over_openssh() {
    let _one = serial();
    if !lab_can(true, false) {
        return;
    }
    let lab = Lab::new("s", &["target", "c1", "c2", "c3", "c4", "ctl"]);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let run_dir = d.join("run");
    let hosts: Vec<&str> = std::iter::once("target").chain(CLIENTS).collect();
    let (opts, sshds) = sshd_lab(d, &lab, &hosts, &run_dir);
    // the target gets its faultline copied over ssh first (`install: true`), and serves from the copy
    let copy = d.join("bin").join("faultline");
    std::fs::create_dir_all(copy.parent().unwrap()).unwrap();
    let hosts = agents_yaml(&lab, |h| format!("ssh: root@{}, ssh_options: {opts}", lab.addr(h))).replacen(
        &format!("faultline: {}}}", bin()),
        &format!("faultline: {}, install: true}}", copy.display()),
        1,
    );
    let file = experiment(d, &hosts);
    let o = run(&file, &d.join("out"), &run_dir, Some(lab.ns("ctl")));
    for mut s in sshds {
        let _ = s.kill();
        let _ = s.wait();
    }
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let st = study(&d.join("out"));
    check_aligned(&st);
    assert!(st["agents"].as_array().unwrap().iter().all(|a| a["channel"].as_str().unwrap().starts_with("ssh root@10.99.0.")), "{}", st["agents"]);
    assert_eq!(std::fs::read(&copy).unwrap(), std::fs::read(bin()).unwrap(), "the target's copy differs");
    let want = (RATE * SECONDS * 4) as f64;
    assert!((total_ops(&st) / want - 1.0).abs() <= TOLERANCE, "over ssh {} ops, asked for {want}", total_ops(&st));
    assert_nothing_left(&lab, &run_dir);
}

/// Network faults on the sending host: a partition through nftables is realized in its window
/// and only on its link; a delay (no tc netem on this kernel) through the relay's engine on the
/// sending host is realized in its window, and only on its link.
#[test]
fn net_faults_use_nftables_and_delay_the_user_space_engine() {
    let _one = serial();
    if !lab_can(false, true) {
        return;
    }
    let lab = Lab::new("n", &["target", "c1", "c2"]);
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    let agents = lab.exec_agents_yaml(&["target", "c1", "c2"], bin());
    let base = format!("name: n\nhosts:\n  clients: [c1, c2]\n  interval: 250ms\n{agents}disk: {{size: 64MiB}}\nmonitor: off\n{}", workload());
    let file = dir.path().join("e.yaml");
    std::fs::write(&file, format!("{base}net_faults:\n  - {{from: c1, to: target, both: true, partition: true, window: {{from: 1s, to: 2s}}}}\n")).unwrap();
    let o = run(&file, &dir.path().join("out"), &run_dir, None);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let st = study(&dir.path().join("out"));
    let ws: Vec<&Value> = st["window_stats"].as_array().unwrap().iter().collect();
    let ratio = |c: &str| ws.iter().find(|w| w["client"] == c).map(|w| f(&w["ratio"])).unwrap();
    assert!(ratio("c1") < 0.3, "c1 went on through its partition: {ws:?}");
    assert!(ratio("c2") > 0.8, "c2 was hit by c1's partition: {ws:?}");
    assert_nothing_left(&lab, &run_dir);
    // delay goes through the user-space engine on c1 (no tc netem here): c1's requests wait
    // 1 ms more inside the window, not before or after it, and c2's do not
    // (6 s, window 2..4 s: enough intervals on each side for medians on a busy machine)
    let longer = base.replace(&format!("duration: {SECONDS}s"), "duration: 6s");
    std::fs::write(&file, format!("{longer}net_faults:\n  - {{from: c1, to: target, delay: 1ms, window: {{from: 2s, to: 4s}}}}\n")).unwrap();
    let o = run(&file, &dir.path().join("out2"), &run_dir, None);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    check_delay_window(&dir.path().join("out2"), "c1", "c2", 2.0, 4.0, 1.0);
    assert_nothing_left(&lab, &run_dir);
    // bursty loss (Gilbert-Elliott) from the target to c2 goes through the target's engine:
    // its counters show the drops, and c2's reads go on (TCP resends)
    std::fs::write(&file, format!("{base}net_faults:\n  - {{from: target, to: c2, loss_bursts: \"20%,50%\", window: {{from: 1s, to: 2s}}}}\n")).unwrap();
    let o = run(&file, &dir.path().join("out3"), &run_dir, None);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r: Value = serde_json::from_str(&std::fs::read_to_string(dir.path().join("out3/results.json")).unwrap()).unwrap();
    let notes = r["setups"][0]["repetitions"][0]["notes"].to_string();
    let at = notes.find("user space on target -> c2").unwrap_or_else(|| panic!("no engine note: {notes}"));
    let dropped: u64 = notes[at..].split("dropped ").nth(1).and_then(|x| x.split(',').next()).and_then(|x| x.parse().ok()).unwrap();
    assert!(dropped > 0, "{notes}");
    assert!(!notes.contains("user space on target -> c1"), "{notes}");
    assert_nothing_left(&lab, &run_dir);
}

/// `client`'s latency against `other`'s before, inside and after a window [from, to] s in
/// which `client`'s packets to the target waited `add_ms` ms more (and `other`'s did not).
/// Also the engine's own counters (results' notes).
fn check_delay_window(out: &Path, client: &str, other: &str, from: f64, to: f64, add_ms: f64) {
    let r: Value = serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    let rep = &r["setups"][0]["repetitions"][0];
    let notes: Vec<&str> = rep["notes"].as_array().unwrap().iter().filter_map(|n| n.as_str()).collect();
    let engine =
        notes.iter().find(|n| n.starts_with(&format!("network: user space on {client} -> target"))).unwrap_or_else(|| panic!("no engine note: {notes:?}"));
    let num = |k: &str| -> u64 {
        engine.split(&format!("{k} ")).nth(1).and_then(|x| x.split(|c: char| !c.is_ascii_digit()).next()).and_then(|x| x.parse().ok()).unwrap_or(0)
    };
    assert!(num("delayed") > 10, "{engine}");
    assert_eq!(num("late route switches"), 0, "{engine}");
    // per interval, `client`'s mean latency minus `other`'s (the machine's load, shared by
    // both, cancels); the median over the intervals before, inside and after the window
    let st = &rep["networked"];
    let points = |c: &str| -> Vec<Value> { st["clients"].as_array().unwrap().iter().find(|x| x["host"] == c).unwrap()["points"].as_array().unwrap().clone() };
    let (pc, po) = (points(client), points(other));
    let median = |lo: f64, hi: f64| -> f64 {
        let mut v: Vec<f64> = pc.iter().zip(&po).filter(|(p, _)| (lo..=hi).contains(&f(&p["t_s"]))).map(|(p, q)| f(&p["mean_us"]) - f(&q["mean_us"])).collect();
        assert!(!v.is_empty(), "no interval ends in [{lo}, {hi}] s: {pc:?}");
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let iv = f(&st["interval_s"]);
    let (before, inside, after) = (median(iv, from), median(from + iv + 0.05, to), median(to + iv + 0.05, f64::MAX));
    let add = add_ms * 1000.0;
    assert!(inside - before >= 0.7 * add, "{client} minus {other}: {before:.0} us before the window, {inside:.0} us inside (want +{add} us)");
    let series = |p: &[Value]| p.iter().map(|x| format!("{:.2}s:{:.0}", f(&x["t_s"]), f(&x["mean_us"]))).collect::<Vec<_>>().join(" ");
    assert!(
        after - before <= 0.3 * add,
        "{client} minus {other}: {before:.0} us before the window, {after:.0} us after it (the delay did not end): {client} {} / {other} {} / {engine}",
        series(&pc),
        series(&po)
    );
}

/// Disk faults through the target's control socket (over the agent) and host faults through
/// `faultline host` on the target's agent, both in windows counted from the agreed start; and
/// a command target (nbdkit) instead of faultline's server.
#[test]
fn disk_and_host_faults_in_their_windows_and_a_command_target() {
    let _one = serial();
    if !need_net(&[]) {
        return;
    }
    let lab = Lab::new("d", &["target", "c1"]);
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    let agents = |target: &str| {
        let mut a = format!("  target: {target}\n  agents:\n");
        // `ip netns exec` mounts a /sys of its own without the cgroup file systems host faults
        // need: nsenter enters only the network namespace (any exec prefix is a channel)
        for h in ["target", "c1"] {
            a += &format!("    {h}: {{exec: [nsenter, --net=/run/netns/{}, --], address: {}, faultline: {}}}\n", lab.ns(h), lab.addr(h), bin());
        }
        a
    };
    let head = |target: &str| format!("name: d\nhosts:\n  clients: [c1]\n  interval: 250ms\n{}disk: {{size: 64MiB}}\nmonitor: off\n", agents(target));
    let file = dir.path().join("e.yaml");
    std::fs::write(
        &file,
        format!(
            "{}workload: {{pattern: sequential, block_size: 4KiB, mix: {{read: 100}}, duration: 3s, rate_iops: 400, on_error: continue}}\nsetups:\n  - name: eio\n    faults:\n      - {{type: error, op: read, probability: 100%, window: {{from: 1s, to: 2s}}}}\n  - name: freeze\n    host_faults:\n      - {{type: freeze, host: target, window: {{from: 1s, to: 2s}}}}\n  - name: kill\n    host_faults:\n      - {{type: kill, host: target, window: {{from: 1s, to: 2s}}}}\n    faults:\n      - {{type: error, op: read, probability: 50%, window: {{from: 2300ms, to: 10s}}}}\n",
            head("faultline")
        ),
    )
    .unwrap();
    let out = dir.path().join("out");
    let o = run(&file, &out, &run_dir, None);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_nothing_left(&lab, &run_dir);
    let r: Value = serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    let setup = |n: &str| r["setups"].as_array().unwrap().iter().find(|s| s["name"] == n).unwrap()["repetitions"][0].clone();
    // EIO only inside 1..2 s of the controller's clock (a probe interval of slack at the edges)
    let eio = setup("eio");
    let st = &eio["networked"];
    // (the NBD client retries some; what still failed reached the workload)
    assert!(st["clients"][0]["failed_ios"].as_u64().unwrap() > 10, "{}", st["clients"][0]);
    let with_errors: Vec<f64> =
        st["probes"].as_array().unwrap().iter().filter(|p| p["host"] == "c1" && p["errors"].as_u64().unwrap() > 0).map(|p| f(&p["t_s"])).collect();
    assert!(!with_errors.is_empty() && with_errors.iter().all(|t| (1.0..=2.5).contains(t)), "errors at {with_errors:?}");
    assert!(eio["faults"].as_array().is_some_and(|f| !f.is_empty()), "no injected faults collected from the target");
    // freeze: the target's server stops for the window, the client with it
    let fr = setup("freeze");
    assert!(fr["host_faults"].as_array().is_some_and(|h| h.len() == 1 && h[0]["error"].is_null()), "{}", fr["host_faults"]);
    let ratio = f(&fr["networked"]["window_stats"][0]["ratio"]);
    assert!(ratio < 0.3, "the client went on while its target was frozen: {}", fr["networked"]["window_stats"]);
    // kill: the target's agent kills its server at 1 s and the controller starts it again at
    // 2 s; the client stalls in between and reads again after
    let k = setup("kill");
    let h = &k["host_faults"][0];
    assert!(h["error"].is_null() && h["killed"].as_array().unwrap().len() == 1 && h["restarted"].as_array().unwrap().len() == 1, "{}", k["host_faults"]);
    assert_ne!(h["killed"], h["restarted"]);
    let kw = k["networked"]["windows"].as_array().unwrap().iter().position(|w| w["kind"] == "host").expect("the kill's window");
    let ws = k["networked"]["window_stats"].as_array().unwrap().iter().find(|w| w["window"] == kw).unwrap();
    assert!(f(&ws["ratio"]) < 0.5, "the client went on while its target was dead: {ws}");
    let late_ops: f64 = k["networked"]["clients"][0]["points"].as_array().unwrap().iter().filter(|p| f(&p["t_s"]) > 2.5).map(|p| f(&p["iops"])).sum();
    assert!(late_ops > 0.0, "no reads after the restart: {}", k["networked"]["clients"][0]["points"]);
    // the setup's disk fault is armed again on the restarted server, its window on the run's clock
    assert!(k["faults"].as_array().is_some_and(|f| !f.is_empty()), "the restarted target injected nothing: {}", k["notes"]);
    assert!(k["notes"].as_array().unwrap().iter().any(|n| n.as_str().unwrap().contains("armed again")), "{}", k["notes"]);
    // a command's server instead of faultline's
    if !which("nbdkit") {
        skip("nbdkit target", "needs nbdkit");
        return;
    }
    std::fs::write(
        &file,
        format!(
            "{}workload: {{pattern: uniform, block_size: 4KiB, mix: {{read: 100}}, duration: 2s, rate_iops: 200}}\n",
            head("{command: \"nbdkit -f -p $FAULTLINE_PORT memory 64M\"}")
        ),
    )
    .unwrap();
    let o = run(&file, &dir.path().join("out2"), &run_dir, None);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let st = study(&dir.path().join("out2"));
    let ops = st["clients"][0]["ops"].as_u64().unwrap() as f64;
    assert!((ops / 400.0 - 1.0).abs() <= TOLERANCE, "{ops} ops from nbdkit, asked for 400");
    assert_nothing_left(&lab, &run_dir);
}

/// Ctrl-C on the controller tears down through the agents; kill -9 of the controller closes
/// the agents' channels and they end everything themselves (the nftables table, the engine's
/// TUN device and routes too); kill -9 of the controller and of c1's agent together leaves
/// c1's table in c1's ledger, which `faultline cleanup` there removes.
#[test]
fn ctrl_c_and_kill9_of_the_controller_leave_nothing() {
    let _two = shared();
    if !lab_can(false, true) {
        return;
    }
    let lab = Lab::new("k", &["target", "c1"]);
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    let agents = lab.exec_agents_yaml(&["target", "c1"], bin());
    let file = dir.path().join("e.yaml");
    std::fs::write(
        &file,
        format!(
            "name: k\nhosts:\n  clients: [c1]\n{agents}disk: {{size: 64MiB}}\nmonitor: off\nworkload: {{pattern: uniform, block_size: 4KiB, mix: {{read: 100}}, duration: 60s, rate_iops: 100}}\nnet_faults:\n  - {{from: c1, to: target, partition: true, window: {{from: 600s}}}}\n  - {{from: c1, to: target, delay: 1ms}}\n"
        ),
    )
    .unwrap();
    // a strict reverse-path filter on c1 (as many distributions set): the engine makes it loose
    // on the device while it runs, and it is strict again after, however the run ended
    let rp = |v: Option<&str>| -> String {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", lab.ns("c1"), "sysctl", "-n"]);
        match v {
            Some(v) => c.args(["-w", &format!("net.ipv4.conf.v1.rp_filter={v}")]),
            None => c.arg("net.ipv4.conf.v1.rp_filter"),
        };
        String::from_utf8_lossy(&c.output().unwrap().stdout).trim().to_string()
    };
    rp(Some("1"));
    for (k, sig) in [("int", nix::sys::signal::Signal::SIGINT), ("kill", nix::sys::signal::Signal::SIGKILL), ("both", nix::sys::signal::Signal::SIGKILL)] {
        let child = Command::new(bin())
            .arg("run")
            .arg(&file)
            .arg("--out")
            .arg(dir.path().join(k))
            .arg("-q")
            .env("FAULTLINE_RUN_DIR", &run_dir)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // running: the workload on c1, the partition's table there and the engine's route
        let t = Instant::now();
        loop {
            let o = Command::new("ip").args(["netns", "exec", lab.ns("c1"), "nft", "list", "tables"]).output().unwrap();
            let workload =
                lab.pids("c1").iter().any(|p| String::from_utf8_lossy(&std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default()).contains("workload"));
            let r = Command::new("ip").args(["-n", lab.ns("c1"), "route", "show"]).output().unwrap();
            let routed = String::from_utf8_lossy(&r.stdout).contains(&format!("{} dev flq", lab.addr("target")));
            if workload && routed && String::from_utf8_lossy(&o.stdout).contains("faultline_") {
                assert_eq!(rp(None), "2", "rp_filter on c1's device while the engine runs");
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(30), "the run never got going");
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_millis(1000));
        if k == "both" {
            let a = agent_pid(&lab, "c1").expect("c1's agent");
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(a), sig).unwrap();
        }
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), sig).unwrap();
        let o = child.wait_with_output().unwrap();
        assert!(!o.status.success());
        if k == "both" {
            // nobody was left on c1 to delete its table: the ledger says it is there
            let t = Instant::now();
            while !lab.pids("c1").is_empty() && t.elapsed() < Duration::from_secs(30) {
                std::thread::sleep(Duration::from_millis(50));
            }
            let o = Command::new("ip").args(["netns", "exec", lab.ns("c1"), "nft", "list", "tables"]).output().unwrap();
            assert!(String::from_utf8_lossy(&o.stdout).contains("faultline_"), "c1's table went without cleanup?");
            let o = Command::new("ip").args(["netns", "exec", lab.ns("c1"), bin(), "cleanup"]).env("FAULTLINE_RUN_DIR", &run_dir).output().unwrap();
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
            let said = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
            assert!(said.contains("deleted nftables table inet faultline_") && said.contains("rp_filter to 1"), "{said}");
        }
        if k == "int" {
            assert!(String::from_utf8_lossy(&o.stderr).contains("interrupted"), "{}", String::from_utf8_lossy(&o.stderr));
        }
        assert_nothing_left(&lab, &run_dir);
        assert_eq!(rp(None), "1", "rp_filter on c1's device after the run ({k})");
    }
}

/// examples/performability.yaml, scaled down (4 s runs, windows 1.5..3 s), unchanged but for
/// `hosts:`: once with its hosts as namespaces (faultline builds them, the relay between them)
/// and once as SSH hosts in the lab (agents; the delay through each sending host's engine).
/// Every setup runs both ways, with its window measured; the throughput ratios (during /
/// before) are printed (BENCHMARKS.md), and those the fault alone decides agree.
#[test]
fn performability_example_over_openssh_matches_the_namespace_run() {
    let _one = serial();
    if !lab_can(true, true) {
        return;
    }
    let example = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/performability.yaml")).unwrap();
    // (half-second intervals: the study compares each window with whole intervals before it)
    let scaled = example
        .replace("duration: 30s", "duration: 4s")
        .replace("from: 10s, to: 20s", "from: 1500ms, to: 3s")
        .replace("from: 10s}", "from: 1500ms}")
        .replace("  interval: 1s\n", "  interval: 500ms\n");
    assert_eq!(scaled.matches("from: 1500ms").count(), 7, "the example's windows changed; scale them here too");
    let lab = Lab::new("p", &["target", "client", "ctl"]);
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let run_dir = d.join("run");
    let (opts, sshds) = sshd_lab(d, &lab, &["target", "client"], &run_dir);
    let mut agents = "  agents:\n".to_string();
    for h in ["target", "client"] {
        agents += &format!("    {h}: {{ssh: root@{}, ssh_options: {opts}, address: {}, faultline: {}}}\n", lab.addr(h), lab.addr(h), bin());
    }
    let over_ssh = scaled.replacen("  interval: 500ms\n", &format!("  interval: 500ms\n{agents}"), 1);
    assert_ne!(over_ssh, scaled);
    let (f_ns, f_ssh) = (d.join("ns.yaml"), d.join("ssh.yaml"));
    std::fs::write(&f_ns, &scaled).unwrap();
    std::fs::write(&f_ssh, &over_ssh).unwrap();
    let o = run(&f_ns, &d.join("ns"), &run_dir, None);
    assert!(o.status.success(), "namespaces: {}", String::from_utf8_lossy(&o.stderr));
    let o = run(&f_ssh, &d.join("ssh"), &run_dir, Some(lab.ns("ctl")));
    for mut s in sshds {
        let _ = s.kill();
        let _ = s.wait();
    }
    assert!(o.status.success(), "over ssh: {}", String::from_utf8_lossy(&o.stderr));
    // (setup, window ratio, before and during MiB/s)
    let ratios = |out: &str| -> Vec<(String, Option<f64>, String)> {
        let r: Value = serde_json::from_str(&std::fs::read_to_string(d.join(out).join("results.json")).unwrap()).unwrap();
        r["setups"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                let st = &s["repetitions"][0]["networked"];
                let hf = &s["repetitions"][0]["host_faults"];
                assert!(hf.as_array().is_none_or(|h| h.iter().all(|h| h["error"].is_null())), "{out}: {}: {hf}", s["name"]);
                let w = st["window_stats"].as_array().unwrap().first().cloned().unwrap_or_default();
                let mib = format!("{:>6.1} -> {:>6.1} MiB/s", f(&w["before_mib_s"]), f(&w["during_mib_s"]));
                (s["name"].as_str().unwrap().to_string(), w["ratio"].as_f64(), mib)
            })
            .collect()
    };
    let (ns, ssh) = (ratios("ns"), ratios("ssh"));
    assert_eq!(ns.len(), 7);
    assert_eq!(ns.iter().map(|x| &x.0).collect::<Vec<_>>(), ssh.iter().map(|x| &x.0).collect::<Vec<_>>());
    for (a, b) in ns.iter().zip(&ssh) {
        println!("setup {:<18} namespaces: ratio {:>5.3} ({})   ssh: ratio {:>5.3} ({})", a.0, a.1.unwrap_or(f64::NAN), a.2, b.1.unwrap_or(f64::NAN), b.2);
        assert_eq!(a.1.is_some(), a.0 != "baseline", "setup {}: no window figures", a.0);
        assert_eq!(a.1.is_some(), b.1.is_some(), "setup {}: a window in one run only", a.0);
        // the faults that decide throughput by themselves (1 ms more per request each way
        // against sub-ms round trips; every other request failing; every read failing) cut it
        // both ways; loss and the CPU hog cost in proportion to the path's own speed (the relay
        // handles every packet while a loss rule is set; the kernel does on the SSH hosts),
        // so those are reported, not compared
        if ["delay-1ms", "disk-errors-50pct", "sticky-errors", "delay-and-cpu-hog"].contains(&a.0.as_str()) {
            assert!(a.1.unwrap() < 0.5 && b.1.unwrap() < 0.5, "setup {}: ratio {:?} (namespaces) and {:?} (ssh)", a.0, a.1, b.1);
        }
    }
    assert_nothing_left(&lab, &run_dir);
}

/// A power cut of the target through agents (docs/crash.md, "A power cut in a networked
/// experiment"): faultline's disk server with a volatile cache on one lab host, the client's
/// block workload on another, each reached by `ip netns exec`. One client thread writes 4 KiB
/// blocks in sequence and flushes every 24 writes. Per trigger
/// (`after_ops` from the client's interval lines, `after_flushes` from the remote disk's
/// stats, `at` on the controller's clock) and model (`torn` travels to the client's oracle as
/// `--crash-oracle torn`): the client's I/O fails at the cut with EIO, the
/// target powers on through its agent, the client's own durability oracle rereads what it
/// wrote over NBD and finds every flushed block and nothing foreign, its figures agree with the
/// cache's; nothing is left on either host.
#[test]
fn a_power_cut_of_the_target_through_agents_loses_no_flushed_block() {
    let _two = shared();
    if !need_net(&[]) {
        return;
    }
    let n = common::count;
    let lab = Lab::new("pc", &["target", "c1"]);
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    let agents = lab.exec_agents_yaml(&["target", "c1"], bin());
    let file = dir.path().join("e.yaml");
    std::fs::write(
        &file,
        format!(
            "name: cut\nhosts:\n  clients: [c1]\n  target: faultline\n  nbd: {{timeout: 2s, retries: 3}}\n  interval: 250ms\n{agents}disk: {{size: 64MiB, write_cache: volatile}}\nmonitor: off\nworkload: {{threads: 1, pattern: sequential, block_size: 4KiB, mix: {{write: 100}}, sync: 'fsync:24', duration: 30s, on_error: continue, content: {{profile: none, seed: 4}}}}\nsetups:\n  - name: lose-all\n    faults: [{{type: power-cut, model: lose-all, seed: 21, when: {{after_ops: 2500}}}}]\n  - name: keep-prefix\n    faults: [{{type: power-cut, model: keep-prefix, seed: 21, when: {{after_flushes: 60}}}}]\n  - name: random-subset\n    faults: [{{type: power-cut, model: random-subset, seed: 5, when: {{at: 1s}}}}]\n  - name: torn\n    faults: [{{type: power-cut, model: torn, seed: 8, when: {{after_ops: 1000}}}}]\n"
        ),
    )
    .unwrap();
    let out = dir.path().join("out");
    let o = run(&file, &out, &run_dir, None);
    let stderr = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(o.status.success(), "{stderr}");
    assert_nothing_left(&lab, &run_dir);
    let res: Value = serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("<table class=\"crash\">"), "the report has no crash section");
    let mut unflushed = 0;
    let mut lost = 0;
    for model in ["lose-all", "keep-prefix", "random-subset", "torn"] {
        let rep = &res["setups"].as_array().unwrap().iter().find(|s| s["name"] == model).unwrap()["repetitions"][0];
        let (k, o) = common::cut::assert_one_client_cut(model, rep, 500);
        let c = &rep["crash"];
        // each trigger came due, not before
        match model {
            "lose-all" => {
                assert!(n(o, "checked") >= 2500, "cut before the 2500th op: {o}");
                assert!(rep["notes"].as_array().unwrap().iter().any(|x| x.as_str().unwrap().contains("after_ops through agents")), "{}", rep["notes"]);
            }
            "keep-prefix" => assert!(n(k, "epoch") >= 60, "cut before the 60th flush: {k}"),
            "random-subset" => assert!(c["t_s"].as_f64().unwrap() >= 1.0, "cut before 1 s: {c:#}"),
            // the model reached the client's oracle: a block that kept some of its sectors is
            // `torn`, not garbage (checked above)
            _ => assert!(n(o, "checked") >= 1000, "cut before the 1000th op: {o}"),
        }
        unflushed += n(k, "unflushed");
        lost += n(o, "unsynced_lost");
    }
    // unsynced losses are counted (lose-all loses every unflushed write; a cut right after a
    // flush has none, hence not per model)
    assert!(unflushed == 0 || lost > 0, "{res:#}");
}

/// A power cut of the target through agents with two clients (docs/crash.md, "Several
/// clients: one slice of the disk each"): each client's `faultline workload` gets its half of
/// the disk (`--base`, `--span`) and its own content seed on its command line, writes 4 KiB
/// blocks in sequence from the start of its half at 1000 writes/s and flushes every 24 writes;
/// each is stopped once it has seen its own I/O fail, rereads its half after power-on and
/// prints its own oracle. `lost-writes` is the negative control: the target's disk acknowledges
/// the writes to the first LOST bytes of the second half and stores nothing, so the second
/// client's oracle must find exactly those blocks durable-lost (flushed long before the cut)
/// and the first client's none. The crash record has both clients, in `hosts: {clients}`
/// order, and their sum; nothing is left on any host.
#[test]
fn two_clients_of_a_cut_through_agents_each_keep_their_own_slice_and_oracle() {
    let _two = shared();
    if !need_net(&[]) {
        return;
    }
    const DISK: u64 = 64 << 20;
    const LOST: u64 = 256 << 10;
    let lab = Lab::new("pm", &["target", "c1", "c2"]);
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    // the clients' agents listed in the other order: the slices follow `clients:`
    let agents = lab.exec_agents_yaml(&["target", "c2", "c1"], bin());
    let file = dir.path().join("e.yaml");
    std::fs::write(
        &file,
        format!(
            "name: cut2\nhosts:\n  clients: [c1, c2]\n  target: faultline\n  nbd: {{timeout: 2s, retries: 3}}\n  interval: 250ms\n{agents}disk: {{size: 64MiB, write_cache: volatile}}\nmonitor: off\nworkload: {{threads: 1, pattern: sequential, block_size: 4KiB, mix: {{write: 100}}, sync: 'fsync:24', rate_iops: 1000, duration: 30s, on_error: continue, content: {{profile: none, seed: 4}}}}\nsetups:\n  - name: lose-all\n    faults: [{{type: power-cut, model: lose-all, seed: 21, when: {{after_ops: 5000}}}}]\n  - name: keep-prefix\n    faults: [{{type: power-cut, model: keep-prefix, seed: 21, when: {{after_flushes: 120}}}}]\n  - name: lost-writes\n    faults:\n      - {{type: lost-write, target: {{offset: 32MiB, length: 256KiB}}}}\n      - {{type: power-cut, model: lose-all, seed: 21, when: {{after_ops: 5000}}}}\n"
        ),
    )
    .unwrap();
    let out = dir.path().join("out");
    let o = run(&file, &out, &run_dir, None);
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{text}");
    assert_nothing_left(&lab, &run_dir);
    let res: Value = serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    for model in ["lose-all", "keep-prefix", "lost-writes"] {
        let rep = &res["setups"].as_array().unwrap().iter().find(|s| s["name"] == model).unwrap()["repetitions"][0];
        common::cut::assert_two_client_cut(model, rep, ["c1", "c2"], DISK, if model == "lost-writes" { LOST } else { 0 }, &text, &html);
    }
}

/// The crash phase of a power cut through agents, made long by a read delay on the target's
/// disk (the workload only writes: the reread is the only reader): losing the client's agent
/// then (SIGKILL) fails the repetition with the host's name and the phase; Ctrl-C then ends the
/// run as interrupted; nothing is left on either host after either.
#[test]
fn losing_the_client_or_ctrl_c_in_the_crash_phase_ends_the_run_cleanly() {
    let _two = shared();
    if !need_net(&[]) {
        return;
    }
    let lab = Lab::new("pl", &["target", "c1"]);
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    let agents = lab.exec_agents_yaml(&["target", "c1"], bin());
    let file = dir.path().join("e.yaml");
    std::fs::write(
        &file,
        format!(
            "name: cutl\nhosts:\n  clients: [c1]\n  nbd: {{timeout: 2s, retries: 1}}\n  interval: 250ms\n{agents}disk: {{size: 64MiB, write_cache: volatile}}\nmonitor: off\nworkload: {{threads: 1, pattern: sequential, block_size: 4KiB, mix: {{write: 100}}, sync: 'fsync:8', duration: 30s, rate_iops: 1000, on_error: continue}}\nfaults:\n  - {{type: delay, op: read, delay: 20ms}}\n  - {{type: power-cut, model: lose-all, when: {{at: 1s}}}}\n"
        ),
    )
    .unwrap();
    for how in ["agent", "ctrl-c"] {
        let mut child = Command::new(bin())
            .arg("run")
            .arg(&file)
            .arg("--out")
            .arg(dir.path().join(how))
            .env("FAULTLINE_RUN_DIR", &run_dir)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // the phase lines on stderr: wait for the reread to start
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        let stderr = child.stderr.take().unwrap();
        let reader = std::thread::spawn(move || {
            use std::io::BufRead;
            for l in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
        let mut text = String::new();
        let t = Instant::now();
        loop {
            let l = rx.recv_timeout(Duration::from_secs(60)).unwrap_or_else(|_| panic!("no crash phase within 60 s: {text}"));
            text += &l;
            text.push('\n');
            if l.contains("crash: durability oracle (over NBD, from c1 through its agent)") {
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(60), "{text}");
        }
        std::thread::sleep(Duration::from_millis(300));
        match how {
            "agent" => {
                let a = agent_pid(&lab, "c1").expect("c1's agent");
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(a), nix::sys::signal::Signal::SIGKILL).unwrap();
            }
            _ => nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGINT).unwrap(),
        }
        let status = child.wait().unwrap();
        reader.join().unwrap();
        text.extend(rx.try_iter().map(|l| l + "\n"));
        println!("{how}: {}", text.lines().rev().take(3).collect::<Vec<_>>().join(" / "));
        assert!(!status.success(), "{how}: {text}");
        if how == "agent" {
            assert!(text.contains("agent on host c1 lost") && text.contains("no durability oracle (crash phase)"), "{text}");
        } else {
            assert!(text.contains("interrupted"), "{text}");
        }
        assert_nothing_left(&lab, &run_dir);
    }
}
