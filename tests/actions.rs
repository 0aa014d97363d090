//! Each fault action and trigger, observed by a real client doing O_DIRECT I/O on /dev/loopN,
//! over both transports: the faults are applied by the disk, but each transport carries the
//! request, the errno and the reply's bytes in its own way.

mod common;
use common::*;
use serde_json::json;
use std::time::{Duration, Instant};

/// Each test runs three times: `NAME::ring` over FUSE over io_uring with one ring thread,
/// `NAME::ring_per_cpu` with one ring thread per CPU queue (both reported skipped where the
/// ring cannot be had), and `NAME::classic` over /dev/fuse reads.
macro_rules! both_transports {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[test]
            fn ring() {
                if super::need_ring() {
                    super::$name("on");
                }
            }
            #[test]
            fn ring_per_cpu() {
                if super::need_ring() {
                    super::$name("per-cpu");
                }
            }
            #[test]
            fn classic() {
                super::$name("off");
            }
        }
    )*};
}

both_transports!(
    write_bitflip_is_stored_read_bitflip_is_not,
    corrupt_zero_and_random,
    errors_fail_the_whole_request_and_carry_errno,
    lost_torn_and_misdirected_writes,
    transient_fires_exactly_times,
    probability_within_bounds_and_matches_log,
    content_rules_hit_only_matching_blocks,
    window_and_after_requests,
    rot_corrupts_at_rest,
    discard_and_flush,
    control_socket_round_trip,
);

fn write_bitflip_is_stored_read_bitflip_is_not(ring: &str) {
    let s = Serve::start_ring(
        "64MiB",
        ring,
        "rules:\n  - {type: bitflip, op: write, target: {block: 10, count: 2}}\n  - {type: bitflip, op: read, byte: 7, bit: 6, target: {block: 20}}\n",
    );
    let d = s.open();
    write_blocks(&d, 0, 32, 1, |b| b);
    for b in 0..32 {
        let got = read_block(&d, b).unwrap();
        let mut want = expected(b, 1);
        match b {
            10 | 11 => want[0] ^= 1,
            20 => want[7] ^= 1 << 6,
            _ => {}
        }
        assert_eq!(got, want, "block {b}");
    }
    s.clear();
    // the write flip is in the stored copy; the read flip never was
    let mut w10 = expected(10, 1);
    w10[0] ^= 1;
    assert_eq!(read_block(&d, 10).unwrap(), w10);
    assert_eq!(read_block(&d, 20).unwrap(), expected(20, 1));
    drop(d);
    s.stop();
}

fn corrupt_zero_and_random(ring: &str) {
    let s = Serve::start_ring(
        "64MiB",
        ring,
        "rules:\n  - {type: corrupt, op: write, offset: 100, length: 50, fill: zero, target: {block: 3}}\n  - {type: corrupt, op: read, offset: 4000, fill: random, target: {block: 4}}\n",
    );
    let d = s.open();
    write_blocks(&d, 0, 8, 2, |b| b);
    let got = read_block(&d, 3).unwrap();
    let mut want = expected(3, 2);
    want[100..150].fill(0);
    assert_eq!(got, want);
    let got = read_block(&d, 4).unwrap();
    let orig = expected(4, 2);
    assert_eq!(got[..4000], orig[..4000]);
    assert_ne!(got[4000..], orig[4000..]);
    drop(d);
    s.stop();
}

fn errors_fail_the_whole_request_and_carry_errno(ring: &str) {
    let s = Serve::start_ring(
        "64MiB",
        ring,
        "rules:\n  - {type: error, op: read, target: {block: 5}}\n  - {type: error, op: write, errno: ENOSPC, target: {block: 40}}\n  - {type: error, op: write, errno: EROFS, target: {block: 50}}\n",
    );
    let d = s.open();
    write_blocks(&d, 0, 16, 3, |b| b);
    // a 16-block read touching block 5 fails as a whole; the error counts 16 blocks
    let mut big = faultline::workload::direct::AlignedBuf::new(16 * BS as usize);
    let e = d.read_at(&mut big, 0).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO));
    assert_eq!(errno(read_block(&d, 5)), Some(libc::EIO));
    assert!(read_block(&d, 6).is_ok());
    let r = s.rules();
    assert_eq!(r[0]["fired"], 2);
    assert_eq!(r[0]["blocks"], 17);
    // ENOSPC crosses the loop driver as BLK_STS_NOSPC; EROFS has no block status and becomes EIO
    let buf = faultline::workload::direct::AlignedBuf::new(BS as usize);
    assert_eq!(d.write_at(&buf, 40 * BS).unwrap_err().raw_os_error(), Some(libc::ENOSPC));
    assert_eq!(d.write_at(&buf, 50 * BS).unwrap_err().raw_os_error(), Some(libc::EIO));
    // a failed write stores nothing
    s.clear();
    assert_eq!(read_block(&d, 40).unwrap(), vec![0u8; BS as usize]);
    drop(d);
    s.stop();
}

