//! The workload engine and verification against a real faultline disk: verify catches a block
//! corrupted by a bit-flip rule, one overwritten behind its back, an unreadable block and a
//! misdirected write; error policies behave as specified.

mod common;
use common::*;
use faultline::verify::{BadBlock, verify_device};
use faultline::workload::content_map::ContentMap;
use faultline::workload::pattern::Pattern;
use faultline::workload::runner::{BlockWorkload, ErrorPolicy, run_block};
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
        seed: 5,
        on_error,
        span: Some(size),
    }
}

#[test]
fn verify_classifies_corruption_errors_and_misdirection() {
    let s = Serve::start(
        "64MiB",
        "rules:\n  - {type: bitflip, op: write, target: {block: 100}}\n  - {type: misdirected-write, shift: -16KiB, target: {block: 200}}\n",
    );
    let map = Arc::new(ContentMap::new((64 << 20) / BS, 4096, 5));
    // one thread: with two, the other may use up the shared size bound before blocks 100..203
    // are written
    let mut one = workload(&s, 8 << 20, ErrorPolicy::Stop);
    one.threads = 1;
    let res = run_block(&one, map.clone()).unwrap();
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
    assert_eq!(rep.counts.unreadable, 1);
    assert!(matches!(rep.bad[10], BadBlock::Unreadable { block: 400, errno: libc::EIO }));
    for b in &rep.bad[1..5] {
        let BadBlock::Corrupted { block, holds, .. } = b else { panic!() };
        assert_eq!(*holds, Some(block + 4), "block {block} should hold the content meant for {}", block + 4);
    }
    assert_eq!(rep.counts.misdirected, 4);
    assert_eq!(rep.counts.ok, rep.counts.checked - 11);
    drop(d);
    s.stop();
}

#[test]
fn error_policies() {
    // each of the two threads writes its own half in order, so the first request of each half
    // fails whichever thread runs first (one may do all the work while the other still starts)
    let starts = [0, (2 << 20) / BS];
    let s = Serve::start(
        "64MiB",
        &format!(
            "rules:\n  - {{type: error, op: write, target: {{block: {}}}}}\n  - {{type: error, op: write, target: {{block: {}}}}}\n",
            starts[0], starts[1]
        ),
    );
    let map = Arc::new(ContentMap::new((64 << 20) / BS, 4096, 5));
    // continue: the failed request is recorded, the rest goes on
    let r = run_block(&workload(&s, 4 << 20, ErrorPolicy::Continue), map.clone()).unwrap();
    // the size bound is shared: a thread that runs ahead wraps around its half and hits its
    // start again, so every failure is at a start, and there is at least one
    let n = r.failed_ios.len() as u64;
    assert!(n >= 1 && r.failed_ios.iter().all(|f| starts.iter().any(|b| f.offset == b * BS)), "{:?}", r.failed_ios);
    assert_eq!(r.errors.get("write:EIO"), Some(&n));
    assert_eq!(r.write.ops + n, (4 << 20) / 16384);
    assert!(!r.stopped_on_error);
    assert!(starts.iter().all(|b| map.get(*b).is_none()), "a failed write leaves nothing to verify");
    // stop: ends at the first failure
    let r = run_block(&workload(&s, 4 << 20, ErrorPolicy::Stop), map.clone()).unwrap();
    assert!(r.stopped_on_error);
    assert!(r.write.ops < (4 << 20) / 16384 - 1);
    // retry: a transient error (times: 2) is retried away; one thread, so the same request
    // fails twice and waits out both backoffs (1 ms, then 2 ms)
    s.clear();
    s.add("rules:\n  - {type: error, op: write, times: 2, target: {block: 64}}\n");
    let mut one = workload(&s, 4 << 20, ErrorPolicy::Retry(3));
    one.threads = 1;
    let r = run_block(&one, map.clone()).unwrap();
    assert_eq!(r.retries, 2);
    assert!(r.failed_ios.is_empty());
    assert!(r.retry_seconds >= 0.003);
    s.stop();
}

