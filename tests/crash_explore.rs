//! `faultline crash explore` / `crash replay` and the dm-log-writes format, against real
//! parts: xfstests' replay-log (built from its source by scripts/replay-log.sh), ext4 with
//! e2fsck, loop devices.

mod common;

use common::{RunDir, bin, unique};
use faultline::crash::overlay::{Overlay, OverlayStore};
use faultline::crash::states::{self, StateId, Variant};
use faultline::disk::Store;
use faultline::disk::logwrites::{DISCARD, FLUSH, FUA, Kind, Log, LogWriter, MARK, replay_into};
use rand::{Rng, SeedableRng};
use serde_json::Value;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// xfstests' replay-log, built once per test binary.
fn replay_log() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let out = std::env::temp_dir().join(format!("replay-log-{}", std::process::id()));
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/replay-log.sh");
            let o = Command::new("bash").arg(script).arg(&out).output().unwrap();
            assert!(o.status.success(), "building replay-log failed (set XFSTESTS_SRC to an xfstests checkout): {}", String::from_utf8_lossy(&o.stderr));
            out
        })
        .clone()
}

fn run_replay_log(args: &[&str]) -> String {
    let o = Command::new(replay_log()).args(args).output().unwrap();
    assert!(o.status.success(), "replay-log {args:?}: {}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// replay-log's image of `log` after `args` (onto a zeroed file of `size` bytes).
fn replay_log_image(dir: &Path, log: &Path, size: u64, args: &[&str]) -> Vec<u8> {
    let img = dir.join(unique("img"));
    std::fs::File::create(&img).unwrap().set_len(size).unwrap();
    let mut a = vec!["--log", log.to_str().unwrap(), "--replay", img.to_str().unwrap()];
    a.extend_from_slice(args);
    run_replay_log(&a);
    let b = std::fs::read(&img).unwrap();
    std::fs::remove_file(&img).unwrap();
    b
}

fn our_image(log: &Log, upto: usize, size: u64) -> Vec<u8> {
    let f = tempfile::tempfile().unwrap();
    f.set_len(size).unwrap();
    replay_into(log, upto, &f).unwrap();
    let mut b = Vec::new();
    let mut f = f;
    std::io::Seek::rewind(&mut f).unwrap();
    f.read_to_end(&mut b).unwrap();
    b
}

#[test]
fn logs_we_write_replay_with_xfstests_replay_log() {
    let dir = tempfile::tempdir().unwrap();
    let size = 1u64 << 20;
    for ss in [512u32, 4096] {
        let p = dir.path().join(format!("log-{ss}"));
        let mut w = LogWriter::create(&p, ss).unwrap();
        let mut r = rand::rngs::StdRng::seed_from_u64(ss as u64);
        let mut marks = vec![];
        for i in 0..300u32 {
            match r.random_range(0..10) {
                0 => w.flush().unwrap(),
                1 => {
                    let n = format!("m{i}");
                    w.mark(&n).unwrap();
                    marks.push((n, w.entries() as usize));
                }
                2 => {
                    let off = r.random_range(0..size / ss as u64 - 8) * ss as u64;
                    w.discard(off, ss as u64 * r.random_range(1..8)).unwrap();
                }
                k => {
                    let len = ss as usize * r.random_range(1..9);
                    let off = r.random_range(0..(size - len as u64) / ss as u64) * ss as u64;
                    let data: Vec<u8> = (0..len).map(|_| r.random()).collect();
                    w.write(off, &data, if k == 3 { FUA } else { 0 }).unwrap();
                }
            }
        }
        let n = w.finish().unwrap();
        let log = Log::open(&p).unwrap();
        assert_eq!(log.entries.len() as u64, n);
        let ps = p.to_str().unwrap();
        // its reading of the super block and of every entry header
        assert_eq!(run_replay_log(&["--log", ps, "--num-entries"]).trim(), n.to_string());
        assert_eq!(run_replay_log(&["--log", ps]).trim(), format!("Log version=1, sectorsize={ss}, entries={n}"));
        // replayed to marks (it stops after the mark entry) and to entry counts: the same bytes
        assert!(marks.len() >= 5, "{} marks", marks.len());
        for (name, upto) in marks.iter().step_by(marks.len() / 5) {
            let found = run_replay_log(&["--log", ps, "--find", "--end-mark", name]);
            assert_eq!(found.split('@').next().unwrap(), (upto - 1).to_string(), "find {name}");
            let theirs = replay_log_image(dir.path(), &p, size, &["--end-mark", name]);
            assert!(theirs == our_image(&log, *upto, size), "sector size {ss}: images differ at mark {name}");
        }
        for limit in [1, n as usize / 3, n as usize] {
            let theirs = replay_log_image(dir.path(), &p, size, &["--limit", &limit.to_string()]);
            assert!(theirs == our_image(&log, limit, size), "sector size {ss}: images differ after {limit} entries");
        }
        // the flags replay-log prints are the ones we wrote
        let v = Command::new(replay_log()).args(["--log", ps, "--replay", "/dev/null", "-v", "--limit", &n.to_string()]).output().unwrap();
        let text = String::from_utf8_lossy(&v.stdout);
        let count = |f: &str| text.lines().filter(|l| l.contains(f)).count();
        let ours = |k: fn(&faultline::disk::logwrites::Entry) -> bool| log.entries.iter().filter(|e| k(e)).count();
        assert_eq!(count("(FLUSH)"), ours(|e| e.kind == Kind::Flush));
        assert_eq!(count("(FUA)"), ours(|e| e.fua()));
        assert_eq!(count("(DISCARD)"), ours(|e| e.kind == Kind::Discard));
    }
}

/// A file of tests/fixtures/dm-log-writes (its README.md says how they were recorded).
fn kernel_fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/dm-log-writes").join(name)
}

/// The fixture `name` (gzip'd) uncompressed into `dir`, by gzip itself.
fn gunzip_fixture(dir: &Path, name: &str) -> PathBuf {
    let o = Command::new("gzip").arg("-dc").arg(kernel_fixture(name)).output().unwrap();
    assert!(o.status.success(), "gzip -dc {name}: {}", String::from_utf8_lossy(&o.stderr));
    let p = dir.join(unique(name.trim_end_matches(".gz")));
    std::fs::write(&p, o.stdout).unwrap();
    p
}

/// An operation of an ops file, or an entry of a dm-log-writes log: kind, byte offset, byte
/// length, flags (a write's `n` is its place among the ops file's writes, from 1).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Logged {
    Write { n: u32, off: u64, len: u64, flags: u64 },
    Discard { off: u64, len: u64 },
    Flush,
    Mark(String),
}

