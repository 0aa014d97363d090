//! `faultline run`: the study's qualitative results on real stacks (scaled down), teardown
//! after Ctrl-C, and experiment-file errors.

mod common;
use common::{bin, faultline_mounts};
use faultline::report::model::{Results, SetupResult};

/// Written in 64 KiB requests: what a fault hits and what verification finds is counted per
/// 4 KiB disk block whatever the request size, and 4 KiB writes made these tests minutes long.
const WORKLOAD: &str = "workload:
  pattern: sequential
  mix: { write: 100 }
  block_size: 64KiB
  size: 256MiB
  files: 4
  file_size: 64MiB
  sync: direct
  content: { profile: debian12-usr, seed: 3 }
";

/// `WORKLOAD` in 4 KiB requests, for the deduplication study: its "one rot hits one shared
/// block" holds for content written block by block (in 64 KiB requests the rot counted 57).
const WORKLOAD_4K: &str = "workload:
  pattern: sequential
  mix: { write: 100 }
  block_size: 4KiB
  size: 256MiB
  files: 4
  file_size: 64MiB
  sync: direct
  content: { profile: debian12-usr, seed: 3 }
";

fn run(yaml: &str) -> Results {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("exp.yaml");
    std::fs::write(&f, yaml).unwrap();
    let out = dir.path().join("results");
    let o = std::process::Command::new(bin()).arg("run").arg(&f).arg("--out").arg(&out).arg("-q").output().unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "faultline run failed:\n{stdout}\n{stderr}");
    for f in ["results.json", "timeseries.csv", "faults.csv", "integrity.csv", "report.html"] {
        assert!(out.join(f).exists(), "{f} missing");
    }
    assert!(stdout.contains("results:"), "{stdout}");
    faultline::report::load_dir(&out).unwrap()
}

fn setup<'a>(r: &'a Results, name: &str) -> &'a SetupResult {
    r.setups.iter().find(|s| s.name == name).unwrap_or_else(|| panic!("no setup {name}"))
}

/// (injected, failures, silent, detected, app errors) of the first repetition.
fn counts(s: &SetupResult) -> (u64, u64, u64, u64, u64) {
    let c = s.repetitions[0].counts();
    (c.faults_injected, c.failures, c.silent, c.detected, c.app_errors)
}

fn notes(s: &SetupResult) -> String {
    s.repetitions[0].notes.join("\n")
}

#[test]
fn raw_device_matrix() {
    let r = run(&format!(
        "name: raw
disk: {{ size: 512MiB }}
stack: raw
{WORKLOAD}
setups:
  - name: baseline
    faults: []
  - name: bitflip-offset
    faults: [ {{ type: bitflip, op: write, times: 1, target: last_written_block, by: offset, when: {{ every: 64MiB }} }} ]
  - name: bitflip-content
    faults: [ {{ type: bitflip, op: write, times: 1, target: last_written_block, by: content, when: {{ every: 64MiB }} }} ]
  - name: medium-error
    faults: [ {{ type: error, op: read, target: last_written_block, when: {{ every: 64MiB }} }} ]
  - name: slow-disk
    faults: [ {{ type: delay, delay: 1s, op: write, times: 1, target: last_written_block, when: {{ every: 64MiB }} }} ]
"
    ));
    let base = setup(&r, "baseline");
    assert_eq!(counts(base), (0, 0, 0, 0, 0), "{}", notes(base));
    assert!(base.repetitions[0].integrity.ok >= 65536, "every written block verified");

    for name in ["bitflip-offset", "bitflip-content"] {
        let s = setup(&r, name);
        let (inj, fail, silent, _, app) = counts(s);
        assert_eq!(inj, 4, "{name}: one flip per 64 MiB\n{}", notes(s));
        assert_eq!((fail, silent, app), (4, 4, 0), "{name}: raw bit flips are silent corruption, one per flip\n{}", notes(s));
    }
    let s = setup(&r, "medium-error");
    let (inj, fail, _, detected, _) = counts(s);
    assert!(inj == 4 && fail >= inj && detected == fail, "medium error: every latent error is found, none silent: {:?}\n{}", counts(s), notes(s));

    let s = setup(&r, "slow-disk");
    let (inj, fail, ..) = counts(s);
    assert_eq!((inj, fail), (4, 0), "{}", notes(s));
    // 4 x 1 s of stall in one thread's serial writes: the 256 MiB take at least 4 s (a
    // comparison with the baseline's throughput would measure the machine's load: tests run
    // two at a time)
    let w = s.repetitions[0].write.mib_s;
    assert!(256.0 / w >= 4.0, "slow disk: 256 MiB at {w:.1} MiB/s took {:.2} s, under its 4 s of stalls", 256.0 / w);
    assert!(s.repetitions[0].write.max_us >= 1_000_000.0, "a 1 s write must show in max latency");
}

