//! Recording a disk's writes to a dm-log-writes log (`logwrites`), for crash-state exploration
//! (`faultline crash explore`, docs/crash.md): every write with its data, every discard and
//! completed flush, in completion order, plus named marks from the control socket.
//!
//! The write cache layer calls the slot on each request's completion (before it is
//! acknowledged, so the log's order is the order the client saw); with no recorder the slot
//! costs one plain load and a branch per request (`Slot::get`).

use super::logwrites::LogWriter;
use anyhow::{Result, bail};
use arc_swap::ArcSwapOption;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::Acquire, Ordering::Release};
use std::sync::{Arc, Mutex};

/// Log sector size of recordings: the smallest logical block a loop device can have, so every
/// request the kernel sends is whole sectors and torn variants can split at 512 B.
pub const SECTOR: u32 = 512;

pub struct Recorder {
    w: Mutex<Option<LogWriter>>,
    /// The first error writing the log (disk full...): recording stops there and says so.
    error: Mutex<Option<String>>,
}

/// What a recording holds (reply to `record`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Recording {
    pub path: Option<PathBuf>,
    pub entries: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Recorder {
    fn with(&self, f: impl FnOnce(&mut LogWriter) -> Result<()>) {
        let mut g = self.w.lock().unwrap();
        if let Some(w) = g.as_mut()
            && let Err(e) = f(w)
        {
            *self.error.lock().unwrap() = Some(format!("{e:#}"));
            // a log with a hole in it would replay wrong states: stop here
            if let Some(w) = g.take() {
                let _ = w.finish();
            }
        }
    }
    pub fn write(&self, off: u64, data: &[u8]) {
        self.with(|w| w.write(off, data, 0));
    }
    pub fn flush(&self) {
        self.with(|w| w.flush());
    }
    pub fn discard(&self, off: u64, len: u64) {
        self.with(|w| w.discard(off, len));
    }
}

/// Where the cache layer finds the recorder, if any. `on` is set while a recorder is in the
/// slot, so a request on a disk that is not recording reads one flag (no reference count
/// taken and dropped on the slot's `Arc`).
#[derive(Default)]
pub struct Slot(ArcSwapOption<Recorder>, AtomicBool);

impl Slot {
    /// The recorder while recording.
    #[inline]
    pub fn get(&self) -> Option<Arc<Recorder>> {
        if !self.on() {
            return None;
        }
        self.0.load_full()
    }

    /// Whether a recorder may be in the slot (one load; `get` for the recorder itself).
    #[inline]
    pub fn on(&self) -> bool {
        self.1.load(Acquire)
    }

    /// Start recording into a new log at `path`. Err while already recording.
    pub fn start(&self, path: &Path) -> Result<Recording> {
        if let Some(r) = self.get() {
            let g = r.w.lock().unwrap();
            bail!("already recording to {}; stop that first (record with no path)", g.as_ref().map_or(String::new(), |w| w.path().display().to_string()));
        }
        let w = LogWriter::create(path, SECTOR)?;
        self.0.store(Some(Arc::new(Recorder { w: Mutex::new(Some(w)), error: Mutex::new(None) })));
        self.1.store(true, Release);
        Ok(Recording { path: Some(path.to_owned()), entries: 0, error: None })
    }

    /// Stop recording: the log is complete on disk when this returns.
    pub fn stop(&self) -> Result<Recording> {
        self.1.store(false, Release);
        let Some(r) = self.0.swap(None) else { bail!("not recording") };
        let w = r.w.lock().unwrap().take();
        let error = r.error.lock().unwrap().clone();
        let (path, entries) = match w {
            Some(w) => {
                let p = w.path().to_owned();
                (Some(p), w.finish()?)
            }
            None => (None, 0),
        };
        Ok(Recording { path, entries, error })
    }

    /// Add a MARK entry named `name`; the entry's index, or None when not recording.
    pub fn mark(&self, name: &str) -> Result<Option<u64>> {
        let Some(r) = self.get() else { return Ok(None) };
        let mut g = r.w.lock().unwrap();
        let Some(w) = g.as_mut() else { bail!("the recording stopped: {}", r.error.lock().unwrap().clone().unwrap_or_default()) };
        w.mark(name)?;
        Ok(Some(w.entries() - 1))
    }
}
