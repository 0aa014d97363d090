//! Power cuts of the target host in networked experiments (docs/crash.md, "A power cut in a
//! networked experiment"): real namespaces and relay, faultline's NBD server with a volatile
//! write cache in the target host, the NBD client's block workload in the client host. The
//! client sees its I/O fail at the cut; after power-on the durability oracle rereads what the
//! client wrote over NBD and finds every block it had flushed; nothing is left behind. With
//! two clients each writes its own slice of the disk and has its own oracle; a lost write in
//! one slice is found in that client's record only. Bad input (a command target, a disk
//! without the volatile cache, a span larger than a client's slice) is refused with its place.

mod common;

use common::{RunDir, count as n, namespaces_of, need_net};

/// One client thread writes 4 KiB blocks in sequence (each write its own block) and flushes
/// every 24 writes: at the cut the target's cache holds the writes since the last flush.
const EXPERIMENT: &str = r#"
name: netcut
hosts: {clients: [client], target: faultline, nbd: {timeout: 2s, retries: 3}, interval: 250ms}
disk: {size: 64MiB, write_cache: volatile}
monitor: off
workload: {threads: 1, pattern: sequential, block_size: 4KiB, mix: {write: 100}, sync: 'fsync:24', duration: 30s, on_error: continue, content: {profile: none, seed: 4}}
setups:
  - name: lose-all
    faults: [{type: power-cut, model: lose-all, seed: 21, when: {after_ops: 2500}}]
  - name: keep-prefix
    faults: [{type: power-cut, model: keep-prefix, seed: 21, when: {after_flushes: 60}}]
"#;

#[test]
fn a_cut_of_the_target_fails_the_client_and_loses_no_flushed_block() {
    if !need_net(&[]) {
        return;
    }
    let run = RunDir::new("netcut");
    let tmp = tempfile::tempdir().unwrap();
    let common::Ran { pid, results: res, text, out } = run.run_ok(tmp.path(), EXPERIMENT);
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    assert!(html.contains("class=\"chart crash-figure\"") && html.contains("<table class=\"crash\">"), "the report has no crash section");
    for model in ["lose-all", "keep-prefix"] {
        let s = res["setups"].as_array().unwrap().iter().find(|s| s["name"] == model).unwrap();
        let rep = &s["repetitions"][0];
        let c = &rep["crash"];
        assert_eq!(c["fired"], true, "{model}: {c:#}");
        assert!(c["check"].is_null() && c["mount"].is_null(), "{model}: a raw export has no file system to check");
        // the cache's figures are whole
        let (k, o) = (&c["cut"], &c["oracle"]);
        assert_eq!(n(k, "kept") + n(k, "lost") + n(k, "torn"), n(k, "unflushed"), "{model}: {k}");
        // the client saw its I/O fail at the cut (EIO from the powered-off disk, after its retries)
        let client = &rep["networked"]["clients"][0];
        assert!(n(client, "failed_ios") > 0, "{model}: the client saw no error at the cut: {client}");
        assert!(rep["networked"]["clients"][0]["io_errors"].as_object().unwrap().keys().all(|e| e.ends_with(":EIO")), "{model}: {client}");
        // after power-on: every flushed block is there, nothing foreign; the states add up
        let sum: u64 = ["durable_kept", "unsynced_kept", "unsynced_lost", "torn", "durable_lost", "garbage"].iter().map(|x| n(o, x)).sum();
        assert_eq!(sum, n(o, "checked"), "{model}: {o}");
        assert!(n(o, "durable_kept") > 1000, "{model}: {o}");
        assert_eq!((n(o, "durable_lost"), n(o, "garbage")), (0, 0), "{model}: {c:#}");
        // each lost write was its own block, which reads back as before it (zeros); each kept
        // one reads back as written
        assert!(n(o, "unsynced_lost") >= n(k, "lost"), "{model}: {c:#}");
        assert!(n(o, "unsynced_kept") >= n(k, "kept"), "{model}: {c:#}");
        if model == "lose-all" {
            assert_eq!(n(k, "kept"), 0, "{c:#}");
        }
        // the cut is counted as the workload's errors, not as silent corruption
        assert!(rep["notes"].as_array().unwrap().iter().any(|x| x.as_str().unwrap().contains("the target lost power at")), "{model}: {:?}", rep["notes"]);
    }
    // unsynced losses are counted somewhere across the two models (lose-all loses every
    // unflushed write; a cut right after a flush has none, hence not per model)
    let lost: u64 = res["setups"].as_array().unwrap().iter().map(|s| n(&s["repetitions"][0]["crash"]["oracle"], "unsynced_lost")).sum();
    let unflushed: u64 = res["setups"].as_array().unwrap().iter().map(|s| n(&s["repetitions"][0]["crash"]["cut"], "unflushed")).sum();
    assert!(unflushed == 0 || lost > 0, "{text}");
    assert!(
        text.contains("crash: lose-all rep 1: lose-all after 2500 ops (cut at") && text.contains("crash: keep-prefix rep 1: keep-prefix after 60 flushes"),
        "{text}"
    );
    assert!(namespaces_of(pid).is_empty(), "namespaces left: {:?}", namespaces_of(pid));
    assert!(run.leftovers().is_empty(), "{:?}", run.leftovers());
}

