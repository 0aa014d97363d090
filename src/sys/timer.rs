//! Precise deadlines on one thread: the disk's late replies (frontend/delay.rs; the network
//! relay keeps its own heap in its event loop but the same `SPIN`). The thread running
//! `TimerQueue::run` sleeps on a condvar until `SPIN` before the earliest deadline, then spin-waits: a sleep
//! alone overshoots, mostly by the default 50 µs timer slack, which that thread sets to 1 ns.
//! Spinning is kept short because on a small machine a spinning thread takes a CPU from the
//! I/O path it is timing. A push during the spin is noticed (it may be earlier).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

/// How long before a deadline the timer thread stops sleeping and spins.
pub const SPIN: Duration = Duration::from_micros(40);

/// Something due at `at`; `seq` keeps equal deadlines in arrival order. Earliest first in a
/// `BinaryHeap<Reverse<Timed<T>>>` (here and in the ring thread's own timers, frontend/uring/).
pub struct Timed<T> {
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

struct Pending<T> {
    heap: BinaryHeap<Reverse<Timed<T>>>,
    /// `finish` was called: end once nothing is pending.
    finishing: bool,
}

/// Items due at given instants, handed one by one to the thread in `run` when due.
pub struct TimerQueue<T> {
    pending: Mutex<Pending<T>>,
    cv: Condvar,
    /// Bumped on every push so a spinning waiter notices an earlier deadline.
    pushes: AtomicU64,
    /// `stop` was called: end now, dropping what is pending.
    stopped: AtomicBool,
}

impl<T> Default for TimerQueue<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> TimerQueue<T> {
    pub fn new() -> TimerQueue<T> {
        TimerQueue {
            pending: Mutex::new(Pending { heap: BinaryHeap::new(), finishing: false }),
            cv: Condvar::new(),
            pushes: AtomicU64::new(0),
            stopped: AtomicBool::new(false),
        }
    }

    /// Queue `item` for `at`.
    pub fn push(&self, at: Instant, item: T) {
        self.push_bounded(at, usize::MAX, || item);
    }

    /// Queue `make()` for `at` unless `max` items are pending already (then `make` is not
    /// called); returns whether it was queued. `make` runs under the queue's lock.
    pub fn push_bounded(&self, at: Instant, max: usize, make: impl FnOnce() -> T) -> bool {
        let mut g = self.pending.lock().unwrap();
        if g.heap.len() >= max {
            return false;
        }
        let seq = self.pushes.fetch_add(1, Ordering::Release);
        g.heap.push(Reverse(Timed { at, seq, item: make() }));
        drop(g);
        self.cv.notify_one();
        true
    }

    /// `run` returns once everything pending has been handed out (late, as asked).
    pub fn finish(&self) {
        self.pending.lock().unwrap().finishing = true;
        self.cv.notify_all();
    }

    /// `run` returns at once; pending items are dropped with the queue.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        // under the lock, so a `run` between its check and its wait cannot miss the wake-up
        let _g = self.pending.lock().unwrap();
        self.cv.notify_all();
    }

    /// The timer thread's loop: hands every item to `fire` once its deadline has passed, in
    /// deadline order (outside the lock, so pushes go on meanwhile), until `finish` or `stop`.
    /// Sets the calling thread's timer slack to 1 ns.
    pub fn run(&self, mut fire: impl FnMut(T)) {
        // the default 50 µs timer slack is most of a timer's overshoot; ask for precise wakeups
        // SAFETY: PR_SET_TIMERSLACK takes a value, no pointer; it affects this thread only
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1u64) };
        let mut due = Vec::new();
        let mut g = self.pending.lock().unwrap();
        while !self.stopped.load(Ordering::Acquire) {
            let now = Instant::now();
            while g.heap.peek().is_some_and(|Reverse(t)| t.at <= now) {
                due.push(g.heap.pop().unwrap().0.item);
            }
            if !due.is_empty() {
                drop(g);
                due.drain(..).for_each(&mut fire);
                g = self.pending.lock().unwrap();
                continue;
            }
            if g.finishing && g.heap.is_empty() {
                return;
            }
            match g.heap.peek().map(|Reverse(t)| t.at) {
                None => g = self.cv.wait(g).unwrap(),
                Some(at) if at - now > SPIN => g = self.cv.wait_timeout(g, at - now - SPIN).unwrap().0,
                Some(at) => {
                    let seen = self.pushes.load(Ordering::Acquire);
                    drop(g);
                    while Instant::now() < at && self.pushes.load(Ordering::Acquire) == seen && !self.stopped.load(Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                    g = self.pending.lock().unwrap();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn fires_in_deadline_order_then_finishes() {
        let q = Arc::new(TimerQueue::new());
        let t0 = Instant::now();
        for ms in [30u64, 10, 20, 10] {
            q.push(t0 + Duration::from_millis(ms), ms);
        }
        q.finish();
        let mut got = Vec::new();
        q.run(|ms| got.push((ms, Instant::now())));
        assert_eq!(got.iter().map(|g| g.0).collect::<Vec<_>>(), vec![10, 10, 20, 30]);
        for (ms, at) in got {
            assert!(at >= t0 + Duration::from_millis(ms), "{ms} ms item fired early");
        }
    }

    #[test]
    fn bounded_push_refuses_beyond_max_and_stop_drops_pending() {
        let q = Arc::new(TimerQueue::new());
        let far = Instant::now() + Duration::from_secs(3600);
        assert!(q.push_bounded(far, 2, || 1));
        assert!(q.push_bounded(far, 2, || 2));
        assert!(!q.push_bounded(far, 2, || unreachable!("not made when full")));
        let q2 = q.clone();
        let t = std::thread::spawn(move || {
            let mut n = 0;
            q2.run(|_| n += 1);
            n
        });
        std::thread::sleep(Duration::from_millis(20));
        q.stop();
        assert_eq!(t.join().unwrap(), 0, "stop hands out nothing that was not due");
    }
}
