//! CPU wake-up latency while the disk is in use: a PM QoS request of 0 µs on
//! /dev/cpu_dma_latency, which makes idle CPUs poll instead of halting. Every round trip of a
//! request wakes a CPU that went idle while it waited: the client's, when the completion
//! reaches it; the loop worker's and ours, when the request is handed on. A halted CPU is woken
//! by an IPI, and in a VM both the IPI and the halt's exit go through the hypervisor; a polling
//! CPU notices the work without an IPI (the kernel skips it for a CPU that polls). The gain is
//! largest at queue depth 1 and small at deep queues (BENCHMARKS.md). The cost: idle CPUs spin
//! while it is held, so `auto` holds it only while requests come (released `GRACE` after the
//! last one, never while a reply is still due), and `keep` leaves the machine alone.
//!
//! The request belongs to the open file: the kernel drops it when the file is closed, also
//! when the process dies, so a crash leaves nothing to clean up. It is machine-wide: whatever
//! runs on the disk (the system under test) runs with polling CPUs too; comparisons meant to
//! exclude that (another disk, another tool) should hold it for both or use `keep`.

use super::poll::Poller;
use anyhow::{Context, Result};
use std::fs::File;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering::*};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::Duration;

pub use crate::spec::disk::CpuLatency;

const DEVICE: &str = "/dev/cpu_dma_latency";
/// No requests for this long (and none in flight): release. Long enough that a steady stream
/// with gaps (a think time, a sync) keeps it; one take and release cost a few µs each.
pub const GRACE: Duration = Duration::from_millis(10);

/// The machine's current CPU latency limit in µs (the smallest request of all processes;
/// 2,000,000,000 when nobody asks).
pub fn current_limit() -> Result<i32> {
    let mut b = [0u8; 4];
    use std::io::Read;
    File::open(DEVICE).and_then(|mut f| f.read_exact(&mut b)).with_context(|| format!("cannot read {DEVICE}"))?;
    Ok(i32::from_ne_bytes(b))
}

struct State {
    /// our request; its value is 0 (held) or the kernel's default (-1 writes the default);
    /// written under `gone`'s lock
    file: File,
    held: AtomicBool,
    /// set when the disk goes away: the watcher ends
    gone: Mutex<bool>,
    wake: Condvar,
}

impl State {
    fn put(&self, v: i32) -> std::io::Result<()> {
        // exactly 4 bytes: the kernel reads a binary s32 (any other length is parsed as hex text)
        (&self.file).write_all(&v.to_ne_bytes())
    }
}

/// One disk's request. `busy` on each arrival; a watcher thread releases it when the disk is quiet.
pub struct Hold {
    state: Arc<State>,
}

impl Hold {
    /// `None` for `Keep`. `Hold` asks now; `Auto` asks at the first request (`busy`). The
    /// watcher looks at the poller's activity (a weak reference: the poller owns this hold).
    pub fn open(mode: CpuLatency, poller: Weak<Poller>) -> Result<Option<Hold>> {
        if mode == CpuLatency::Keep {
            return Ok(None);
        }
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(DEVICE)
            .with_context(|| format!("cannot open {DEVICE} (cpu_latency {mode}; `keep` does without it)"))?;
        let state = Arc::new(State { file, held: AtomicBool::new(false), gone: Mutex::new(false), wake: Condvar::new() });
        if mode == CpuLatency::Hold {
            state.put(0).with_context(|| format!("cannot write to {DEVICE}"))?;
            state.held.store(true, Release);
            return Ok(Some(Hold { state }));
        }
        let s = state.clone();
        std::thread::Builder::new().name("faultline-cpulat".into()).spawn(move || watch(&s, &poller)).context("cannot start the cpu latency thread")?;
        Ok(Some(Hold { state }))
    }

    /// A request arrived: hold the latency if not held. One relaxed load when held.
    #[inline]
    pub fn busy(&self) {
        if !self.state.held.load(Relaxed) {
            self.take();
        }
    }

    #[cold]
    fn take(&self) {
        let _gone = self.state.gone.lock().unwrap_or_else(|e| e.into_inner());
        // a failed write leaves the machine as it was: this is an optimisation
        if !self.state.held.load(Relaxed) && self.state.put(0).is_ok() {
            self.state.held.store(true, Relaxed);
            self.state.wake.notify_one();
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        // the watcher may be the thread dropping the poller (its upgrade was the last
        // reference), so it is told to end, never joined; the kernel drops the request when
        // the watcher's reference to the file goes
        *self.state.gone.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.state.wake.notify_one();
    }
}

/// Release the request once the disk has had no request for `GRACE` and none is in flight.
fn watch(s: &State, poller: &Weak<Poller>) {
    let mut last = None;
    loop {
        {
            let mut gone = s.gone.lock().unwrap_or_else(|e| e.into_inner());
            while !*gone && !s.held.load(Relaxed) {
                gone = s.wake.wait(gone).unwrap_or_else(|e| e.into_inner());
                last = None;
            }
            if *gone {
                return;
            }
            if *s.wake.wait_timeout(gone, GRACE).unwrap_or_else(|e| e.into_inner()).0 {
                return;
            }
        }
        // not under the lock: if this upgrade is the poller's last reference, dropping it
        // drops the `Hold`, whose drop takes the lock
        let Some(now) = poller.upgrade().map(|p| p.activity()) else { return };
        if last == Some(now.0) && now.1 == 0 {
            let gone = s.gone.lock().unwrap_or_else(|e| e.into_inner());
            // -1: back to the kernel's default (no limit), keeping the file for next time
            if !*gone && s.put(-1).is_ok() {
                s.held.store(false, Relaxed);
            }
        }
        last = Some(now.0);
    }
}
