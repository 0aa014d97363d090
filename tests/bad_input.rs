//! Bad input: clear error (file, line, what is allowed), non-zero exit, nothing left behind.

mod common;
use common::*;
use std::process::{Command, Output};

/// Run `faultline serve` with this rules text and extra args; it must fail without leftovers.
fn serve_fails(rules: &str, args: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.yaml");
    std::fs::write(&p, rules).unwrap();
    let run = RunDir::new("bad");
    let out = run.cmd(&["serve"]).args(args).arg("--rules").arg(&p).output().unwrap();
    check_failed(&out, &run)
}

/// The command failed, printed no device, and left nothing in its run directory (no loop
/// device over a file there, no mount, no ledger). Each command gets a run directory of its
/// own: a before/after list of the machine's devices changes with every other test running.
fn check_failed(out: &Output, run: &RunDir) -> String {
    assert!(!out.status.success(), "must fail");
    assert!(out.stdout.is_empty(), "no device path may be printed on failure");
    assert_eq!(run.leftovers(), Vec::<String>::new(), "something was left behind");
    String::from_utf8_lossy(&out.stderr).to_string()
}

#[test]
fn malformed_yaml() {
    let e = serve_fails("rules:\n  - {type: error\n", &["--size", "16MiB"]);
    assert!(e.contains("bad.yaml") && e.contains("error:"), "{e}");
}

#[test]
fn unknown_key_names_line_and_key() {
    let e = serve_fails("rules:\n  - type: error\n    op: read\n  - type: delay\n    dealy: 10us\n", &["--size", "16MiB"]);
    assert!(e.contains("bad.yaml:") && e.contains("dealy"), "{e}");
    assert!(e.contains(":5:") || e.contains(":4:"), "line of the bad key expected: {e}");
}

#[test]
fn bad_units_and_values() {
    let e = serve_fails("rules:\n  - {type: delay, delay: 10 parsecs}\n", &["--size", "16MiB"]);
    assert!(e.contains("bad.yaml") && e.contains("parsecs") && e.contains("us"), "{e}");
    let e = serve_fails("rules:\n  - {type: bitflip, op: write, bit: 9}\n", &["--size", "16MiB"]);
    assert!(e.contains("bad.yaml:2:") && e.contains("allowed: 0..7"), "{e}");
    let e = serve_fails("rules: []\n", &["--size", "16 MiBs"]);
    assert!(e.contains("16 MiBs"), "{e}");
    let e = serve_fails("rules: []\n", &["--size", "16MiB", "--block-size", "3000"]);
    assert!(e.contains("512B to 64KiB"), "{e}");
    let e = serve_fails("rules: []\n", &["--size", "16MiB", "--store", "tape:/dev/st0"]);
    assert!(e.contains("ram, file:PATH, device:PATH"), "{e}");
    let e = serve_fails("rules: []\n", &["--size", "16MiB", "--busy-poll", "5ms"]);
    assert!(e.contains("--busy-poll") && e.contains("up to 1ms"), "{e}");
    let e = serve_fails("rules: []\n", &["--size", "16MiB", "--busy-poll", "50"]);
    assert!(e.contains("no unit"), "{e}");
    let e = serve_fails("rules: []\n", &["--size", "0"]);
    assert!(e.contains("disk size 0") && e.contains("at least 16 blocks"), "{e}");
    // a bad size is refused before the file store's file is created
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("new.img");
    let e = serve_fails("rules: []\n", &["--size", "1000", "--store", &format!("file:{}", img.display())]);
    assert!(e.contains("disk size 1000") && e.contains("multiple of the block size"), "{e}");
    assert!(!img.exists(), "a refused disk created its file");
}