fn lost_torn_and_misdirected_writes(ring: &str) {
    let s = Serve::start_ring(
        "64MiB",
        ring,
        "rules:\n  - {type: lost-write, target: {block: 1}}\n  - {type: torn-write, keep: 1KiB, target: {block: 2}}\n  - {type: misdirected-write, shift: 40KiB, target: {block: 3}}\n",
    );
    let d = s.open();
    for b in 1..=3 {
        write_blocks(&d, b, 1, 4, |b| b); // each write acknowledged
    }
    s.clear();
    let zero = vec![0u8; BS as usize];
    assert_eq!(read_block(&d, 1).unwrap(), zero, "lost write stored something");
    let torn = read_block(&d, 2).unwrap();
    assert_eq!(torn[..1024], expected(2, 4)[..1024]);
    assert_eq!(torn[1024..], zero[1024..]);
    assert_eq!(read_block(&d, 3).unwrap(), zero, "misdirected write reached its own block");
    assert_eq!(read_block(&d, 13).unwrap(), expected(3, 4), "misdirected write not at +40KiB");
    drop(d);
    s.stop();
}

fn transient_fires_exactly_times(ring: &str) {
    let s = Serve::start_ring("64MiB", ring, "rules:\n  - {type: error, op: read, times: 3, target: {block: 7}}\n");
    let d = s.open();
    let fails = (0..20).filter(|_| read_block(&d, 7).is_err()).count();
    assert_eq!(fails, 3);
    assert_eq!(s.rules()[0]["fired"], 3);
    drop(d);
    s.stop();
}

fn probability_within_bounds_and_matches_log(ring: &str) {
    let s = Serve::start_ring("64MiB", ring, "rules:\n  - {type: error, op: read, probability: 30%, seed: 42, target: {block: 9}}\n");
    let d = s.open();
    let n = 3000;
    let fails = (0..n).filter(|_| read_block(&d, 9).is_err()).count() as f64;
    let (mean, sd) = (n as f64 * 0.3, (n as f64 * 0.3 * 0.7).sqrt());
    assert!((fails - mean).abs() < 5.0 * sd, "{fails} failures of {n}, expected {mean} +- {}", 5.0 * sd);
    let r = &s.rules()[0];
    assert_eq!(r["fired"].as_u64().unwrap() as f64, fails, "every client failure is a logged firing");
    assert_eq!(r["matched"], n);
    drop(d);
    s.stop();
}

fn content_rules_hit_only_matching_blocks(ring: &str) {
    let s = Serve::start_ring("64MiB", ring, "rules: []\n");
    let d = s.open();
    // content id 77 at blocks 3, 9, 25; other blocks unique
    let id_of = |b: u64| if [3, 9, 25].contains(&b) { 77 } else { 1000 + b };
    let h = faultline::content::hash_hex(faultline::content::block_hash(&expected(77, 5)));
    s.add(&format!("rules:\n  - {{type: bitflip, op: write, target: {{hash: \"{h}\"}}}}\n"));
    write_blocks(&d, 0, 32, 5, id_of);
    for b in 0..32 {
        let mut want = expected(id_of(b), 5);
        if id_of(b) == 77 {
            want[0] ^= 1;
        }
        assert_eq!(read_block(&d, b).unwrap(), want, "block {b}");
    }
    let log = s.log();
    let mut hit: Vec<u64> = log.iter().map(|e| e["blocks"][0][0].as_u64().unwrap()).collect();
    hit.sort();
    assert_eq!(hit, vec![3, 9, 25]);
    drop(d);
    s.stop();
}

fn window_and_after_requests(ring: &str) {
    let s = Serve::start_ring("64MiB", ring, "rules:\n  - {type: error, op: read, window: {from: 1500ms, to: 3s}, target: {block: 1}}\n");
    let d = s.open();
    let t0 = Instant::now();
    assert!(read_block(&d, 1).is_ok(), "fired before the window");
    while t0.elapsed() < Duration::from_millis(1700) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(read_block(&d, 1).is_err(), "did not fire inside the window");
    while t0.elapsed() < Duration::from_millis(3300) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(read_block(&d, 1).is_ok(), "fired after the window");
    // after: counted from the device's start, so arm relative to the current count
    let seen = s.call(json!({"cmd": "stats"}))["requests"].as_u64().unwrap();
    s.add(&format!("rules:\n  - {{type: error, op: read, after: {{requests: {}}}, target: {{block: 2}}}}\n", seen + 5));
    let fails: Vec<bool> = (0..8).map(|_| read_block(&d, 2).is_err()).collect();
    assert_eq!(fails, vec![false, false, false, false, false, true, true, true]);
    drop(d);
    s.stop();
}