/// Two clients, each writing 4 KiB blocks in sequence from the start of its own slice of the
/// disk (half of it each) and flushing every 24 writes, at 1000 writes/s each: the cuts come
/// seconds in, so a client that starts late (a loaded machine) still writes its share first. `lost-writes` is the negative control:
/// the target's disk acknowledges the writes to the first LOST bytes of the second half and
/// stores nothing, so the second client's oracle must find exactly those blocks durable-lost
/// (it flushed them long before the cut), and the first client's none.
const TWO: &str = r#"
name: netcut2
hosts: {clients: [client, client-2], target: faultline, nbd: {timeout: 2s, retries: 3}, interval: 250ms}
disk: {size: 64MiB, write_cache: volatile}
monitor: off
workload: {threads: 1, pattern: sequential, block_size: 4KiB, mix: {write: 100}, sync: 'fsync:24', rate_iops: 1000, duration: 30s, on_error: continue, content: {profile: none, seed: 4}}
setups:
  - name: lose-all
    faults: [{type: power-cut, model: lose-all, seed: 21, when: {after_ops: 5000}}]
  - name: keep-prefix
    faults: [{type: power-cut, model: keep-prefix, seed: 21, when: {after_flushes: 120}}]
  - name: lost-writes
    faults:
      - {type: lost-write, target: {offset: 32MiB, length: 256KiB}}
      - {type: power-cut, model: lose-all, seed: 21, when: {after_ops: 5000}}
"#;
const DISK: u64 = 64 << 20;
const LOST: u64 = 256 << 10;
const STATES: [&str; 8] = ["checked", "durable_kept", "unsynced_kept", "unsynced_lost", "torn", "durable_lost", "garbage", "files_lost"];

