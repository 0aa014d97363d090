//! Driving I/O against a block device or a set of files (docs/workload.md).
//!
//! `run(&Workload, &Maps, observer, progress)` is the one entry point. Each thread owns a region
//! (block interface) or a file set (file interface); the per-op logic (bounds, pattern, mix,
//! content, map, errors, retries, stats) lives in `op` and is shared by both I/O engines (`IoEngine`): `psync`
//! and `uring` only move bytes.

pub mod content_map;
pub mod direct;
pub mod entries;
pub mod files;
pub mod fileset;
pub mod maps;
pub mod op;
pub mod pattern;
pub mod personality;
pub mod psync;
pub mod runner;
pub mod stats;
pub mod uring;
pub mod windows;

pub use crate::spec::workload::config::{ErrorPolicy, Interface, IoEngine, SyncMode, Workload};
pub use maps::Maps;
pub use runner::{LatencySummary, WorkloadResult, run};
pub use stats::{FlowopSummary, Sample};

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Instant;

/// Called from the issuing thread just before a write is submitted, so a fault can be armed
/// against the block about to be written (or the one written last).
pub trait WriteObserver: Send + Sync {
    fn before_write(&self, ev: &WriteEvent);
}

pub struct WriteEvent<'a> {
    /// Bytes of writes issued before this one (all threads).
    pub written_before: u64,
    /// Ops (reads+writes) issued before this one.
    pub ops_before: u64,
    /// Since the workload started.
    pub elapsed: std::time::Duration,
    /// File index (file interface), None on a block device.
    pub file: Option<usize>,
    /// Byte offset in the device or file.
    pub offset: u64,
    /// Content id of each 4 KiB block of this write.
    pub ids: &'a [u64],
}

/// Live progress, updated by the workload threads as I/Os complete; read it from another
/// thread (a progress bar). `start` is set when the workload starts issuing.
#[derive(Default)]
pub struct Progress {
    /// Bytes of completed I/Os (reads + writes, successful or not); each workload thread adds
    /// its share every 64 ops or 20 ms (and at its end).
    pub bytes: AtomicU64,
    /// Completed I/Os.
    pub ops: AtomicU64,
    /// Failed I/Os (after retries).
    pub errors: AtomicU64,
    pub start: OnceLock<Instant>,
    /// Set by the caller to end the run early (e.g. Ctrl-C); in-flight I/Os complete.
    pub stop: AtomicBool,
    /// `interface: nbd`: the client's counters, for sampling while the workload runs.
    pub nbd: OnceLock<std::sync::Arc<crate::nbd::client::Counters>>,
}

impl Progress {
    pub fn new() -> Progress {
        Progress::default()
    }
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Relaxed)
    }
    pub fn ops(&self) -> u64 {
        self.ops.load(Relaxed)
    }
    pub fn errors(&self) -> u64 {
        self.errors.load(Relaxed)
    }
    pub fn elapsed(&self) -> std::time::Duration {
        self.start.get().map(|s| s.elapsed()).unwrap_or_default()
    }
}
