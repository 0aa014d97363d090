//! Power cuts inside `faultline run` (docs/crash.md, "Crash and check in a run"): real disks with
//! a volatile write cache, real ext4 / xfs / btrfs and their checks, a raw device under O_DIRECT
//! and fdatasync, a command stack with acknowledgements and its own check, kill -9 of the
//! runner during the crash phase, and bad input.

mod common;

use common::{RunDir, count as n};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// Run `yaml` with `faultline run` in `run`: results.json, the run's output, its results
/// directory.
fn run_experiment(run: &RunDir, dir: &Path, yaml: &str) -> (Value, String, PathBuf) {
    let r = run.run_ok(dir, yaml);
    (r.results, r.text, r.out)
}

fn crashes(res: &Value) -> Vec<Value> {
    res["setups"][0]["repetitions"].as_array().unwrap().iter().map(|r| r["crash"].clone()).collect()
}

/// The oracle's states add up to the blocks checked, and nothing broke a promise.
fn no_failures(c: &Value, what: &str) {
    let o = &c["oracle"];
    let sum: u64 = ["durable_kept", "unsynced_kept", "unsynced_lost", "torn", "durable_lost", "garbage"].iter().map(|k| n(o, k)).sum();
    assert_eq!(sum, n(o, "checked"), "{what}: {o}");
    assert!(n(o, "checked") > 0, "{what}: nothing checked: {o}");
    assert_eq!((n(o, "durable_lost"), n(o, "garbage"), n(o, "files_lost")), (0, 0, 0), "{what}: {c:#}");
}

/// The cache's own figures are whole: every unflushed write kept, lost or torn.
fn cut_whole(c: &Value, what: &str) {
    let k = &c["cut"];
    assert_eq!(n(k, "kept") + n(k, "lost") + n(k, "torn"), n(k, "unflushed"), "{what}: {k}");
}

/// The case's checks hold for every cut; what it needs to show something is a cut with
/// durable and unsynced writes, which a cut can miss when every thread has just synced, or when
/// the file system's own flushes reach `after_flushes` before any fsync returned (seen under
/// heavy load): such a cut is run again, up to three times.
fn fs_case(fs: &str, model: &str, when: &str) {
    for attempt in 1..=3 {
        if fs_attempt(fs, model, when, attempt) {
            return;
        }
        eprintln!("{fs} {model}: attempt {attempt}: the cut found nothing durable or nothing unsynced; again");
    }
    panic!("{fs} {model}: three cuts found nothing durable or nothing unsynced (4 threads between fsyncs)");
}

/// One cut; whether it found unsynced writes.
fn fs_attempt(fs: &str, model: &str, when: &str, attempt: u32) -> bool {
    let run = RunDir::new(&format!("crash-{fs}-{attempt}"));
    let tmp = tempfile::tempdir().unwrap();
    // 4 threads each fsync every 32 writes: when the power goes, each has 0..31 unsynced
    let yaml = format!(
        "name: cut-{fs}\ndisk: {{size: 512MiB, write_cache: volatile}}\nstack: {fs}\nmonitor: off\n\
workload: {{interface: file, files: 8, file_size: 4MiB, threads: 4, pattern: uniform, mix: {{write: 100}}, sync: 'fsync:32', duration: 30s, content: {{profile: none, seed: 9}}}}\n\
faults:\n  - {{type: power-cut, model: {model}, seed: 5, when: {when}}}\n"
    );
    let (res, out, dir) = run_experiment(&run, tmp.path(), &yaml);
    let c = &crashes(&res)[0];
    let what = format!("{fs} {model}");
    assert_eq!(c["fired"], true, "{what}: {c:#}");
    assert_eq!(c["model"], model);
    cut_whole(c, &what);
    assert_eq!(c["mount"], "ok", "{what}: {c:#}");
    // ext4's and xfs's journals and btrfs's cow promise a consistent file system after a cut
    // whose flushes were honoured: the check after the replay is clean
    assert_eq!(c["check"]["verdict"], "clean", "{what}: {:#}", c["check"]);
    assert_eq!(c["check"]["exit_code"], 0);
    no_failures(c, &what);
    let o = &c["oracle"];
    // something to show: a sync credited before the cut (btrfs's own flushes can reach
    // `after_flushes` before any of the workload's fsyncs returned) and writes after it
    let unsynced = n(o, "durable_kept") > 0 && n(o, "unsynced_kept") + n(o, "unsynced_lost") > 0;
    // the summary line and the report's crash section
    assert!(out.contains(&format!("crash: cut-{fs} rep 1: {model}")) && out.contains("oracle: durable-lost 0 garbage 0"), "{out}");
    let html = std::fs::read_to_string(dir.join("report.html")).unwrap();
    assert!(html.contains("<h3>Crash and check</h3>") && html.contains("crash-figure"), "{what}");
    assert!(run.leftovers().is_empty(), "{what}: {:?}", run.leftovers());
    unsynced
}