#[test]
fn control_socket_path_is_checked_before_anything_is_built() {
    let dir = tempfile::tempdir().unwrap();
    // under `timeout`: a serve that took the path would serve until killed
    let serve = |socket: &std::path::Path| {
        let run = RunDir::new("socket");
        let out =
            Command::new("timeout").args(["20", bin(), "serve", "--size", "16MiB", "--socket"]).arg(socket).env("FAULTLINE_RUN_DIR", &run.0).output().unwrap();
        check_failed(&out, &run)
    };
    // a missing directory is an error, not created (it was made, and left behind)
    let missing = dir.path().join("no/such/dir");
    let e = serve(&missing.join("s.sock"));
    assert!(e.contains("directory") && e.contains("does not exist"), "{e}");
    assert!(!dir.path().join("no").exists(), "the socket's directory was created");
    // a file in the way is the user's: it was removed to bind the socket
    let file = dir.path().join("notes.txt");
    std::fs::write(&file, "keep").unwrap();
    let e = serve(&file);
    assert!(e.contains("exists and is not a socket"), "{e}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep");
    let run = RunDir::new("net");
    let out = Command::new("timeout")
        .args(["20", bin(), "net", "--socket"])
        .arg(&file)
        .args(["up", "--hosts", "a,b"])
        .env("FAULTLINE_RUN_DIR", &run.0)
        .output()
        .unwrap();
    let e = check_failed(&out, &run);
    assert!(e.contains("exists and is not a socket"), "{e}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep");
}

#[test]
fn workload_flags_of_the_other_interface() {
    // they were ignored and the run went on; a spec file's keys are errors
    let dir = tempfile::tempdir().unwrap();
    let dev = dir.path().join("dev.img");
    std::fs::write(&dev, vec![0u8; 1 << 20]).unwrap();
    let out = dir.path().join("res");
    let run = |args: &[&str]| {
        let o = Command::new(bin()).arg("workload").args(args).arg("--out").arg(&out).output().unwrap();
        assert!(!o.status.success() && !out.exists(), "must fail before running: {args:?}");
        String::from_utf8_lossy(&o.stderr).to_string()
    };
    let d = dev.display().to_string();
    let e = run(&["--device", &d, "--ops", "10", "--files", "2"]);
    assert!(e.contains("--files and --file-size apply to files in a directory (--dir)"), "{e}");
    let e = run(&["--device", &d, "--ops", "10", "--file-size", "64KiB"]);
    assert!(e.contains("--files and --file-size apply"), "{e}");
    let e = run(&["--dir", &dir.path().display().to_string(), "--file-size", "64KiB", "--ops", "10", "--span", "1MiB"]);
    assert!(e.contains("--span applies to a device"), "{e}");
}

#[test]
fn workload_bound_of_zero() {
    // a bound of 0 would run nothing and still report success: refused with what is allowed
    let dir = tempfile::tempdir().unwrap();
    let dev = dir.path().join("dev.img");
    std::fs::write(&dev, vec![0u8; 1 << 20]).unwrap();
    let out = dir.path().join("res");
    for b in [["--ops", "0"], ["--size", "0"], ["--duration", "0s"]] {
        let o = Command::new(bin()).arg("workload").arg("--device").arg(&dev).args(b).arg("--out").arg(&out).output().unwrap();
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && !out.exists(), "must fail before running: {b:?}");
        assert!(e.contains("a bound of 0") && e.contains("allowed: more than 0"), "{e}");
    }
}

#[test]
fn host_faults_on_faultline_itself() {
    // a freeze of itself hung for good (its cgroup left frozen); a kill ended it mid-way
    let script = format!("exec {} host --pid $$ --fault '{{type: cpu, share: 50%}}' --duration 1s", bin());
    let out = Command::new("sh").args(["-c", &script]).output().unwrap();
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && e.contains("is this faultline process itself"), "{e}");
}

#[test]
fn failed_run_leaves_no_results_directory() {
    // a store file in a missing directory passes validation and fails when the disk starts
    let dir = tempfile::tempdir().unwrap();
    let exp = dir.path().join("exp.yaml");
    let store = dir.path().join("no/such/dir/disk.img");
    std::fs::write(&exp, format!("name: t\ndisk: {{size: 64MiB, store: 'file:{}'}}\nworkload: {{size: 1MiB}}\nmonitor: off\n", store.display())).unwrap();
    for out in [dir.path().join("made/res"), dir.path().join("given")] {
        if out.ends_with("given") {
            std::fs::create_dir(&out).unwrap();
        }
        let run = RunDir::new("failedrun");
        let o = run.cmd(&["run", "-q"]).arg(&exp).arg("--out").arg(&out).output().unwrap();
        let e = check_failed(&o, &run);
        assert!(e.contains("cannot open store file"), "{e}");
        if out.ends_with("given") {
            assert_eq!(std::fs::read_dir(&out).unwrap().count(), 0, "the given empty directory was left with files");
        } else {
            assert!(!dir.path().join("made").exists(), "the results directory (and its parent) were left behind");
        }
    }
}

