//! Completion steering: which CPU the block layer completes our loop device's requests on
//! (`/sys/block/loopN/queue/rq_affinity`). A loop device has one hardware queue, so with the
//! kernel's default (0 for loop) a request is completed by raising the block softirq on the
//! CPU that ended it: our serving thread's, in task context, which wakes ksoftirqd there, and
//! ksoftirqd then wakes the client on its own CPU. With 2 ("force") the completion is sent to
//! the CPU that submitted the request and runs there in the IPI's interrupt: one wake-up less
//! on the round trip. That helps at queue depth 1 but hurts at deep queues, where one IPI per
//! completion costs more than a softirq that completes a batch (BENCHMARKS.md). So `auto`
//! forces while requests come one at a time
//! (the poller's serial test, `poll.rs`) and puts the device's own value back otherwise. Over
//! the ring only (`frontend/mod.rs`): the classic path's threads look serial at any depth.
//!
//! The setting outlives the loop device's attachment (a later `losetup` of the same loopN
//! inherits it), so the value found is restored at teardown, and recorded in the ledger first
//! for `faultline cleanup` after a crash.

use anyhow::{Context, Result};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering::*};

pub use crate::spec::disk::RqAffinity;
pub use crate::sys::loopdev::{rq_affinity as read, rq_affinity_path as sysfs_path};

/// The steering of one loop device. Transitions are rare (a change of queue depth), and each
/// is one cheap sysfs write that does not freeze the queue.
pub struct Steer {
    file: File,
    /// the device's value when we found it: what `serial(false)` and `restore` write
    pub original: u8,
    auto: bool,
    /// the file holds 2 because of `serial(true)`
    forced: AtomicBool,
    /// serialises transitions (the classic front end serves from two threads); holds
    /// `retired`: once restored, nothing more is written
    gate: Mutex<bool>,
}

impl Steer {
    /// Open the device's setting and apply a fixed value; `None` for `Keep`. The caller
    /// records `original` in the ledger before any request can trigger a change (`Auto`
    /// changes nothing until requests arrive; a fixed value is written here, after
    /// `record`).
    pub fn open(device: &Path, mode: RqAffinity, record: impl FnOnce(u8) -> Result<()>) -> Result<Option<Steer>> {
        if mode == RqAffinity::Keep {
            return Ok(None);
        }
        let original = read(device)?;
        let path = sysfs_path(device);
        let file = std::fs::OpenOptions::new().write(true).open(&path).with_context(|| format!("cannot open {} for writing", path.display()))?;
        record(original)?;
        let s = Steer { file, original, auto: mode == RqAffinity::Auto, forced: AtomicBool::new(false), gate: Mutex::new(false) };
        if let Some(v) = mode.fixed() {
            s.put(v).with_context(|| format!("cannot set {} to {v}", path.display()))?;
        }
        Ok(Some(s))
    }

    fn put(&self, v: u8) -> std::io::Result<()> {
        self.file.write_at(&[b'0' + v], 0).map(|_| ())
    }

    /// Requests are coming one at a time (`true`) or overlap (`false`). Cheap when nothing
    /// changes: one relaxed load.
    #[inline]
    pub fn serial(&self, serial: bool) {
        if !self.auto || self.forced.load(Relaxed) == serial {
            return;
        }
        let retired = self.gate.lock().unwrap_or_else(|e| e.into_inner());
        if *retired || self.forced.load(Relaxed) == serial {
            return;
        }
        // a failed write leaves the device as it was; steering is an optimisation
        if self.put(if serial { 2 } else { self.original }).is_ok() {
            self.forced.store(serial, Relaxed);
        }
    }

    /// Put the device's own value back; later `serial` calls change nothing.
    pub fn restore(&self) -> Result<()> {
        let mut retired = self.gate.lock().unwrap_or_else(|e| e.into_inner());
        *retired = true;
        self.put(self.original).context("cannot restore the loop device's rq_affinity")
    }
}
