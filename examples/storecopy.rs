//! A 128 KiB write into the RAM store, as the ring front end makes it (a lent payload, hot in the
//! cache as after the kernel's copy into it): µs per write with nothing to hash and with every
//! 4 KiB block hashed (content rules), median over a sequential pass through 512 MiB of a
//! populated store. Run it from two builds to compare copy paths.
use faultline::disk::store::{Hashed, Lent, RamStore, Src, Store};
use std::time::Instant;

fn main() {
    const W: usize = 128 << 10;
    const REGION: u64 = 512 << 20;
    let store = RamStore::new(REGION).unwrap();
    store.populate().unwrap();
    let mut payload: Vec<u8> = (0..W).map(|i| (i * 31 % 251) as u8).collect();
    for round in 0..3 {
        let mut line = format!("round {round}:");
        for hashed in [None, Some(Hashed { bs: 4096, start: 0, blocks: W / 4096 })] {
            let mut t = Vec::new();
            for off in (0..REGION).step_by(W) {
                // the kernel's copy into the payload leaves it in the cache
                for c in payload.chunks_mut(64) {
                    c[0] = c[0].wrapping_add(1);
                }
                let t0 = Instant::now();
                let r = store.write_locked(off, Src::Lent(Lent::new(&mut payload, W)), hashed, &mut |_| {}, &mut |h, _| {
                    std::hint::black_box(h);
                });
                t.push(t0.elapsed().as_secs_f64() * 1e6);
                assert!(r.is_ok(), "the RAM store takes every in-range write");
            }
            t.sort_by(f64::total_cmp);
            line += &format!(" {}={:.2}us", if hashed.is_some() { "hashed" } else { "copy" }, t[t.len() / 2]);
        }
        println!("{line} (median per 128 KiB write)");
    }
}
