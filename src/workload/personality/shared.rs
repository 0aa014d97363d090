//! What a personality's threads share: the file set's maps (`Live`), which files exist and
//! which are busy (`Picks`), and the rotors that pick them as filebench does.

use crate::content::stream::Stream;
use crate::spec::workload::config::{CONTENT_BLOCK, PersonalitySpec, Workload};
use crate::workload::entries::EntryOracle;
use crate::workload::fileset::Layout;
use crate::workload::stats::IntervalAcc;
use crate::workload::{Progress, WriteObserver};
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// What the map knows of one file: the content id of each 4 KiB block (None: a failed
/// write, unknown), and the generation (bumped by each create, delete and replace, under this lock
/// and while the file is busy; `Shared::generation` mirrors it so an open need not wait for
/// the lock while a writer holds it).
#[derive(Default)]
pub(super) struct Live {
    pub(super) blocks: Vec<Option<u64>>,
    pub(super) generation: u64,
}

impl Live {
    pub(super) fn record(&mut self, first: u64, ids: &[u64], ok: bool) {
        let end = first as usize + ids.len();
        if self.blocks.len() < end {
            self.blocks.resize(end, None);
        }
        for (k, id) in ids.iter().enumerate() {
            self.blocks[first as usize + k] = ok.then_some(*id);
        }
    }
}

/// Which files exist and which are busy; the rotors of `pick`.
pub(super) struct Picks {
    pub(super) exists: Vec<bool>,
    pub(super) busy: Vec<bool>,
    pub(super) rotor_exists: Vec<usize>,
    pub(super) rotor_free: Vec<usize>,
}

pub(super) struct Shared<'a> {
    pub(super) w: &'a Workload,
    pub(super) p: &'a PersonalitySpec,
    pub(super) dir: PathBuf,
    pub(super) layout: Layout,
    pub(super) live: Vec<Mutex<Live>>,
    pub(super) generation: Vec<AtomicU64>,
    /// `replace`: per file, the versions its temp file had so far (the oracle's generations of
    /// the temp's path, slot `entries + i`).
    pub(super) temp_generation: Vec<AtomicU64>,
    pub(super) picks: Mutex<Picks>,
    pub(super) stream: Stream,
    pub(super) seed: u64,
    /// Content blocks handed to writes so far: write block n carries stream.id_at(n).
    pub(super) write_blocks: AtomicU64,
    pub(super) claimed_ops: AtomicU64,
    pub(super) stop: AtomicBool,
    pub(super) stopped_on_error: AtomicBool,
    pub(super) observer: Option<&'a dyn WriteObserver>,
    pub(super) progress: &'a Progress,
    pub(super) start: Instant,
    pub(super) intervals: Vec<Mutex<IntervalAcc>>,
    /// With a power cut planned: the durability oracle's record of entries and versions.
    pub(super) oracle: Option<EntryOracle>,
}

impl Shared<'_> {
    /// filebench's fileset_pick: the next file of `set` at or after the rotor that exists
    /// (or does not), skipping busy ones; it is returned busy. None: no such file now.
    pub(super) fn pick(&self, set: usize, exists: bool) -> Option<usize> {
        let s = &self.layout.sets[set];
        let mut p = self.picks.lock().unwrap();
        let rotor = if exists { p.rotor_exists[set] } else { p.rotor_free[set] };
        for k in 0..s.count {
            let i = s.first + (rotor + k) % s.count;
            if p.exists[i] == exists && !p.busy[i] {
                p.busy[i] = true;
                let next = (i - s.first + 1) % s.count;
                if exists {
                    p.rotor_exists[set] = next;
                } else {
                    p.rotor_free[set] = next;
                }
                return Some(i);
            }
        }
        None
    }

    /// `pick`, waiting while every candidate is busy (another thread is opening, creating or
    /// deleting it). filebench ends the run when a flowop finds no file; here the flowop is
    /// skipped (counted in `flowops_skipped`) after a second without one, or at the stop.
    pub(super) fn pick_wait(&self, set: usize, exists: bool) -> Option<usize> {
        let t0 = Instant::now();
        let mut spins = 0u32;
        loop {
            if let Some(i) = self.pick(set, exists) {
                return Some(i);
            }
            if self.stopping() || t0.elapsed() >= Duration::from_secs(1) {
                return None;
            }
            spins += 1;
            if spins < 16 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
    }

    /// A create or delete of file `i` (busy): a new generation, no blocks.
    pub(super) fn renew(&self, i: usize) -> u64 {
        let mut l = self.live[i].lock().unwrap();
        l.blocks.clear();
        l.generation += 1;
        self.generation[i].store(l.generation, Relaxed);
        l.generation
    }

    pub(super) fn release(&self, i: usize, exists: bool) {
        let mut p = self.picks.lock().unwrap();
        p.busy[i] = false;
        p.exists[i] = exists;
    }

    pub(super) fn path(&self, i: usize) -> PathBuf {
        self.dir.join(&self.layout.entries[i].path)
    }

    pub(super) fn stopping(&self) -> bool {
        self.stop.load(Relaxed) || self.progress.stop.load(Relaxed) || self.w.duration.is_some_and(|d| self.start.elapsed() >= d)
    }

    /// The content ids of `n` bytes of new writes, into `ids`; returns the first block number.
    pub(super) fn draw_ids(&self, n: u64, ids: &mut Vec<u64>) -> u64 {
        let per = n / CONTENT_BLOCK;
        let n0 = self.write_blocks.fetch_add(per, Relaxed);
        ids.clear();
        ids.extend((0..per).map(|k| self.stream.id_at(n0 + k)));
        n0
    }
}
