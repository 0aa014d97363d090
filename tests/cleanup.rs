//! After kill -9 of `faultline serve`, `faultline cleanup` leaves no loop device or FUSE mount.

mod common;
use common::*;

#[test]
fn cleanup_after_kill9() {
    let run = RunDir::new("kill9");
    let mut s = Serve::start_in(&run, &["--size", "64MiB"], "rules: []\n");
    let dev = s.dev.clone();
    let pid = s.pid();
    let name = dev.file_name().unwrap().to_string_lossy().to_string();
    let mnt = format!("{}/mnt-{pid}-0", run.0.display());
    assert!(mounts_in(&run.0).contains(&mnt));
    s.kill9();
    // still there: nobody tore it down
    assert!(mounts_in(&run.0).contains(&mnt), "expected the mount to survive kill -9");
    assert!(std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file")).is_ok());
    let (text, _) = run.cleanup();
    assert!(text.contains(&format!("detached {}", dev.display())), "{text}");
    assert!(!mounts_in(&run.0).contains(&mnt), "FUSE mount left behind: {text}");
    assert_gone_in(&run.0, &dev, pid);
    assert!(!std::path::Path::new(&mnt).exists());
    assert!(!run.0.join(format!("runs/{pid}-0.json")).exists());
    // a second cleanup finds nothing of this run
    let (text, _) = run.cleanup();
    assert!(!text.contains(&format!("pid {pid}")), "{text}");
    assert!(run.leftovers().is_empty(), "{:?}", run.leftovers());
}

/// `faultline serve --size 64MiB ARGS` recording into `run`: the process and its loop device.
fn serve(run: &RunDir, args: &[&str]) -> (std::process::Child, std::path::PathBuf) {
    let mut s = run.cmd(&["serve", "--size", "64MiB"]).args(args).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::null()).spawn().unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(s.stdout.take().unwrap()), &mut line).unwrap();
    (s, std::path::PathBuf::from(line.trim()))
}

/// In the child: serve a disk in this very process (the library allows it, though `run` uses
/// server processes), then read from it with every reply delayed: the read waits, and a kill -9
/// leaves the process stuck on its own FUSE connection.
fn serve_and_read_own_disk() {
    use faultline::disk::{DiskConfig, StoreSpec};
    use faultline::frontend::{Options, uring::RingMode};
    let cfg = DiskConfig {
        size: Some(64 << 20),
        block_size: 4096,
        store: StoreSpec::Ram,
        destructive: false,
        force: false,
        latency: None,
        populate: None,
        ..Default::default()
    };
    let opts = Options { ring: RingMode::Off, ..Options::default() };
    let served = faultline::stack::served::ServedDisk::start(
        &cfg,
        &opts,
        |d| {
            faultline::spec::rule::yaml::parse_rules("rules:\n  - type: delay\n    delay: 60s\n    op: read\n", "test", d.geometry())
                .map_err(anyhow::Error::msg)
        },
        None,
    )
    .unwrap();
    println!("{}", served.device().display());
    let d = faultline::workload::direct::DirectDev::open(served.device()).unwrap();
    let mut buf = faultline::workload::direct::AlignedBuf::new(4096);
    let _ = d.read_at(&mut buf, 0);
    std::process::exit(0);
}