fn rot_corrupts_at_rest(ring: &str) {
    let s = Serve::start_ring("64MiB", ring, "rules: []\n");
    let d = s.open();
    write_blocks(&d, 0, 16, 6, |b| if b % 5 == 0 { 500 } else { b });
    let h = faultline::content::hash_hex(faultline::content::block_hash(&expected(500, 6)));
    s.add(&format!("rules:\n  - {{type: rot, target: {{hash: \"{h}\"}}}}\n  - {{type: rot, byte: 9, bit: 2, target: {{block: 7}}}}\n"));
    for b in 0..16 {
        let id = if b % 5 == 0 { 500 } else { b };
        let mut want = expected(id, 6);
        if id == 500 {
            want[0] ^= 1;
        }
        if b == 7 {
            want[9] ^= 1 << 2;
        }
        assert_eq!(read_block(&d, b).unwrap(), want, "block {b}");
    }
    let r = s.rules();
    assert_eq!((r[0]["blocks"].as_u64(), r[1]["blocks"].as_u64()), (Some(4), Some(1)));
    drop(d);
    s.stop();
}

fn discard_and_flush(ring: &str) {
    let s = Serve::start_ring("64MiB", ring, "rules:\n  - {type: error, op: flush}\n");
    let d = s.open();
    write_blocks(&d, 0, 64, 7, |b| b);
    assert!(d.sync().is_err(), "a flush error must fail fsync");
    s.clear();
    assert!(d.sync().is_ok());
    let st = std::process::Command::new("blkdiscard").args(["-o", "65536", "-l", "65536"]).arg(&s.dev).status().unwrap();
    assert!(st.success());
    assert_eq!(read_block(&d, 16).unwrap(), vec![0u8; BS as usize]);
    assert_eq!(read_block(&d, 15).unwrap(), expected(15, 7));
    s.add("rules:\n  - {type: error, op: discard}\n");
    let st = std::process::Command::new("blkdiscard").args(["-o", "0", "-l", "65536"]).arg(&s.dev).stderr(std::process::Stdio::null()).status().unwrap();
    assert!(!st.success(), "a discard error must fail blkdiscard");
    drop(d);
    s.stop();
}

fn control_socket_round_trip(ring: &str) {
    let s = Serve::start_ring("64MiB", ring, "rules:\n  - {name: a, type: error, op: read, target: {block: 1}}\n");
    let ids = s.add("rules:\n  - {name: b, type: delay, delay: 1ms}\n  - {name: c, type: bitflip, op: write, random: true, seed: 3}\n");
    assert_eq!(ids.len(), 2);
    assert_eq!(s.rules().len(), 3);
    s.call(json!({"cmd": "remove", "ids": [ids[0]]}));
    let names: Vec<String> = s.rules().iter().map(|r| r["name"].as_str().unwrap().to_string()).collect();
    assert_eq!(names, vec!["a", "c"]);
    let err = faultline::frontend::control::call(&s.socket, &json!({"cmd": "add", "rules": "rules:\n  - {type: bitflip, errno: EIO}\n"})).unwrap_err();
    assert!(err.to_string().contains("rules:2:") && err.to_string().contains("does not apply"), "{err}");
    // the CLI finds the socket by flag and prints JSON
    let out = std::process::Command::new(bin()).args(["fault", "list", "--socket"]).arg(&s.socket).output().unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v.as_array().unwrap().len(), 2);
    // `fault add` prints one line, the count and the new ids
    let file = s.dir.path().join("add.yaml");
    std::fs::write(
        &file,
        "rules:\n  - {type: delay, op: write, delay: 1us}\n  - {type: delay, op: write, delay: 2us}\n  - {type: delay, op: write, delay: 3us}\n",
    )
    .unwrap();
    let out = std::process::Command::new(bin()).args(["fault", "add", "--socket"]).arg(&s.socket).arg(&file).output().unwrap();
    std::fs::remove_file(&file).unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.stdout.iter().filter(|&&b| b == b'\n').count(), 1, "{}", String::from_utf8_lossy(&out.stdout));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["armed"], 3);
    let added: Vec<u64> = v["ids"].as_array().unwrap().iter().map(|i| i.as_u64().unwrap()).collect();
    assert_eq!(added.len(), 3);
    s.call(json!({"cmd": "remove", "ids": added}));
    assert_eq!(s.rules().len(), 2);
    // pause and resume through the CLI: paused, rule a (reads of block 1 fail) does not fire
    let fault = |cmd: &str| std::process::Command::new(bin()).args(["fault", cmd, "--socket"]).arg(&s.socket).output().unwrap();
    let d = s.open();
    assert!(read_block(&d, 1).is_err());
    let out = fault("pause");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["paused"], 2);
    assert!(read_block(&d, 1).is_ok());
    let again = fault("pause");
    assert!(!again.status.success() && String::from_utf8_lossy(&again.stderr).contains("already paused"));
    assert_eq!(s.rules().len(), 2, "paused rules stay listed");
    assert!(fault("resume").status.success());
    assert!(read_block(&d, 1).is_err());
    drop(d);
    s.stop();
}
