//! The durability oracle's record of a personality's files (docs/crash.md, "Directory
//! entries"): per path, which entry state was acknowledged durable (the file exists as one
//! version, or is absent) and the entry changes made after it (creates, deletes, renames); per
//! version (an inode: one create of the path, or one rename onto it), which content was
//! acknowledged durable and what was only written.
//!
//! The rules (ALICE's and CrashMonkey's "file and parent fsynced"):
//! - a write of a version is durable once an fsync of that version's file, started after the
//!   write completed, returned success before the power cut began;
//! - a create is durable once an fsync of the new file and an fsync of its parent directory,
//!   both started after the create completed, returned success before the cut began; a delete
//!   once an fsync of the parent directory started after it did. A directory fsync makes
//!   durable, per path of the directory, the last change that completed before it started (a
//!   create still needs its file's fsync); a change that becomes durable settles every change
//!   of the path before it;
//! - a rename removes the source's entry (a delete of the source path) and replaces the
//!   destination's (the destination names the source's version, a new one for its path; the
//!   previous one is gone once the rename is durable). It is durable once an fsync of the
//!   destination's directory, and of the source's if it differs, each started after the rename
//!   completed, returned success before the cut began. Its content stays the version's: durable
//!   as far as that file was fsynced (before or after the rename). Until then the destination
//!   may hold its previous state or the renamed version, never nothing if it was a durable file
//!   (POSIX: a rename replaces the destination atomically);
//! - the preallocated file set is synced (`syncfs`) before the timed phase: its entries and
//!   contents are durable, and the paths not created are durably absent.
//!
//! Events are recorded after their syscall returned and syncs' snapshots are taken before
//! their syscall starts, both under one lock: a change or write recorded before a snapshot
//! completed before the sync started (one that raced it is not credited: conservative).
//!
//! With a log (`EntryOracle::with_log`) every call that changes the record is also handed to
//! the log as an `EntryEvent`, under the same lock and so in the record's order: `crash
//! explore` keeps them and rebuilds the record as of each crash state (`EntryEvent::apply` on a
//! fresh record).

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex, MutexGuard};

/// A write of one version (its blocks share the write's sequence number).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VersionWrite {
    pub block: u64,
    pub id: u64,
    pub seq: u64,
    /// The write failed: a possible content, never made durable.
    pub failed: bool,
}

/// One version (inode) of a path: the content of one create.
#[derive(Clone, Debug, Default)]
pub struct Version {
    /// Per block, the durable content: (id, the write's sequence number).
    pub durable: HashMap<u64, (u64, u64)>,
    /// Writes not acknowledged durable, in order.
    pub pending: Vec<VersionWrite>,
    /// Writes so far (the next write's sequence number).
    pub writes: u64,
    /// An fsync of this version's file returned success before the cut.
    pub file_synced: bool,
}

impl Version {
    /// Every block this version holds a record of, sorted.
    pub fn blocks(&self) -> Vec<u64> {
        let mut b: Vec<u64> = self.durable.keys().copied().chain(self.pending.iter().map(|w| w.block)).collect();
        b.sort_unstable();
        b.dedup();
        b
    }

    /// The durable content of `block` and the contents written after it (in order).
    pub fn block(&self, block: u64) -> (Option<u64>, Vec<u64>) {
        let d = self.durable.get(&block).copied();
        let after = d.map_or(0, |(_, s)| s + 1);
        let later = self.pending.iter().filter(|w| w.block == block && w.seq >= after).map(|w| w.id).collect();
        (d.map(|(id, _)| id), later)
    }
}

/// An entry change of a path not (yet) acknowledged durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// The path was created as version `generation`; `dir_synced`: a directory fsync started
    /// after it, while it was the path's last change, returned success before the cut.
    Create {
        generation: u64,
        seq: u64,
        dir_synced: bool,
    },
    Delete {
        seq: u64,
    },
    /// Slot `from` was renamed over the path, which now names version `generation` (the
    /// source's version as it was at the rename). `dir_synced`: as for a create, of the path's
    /// directory; `from_dir_synced`: an fsync of the source's directory started after the
    /// rename and returned success before the cut (true at once when it is the same directory).
    Rename {
        generation: u64,
        seq: u64,
        from: usize,
        dir_synced: bool,
        from_dir_synced: bool,
    },
}

