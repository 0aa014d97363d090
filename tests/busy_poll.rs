//! `serve --busy-poll` on the real device: the daemon polls between serial requests (it uses
//! more CPU than with polling off for the same serial I/O, and the data is intact), and it
//! stops once the disk goes idle. Alone in its test binary: it reads the daemon's CPU time.

mod common;
use common::*;
use std::time::{Duration, Instant};

/// The daemon's CPU time (user + system) in clock ticks, from /proc/PID/stat.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // fields after the parenthesised command name; utime and stime are fields 14 and 15
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// Serial 4 KiB reads, alternating between the two disks and checking each block, for 1.5 s
/// and until the two daemons have used 20 ticks (at most 10 s: a loaded machine gives a slow
/// client); returns each daemon's CPU ticks used. Both see the same requests at the same
/// moments, so the load of the rest of the machine weighs on both alike.
fn serial_reads(a: &Serve, b: &Serve) -> (u64, u64) {
    let (da, db) = (a.open(), b.open());
    write_blocks(&da, 0, 256, 5, |b| b);
    write_blocks(&db, 0, 256, 5, |b| b);
    let before = (cpu_ticks(a.pid()), cpu_ticks(b.pid()));
    let used = || (cpu_ticks(a.pid()) - before.0, cpu_ticks(b.pid()) - before.1);
    let t = Instant::now();
    loop {
        for blk in 0..256 {
            assert_eq!(read_block(&da, blk).unwrap(), expected(blk, 5), "block {blk}");
            assert_eq!(read_block(&db, blk).unwrap(), expected(blk, 5), "block {blk}");
        }
        let (ua, ub) = used();
        if (t.elapsed().as_secs_f64() >= 1.5 && ua + ub >= 20) || t.elapsed().as_secs() >= 10 {
            return (ua, ub);
        }
    }
}

#[test]
fn polls_between_serial_requests_and_stops_when_idle() {
    let off = Serve::start_args(&["--size", "64MiB", "--busy-poll", "0"], "rules: []\n");
    let on = Serve::start_args(&["--size", "64MiB"], "rules: []\n"); // default 50us
    let (ticks_off, ticks_on) = serial_reads(&off, &on);
    off.stop();
    eprintln!("daemon CPU ticks over the same serial reads: {ticks_off} polling off, {ticks_on} on");
    // polling fills the daemon's idle gaps between its requests (here: while the other disk
    // serves one) with (yielding) polls
    assert!(ticks_on as f64 > 1.5 * ticks_off as f64, "no sign of polling: {ticks_on} ticks with, {ticks_off} without");

    // idle: the poll gives up after one budget, so the daemon sleeps
    std::thread::sleep(Duration::from_millis(200));
    let before = cpu_ticks(on.pid());
    std::thread::sleep(Duration::from_secs(1));
    let idle = cpu_ticks(on.pid()) - before;
    assert!(idle <= 3, "an idle disk used {idle} ticks of CPU in 1 s: still polling");
    on.stop();
}