#[test]
fn ext4_after_a_cut_is_clean_and_keeps_every_fsynced_block() {
    fs_case("ext4", "random-subset", "{after_ops: 3000}");
}

#[test]
fn xfs_after_a_cut_is_clean_and_keeps_every_fsynced_block() {
    fs_case("xfs", "keep-prefix", "{after_ops: 3000}");
}

#[test]
fn btrfs_after_a_cut_is_clean_and_keeps_every_fsynced_block() {
    fs_case("btrfs", "lose-all", "{after_flushes: 30}");
}

fn raw_case(model: &str, threads: u32, pattern: &str) -> Value {
    let run = RunDir::new(&format!("crash-raw-{model}"));
    let tmp = tempfile::tempdir().unwrap();
    // O_DIRECT writes reach the disk's cache at once; an fdatasync every 24 flushes it (not a
    // divisor of the 64-op progress batches the after_ops trigger reads, so the cut falls
    // between two fdatasyncs)
    let yaml = format!(
        "name: cut-raw\ndisk: {{size: 256MiB, write_cache: volatile}}\nstack: raw\nmonitor: off\n\
workload: {{span: 64MiB, threads: {threads}, pattern: {pattern}, mix: {{write: 100}}, sync: 'fsync:24', duration: 30s, content: {{profile: none, seed: 4}}}}\n\
faults:\n  - {{type: power-cut, model: {model}, seed: 21, when: {{after_ops: 2500}}}}\n"
    );
    let (res, _, _) = run_experiment(&run, tmp.path(), &yaml);
    let c = crashes(&res)[0].clone();
    assert_eq!(c["fired"], true, "{model}: {c:#}");
    assert!(c["check"].is_null() && c["mount"].is_null(), "raw: no file system to check");
    cut_whole(&c, model);
    no_failures(&c, model);
    assert!(run.leftovers().is_empty(), "{model}: {:?}", run.leftovers());
    c
}

/// One thread, sequential 4 KiB writes on distinct blocks: every unflushed write is one block,
/// so the oracle's unsynced-kept blocks are exactly the writes the cache kept.
#[test]
fn raw_keep_prefix_keeps_exactly_what_the_cache_kept() {
    // a cut right after an fdatasync has nothing to keep (seen under heavy load): cut again
    let mut c = raw_case("keep-prefix", 1, "sequential");
    for _ in 0..2 {
        if n(&c["cut"], "unflushed") > 0 {
            break;
        }
        c = raw_case("keep-prefix", 1, "sequential");
    }
    let (o, k) = (&c["oracle"], &c["cut"]);
    assert!(n(k, "unflushed") > 0, "{c:#}");
    assert_eq!(n(o, "unsynced_kept"), n(k, "kept"), "{c:#}");
    assert!(n(o, "unsynced_lost") >= n(k, "lost"), "{c:#}");
}

#[test]
fn raw_random_subset_loses_no_flushed_block() {
    let c = raw_case("random-subset", 2, "uniform");
    assert!(n(&c["oracle"], "durable_kept") > 0, "{c:#}");
}