/// The operations of tests/fixtures/dm-log-writes/ops-SS (scripts/dm-log-writes-io.c runs them
/// in the recording machine) and the entries the kernel's dm-log-writes
/// (drivers/md/dm-log-writes.c) logs for them: a plain write or a discard is held from its completion until a
/// flush completes, then logged ahead of that flush; a FUA write is logged when it completes,
/// ahead of the writes still held, and its O_DSYNC then flushes; a mark is logged when it is
/// sent, ahead of the writes still held; removing the target logs what it still holds, then the
/// mark `dm-log-writes-end`.
fn kernel_log_of_ops(ss: u32) -> (Vec<Logged>, Vec<Logged>) {
    let text = std::fs::read_to_string(kernel_fixture(&format!("ops-{ss}"))).unwrap();
    let (mut ops, mut n) = (vec![], 0);
    for (i, line) in text.lines().enumerate() {
        let w: Vec<&str> = line.split('#').next().unwrap().split_whitespace().collect();
        let num = |k: usize| w[k].parse::<u64>().unwrap_or_else(|_| panic!("ops-{ss} line {}: {line}", i + 1));
        ops.push(match w.as_slice() {
            [] => continue,
            ["write" | "fua", _, _] => {
                n += 1;
                Logged::Write { n, off: num(1), len: num(2), flags: if w[0] == "fua" { FUA } else { 0 } }
            }
            ["flush"] => Logged::Flush,
            ["discard", _, _] => Logged::Discard { off: num(1), len: num(2) },
            ["mark", name] => Logged::Mark(name.to_string()),
            _ => panic!("ops-{ss} line {}: {line}", i + 1),
        });
    }
    let (mut log, mut held) = (vec![], vec![]);
    for op in &ops {
        match op {
            Logged::Write { flags: 0, .. } | Logged::Discard { .. } => held.push(op.clone()),
            Logged::Write { .. } => {
                log.push(op.clone());
                log.append(&mut held);
                log.push(Logged::Flush);
            }
            Logged::Flush => {
                log.append(&mut held);
                log.push(Logged::Flush);
            }
            Logged::Mark(_) => log.push(op.clone()),
        }
    }
    log.append(&mut held);
    log.push(Logged::Mark("dm-log-writes-end".into()));
    (ops, log)
}

/// What scripts/dm-log-writes-io.c writes as its write `n` at [off, off+len): each 512 B
/// sector S holds 16 records "write N sector S", left-aligned in 31 bytes, then a newline.
fn kernel_fixture_data(n: u32, off: u64, len: u64) -> Vec<u8> {
    (0..len / 32).flat_map(|k| format!("{:<31}\n", format!("write {n} sector {}", (off + k * 32) / 512)).into_bytes()).collect()
}

/// The device after `entries` (of `kernel_log_of_ops`) on a zeroed one of `size` bytes.
fn kernel_fixture_image(entries: &[Logged], size: u64) -> Vec<u8> {
    let mut img = vec![0u8; size as usize];
    for e in entries {
        match *e {
            Logged::Write { n, off, len, .. } => img[off as usize..(off + len) as usize].copy_from_slice(&kernel_fixture_data(n, off, len)),
            Logged::Discard { off, len } => img[off as usize..(off + len) as usize].fill(0),
            _ => {}
        }
    }
    img
}