#[test]
fn failed_run_keeps_the_results_of_finished_setups() {
    // setup `a` finishes, then setup `b`'s store cannot be opened: `b` is recorded as failed,
    // `a`'s results and maps are written, the run fails naming `b`
    let dir = tempfile::tempdir().unwrap();
    let exp = dir.path().join("exp.yaml");
    let store = dir.path().join("no/such/dir/disk.img");
    std::fs::write(
        &exp,
        format!(
            "name: t\ndisk: {{size: 64MiB}}\nworkload: {{size: 1MiB}}\nmonitor: off\nsetups:\n  - {{name: a}}\n  - {{name: b, disk: {{size: 64MiB, store: 'file:{}'}}}}\n",
            store.display()
        ),
    )
    .unwrap();
    let out = dir.path().join("res");
    let run = RunDir::new("keptmaps");
    let o = run.cmd(&["run", "-q"]).arg(&exp).arg("--out").arg(&out).output().unwrap();
    let e = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(!o.status.success() && run.leftovers().is_empty(), "must fail and leave nothing: {e}\n{:?}", run.leftovers());
    assert!(e.contains("cannot open store file") && e.contains("1 of 2 setup(s) failed (`b` repetition 1)"), "{e}");
    assert!(out.join("maps").join("a-1").exists(), "the finished repetition's maps are gone");
    let r = faultline::report::load_dir(&out).unwrap();
    assert_eq!(r.setups.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["a"]);
    assert!(r.failed.len() == 1 && r.failed[0].setup == "b" && r.failed[0].error.contains("disk server did not start"), "{:?}", r.failed);
}

#[test]
fn monitor_interval_and_out() {
    // an interval of 0 was taken; a file as --out failed only after the whole watch
    let o = Command::new(bin()).args(["monitor", "--device", "/dev/null", "--duration", "1s", "--interval", "0s"]).output().unwrap();
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && e.contains("--interval") && e.contains("allowed: 10ms or more"), "{e}");
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("monitor.json");
    std::fs::write(&f, "{}").unwrap();
    let o = Command::new(bin()).args(["monitor", "--device", "/dev/null", "--duration", "1s", "--out"]).arg(&f).output().unwrap();
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && o.stdout.is_empty() && e.contains("exists and is not a directory"), "{e}");
}

#[test]
fn fault_add_names_the_file_in_the_snippet_too() {
    let s = Serve::start("16MiB", "rules: []\n");
    let bad = s.dir.path().join("more.yaml");
    std::fs::write(&bad, "rules:\n  - {type: error, dealy: 1}\n").unwrap();
    let o = Command::new(bin()).arg("fault").arg("--socket").arg(&s.socket).arg("add").arg(&bad).output().unwrap();
    let e = String::from_utf8_lossy(&o.stderr).to_string();
    s.stop();
    let name = bad.display().to_string();
    assert!(!o.status.success() && e.contains(&format!("{name}:2:")) && e.contains(&format!("--> {name}:2:")), "{e}");
    assert!(!e.contains("rules:2:"), "the snippet named the server's `rules`: {e}");
}

#[test]
fn workload_span_below_one_block_per_thread() {
    // it said `the device span (0 bytes) is too small`, not the span given
    let dir = tempfile::tempdir().unwrap();
    let dev = dir.path().join("dev.img");
    std::fs::write(&dev, vec![0u8; 1 << 20]).unwrap();
    let o = Command::new(bin())
        .arg("workload")
        .arg("--device")
        .arg(&dev)
        .args(["--ops", "1", "--span", "3000", "--out"])
        .arg(dir.path().join("res"))
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && e.contains("span 3000 holds fewer blocks of 4096 than there are threads (1)"), "{e}");
}

#[test]
fn workload_out_that_is_a_file() {
    // refused only after the workload had written the device
    let dir = tempfile::tempdir().unwrap();
    let dev = dir.path().join("dev.img");
    std::fs::write(&dev, vec![0u8; 1 << 20]).unwrap();
    let out = dir.path().join("notes.txt");
    std::fs::write(&out, "keep").unwrap();
    let o = Command::new(bin()).arg("workload").arg("--device").arg(&dev).args(["--ops", "16", "--out"]).arg(&out).output().unwrap();
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && e.contains("exists and is not a directory"), "{e}");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "keep");
    assert!(std::fs::read(&dev).unwrap().iter().all(|&b| b == 0), "the workload ran before the error");
}