impl Change {
    fn seq(&self) -> u64 {
        match self {
            Change::Create { seq, .. } | Change::Delete { seq } | Change::Rename { seq, .. } => *seq,
        }
    }

    /// The version the path names after this change (None: a delete).
    pub fn generation(&self) -> Option<u64> {
        match self {
            Change::Create { generation, .. } | Change::Rename { generation, .. } => Some(*generation),
            Change::Delete { .. } => None,
        }
    }
}

/// The record of one path.
#[derive(Clone, Debug, Default)]
pub struct PathRecord {
    /// The durable entry state: the version the path durably names, None: durably absent.
    pub durable: Option<u64>,
    /// Entry changes after the durable state, in order.
    pub pending: Vec<Change>,
    /// The versions that may still be found: the durable one and those of pending creates
    /// and renames.
    pub versions: BTreeMap<u64, Version>,
    /// The durable state came by a rename onto the path.
    pub durable_renamed: bool,
}

impl PathRecord {
    /// The versions a present file may be, the durable one first.
    pub fn candidates(&self) -> Vec<u64> {
        let mut c: Vec<u64> = self.durable.into_iter().collect();
        c.extend(self.pending.iter().filter_map(Change::generation));
        c
    }

    /// Whether a rename onto the path made its durable state or is pending.
    pub fn renamed(&self) -> bool {
        self.durable_renamed || self.pending.iter().any(|p| matches!(p, Change::Rename { .. }))
    }

    /// Whether a pending change deleted the path.
    pub fn pending_delete(&self) -> bool {
        self.pending.iter().any(|p| matches!(p, Change::Delete { .. }))
    }

    /// Changes through `pending[k]` are durable: the path's durable state is what `pending[k]`
    /// left, and versions no state can name any more are dropped.
    fn settle(&mut self, k: usize) {
        self.durable = self.pending[k].generation();
        self.durable_renamed = matches!(self.pending[k], Change::Rename { .. });
        self.pending.drain(..=k);
        let keep = self.candidates();
        self.versions.retain(|g, _| keep.contains(g));
    }

    /// The last create whose file and directory were both fsynced, or rename whose
    /// directories were, becomes durable.
    fn resolve(&mut self) {
        let k = self.pending.iter().rposition(|p| match p {
            Change::Create { generation, dir_synced, .. } => *dir_synced && self.versions.get(generation).is_some_and(|v| v.file_synced),
            Change::Rename { dir_synced, from_dir_synced, .. } => *dir_synced && *from_dir_synced,
            Change::Delete { .. } => false,
        });
        if let Some(k) = k {
            self.settle(k);
        }
    }
}

/// One call that changed the record, with its arguments (`EntryLog`). Replaying a record's
/// events in order on a fresh record (`apply`) rebuilds it; a sync left out credits nothing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum EntryEvent {
    Created { slot: usize, generation: u64 },
    Deleted { slot: usize },
    Renamed { from: usize, generation: u64, to: usize, to_generation: u64 },
    Wrote { slot: usize, generation: u64, first: u64, ids: Vec<u64>, ok: bool },
    FileSynced { slot: usize, generation: u64, snap: u64 },
    DirSynced { slot: usize, snap: u64 },
    SyncedAll,
}

impl EntryEvent {
    /// A sync that returned success: what it credits is durable from then on.
    pub fn is_sync(&self) -> bool {
        matches!(self, EntryEvent::FileSynced { .. } | EntryEvent::DirSynced { .. } | EntryEvent::SyncedAll)
    }

    /// Make the same call on `o`.
    pub fn apply(&self, o: &EntryOracle) {
        match self {
            EntryEvent::Created { slot, generation } => o.created(*slot, *generation),
            EntryEvent::Deleted { slot } => o.deleted(*slot),
            EntryEvent::Renamed { from, generation, to, to_generation } => o.renamed(*from, *generation, *to, *to_generation),
            EntryEvent::Wrote { slot, generation, first, ids, ok } => o.wrote(*slot, *generation, *first, ids, *ok),
            EntryEvent::FileSynced { slot, generation, snap } => o.file_synced(*slot, *generation, *snap),
            EntryEvent::DirSynced { slot, snap } => o.dir_synced(*slot, *snap),
            EntryEvent::SyncedAll => o.synced_all(),
        }
    }
}