#[test]
fn a_log_recorded_by_the_kernels_dm_log_writes_reads_and_replays_like_replay_log() {
    let dir = tempfile::tempdir().unwrap();
    for ss in [512u32, 4096] {
        let p = gunzip_fixture(dir.path(), &format!("log-{ss}.gz"));
        let disk = std::fs::read(gunzip_fixture(dir.path(), &format!("data-{ss}.gz"))).unwrap();
        let size = disk.len() as u64;
        let log = Log::open(&p).unwrap();
        let ps = p.to_str().unwrap();
        let n = log.entries.len();
        assert_eq!(log.sectorsize, ss);
        assert_eq!(run_replay_log(&["--log", ps]).trim(), format!("Log version=1, sectorsize={ss}, entries={n}"));
        // every entry, in order, is the one the kernel's rules make of the operations; each
        // write holds what the recording machine wrote
        let (ops, expect) = kernel_log_of_ops(ss);
        let got: Vec<Logged> = log
            .entries
            .iter()
            .zip(&expect)
            .map(|(e, x)| match (&e.kind, x) {
                (Kind::Write { .. }, Logged::Write { n, .. }) => {
                    let mut b = vec![0u8; e.len as usize];
                    log.data(e, 0, &mut b).unwrap();
                    assert!(b == kernel_fixture_data(*n, e.off, e.len), "sector size {ss}: entry {} holds other data than write {n}", e.index);
                    Logged::Write { n: *n, off: e.off, len: e.len, flags: e.flags }
                }
                (Kind::Write { .. }, _) => Logged::Write { n: 0, off: e.off, len: e.len, flags: e.flags },
                (Kind::Discard, _) => Logged::Discard { off: e.off, len: e.len },
                (Kind::Flush, _) => Logged::Flush,
                (Kind::Mark(m), _) => Logged::Mark(m.clone()),
            })
            .collect();
        assert_eq!(got, expect[..got.len()], "sector size {ss}: the log against the kernel's rules for ops-{ss}");
        assert_eq!(n, expect.len(), "sector size {ss}: entries");
        // flags: FUA on the FUA writes only, FLUSH on the flushes only (dm splits a preflush off
        // its write), no METADATA (no file system wrote); a FUA write was logged ahead of a write
        // that completed before it
        for e in &log.entries {
            let want = match e.kind {
                Kind::Flush => FLUSH,
                Kind::Discard => DISCARD,
                Kind::Mark(_) => MARK,
                Kind::Write { .. } => e.flags & FUA,
            };
            assert_eq!(e.flags, want, "sector size {ss}: entry {} flags", e.index);
        }
        let fua = log.entries.iter().position(|e| e.fua()).expect("a FUA write");
        let (Logged::Write { n: nf, .. }, Logged::Write { n: nb, flags: 0, .. }) = (&got[fua], &got[fua + 1]) else { panic!("sector size {ss}: {got:?}") };
        assert!(nb < nf, "sector size {ss}: after FUA write {nf}, expected a write that completed before it, got write {nb}");
        // a mark sent while a write was held comes before it
        let early = ops.iter().position(|x| *x == Logged::Mark("early".into())).unwrap();
        assert!(matches!(ops[early - 1], Logged::Write { flags: 0, .. }), "ops-{ss}: a write before the mark early");
        let at = log.find_mark("early").unwrap();
        assert_eq!(got[at + 1], ops[early - 1], "sector size {ss}: the write before the mark early");
        let v = Command::new(replay_log()).args(["--log", ps, "--replay", "/dev/null", "-v", "--limit", &n.to_string()]).output().unwrap();
        let text = String::from_utf8_lossy(&v.stdout);
        let count = |f: &str| text.lines().filter(|l| l.contains(f)).count();
        assert_eq!(count("(FLUSH)"), expect.iter().filter(|x| **x == Logged::Flush).count());
        assert_eq!(count("(FUA)"), 1);
        assert_eq!(count("(DISCARD)"), expect.iter().filter(|x| matches!(x, Logged::Discard { .. })).count());
        // after each mark and each prefix: replay-log's image, ours and the operations' are the
        // same bytes
        for x in &expect {
            let Logged::Mark(name) = x else { continue };
            let at = log.find_mark(name).unwrap();
            let found = run_replay_log(&["--log", ps, "--find", "--end-mark", name]);
            assert_eq!(found.split('@').next().unwrap(), at.to_string(), "find {name}");
            let theirs = replay_log_image(dir.path(), &p, size, &["--end-mark", name]);
            assert!(theirs == our_image(&log, at + 1, size), "sector size {ss}: images differ at mark {name}");
            assert!(theirs == kernel_fixture_image(&expect[..=at], size), "sector size {ss}: at mark {name}, not what the operations wrote");
        }
        for limit in 1..=n {
            let theirs = replay_log_image(dir.path(), &p, size, &["--limit", &limit.to_string()]);
            assert!(theirs == our_image(&log, limit, size), "sector size {ss}: images differ after {limit} entries");
            assert!(theirs == kernel_fixture_image(&expect[..limit], size), "sector size {ss}: after {limit} entries, not what the operations wrote");
        }
        // the whole log replayed is the data disk as the kernel left it
        assert!(our_image(&log, n, size) == disk, "sector size {ss}: the replayed log differs from the recorded data disk");
    }
}

