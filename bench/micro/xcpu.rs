//! Cross-CPU cache-line round trip: two threads pinned to two CPUs (the first two this process
//! may run on, or `xcpu A B`) hand one cache line back and forth; prints the median of 5 runs
//! in ns per round trip. On a VM it shows where the host placed the two vCPUs: tens of ns when
//! they share a cache, several hundred when they do not, and that decides how fast any
//! request that crosses CPUs is served (BENCHMARKS.md). The benches record it each round.
//! `cargo bench --bench xcpu`
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::time::Instant;

const TRIPS: u64 = 20_000;

/// The line handed over, alone in its cache line.
#[repr(align(64))]
struct Line(AtomicU64);
static LINE: Line = Line(AtomicU64::new(0));

fn pin(cpu: usize) {
    let mut set = nix::sched::CpuSet::new();
    if set.set(cpu).is_ok() {
        let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set);
    }
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (a, b) = if args.len() == 2 {
        (args[0], args[1])
    } else {
        let set = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).expect("sched_getaffinity");
        let mut cpus = (0..nix::sched::CpuSet::count()).filter(|&c| set.is_set(c).unwrap_or(false));
        match (cpus.next(), cpus.next()) {
            (Some(a), Some(b)) => (a, b),
            _ => {
                eprintln!("xcpu: needs two CPUs to run on");
                std::process::exit(2);
            }
        }
    };
    pin(a);
    let mut runs: Vec<f64> = (0..5)
        .map(|_| {
            let line = &LINE.0;
            line.store(0, Release);
            let h = std::thread::spawn(move || {
                pin(b);
                for i in 0..=TRIPS {
                    // no spin_loop hint: a PAUSE would add its own delay to every hand-over measured
                    while LINE.0.load(Acquire) != 2 * i + 1 {}
                    LINE.0.store(2 * i + 2, Release);
                }
            });
            // the first trip waits for the other thread to start and move to its CPU
            line.store(1, Release);
            while line.load(Acquire) != 2 {}
            let t = Instant::now();
            for i in 1..=TRIPS {
                line.store(2 * i + 1, Release);
                while line.load(Acquire) != 2 * i + 2 {}
            }
            let ns = t.elapsed().as_nanos() as f64 / TRIPS as f64;
            h.join().expect("the other thread");
            ns
        })
        .collect();
    runs.sort_by(|x, y| x.total_cmp(y));
    println!("{:.0}", runs[2]);
}