/// lose-all with one thread: the cache keeps nothing, so nothing written since the last flush
/// that completed before the cut survives. A device's fdatasync that succeeded is credited even
/// when it returns after the cut began (its flush was wholly before it: docs/crash.md), so no
/// flushed write is found `unsynced_kept`.
#[test]
fn raw_lose_all_keeps_nothing_unsynced() {
    let c = raw_case("lose-all", 1, "uniform");
    let o = &c["oracle"];
    assert_eq!(n(&c["cut"], "kept"), 0, "{c:#}");
    assert_eq!(n(o, "unsynced_kept"), 0, "{c:#}");
    assert!(n(&c["cut"], "lost") == 0 || n(o, "unsynced_lost") > 0, "{c:#}");
}

/// A command stack: the application fsyncs each record (and its directory) before it
/// acknowledges it; its check finds every acknowledged record after the cut.
#[test]
fn a_command_s_acknowledged_commits_survive_and_its_check_reports_them() {
    let run = RunDir::new("crash-cmd");
    let tmp = tempfile::tempdir().unwrap();
    let yaml = r#"name: cut-app
disk: {size: 256MiB, write_cache: volatile}
monitor: off
stack:
  fs: ext4
  command: 'i=0; while :; do i=$((i+1)); echo $i > f.$i && sync f.$i . && echo $i >> "$FAULTLINE_ACKS"; done'
  acks: true
  check: 'n=0; l=0; while read k; do n=$((n+1)); [ "$(cat f.$k 2>/dev/null)" = "$k" ] || l=$((l+1)); done < "$FAULTLINE_ACKS"; echo "{\"acked\": $n, \"lost\": $l}"; [ $l = 0 ]'
faults:
  - {type: power-cut, model: random-subset, seed: 3, when: {at: 2s}}
"#;
    let (res, out, dir) = run_experiment(&run, tmp.path(), yaml);
    let c = &crashes(&res)[0];
    assert_eq!(c["fired"], true, "{c:#}");
    assert_eq!(c["check"]["verdict"], "clean", "{c:#}");
    let acks = n(c, "acks");
    assert!(acks > 5, "the application acknowledged only {acks} commits in 2 s: {c:#}");
    let a = &c["app_check"];
    assert_eq!(a["verdict"], "consistent", "{a:#}");
    // the check read the acknowledgements file as it was when the power went
    assert_eq!(a["figures"]["acked"].as_f64(), Some(acks as f64), "{a:#}");
    assert_eq!(a["figures"]["lost"].as_f64(), Some(0.0), "{a:#}");
    assert!(c["oracle"].is_null(), "a command stack has no workload map");
    let file = PathBuf::from(c["acks_file"].as_str().unwrap());
    assert!(file.starts_with(std::fs::canonicalize(&dir).unwrap()) || file.starts_with(&dir), "{}", file.display());
    assert!(out.contains("application: consistent (acked"), "{out}");
    assert!(run.leftovers().is_empty(), "{:?}", run.leftovers());
}

/// kill -9 of the runner inside the crash phase: `faultline cleanup` leaves no loop device,
/// mount, ledger or process behind (also when the disk was still powered off). A phase that
/// ended before the kill came (nothing recorded any more) tests nothing: the case runs again,
/// up to three times.
fn kill9_in_crash(after: Duration) {
    for attempt in 1..=3 {
        if kill9_attempt(after) {
            return;
        }
        eprintln!("attempt {attempt}: the crash phase ended within {after:?}; again");
    }
    panic!("the crash phase ended within {after:?} three times: nothing recorded at kill time");
}

