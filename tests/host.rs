//! Host faults (`faultline host`) on real processes, through real cgroups: a CPU quota caps
//! what busy processes get, a freeze stops them and the thaw resumes them, a memory limit
//! makes an allocating process hit it, held memory is resident, kill + restart replaces the
//! process, and a kill -9 of faultline while a freeze is on is undone by `faultline cleanup`
//! (also when the frozen process is the killed run's own disk server).

mod common;

use common::{RunDir, bin, skip};
use serde_json::Value;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A process we start, killed when the test ends however it ends.
struct Proc(Child);
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn busy() -> Proc {
    Proc(Command::new("sh").args(["-c", "while :; do :; done"]).stdout(Stdio::null()).spawn().unwrap())
}

/// CPU time of a process (user + system), from /proc.
fn cpu(pid: u32) -> Duration {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let f: Vec<&str> = s[s.rfind(')').unwrap() + 2..].split(' ').collect();
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).unwrap().unwrap() as u64;
    Duration::from_millis(ticks * 1000 / hz)
}

fn host(args: &[&str]) -> Vec<Value> {
    let out = Command::new(bin()).arg("host").args(args).arg("--json").output().unwrap();
    assert!(out.status.success(), "faultline host {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn has(controller: &str) -> bool {
    if faultline::sys::cgroup::hierarchy(controller).is_some() {
        return true;
    }
    skip("", &format!("no cgroup hierarchy has the {controller} controller"));
    false
}

/// The faultline group a process is in, if any (its /proc/PID/cgroup names one).
fn in_our_group(pid: u32) -> Option<String> {
    let t = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    t.lines().find(|l| l.contains("/faultline-")).map(String::from)
}

#[test]
fn a_cpu_quota_caps_busy_processes() {
    if !has("cpu") {
        return;
    }
    // two targets and a control process outside the fault, measured over the same window, so
    // a machine busy with other work cannot make the quota look effective or not
    let (a, b, control) = (busy(), busy(), busy());
    let pids = [a.0.id(), b.0.id()];
    let c0 = cpu(control.0.id());
    let cpus = std::thread::available_parallelism().unwrap().get() as f64;
    // take 95%: the two may use a twentieth of the machine between them
    let share = 0.95;
    let r = host(&["--pid", &pids[0].to_string(), "--pid", &pids[1].to_string(), "--fault", "{type: cpu, share: 95%, window: {to: 2s}}"]);
    let free = (cpu(control.0.id()) - c0).as_secs_f64() / 2.0;
    let used = r[0]["target_cpus_used"].as_f64().expect("target_cpus_used");
    let cap = (1.0 - share) * cpus;
    assert!(used <= cap * 1.15 + 0.02, "the processes used {used:.2} CPUs under a cap of {cap:.2}");
    assert!(free > used, "the control process got {free:.2} CPUs, the two limited ones {used:.2} together: the quota changed nothing");
    assert!(r[0]["applied_at_s"].as_f64().unwrap() < 0.5 && (r[0]["reverted_at_s"].as_f64().unwrap() - 2.0).abs() < 0.5, "{r:?}");
    assert!(pids.iter().all(|&p| in_our_group(p).is_none()), "a target is still in a faultline group");
}

#[test]
fn a_freeze_stops_processes_until_the_window_ends() {
    if !has("freezer") {
        return;
    }
    let p = busy();
    let pid = p.0.id();
    let bin = bin().to_string();
    let run = std::thread::spawn(move || {
        let out = Command::new(bin)
            .args(["host", "--pid", &pid.to_string(), "--fault", "{type: freeze, window: {from: 200ms, to: 1500ms}}", "--json"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<Vec<Value>>(&out.stdout).unwrap()
    });
    std::thread::sleep(Duration::from_millis(500));
    let c1 = cpu(pid);
    std::thread::sleep(Duration::from_millis(700));
    let c2 = cpu(pid);
    let r = run.join().unwrap();
    assert!(c2 - c1 <= Duration::from_millis(20), "a frozen process ran {:?}", c2 - c1);
    // it runs again (as soon as the machine gives it a CPU)
    let c3 = cpu(pid);
    let t = Instant::now();
    while cpu(pid) - c3 < Duration::from_millis(30) {
        assert!(t.elapsed() < Duration::from_secs(10), "the process did not run again after the thaw");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (on, off) = (r[0]["applied_at_s"].as_f64().unwrap(), r[0]["reverted_at_s"].as_f64().unwrap());
    assert!((on - 0.2).abs() < 0.2 && (off - 1.5).abs() < 0.3, "window 0.2..1.5 s realized as {on}..{off}");
    assert_eq!(in_our_group(pid), None);
}

#[test]
fn a_memory_limit_is_hit_by_an_allocating_process() {
    if !has("memory") {
        return;
    }
    // allocates 256 MiB half a second after the limit is on
    let script = "import time\ntime.sleep(0.5)\nb = bytearray(256 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\ntime.sleep(5)\n";
    let mut p = Proc(Command::new("python3").args(["-c", script]).spawn().unwrap());
    let pid = p.0.id();
    let r = host(&["--pid", &pid.to_string(), "--fault", "{type: memory, limit: 64MiB, window: {to: 2s}}"]);
    let hits = r[0]["memory_limit_hits"].as_u64().expect("memory_limit_hits");
    let peak = r[0]["memory_peak"].as_u64().unwrap_or(0);
    assert!(hits > 0, "the limit was never hit: {r:?}");
    assert!(peak <= 64 << 20, "the group's peak {peak} exceeded the 64 MiB limit");
    // a process that cannot reclaim enough is killed inside its group
    let st = p.0.try_wait().unwrap();
    assert!(st.is_some_and(|s| !s.success()), "the process should not have got its 256 MiB: {st:?}");
}

#[test]
fn held_memory_is_resident_while_held() {
    let p = Proc(Command::new("sleep").arg("10").spawn().unwrap());
    let mut h = Proc(
        Command::new(bin())
            .args(["host", "--pid", &p.0.id().to_string(), "--fault", "{type: memory, hold: 256MiB, window: {to: 2s}}", "--json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let t = Instant::now();
    let rss = |pid: u32| -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        s.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.trim().strip_suffix("kB")).and_then(|v| v.trim().parse().ok()).unwrap_or(0) * 1024
    };
    let mut max = 0;
    while t.elapsed() < Duration::from_millis(1800) {
        max = max.max(rss(h.0.id()));
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = std::mem::replace(&mut h.0, Command::new("true").spawn().unwrap()).wait_with_output().unwrap();
    let r: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r[0]["held"].as_u64(), Some(256 << 20), "{r:?}");
    assert!(max >= 256 << 20, "faultline's resident memory peaked at {max} bytes while holding 256 MiB");
}

#[test]
fn kill_and_restart_replaces_the_process() {
    let mut p = Proc(Command::new("sleep").arg("30").spawn().unwrap());
    let pid = p.0.id();
    let r = host(&["--pid", &pid.to_string(), "--fault", "{type: kill, window: {from: 100ms, to: 400ms}}", "--restart", "exec sleep 30"]);
    assert_eq!(r[0]["killed"], serde_json::json!([pid]), "{r:?}");
    let new = r[0]["restarted"][0].as_u64().expect("a restarted pid") as u32;
    assert!(p.0.try_wait().unwrap().is_some(), "the target was not killed");
    assert!(std::path::Path::new(&format!("/proc/{new}")).exists(), "the restarted process is not running");
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(new as i32), nix::sys::signal::Signal::SIGKILL);
}

#[test]
fn cleanup_thaws_what_a_killed_faultline_froze() {
    if !has("freezer") {
        return;
    }
    let run = RunDir::new("thaw");
    let p = busy();
    let pid = p.0.id();
    let mut h = run.cmd(&["host", "--pid", &pid.to_string(), "--fault", "{type: freeze}"]).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    // wait until it is frozen: its CPU time stops moving
    let t = Instant::now();
    loop {
        let c = cpu(pid);
        std::thread::sleep(Duration::from_millis(100));
        if cpu(pid) == c && in_our_group(pid).is_some() {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "the process was never frozen");
    }
    h.kill().unwrap();
    h.wait().unwrap();
    let group = in_our_group(pid).expect("the group should outlive a kill -9");
    let out = run.cmd(&["cleanup"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("removed cgroup"), "cleanup said: {text}");
    assert_eq!(in_our_group(pid), None, "still in {group}");
    let (c, t) = (cpu(pid), Instant::now());
    while cpu(pid) == c {
        assert!(t.elapsed() < Duration::from_secs(10), "the process is still frozen after cleanup");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn bad_faults_are_refused_before_anything_runs() {
    let out = Command::new(bin()).args(["host", "--pid", "1", "--fault", "{type: cpu, share: 100%}"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--fault #1:2:5: host fault #1: `share` must be above 0%"), "{err}");
    let out = Command::new(bin()).args(["host", "--pid", "1", "--fault", "{type: kill, window: {to: 1s}}"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("nothing here knows how to restart"), "{err}");
}

#[test]
fn spinners_take_at_most_their_share() {
    let p = busy();
    let r = host(&["--pid", &p.0.id().to_string(), "--fault", "{type: cpu, share: 50%, method: spin, window: {to: 1s}}"]);
    let cpus = std::thread::available_parallelism().unwrap().get() as f64;
    let taken = r[0]["cpus_taken"].as_f64().expect("cpus_taken");
    // a duty cycle of half of every 10 ms on each CPU: never more than half the machine,
    // and some of it however busy the machine is
    assert!(taken > 0.05 && taken <= 0.5 * cpus * 1.1, "spinners took {taken:.2} CPUs of {cpus}");
    assert!(r[0]["target_cpus_used"].as_f64().is_some(), "{r:?}");
}

#[test]
fn an_experiment_freezes_its_disk_server_in_a_window() {
    if !has("freezer") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("exp.yaml");
    std::fs::write(
        &f,
        "name: freeze\ndisk: {size: 64MiB}\nstack: raw\n\
workload: {pattern: sequential, mix: {write: 100}, block_size: 4KiB, duration: 3s, interval: 100ms}\n\
host_faults:\n  - {type: freeze, window: {from: 1s, to: 2s}}\n",
    )
    .unwrap();
    let out = dir.path().join("results");
    let o = Command::new(bin()).arg("run").arg(&f).arg("--out").arg(&out).arg("-q").output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let res = faultline::report::load_dir(&out).unwrap();
    let rep = &res.setups[0].repetitions[0];
    let h = &rep.host_faults[0];
    let (on, off) = (h.applied_at_s.unwrap(), h.reverted_at_s.unwrap());
    assert!((on - 1.0).abs() < 0.3 && (off - 2.0).abs() < 0.3, "window 1..2 s realized as {on}..{off}");
    // nothing completes while the server is frozen; writes do before and after
    let ops = |a: f64, b: f64| -> f64 { rep.timeseries.iter().filter(|s| s.t_s > a && s.t_s <= b).map(|s| s.write_iops).sum() };
    assert_eq!(ops(on + 0.15, off - 0.05), 0.0, "writes completed while the disk server was frozen: {:?}", rep.timeseries);
    assert!(ops(0.0, on - 0.1) > 0.0 && ops(off + 0.2, 3.0) > 0.0, "no writes outside the window: {:?}", rep.timeseries);
}

/// kill -9 of a run while its host fault freezes the run's own disk server: the run cannot
/// end (its I/O waits for the frozen server) and the server cannot tear down. One `cleanup`
/// thaws the server first, so it sees its run gone and releases its disk itself: no loop
/// device, mount or ledger is left for a second `cleanup`, and it does not take the 20 s of
/// waiting for a frozen server to finish, then to die of SIGTERM, then of SIGKILL.
#[test]
fn cleanup_after_kill9_during_a_freeze_of_the_disk_server_leaves_nothing() {
    if !has("freezer") {
        return;
    }
    let run = RunDir::new("freeze");
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("exp.yaml");
    std::fs::write(
        &f,
        "name: freeze9\ndisk: {size: 64MiB}\nstack: raw\n\
workload: {pattern: sequential, mix: {write: 100}, block_size: 4KiB, duration: 30s, interval: 100ms}\n\
host_faults:\n  - {type: freeze, window: {from: 1s, to: 25s}}\n",
    )
    .unwrap();
    let mut child = run.spawn_run(&f, &dir.path().join("results"));
    // the server's ledger names the run as its owner; wait until its group is frozen
    let t = Instant::now();
    let server = loop {
        let ledgers = run.ledgers();
        let frozen = ledgers.iter().any(|v| {
            v["cgroups"][0]["path"].as_str().is_some_and(|g| {
                std::fs::read_to_string(format!("{g}/freezer.state")).is_ok_and(|s| s.trim() == "FROZEN")
                    || std::fs::read_to_string(format!("{g}/cgroup.freeze")).is_ok_and(|s| s.trim() == "1")
            })
        });
        let server = ledgers.iter().find(|v| v["owner"].is_array()).and_then(|v| v["pid"].as_u64());
        if let (true, Some(s)) = (frozen, server) {
            break s as u32;
        }
        if t.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the run never froze its disk server");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    std::thread::sleep(Duration::from_millis(300));
    child.kill().unwrap();
    // dead, though not yet gone (a thread of it waits for the frozen disk): a cleanup before
    // the kill took effect would see it alive and leave it, and the run would wait for good
    let pid = child.id();
    let t = Instant::now();
    while std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z ")) && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let (text, took) = run.cleanup();
    // the run ends once its disk answers again; if cleanup did not thaw it, it never would:
    // thaw by hand, so the test fails rather than hangs
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t.elapsed() > Duration::from_secs(30) {
            for v in run.ledgers() {
                if let Some(g) = v["cgroups"][0]["path"].as_str() {
                    let _ = std::fs::write(format!("{g}/freezer.state"), "THAWED");
                    let _ = std::fs::write(format!("{g}/cgroup.freeze"), "0");
                }
            }
            let _ = child.wait();
            panic!("the killed run did not end 30 s after cleanup: its disk server stayed frozen\n{text}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let t = Instant::now();
    while std::fs::read_to_string(format!("/proc/{server}/stat")).is_ok_and(|s| !s.contains(") Z ")) && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let left = run.leftovers();
    assert!(took < Duration::from_secs(10), "cleanup took {took:?}:\n{text}");
    assert!(!text.contains("killed disk server"), "the frozen server was killed instead of tearing down:\n{text}");
    assert!(left.is_empty(), "left after one cleanup: {left:?}\n{text}");
}