#[test]
fn profile_of_no_data() {
    // a profile is measured from data: paths that hold none are refused, no profile written
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("empty")).unwrap();
    std::fs::write(dir.path().join("empty/zero"), "").unwrap();
    let out = dir.path().join("p.profile");
    let o = Command::new(bin()).arg("profile").arg(dir.path().join("empty")).arg("-o").arg(&out).output().unwrap();
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && e.contains("no data to measure (1 files, 0 bytes)") && !out.exists(), "{e}");
}

#[test]
fn output_paths_are_checked_before_the_work() {
    // a missing directory or a directory as the file was found only once the work was done
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("data"), vec![7u8; 64 << 10]).unwrap();
    let missing = dir.path().join("no/such/p.out");
    for (args, flag) in [
        (vec!["profile".into(), dir.path().join("data").display().to_string(), "-o".into()], "-o"),
        (vec!["verify".into(), "--map".into(), dir.path().join("nomaps").display().to_string(), "--out".into()], "--out"),
    ] {
        for out in [missing.clone(), dir.path().to_path_buf()] {
            let o = Command::new(bin()).args(&args).arg(&out).output().unwrap();
            let e = String::from_utf8_lossy(&o.stderr);
            let why = if out == missing { "does not exist" } else { "is a directory" };
            assert!(!o.status.success() && e.contains(&format!("{flag} {}", out.display())) && e.contains(why), "{args:?} {}: {e}", out.display());
        }
    }
    assert!(!dir.path().join("no").exists());
}

#[test]
fn monitor_and_host_duration_of_zero() {
    // a zero duration would watch or apply nothing and still report success: refused
    let mut sleeper = Command::new("sleep").arg("30").spawn().unwrap();
    let pid = sleeper.id().to_string();
    for args in [&["monitor", "--device", "/dev/null"][..], &["host", "--pid", &pid, "--fault", "{type: cpu, share: 50%}"][..]] {
        let o = Command::new(bin()).args(args).args(["--duration", "0s"]).output().unwrap();
        let e = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && o.stdout.is_empty() && e.contains("--duration") && e.contains("allowed: more than 0"), "{args:?}: {e}");
    }
    let _ = sleeper.kill();
    let _ = sleeper.wait();
}

#[test]
fn device_store_needs_destructive_and_refuses_signatures() {
    // a real block device: a loop device over a file carrying an ext4 signature
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("img");
    std::fs::write(&img, vec![0u8; 32 << 20]).unwrap();
    assert!(Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&img).status().unwrap().success());
    let loopdev = LoopDev::attach(&img);
    let dev = loopdev.0.clone();
    let store = format!("device:{dev}");
    let e = serve_fails("rules: []\n", &["--store", &store]);
    assert!(e.contains("--destructive"), "{e}");
    let e = serve_fails("rules: []\n", &["--store", &store, "--destructive"]);
    assert!(e.contains("ext4") && e.contains("--force"), "{e}");
    drop(loopdev);
    // the signature is still there: nothing was written
    let out = Command::new("blkid").arg("-p").arg(&img).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("ext4"));
}

#[test]
fn not_root() {
    let run = RunDir::new("notroot");
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(bin())
        .args(["serve", "--size", "16MiB"])
        .env("FAULTLINE_RUN_DIR", &run.0)
        .output()
        .unwrap();
    let e = check_failed(&out, &run);
    assert!(e.contains("must run as root"), "{e}");
}

#[test]
fn missing_dev_fuse() {
    // a private mount namespace where /dev is an empty tmpfs
    let run = RunDir::new("nofuse");
    let script = format!("mount -t tmpfs none /dev && exec {} serve --size 16MiB", bin());
    let out = Command::new("unshare").args(["-m", "--propagation", "private", "sh", "-c", &script]).env("FAULTLINE_RUN_DIR", &run.0).output().unwrap();
    let e = check_failed(&out, &run);
    assert!(e.contains("/dev/fuse is missing"), "{e}");
}
