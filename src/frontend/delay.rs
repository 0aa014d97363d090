//! Late replies. A delayed request is executed at once and its reply handed here, so the FUSE
//! threads keep serving other requests. One thread sleeps on a condvar until `SPIN` before the
//! earliest deadline, then spin-waits: a sleep alone overshoots (../shared/docs/FUSE-NOTES.md),
//! mostly by the default 50 µs timer slack, which this thread sets to 1 ns. Spinning is kept
//! short because on a small machine a spinning thread takes a CPU from the I/O path it is timing.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

type Job = Box<dyn FnOnce() + Send>;

pub(super) const SPIN: Duration = Duration::from_micros(40);

/// Something due at `at`; `seq` keeps equal deadlines in arrival order. Earliest first in a
/// `BinaryHeap<Reverse<Timed<T>>>` (here and in the ring thread's own timers, uring/).
pub(super) struct Timed<T> {
    pub at: Instant,
    pub seq: u64,
    pub item: T,
}
impl<T> PartialEq for Timed<T> {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl<T> Eq for Timed<T> {}
impl<T> PartialOrd for Timed<T> {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl<T> Ord for Timed<T> {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}

struct Shared {
    heap: Mutex<(BinaryHeap<Reverse<Timed<Job>>>, bool)>,
    cv: Condvar,
    /// Bumped on every push so a spinning waiter notices an earlier deadline.
    pushes: AtomicU64,
}

pub struct Delayer {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Delayer {
    pub fn new() -> Delayer {
        let shared = Arc::new(Shared { heap: Mutex::new((BinaryHeap::new(), false)), cv: Condvar::new(), pushes: AtomicU64::new(0) });
        let s = shared.clone();
        let thread = std::thread::Builder::new().name("faultline-delay".into()).spawn(move || run(&s)).expect("spawn delay thread");
        Delayer { shared, thread: Some(thread) }
    }

    /// Run `job` once `at` has passed.
    pub fn at(&self, at: Instant, job: Job) {
        let mut g = self.shared.heap.lock().unwrap();
        let seq = self.shared.pushes.fetch_add(1, Ordering::Release);
        g.0.push(Reverse(Timed { at, seq, item: job }));
        drop(g);
        self.shared.cv.notify_one();
    }
}

impl Default for Delayer {
    fn default() -> Self {
        Self::new()
    }
}

fn run(s: &Shared) {
    // the default 50 µs timer slack is most of a timer's overshoot; ask for precise wakeups
    // SAFETY: PR_SET_TIMERSLACK takes a value, no pointer; it affects this thread only
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1u64) };
    let mut g = s.heap.lock().unwrap();
    loop {
        let now = Instant::now();
        // everything due: run outside the lock
        let mut due = Vec::new();
        while g.0.peek().is_some_and(|Reverse(i)| i.at <= now) {
            due.push(g.0.pop().unwrap().0.item);
        }
        if !due.is_empty() {
            drop(g);
            for j in due {
                j();
            }
            g = s.heap.lock().unwrap();
            continue;
        }
        if g.1 && g.0.is_empty() {
            return;
        }
        match g.0.peek().map(|Reverse(i)| i.at) {
            None => g = s.cv.wait(g).unwrap(),
            Some(at) if at - now > SPIN => g = s.cv.wait_timeout(g, at - now - SPIN).unwrap().0,
            Some(at) => {
                let seen = s.pushes.load(Ordering::Acquire);
                drop(g);
                while Instant::now() < at && s.pushes.load(Ordering::Acquire) == seen {
                    std::hint::spin_loop();
                }
                g = s.heap.lock().unwrap();
            }
        }
    }
}

impl Drop for Delayer {
    /// Pending replies are still sent (late, as asked) before the thread ends.
    fn drop(&mut self) {
        self.shared.heap.lock().unwrap().1 = true;
        self.shared.cv.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn fires_in_order_and_on_time() {
        let d = Delayer::new();
        let (tx, rx) = mpsc::channel();
        let t0 = Instant::now();
        for ms in [30u64, 10, 20] {
            let tx = tx.clone();
            d.at(t0 + Duration::from_millis(ms), Box::new(move || tx.send((ms, Instant::now())).unwrap()));
        }
        let got: Vec<(u64, Instant)> = (0..3).map(|_| rx.recv().unwrap()).collect();
        assert_eq!(got.iter().map(|g| g.0).collect::<Vec<_>>(), vec![10, 20, 30]);
        for (ms, at) in got {
            assert!(at >= t0 + Duration::from_millis(ms));
        }
    }
}
