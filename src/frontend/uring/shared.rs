//! Per-queue rings served together (`--ring-threads 0` on a machine with several CPUs).
//!
//! Each CPU queue has its own ring and an owner thread pinned to that CPU. While requests
//! overlap, each owner serves its own ring: a request is served on the CPU that queued it, and
//! two queues are served at once. While requests come one at a time, one thread drives every
//! ring and busy-polls them all (`poll.rs`), the other owners parked: the next request finds a
//! running thread whichever queue it lands on, as with a single ring thread. While requests
//! overlap, an owner that has served its ring polls it a few µs (`OWNER_POLL`), yielding,
//! before it sleeps: at a deep queue the loop worker on the same CPU queues the next request
//! within that time, and the owner saves a sleep and a wake-up per batch.
//!
//! The kernel delivers an entry's next request through task work of the thread that committed
//! the entry, so these rings are made without SINGLE_ISSUER (several threads submit). With
//! COOP_TASKRUN that task work does not interrupt a running committer (it runs at its next
//! system call: every thread here makes them all the time, a spinning one yields) and still
//! wakes a sleeping one (parked, or waiting on its own ring), which posts the completion on
//! the entry's ring, where whoever serves that ring sees it (a driver asleep polls the others'
//! completion queues from its own ring). Without COOP_TASKRUN the interrupt per request halves
//! queue-depth-1 IOPS here (BENCHMARKS.md). Only a ring's own thread queues its eventfd read
//! (`Station::rearm`): the poke that wakes it must complete through that thread.

use super::{Station, poke};
use crate::frontend::poll::OWNER_POLL;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::*};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// `driver` when no thread drives every ring.
const NONE: usize = usize::MAX;

/// An owner's longest sleep on its ring before it looks at the stop flag again: the wake-up
/// at the stop is an eventfd read, and a lost one must not hang the teardown.
const BOUND: Duration = Duration::from_millis(200);

pub(super) struct Shared {
    /// each owner's ring, present from registration until its owner ends
    stations: Vec<Mutex<Option<Station>>>,
    /// each owner's eventfd: a poke wakes it from its ring's wait
    wakes: Vec<Arc<OwnedFd>>,
    /// the owner that drives every ring, or `NONE`
    driver: AtomicUsize,
    /// stations present
    ready: AtomicUsize,
    /// parked owners wait here for the driver to let go (or for the stop)
    gate: Mutex<()>,
    unparked: Condvar,
}

impl Shared {
    pub(super) fn new(wakes: Vec<Arc<OwnedFd>>) -> Shared {
        Shared {
            stations: wakes.iter().map(|_| Mutex::new(None)).collect(),
            wakes,
            driver: AtomicUsize::new(NONE),
            ready: AtomicUsize::new(0),
            gate: Mutex::new(()),
            unparked: Condvar::new(),
        }
    }

