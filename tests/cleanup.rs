//! After kill -9 of `faultline serve`, `faultline cleanup` leaves no loop device or FUSE mount.

mod common;
use common::*;

#[test]
fn cleanup_after_kill9() {
    let mut s = Serve::start("64MiB", "rules: []\n");
    let dev = s.dev.clone();
    let pid = s.pid();
    let name = dev.file_name().unwrap().to_string_lossy().to_string();
    let mnt = format!("/run/faultline/mnt-{pid}-0");
    assert!(faultline_mounts().contains(&mnt));
    s.kill9();
    // still there: nobody tore it down
    assert!(faultline_mounts().contains(&mnt), "expected the mount to survive kill -9");
    assert!(std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file")).is_ok());
    let out = std::process::Command::new(bin()).arg("cleanup").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&format!("detached {}", dev.display())), "{text}");
    assert!(!faultline_mounts().contains(&mnt), "FUSE mount left behind: {text}");
    assert_gone(&dev, pid);
    assert!(!std::path::Path::new(&mnt).exists());
    assert!(!std::path::Path::new(&format!("/run/faultline/runs/{pid}-0.json")).exists());
    // a second cleanup finds nothing of this run
    let out = std::process::Command::new(bin()).arg("cleanup").output().unwrap();
    assert!(!String::from_utf8_lossy(&out.stdout).contains(&format!("pid {pid}")));
}