/// One kill; false when the run had nothing recorded any more when the kill came.
fn kill9_attempt(after: Duration) -> bool {
    let run = RunDir::new("crash-kill9");
    let tmp = tempfile::tempdir().unwrap();
    let exp = tmp.path().join("exp.yaml");
    std::fs::write(
        &exp,
        "name: k\ndisk: {size: 512MiB, write_cache: volatile}\nstack: ext4\nmonitor: off\n\
workload: {interface: file, files: 16, file_size: 16MiB, threads: 2, pattern: uniform, mix: {write: 100}, sync: 'fsync:64', duration: 30s}\n\
faults:\n  - {type: power-cut, model: keep-prefix, when: {after_ops: 2000}}\n",
    )
    .unwrap();
    let mut child = run.cmd(&["run"]).arg(&exp).arg("--out").arg(tmp.path().join("out")).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    loop {
        let mut line = String::new();
        assert!(err.read_line(&mut line).unwrap() > 0, "the run ended before its crash phase:\n{seen}");
        seen.push_str(&line);
        if line.contains(": crash + check") {
            break;
        }
    }
    std::thread::sleep(after);
    if run.ledgers().is_empty() {
        let _ = child.kill();
        let _ = child.wait();
        return false;
    }
    child.kill().unwrap();
    let drain = std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut err, &mut rest);
        rest
    });
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() {
        assert!(t.elapsed() < Duration::from_secs(20), "the killed run did not end");
        std::thread::sleep(Duration::from_millis(20));
    }
    let rest = drain.join().unwrap();
    assert!(!rest.contains(": done in"), "the run finished before the kill:\n{seen}{rest}");
    // its disk server sees its owner gone and tears down; cleanup releases what is left
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (text, took) = run.cleanup();
        assert!(took < Duration::from_secs(20), "cleanup took {took:?}: {text}");
        let left = run.leftovers();
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "left after kill -9 in the crash phase: {left:?}\n{seen}{rest}\n{text}");
        std::thread::sleep(Duration::from_millis(500));
    }
    true
}

#[test]
fn kill9_at_the_start_of_the_crash_phase_leaves_nothing() {
    kill9_in_crash(Duration::from_millis(0));
}

#[test]
fn kill9_during_the_check_leaves_nothing() {
    kill9_in_crash(Duration::from_millis(150));
}

/// Bad input is refused before anything is built, with file:line:col, what is wrong and what
/// is allowed.
#[test]
fn bad_power_cuts_are_refused_with_their_place() {
    let tmp = tempfile::tempdir().unwrap();
    let run = RunDir::new("crash-bad");
    let cases = [
        (
            "name: x\nstack: ext4\nworkload: {size: 1MiB}\nfaults:\n  - {type: power-cut, when: {at: 1s}}\n",
            "exp.yaml:5:5: fault #1: a power cut needs a disk with a volatile write cache: add `disk: {write_cache: volatile}`",
        ),
        (
            "name: x\ndisk: {write_cache: volatile}\nstack: ext4\nworkload: {size: 1MiB}\nfaults:\n  - {type: power-cut, model: unplug, when: {at: 1s}}\n",
            "exp.yaml:6:5: fault #1: 'unplug' is not a survival model setting; allowed: lose-all, keep-prefix, random-subset, torn, reorder",
        ),
        (
            "name: x\ndisk: {write_cache: volatile}\nstack: ext4\nworkload: {size: 1MiB}\nfaults:\n  - {type: power-cut, model: torn}\n",
            "exp.yaml:6:5: fault #1: a power cut needs `when`: {at: DURATION}, {after_ops: N} or {after_flushes: N}",
        ),
    ];
    for (yaml, want) in cases {
        let err = run.refused(tmp.path(), yaml);
        assert!(err.contains(want), "{yaml}\n{err}");
    }
    assert!(run.leftovers().is_empty(), "{:?}", run.leftovers());
}

/// A personality under a cut: `faultline run` with `reps` repetitions; each repetition's crash
/// record.
fn personality_cut(tag: &str, stack: &str, workload: &str, model: &str, when: &str, reps: u32) -> Vec<Value> {
    crashes(&personality_run(tag, stack, workload, model, when, reps))
}

