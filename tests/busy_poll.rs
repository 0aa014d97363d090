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

/// Serial 4 KiB reads for `secs`, checking each block; returns the daemon's CPU ticks used.
fn serial_reads(s: &Serve, secs: f64) -> u64 {
    let d = s.open();
    write_blocks(&d, 0, 256, 5, |b| b);
    let before = cpu_ticks(s.pid());
    let t = Instant::now();
    let mut b = 0;
    while t.elapsed().as_secs_f64() < secs {
        assert_eq!(read_block(&d, b).unwrap(), expected(b, 5), "block {b}");
        b = (b + 1) % 256;
    }
    cpu_ticks(s.pid()) - before
}

#[test]
fn polls_between_serial_requests_and_stops_when_idle() {
    let off = Serve::start_args(&["--size", "64MiB", "--busy-poll", "0"], "rules: []\n");
    let ticks_off = serial_reads(&off, 1.5);
    off.stop();

    let on = Serve::start_args(&["--size", "64MiB"], "rules: []\n"); // default 50us
    let ticks_on = serial_reads(&on, 1.5);
    eprintln!("daemon CPU ticks over 1.5 s of serial reads: {ticks_off} polling off, {ticks_on} on");
    // polling fills the daemon's idle gaps between requests with (yielding) polls
    assert!(ticks_on as f64 > 1.5 * ticks_off as f64, "no sign of polling: {ticks_on} ticks with, {ticks_off} without");

    // idle: the poll gives up after one budget, so the daemon sleeps
    std::thread::sleep(Duration::from_millis(200));
    let before = cpu_ticks(on.pid());
    std::thread::sleep(Duration::from_secs(1));
    let idle = cpu_ticks(on.pid()) - before;
    assert!(idle <= 3, "an idle disk used {idle} ticks of CPU in 1 s: still polling");
    on.stop();
}