fn spec_on(s: &Serve, engine: faultline::workload::IoEngine, size: u64) -> faultline::workload::Workload {
    use faultline::workload::{Interface, Workload};
    let mut w = Workload::new(Interface::Block { device: s.dev.clone() });
    w.block_size = 16384;
    w.size = Some(size);
    w.span = Some(size);
    w.seed = 11;
    w.engine = engine;
    w.iodepth = 8;
    w.profile = faultline::content::profile::Profile::parse("0 300\n3 100\n", "t").unwrap();
    w
}

fn read_all(s: &Serve, len: u64) -> Vec<u8> {
    let mut buf = faultline::workload::direct::AlignedBuf::new(len as usize);
    s.open().read_at(&mut buf, 0).unwrap();
    buf.to_vec()
}

#[test]
fn psync_and_io_uring_write_identical_data() {
    use faultline::workload::{IoEngine, Maps, run};
    let s = Serve::start("32MiB", "rules: []\n");
    let size = 8 << 20;
    // 16 KiB writes fill buffers that keep their segments; 4 KiB ones go to their segment's own
    for bs in [16384, 4096] {
        let w = faultline::workload::Workload { block_size: bs, ..spec_on(&s, IoEngine::Psync, size) };
        let m1 = Maps::new(&w).unwrap();
        let r1 = run(&w, &m1, None, None).unwrap();
        let bytes1 = read_all(&s, size);
        assert!(verify_device(&s.dev, &m1.maps[0]).unwrap().is_clean(), "psync bs {bs}");
        // wipe, then the same workload through io_uring at queue depth 8
        s.open().write_at(&faultline::workload::direct::AlignedBuf::new(size as usize), 0).unwrap();
        let w2 = faultline::workload::Workload { block_size: bs, ..spec_on(&s, IoEngine::IoUring, size) };
        let m2 = Maps::new(&w2).unwrap();
        let r2 = run(&w2, &m2, None, None).unwrap();
        assert_eq!((r1.write.ops, r2.write.ops), (size / bs, size / bs));
        let bytes2 = read_all(&s, size);
        assert!(bytes1.iter().any(|b| *b != 0));
        assert!(bytes1 == bytes2, "device contents differ between psync and io_uring, bs {bs}");
        assert_eq!(m1.maps[0].written().collect::<Vec<_>>(), m2.maps[0].written().collect::<Vec<_>>());
        // the profile's duplicates are really there: fewer distinct ids than blocks
        let ids: std::collections::HashSet<u64> = m1.maps[0].written().map(|(_, id)| id).collect();
        assert!(ids.len() < (size / BS) as usize, "{} distinct of {}", ids.len(), size / BS);
        s.open().write_at(&faultline::workload::direct::AlignedBuf::new(size as usize), 0).unwrap();
    }
    s.stop();
}