#[test]
fn file_system_matrix() {
    let r = run(&format!(
        "name: fs
disk: {{ size: 768MiB }}
{WORKLOAD}
faults: [ {{ type: bitflip, op: write, times: 1, target: last_written_block, when: {{ every: 64MiB }} }} ]
setups:
  - name: ext4
    stack: {{ fs: ext4, mkfs: [\"-b\", \"4096\"], mount: [data=ordered] }}
  - name: btrfs
    stack: btrfs
  - name: raid1
    stack: btrfs-raid1
"
    ));
    let s = setup(&r, "ext4");
    let (inj, fail, silent, ..) = counts(s);
    assert!(inj >= 4, "ext4: {:?}\n{}", counts(s), notes(s));
    assert_eq!((fail, silent), (inj, inj), "ext4 has no data checksums: every flip is silent corruption\n{}", notes(s));
    assert!(!s.repetitions[0].integrity.files_hit.is_empty());

    let s = setup(&r, "btrfs");
    let (inj, fail, silent, detected, _) = counts(s);
    assert!(inj >= 4, "btrfs: {:?}\n{}", counts(s), notes(s));
    assert_eq!(silent, 0, "btrfs checksums data: corruption must never be silent\n{}", notes(s));
    assert!(detected >= 1 && fail == detected, "btrfs reports flipped blocks as unreadable: {:?}\n{}", counts(s), notes(s));

    let s = setup(&r, "raid1");
    let (inj, fail, ..) = counts(s);
    assert!(inj >= 4, "raid1: {:?}\n{}", counts(s), notes(s));
    assert_eq!(fail, 0, "raid1 heals flips on one leg from the other\n{}", notes(s));
}

#[test]
fn dedup_blast_radius() {
    let r = run(&format!(
        "name: dedup
disk: {{ size: 768MiB }}
stack: dedup
{WORKLOAD_4K}
setups:
  - name: most-duplicated
    faults: [ {{ type: rot, target: most_duplicated }} ]
  - name: unique
    faults: [ {{ type: rot, target: unique }} ]
"
    ));
    let (m, u) = (setup(&r, "most-duplicated"), setup(&r, "unique"));
    let (mi, mf, ..) = counts(m);
    let (ui, uf, ..) = counts(u);
    // after deduplication each content has one physical block: the rot hits exactly one
    assert_eq!((mi, ui), (1, 1), "rot must hit the one shared block: most {:?} unique {:?}\n{}\n{}", counts(m), counts(u), notes(m), notes(u));
    assert_eq!(uf, 1, "the unique block is lost\n{}", notes(u));
    assert!(mf > 10 * uf, "one rotten block shared by many logical blocks costs all of them: most-duplicated {mf} vs unique {uf}\n{}", notes(m));
    assert!(!m.repetitions[0].integrity.files_hit.is_empty() && m.repetitions[0].integrity.files_hit.len() > 1, "the blast radius spans files");
}

#[test]
fn ctrl_c_tears_everything_down() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("exp.yaml");
    std::fs::write(&f, "name: long\ndisk: {size: 256MiB}\nstack: ext4\nworkload: {pattern: uniform, mix: {write: 100}, duration: 60s, files: 2, file_size: 32MiB, content: {profile: none}}\n").unwrap();
    let mut c = std::process::Command::new(bin()).arg("run").arg(&f).arg("--out").arg(dir.path().join("r")).arg("-q").spawn().unwrap();
    // wait until the file system is mounted, then interrupt
    let pid = c.id();
    let t = std::time::Instant::now();
    while !std::fs::read_to_string("/proc/self/mountinfo").unwrap().contains(&format!("fs-{pid}-")) {
        assert!(t.elapsed().as_secs() < 30, "the ext4 stack never appeared");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    std::thread::sleep(std::time::Duration::from_millis(500));
    // SAFETY: kill takes no pointers; our child, not yet waited for (its pid is not reused)
    unsafe { libc::kill(pid as i32, libc::SIGINT) };
    let st = c.wait().unwrap();
    assert!(!st.success(), "an interrupted run must not report success");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&format!("-{pid}-")), "mount of pid {pid} left behind:\n{mounts}");
    assert!(!faultline_mounts().iter().any(|m| m.contains(&format!("mnt-{pid}-"))));
    let loops = std::process::Command::new("losetup").arg("-a").output().unwrap();
    assert!(!String::from_utf8_lossy(&loops.stdout).contains(&format!("mnt-{pid}-")), "loop device left behind");
}

/// A setup that fails (here mkfs.ext4 refusing 1 KiB blocks on a disk of 4 KiB sectors) is
/// recorded and left out; the setups around it still run and are written; the run exits
/// non-zero naming it, and leaves nothing mounted or attached.
#[test]
fn a_failed_setup_is_recorded_and_the_run_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("exp.yaml");
    let w =
        "workload: {pattern: sequential, mix: {write: 100}, block_size: 64KiB, size: 8MiB, files: 1, file_size: 8MiB, sync: direct, content: {profile: none}}";
    std::fs::write(
        &f,
        format!("name: goes-on\ndisk: {{size: 128MiB}}\n{w}\nsetups:\n  - {{name: before, stack: raw}}\n  - {{name: bad-mkfs, stack: {{fs: ext4, mkfs: [-b, '1024']}}}}\n  - {{name: after, stack: ext4}}\n"),
    )
    .unwrap();
    let out = dir.path().join("r");
    let c = std::process::Command::new(bin())
        .arg("run")
        .arg(&f)
        .arg("--out")
        .arg(&out)
        .arg("-q")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = c.id();
    let o = c.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "a run with a failed setup must not report success:\n{stderr}");
    assert!(stderr.contains("1 of 3 setup(s) failed") && stderr.contains("`bad-mkfs` repetition 1"), "{stderr}");
    let r = faultline::report::load_dir(&out).unwrap();
    let names: Vec<&str> = r.setups.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["before", "after"]);
    assert!(r.setups.iter().all(|s| s.repetitions.len() == 1 && s.repetitions[0].write.ops > 0));
    assert_eq!(r.failed.len(), 1, "{:?}", r.failed);
    assert_eq!((r.failed[0].setup.as_str(), r.failed[0].repetition), ("bad-mkfs", 1));
    assert!(r.failed[0].error.contains("mkfs.ext4"), "{}", r.failed[0].error);
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("1 repetition(s) failed") && html.contains("bad-mkfs"));
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&format!("-{pid}-")), "mount of pid {pid} left behind:\n{mounts}");
    let loops = String::from_utf8_lossy(&std::process::Command::new("losetup").arg("-a").output().unwrap().stdout).to_string();
    assert!(!loops.contains(&format!("mnt-{pid}-")), "loop device left behind:\n{loops}");
}

