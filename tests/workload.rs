//! The workload engine and verification against a real faultline disk: verify catches a block
//! corrupted by a bit-flip rule, one overwritten behind its back, an unreadable block and a
//! misdirected write; error policies behave as specified.

mod common;
use common::*;
use faultline::content::{profile::Profile, stream::Stream};
use faultline::verify::{BadBlock, verify_device};
use faultline::workload::engine::{BlockWorkload, ErrorPolicy, run_block};
use faultline::workload::map::ContentMap;
use faultline::workload::pattern::Pattern;
use std::sync::Arc;

fn workload(s: &Serve, size: u64, on_error: ErrorPolicy) -> BlockWorkload {
    BlockWorkload {
        device: s.dev.clone(),
        pattern: Pattern::Sequential,
        write_pct: 100,
        block_size: 16384,
        threads: 2,
        size: Some(size),
        ops: None,
        duration: None,
        stream: Stream::new(&Profile::none().scaled(size / BS), 5),
        seed: 5,
        on_error,
        span: Some(size),
    }
}

#[test]
fn verify_classifies_corruption_errors_and_misdirection() {
    let s = Serve::start("64MiB", "rules:\n  - {type: bitflip, op: write, target: {block: 100}}\n  - {type: misdirected-write, shift: -16KiB, target: {block: 200}}\n");
    let map = Arc::new(ContentMap::new((64 << 20) / BS, 4096, 5));
    let res = run_block(&workload(&s, 8 << 20, ErrorPolicy::Stop), map.clone()).unwrap();
    assert_eq!(res.write.ops, (8 << 20) / 16384);
    assert!(res.failed_ios.is_empty());
    // behind its back: overwrite block 300 directly; then make block 400 unreadable
    s.clear();
    let d = s.open();
    let junk = faultline::workload::direct::AlignedBuf::new(BS as usize);
    d.write_at(&junk, 300 * BS).unwrap();
    s.add("rules:\n  - {type: error, op: read, target: {block: 400}}\n");
    let rep = verify_device(&s.dev, &map).unwrap();
    let bad: Vec<u64> = rep.bad.iter().map(|b| b.block()).collect();
    // 100: flipped; 196..199: hold what was meant for 200..203 (written earlier, then hit by
    // the misdirected write); 200..203: never arrived (zeroes); 300: overwritten; 400: unreadable
    assert_eq!(bad, vec![100, 196, 197, 198, 199, 200, 201, 202, 203, 300, 400], "{rep:?}");
    assert_eq!(rep.unreadable, 1);
    assert!(matches!(rep.bad[10], BadBlock::Unreadable { block: 400, errno: libc::EIO }));
    for b in &rep.bad[1..5] {
        let BadBlock::Corrupted { block, holds, .. } = b else { panic!() };
        assert_eq!(*holds, Some(block + 4), "block {block} should hold the content meant for {}", block + 4);
    }
    assert_eq!(rep.misdirected, 4);
    assert_eq!(rep.ok, rep.checked - 11);
    drop(d);
    s.stop();
}

#[test]
fn error_policies() {
    let s = Serve::start("64MiB", "rules:\n  - {type: error, op: write, target: {block: 64}}\n");
    let map = Arc::new(ContentMap::new((64 << 20) / BS, 4096, 5));
    // continue: the failed request is recorded, the rest goes on
    let r = run_block(&workload(&s, 4 << 20, ErrorPolicy::Continue), map.clone()).unwrap();
    assert_eq!(r.failed_ios.len(), 1);
    assert_eq!(r.failed_ios[0].offset, 64 * BS);
    assert_eq!(r.errors.get("write:EIO"), Some(&1));
    assert_eq!(r.write.ops + 1, (4 << 20) / 16384);
    assert!(!r.stopped_on_error);
    assert_eq!(map.get(64), None, "a failed write leaves nothing to verify");
    // stop: ends at the first failure
    let r = run_block(&workload(&s, 4 << 20, ErrorPolicy::Stop), map.clone()).unwrap();
    assert!(r.stopped_on_error);
    assert!(r.write.ops < (4 << 20) / 16384 - 1);
    // retry: a transient error (times: 2) is retried away
    s.clear();
    s.add("rules:\n  - {type: error, op: write, times: 2, target: {block: 64}}\n");
    let r = run_block(&workload(&s, 4 << 20, ErrorPolicy::Retry(3)), map.clone()).unwrap();
    assert_eq!(r.retries, 2);
    assert!(r.failed_ios.is_empty());
    assert!(r.retry_seconds >= 0.003);
    s.stop();
}
