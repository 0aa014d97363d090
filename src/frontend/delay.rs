//! Late replies. A delayed request is executed at once and its reply handed here, so the FUSE
//! threads keep serving other requests. One thread sends each reply at its due time through a
//! `sys::timer::TimerQueue` (sleep, then a short spin with 1 ns timer slack: a sleep alone
//! overshoots, ../shared/docs/FUSE-NOTES.md).

use crate::sys::timer::TimerQueue;
use std::sync::Arc;
use std::time::Instant;

type Job = Box<dyn FnOnce() + Send>;

pub struct Delayer {
    queue: Arc<TimerQueue<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Delayer {
    pub fn new() -> Delayer {
        let queue = Arc::new(TimerQueue::new());
        let q = queue.clone();
        let thread = std::thread::Builder::new().name("faultline-delay".into()).spawn(move || q.run(|job: Job| job())).expect("spawn delay thread");
        Delayer { queue, thread: Some(thread) }
    }

    /// Run `job` once `at` has passed.
    pub fn at(&self, at: Instant, job: Job) {
        self.queue.push(at, job);
    }
}

impl Default for Delayer {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Delayer {
    /// Pending replies are still sent (late, as asked) before the thread ends.
    fn drop(&mut self) {
        self.queue.finish();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::time::Duration;

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