/// psync at 128 KiB fills each write's bytes ahead on a filler thread, in batches: the data,
/// the content map and the observer's events must be exactly those of the plain path (io_uring
/// draws the same ops in the same order), and a stop must not let drawn-ahead writes through.
#[test]
fn psync_prefilled_writes_match_io_uring_and_stop_cleanly() {
    use faultline::workload::{IoEngine, Maps, WriteEvent, WriteObserver, run};
    use std::sync::Mutex;
    struct Rec(Mutex<Vec<(u64, u64, Vec<u64>)>>);
    impl WriteObserver for Rec {
        fn before_write(&self, ev: &WriteEvent) {
            self.0.lock().unwrap().push((ev.ops_before, ev.offset, ev.ids.to_vec()));
        }
    }
    let s = Serve::start("32MiB", "rules: []\n");
    let size = 8 << 20;
    let mixed = |engine| {
        let mut w = spec_on(&s, engine, size);
        w.block_size = 128 << 10;
        w.pattern = Pattern::Uniform;
        w.write_pct = 70;
        w.size = None;
        w.ops = Some(300);
        w
    };
    let w1 = mixed(IoEngine::Psync);
    let m1 = Maps::new(&w1).unwrap();
    let rec = Arc::new(Rec(Mutex::new(Vec::new())));
    let r1 = run(&w1, &m1, Some(rec.clone()), None).unwrap();
    assert_eq!(r1.read.ops + r1.write.ops, 300);
    assert!(r1.read.ops > 30 && r1.write.ops > 150, "{} reads, {} writes", r1.read.ops, r1.write.ops);
    let ev = rec.0.lock().unwrap();
    assert_eq!(ev.len() as u64, r1.write.ops, "one event per issued write");
    assert!(ev.windows(2).all(|p| p[0].0 < p[1].0), "events in op order");
    let bytes1 = read_all(&s, size);
    // every block's bytes are its announced content (the last write to it wins)
    let mut last = std::collections::HashMap::new();
    for (_, off, ids) in ev.iter() {
        for (i, id) in ids.iter().enumerate() {
            last.insert(off / BS + i as u64, *id);
        }
    }
    for (blk, id) in &last {
        assert_eq!(m1.maps[0].get(*blk), Some(*id), "map at block {blk}");
        let at = (*blk * BS) as usize;
        assert!(bytes1[at..at + BS as usize] == expected(*id, m1.seed)[..], "bytes of block {blk}");
    }
    drop(ev);
    // io_uring at depth 8 and at depth 1 (where the next op is staged, filled while one I/O runs)
    for depth in [8, 1] {
        s.open().write_at(&faultline::workload::direct::AlignedBuf::new(size as usize), 0).unwrap();
        let mut w2 = mixed(IoEngine::IoUring);
        w2.iodepth = depth;
        let m2 = Maps::new(&w2).unwrap();
        let rec2 = Arc::new(Rec(Mutex::new(Vec::new())));
        let r2 = run(&w2, &m2, Some(rec2.clone()), None).unwrap();
        assert_eq!((r2.read.ops, r2.write.ops), (r1.read.ops, r1.write.ops), "depth {depth}");
        assert!(read_all(&s, size) == bytes1, "device contents differ between psync (prefilled) and io_uring depth {depth}");
        assert_eq!(m1.maps[0].written().collect::<Vec<_>>(), m2.maps[0].written().collect::<Vec<_>>());
        assert_eq!(*rec2.0.lock().unwrap(), *rec.0.lock().unwrap(), "observer events, depth {depth}");
    }

    // stop policy, sequential: the third write (bytes 256-384 KiB) fails; nothing after it is issued
    s.add("rules:\n  - {type: error, op: write, target: {block: 70}}\n");
    let mut w3 = spec_on(&s, IoEngine::Psync, size);
    w3.block_size = 128 << 10;
    w3.on_error = faultline::workload::ErrorPolicy::Stop;
    let m3 = Maps::new(&w3).unwrap();
    let rec = Arc::new(Rec(Mutex::new(Vec::new())));
    let r3 = run(&w3, &m3, Some(rec.clone()), None).unwrap();
    assert!(r3.stopped_on_error);
    assert_eq!((r3.write.ops, r3.failed_ios.len()), (2, 1), "{:?}", r3.failed_ios);
    assert_eq!(r3.failed_ios[0].offset, 256 << 10);
    assert_eq!(rec.0.lock().unwrap().len(), 3, "writes announced: two done, one failed");
    assert_eq!(m3.maps[0].written().count(), 64);
    s.stop();
}

