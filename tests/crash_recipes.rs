//! The application recipes of examples/crash (docs: examples/crash/README.md) under power cuts
//! in `faultline run`, scaled down to seconds per cut: SQLite (WAL, synchronous=FULL and OFF),
//! PostgreSQL 15 (fsync=on and off, data checksums) and fsynced files on ext4 mounted
//! barrier=1 and barrier=0, each under every survival model. What must hold: with FULL,
//! fsync=on and barrier=1 every acknowledged commit or file survives every model and the
//! database's own integrity check is clean. The other variants promise nothing: their numbers
//! must be recorded, whatever they are.
//!
//! The experiments use the examples' own command lines, which find the scripts through
//! faultline's working directory (/proc/$PPID/cwd), so `faultline run` runs in the repository
//! root here.
//!
//! Each recipe runs over one transport (scripts/test.sh's TRANSPORT_PINNED: the PostgreSQL
//! pair takes a minute each), each pair split between them: one over classic /dev/fuse, the
//! other over FUSE over io_uring where the kernel has it (`ring_where_available`), so both
//! transports carry a recipe whose guarantee is asserted: SQLite FULL and ext4 barrier=1 over
//! io_uring, PostgreSQL fsync=on over classic.

mod common;
use common::{RunDir, skip, which};
use serde_json::Value;
use std::path::Path;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const MODELS: [&str; 5] = ["lose-all", "keep-prefix", "random-subset", "torn", "reorder"];

/// One setup per survival model, each with one cut `at` into the run and a fixed seed (a
/// failing model is then reproducible), over the transport `ring` (`ring:`).
fn experiment(name: &str, command: &str, check: &str, mount: &[&str], at: &str, ring: &str) -> String {
    let mut y = format!(
        "name: {name}
disk: {{ size: 512MiB, store: ram, write_cache: volatile, ring: {ring} }}
monitor: off
stack:
  fs: ext4
  mount: [{}]
  acks: true
  command: {command:?}
  check: {check:?}
  timeout: 2m
setups:
",
        mount.join(", ")
    );
    for (i, m) in MODELS.iter().enumerate() {
        y += &format!("  - {{ name: {m}, faults: [{{ type: power-cut, model: {m}, seed: {}, when: {{ at: {at} }} }}] }}\n", i + 1);
    }
    y
}

/// The command lines of an example file, so a test runs exactly what the example runs.
fn example_has(file: &str, line: &str) {
    let text = std::fs::read_to_string(Path::new(ROOT).join("examples").join(file)).unwrap();
    assert!(text.contains(line), "examples/{file} no longer runs {line:?}: keep the test and the example in step");
}

/// `faultline run` of `yaml` in the repository root: its exit status and results.json.
fn run(rd: &RunDir, yaml: &str) -> (bool, Value, String) {
    common::check_pinned("its experiment's disk", yaml.contains("ring: "));
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("exp.yaml");
    std::fs::write(&f, yaml).unwrap();
    let out = dir.path().join("results");
    let o = rd.cmd(&["run"]).arg(&f).arg("--out").arg(&out).arg("-q").current_dir(ROOT).output().unwrap();
    let text = format!("{}\n{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    let results = std::fs::read_to_string(out.join("results.json")).unwrap_or_else(|e| panic!("no results.json ({e}):\n{text}"));
    assert!(rd.leftovers().is_empty(), "left behind: {:?}", rd.leftovers());
    (o.status.success(), serde_json::from_str(&results).unwrap(), text)
}

/// What the run recorded of each setup's cut: the application check (`app_check`: the
/// command, its `verdict`, the numbers of its last stdout line as `figures`) and the file
/// system's check after the journal replay (`check`: its `verdict`).
struct Cut {
    setup: String,
    figures: Value,
    app_verdict: String,
    fs_verdict: String,
}

fn cuts(results: &Value) -> Vec<Cut> {
    fn find<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
        match v {
            Value::Object(m) => m.get(key).filter(|x| !x.is_null()).or_else(|| m.values().find_map(|x| find(x, key))),
            Value::Array(a) => a.iter().find_map(|x| find(x, key)),
            _ => None,
        }
    }
    let setups = results["setups"].as_array().expect("results.json has setups");
    setups
        .iter()
        .map(|s| {
            let setup = s["name"].as_str().unwrap().to_string();
            let rep = &s["repetitions"][0];
            let fs_verdict = find(rep, "crash").and_then(|c| c["check"]["verdict"].as_str()).unwrap_or("none").to_string();
            // no application check where the file system did not mount after the cut: the
            // run records why (`crash.mount`), and that is the cut's finding
            let Some(app) = find(rep, "app_check") else {
                let mount = find(rep, "crash").map(|c| c["mount"].clone()).unwrap_or_default();
                assert!(mount.as_str().is_some_and(|m| m != "ok"), "setup {setup}: no application check recorded and the mount did not fail: {rep:#}");
                return Cut { setup, figures: Value::Null, app_verdict: format!("not run: {}", mount.as_str().unwrap_or("")), fs_verdict };
            };
            Cut { setup, figures: app["figures"].clone(), app_verdict: app["verdict"].as_str().unwrap_or("").to_string(), fs_verdict }
        })
        .collect()
}

