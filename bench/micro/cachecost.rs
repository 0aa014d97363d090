//! What the volatile write cache (disk::cache, docs/crash.md) costs a write inside the daemon,
//! without FUSE or the kernel: two 1 GiB RAM disks, `write_cache: none` and `volatile` (bound
//! 256 MiB), their first 512 MiB written with non-zero bytes and flushed (every undo copy is
//! real bytes, as in bench/crash.sh), then the whole write path (`Disk::write_then_copied`, a
//! lent payload as from the ring front end) at 4 KiB sequential, 128 KiB sequential and 4 KiB
//! random, the two disks in turns of 4096 writes (order swapped every turn) over 4 passes of
//! the 512 MiB: µs per write (mean, drains included: throughput), the worst write (a drain),
//! and the difference. Then the pieces an undo copy can cost, alone: a copy of the old bytes
//! into a fresh `Box<[u8]>` per write, the 65,536 copies freed as a drain frees them, against
//! a copy into a reused ring. `cargo bench --bench cachecost`
use faultline::disk::store::Lent;
use faultline::disk::{Disk, DiskConfig};
use faultline::spec::disk::CacheMode;
use std::time::Instant;

const REGION: u64 = 512 << 20;
const TURN: usize = 4096;

fn disk(mode: CacheMode) -> Disk {
    let cfg = DiskConfig { size: Some(1 << 30), write_cache: mode, write_cache_size: 256 << 20, ..Default::default() };
    let d = Disk::open(&cfg).unwrap();
    let fill: Vec<u8> = (0..1usize << 20).map(|i| (i % 251) as u8 | 1).collect();
    for off in (0..REGION).step_by(1 << 20) {
        assert!(d.write(off, &fill).errno.is_none());
    }
    assert!(d.flush().errno.is_none());
    d
}

fn main() {
    let disks = [disk(CacheMode::None), disk(CacheMode::Volatile)];
    let mut payload = vec![7u8; 128 << 10];
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for (name, bs, random) in [("w4k", 4096usize, false), ("w128k", 128 << 10, false), ("rw4k", 4096, true)] {
        let n = (REGION as usize / bs) * 4;
        let (mut total, mut worst) = ([0f64; 2], [0f64; 2]);
        let mut at = [0u64; 2];
        let mut turn = 0usize;
        let mut done = 0usize;
        while done < n {
            for k in 0..2 {
                let d = (k + turn) % 2;
                let t0 = Instant::now();
                for _ in 0..TURN.min(n - done) {
                    let off = if random {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x % (REGION / bs as u64) * bs as u64
                    } else {
                        let o = at[d];
                        at[d] = (at[d] + bs as u64) % REGION;
                        o
                    };
                    payload[0] = payload[0].wrapping_add(1);
                    let w0 = Instant::now();
                    disks[d].write_then_copied(off, Lent::new(&mut payload, bs), |o, _| assert!(o.errno.is_none()));
                    worst[d] = worst[d].max(w0.elapsed().as_secs_f64() * 1e6);
                }
                total[d] += t0.elapsed().as_secs_f64();
            }
            done += TURN.min(n - done);
            turn += 1;
        }
        let us = |d: usize| total[d] * 1e6 / n as f64;
        let st = disks[1].cache().stats();
        println!(
            "{name}: none {:.2} us/write, volatile {:.2} us/write (+{:.2} us, {:.0}%); worst write none {:.0} us, volatile {:.0} us; drains so far {}",
            us(0),
            us(1),
            us(1) - us(0),
            (us(1) / us(0) - 1.0) * 100.0,
            worst[0],
            worst[1],
            st.drains
        );
    }

    // the pieces alone, over the disks' 512 MiB pattern (cold in the CPU cache, as the store)
    let src: Vec<u8> = (0..REGION as usize).map(|i| (i % 251) as u8 | 1).collect();
    for bs in [4096usize, 128 << 10] {
        let per = (256usize << 20) / bs;
        for round in 0..2 {
            let mut held: Vec<Box<[u8]>> = Vec::with_capacity(per);
            let t0 = Instant::now();
            for i in 0..per {
                let at = (i * bs) % (REGION as usize - bs);
                held.push(src[at..at + bs].into());
            }
            let boxed = t0.elapsed().as_secs_f64() * 1e6 / per as f64;
            let t1 = Instant::now();
            drop(held);
            let freed = t1.elapsed().as_secs_f64() * 1e3;
            let mut ring = vec![0u8; 256 << 20];
            for round2 in 0..2 {
                let t2 = Instant::now();
                for i in 0..per {
                    let at = (i * bs) % (REGION as usize - bs);
                    ring[i * bs..(i + 1) * bs].copy_from_slice(&src[at..at + bs]);
                }
                if round2 == 1 {
                    println!(
                        "undo copy {} KiB (round {round}): into a fresh Box {boxed:.2} us, into a reused ring {:.2} us; freeing {per} boxes {freed:.1} ms",
                        bs >> 10,
                        t2.elapsed().as_secs_f64() * 1e6 / per as f64
                    );
                }
            }
            std::hint::black_box(&ring);
        }
    }
}
