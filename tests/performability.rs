//! Networked experiments (`hosts:`, docs/experiment.md "Hosts") run end to end with real
//! namespaces, the relay, faultline's NBD server in the target host and the NBD client in the
//! client host. Asserts the mechanics: fault windows begin and end on time (relay drops only
//! inside a partition window), the loss ratio realized on the link, a network delay shifting
//! the NBD request latency, retries counted when the target's disk errs, per-window figures
//! in windows.csv, a setup's own NBD policy reaching its clients, and nothing left behind
//! after the run and after kill -9 + `faultline cleanup` (also no cgroup of a host fault on
//! the target).

mod common;

use common::{RunDir, namespaces_of, need_net, which};

use serde_json::Value;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const EXPERIMENT: &str = r#"
name: mechanics
hosts: {clients: [client], target: faultline, nbd: {timeout: 1s, retries: 3}, interval: 250ms}
disk: {size: 64MiB}
monitor: off
workload: {pattern: sequential, block_size: 8KiB, mix: {read: 100}, duration: 7s, on_error: continue}
setups:
  - name: partition
    net_faults:
      - {from: client, to: target, both: true, partition: true, window: {from: 2s, to: 4s}}
  - name: delay
    net_faults:
      - {from: client, to: target, both: true, delay: 2ms, window: {from: 2s, to: 4s}}
  - name: loss
    net_faults:
      - {from: client, to: target, loss: 5%, seed: 7}
  - name: errors
    faults:
      - {type: error, op: read, probability: 50%, window: {from: 2s, to: 4s}}
"#;

/// Write `yaml` into a temp dir and start `faultline run` on it (stdout and stderr piped);
/// returns the dir (kept alive by the caller), the results folder and the run.
fn start_run(yaml: &str) -> (tempfile::TempDir, std::path::PathBuf, std::process::Child) {
    start_run_at(&common::run_root(), yaml)
}

/// `start_run` recording in run directory `run_root` (a test's own, for one that runs `cleanup`).
fn start_run_at(run_root: &Path, yaml: &str) -> (tempfile::TempDir, std::path::PathBuf, std::process::Child) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("e.yaml");
    std::fs::write(&file, yaml).unwrap();
    let out = dir.path().join("out");
    let child = Command::new(common::bin())
        .arg("run")
        .arg(&file)
        .arg("--out")
        .arg(&out)
        .arg("-q")
        .env("FAULTLINE_RUN_DIR", run_root)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    (dir, out, child)
}

fn setup<'a>(r: &'a Value, name: &str) -> &'a Value {
    r["setups"].as_array().unwrap().iter().find(|s| s["name"] == name).unwrap_or_else(|| panic!("setup {name}"))
}

fn study<'a>(r: &'a Value, name: &str) -> &'a Value {
    &setup(r, name)["repetitions"][0]["networked"]
}

fn probes<'a>(st: &'a Value, host: &str) -> Vec<&'a Value> {
    st["probes"].as_array().unwrap().iter().filter(|p| p["host"] == host).collect()
}

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or(0.0)
}