#[test]
fn two_clients_of_a_cut_each_keep_their_own_slice_and_oracle() {
    if !need_net(&[]) {
        return;
    }
    let run = RunDir::new("netcut2");
    let tmp = tempfile::tempdir().unwrap();
    let common::Ran { pid, results: res, text, out } = run.run_ok(tmp.path(), TWO);
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    for model in ["lose-all", "keep-prefix", "lost-writes"] {
        let s = res["setups"].as_array().unwrap().iter().find(|s| s["name"] == model).unwrap();
        let rep = &s["repetitions"][0];
        let c = &rep["crash"];
        assert_eq!(c["fired"], true, "{model}: {c:#}");
        let clients = c["clients"].as_array().unwrap_or_else(|| panic!("{model}: no per-client records: {c:#}"));
        let hosts: Vec<&str> = clients.iter().map(|k| k["host"].as_str().unwrap()).collect();
        assert_eq!(hosts, ["client", "client-2"], "{model}");
        // the slices: halves of the disk, in host order, not overlapping
        let slice = DISK / 2;
        for (i, k) in clients.iter().enumerate() {
            assert_eq!((n(k, "offset"), n(k, "length")), (i as u64 * slice, slice), "{model}: {k}");
        }
        assert!(n(&clients[0], "offset") + n(&clients[0], "length") <= n(&clients[1], "offset"), "{model}: overlap");
        // the sum is the clients' totals, key by key
        for key in STATES {
            let sum: u64 = clients.iter().map(|k| n(&k["oracle"], key)).sum();
            assert_eq!(n(&c["oracle"], key), sum, "{model}: {key}: {c:#}");
        }
        for (i, k) in clients.iter().enumerate() {
            let o = &k["oracle"];
            let host = hosts[i];
            // each client saw its I/O fail at the cut, the same count as its series says
            assert!(n(k, "failed_ios") > 0, "{model}: {host} saw no error: {k}");
            assert_eq!(n(k, "failed_ios"), n(&rep["networked"]["clients"][i], "failed_ios"), "{model}: {host}");
            assert!(
                rep["notes"].as_array().unwrap().iter().any(|x| x.as_str().unwrap().contains(&format!("{host} saw {} failed I/O(s)", n(k, "failed_ios")))),
                "{model}: {:?}",
                rep["notes"]
            );
            let states: u64 = ["durable_kept", "unsynced_kept", "unsynced_lost", "torn", "durable_lost", "garbage"].iter().map(|x| n(o, x)).sum();
            assert_eq!(states, n(o, "checked"), "{model}: {host}: {o}");
            assert!(n(o, "durable_kept") > 100, "{model}: {host}: {o}");
            // nothing foreign in any slice: the other client's content (another seed) would be garbage
            assert_eq!(n(o, "garbage"), 0, "{model}: {host}: {o}");
            let lost = if model == "lost-writes" && i == 1 { LOST / 4096 } else { 0 };
            assert_eq!(n(o, "durable_lost"), lost, "{model}: {host}: {o}");
            // failures name the disk's blocks: inside the client's slice, where the rule was
            for f in o["failures"].as_array().into_iter().flatten() {
                let b = n(f, "block") * 4096;
                assert!(b >= slice && b < slice + LOST && f["state"] == "durable-lost" && f["found"] == "zeros", "{model}: {host}: {f}");
            }
        }
        let row = format!("client client-2: bytes {slice}..{DISK} of the disk");
        assert!(html.contains(&row), "{model}: the report has no per-client row");
        assert!(text.contains(&format!("; client client-2 (bytes {slice}..{DISK}, ")), "{text}");
    }
    assert!(html.matches("<tr class=\"client\">").count() == 6, "two rows per cut");
    assert!(namespaces_of(pid).is_empty(), "namespaces left: {:?}", namespaces_of(pid));
    assert!(run.leftovers().is_empty(), "{:?}", run.leftovers());
}

/// A cut the target cannot take is refused before any host is built, with the cut's place,
/// what is wrong and what is allowed.
#[test]
fn bad_cuts_in_networked_experiments_are_refused_with_their_place() {
    let run = RunDir::new("netcut-bad");
    let tmp = tempfile::tempdir().unwrap();
    let cases = [
        (
            "name: x\nhosts: {target: {command: 'nbdkit -f -p $FAULTLINE_PORT memory 64M'}}\ndisk: {write_cache: volatile}\nworkload: {duration: 5s}\nfaults:\n  - {type: power-cut, when: {at: 1s}}\n",
            "exp.yaml:6:5: fault #1: setup `x`: a power cut needs `target: faultline`",
        ),
        (
            "name: x\nhosts: {clients: [client]}\nworkload: {duration: 5s}\nfaults:\n  - {type: power-cut, model: keep-prefix, when: {after_flushes: 3}}\n",
            "exp.yaml:5:5: fault #1: a power cut needs a disk with a volatile write cache: add `disk: {write_cache: volatile}`",
        ),
        (
            "name: x\nhosts: {clients: [a, b]}\ndisk: {size: 64MiB, write_cache: volatile}\nworkload: {span: 48MiB, duration: 5s}\nfaults:\n  - {type: power-cut, when: {at: 1s}}\n",
            "exp.yaml:4:18: workload: span: 48MiB is larger than each client's slice of the disk",
        ),
    ];
    for (yaml, want) in cases {
        let err = run.refused(tmp.path(), yaml);
        assert!(err.contains(want), "{yaml}\n{err}");
        assert!(err.contains("allowed") || err.contains("add `disk:"), "{err}");
    }
    assert!(run.leftovers().is_empty(), "{:?}", run.leftovers());
}