#[test]
fn experiment_errors_name_line_and_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("name: x\nstack: zfs\nworkload: {size: 1MiB}\n", "exp.yaml:2:", "allowed: raw, ext4"),
        ("name: x\nworkload: {size: 1MiB}\nfaults:\n  - {type: bitflip, target: last_written_block}\n", "exp.yaml:4:", "needs a `when`"),
        ("name: x\nworkload: {size: 1MiB}\nfaults:\n  - {type: bitflip, target: unique, disk: 1}\n", "exp.yaml:4:", "does not exist"),
        (
            "name: x\nstack: ext4\nworkload: {size: 1MiB}\nfaults:\n  - {type: bitflip, op: write, target: last_written_block, by: offset, when: {every: 1MiB}}\n",
            "exp.yaml:5:",
            "by: content",
        ),
        ("name: x\ncolour: red\n", "exp.yaml", "colour"),
        ("stack: raw\n", "exp.yaml", "missing `name`"),
        ("name: x\ndisk: {busy_poll: 5ms}\n", "exp.yaml:2:19:", "up to 1ms"),
        ("name: x\ndisk: {busy_poll: 20}\n", "exp.yaml:2:19:", "no unit"),
    ];
    for (yaml, at, what) in cases {
        let f = dir.path().join("exp.yaml");
        std::fs::write(&f, yaml).unwrap();
        let o = std::process::Command::new(bin()).arg("run").arg(&f).arg("--check").output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{yaml} should be refused");
        assert!(err.contains(at) && err.contains(what), "{yaml}: expected `{at}` and `{what}` in:\n{err}");
    }
    // the shipped examples are valid
    for ex in ["quickstart.yaml", "study.yaml"] {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples").join(ex);
        let o = std::process::Command::new(bin()).arg("run").arg(&p).arg("--check").output().unwrap();
        assert!(o.status.success(), "{ex}: {}", String::from_utf8_lossy(&o.stderr));
    }
}

