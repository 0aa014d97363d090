//! Busy polling of /dev/fuse after a request, so the next request does not pay a sleep and a
//! wake-up. At queue depth 1 the daemon is idle for a short gap between its reply and the next
//! request; a blocking read sleeps there, and waking it (an IPI and the idle CPU's exit, a VM
//! exit in a guest) is a large part of the round trip. fuser owns the read loop, so the
//! poll happens at the end of our own read/write handlers: `poll(2)` (timeout 0) the session's
//! /dev/fuse, yielding between polls, until a request is pending or the budget runs out;
//! fuser's blocking read then finds the request waiting. All clone fds share one input queue,
//! so polling a dup of the session fd sees every pending request.
//!
//! Spinning only pays while requests come one at a time (the CPUs idle between them). Under
//! a deep queue the CPUs are busy with the client and the kernel, and a spinner takes time
//! from them. So a thread spins only when the last `SERIAL_RUN` requests each arrived while no
//! other was in flight (a deep queue rarely passes that test), and at most one thread of the
//! process spins at a time, whichever disk it serves: on a small machine two spinners starve
//! the I/O they wait for, and a btrfs raid1 stack serves two disks that take requests
//! together. BENCHMARKS.md has the measurements behind these choices.

use super::cpu_latency::Hold;
use super::steer::Steer;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::*};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// Set while some thread of this process spins (all disks share it).
static SPINNING: AtomicBool = AtomicBool::new(false);

/// Requests in a row, each alone in flight, before spinning starts.
const SERIAL_RUN: u64 = 32;

/// While requests overlap, how long a ring owner pinned to its queue's CPU polls its own ring
/// before it sleeps (`uring/shared.rs`): a few µs, about the loop worker's time to queue the
/// next request on this CPU. Longer polls gain nothing at QD32 (BENCHMARKS.md).
pub const OWNER_POLL: Duration = Duration::from_micros(5);

pub struct Poller {
    fd: OnceLock<OwnedFd>,
    budget: Duration,
    in_flight: AtomicU32,
    seen: AtomicU64,
    /// `seen` at the last request that arrived while another was in flight
    last_overlap: AtomicU64,
    /// the loop device's completion steering (`steer.rs`), told of each serial/overlap change
    steer: OnceLock<Steer>,
    /// the CPU wake-up latency request (`cpu_latency.rs`), told of each arrival
    hold: OnceLock<Hold>,
}

/// A request from arrival to reply; dropping it marks the reply sent. A delayed reply carries
/// it to the delay thread.
pub struct InFlight(Arc<Poller>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Release);
    }
}

/// No thread of the process spins now: a hint for a caller deciding whether a spin is worth
/// preparing (`idle_until` decides).
pub fn spinner_free() -> bool {
    !SPINNING.load(Relaxed)
}

impl Poller {
    /// `budget` zero: never spin.
    pub fn new(budget: Duration) -> Poller {
        Poller {
            fd: OnceLock::new(),
            budget,
            in_flight: AtomicU32::new(0),
            seen: AtomicU64::new(0),
            last_overlap: AtomicU64::new(0),
            steer: OnceLock::new(),
            hold: OnceLock::new(),
        }
    }

    /// The fd to poll: a dup of the session's /dev/fuse fd (never read from).
    pub fn attach(&self, fd: OwnedFd) {
        let _ = self.fd.set(fd);
    }

    /// Steer the loop device's completions by the same serial test (set once the device exists).
    pub fn steer_with(&self, s: Steer) {
        let _ = self.steer.set(s);
    }

    pub fn steer(&self) -> Option<&Steer> {
        self.steer.get()
    }

    /// Hold the CPU latency while requests come (set once, before requests are served).
    pub fn hold_with(&self, h: Hold) {
        let _ = self.hold.set(h);
    }

    /// Requests seen so far and requests in flight (the latency hold's watcher: quiet when
    /// the first has not moved and the second is zero).
    pub fn activity(&self) -> (u64, u32) {
        (self.seen.load(Relaxed), self.in_flight.load(Acquire))
    }

    /// A request arrived; keep the guard until its reply is sent (or handed to another thread).
    pub fn arrived(self: &Arc<Self>) -> InFlight {
        self.arrived_among(1)
    }

    /// A request arrived together with `batch - 1` others that the caller takes in the same
    /// sweep (the ring's completion queue: one thread serves them in turn, so `in_flight`
    /// alone would never see them overlap).
    pub fn arrived_among(self: &Arc<Self>, batch: usize) -> InFlight {
        let n = self.seen.fetch_add(1, Relaxed) + 1;
        if let Some(h) = self.hold.get() {
            h.busy();
        }
        if self.in_flight.fetch_add(1, AcqRel) > 0 || batch > 1 {
            self.last_overlap.store(n, Relaxed);
            if let Some(s) = self.steer.get() {
                s.serial(false);
            }
        } else if let Some(s) = self.steer.get() {
            s.serial(n.saturating_sub(self.last_overlap.load(Relaxed)) >= SERIAL_RUN);
        }
        InFlight(self.clone())
    }