#[test]
fn observer_progress_rate_and_timeseries() {
    use faultline::workload::{IoEngine, Maps, Progress, WriteEvent, WriteObserver, run};
    use std::sync::Mutex;
    /// (written_before, ops_before, offset, ids) of each announced write
    type Announced = (u64, u64, u64, Vec<u64>);
    struct Rec(Mutex<Vec<Announced>>);
    impl WriteObserver for Rec {
        fn before_write(&self, ev: &WriteEvent) {
            self.0.lock().unwrap().push((ev.written_before, ev.ops_before, ev.offset, ev.ids.to_vec()));
        }
    }
    let s = Serve::start("32MiB", "rules: []\n");
    let mut w = spec_on(&s, IoEngine::IoUring, 4 << 20);
    w.size = None;
    w.ops = Some(100);
    w.rate_iops = Some(500);
    w.interval = std::time::Duration::from_millis(50);
    let maps = Maps::new(&w).unwrap();
    let rec = Arc::new(Rec(Mutex::new(Vec::new())));
    let prog = Progress::new();
    let r = run(&w, &maps, Some(rec.clone()), Some(&prog)).unwrap();
    let ev = rec.0.lock().unwrap();
    assert_eq!(ev.len(), 100);
    // sequential, one thread: every event describes exactly what landed where
    for (k, (wb, ob, off, ids)) in ev.iter().enumerate() {
        assert_eq!((*wb, *ob, *off), (k as u64 * 16384, k as u64, k as u64 * 16384));
        for (i, id) in ids.iter().enumerate() {
            assert_eq!(maps.maps[0].get(off / BS + i as u64), Some(*id));
        }
    }
    assert_eq!((prog.ops(), prog.bytes(), prog.errors()), (100, 100 * 16384, 0));
    // 100 ops at 500 IOPS: about 0.2 s, and not faster
    assert!(r.seconds >= 0.19 && r.seconds < 0.6, "{} s", r.seconds);
    assert!(r.timeseries.len() >= 3, "{} samples", r.timeseries.len());
    let total: f64 = r.timeseries.windows(2).map(|p| p[1].write.iops * (p[1].t - p[0].t)).sum::<f64>() + r.timeseries[0].write.iops * r.timeseries[0].t;
    assert!((total - 100.0).abs() < 1.0, "time series adds up to {total} writes");
    assert!(r.timeseries.iter().all(|x| x.rss_mib > 1.0));
    // latencies are real: above a microsecond through FUSE, ordered, and not clamped
    let l = &r.write;
    assert!(l.mean_us > 1.0 && l.p50_us > 1.0 && l.p50_us <= l.p99_us && l.p99_us <= l.max_us && l.max_us < 1e6, "{l:?}");
    assert!(r.timeseries.iter().filter(|x| x.write.iops > 0.0).all(|x| x.write.mean_us > 1.0 && x.write.p99_us >= x.write.mean_us * 0.5));
    s.stop();
}

#[test]
fn io_uring_errors_are_recorded_and_retried() {
    use faultline::workload::{ErrorPolicy, IoEngine, Maps, run};
    let s = Serve::start("32MiB", "rules:\n  - {type: error, op: write, target: {block: 64}}\n");
    let mut w = spec_on(&s, IoEngine::IoUring, 4 << 20);
    w.on_error = ErrorPolicy::Continue;
    let maps = Maps::new(&w).unwrap();
    let r = run(&w, &maps, None, None).unwrap();
    // the block layer may merge adjacent in-flight writes into one request; an error on it fails
    // every merged write, and each is recorded: a contiguous run around block 64, at most iodepth
    let f = &r.failed_ios;
    assert!(!f.is_empty() && f.len() <= 8, "{f:?}");
    assert!(f.iter().all(|e| e.op == "write" && e.errno == libc::EIO && e.len == 16384));
    assert!(f.windows(2).all(|p| p[1].offset == p[0].offset + 16384), "{f:?}");
    assert!(f[0].offset <= 64 * BS && 64 * BS < f.last().unwrap().offset + 16384, "{f:?}");
    assert_eq!(r.write.ops + f.len() as u64, (4 << 20) / 16384);
    assert_eq!(r.errors.get("write:EIO"), Some(&(f.len() as u64)));
    for b in 0..(4 << 20) / BS {
        let failed = f.iter().any(|e| b * BS >= e.offset && b * BS < e.offset + e.len);
        assert_eq!(maps.maps[0].get(b).is_none(), failed, "block {b}");
    }
    // a transient error (times: 2) is retried away synchronously
    s.clear();
    s.add("rules:\n  - {type: error, op: write, times: 2, target: {block: 64}}\n");
    w.on_error = ErrorPolicy::Retry(3);
    let maps = Maps::new(&w).unwrap();
    let r = run(&w, &maps, None, None).unwrap();
    assert!(r.failed_ios.is_empty(), "{:?}", r.failed_ios);
    // block 64's write fails twice; writes merged with its first attempt are retried once
    assert!(r.retries >= 2 && r.retries <= 9, "{} retries", r.retries);
    assert_eq!(r.write.ops, (4 << 20) / 16384);
    assert!(maps.maps[0].get(64).is_some());
    // stop: in-flight I/Os finish, nothing new is issued once the failure is seen. Writes
    // after the failing one are held 50 ms, so none of them completes (and is refilled)
    // before the failure is reaped (io_uring may punt a write to its workers, and the device
    // completes out of order: without the delay later writes could finish first and refill)
    s.clear();
    s.add("rules:\n  - {type: error, op: write, target: {block: 64}}\n  - {type: delay, delay: 50ms, op: write, target: {block: 68, count: 956}}\n");
    w.on_error = ErrorPolicy::Stop;
    let r = run(&w, &Maps::new(&w).unwrap(), None, None).unwrap();
    assert!(r.stopped_on_error);
    assert!(r.write.ops < 16 + 8, "{} writes after a failure at write 16 with 8 in flight", r.write.ops);
    s.stop();
}

