//! Checks of a networked power cut's repetition (results.json's `setups[].repetitions[]`), the
//! same whether the hosts are namespaces (tests/net_cut.rs) or reached through agents
//! (tests/agents_run.rs).

use super::count as n;
use serde_json::Value;

/// The oracle's states, which add up to `checked`.
const STATES: [&str; 6] = ["durable_kept", "unsynced_kept", "unsynced_lost", "torn", "durable_lost", "garbage"];

fn notes_have(rep: &Value, what: &str) -> bool {
    rep["notes"].as_array().unwrap().iter().any(|x| x.as_str().unwrap().contains(what))
}

/// One client's cut of setup `model`: it fired; the cache's figures are whole; the client saw
/// its I/O fail at the cut, every failure EIO from the powered-off disk; after power-on its
/// oracle found every flushed block (at least `min_kept` of them) and nothing foreign, the
/// states add up, and each lost write reads back as before it and each kept one as written;
/// the notes say the target lost power. Returns the cut's (`crash.cut`) and the oracle's
/// figures.
pub fn assert_one_client_cut<'a>(model: &str, rep: &'a Value, min_kept: u64) -> (&'a Value, &'a Value) {
    let c = &rep["crash"];
    assert_eq!(c["fired"], true, "{model}: {c:#}");
    assert!(c["check"].is_null() && c["mount"].is_null(), "{model}: a raw export has no file system to check");
    let (k, o) = (&c["cut"], &c["oracle"]);
    let client = &rep["networked"]["clients"][0];
    println!("{model}: cut at {} s: {k}\n  oracle: {o}\n  client: {}", c["t_s"], client["io_errors"]);
    assert_eq!(n(k, "kept") + n(k, "lost") + n(k, "torn"), n(k, "unflushed"), "{model}: {k}");
    assert!(n(client, "failed_ios") > 0, "{model}: the client saw no error at the cut: {client}");
    assert!(client["io_errors"].as_object().unwrap().keys().all(|e| e.ends_with(":EIO")), "{model}: {client}");
    let sum: u64 = STATES.iter().map(|x| n(o, x)).sum();
    assert_eq!(sum, n(o, "checked"), "{model}: {o}");
    assert!(n(o, "durable_kept") > min_kept, "{model}: {o}");
    assert_eq!((n(o, "durable_lost"), n(o, "garbage")), (0, 0), "{model}: {c:#}");
    // a lost write reads back as what its block held before it (zeros, or its durable content
    // once the sequence wrapped the disk), a kept one as written
    assert!(n(o, "unsynced_lost") >= n(k, "lost"), "{model}: {c:#}");
    assert!(n(o, "unsynced_kept") >= n(k, "kept"), "{model}: {c:#}");
    if model == "lose-all" {
        assert_eq!(n(k, "kept"), 0, "{c:#}");
    }
    assert!(notes_have(rep, "the target lost power at"), "{model}: {}", rep["notes"]);
    (k, o)
}

/// Two clients' cut of setup `model` on a `disk`-byte disk of 4 KiB blocks: one record per client, in
/// `hosts` order (the series too), each with its half of the disk; the cut's oracle is their
/// sum, key by key; each client saw its own I/O fail (EIO, the count its series and the notes
/// have); each client's states add up with more than 100 durable-kept blocks and no garbage
/// (the other client's content, its seed, in a slice would be garbage). `lost`: the first
/// bytes of the second half whose writes a rule dropped (0: none): exactly those blocks are
/// the second client's durable-lost ones and its failures, none the first's. `text` (the
/// run's output) and `html` (its report) have the second client's row.
pub fn assert_two_client_cut(model: &str, rep: &Value, hosts: [&str; 2], disk: u64, lost: u64, text: &str, html: &str) {
    let c = &rep["crash"];
    assert_eq!(c["fired"], true, "{model}: {c:#}");
    let k = &c["cut"];
    assert_eq!(n(k, "kept") + n(k, "lost") + n(k, "torn"), n(k, "unflushed"), "{model}: {k}");
    if model == "lose-all" {
        assert_eq!(n(k, "kept"), 0, "{c:#}");
    }
    let clients = c["clients"].as_array().unwrap_or_else(|| panic!("{model}: no per-client records: {c:#}"));
    let names: Vec<&str> = clients.iter().map(|k| k["host"].as_str().unwrap()).collect();
    assert_eq!(names, hosts, "{model}");
    let series: Vec<&str> = rep["networked"]["clients"].as_array().unwrap().iter().map(|s| s["host"].as_str().unwrap()).collect();
    assert_eq!(series, hosts, "{model}");
    let slice = disk / 2;
    for (i, k) in clients.iter().enumerate() {
        assert_eq!((n(k, "offset"), n(k, "length")), (i as u64 * slice, slice), "{model}: {k}");
    }
    for key in STATES.iter().chain(&["checked", "files_lost"]) {
        let sum: u64 = clients.iter().map(|k| n(&k["oracle"], key)).sum();
        assert_eq!(n(&c["oracle"], key), sum, "{model}: {key}: {c:#}");
    }
    for (i, (k, host)) in clients.iter().zip(hosts).enumerate() {
        let o = &k["oracle"];
        let mut brief = k.clone();
        brief["oracle"].as_object_mut().unwrap().remove("failures");
        println!("{model}: {host}: {brief}");
        let series = &rep["networked"]["clients"][i];
        assert!(n(k, "failed_ios") > 0, "{model}: {host} saw no error: {k}");
        assert_eq!(n(k, "failed_ios"), n(series, "failed_ios"), "{model}: {host}");
        assert!(series["io_errors"].as_object().unwrap().keys().all(|e| e.ends_with(":EIO")), "{model}: {series}");
        assert!(notes_have(rep, &format!("{host} saw {} failed I/O(s)", n(k, "failed_ios"))), "{model}: {}", rep["notes"]);
        let states: u64 = STATES.iter().map(|x| n(o, x)).sum();
        assert_eq!(states, n(o, "checked"), "{model}: {host}: {o}");
        assert!(n(o, "durable_kept") > 100, "{model}: {host}: {o}");
        assert_eq!(n(o, "garbage"), 0, "{model}: {host}: {o}");
        let want = if i == 1 { lost / 4096 } else { 0 };
        assert_eq!(n(o, "durable_lost"), want, "{model}: {host}: {o}");
        // failures name the disk's blocks: inside the second slice, where the rule was
        for f in o["failures"].as_array().into_iter().flatten() {
            let b = n(f, "block") * 4096;
            assert!(b >= slice && b < slice + lost && f["state"] == "durable-lost" && f["found"] == "zeros", "{model}: {host}: {f}");
        }
    }
    let second = hosts[1];
    assert!(html.contains(&format!("client {second}: bytes {slice}..{disk} of the disk")), "{model}: the report has no per-client row");
    assert!(text.contains(&format!("; client {second} (bytes {slice}..{disk}, ")), "{text}");
}