#[test]
fn windows_loss_delay_and_retries_are_realized_and_nothing_is_left() {
    if !need_net(&[]) {
        return;
    }
    let (_dir, out, child) = start_run(EXPERIMENT);
    let pid = child.id();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "run failed:\n{}\n{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(namespaces_of(pid).is_empty(), "namespaces left: {:?}", namespaces_of(pid));
    let r: Value = serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();

    // partition 2s..4s: the relay's faults drop packets only inside the window (one probe
    // interval and a bit of tolerance on each side), and some inside it; packets a full
    // receive queue refused are congestion, counted apart (`relay_backlog_full`)
    let st = study(&r, "partition");
    let tol = 0.3;
    let mut inside = 0;
    for p in probes(st, "target").into_iter().chain(probes(st, "client")) {
        let t = f(&p["t_s"]);
        let dropped = p["relay_dropped"].as_u64().unwrap();
        if t < 2.0 - tol || t > 4.0 + 0.25 + tol {
            assert_eq!(dropped, 0, "the relay's faults dropped packets at {t:.2} s, outside the window 2..4 s");
        } else {
            inside += dropped;
        }
    }
    assert!(inside > 0, "no packet dropped inside the partition window");
    // throughput: the intervals well inside the window carried nothing; well after, again
    let pts = st["clients"][0]["points"].as_array().unwrap();
    let at = |a: f64, b: f64| pts.iter().filter(|p| f(&p["t_s"]) > a && f(&p["t_s"]) <= b).map(|p| f(&p["mib_s"])).collect::<Vec<_>>();
    // unless the run says the route reached the relay late (the window's
    // first packets took the kernel's path), and says so in its notes
    let late: u64 = st["links"]["links"].as_array().unwrap().iter().map(|l| l["late_switches"].as_u64().unwrap()).sum();
    if late == 0 {
        assert!(at(2.5, 3.75).iter().all(|m| *m == 0.0), "data moved during the partition: {:?}; links: {}", at(2.5, 3.75), st["links"]);
    } else {
        let notes = setup(&r, "partition")["repetitions"][0]["notes"].to_string();
        assert!(notes.contains("only after a rule's window had opened"), "{late} late route switch(es) and no note: {notes}");
        eprintln!("partition: {late} late route switch(es); data in the window: {:?}; links: {}", at(2.5, 3.75), st["links"]);
    }
    assert!(at(1.0, 2.0).iter().all(|m| *m > 0.0), "no data before the partition: {:?}", at(1.0, 2.0));
    assert!(at(0.0, 7.5).iter().skip(24).any(|m| *m > 0.0), "no data after the partition");
    let ws = &st["window_stats"][0];
    // (a late switch let the window's first packets through: the run says its figures are not
    // the fault's, so its ratio is not checked; the switch's lateness is in the links)
    assert!(late > 0 || f(&ws["ratio"]) < 0.2, "partition window ratio {}", ws["ratio"]);
    assert!(ws["timeouts"].as_u64().unwrap() + ws["retries"].as_u64().unwrap() > 0, "the partition cost no timeout or retry: {ws}");

    // delay 2 ms each way: every NBD request waits at least 4 ms inside the window
    let st = study(&r, "delay");
    let pts = st["clients"][0]["points"].as_array().unwrap();
    let mean_in: Vec<f64> = pts.iter().filter(|p| f(&p["t_s"]) > 2.5 && f(&p["t_s"]) <= 3.75).map(|p| f(&p["mean_us"])).collect();
    assert!(!mean_in.is_empty() && mean_in.iter().all(|m| *m >= 4000.0), "mean request latency inside the 2 ms window: {mean_in:?} µs");
    let mean_before: Vec<f64> = pts.iter().filter(|p| f(&p["t_s"]) > 0.5 && f(&p["t_s"]) <= 2.0).map(|p| f(&p["mean_us"])).collect();
    assert!(mean_before.iter().any(|m| *m < 4000.0), "latency before the window already had the delay: {mean_before:?}");

    // loss 5% on client -> target: the realized ratio on that link within 5 sigma
    let st = study(&r, "loss");
    let link = st["links"]["links"].as_array().unwrap().iter().find(|l| l["from"] == "client" && l["to"] == "target").unwrap();
    let (n, d) = (link["packets"].as_u64().unwrap() as f64, link["dropped"].as_u64().unwrap() as f64);
    assert!(n > 1000.0, "too few packets: {n}");
    let sigma = (n * 0.05 * 0.95).sqrt();
    assert!((d - n * 0.05).abs() < 5.0 * sigma, "dropped {d} of {n}, expected about {}", n * 0.05);
    let back = st["links"]["links"].as_array().unwrap().iter().find(|l| l["from"] == "target" && l["to"] == "client").unwrap();
    assert_eq!(back["dropped"].as_u64().unwrap(), 0, "loss on the reverse link, which has no rule");

    // disk errors 2s..4s: the NBD client retried, inside the window only
    let st = study(&r, "errors");
    let ws = &st["window_stats"][0];
    assert!(ws["retries"].as_u64().unwrap() > 0, "no retry counted in the error window: {ws}");
    for p in probes(st, "client") {
        let t = f(&p["t_s"]);
        if !(2.0 - tol..=4.0 + 0.25 + tol).contains(&t) {
            assert_eq!(p["retries"].as_u64().unwrap(), 0, "retries at {t:.2} s, outside the window");
        }
    }
    let nbd = &setup(&r, "errors")["repetitions"][0]["nbd_client"];
    assert!(nbd["retries"].as_u64().unwrap() > 0 && nbd["remote_errors"].as_u64().unwrap() > 0, "{nbd}");

    let csv = std::fs::read_to_string(out.join("windows.csv")).unwrap();
    assert_eq!(csv.lines().count(), 1 + 4, "{csv}");
    assert!(std::fs::read_to_string(out.join("hosts_timeseries.csv")).unwrap().lines().any(|l| l.contains(",target,")));
    // the report and the summary lead with the windows; a read-only study shows no write column
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("class=\"fault-window\""));
    let lead = html.find("class=\"lead-performability\"").expect("no performability lead");
    assert!(lead < html.find("<table class=\"overview\"").unwrap() && lead < html.find("<section id=\"setup-").unwrap());
    assert_eq!(
        html[lead..].split("<div class=\"multiples\">").nth(1).unwrap().split("</div>").next().unwrap().matches("<svg").count(),
        4,
        "one chart per setup"
    );
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.starts_with("fault windows"), "{stdout}");
    let head = stdout.lines().find(|l| l.starts_with("setup ") && l.contains("reps")).unwrap();
    assert!(head.contains("read MiB/s") && !head.contains("write"), "{stdout}");
}

