//! `faultline workload` and `faultline verify` as a user runs them: a YAML spec against a
//! faultline disk, results written to --out, verify from the saved maps; a bad spec is refused
//! with file, line, column and what is allowed.

mod common;
use common::*;
use std::process::Command;

#[test]
fn workload_cli_writes_results_and_verify_reads_them_back() {
    let s = Serve::start("64MiB", "rules: []\n");
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("w.yaml");
    std::fs::write(&spec, "workload:\n  pattern: uniform\n  mix: {read: 20, write: 80}\n  engine: io_uring\n  iodepth: 8\n  threads: 2\n  ops: 4000\n  span: 16MiB\n  interval: 20ms\n  content: {profile: linux-6.1-source, seed: 3}\n").unwrap();
    let out = dir.path().join("res");
    let o = Command::new(bin()).args(["workload", "--spec"]).arg(&spec).arg("--device").arg(&s.dev).arg("--out").arg(&out).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(table.contains("write") && table.contains("IOPS"), "{table}");
    let res: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("result.json")).unwrap()).unwrap();
    assert_eq!(res["read"]["ops"].as_u64().unwrap() + res["write"]["ops"].as_u64().unwrap(), 4000);
    let csv = std::fs::read_to_string(out.join("timeseries.csv")).unwrap();
    assert!(csv.starts_with("t,read_iops,") && csv.lines().count() >= 2, "{csv}");
    // verify from the saved maps: everything written is intact
    let o = Command::new(bin()).args(["verify", "--map"]).arg(&out).output().unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let written = res["write"]["ops"].as_u64().unwrap();
    assert!(text.contains("corrupted 0 (misdirected 0), unreadable 0"), "{text}");
    let checked: u64 = text.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(checked > 0 && checked <= written, "{text}");
    // a bad spec: exit 1, the location and the allowed values
    std::fs::write(&spec, "workload:\n  ops: 10\n  engine: aio\n").unwrap();
    let o = Command::new(bin()).args(["workload", "--spec"]).arg(&spec).arg("--device").arg(&s.dev).arg("--out").arg(&out).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1));
    assert!(err.contains(&format!("{}:3:11: engine: `aio` is not an engine; allowed: psync, io_uring", spec.display())), "{err}");
    s.stop();
}