#[test]
fn io_uring_never_has_two_writes_to_one_block_in_flight() {
    use faultline::workload::pattern::Pattern;
    use faultline::workload::{IoEngine, Maps, run};
    // 16 blocks, 32 in flight, random: without serializing overlaps the device and the map
    // disagree about which of two concurrent writes a block holds
    let s = Serve::start("32MiB", "rules: []\n");
    let mut w = spec_on(&s, IoEngine::IoUring, 128 << 10);
    w.block_size = 4096;
    w.pattern = Pattern::Uniform;
    w.iodepth = 32;
    w.threads = 2;
    w.size = None;
    w.ops = Some(60_000);
    for _ in 0..3 {
        let maps = Maps::new(&w).unwrap();
        let r = run(&w, &maps, None, None).unwrap();
        assert_eq!(r.write.ops, 60_000);
        let rep = faultline::verify::verify(&maps).unwrap();
        assert!(rep.is_clean() && rep.counts.checked == 32, "{rep:?}");
    }
    s.stop();
}

/// Engine buffers keep the pool segments their blocks hold so a write of the next sequential
/// ids rewrites only the stamps; a read into a buffer must make the next write there fill in
/// full. Mixed 128 KiB reads and writes (psync's fill-ahead batches, io_uring's staged slots)
/// must leave exactly the mapped content on the device.
#[test]
fn reads_into_reused_buffers_do_not_leak_into_writes() {
    use faultline::workload::{IoEngine, Maps, run};
    let s = Serve::start("64MiB", "rules: []\n");
    // at 4 KiB both engines write each block in its pool segment's own buffer, where reads
    // must not land (psync) or land only in spares (io_uring)
    for (engine, depth, bs) in [
        (IoEngine::Psync, 1, 128 << 10),
        (IoEngine::Psync, 1, 4096),
        (IoEngine::IoUring, 1, 128 << 10),
        (IoEngine::IoUring, 4, 128 << 10),
        (IoEngine::IoUring, 1, 4096),
        (IoEngine::IoUring, 8, 4096),
    ] {
        let mut w = spec_on(&s, engine, if bs == 4096 { 16 << 20 } else { 48 << 20 });
        w.block_size = bs;
        w.span = Some(8 << 20);
        w.iodepth = depth;
        w.write_pct = 50;
        w.pattern = Pattern::Sequential;
        w.profile = faultline::content::profile::Profile::none();
        let m = Maps::new(&w).unwrap();
        let r = run(&w, &m, None, None).unwrap();
        assert!(r.read.ops > 50 && r.write.ops > 50, "{engine:?}: {} reads, {} writes", r.read.ops, r.write.ops);
        let rep = verify_device(&s.dev, &m.maps[0]).unwrap();
        let written = m.maps[0].written().count() as u64;
        assert!(rep.is_clean() && rep.counts.checked == written && written > 1000, "{engine:?} qd{depth} bs {bs}: {rep:?}");
    }
    s.stop();
}