#[test]
fn file_block_target_op_trigger_and_command_stack() {
    let r = run(
        "name: targets
disk: { size: 256MiB }
workload: { pattern: sequential, mix: { write: 100 }, size: 32MiB, files: 4, file_size: 8MiB, sync: direct, content: { profile: none } }
setups:
  - name: file-block
    stack: ext4
    faults: [ { type: bitflip, op: write, times: 1, target: { file: f1, block: 5 } } ]
  - name: after-ops
    stack: raw
    faults: [ { type: error, op: write, times: 1, when: { after_ops: 100 } } ]
  - name: command
    stack: { command: 'dd if=/dev/zero of=$FAULTLINE_DEVICE bs=4k count=64 oflag=direct 2>/dev/null; dd if=$FAULTLINE_DEVICE of=/dev/null bs=4k count=64 iflag=direct' }
    faults: [ { type: error, op: read, target: { block: 10 } } ]
",
    );
    // block 5 of file 1, and nothing else
    let s = setup(&r, "file-block");
    let bad = &s.repetitions[0].integrity.bad;
    assert_eq!(bad.len(), 1, "{bad:?}\n{}", notes(s));
    assert_eq!((bad[0].file.as_deref(), bad[0].offset, bad[0].kind.as_str()), (Some("faultline-0001.dat"), 5 * 4096, "corrupted"));
    // one write fails once the workload has done 100 ops
    let s = setup(&r, "after-ops");
    let (inj, fail, _, _, app) = counts(s);
    assert_eq!((inj, app, fail), (1, 1, 0), "the failed write is an app error; nothing unverified\n{}", notes(s));
    // the command saw the read error: dd fails, faultline says so
    let s = setup(&r, "command");
    let n = notes(s);
    assert!(n.contains("exit code 1") && n.contains("the command failed"), "{n}");
    assert!(counts(s).0 >= 1, "the read error fired: {n}");
}