    fn station(&self, t: usize) -> MutexGuard<'_, Option<Station>> {
        self.stations[t].lock().unwrap_or_else(|e| e.into_inner())
    }

    fn driven_by_other(&self, t: usize) -> bool {
        let d = self.driver.load(Acquire);
        d != NONE && d != t
    }

    /// Wake parked owners (the driver let go, or the server stops).
    pub(super) fn unpark(&self) {
        let _g = self.gate.lock().unwrap_or_else(|e| e.into_inner());
        self.unparked.notify_all();
    }

    /// Serve station `t` as its owner until stopped, unmounted or its ring fails; returns it
    /// for closing.
    pub(super) fn own(&self, t: usize, station: Station, stop: &AtomicBool) -> Station {
        *self.station(t) = Some(station);
        self.ready.fetch_add(1, AcqRel);
        loop {
            {
                let mut g = self.gate.lock().unwrap_or_else(|e| e.into_inner());
                while self.driven_by_other(t) && !stop.load(Acquire) {
                    g = self.unparked.wait(g).unwrap_or_else(|e| e.into_inner());
                }
            }
            let mut g = self.station(t);
            let st = g.as_mut().expect("a station stays until its owner ends");
            let ended = loop {
                let batch = st.requests();
                st.serve(batch);
                if stop.load(Acquire) || st.finished() {
                    break true;
                }
                st.due();
                if self.driven_by_other(t) {
                    // park: the driver serves this ring
                    break !st.submit();
                }
                // a drive starts after a request, as a single thread's spin does; after it, wait
                // (at once if a request came meanwhile)
                if batch > 0 && st.server.late.is_empty() && st.server.poller.may_spin() && self.claim(t) && !self.drive(t, st, stop) {
                    break true;
                }
                // requests overlap: poll this ring briefly before sleeping on it
                if st.server.late.is_empty() && st.server.poller.overlapping() {
                    if !st.submit() {
                        break true;
                    }
                    if self.poll_own(t, st) {
                        st.take();
                        continue;
                    }
                }
                if !st.wait(false, Some(BOUND)) {
                    break true;
                }
                st.take();
            };
            if ended {
                self.ready.fetch_sub(1, AcqRel);
                return g.take().expect("a station stays until its owner ends");
            }
        }
    }

    /// Poll owner `t`'s own ring for `OWNER_POLL`, yielding: true when a completion came. The
    /// yield lets the loop worker that queues the next request run on this CPU (the owner is
    /// pinned there), and is the kernel entry that runs the ring's task work (a new request).
    /// A disk's owners are pinned to different CPUs, so they never poll on one CPU; two disks'
    /// owners may, each for at most `OWNER_POLL` and yielding to the other. Unlike
    /// `Poller::idle_until` it takes no process-wide turn.
    fn poll_own(&self, t: usize, st: &mut Station) -> bool {
        let end = Instant::now() + OWNER_POLL;
        while !st.pending() {
            if Instant::now() >= end || self.driven_by_other(t) {
                return false;
            }
            // SAFETY: a plain syscall without arguments
            unsafe { libc::sched_yield() };
        }
        true
    }

    /// Become the driver, if every station is there, nobody drives, and no other thread of
    /// the process spins (then a drive would end at once, after waking every owner).
    fn claim(&self, t: usize) -> bool {
        self.ready.load(Acquire) == self.stations.len()
            && crate::frontend::poll::spinner_free()
            && self.driver.compare_exchange(NONE, t, AcqRel, Acquire).is_ok()
    }

    /// Serve every ring from this thread while requests come one at a time, the other owners
    /// parked: busy-poll them all between requests, and when the poll gives up, sleep on this
    /// thread's ring with a poll of every other ring's completion queue on it (the driver stays
    /// the driver: a drive's start wakes every owner). Ends when requests overlap (or a reply
    /// is delayed: each owner keeps its own ring's timers), at the stop or an unmount. False
    /// when `own`'s ring failed.
    fn drive(&self, t: usize, own: &mut Station, stop: &AtomicBool) -> bool {
        for (o, w) in self.wakes.iter().enumerate() {
            if o != t {
                poke(w.as_raw_fd());
            }
        }
        let ids: Vec<usize> = (0..self.stations.len()).filter(|&o| o != t).collect();
        let mut others: Vec<_> = ids.iter().map(|&o| self.station(o)).collect();
        let mut ok = true;
        // a station already taken by its ended owner: nothing to drive
        if others.iter().all(|g| g.is_some()) {
            let mut rest: Vec<&mut Station> = others.iter_mut().map(|g| g.as_mut().expect("checked")).collect();
            let poller = own.server.poller.clone();
            loop {
                own.take();
                rest.iter_mut().for_each(|s| s.take());
                let batch = own.requests() + rest.iter().map(|s| s.requests()).sum::<usize>();
                for s in std::iter::once(&mut *own).chain(rest.iter_mut().map(|s| &mut **s)) {
                    s.serve(batch);
                    s.due();
                }
                ok = own.submit();
                // another ring's failure ends its own owner, once the drive lets go
                let others_ok = rest.iter_mut().all(|s| s.submit());
                if !ok || !others_ok || stop.load(Acquire) || own.finished() || rest.iter().any(|s| s.finished()) {
                    break;
                }
                if !poller.may_spin() {
                    break;
                }
                poller.idle_until(|| own.pending() || rest.iter_mut().any(|s| s.pending()));
                if own.pending() || rest.iter_mut().any(|s| s.pending()) {
                    continue;
                }
                for (s, &o) in rest.iter().zip(&ids) {
                    own.watch(o, s.fd());
                }
                if !own.wait(false, Some(BOUND)) {
                    ok = false;
                    break;
                }
            }
        }
        drop(others);
        // an owner checks `driver` under the gate before it waits: this notify reaches it
        self.driver.store(NONE, Release);
        self.unpark();
        ok
    }
}
