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
        common::cut::assert_one_client_cut(model, rep, 1000);
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
        common::cut::assert_two_client_cut(model, rep, ["client", "client-2"], DISK, if model == "lost-writes" { LOST } else { 0 }, &text, &html);
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
