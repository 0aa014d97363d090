//! filebench personalities on ext4 on a faultline disk (`faultline run`): per-flowop stats,
//! the R:W mix of filebench's workload files, clean verification without faults, and a write
//! bit flip found by the verifier.

mod common;
use common::bin;
use faultline::report::model::{Results, SetupResult};

fn run(yaml: &str) -> Results {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("exp.yaml");
    std::fs::write(&f, yaml).unwrap();
    let out = dir.path().join("results");
    let o = std::process::Command::new(bin()).arg("run").arg(&f).arg("--out").arg(&out).arg("-q").output().unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "faultline run failed:\n{stdout}\n{}", String::from_utf8_lossy(&o.stderr));
    assert!(stdout.contains("flowops (mean over"), "the summary shows the flowops:\n{stdout}");
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("<h3>Flowops"), "report.html has the flowop table");
    faultline::report::load_dir(&out).unwrap()
}

fn setup<'a>(r: &'a Results, name: &str) -> &'a SetupResult {
    r.setups.iter().find(|s| s.name == name).unwrap_or_else(|| panic!("no setup {name}"))
}

#[test]
fn personalities_on_ext4() {
    let r = run("name: pers
disk: { size: 1GiB }
stack: ext4
faults: []
setups:
  - name: fileserver
    workload: { personality: fileserver, scale: 0.01, duration: 3s, content: { profile: debian12-usr, seed: 2 } }
  - name: webserver
    workload: { personality: webserver, scale: 0.05, threads: 20, ops: 40000, duration: 10s, content: { profile: debian12-usr, seed: 2 } }
  - name: varmail
    workload: { personality: varmail, scale: 0.05, duration: 3s, content: { profile: debian12-usr, seed: 2 } }
  - name: webserver-bitflip
    workload: { personality: webserver, scale: 0.05, threads: 20, ops: 40000, duration: 10s, content: { profile: none, seed: 2 } }
    faults: [ { type: bitflip, op: write, times: 1, target: last_written_block, when: { every: 4MiB } } ]
");
    // (personality, its flowops, R:W of filebench's file, tolerance)
    let cases = [
        ("fileserver", &["createfile", "writewholefile", "closefile", "openfile", "appendfilerand", "readwholefile", "deletefile", "statfile"][..], 0.5, 0.05),
        ("webserver", &["openfile", "readwholefile", "closefile", "appendfilerand"][..], 10.0, 1.0),
        ("varmail", &["deletefile", "createfile", "appendfilerand", "fsync", "closefile", "openfile", "readwholefile"][..], 1.0, 0.1),
    ];
    for (name, ops, ratio, tol) in cases {
        let s = setup(&r, name);
        let rep = &s.repetitions[0];
        let notes = rep.notes.join("\n");
        assert_eq!(rep.flowops.len(), ops.len(), "{name}: {:?}", rep.flowops.keys());
        for op in ops {
            let f = &rep.flowops[*op];
            assert!(f.ops > 0 && f.ops_s > 0.0 && f.mean_us > 0.0 && f.p99_us >= f.p50_us, "{name} {op}: {f:?}");
        }
        let got = rep.flowop_read_write_ratio().unwrap();
        assert!((got - ratio).abs() <= tol, "{name}: R:W {got:.3}, filebench's is {ratio}");
        assert_eq!(rep.failed_ios, 0, "{name}: {:?}\n{notes}", rep.io_errors);
        let i = &rep.integrity;
        assert!(i.blocks_checked > 0, "{name}: the files alive at the end are verified");
        assert_eq!(i.ok, i.blocks_checked, "{name}: no faults, nothing bad: {:?}\n{notes}", i.bad);
        assert!(rep.read.ops > 0 && rep.write.ops > 0 && !rep.timeseries.is_empty());
    }
    // webserver never deletes: every flipped block is in a live file (the log), and ext4 has
    // no data checksums, so each flip is silent corruption the verifier finds
    let s = setup(&r, "webserver-bitflip");
    let c = s.repetitions[0].counts();
    let notes = s.repetitions[0].notes.join("\n");
    assert!(c.faults_injected >= 1, "{c:?}\n{notes}");
    assert_eq!((c.silent, c.failures), (c.faults_injected, c.faults_injected), "{c:?}\n{notes}");
    assert!(!s.repetitions[0].integrity.files_hit.is_empty());
}