/// `personality_cut`'s run: the whole results.json.
fn personality_run(tag: &str, stack: &str, workload: &str, model: &str, when: &str, reps: u32) -> Value {
    let run = RunDir::new(&format!("crash-{tag}"));
    let tmp = tempfile::tempdir().unwrap();
    let yaml = format!(
        "name: cut-{tag}\ndisk: {{size: 512MiB, write_cache: volatile}}\nstack: {stack}\nmonitor: off\nrepeat: {reps}\n\
workload: {{{workload}, duration: 30s, content: {{profile: none, seed: 9}}}}\n\
faults:\n  - {{type: power-cut, model: {model}, seed: 7, when: {when}}}\n"
    );
    let (res, out, _) = run_experiment(&run, tmp.path(), &yaml);
    let cs = crashes(&res);
    assert_eq!(cs.len(), reps as usize);
    for c in &cs {
        assert_eq!(c["fired"], true, "{tag}: {c:#}");
        cut_whole(c, tag);
        let mut counts = c["oracle"].clone();
        if let Some(o) = counts.as_object_mut() {
            o.remove("failures");
        }
        eprintln!("{tag}: cut {} mount {} check {} oracle {counts}", c["cut"], c["mount"], c["check"]["verdict"]);
        if c["oracle"].is_null() {
            // the file system did not mount: the callers say whether that may happen
            continue;
        }
        let e = &c["oracle"]["entries"];
        let sum: u64 = ["durable_kept", "unsynced_kept", "unsynced_lost", "durable_lost", "reappeared"].iter().map(|k| n(e, k)).sum();
        assert_eq!(sum, n(e, "checked"), "{tag}: every path checked has exactly one state: {e}");
    }
    assert!(out.contains("; entries: checked"), "{out}");
    assert!(run.leftovers().is_empty(), "{tag}: {:?}", run.leftovers());
    res
}

/// ext4 and xfs honour flushes: after a cut every entry and block varmail made durable (file
/// and directory fsynced) is there, the check is clean, and the entries were counted.
fn varmail_keeps_what_it_made_durable(fs: &str, model: &str) {
    let tag = format!("varmail-{fs}-{model}");
    let cs = personality_cut(&tag, fs, "personality: varmail, scale: 0.2, threads: 4, fsync_dir: true", model, "{after_ops: 4000}", 1);
    let c = &cs[0];
    assert_eq!(c["mount"], "ok", "{tag}: {c:#}");
    assert_eq!(c["check"]["verdict"], "clean", "{tag}: {:#}", c["check"]);
    no_failures(c, &tag);
    let (o, e) = (&c["oracle"], &c["oracle"]["entries"]);
    assert_eq!((n(e, "durable_lost"), n(e, "reappeared")), (0, 0), "{tag}: {e}");
    // 200 paths: 160 preallocated, and varmail's creates and deletes over them
    assert!(n(e, "checked") >= 150, "{tag}: {e}");
    assert!(n(o, "durable_kept") > 0, "{tag}: {o}");
}

#[test]
fn varmail_on_ext4_lose_all_keeps_every_durable_entry_and_block() {
    varmail_keeps_what_it_made_durable("ext4", "lose-all");
}

#[test]
fn varmail_on_ext4_random_subset_keeps_every_durable_entry_and_block() {
    varmail_keeps_what_it_made_durable("ext4", "random-subset");
}

#[test]
fn varmail_on_xfs_lose_all_keeps_every_durable_entry_and_block() {
    varmail_keeps_what_it_made_durable("xfs", "lose-all");
}

/// fileserver never fsyncs: only its preallocated file set (synced before the timed phase) is
/// durable, and a cut loses none of it that the run did not delete or rewrite since.
#[test]
fn fileserver_on_ext4_keeps_its_synced_file_set() {
    let tag = "fileserver-ext4";
    let cs = personality_cut(tag, "ext4", "personality: fileserver, scale: 0.02, threads: 4", "keep-prefix", "{after_ops: 1500}", 1);
    let c = &cs[0];
    assert_eq!(c["check"]["verdict"], "clean", "{:#}", c["check"]);
    no_failures(c, tag);
    assert!(n(&c["oracle"]["entries"], "checked") >= 150, "{c:#}");
}