    /// Spin until a request is pending on /dev/fuse or the budget is spent. Call after
    /// replying. Not while a reply is still to come from the delay thread: the client waits
    /// for it before sending more, and the delay thread's own spin wants a CPU.
    pub fn idle(&self) {
        let Some(fd) = self.fd.get() else { return };
        let mut p = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd. Pending, or an error (unmounted: fuser's read will see it).
        self.idle_until(|| unsafe { libc::poll(&mut p, 1, 0) } != 0);
    }

    /// Requests overlap: one arrived while another was in flight within the last `SERIAL_RUN`
    /// requests (a deep queue), and polling is not turned off (a zero budget).
    pub fn overlapping(&self) -> bool {
        !self.budget.is_zero() && !self.serial_run()
    }

    /// The last `SERIAL_RUN` requests each arrived with no other in flight.
    fn serial_run(&self) -> bool {
        // saturating: an overlap recorded between the two loads reads as "just now"
        self.seen.load(Relaxed).saturating_sub(self.last_overlap.load(Relaxed)) >= SERIAL_RUN
    }

    /// Whether a spin after this request would be allowed (requests arriving one at a time,
    /// no reply pending, a budget); cheap, for callers that wait differently otherwise.
    pub fn may_spin(&self) -> bool {
        !self.budget.is_zero() && self.in_flight.load(Acquire) == 0 && self.serial_run()
    }

    /// Spin until `pending()` says a request is there or the budget is spent, if `may_spin`
    /// and no other thread of the process spins. `pending` is the front end's own check:
    /// /dev/fuse readable (classic), or a completion on the ring (uring.rs).
    pub fn idle_until(&self, mut pending: impl FnMut() -> bool) {
        if !self.may_spin() || SPINNING.swap(true, Acquire) {
            return;
        }
        let end = Instant::now() + self.budget;
        // yield, not a pause: the client or the loop worker may be runnable on this CPU
        // (woken by our reply), and they are what the next request waits for. The yield is
        // also the kernel entry that runs the ring's pending task work (a new request).
        while !pending() && Instant::now() < end {
            // SAFETY: a plain syscall without arguments
            unsafe { libc::sched_yield() };
        }
        SPINNING.store(false, Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::FromRawFd;

    /// A poller on a pipe: the read end is "pending" once something is written to `tx`.
    /// The spinner flag is process-wide: these tests take turns.
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn poller(budget: Duration) -> (Arc<Poller>, std::fs::File) {
        let mut fds = [0; 2];
        // SAFETY: `fds` has room for the two fds pipe() writes
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let p = Arc::new(Poller::new(budget));
        // SAFETY: a fresh fd from pipe(), owned by nothing else
        p.attach(unsafe { OwnedFd::from_raw_fd(fds[0]) });
        // SAFETY: as above, the other end
        let w = unsafe { std::fs::File::from_raw_fd(fds[1]) };
        (p, w)
    }

    fn serial(p: &Arc<Poller>, n: u64) {
        for _ in 0..n {
            drop(p.arrived());
        }
    }

    fn timed(p: &Poller) -> Duration {
        let t = Instant::now();
        p.idle();
        t.elapsed()
    }

    #[test]
    fn spins_for_the_budget_only_after_a_serial_run() {
        let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
        let (p, _tx) = poller(Duration::from_millis(20));
        serial(&p, SERIAL_RUN - 1);
        assert!(timed(&p) < Duration::from_millis(10), "spun before a serial run");
        serial(&p, 1);
        assert!(timed(&p) >= Duration::from_millis(20), "did not spin for its budget");
    }

    #[test]
    fn stops_as_soon_as_a_request_is_pending() {
        let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
        let (p, mut tx) = poller(Duration::from_secs(2));
        serial(&p, SERIAL_RUN);
        use std::io::Write;
        tx.write_all(b"x").unwrap();
        assert!(timed(&p) < Duration::from_millis(500));
    }

    #[test]
    fn no_spin_after_overlap_or_while_a_reply_is_pending() {
        let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
        let (p, _tx) = poller(Duration::from_secs(2));
        serial(&p, SERIAL_RUN);
        let a = p.arrived();
        let b = p.arrived(); // arrived while `a` was in flight
        drop((a, b));
        serial(&p, SERIAL_RUN - 2);
        assert!(timed(&p) < Duration::from_millis(500), "spun right after overlapping requests");
        serial(&p, 2);
        let delayed = p.arrived();
        assert!(timed(&p) < Duration::from_millis(500), "spun while a delayed reply was pending");
        drop(delayed);
    }

    #[test]
    fn one_spinner_at_a_time_across_disks() {
        let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
        let (p, _tx) = poller(Duration::from_millis(600));
        let (other_disk, _tx2) = poller(Duration::from_millis(600));
        serial(&p, SERIAL_RUN);
        serial(&other_disk, SERIAL_RUN);
        let q = p.clone();
        let spinner = std::thread::spawn(move || timed(&q));
        std::thread::sleep(Duration::from_millis(100));
        assert!(timed(&p) < Duration::from_millis(300), "a second thread spun too");
        assert!(timed(&other_disk) < Duration::from_millis(300), "a second disk's thread spun too");
        assert!(spinner.join().unwrap() >= Duration::from_millis(600));
    }

    #[test]
    fn overlapping_until_a_serial_run_and_never_with_a_zero_budget() {
        let (p, _tx) = poller(Duration::from_millis(1));
        serial(&p, SERIAL_RUN);
        assert!(!p.overlapping(), "a serial run read as overlapping");
        let a = p.arrived();
        drop((a, p.arrived()));
        assert!(p.overlapping(), "two requests in flight together did not read as overlapping");
        serial(&p, SERIAL_RUN - 1);
        assert!(p.overlapping(), "overlap forgotten before a whole serial run");
        serial(&p, 1);
        assert!(!p.overlapping(), "overlap still reported after a whole serial run");
        let (off, _tx2) = poller(Duration::ZERO);
        let a = off.arrived();
        drop((a, off.arrived()));
        assert!(!off.overlapping(), "a zero budget must turn the owners' poll off too");
    }

    #[test]
    fn zero_budget_never_spins() {
        let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
        let (p, _tx) = poller(Duration::ZERO);
        serial(&p, 10 * SERIAL_RUN);
        assert!(timed(&p) < Duration::from_millis(10));
    }
}
