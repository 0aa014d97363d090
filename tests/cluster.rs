//! Agents reached through real exec channels: `ip netns exec` into namespaces made here, and
//! OpenSSH (an sshd started by the test on a free port, with keys made in a temp dir and real
//! host-key checking). Checks the hello, the clock offset, commands and their events, that an
//! agent ends its commands when its channel closes, and that `faultline cleanup` ends them
//! after the agent is killed.

mod common;

use common::{bin, skip};
use faultline::cluster::proto::{Event, Op};
use faultline::cluster::{Agent, Channel};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A network namespace for the test, deleted at the end.
struct Netns(String);
impl Netns {
    fn new(tag: &str) -> Netns {
        let name = format!("fl-test-{}", common::unique(tag));
        assert!(Command::new("ip").args(["netns", "add", &name]).status().unwrap().success());
        Netns(name)
    }
    fn channel(&self) -> Channel {
        Channel::Exec(vec!["ip".into(), "netns".into(), "exec".into(), self.0.clone()])
    }
}
impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

fn alive(pid: u32) -> bool {
    faultline::sys::process::start_time(pid).is_some_and(|t| faultline::sys::process::is_running(pid, t))
}

fn wait_gone(pid: u32, limit: Duration) -> bool {
    let t = Instant::now();
    while alive(pid) {
        if t.elapsed() > limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

#[test]
fn agents_in_namespaces_answer_and_end_their_commands_with_the_channel() {
    let spaces: Vec<Netns> = (0..4).map(|i| Netns::new(&format!("a{i}"))).collect();
    let mut agents: Vec<Agent> = spaces.iter().map(|n| Agent::connect(&n.channel(), bin()).unwrap()).collect();
    for a in &mut agents {
        // same machine, same clock: the estimate must find no offset beyond its own error
        let o = a.clock_offset(8).unwrap();
        assert!(o.offset_ns.unsigned_abs() <= o.error_ns + 1_000_000, "{o:?}");
        // the command really runs inside the namespace: only a loopback device there
        let r = a.call(Op::Exec { argv: vec!["ip".into(), "-o".into(), "link".into()], stdin: None }, Duration::from_secs(10)).unwrap();
        let links = r["stdout"].as_str().unwrap();
        assert!(links.lines().count() == 1 && links.contains("lo"), "{links}");
    }
    // a spawned command's output and exit come back as events
    let a = &mut agents[0];
    a.call(Op::Spawn { name: "echo".into(), argv: vec!["sh".into(), "-c".into(), "echo one; echo two >&2; exit 3".into()] }, Duration::from_secs(10)).unwrap();
    let mut seen = Vec::new();
    loop {
        match a.events().recv_timeout(Duration::from_secs(10)).expect("events") {
            Event::Output { line, stream, .. } => seen.push(format!("{stream}:{line}")),
            Event::Exit { code, .. } => {
                assert_eq!(code, Some(3));
                break;
            }
        }
    }
    seen.sort();
    assert_eq!(seen, ["stderr:two", "stdout:one"]);
    // errors come back as errors, and the agent goes on
    let e = a.call(Op::Kill { name: "nothing".into(), signal: None }, Duration::from_secs(10)).unwrap_err();
    assert!(format!("{e:#}").contains("no running command named `nothing`"), "{e:#}");
    // a long command, then the controller goes away: the agent ends it
    let r = agents[1].call(Op::Spawn { name: "sleep".into(), argv: vec!["sleep".into(), "300".into()] }, Duration::from_secs(10)).unwrap();
    let pid = r["pid"].as_u64().unwrap() as u32;
    assert!(alive(pid));
    let agent_pid = agents[1].hello.pid;
    drop(agents);
    assert!(wait_gone(pid, Duration::from_secs(10)), "the spawned command outlived its agent's channel");
    assert!(wait_gone(agent_pid, Duration::from_secs(10)), "the agent did not exit when its channel closed");
}

#[test]
fn cleanup_ends_the_commands_of_a_killed_agent() {
    // a run directory of the test's own: the cleanup below acts on it only (not on other
    // runs of the machine)
    let run_dir = tempfile::tempdir().unwrap();
    let env = format!("FAULTLINE_RUN_DIR={}", run_dir.path().display());
    let mut a = Agent::connect(&Channel::Exec(vec!["env".into(), env]), bin()).unwrap();
    // a command in its own group whose child would not die with the leader's parent
    let r = a.call(Op::Spawn { name: "tree".into(), argv: vec!["sh".into(), "-c".into(), "sleep 300 & wait".into()] }, Duration::from_secs(10)).unwrap();
    let leader = r["pid"].as_u64().unwrap() as i32;
    std::thread::sleep(Duration::from_millis(200));
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(a.hello.pid as i32), nix::sys::signal::Signal::SIGKILL);
    assert!(wait_gone(a.hello.pid, Duration::from_secs(5)));
    drop(a);
    // the group's `sleep` survives the agent (the leader dies with it, its child does not)
    std::thread::sleep(Duration::from_millis(200));
    assert!(faultline::sys::process::group_exists(leader), "nothing left to clean up: the test proves nothing");
    let out = Command::new(bin()).arg("cleanup").env("FAULTLINE_RUN_DIR", run_dir.path()).output().unwrap();
    assert!(out.status.success());
    let t = Instant::now();
    while faultline::sys::process::group_exists(leader) {
        assert!(t.elapsed() < Duration::from_secs(10), "cleanup left the killed agent's process group");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// An sshd on a free local port, keys and config in a temp dir, killed at the end.
struct Sshd {
    child: std::process::Child,
    dir: tempfile::TempDir,
    port: u16,
}
impl Sshd {
    fn start() -> Option<Sshd> {
        let sshd = ["/usr/sbin/sshd", "/usr/bin/sshd"].into_iter().find(|p| std::path::Path::new(p).exists())?;
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for (k, t) in [("host", "ed25519"), ("client", "ed25519")] {
            assert!(Command::new("ssh-keygen").args(["-q", "-t", t, "-N", "", "-f"]).arg(d.join(k)).status().unwrap().success());
        }
        std::fs::copy(d.join("client.pub"), d.join("authorized_keys")).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let cfg = format!(
            "Port {port}\nListenAddress 127.0.0.1\nHostKey {h}\nAuthorizedKeysFile {a}\nPermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nPidFile none\n",
            h = d.join("host").display(),
            a = d.join("authorized_keys").display()
        );
        std::fs::write(d.join("sshd_config"), cfg).unwrap();
        std::fs::create_dir_all("/run/sshd").unwrap();
        // the client checks the host key against this file: real host-key checking
        let host_pub = std::fs::read_to_string(d.join("host.pub")).unwrap();
        std::fs::write(d.join("known_hosts"), format!("[127.0.0.1]:{port} {host_pub}")).unwrap();
        let child = Command::new(sshd).arg("-D").arg("-e").arg("-f").arg(d.join("sshd_config")).stderr(Stdio::null()).spawn().unwrap();
        let t = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(t.elapsed() < Duration::from_secs(10), "sshd did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(Sshd { child, dir, port })
    }
    fn options(&self) -> Vec<String> {
        let d = self.dir.path();
        vec![
            "-p".into(),
            self.port.to_string(),
            "-i".into(),
            d.join("client").display().to_string(),
            "-o".into(),
            format!("UserKnownHostsFile={}", d.join("known_hosts").display()),
            "-o".into(),
            "StrictHostKeyChecking=yes".into(),
        ]
    }
}
impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn agents_over_openssh_with_the_binary_copied_over() {
    let Some(sshd) = Sshd::start() else {
        skip("", "no sshd (apt-get install openssh-server)");
        return;
    };
    let ch = Channel::Ssh { dest: "root@127.0.0.1".into(), options: sshd.options() };
    // opt-in copy of this faultline to the host, then an agent from the copy
    let copy = sshd.dir.path().join("bin").join("faultline");
    std::fs::create_dir_all(copy.parent().unwrap()).unwrap();
    let out = Command::new(bin())
        .args(["agent", "--ssh", "root@127.0.0.1", "--install", "--faultline"])
        .arg(&copy)
        .args(sshd.options().iter().flat_map(|o| ["--ssh-option".to_string(), o.clone()]))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("protocol 1") && text.contains("clock offset"), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read(&copy).unwrap(), std::fs::read(bin()).unwrap(), "the copied binary differs");
    let mut a = Agent::connect(&ch, copy.to_str().unwrap()).unwrap();
    let r = a.call(Op::Exec { argv: vec!["sh".into(), "-c".into(), "echo $SSH_CONNECTION".into()], stdin: None }, Duration::from_secs(10)).unwrap();
    assert!(r["stdout"].as_str().unwrap().contains("127.0.0.1"), "not run over ssh: {r}");
    a.shutdown().unwrap();
    // a host key that does not match is refused by OpenSSH, and the error says so
    std::fs::write(
        sshd.dir.path().join("known_hosts"),
        format!("[127.0.0.1]:{} {}", sshd.port, std::fs::read_to_string(sshd.dir.path().join("client.pub")).unwrap()),
    )
    .unwrap();
    let e = Agent::connect(&ch, copy.to_str().unwrap()).err().expect("a wrong host key must fail");
    assert!(format!("{e:#}").contains("did not start"), "{e:#}");
}
