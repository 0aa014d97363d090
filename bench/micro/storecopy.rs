//! A 128 KiB write into the RAM store, as the ring front end makes it (a lent payload, hot in the
//! cache as after the kernel's copy into it): µs per write with nothing to hash and with every
//! 4 KiB block hashed (content rules), median over a sequential pass through 512 MiB of a
//! populated store. Then the whole write path (`Disk::write_then_copied`: plan, store, content
//! lookups) of two disks side by side, one without rules and one with the device bench's 100k
//! never-matching rules (50k content rules for writes, 50k offset rules for reads), interleaved
//! write by write in alternating order. Run it from two builds to compare copy paths.
//! `cargo bench --bench storecopy`
use faultline::disk::store::{Hashed, Lent, RamStore, Src, Store};
use faultline::disk::{Disk, DiskConfig};
use faultline::spec::rule::{Action, FlipAt, Op, Rule, Target};
use std::time::Instant;

const W: usize = 128 << 10;
const REGION: u64 = 512 << 20;

/// The kernel's copy into the payload leaves it in the cache.
fn touch(payload: &mut [u8]) {
    for c in payload.chunks_mut(64) {
        c[0] = c[0].wrapping_add(1);
    }
}

fn median(mut t: Vec<f64>) -> f64 {
    t.sort_by(f64::total_cmp);
    t[t.len() / 2]
}

fn main() {
    let store = RamStore::new(REGION).unwrap();
    store.populate().unwrap();
    let mut payload: Vec<u8> = (0..W).map(|i| (i * 31 % 251) as u8).collect();
    for round in 0..3 {
        let mut line = format!("round {round}:");
        for hashed in [None, Some(Hashed { bs: 4096, start: 0, blocks: W / 4096 })] {
            let mut t = Vec::new();
            for off in (0..REGION).step_by(W) {
                touch(&mut payload);
                let t0 = Instant::now();
                let r = store.write_locked(off, Src::Lent(Lent::new(&mut payload, W)), hashed, &mut |_| {}, &mut |h, _| {
                    std::hint::black_box(h);
                });
                t.push(t0.elapsed().as_secs_f64() * 1e6);
                assert!(r.is_ok(), "the RAM store takes every in-range write");
            }
            line += &format!(" {}={:.2}us", if hashed.is_some() { "hashed" } else { "copy" }, median(t));
        }
        println!("{line} (median per 128 KiB write)");
    }
    drop(store);

    let cfg = DiskConfig { size: Some(REGION), populate: Some(true), ..Default::default() };
    let disks = [Disk::open(&cfg).unwrap(), Disk::open(&cfg).unwrap()];
    // the rules of bench/gen-rules.py: random hashes, offset rules beyond the written range
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut rules = Vec::new();
    for i in 0..50_000u64 {
        let hash = (u128::from(next()) << 64) | u128::from(next());
        rules.push(Rule::new(Action::Bitflip { at: FlipAt::default() }, &[Op::Write], Target::Content { hash }));
        let start = (131072 + i) * 4096;
        rules.push(Rule::new(Action::Error { errno: libc::EIO }, &[Op::Read], Target::Range { start, end: start + 4096 }));
    }
    disks[1].arm(rules).unwrap();
    // the content lookups alone: 32 fresh hashes per write (as from new data), after a 128 KiB
    // copy has gone through the cache
    for round in 0..3 {
        let mut t = Vec::new();
        for n in 0..20_000u64 {
            touch(&mut payload);
            let hashes: Vec<u128> = (0..W / 4096).map(|_| (u128::from(next()) << 64) | u128::from(next())).collect();
            let t0 = Instant::now();
            let mut p = disks[1].engine().begin(Op::Write, n % 4096 * W as u64, W as u64);
            p.match_hashes(&hashes);
            t.push(t0.elapsed().as_secs_f64() * 1e6);
            assert!(p.plan.is_clean());
        }
        println!("round {round}: begin + 32 content lookups, 100k rules={:.3}us (median per 128 KiB write)", median(t));
    }
    for round in 0..3 {
        let mut t = [Vec::new(), Vec::new()];
        for (n, off) in (0..REGION).step_by(W).enumerate() {
            for k in [n % 2, 1 - n % 2] {
                touch(&mut payload);
                let t0 = Instant::now();
                disks[k].write_then_copied(off, Lent::new(&mut payload, W), |o, _| assert!(o.errno.is_none() && o.delay.is_none()));
                t[k].push(t0.elapsed().as_secs_f64() * 1e6);
            }
        }
        let d = t.iter().map(|v| v.iter().copied().sum::<f64>() / v.len() as f64).collect::<Vec<_>>();
        let [a, b] = t.map(median);
        println!("round {round}: disk write no rules={a:.2}us 100k rules={b:.2}us (+{:.2}; means {:.2} / {:.2}) (median per 128 KiB write)", b - a, d[0], d[1]);
    }
}