#[test]
fn kill9_of_the_run_then_cleanup_leaves_nothing() {
    if !need_net(&[]) {
        return;
    }
    let run = RunDir::new("perf-kill9");
    let (_dir, _out, mut child) = start_run_at(
        &run.0,
        "name: k\nhosts: {}\ndisk: {size: 64MiB}\nmonitor: off\nworkload: {pattern: sequential, block_size: 8KiB, mix: {read: 100}, duration: 60s}\n",
    );
    let pid = child.id();
    // wait until both hosts exist and the target serves (a process in its namespace)
    let t = Instant::now();
    let target_ns = format!("fl-{pid}-target");
    let mut server = Vec::new();
    while t.elapsed() < Duration::from_secs(60) {
        if namespaces_of(pid).len() == 2 {
            let out = Command::new("ip").args(["netns", "pids", &target_ns]).output().unwrap();
            server = String::from_utf8_lossy(&out.stdout).split_whitespace().filter_map(|p| p.parse::<i32>().ok()).collect();
            if !server.is_empty() {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!server.is_empty(), "the run never started its target");
    std::thread::sleep(Duration::from_millis(500));
    child.kill().unwrap();
    child.wait().unwrap();
    let (text, _) = run.cleanup();
    // the server may still be finishing its own teardown (its owner died): give it a moment
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(30) && (!namespaces_of(pid).is_empty() || server.iter().any(|p| Path::new(&format!("/proc/{p}")).exists())) {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(namespaces_of(pid).is_empty(), "namespaces left after cleanup: {:?}\n{text}", namespaces_of(pid));
    for p in &server {
        assert!(!Path::new(&format!("/proc/{p}")).exists(), "target server {p} survived kill -9 + cleanup");
    }
}

/// Control groups named for process `pid` (`faultline-PID-...`), in every hierarchy.
fn cgroups_of(pid: u32) -> Vec<std::path::PathBuf> {
    let name = format!("faultline-{pid}-");
    let mut found = Vec::new();
    let mut dirs = vec![std::path::PathBuf::from("/sys/fs/cgroup")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                if e.file_name().to_string_lossy().starts_with(&name) {
                    found.push(e.path());
                }
                dirs.push(e.path());
            }
        }
    }
    found
}

/// kill -9 of a networked run while a host fault holds its target's disk server in a CPU
/// group: the server, in the target host's namespace (a /sys of its own, without the cgroup
/// mounts), releases what its dead run built; it must leave the group's record to `cleanup`,
/// which removes the group (a group counts as gone only where its hierarchy is mounted).
#[test]
fn kill9_during_a_host_fault_window_then_cleanup_leaves_no_cgroup() {
    if !need_net(&[]) || faultline::sys::cgroup::hierarchy("cpu").is_none() {
        return;
    }
    let run = RunDir::new("perf-cgroup");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("e.yaml");
    std::fs::write(
        &file,
        "name: k\nhosts: {}\ndisk: {size: 64MiB}\nmonitor: off\n\
workload: {pattern: sequential, block_size: 8KiB, mix: {read: 100}, duration: 60s}\n\
host_faults:\n  - {type: cpu, share: 50%, host: target, window: {from: 500ms, to: 50s}}\n",
    )
    .unwrap();
    let mut child = run.spawn_run(&file, &dir.path().join("out"));
    let pid = child.id();
    let t = Instant::now();
    while cgroups_of(pid).is_empty() && t.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let groups = cgroups_of(pid);
    // the disk server: the process whose ledger names the run as its owner
    let server: Vec<u32> =
        run.ledgers().iter().filter(|v| v["owner"][0].as_u64() == Some(pid as u64)).filter_map(|v| v["pid"].as_u64().map(|p| p as u32)).collect();
    std::thread::sleep(Duration::from_millis(300));
    child.kill().unwrap();
    child.wait().unwrap();
    // the disk server ends by itself (its run is gone), having released what it could
    let running = |p: &u32| std::fs::read_to_string(format!("/proc/{p}/stat")).is_ok_and(|s| !s.contains(") Z "));
    let t = Instant::now();
    while server.iter().any(running) && t.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let (text, _) = run.cleanup();
    let left = cgroups_of(pid);
    for g in &left {
        let _ = std::fs::remove_dir(g);
    }
    assert!(!groups.is_empty() && !server.is_empty(), "the run never put its disk server in a group");
    assert!(left.is_empty(), "cgroups left after kill -9 + cleanup: {left:?}\n{text}");
    assert!(namespaces_of(pid).is_empty(), "namespaces left after cleanup: {:?}\n{text}", namespaces_of(pid));
}

/// kill -9 of a networked run: its disk server, in the target host, sees its run gone and
/// tears itself down (its ledger and control socket go), rather than deleting the host it
/// runs in and so killing itself after the grace of a namespace's processes; `cleanup` then
/// deletes the hosts.
#[test]
fn kill9_of_the_run_lets_its_disk_server_end_by_its_own_teardown() {
    if !need_net(&[]) {
        return;
    }
    let run = RunDir::new("perf-server");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("e.yaml");
    std::fs::write(
        &file,
        "name: k\nhosts: {}\ndisk: {size: 64MiB}\nmonitor: off\nworkload: {pattern: sequential, block_size: 8KiB, mix: {read: 100}, duration: 60s}\n",
    )
    .unwrap();
    let mut child = run.spawn_run(&file, &dir.path().join("out"));
    let pid = child.id();
    let t = Instant::now();
    let server = loop {
        if let Some(s) = run.ledgers().iter().find(|v| v["owner"][0].as_u64() == Some(pid as u64)).and_then(|v| v["pid"].as_u64()) {
            break Some(s as u32);
        }
        if t.elapsed() > Duration::from_secs(60) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    std::thread::sleep(Duration::from_millis(1000));
    child.kill().unwrap();
    child.wait().unwrap();
    let t = Instant::now();
    while server.is_some_and(|s| run.ledgers().iter().any(|v| v["pid"].as_u64() == Some(s as u64))) && t.elapsed() < Duration::from_secs(15) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let took = t.elapsed();
    let sockets: Vec<_> = std::fs::read_dir(&run.0).unwrap().flatten().map(|e| e.file_name()).filter(|n| n.to_string_lossy().ends_with(".sock")).collect();
    let (text, _) = run.cleanup();
    assert!(server.is_some(), "the run never started its disk server");
    assert!(took < Duration::from_secs(15), "the disk server did not tear itself down (its ledger stayed); cleanup:\n{text}");
    assert!(sockets.is_empty(), "control sockets left by the disk server: {sockets:?}");
    assert!(namespaces_of(pid).is_empty(), "namespaces left after cleanup: {:?}\n{text}", namespaces_of(pid));
}

/// A target command that fails before it listens ends the run's wait for it at once (it
/// waited the full 20 s for a port nobody would open), and the run leaves no host behind.
#[test]
fn a_target_command_that_fails_at_once_is_reported_at_once() {
    if !need_net(&[]) {
        return;
    }
    let t = Instant::now();
    let (_dir, _out, child) = start_run(
        "name: f\nhosts: {target: {command: \"echo no such server >&2; exit 3\"}}\nmonitor: off\nworkload: {pattern: sequential, block_size: 8KiB, mix: {read: 100}, duration: 5s}\n",
    );
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    let took = t.elapsed();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("ended (exit status: 3) before it listened"), "{err}");
    assert!(took < Duration::from_secs(10), "the run took {took:?} to see its target command fail:\n{err}");
    assert!(namespaces_of(pid).is_empty(), "namespaces left: {:?}", namespaces_of(pid));
}

#[test]
fn ctrl_c_tears_everything_down() {
    if !need_net(&[]) {
        return;
    }
    let (_dir, _out, mut child) = start_run(
        "name: c\nhosts: {clients: [client, client-2]}\ndisk: {size: 64MiB}\nmonitor: off\nworkload: {pattern: sequential, block_size: 8KiB, mix: {read: 100}, duration: 60s}\n",
    );
    let pid = child.id();
    let t = Instant::now();
    while namespaces_of(pid).len() < 3 && t.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(namespaces_of(pid).len(), 3, "the run never built its three hosts");
    std::thread::sleep(Duration::from_secs(1));
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGINT).unwrap();
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() {
        assert!(t.elapsed() < Duration::from_secs(60), "the run did not end after Ctrl-C");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(err.contains("interrupted"), "{err}");
    assert!(namespaces_of(pid).is_empty(), "namespaces left after Ctrl-C: {:?}", namespaces_of(pid));
}

#[test]
fn two_clients_against_an_nbdkit_target() {
    if !need_net(&[]) {
        return;
    }
    if !which("nbdkit") {
        common::skip("", "needs nbdkit");
        return;
    }
    let (_dir, out, child) = start_run(
        r#"name: n
hosts: {clients: [client, client-2], target: {command: "nbdkit -f -p $FAULTLINE_PORT memory 64M"}, interval: 500ms}
monitor: off
workload: {pattern: sequential, block_size: 8KiB, mix: {read: 100}, duration: 3s}
net_faults:
  - {from: client-2, to: target, both: true, delay: 2ms}
"#,
    );
    let pid = child.id();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(namespaces_of(pid).is_empty(), "namespaces left: {:?}", namespaces_of(pid));
    let r: Value = serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    let st = study(&r, "n");
    assert_eq!(st["hosts"].as_array().unwrap().len(), 3);
    let clients = st["clients"].as_array().unwrap();
    assert_eq!(clients.len(), 2);
    let mean = |c: &Value| {
        let p = c["points"].as_array().unwrap();
        p.iter().map(|x| f(&x["mean_us"])).sum::<f64>() / p.len() as f64
    };
    for c in clients {
        assert!(f(&c["mib_s"]) > 0.0, "client {} read nothing", c["host"]);
    }
    // only client-2's link is delayed (2 ms each way): its requests take at least 4 ms
    let (c1, c2) = (clients.iter().find(|c| c["host"] == "client").unwrap(), clients.iter().find(|c| c["host"] == "client-2").unwrap());
    assert!(mean(c2) >= 4000.0 && mean(c1) < mean(c2), "client {} µs, client-2 {} µs", mean(c1), mean(c2));
}

/// A setup's own `nbd:` reaches its clients: under the same disk errors the published
/// clients (`retries: 0`, the experiment's) never retry and fail requests, ours (`retries: 3`)
/// retry.
#[test]
fn a_setup_s_nbd_policy_reaches_its_clients() {
    if !need_net(&[]) {
        return;
    }
    let (_dir, out, child) = start_run(
        r#"name: pairs
hosts: {clients: [client], nbd: {timeout: 2s, retries: 0}, interval: 500ms}
disk: {size: 64MiB}
monitor: off
workload: {pattern: sequential, block_size: 8KiB, mix: {read: 100}, duration: 3s, on_error: continue}
faults:
  - {type: error, op: read, probability: 50%, window: {from: 1s, to: 2s}}
matrix:
  client:
    - {name: published}
    - {name: ours, nbd: {retries: 3}}
"#,
    );
    let pid = child.id();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(namespaces_of(pid).is_empty(), "namespaces left: {:?}", namespaces_of(pid));
    let r: Value = serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    let nbd = |name: &str| setup(&r, name)["repetitions"][0]["nbd_client"].clone();
    let (p, q) = (nbd("published"), nbd("ours"));
    assert!(p["retries"].as_u64().unwrap() == 0 && p["failed"].as_u64().unwrap() > 0, "published: {p}");
    assert!(q["retries"].as_u64().unwrap() > 0 && q["remote_errors"].as_u64().unwrap() > 0, "ours: {q}");
}