/// A count of the check's line (recorded as a JSON number, possibly a float).
fn num(c: &Value, k: &str) -> u64 {
    let x = c[k].as_f64().unwrap_or_else(|| panic!("`{k}` is not recorded as a number in {c}"));
    assert!(x >= 0.0 && x.fract() == 0.0, "`{k}` is not a count in {c}");
    x as u64
}

/// Every model: something was acknowledged before the cut, and it is all there, whole; the
/// application's and the file system's checks passed.
fn assert_nothing_acked_lost(results: &Value, what: &str, flags: &[&str]) {
    let cuts = cuts(results);
    assert_eq!(cuts.len(), MODELS.len(), "{what}: one cut per model");
    for Cut { setup, figures: c, app_verdict, fs_verdict } in cuts {
        let acked = num(&c, "acked");
        assert!(acked > 0, "{what} {setup}: nothing was acknowledged before the cut, the cut proves nothing: {c}");
        assert_eq!(num(&c, "lost"), 0, "{what} {setup}: acknowledged commits lost: {c}");
        assert_eq!(num(&c, "corrupt"), 0, "{what} {setup}: acknowledged commits corrupt: {c}");
        assert_eq!(num(&c, "present"), acked, "{what} {setup}: {c}");
        for f in flags {
            assert_eq!(num(&c, f), 1, "{what} {setup}: {f}: {c}");
        }
        assert_eq!(app_verdict, "consistent", "{what} {setup}: {c}");
        assert_eq!(fs_verdict, "clean", "{what} {setup}: e2fsck after the journal replay");
    }
}

/// Every model: the check ran and its counts add up; what they are is the finding, not asserted.
fn assert_numbers_reported(results: &Value, what: &str) -> String {
    let cuts = cuts(results);
    assert_eq!(cuts.len(), MODELS.len(), "{what}: one cut per model");
    let mut seen = Vec::new();
    for Cut { setup, figures: c, app_verdict, fs_verdict } in cuts {
        // a cut can leave a file system the check cannot read at all (no JSON line): then it
        // must not have called the result consistent, and that is the finding
        if c.as_object().is_none_or(|m| m.is_empty()) {
            assert_ne!(app_verdict, "consistent", "{what} {setup}: a check that printed no figures called it consistent");
            seen.push(format!("{setup}: no figures (app {app_verdict:?}, e2fsck {fs_verdict})"));
            continue;
        }
        let acked = num(&c, "acked");
        assert!(acked > 0, "{what} {setup}: nothing was acknowledged before the cut: {c}");
        assert_eq!(num(&c, "present") + num(&c, "lost") + num(&c, "corrupt"), acked, "{what} {setup}: {c}");
        assert!(["consistent", "inconsistent"].contains(&app_verdict.as_str()), "{what} {setup}: verdict {app_verdict:?}");
        seen.push(format!("{setup}: {c} app {app_verdict}, e2fsck {fs_verdict}"));
    }
    seen.join("\n")
}

const SQLITE_CHECK: &str = "exec python3 /proc/$PPID/cwd/examples/crash/sqlite.py check";

fn sqlite(sync: &str) -> String {
    let command = format!("exec python3 /proc/$PPID/cwd/examples/crash/sqlite.py write --sync {sync}");
    example_has("crash-sqlite.yaml", &command);
    example_has("crash-sqlite.yaml", SQLITE_CHECK);
    let ring = if sync == "full" { common::ring_where_available() } else { "off" };
    experiment(&format!("sqlite-{sync}"), &command, SQLITE_CHECK, &[], "2s", ring)
}

fn need_python_sqlite() -> bool {
    let ok = std::process::Command::new("python3").args(["-c", "import sqlite3"]).status().is_ok_and(|s| s.success());
    if !ok {
        skip("", "needs python3 with its sqlite3 module");
    }
    ok
}

#[test]
fn sqlite_synchronous_full_keeps_every_acknowledged_commit_under_every_model() {
    if !need_python_sqlite() {
        return;
    }
    let rd = RunDir::new("sqlite-full");
    let (ok, results, text) = run(&rd, &sqlite("full"));
    assert_nothing_acked_lost(&results, "sqlite synchronous=FULL", &["integrity_ok", "tally_ok"]);
    assert!(ok, "faultline run failed although every check passed:\n{text}");
}