/// Where a record's events go as they are made. Called with the record locked: events come
/// in the record's order, and the call delays every other change of the record.
pub trait EntryLog: Send + Sync {
    fn event(&self, ev: EntryEvent);
}

pub struct Inner {
    pub paths: Vec<PathRecord>,
    /// Entry changes recorded so far: a directory fsync's snapshot.
    seq: u64,
}

/// The record of a personality's file set (paths relative to the workload's directory).
pub struct EntryOracle {
    /// The durability oracle's switch (`Durability::power_off`): set before the power goes;
    /// a sync that returns after it credits nothing.
    pub power_off: Arc<AtomicBool>,
    /// Path of each file slot, relative to the workload's directory.
    pub names: Vec<PathBuf>,
    /// Per directory, its file slots; `dir_of` maps a slot to its directory.
    dirs: Vec<Vec<usize>>,
    dir_of: Vec<usize>,
    inner: Mutex<Inner>,
    /// Where the changes also go (`crash explore`), if anywhere.
    log: Option<Arc<dyn EntryLog>>,
}

impl EntryOracle {
    pub fn new(names: Vec<PathBuf>, power_off: Arc<AtomicBool>) -> EntryOracle {
        let mut index: HashMap<PathBuf, usize> = HashMap::new();
        let mut dirs: Vec<Vec<usize>> = Vec::new();
        let dir_of = names
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let parent = n.parent().unwrap_or(Path::new("")).to_path_buf();
                let d = *index.entry(parent).or_insert_with(|| {
                    dirs.push(Vec::new());
                    dirs.len() - 1
                });
                dirs[d].push(i);
                d
            })
            .collect();
        let paths = vec![PathRecord::default(); names.len()];
        EntryOracle { power_off, names, dirs, dir_of, inner: Mutex::new(Inner { paths, seq: 0 }), log: None }
    }

    /// The same record, handing every change to `log` as well.
    pub fn with_log(mut self, log: Arc<dyn EntryLog>) -> EntryOracle {
        self.log = Some(log);
        self
    }

    /// Hand an event to the log (the caller holds the record's lock).
    fn note(&self, ev: impl FnOnce() -> EntryEvent) {
        if let Some(l) = &self.log {
            l.event(ev());
        }
    }

    fn off(&self) -> bool {
        self.power_off.load(SeqCst)
    }

    /// The record, for the verdict after the cut.
    pub fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap()
    }

    /// Slot `i` was created as version `generation` (the create returned).
    pub fn created(&self, i: usize, generation: u64) {
        let mut g = self.lock();
        g.seq += 1;
        let seq = g.seq;
        let p = &mut g.paths[i];
        p.versions.insert(generation, Version::default());
        p.pending.push(Change::Create { generation, seq, dir_synced: false });
        self.note(|| EntryEvent::Created { slot: i, generation });
    }

    /// Slot `i` was deleted (the unlink returned).
    pub fn deleted(&self, i: usize) {
        let mut g = self.lock();
        g.seq += 1;
        let seq = g.seq;
        g.paths[i].pending.push(Change::Delete { seq });
        self.note(|| EntryEvent::Deleted { slot: i });
    }

    /// A write of version `generation` of slot `i` returned: blocks `first..` hold `ids`
    /// (`ok`: it succeeded).
    pub fn wrote(&self, i: usize, generation: u64, first: u64, ids: &[u64], ok: bool) {
        let mut g = self.lock();
        // logged even when the version is no longer followed here: a record rebuilt without
        // the change that dropped it still follows it
        self.note(|| EntryEvent::Wrote { slot: i, generation, first, ids: ids.to_vec(), ok });
        let Some(v) = g.paths[i].versions.get_mut(&generation) else { return };
        let seq = v.writes;
        v.writes += 1;
        v.pending.extend(ids.iter().enumerate().map(|(k, id)| VersionWrite { block: first + k as u64, id: *id, seq, failed: !ok }));
    }

    /// Slot `from`'s version `generation` was renamed over slot `to` (the rename returned; `to`
    /// may have existed or not): `from` is deleted, and `to` names the version as its
    /// `to_generation` (new for `to`'s record), its content record copied from `from`'s.
    /// Later writes and fsyncs of that file are `to`'s (`to`, `to_generation`); `from`'s copy,
    /// which a cut before the rename is durable may still show there, stays as it was at the
    /// rename (a workload writes the file before renaming it). `from == to` (a rename that
    /// changes nothing) records nothing.
    pub fn renamed(&self, from: usize, generation: u64, to: usize, to_generation: u64) {
        if from == to {
            return;
        }
        let mut g = self.lock();
        g.seq += 1;
        let seq = g.seq;
        let v = g.paths[from].versions.get(&generation).cloned().unwrap_or_default();
        g.paths[from].pending.push(Change::Delete { seq });
        let same = self.dir_of[from] == self.dir_of[to];
        let p = &mut g.paths[to];
        p.versions.insert(to_generation, v);
        p.pending.push(Change::Rename { generation: to_generation, seq, from, dir_synced: false, from_dir_synced: same });
        self.note(|| EntryEvent::Renamed { from, generation, to, to_generation });
    }

    /// Before an fsync of version `generation` of slot `i`: the writes it can cover.
    pub fn file_sync_start(&self, i: usize, generation: u64) -> u64 {
        self.lock().paths[i].versions.get(&generation).map_or(0, |v| v.writes)
    }

    /// That fsync returned success: the writes before `snap` are durable, and so is the
    /// version's create if its directory was fsynced after it.
    pub fn file_synced(&self, i: usize, generation: u64, snap: u64) {
        if self.off() {
            return;
        }
        let mut g = self.lock();
        self.note(|| EntryEvent::FileSynced { slot: i, generation, snap });
        let p = &mut g.paths[i];
        let Some(v) = p.versions.get_mut(&generation) else { return };
        v.file_synced = true;
        let mut keep = Vec::with_capacity(v.pending.len());
        for w in v.pending.drain(..) {
            if w.seq < snap && !w.failed {
                let e = v.durable.entry(w.block).or_insert((w.id, w.seq));
                if w.seq >= e.1 {
                    *e = (w.id, w.seq);
                }
            } else {
                keep.push(w);
            }
        }
        v.pending = keep;
        p.resolve();
    }

    /// Before an fsync of the directory of slot `i`: the changes it can cover.
    pub fn dir_sync_start(&self) -> u64 {
        self.lock().seq
    }

    /// That directory fsync returned success: per path of the directory, its last change
    /// before `snap` is in the directory's durable state (a delete at once, a create once its
    /// file is fsynced too, a rename from another directory once that one is fsynced too);
    /// and renames out of this directory into another one before `snap` have their source
    /// side durable.
    pub fn dir_synced(&self, i: usize, snap: u64) {
        if self.off() {
            return;
        }
        let d = self.dir_of[i];
        let mut g = self.lock();
        self.note(|| EntryEvent::DirSynced { slot: i, snap });
        for &j in &self.dirs[d] {
            let p = &mut g.paths[j];
            let Some(k) = p.pending.iter().rposition(|c| c.seq() <= snap) else { continue };
            match &mut p.pending[k] {
                Change::Create { dir_synced, .. } | Change::Rename { dir_synced, .. } => {
                    *dir_synced = true;
                    p.resolve();
                }
                Change::Delete { .. } => p.settle(k),
            }
        }
        if self.dirs.len() < 2 {
            return;
        }
        for (j, p) in g.paths.iter_mut().enumerate() {
            if self.dir_of[j] == d {
                continue;
            }
            let mut hit = false;
            for c in &mut p.pending {
                if let Change::Rename { seq, from, from_dir_synced, .. } = c
                    && *seq <= snap
                    && self.dir_of[*from] == d
                {
                    *from_dir_synced = true;
                    hit = true;
                }
            }
            if hit {
                p.resolve();
            }
        }
    }

    /// The whole file system was synced (`syncfs` returned success): every change and every
    /// successful write so far is durable.
    pub fn synced_all(&self) {
        if self.off() {
            return;
        }
        let mut g = self.lock();
        self.note(|| EntryEvent::SyncedAll);
        for p in &mut g.paths {
            if let Some(gen_) = p.pending.iter().rev().find_map(Change::generation)
                && let Some(v) = p.versions.get_mut(&gen_)
            {
                v.file_synced = true;
            }
            if !p.pending.is_empty() {
                let k = p.pending.len() - 1;
                p.settle(k);
            }
            for v in p.versions.values_mut() {
                let snap = v.writes;
                v.pending.retain(|w| {
                    if w.seq < snap && !w.failed {
                        v.durable.insert(w.block, (w.id, w.seq));
                        false
                    } else {
                        true
                    }
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn oracle(names: &[&str]) -> EntryOracle {
        EntryOracle::new(names.iter().map(PathBuf::from).collect(), Arc::new(AtomicBool::new(false)))
    }

    #[test]
    fn a_create_is_durable_after_its_file_and_its_directory_are_fsynced() {
        let o = oracle(&["d/a", "d/b", "e/c"]);
        o.created(0, 1);
        o.wrote(0, 1, 0, &[10, 11], true);
        let s = o.file_sync_start(0, 1);
        o.wrote(0, 1, 1, &[12], true);
        o.file_synced(0, 1, s);
        {
            let g = o.lock();
            let p = &g.paths[0];
            assert_eq!(p.durable, None, "the directory was not fsynced");
            assert_eq!(p.versions[&1].block(0), (Some(10), vec![]));
            assert_eq!(p.versions[&1].block(1), (Some(11), vec![12]), "the write after the snapshot stays pending");
        }
        // a directory fsync of another directory changes nothing here
        let d = o.dir_sync_start();
        o.dir_synced(2, d);
        assert_eq!(o.lock().paths[0].durable, None);
        let d = o.dir_sync_start();
        o.dir_synced(1, d);
        let g = o.lock();
        assert_eq!((g.paths[0].durable, g.paths[0].pending.len()), (Some(1), 0));
        drop(g);
        // a delete, then a create: the directory fsync settles the delete only when it is the
        // last change before the fsync started
        o.deleted(0);
        let d = o.dir_sync_start();
        o.created(0, 3);
        o.dir_synced(0, d);
        let g = o.lock();
        assert_eq!(g.paths[0].durable, None, "the delete is durable");
        assert_eq!(g.paths[0].candidates(), vec![3]);
        assert!(!g.paths[0].versions.contains_key(&1), "version 1 can no longer be found");
    }

    #[test]
    fn a_directory_fsync_before_the_file_fsync_also_counts_and_late_syncs_credit_nothing() {
        let o = oracle(&["a", "b"]);
        o.created(1, 1);
        let d = o.dir_sync_start();
        o.dir_synced(1, d);
        assert_eq!(o.lock().paths[1].durable, None, "the file is not fsynced yet");
        o.wrote(1, 1, 0, &[5], true);
        let s = o.file_sync_start(1, 1);
        o.file_synced(1, 1, s);
        assert_eq!(o.lock().paths[1].durable, Some(1));
        // after the cut began: nothing is credited
        o.created(0, 1);
        let (s, d) = (o.file_sync_start(0, 1), o.dir_sync_start());
        o.power_off.store(true, SeqCst);
        o.file_synced(0, 1, s);
        o.dir_synced(0, d);
        let g = o.lock();
        assert_eq!((g.paths[0].durable, g.paths[0].candidates()), (None, vec![1]));
        assert!(!g.paths[0].versions[&1].file_synced);
    }

    /// The atomic replace: a temp file written and fsynced, renamed over a durable file, the
    /// directory fsynced. A directory fsync that started before the rename credits nothing;
    /// one started after it makes the destination durably the new version (the old one can no
    /// longer be found) and the source durably absent.
    #[test]
    fn a_rename_is_durable_once_a_directory_fsync_started_after_it_returned() {
        let o = oracle(&["d/a", "d/a.tmp", "e/b"]);
        o.created(0, 1);
        o.wrote(0, 1, 0, &[10], true);
        o.synced_all();
        o.created(1, 1);
        o.wrote(1, 1, 0, &[20, 21], true);
        let s = o.file_sync_start(1, 1);
        o.file_synced(1, 1, s);
        // a directory fsync that started before the rename and returned after it
        let early = o.dir_sync_start();
        o.renamed(1, 1, 0, 2);
        o.dir_synced(0, early);
        {
            let g = o.lock();
            let (a, t) = (&g.paths[0], &g.paths[1]);
            assert_eq!((a.durable, a.candidates()), (Some(1), vec![1, 2]), "the old version or the renamed one");
            assert!(a.renamed() && !a.pending_delete(), "the destination is never durably absent");
            assert_eq!(a.versions[&2].block(1), (Some(21), vec![]), "the temp's fsynced content came with it");
            // the early fsync made the temp's create durable (its last change before it), not
            // its removal by the rename
            assert_eq!((t.durable, t.pending.len(), t.pending_delete()), (Some(1), 1, true));
        }
        // the other directory's fsync changes nothing here
        let d = o.dir_sync_start();
        o.dir_synced(2, d);
        assert_eq!(o.lock().paths[0].durable, Some(1));
        let d = o.dir_sync_start();
        o.dir_synced(1, d);
        let g = o.lock();
        let (a, t) = (&g.paths[0], &g.paths[1]);
        assert_eq!((a.durable, a.durable_renamed, a.pending.len()), (Some(2), true, 0));
        assert!(!a.versions.contains_key(&1), "the replaced version can no longer be found");
        assert_eq!((t.durable, t.candidates(), t.versions.len()), (None, vec![], 0), "the source is durably absent");
    }

    /// A rename is credited without an fsync of the renamed file (its entry is the
    /// directory's); the content stays as durable as that file's own fsyncs made it.
    #[test]
    fn a_durable_rename_of_an_unsynced_file_keeps_its_content_unsynced() {
        let o = oracle(&["a", "a.tmp"]);
        o.created(1, 1);
        o.wrote(1, 1, 0, &[5], true);
        o.renamed(1, 1, 0, 1);
        let d = o.dir_sync_start();
        o.dir_synced(0, d);
        let g = o.lock();
        assert_eq!((g.paths[0].durable, g.paths[0].durable_renamed), (Some(1), true));
        assert_eq!(g.paths[0].versions[&1].block(0), (None, vec![5]), "never fsynced: zeros or 5 may be found");
    }

    /// Across directories both must be fsynced after the rename, in either order; a sync that
    /// returns after the power went credits nothing.
    #[test]
    fn a_rename_across_directories_needs_both_and_late_syncs_credit_nothing() {
        for source_first in [false, true] {
            let o = oracle(&["d/a", "e/x"]);
            o.created(1, 1);
            o.renamed(1, 1, 0, 1);
            // slot 1 is in the source's directory, slot 0 in the destination's
            let (first, second) = if source_first { (1, 0) } else { (0, 1) };
            let s = o.dir_sync_start();
            o.dir_synced(first, s);
            assert_eq!(o.lock().paths[0].durable, None, "one directory of two (source first: {source_first})");
            let s = o.dir_sync_start();
            o.dir_synced(second, s);
            let g = o.lock();
            assert_eq!((g.paths[0].durable, g.paths[1].durable, g.paths[1].pending.len()), (Some(1), None, 0), "source first: {source_first}");
        }
        let o = oracle(&["a", "b"]);
        o.created(1, 1);
        o.renamed(1, 1, 0, 1);
        let s = o.dir_sync_start();
        o.power_off.store(true, SeqCst);
        o.dir_synced(0, s);
        let g = o.lock();
        assert_eq!((g.paths[0].durable, g.paths[0].candidates()), (None, vec![1]));
        assert_eq!(g.paths[1].candidates(), vec![1], "the source may still be there");
    }

    struct Kept(Mutex<Vec<EntryEvent>>);
    impl EntryLog for Kept {
        fn event(&self, ev: EntryEvent) {
            self.0.lock().unwrap().push(ev);
        }
    }

    /// What a record says of each path: durable version, candidates, and per candidate its
    /// blocks' durable and later contents.
    /// Per candidate version: its blocks, each with its durable content and the later ones.
    type Candidates = Vec<(u64, Vec<(u64, Option<u64>, Vec<u64>)>)>;

    fn view(o: &EntryOracle) -> Vec<(Option<u64>, Candidates)> {
        let g = o.lock();
        g.paths
            .iter()
            .map(|p| {
                let vs = p
                    .candidates()
                    .into_iter()
                    .map(|c| (c, p.versions[&c].blocks().into_iter().map(|b| (b, p.versions[&c].block(b).0, p.versions[&c].block(b).1)).collect()))
                    .collect();
                (p.durable, vs)
            })
            .collect()
    }

    /// An atomic replace logged and replayed on a fresh record: the same record, the rename
    /// durable in both.
    #[test]
    fn a_logged_rename_replays_to_the_same_record() {
        let kept = Arc::new(Kept(Mutex::new(vec![])));
        let o = oracle(&["d/a", "d/a.tmp"]).with_log(kept.clone());
        o.created(0, 1);
        let s = o.file_sync_start(0, 1);
        o.file_synced(0, 1, s);
        let d = o.dir_sync_start();
        o.dir_synced(0, d);
        o.created(1, 1);
        o.wrote(1, 1, 0, &[7], true);
        let s = o.file_sync_start(1, 1);
        o.file_synced(1, 1, s);
        o.renamed(1, 1, 0, 2);
        let d = o.dir_sync_start();
        o.dir_synced(0, d);
        let evs = kept.0.lock().unwrap().clone();
        assert!(evs.contains(&EntryEvent::Renamed { from: 1, generation: 1, to: 0, to_generation: 2 }), "{evs:?}");
        let evs: Vec<EntryEvent> = serde_json::from_str(&serde_json::to_string(&evs).unwrap()).unwrap();
        let r = oracle(&["d/a", "d/a.tmp"]);
        evs.iter().for_each(|e| e.apply(&r));
        assert_eq!(view(&r), view(&o));
        let g = r.lock();
        assert_eq!((g.paths[0].durable, g.paths[0].durable_renamed, g.paths[1].durable), (Some(2), true, None));
    }

    #[test]
    fn the_logged_events_rebuild_the_record_and_a_left_out_sync_credits_nothing() {
        let kept = Arc::new(Kept(Mutex::new(vec![])));
        let o = oracle(&["d/a", "d/b"]).with_log(kept.clone());
        o.created(0, 1);
        o.wrote(0, 1, 0, &[10, 11], true);
        let s = o.file_sync_start(0, 1);
        o.file_synced(0, 1, s);
        let d = o.dir_sync_start();
        o.dir_synced(0, d);
        o.created(1, 1);
        o.deleted(0);
        o.wrote(0, 1, 2, &[12], true);
        let d = o.dir_sync_start();
        o.dir_synced(1, d);
        let evs = kept.0.lock().unwrap().clone();
        assert_eq!(evs.len(), 8);
        assert_eq!(evs[0], EntryEvent::Created { slot: 0, generation: 1 });
        // serialized and read back, replayed on a fresh record: the same record
        let evs: Vec<EntryEvent> = serde_json::from_str(&serde_json::to_string(&evs).unwrap()).unwrap();
        let r = oracle(&["d/a", "d/b"]);
        evs.iter().for_each(|e| e.apply(&r));
        assert_eq!(view(&r), view(&o));
        assert_eq!(view(&r)[0].0, None, "the delete is durable");
        // without the last directory fsync the delete is not durable: version 1 may be found
        let r = oracle(&["d/a", "d/b"]);
        evs[..7].iter().for_each(|e| e.apply(&r));
        assert_eq!(r.lock().paths[0].durable, Some(1));
        assert_eq!(r.lock().paths[0].versions[&1].block(2), (None, vec![12]));
        assert!(evs[7].is_sync() && !evs[6].is_sync());
    }

    #[test]
    fn syncfs_makes_everything_durable_and_failed_writes_stay_pending() {
        let o = oracle(&["a", "b"]);
        o.created(0, 1);
        o.wrote(0, 1, 0, &[1, 2], true);
        o.wrote(0, 1, 2, &[3], false);
        o.synced_all();
        let g = o.lock();
        assert_eq!(g.paths[0].durable, Some(1));
        assert_eq!(g.paths[0].versions[&1].block(1), (Some(2), vec![]));
        assert_eq!(g.paths[0].versions[&1].block(2), (None, vec![3]));
        assert_eq!((g.paths[1].durable, g.paths[1].pending.len()), (None, 0));
    }
}
