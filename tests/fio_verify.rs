//! fio is the judge: its own crc32c verification must fail exactly where bit-flip rules fired.

mod common;
use common::*;
use std::collections::BTreeSet;

#[test]
fn fio_verify_fails_exactly_where_bitflips_fired() {
    if std::process::Command::new("fio").arg("--version").output().is_err() {
        panic!("fio is not installed (apt-get install fio); the README's test command installs it");
    }
    let s = Serve::start(
        "64MiB",
        "rules:\n  - {type: bitflip, op: write, target: {block: 100, count: 3}}\n  - {type: bitflip, op: write, byte: 2000, bit: 3, target: {block: 2000}}\n  - {type: bitflip, op: write, random: true, seed: 7, probability: 0.002}\n",
    );
    // fio writes its verify state file (<job>-<host>-<n>-verify.state) into its working
    // directory when verification fails: keep it out of the repository
    let cwd = tempfile::tempdir().unwrap();
    let out = std::process::Command::new("fio")
        .current_dir(cwd.path())
        .args(["--name=v", "--rw=randwrite", "--bs=4k", "--size=16M", "--direct=1", "--ioengine=psync", "--randrepeat=1"])
        .args(["--verify=crc32c", "--do_verify=1", "--verify_fatal=0", "--verify_dump=0", "--continue_on_error=verify"])
        .arg(format!("--filename={}", s.dev.display()))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    // "verify: bad magic header ... at file /dev/loopN offset 409600, length 4096"
    // "crc32c: verify failed at file /dev/loopN offset 8192000, length 4096"
    let fio_bad: BTreeSet<u64> = text
        .lines()
        .filter(|l| l.contains("verify") && l.contains(" offset "))
        .map(|l| {
            let after = &l[l.find(" offset ").unwrap() + 8..];
            after[..after.find(',').unwrap()].parse::<u64>().unwrap() / BS
        })
        .collect();
    let fired: BTreeSet<u64> = s
        .log()
        .iter()
        .flat_map(|e| {
            e["blocks"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|r| {
                    let (a, n) = (r[0].as_u64().unwrap(), r[1].as_u64().unwrap());
                    a..a + n
                })
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(fired.contains(&100) && fired.contains(&2000) && fired.len() > 4, "rules did not fire as set up: {fired:?}");
    assert_eq!(fio_bad, fired, "fio's verification failures must be exactly the blocks where bit flips fired\n{text}");
    s.stop();
}