#[test]
fn cleanup_aborts_the_fuse_connection_a_killed_process_is_stuck_on() {
    if std::env::var_os("FAULTLINE_TEST_SELF_DEADLOCK").is_some() {
        serve_and_read_own_disk();
    }
    let run = RunDir::new("stuck");
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "cleanup_aborts_the_fuse_connection_a_killed_process_is_stuck_on", "--nocapture", "--test-threads=1"])
        .env("FAULTLINE_TEST_SELF_DEADLOCK", "1")
        .env("FAULTLINE_RUN_DIR", &run.0)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut said = String::new();
    let dev = loop {
        let mut line = String::new();
        assert!(std::io::BufRead::read_line(&mut out, &mut line).unwrap() > 0, "the child ended early: {said}");
        said.push_str(&line);
        // the device follows the harness's "test NAME ... " on the same line
        if let Some(i) = line.find("/dev/loop") {
            break std::path::PathBuf::from(line[i..].trim());
        }
    };
    std::thread::sleep(std::time::Duration::from_millis(500)); // the read is waiting now
    child.kill().unwrap();
    let pid = child.id();
    std::thread::sleep(std::time::Duration::from_millis(500));
    // stuck: a thread of the killed process still waits for the disk it served itself
    let threads = std::fs::read_dir(format!("/proc/{pid}/task")).map(|d| d.count()).unwrap_or(0);
    assert!(threads >= 1 && child.try_wait().unwrap().is_none(), "the killed process was expected to hang on its own disk");
    let (text, took) = run.cleanup();
    assert!(text.contains("aborted FUSE connection"), "{text}");
    assert!(text.contains(&format!("detached {}", dev.display())), "{text}");
    assert!(took < std::time::Duration::from_secs(15), "cleanup took {took:?}: {text}");
    // the abort let the stuck thread go: the process ends
    let t = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        assert!(t.elapsed() < std::time::Duration::from_secs(10), "the killed process is still stuck after cleanup");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let me = run.0.to_string_lossy().to_string();
    assert!(!std::fs::read_to_string("/proc/self/mountinfo").unwrap().contains(&me), "mount left: {text}");
    assert!(std::fs::read_dir(run.0.join("runs")).map(|r| r.count()).unwrap_or(0) == 0, "ledger left: {text}");
}

#[test]
fn cleanup_says_why_it_leaves_a_device_under_a_users_own_mount() {
    let run = RunDir::new("usermount");
    let (mut s, dev) = serve(&run, &[]);
    // the user's own file system on the device, mounted where faultline recorded nothing
    assert!(std::process::Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&dev).status().unwrap().success());
    let mnt = tempfile::tempdir().unwrap();
    assert!(std::process::Command::new("mount").arg(&dev).arg(mnt.path()).status().unwrap().success());
    s.kill().unwrap();
    s.wait().unwrap();
    let (text, took) = run.cleanup();
    let umount = || std::process::Command::new("umount").arg(mnt.path()).status();
    let said =
        text.contains(&format!("could not detach {}: it is still mounted on {}", dev.display(), mnt.path().display())) && text.contains("did not record");
    let still = faultline::sys::mount::is_mounted(mnt.path());
    let _ = umount();
    assert!(said, "{text}");
    assert!(still, "cleanup must not take down a mount it did not make");
    assert!(took < std::time::Duration::from_secs(15));
    assert!(text.contains("kept "), "the ledger stays for the next cleanup: {text}");
    // with the user's mount gone, the next cleanup finishes the job
    let (text, _) = run.cleanup();
    assert!(text.contains(&format!("detached {}", dev.display())), "{text}");
}

/// The loop device's rq_affinity outlives its attachment: after kill -9 and a detach by hand
/// (the user's `losetup -d`), `cleanup` still puts the value it found back, or the next disk
/// on that device would start with the killed run's setting.
#[test]
fn cleanup_restores_rq_affinity_of_a_device_detached_by_hand() {
    let run = RunDir::new("rqaff");
    let (mut s, dev) = serve(&run, &["--rq-affinity", "2"]);
    let led = std::fs::read_dir(run.0.join("runs")).unwrap().flatten().next().expect("a ledger").path();
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(led).unwrap()).unwrap();
    let found = v["rq_affinity"][0][1].as_u64().expect("the ledger records the value found") as u8;
    assert_ne!(found, 2, "test needs a device whose own value is not 2");
    // put it back however the test ends: a failed run must not leave the next disk on this
    // device (and this test's next run) at 2
    struct Restore<'a>(&'a std::path::Path, u8);
    impl Drop for Restore<'_> {
        fn drop(&mut self) {
            let _ = faultline::sys::loopdev::set_rq_affinity(self.0, self.1);
        }
    }
    let _restore = Restore(&dev, found);
    assert_eq!(faultline::sys::loopdev::rq_affinity(&dev).unwrap(), 2);
    s.kill().unwrap();
    s.wait().unwrap();
    assert!(std::process::Command::new("losetup").arg("-d").arg(&dev).status().unwrap().success());
    assert_eq!(faultline::sys::loopdev::rq_affinity(&dev).unwrap(), 2, "the setting outlives the attachment");
    let (text, _) = run.cleanup();
    assert_eq!(faultline::sys::loopdev::rq_affinity(&dev).unwrap(), found, "{text}");
    assert!(text.contains(&format!("restored rq_affinity {found} on {}", dev.display())), "{text}");
}