/// The negative control: ext4 mounted `barrier=0` sends no flush, so a lose-all cut takes the
/// disk back to before the mount, and what the workload made durable (the synced file set,
/// varmail's fsynced files and directory) is gone: the oracle must see it in most runs.
#[test]
fn varmail_on_ext4_without_barriers_loses_durable_entries() {
    let cs = personality_cut(
        "varmail-nobarrier",
        "{fs: ext4, mount: [barrier=0]}",
        "personality: varmail, scale: 0.2, threads: 4, fsync_dir: true",
        "lose-all",
        "{after_ops: 4000}",
        3,
    );
    let lost = |c: &Value, k: &str| c["oracle"][k].as_u64().unwrap_or(0);
    let failing = cs.iter().filter(|c| lost(c, "files_lost") + lost(c, "durable_lost") > 0).count();
    assert!(failing >= 2, "durable losses in {failing} of 3 runs: {cs:#?}");
}

/// varmail's rewrite as an atomic replace (`replace: true`: temp file written and fsynced,
/// renamed over the message, directory fsynced): after a lose-all cut every rename that was
/// durable is there with its fsynced content, no destination is missing or holds its old
/// version, and no renamed-away temp is back.
fn replace_keeps_every_durable_rename(fs: &str) {
    let tag = format!("varmail-replace-{fs}");
    let res = personality_run(&tag, fs, "personality: varmail, scale: 0.2, threads: 4, fsync_dir: true, replace: true", "lose-all", "{after_ops: 4000}", 1);
    let c = &crashes(&res)[0];
    assert_eq!(c["mount"], "ok", "{tag}: {c:#}");
    assert_eq!(c["check"]["verdict"], "clean", "{tag}: {:#}", c["check"]);
    no_failures(c, &tag);
    let (e, r) = (&c["oracle"]["entries"], &c["oracle"]["entries"]["renamed"]);
    assert_eq!((n(e, "durable_lost"), n(e, "reappeared"), n(r, "durable_lost")), (0, 0, 0), "{tag}: {e}");
    // the workload renamed (its own flowop), and the oracle checked durable renames
    let renames = n(&res["setups"][0]["repetitions"][0]["flowops"]["renamefile"], "ops");
    assert!(renames > 50, "{tag}: {renames} renames before the cut");
    assert!(n(r, "checked") > 10 && n(r, "durable_kept") > 0, "{tag}: {r}");
    let sum: u64 = ["durable_kept", "unsynced_kept", "unsynced_lost", "durable_lost"].iter().map(|k| n(r, k)).sum();
    assert_eq!(sum, n(r, "checked"), "{tag}: {r}");
}

#[test]
fn varmail_replace_on_ext4_lose_all_keeps_every_durable_rename() {
    replace_keeps_every_durable_rename("ext4");
}

#[test]
fn varmail_replace_on_xfs_lose_all_keeps_every_durable_rename() {
    replace_keeps_every_durable_rename("xfs");
}

/// The negative control of the replace: ext4 `barrier=0` sends no flush, so after a lose-all
/// cut the renames the workload made durable (directory fsynced after them) are gone with the
/// rest: the oracle must count durable rename losses in most runs.
#[test]
fn varmail_replace_on_ext4_without_barriers_loses_durable_renames() {
    let cs = personality_cut(
        "varmail-replace-nobarrier",
        "{fs: ext4, mount: [barrier=0]}",
        "personality: varmail, scale: 0.2, threads: 4, fsync_dir: true, replace: true",
        "lose-all",
        "{after_ops: 4000}",
        3,
    );
    let lost = |c: &Value| c["oracle"]["entries"]["renamed"]["durable_lost"].as_u64().unwrap_or(0);
    let failing = cs.iter().filter(|c| lost(c) > 0).count();
    assert!(failing >= 2, "durable renames lost in {failing} of 3 runs: {cs:#?}");
}
