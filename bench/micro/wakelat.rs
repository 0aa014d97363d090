//! Wake-up latency of a thread blocked on a pipe read, woken by a write from another thread:
//! p50 and p90 of 200 wake-ups. `cargo bench --bench wakelat`
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
fn main() {
    // wake-up latency of a thread blocked on a pipe read, woken by a write from another thread
    let mut fds = [0i32; 2];
    // SAFETY: `fds` has room for the two fds pipe() writes
    unsafe { libc::pipe(fds.as_mut_ptr()) };
    let (r, w) = (fds[0], fds[1]);
    let sent = Arc::new(Mutex::new(Instant::now()));
    let s2 = sent.clone();
    let h = std::thread::spawn(move || {
        let mut v = vec![];
        for _ in 0..200 {
            let mut b = [0u8; 1];
            // SAFETY: reads at most 1 byte into the 1-byte `b`
            unsafe { libc::read(r, b.as_mut_ptr() as *mut _, 1) };
            let now = Instant::now();
            v.push((now - *s2.lock().unwrap()).as_nanos() as f64 / 1000.0);
        }
        v
    });
    for _ in 0..200 {
        std::thread::sleep(Duration::from_micros(300));
        *sent.lock().unwrap() = Instant::now();
        // SAFETY: writes 1 byte from a 1-byte array
        unsafe { libc::write(w, [1u8].as_ptr() as *const _, 1) };
    }
    let mut v = h.join().unwrap();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!("pipe wake latency p50 {:.1}us p90 {:.1}us", v[100], v[180]);
    let _ = (Condvar::new(),);
}