/// A process in another mount namespace (`ip netns exec` makes one) holds a copy of the disk's
/// FUSE mount, which keeps the connection alive after the server's own unmount: the teardown
/// aborts it after a grace period instead of waiting as long as that process lives.
#[test]
fn teardown_ends_even_while_another_mount_namespace_holds_the_mount() {
    let ns = format!("fl-test-{}", unique("copy"));
    assert!(std::process::Command::new("ip").args(["netns", "add", &ns]).status().unwrap().success());
    let s = Serve::start("64MiB", "rules: []\n");
    let mut holder = std::process::Command::new("ip").args(["netns", "exec", &ns, "sleep", "60"]).spawn().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let t = std::time::Instant::now();
    s.stop();
    let took = t.elapsed();
    let _ = holder.kill();
    let _ = holder.wait();
    let _ = std::process::Command::new("ip").args(["netns", "del", &ns]).status();
    assert!(took < std::time::Duration::from_secs(30), "teardown took {took:?} while a mount copy lived");
}

/// The network faults an agent made inside a namespace (`ip netns exec NS faultline agent`) are
/// undone in that namespace, wherever `cleanup` runs: a device of the same name in cleanup's own
/// namespace is someone else's and stays (it was deleted instead, and the agent's stayed).
#[test]
fn cleanup_undoes_network_faults_in_the_namespace_they_were_made_in() {
    if !which("ip") {
        skip("", "needs ip (iproute2)");
        return;
    }
    let run = RunDir::new("netns");
    let ns = format!("fl-cleanuptest-{}", unique("netns"));
    let dev = format!("flqt{}", std::process::id() % 100_000);
    let ip = |args: &[&str]| std::process::Command::new("ip").args(args).stderr(std::process::Stdio::null()).status().unwrap().success();
    // whatever the outcome: the namespace and the device of cleanup's own namespace go
    struct Undo(String, String);
    impl Drop for Undo {
        fn drop(&mut self) {
            let _ = std::process::Command::new("ip").args(["link", "del", &self.1]).stderr(std::process::Stdio::null()).status();
            let _ = std::process::Command::new("ip").args(["netns", "del", &self.0]).status();
        }
    }
    let _undo = Undo(ns.clone(), dev.clone());
    assert!(ip(&["netns", "add", &ns]));
    assert!(ip(&["tuntap", "add", "dev", &dev, "mode", "tun"]), "cannot make a TUN device here");
    assert!(ip(&["netns", "exec", &ns, "ip", "tuntap", "add", "dev", &dev, "mode", "tun"]));
    use std::os::unix::fs::MetadataExt;
    let ino = std::fs::metadata(format!("/run/netns/{ns}")).unwrap().ino();
    // two dead agents' ledgers: one made in the namespace, one in a namespace that is gone
    let mut c = std::process::Command::new("true").spawn().unwrap();
    let dead = c.id();
    c.wait().unwrap();
    std::fs::create_dir_all(run.0.join("runs")).unwrap();
    for (seq, ino) in [(0, ino), (1, 1)] {
        let l = serde_json::json!({"pid": dead, "start_time": 1, "net_devices": [dev], "net_ns": ino});
        std::fs::write(run.0.join(format!("runs/{dead}-{seq}.json")), l.to_string()).unwrap();
    }
    let (text, _) = run.cleanup();
    assert!(text.contains(&format!("deleted network device {dev}")), "{text}");
    assert!(!ip(&["netns", "exec", &ns, "ip", "link", "show", &dev]), "the agent's device is left in its namespace: {text}");
    assert!(ip(&["link", "show", &dev]), "cleanup deleted a device of its own namespace that no ledger of it names: {text}");
    assert!(text.contains("network namespace 1 of pid") && text.contains("is gone"), "{text}");
    assert!(run.leftovers().is_empty(), "ledgers kept: {:?}\n{text}", run.leftovers());
}
