//! How late the disk's late replies go out (`frontend::delay::Delayer`, on the `sys::timer`
//! queue): median and max lateness of 50 replies at each of 50 µs, 200 µs, 1 ms and 5 ms.
//! `cargo bench --bench delaylat`
use faultline::frontend::delay::Delayer;
use std::time::{Duration, Instant};
fn main() {
    let d = Delayer::new();
    for us in [50u64, 200, 1000, 5000] {
        let mut late = vec![];
        for _ in 0..50 {
            let (tx, rx) = std::sync::mpsc::channel();
            let at = Instant::now() + Duration::from_micros(us);
            d.at(at, Box::new(move || tx.send(Instant::now()).unwrap()));
            let got = rx.recv().unwrap();
            late.push((got - at).as_micros());
        }
        late.sort();
        println!("{us}us: late median {}us max {}us", late[25], late[49]);
    }
}