#[test]
fn sqlite_synchronous_off_reports_what_each_model_lost() {
    if !need_python_sqlite() {
        return;
    }
    let rd = RunDir::new("sqlite-off");
    let (_, results, _) = run(&rd, &sqlite("off"));
    eprintln!("sqlite synchronous=OFF:\n{}", assert_numbers_reported(&results, "sqlite synchronous=OFF"));
}

const PG_CHECK: &str = "exec /proc/$PPID/cwd/examples/crash/postgres.sh check";

fn postgres(fsync: &str) -> String {
    let command = format!("exec /proc/$PPID/cwd/examples/crash/postgres.sh write --fsync {fsync}");
    example_has("crash-postgres.yaml", &command);
    example_has("crash-postgres.yaml", PG_CHECK);
    // initdb and the server's start take the first seconds
    let ring = if fsync == "on" { "off" } else { common::ring_where_available() };
    experiment(&format!("postgres-fsync-{fsync}"), &command, PG_CHECK, &[], "10s", ring)
}

fn need_postgres() -> bool {
    let ok = Path::new("/usr/lib/postgresql/15/bin/postgres").exists() && which("unshare") && which("setpriv");
    let user = std::process::Command::new("id").arg("postgres").output().is_ok_and(|o| o.status.success());
    if !(ok && user) {
        skip("", "needs Debian's postgresql 15 (/usr/lib/postgresql/15/bin), the postgres user, unshare and setpriv");
    }
    ok && user
}

/// PostgreSQL processes whose command line names `dir` (the run's mount points are under it).
fn postgres_left(dir: &Path) -> Vec<String> {
    let me = dir.to_string_lossy().to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(&me) && (c.contains("postgres") || c.contains("psql")))
        .collect()
}

#[test]
fn postgres_fsync_on_keeps_every_acknowledged_transaction_under_every_model() {
    if !need_postgres() {
        return;
    }
    let rd = RunDir::new("pg-on");
    let (ok, results, text) = run(&rd, &postgres("on"));
    assert!(postgres_left(&rd.0).is_empty(), "postgres processes left: {:?}", postgres_left(&rd.0));
    assert_nothing_acked_lost(&results, "postgres fsync=on", &["integrity_ok", "tally_ok"]);
    assert!(ok, "faultline run failed although every check passed:\n{text}");
}

#[test]
fn postgres_fsync_off_reports_what_each_model_lost() {
    if !need_postgres() {
        return;
    }
    let rd = RunDir::new("pg-off");
    let (_, results, _) = run(&rd, &postgres("off"));
    assert!(postgres_left(&rd.0).is_empty(), "postgres processes left: {:?}", postgres_left(&rd.0));
    eprintln!("postgres fsync=off:\n{}", assert_numbers_reported(&results, "postgres fsync=off"));
}

const FILES_WRITE: &str = "exec python3 /proc/$PPID/cwd/examples/crash/files.py write";
const FILES_CHECK: &str = "exec python3 /proc/$PPID/cwd/examples/crash/files.py check";

fn files(barrier: &str) -> String {
    example_has("crash-ext4-barrier.yaml", FILES_WRITE);
    example_has("crash-ext4-barrier.yaml", FILES_CHECK);
    example_has("crash-ext4-barrier.yaml", &format!("mount: [{barrier}]"));
    let ring = if barrier == "barrier=1" { common::ring_where_available() } else { "off" };
    experiment(&format!("ext4-{}", barrier.replace('=', "-")), FILES_WRITE, FILES_CHECK, &[barrier], "2s", ring)
}

#[test]
fn ext4_with_barriers_keeps_every_fsynced_file_under_every_model() {
    let rd = RunDir::new("ext4-barrier");
    let (ok, results, text) = run(&rd, &files("barrier=1"));
    assert_nothing_acked_lost(&results, "ext4 barrier=1", &[]);
    assert!(ok, "faultline run failed although every check passed:\n{text}");
}

#[test]
fn ext4_without_barriers_reports_what_each_model_lost() {
    let rd = RunDir::new("ext4-nobarrier");
    let (_, results, _) = run(&rd, &files("barrier=0"));
    eprintln!("ext4 barrier=0:\n{}", assert_numbers_reported(&results, "ext4 barrier=0"));
}

/// The example files themselves pass `faultline run --check` (the tests above run scaled-down
/// copies of their setups).
#[test]
fn the_crash_examples_are_valid_experiments() {
    for f in ["crash-sqlite.yaml", "crash-postgres.yaml", "crash-ext4-barrier.yaml"] {
        let o = std::process::Command::new(common::bin()).args(["run", "--check"]).arg(Path::new(ROOT).join("examples").join(f)).output().unwrap();
        assert!(o.status.success(), "examples/{f}: {}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    }
}
