//! Slow-I/O patterns on a served disk: the requests a pattern selects are the ones the client
//! sees faulted, and the realized counts in `fault list` / `fault stats` are exact.

mod common;
use common::*;
use faultline::fault::pattern::selects;
use faultline::spec::rule::Pattern;
use serde_json::{Value, json};

/// Reads of one block, in order, at queue depth 1: which came back faulted.
fn faulted_reads(d: &faultline::workload::direct::DirectDev, block: u64, n: u64, good: &[u8]) -> Vec<bool> {
    (0..n)
        .map(|_| match read_block(d, block) {
            Ok(b) => b != good,
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
                true
            }
        })
        .collect()
}

fn rule<'a>(list: &'a [Value], name: &str) -> &'a Value {
    list.iter().find(|r| r["name"] == name).unwrap_or_else(|| panic!("rule {name} not listed: {list:?}"))
}

#[test]
fn patterns_select_exactly_and_are_reported() {
    let s = Serve::start("64MiB", "rules: []\n");
    let d = s.open();
    // away from the blocks udev's probe of the new device reads
    for b in [1000, 2000, 3000] {
        write_blocks(&d, b, 1, 5, |b| b);
    }
    let _ = std::process::Command::new("udevadm").arg("settle").status();
    s.add(concat!(
        "rules:\n",
        "  - {name: burst, type: bitflip, op: read, target: {block: 1000}, pattern: {burst: {ratio: 10%, length: 5}}, seed: 3}\n",
        "  - {name: every, type: error, op: read, target: {block: 2000}, pattern: {interval: {every: 10}}}\n",
        "  - {name: random, type: delay, delay: 2us, op: read, target: {block: 3000}, pattern: {random: {ratio: 20%}}, seed: 11}\n",
    ));

    // burst: 1000 reads = 20 periods of 50, one run of 5 in each, where the index function says
    let burst = Pattern::Burst { ratio: 0.1, length: 5, period: 50 };
    let seen = faulted_reads(&d, 1000, 1000, &expected(1000, 5));
    let want: Vec<bool> = (0..1000).map(|n| selects(&burst, 3, n)).collect();
    assert_eq!(seen, want, "the client saw other reads flipped than the pattern selects");
    assert_eq!(seen.iter().filter(|x| **x).count(), 100);

    // interval: the 10th, 20th, ... read fails
    let seen = faulted_reads(&d, 2000, 200, &expected(2000, 5));
    assert_eq!(seen, (0..200).map(|n| n % 10 == 9).collect::<Vec<_>>());

    // random: exactly the seeded draws (client-side a 2 us delay is not observable reliably)
    for _ in 0..500 {
        read_block(&d, 3000).unwrap();
    }
    let random_fired = (0..500).filter(|n| selects(&Pattern::Random { ratio: 0.2 }, 11, *n)).count() as u64;

    // `faultline fault list`, the CLI, shows matched, fired, realized ratio and runs
    let out = std::process::Command::new(bin()).args(["fault", "--socket"]).arg(&s.socket).arg("list").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let list: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    let b = rule(&list, "burst");
    assert_eq!((b["matched"].as_u64(), b["fired"].as_u64(), b["realized_ratio"].as_f64()), (Some(1000), Some(100), Some(0.1)), "{b}");
    assert_eq!(b["runs"], json!({"runs": 20, "completed": 20, "length_mean": 5.0, "length_min": 5, "length_max": 5}), "{b}");
    assert_eq!(b["pattern"], json!({"burst": {"ratio": 0.1, "length": 5, "period": 50}}));
    let e = rule(&list, "every");
    assert_eq!((e["matched"].as_u64(), e["fired"].as_u64()), (Some(200), Some(20)), "{e}");
    assert_eq!(e["runs"], json!({"runs": 20, "completed": 20, "length_mean": 1.0, "length_min": 1, "length_max": 1}), "{e}");
    let r = rule(&list, "random");
    assert_eq!((r["matched"].as_u64(), r["fired"].as_u64()), (Some(500), Some(random_fired)), "{r}");

    // `faultline fault stats`: asked vs realized ratio per pattern rule
    let out = std::process::Command::new(bin()).args(["fault", "--socket"]).arg(&s.socket).arg("stats").output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stats: Value = serde_json::from_slice(&out.stdout).unwrap();
    let firing = stats["rule_firing"].as_array().unwrap();
    assert_eq!(firing.len(), 3, "{stats}");
    let f = rule(firing, "burst");
    assert_eq!((f["ratio"].as_f64(), f["realized_ratio"].as_f64(), f["pattern"].as_str()), (Some(0.1), Some(0.1), Some("burst 5 in 50")), "{f}");
    let f = rule(firing, "random");
    assert_eq!(f["realized_ratio"].as_f64(), Some(random_fired as f64 / 500.0), "{f}");
    // the delayed replies were timed
    assert!(stats["delay_lateness"]["count"].as_u64().unwrap() >= random_fired, "{stats}");
    drop(d);
    s.stop();
}