#[test]
fn a_log_recorded_by_the_kernels_dm_log_writes_explores_and_replays_by_id() {
    let run = RunDir::new("crash-kernel-log");
    let dir = tempfile::tempdir().unwrap();
    let p = gunzip_fixture(dir.path(), "log-512.gz");
    let disk = std::fs::read(gunzip_fixture(dir.path(), "data-512.gz")).unwrap();
    let out = dir.path().join("out");
    let o = run
        .cmd(&["crash", "explore", "--log"])
        .arg(&p)
        .args(["--stack", "raw", "--ring", common::ring_where_available(), "--per-epoch", "2", "--seed", "7", "-q", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "explore --log: {}", String::from_utf8_lossy(&o.stderr));
    let meta: Value = serde_json::from_slice(&std::fs::read(out.join("explore.json")).unwrap()).unwrap();
    let size = meta["size"].as_u64().unwrap();
    assert_eq!(size, disk.len() as u64, "the default size: the furthest write's end rounded up to 1 MiB");
    assert_eq!(meta["ring"], common::ring_where_available(), "the states' transport, for replay");
    let log = Log::open(&p).unwrap();
    let eps = states::epochs(&log);
    let (_, expect) = kernel_log_of_ops(512);
    // one epoch per flush, and the writes the target still held when it was removed
    assert_eq!(eps.len(), expect.iter().filter(|x| **x == Logged::Flush).count() + 1);
    let rs = results(&out);
    let boundaries: Vec<&Value> = rs.iter().filter(|r| r["variant"] == "boundary").collect();
    assert_eq!(boundaries.len(), eps.len());
    // each boundary state, served by `crash replay`, is replay-log's image of its prefix and
    // what the operations had written by then; the last is the recorded data disk
    for (k, ep) in eps.iter().enumerate() {
        let theirs = replay_log_image(dir.path(), &p, size, &["--limit", &ep.end.to_string()]);
        let served = replayed_bytes(&run, &out, &format!("e{k}"));
        assert!(served == theirs, "state e{k} differs from replay-log --limit {}", ep.end);
        assert!(served == kernel_fixture_image(&expect[..ep.end], size), "state e{k}: not what the operations wrote");
        if k == eps.len() - 1 {
            assert!(served == disk, "the last state differs from the recorded data disk");
        }
    }
    // a subset of the FUA write's epoch keeps that write whole (it was durable when it completed)
    let fua = log.entries.iter().position(|e| e.fua()).expect("a FUA write");
    let fe = eps.iter().position(|ep| (ep.start..ep.end).contains(&fua)).unwrap();
    assert!(eps[fe].writes >= 2, "the FUA write's epoch has a held write too: {:?}", eps[fe]);
    let Logged::Write { n, off, len, .. } = expect[fua] else { panic!("entry {fua}: {:?}", expect[fua]) };
    for k in 0..2 {
        let served = replayed_bytes(&run, &out, &format!("e{fe}-s{k}"));
        assert!(served[off as usize..(off + len) as usize] == kernel_fixture_data(n, off, len), "state e{fe}-s{k} lost the FUA write");
    }
    assert_eq!(run.leftovers(), Vec::<String>::new());
}

const EXPERIMENT: &str = "
name: crash-small
disk: { size: 64MiB, store: ram }
stack: { fs: ext4 }
workload:
  interface: file
  files: 3
  file_size: 128KiB
  pattern: uniform
  mix: { write: 100 }
  block_size: 4KiB
  engine: psync
  ops: 24
  sync: fsync:3
repeat: 1
";

/// `crash explore` of `yaml` (DIR/exp.yaml) with `--per-epoch K --seed S`, which must succeed:
/// its results directory (DIR/out) and what it printed.
/// `yaml` with its disk served over `ring` (scripts/test.sh runs this binary once, each test
/// over the transport it names: both are covered).
fn over(yaml: &str, ring: &str) -> String {
    assert!(yaml.contains("disk: { size: 64MiB, store: ram }"), "keep the experiments and over() in step");
    yaml.replacen("disk: { size: 64MiB, store: ram }", &format!("disk: {{ size: 64MiB, store: ram, ring: {ring} }}"), 1)
}

fn explore_ok(run: &RunDir, dir: &Path, yaml: &str, per_epoch: u32, seed: u64) -> (PathBuf, String) {
    common::check_pinned("its experiment's disk", yaml.contains("ring: "));
    let exp = dir.join("exp.yaml");
    std::fs::write(&exp, yaml).unwrap();
    let out = dir.join("out");
    let o = run
        .cmd(&["crash", "explore"])
        .arg(&exp)
        .args(["--per-epoch", &per_epoch.to_string(), "--seed", &seed.to_string(), "-q", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "explore: {}", String::from_utf8_lossy(&o.stderr));
    (out, String::from_utf8_lossy(&o.stdout).into_owned())
}

fn results(out: &Path) -> Vec<Value> {
    std::fs::read_to_string(out.join("states.jsonl")).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// `crash replay`: its device, read whole while it serves, then Ctrl-C.
fn replayed_bytes(run: &RunDir, out: &Path, id: &str) -> Vec<u8> {
    let mut c = run.cmd(&["crash", "replay"]).arg(out).arg(id).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(c.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert!(line.starts_with("/dev/loop"), "replay printed {line:?}");
    let dev = line.trim().to_string();
    let bytes = std::fs::read(&dev).unwrap();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.id() as i32), nix::sys::signal::Signal::SIGINT).unwrap();
    let st = c.wait().unwrap();
    assert!(st.success(), "replay ended with {st}");
    bytes
}

#[test]
fn explore_checks_ext4_states_and_each_replays_by_id() {
    let run = RunDir::new("crash-explore");
    let dir = tempfile::tempdir().unwrap();
    let (out, _) = explore_ok(&run, dir.path(), &over(EXPERIMENT, common::ring_where_available()), 1, 5);
    let summary: Value = serde_json::from_slice(&std::fs::read(out.join("summary.json")).unwrap()).unwrap();
    let meta: Value = serde_json::from_slice(&std::fs::read(out.join("explore.json")).unwrap()).unwrap();
    let rs = results(&out);
    assert_eq!(rs.len() as u64, summary["states"].as_u64().unwrap());
    let log = Log::open(&out.join("log")).unwrap();
    let eps = states::epochs(&log);
    let first = meta["first_epoch"].as_u64().unwrap() as usize;
    assert_eq!(meta["ring"], common::ring_where_available(), "the experiment's disk's transport");
    // every flush boundary from the workload's epoch on was checked, plus subsets and torn ones
    let boundaries: Vec<&Value> = rs.iter().filter(|r| r["variant"] == "boundary").collect();
    assert_eq!(boundaries.len(), eps.len() - first);
    assert!(eps.len() - first >= 8, "an fsync every 3 writes makes many epochs: {}", eps.len() - first);
    assert!(rs.iter().any(|r| r["variant"] == "subset") && rs.iter().any(|r| r["variant"] == "torn"));
    // the log's marks: the workload's start and end, and the sync after it
    let synced = log.find_mark("synced").expect("synced mark");
    assert!(log.find_mark("workload-start").unwrap() < log.find_mark("workload-end").unwrap());
    assert!(log.find_mark("workload-end").unwrap() < synced);
    // at every flush boundary ext4 mounts and checks clean; past the sync every written block
    // of every file is there
    let mut past = 0;
    for r in &boundaries {
        assert_eq!(r["mount"], "ok", "{r}");
        assert_eq!(r["check"], "clean", "{r}");
        let oc = &r["oracle"];
        assert_eq!(oc["durable_lost"], 0, "{r}");
        if r["base_entries"].as_u64().unwrap() as usize > synced {
            past += 1;
            assert!(oc["durable_ok"].as_u64().unwrap() > 0 && oc["durable_ok"] == oc["checked"], "{r}");
        }
    }
    assert!(past >= 1, "no boundary past the sync");
    // the workload's own fsyncs are durability points: boundaries before the end already hold
    // fsynced blocks, and every state keeps every block fsynced before its epoch ended
    assert_eq!(summary["oracle"], "fsync");
    let before_sync =
        boundaries.iter().filter(|r| (r["base_entries"].as_u64().unwrap() as usize) < synced && r["oracle"]["durable_ok"].as_u64().unwrap() > 0).count();
    assert!(before_sync >= 3, "{before_sync} boundaries before the sync hold fsynced blocks");
    for r in rs.iter().filter(|r| r["mount"] == "ok") {
        assert_eq!(r["oracle"]["durable_lost"], 0, "{r}");
    }
    // a boundary state replays as replay-log builds it from our log (a real recording)
    let id = format!("e{}", first + 2);
    let upto = eps[first + 2].end;
    let size = meta["size"].as_u64().unwrap();
    let theirs = replay_log_image(dir.path(), &out.join("log"), size, &["--limit", &upto.to_string()]);
    assert!(replayed_bytes(&run, &out, &id) == theirs, "state {id} differs from replay-log --limit {upto}");
    // a subset state: the same bytes in another process from its id and the seed alone
    let sub = rs.iter().find(|r| r["variant"] == "subset" && r["lost"].as_u64().unwrap() > 0).expect("a subset that lost writes");
    let sid: StateId = sub["id"].as_str().unwrap().parse().unwrap();
    assert!(matches!(sid.variant, Variant::Subset(0)));
    let plan = states::plan(&log, &eps, sid, 5).unwrap();
    let ov = Overlay::new(size).unwrap();
    ov.switch(&log, &plan).unwrap();
    let mut mine = vec![0u8; size as usize];
    OverlayStore(ov).read(0, &mut mine).unwrap();
    assert!(replayed_bytes(&run, &out, &sid.to_string()) == mine, "state {sid} did not reproduce");
    // failing states (if any) are listed with their replay commands
    let failing = std::fs::read_to_string(out.join("failing.txt")).unwrap();
    assert_eq!(failing.lines().count(), rs.iter().filter(|r| r["failed"] == true).count());
    assert!(failing.lines().all(|l| l.contains("faultline crash replay")));
    assert_eq!(run.leftovers(), Vec::<String>::new());
}

#[test]
fn without_barriers_fsynced_blocks_are_lost_in_subsets() {
    // ext4 mounted barrier=0 sends no flush: the workload is one epoch, and a subset of its
    // writes loses blocks the workload had fsynced (the disk acknowledged them volatile)
    let run = RunDir::new("crash-nobarrier");
    let dir = tempfile::tempdir().unwrap();
    let (out, stdout) = explore_ok(&run, dir.path(), &over(&EXPERIMENT.replace("{ fs: ext4 }", "{ fs: ext4, mount: [barrier=0] }"), "off"), 3, 2);
    let rs = results(&out);
    let lost: Vec<&Value> = rs.iter().filter(|r| r["variant"] == "subset" && r["oracle"]["durable_lost"].as_u64().unwrap_or(0) > 0).collect();
    assert!(!lost.is_empty(), "no subset lost a fsynced block: {rs:?}");
    assert!(lost.iter().all(|r| r["failed"] == true));
    // the boundary after the unmount's flush holds everything
    let last = rs.last().unwrap();
    assert_eq!((last["variant"].as_str(), last["oracle"]["durable_lost"].as_u64()), (Some("boundary"), Some(0)), "{last}");
    assert!(stdout.contains("durable blocks lost"));
    // the report leads with the states per epoch by outcome and lists each failing state with
    // its replay command; `faultline report DIR` rebuilds it from the directory
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("class=\"chart explore-figure\""), "no figure");
    let replay = format!("faultline crash replay {} {}", out.display(), lost[0]["id"].as_str().unwrap());
    assert!(html.contains(&replay), "report lacks `{replay}`");
    std::fs::remove_file(out.join("report.html")).unwrap();
    let o = run.cmd(&["report"]).arg(&out).output().unwrap();
    assert!(o.status.success(), "report: {}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(std::fs::read_to_string(out.join("report.html")).unwrap(), html, "the rebuilt report differs");
    assert_eq!(run.leftovers(), Vec::<String>::new());
}

#[test]
fn a_foreign_log_is_explored_with_log_and_stack() {
    // a log recorded by `fault record` on a plain served disk, read like one from dm-log-writes
    let run = RunDir::new("crash-foreign");
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("rec.log");
    let mut s = run.cmd(&["serve", "--size", "32MiB", "--ring", "off"]).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(s.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let dev = line.trim().to_string();
    let sock = std::fs::read_dir(&run.0).unwrap().flatten().map(|e| e.path()).find(|p| p.extension().is_some_and(|x| x == "sock")).unwrap();
    let fault = |args: &[&str]| {
        let o = run.cmd(&["fault", "--socket", sock.to_str().unwrap()]).args(args).output().unwrap();
        assert!(o.status.success(), "fault {args:?}: {}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    fault(&["record", log.to_str().unwrap()]);
    assert!(Command::new("mkfs.ext4").args(["-q", "-F", &dev]).status().unwrap().success());
    fault(&["mark", "made"]);
    let stopped: Value = serde_json::from_str(&fault(&["record", "--stop"])).unwrap();
    assert!(stopped["entries"].as_u64().unwrap() > 10, "{stopped}");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(s.id() as i32), nix::sys::signal::Signal::SIGINT).unwrap();
    assert!(s.wait().unwrap().success());
    let l = Log::open(&log).unwrap();
    assert!(l.entries.iter().any(|e| e.kind == Kind::Flush), "mkfs.ext4 flushes");
    assert_eq!(l.entries.last().unwrap().kind, Kind::Mark("made".into()));
    let out = dir.path().join("out");
    let o = run
        .cmd(&["crash", "explore", "--log"])
        .arg(&log)
        .args(["--stack", "ext4", "--size", "32MiB", "--ring", "off", "--start-mark", "made", "-q", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "explore --log: {}", String::from_utf8_lossy(&o.stderr));
    let rs = results(&out);
    // from the mark on: the last epoch only, whole (mkfs's writes all flushed)
    assert!(!rs.is_empty());
    let last = rs.last().unwrap();
    assert_eq!((last["variant"].as_str(), last["mount"].as_str(), last["check"].as_str()), (Some("boundary"), Some("ok"), Some("clean")), "{last}");
    assert_eq!(run.leftovers(), Vec::<String>::new());
}

#[test]
fn bad_input_says_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let err = |args: &[&str]| {
        let o = Command::new(bin()).args(args).output().unwrap();
        assert!(!o.status.success(), "{args:?} succeeded");
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let d = dir.path().to_str().unwrap();
    let e = err(&["crash", "replay", d, "e1"]);
    assert!(e.contains("not a `faultline crash explore` results directory"), "{e}");
    // a results directory whose log is gone
    let meta =
        r#"{"log":"log","size":1048576,"block_size":4096,"seed":1,"per_epoch":1,"fs":"ext4","mount":[],"first_epoch":0,"synced_entry":null,"source":"x"}"#;
    std::fs::write(dir.path().join("explore.json"), meta).unwrap();
    let e = err(&["crash", "replay", d, "e1"]);
    assert!(e.contains("write log") && e.contains("missing"), "{e}");
    // ids that do not exist
    let mut w = LogWriter::create(&dir.path().join("log"), 512).unwrap();
    w.write(0, &[1u8; 512], 0).unwrap();
    w.flush().unwrap();
    w.finish().unwrap();
    let e = err(&["crash", "replay", d, "e7"]);
    assert!(e.contains("state e7 does not exist") && e.contains("e0 to e0"), "{e}");
    let e = err(&["crash", "replay", d, "e0-s3"]);
    assert!(e.contains("does not exist"), "{e}");
    let e = err(&["crash", "replay", d, "12"]);
    assert!(e.contains("expected eN"), "{e}");
    // not a log; a stack that is not one
    let e = err(&["crash", "explore", "--log", dir.path().join("explore.json").to_str().unwrap(), "--stack", "ext4"]);
    assert!(e.contains("not a dm-log-writes log"), "{e}");
    let e = err(&["crash", "explore", "--log", dir.path().join("log").to_str().unwrap(), "--stack", "zfs"]);
    assert!(e.contains("expected ext4, xfs, btrfs or raw"), "{e}");
    let e = err(&["crash", "explore", "--log", dir.path().join("log").to_str().unwrap(), "--stack", "ext4", "--start-mark", "nope"]);
    assert!(e.contains("no mark named"), "{e}");
    // an experiment whose stack explore cannot take
    let exp = dir.path().join("raid.yaml");
    std::fs::write(&exp, EXPERIMENT.replace("{ fs: ext4 }", "{ fs: btrfs, raid1: true }")).unwrap();
    let e = err(&["crash", "explore", exp.to_str().unwrap(), "--out", dir.path().join("o").to_str().unwrap()]);
    assert!(e.contains("raid1") || e.contains("btrfs-raid1"), "{e}");
    // an experiment's transport is its disk's: --ring only with --log
    let e = err(&["crash", "explore", exp.to_str().unwrap(), "--ring", "off"]);
    assert!(e.contains("--log"), "{e}");
    let e = err(&["crash", "explore", "--log", dir.path().join("log").to_str().unwrap(), "--stack", "raw", "--ring", "sometimes"]);
    assert!(e.contains("sometimes") && e.contains("auto") && e.contains("off"), "{e}");
}

#[test]
fn kill_9_during_explore_leaves_nothing_behind() {
    let run = RunDir::new("crash-kill9");
    let dir = tempfile::tempdir().unwrap();
    let exp = dir.path().join("exp.yaml");
    std::fs::write(&exp, over(&EXPERIMENT.replace("ops: 24", "ops: 60"), "off")).unwrap();
    let out = dir.path().join("out");
    let mut c = run
        .cmd(&["crash", "explore"])
        .arg(&exp)
        .args(["--per-epoch", "2", "-q", "--out"])
        .arg(&out)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // wait until states are being checked, then kill it mid-state
    let t = Instant::now();
    while std::fs::read_to_string(out.join("states.jsonl")).map_or(0, |s| s.lines().count()) < 3 {
        assert!(t.elapsed() < Duration::from_secs(120), "explore checked no states");
        assert!(c.try_wait().unwrap().is_none(), "explore ended early");
        std::thread::sleep(Duration::from_millis(20));
    }
    c.kill().unwrap();
    c.wait().unwrap();
    // its state server notices, releases the mount and the device, and ends
    let t = Instant::now();
    loop {
        let left = run.leftovers();
        if left.is_empty() {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "left behind: {left:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// examples/crash-explore-varmail.yaml (varmail on ext4, every fsync flowop fsyncing the file
/// and then its directory), on the stack `fs`.
fn varmail_experiment(fs: &str) -> String {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/crash-explore-varmail.yaml")).unwrap();
    assert!(text.contains("stack: { fs: ext4 }") && text.contains("fsync_dir: true"), "keep the example and this test in step");
    text.replace("stack: { fs: ext4 }", &format!("stack: {fs}"))
}

fn count(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or(0)
}

#[test]
fn varmail_keeps_every_durable_entry_in_every_explored_state() {
    let run = RunDir::new("crash-varmail");
    let dir = tempfile::tempdir().unwrap();
    let (out, _) = explore_ok(&run, dir.path(), &over(&varmail_experiment("{ fs: ext4 }"), common::ring_where_available()), 1, 3);
    let summary: Value = serde_json::from_slice(&std::fs::read(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["oracle"], "entries", "{summary}");
    eprintln!("varmail on ext4: {summary}");
    // the record's changes, each with its mark in the log
    let log = Log::open(&out.join("log")).unwrap();
    let journal: Value = serde_json::from_slice(&std::fs::read(out.join("entries.json")).unwrap()).unwrap();
    let events = journal["events"].as_array().unwrap();
    for (k, e) in events.iter().enumerate() {
        assert_eq!(log.entries[e["after"].as_u64().unwrap() as usize].kind, Kind::Mark(format!("n{k}")));
    }
    let kinds = |kind: &str| events.iter().filter(|e| e["ev"]["kind"] == kind).count();
    assert!(kinds("created") >= 20 && kinds("deleted") >= 5 && kinds("file_synced") >= 20 && kinds("dir_synced") >= 20, "{}", events.len());
    let synced = log.find_mark("synced").unwrap();
    let rs = results(&out);
    assert_eq!(rs.len() as u64, count(&summary, "states"));
    assert!(rs.len() >= 40, "{} states", rs.len());
    // every state's paths are counted, none broke a promise; flush boundaries and random
    // subsets mount and check clean (a torn write may break the file system itself: the torn
    // model's sector granularity, counted below)
    let mut torn_failed = 0;
    for r in &rs {
        if r["variant"] != "torn" {
            assert_eq!((r["mount"].as_str(), r["check"].as_str(), r["failed"].as_bool()), (Some("ok"), Some("clean"), Some(false)), "{r}");
        }
        if r["mount"] != "ok" || r["check"] != "clean" {
            torn_failed += 1;
        }
        if r["mount"] != "ok" {
            continue;
        }
        let (oc, e) = (&r["oracle"], &r["oracle"]["entries"]);
        assert!(e.is_object(), "no entry counts: {r}");
        assert_eq!((count(e, "durable_lost"), count(e, "reappeared"), count(oc, "durable_lost"), count(oc, "garbage")), (0, 0, 0, 0), "{r}");
        let parts: u64 = ["durable_kept", "unsynced_kept", "unsynced_lost", "durable_lost", "reappeared"].iter().map(|k| count(e, k)).sum();
        assert_eq!(parts, count(e, "checked"), "every path checked has one state: {r}");
        assert!(count(e, "checked") > 0, "{r}");
    }
    eprintln!("varmail on ext4: {torn_failed} torn states did not mount or check clean");
    // the workload's own fsyncs are durability points: states before the final sync hold
    // durable entries and blocks, credited by many syncs, more as the epochs go on
    let before: Vec<&Value> =
        rs.iter().filter(|r| (r["base_entries"].as_u64().unwrap() as usize) < synced && count(&r["oracle"]["entries"], "durable_kept") > 0).collect();
    assert!(before.iter().filter(|r| count(&r["oracle"], "syncs_credited") >= 20 && count(&r["oracle"], "durable_ok") > 0).count() >= 5, "{before:?}");
    let credited: Vec<u64> = rs.iter().filter(|r| r["variant"] == "boundary").map(|r| count(&r["oracle"], "syncs_credited")).collect();
    assert!(credited.windows(2).all(|w| w[0] <= w[1]), "{credited:?}");
    assert!(credited.last().unwrap() > credited.first().unwrap(), "{credited:?}");
    assert_eq!(run.leftovers(), Vec::<String>::new());
}

#[test]
fn varmail_without_barriers_loses_durable_entries_in_subsets() {
    // ext4 mounted barrier=0 sends no flush: the workload is one epoch, every sync's mark lies
    // inside it, and a random subset of its writes loses entries varmail had made durable
    let run = RunDir::new("crash-varmail-nobarrier");
    let dir = tempfile::tempdir().unwrap();
    let (out, stdout) = explore_ok(&run, dir.path(), &over(&varmail_experiment("{ fs: ext4, mount: [barrier=0] }"), "off"), 4, 2);
    let rs = results(&out);
    for r in &rs {
        eprintln!("{} mount {} check {} oracle {}", r["id"], r["mount"], r["check"], r["oracle"]);
    }
    let lost: Vec<&Value> = rs.iter().filter(|r| count(&r["oracle"]["entries"], "durable_lost") > 0).collect();
    assert!(!lost.is_empty(), "no state lost a durable entry");
    for r in &lost {
        assert_eq!(r["failed"], true, "{r}");
        assert!(r["reasons"].as_array().unwrap().iter().any(|x| x.as_str().unwrap().contains("durable entries lost")), "{r}");
    }
    assert!(stdout.contains("durable entries lost"));
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("<th>Entries lost</th>"), "the report has no entry columns");
    assert_eq!(run.leftovers(), Vec::<String>::new());
}
