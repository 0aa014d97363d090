//! What a crash state must still hold of what the workload wrote, behind one small interface
//! (`Oracle`: a state's facts and where its data is -> block counts), so a finer one (the
//! run's durability oracle) can take its place.
//!
//! `EntriesOracle` follows a personality's directory entries and file versions with the run's
//! own record (`workload::entries`) and verdict (`verify::crash::verify_entries`), rebuilt per
//! state from the events the recording kept. `FsyncOracle` knows each write's durability (one
//! psync thread with `fsync:N` or `dsync`: the log is marked before every write).
//! `EndOracle` knows one durability point: the `synced` mark the explorer adds once the
//! workload returned and the file system (or device) was synced; in a state past it every
//! mapped block must read back as written (else
//! `durable_lost`), before it a block that does not is `unsynced_lost` (allowed), and it does
//! not tell garbage from an older version (`garbage` stays 0).

use crate::verify::crash::EntryCounts;
use crate::workload::entries::{EntryEvent, EntryOracle};
use crate::workload::maps::{Maps, Target};
use anyhow::Result;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OracleCounts {
    /// Blocks checked.
    pub checked: u64,
    /// Acknowledged durable, now old, wrong or missing: a failure.
    pub durable_lost: u64,
    /// Content never written there (not classified by `EndOracle`).
    pub garbage: u64,
    /// Not yet durable and not there (allowed).
    pub unsynced_lost: u64,
    /// Not yet durable and there.
    pub unsynced_kept: u64,
    /// Durable and there.
    pub durable_ok: u64,
    /// `entries`: blocks whose every 512 B sector holds one of the allowed versions' (torn
    /// variants; the other oracles count such a block as holding a version).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub torn: u64,
    /// `entries`: the personality's paths, as `faultline run` counts them after a cut.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entries: Option<EntryCounts>,
    /// `entries`: the workload's syncs (file and directory fsyncs, the syncs of the file system)
    /// credited in this state: those whose mark lies before the end of its epoch.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub syncs_credited: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl OracleCounts {
    /// Why these counts fail a state (none: they do not). Durable blocks lost, always; with
    /// `entries` also what `faultline run` counts as failures: durable entries gone, durably
    /// absent paths back, garbage blocks.
    pub fn reasons(&self) -> Vec<String> {
        let mut r = Vec::new();
        if self.durable_lost > 0 {
            r.push(format!("{} durable blocks lost", self.durable_lost));
        }
        if let Some(e) = &self.entries {
            if e.durable_lost > 0 {
                r.push(format!("{} durable entries lost", e.durable_lost));
            }
            if e.reappeared > 0 {
                r.push(format!("{} durably absent paths reappeared", e.reappeared));
            }
            if self.garbage > 0 {
                r.push(format!("{} garbage blocks", self.garbage));
            }
        }
        r
    }
}

/// What the oracle knows of a state.
pub struct StateFacts {
    /// The state holds every entry through the log's durability point (the `synced` mark).
    pub past_sync: bool,
    /// Log entries whose marks count for durability: the end of the state's epoch (a mark
    /// inside epoch N came after every flush an fsync before it waited for, so those
    /// flushes are at or before the one that closed epoch N-1: in the state's base).
    pub horizon: usize,
    /// A torn variant: sectors of a block may come from different versions.
    pub torn: bool,
}

pub trait Oracle: Send + Sync {
    /// Check the state whose files are mounted at `root` (or whose device is `root`).
    fn check(&self, facts: &StateFacts, root: &Path) -> Result<OracleCounts>;
}

/// A personality's record as the recording made it (OUT/entries.json): the record's events
/// in order, each with the log marks that place it (`EntriesOracle`).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct EntryJournal {
    /// The workload's directory below the file system's root.
    pub dir: PathBuf,
    /// Path of each file slot, below `dir`.
    pub names: Vec<PathBuf>,
    /// The content seed.
    pub seed: u64,
    pub events: Vec<LoggedEntryEvent>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoggedEntryEvent {
    pub ev: EntryEvent,
    /// Log index of the mark `n{k}` (k: the event's index) added right after the record took
    /// the event: after its syscall returned (a sync's flushes had completed).
    pub after: usize,
    /// Log index of the mark after the same thread's previous event: the event's syscall
    /// started after it; for the thread's first event, the workload's start mark (None: no
    /// such mark, the event is kept in every state).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<usize>,
}

/// The `entries` oracle: the directory entries and file versions of a personality, checked
/// per state as `faultline run` checks them after a cut (`verify_entries`), against the record
/// as of the state. In a state of epoch N (horizon: the end of epoch N) the record is rebuilt
/// from the events whose syscall may have started before the horizon (`since` before it: one
/// that started after it left nothing in the state), with a sync credited only when its mark
/// lies before the horizon: that mark came after every flush the sync waited for, so those
/// flushes closed epoch N-1 or earlier and every state of epoch N holds what they made durable
/// (FUA writes of epoch N are kept whole). A sync whose mark lies after the horizon credits
/// nothing, as a sync that returns after a cut began credits nothing in `run`.
pub struct EntriesOracle {
    pub journal: EntryJournal,
    /// The last record rebuilt, with its horizon (the states of an epoch share one).
    cache: std::sync::Mutex<Option<(usize, EntryOracle, u64)>>,
}

impl EntriesOracle {
    pub fn new(journal: EntryJournal) -> EntriesOracle {
        EntriesOracle { journal, cache: std::sync::Mutex::new(None) }
    }

    /// The record as of a state whose horizon is `horizon`, and the syncs it credited.
    pub fn record_at(&self, horizon: usize) -> (EntryOracle, u64) {
        let o = EntryOracle::new(self.journal.names.clone(), Arc::new(AtomicBool::new(false)));
        let mut syncs = 0;
        for e in &self.journal.events {
            if e.since.is_some_and(|s| s >= horizon) || (e.ev.is_sync() && e.after >= horizon) {
                continue;
            }
            syncs += e.ev.is_sync() as u64;
            e.ev.apply(&o);
        }
        (o, syncs)
    }
}

impl Oracle for EntriesOracle {
    fn check(&self, facts: &StateFacts, root: &Path) -> Result<OracleCounts> {
        let mut cache = self.cache.lock().unwrap();
        if cache.as_ref().is_none_or(|(h, _, _)| *h != facts.horizon) {
            let (o, n) = self.record_at(facts.horizon);
            *cache = Some((facts.horizon, o, n));
        }
        let (_, record, syncs) = cache.as_ref().expect("just built");
        let rep = crate::verify::crash::verify_entries(record, &root.join(&self.journal.dir), self.journal.seed, facts.torn)?;
        let c = rep.counts;
        Ok(OracleCounts {
            checked: c.checked,
            durable_lost: c.durable_lost,
            garbage: c.garbage,
            unsynced_lost: c.unsynced_lost,
            unsynced_kept: c.unsynced_kept,
            durable_ok: c.durable_kept,
            torn: c.torn,
            entries: c.entries,
            syncs_credited: *syncs,
        })
    }
}

pub struct EndOracle {
    /// The workload's maps; their target is pointed at each state's mount or device in turn.
    pub maps: std::sync::Mutex<Maps>,
}

impl Oracle for EndOracle {
    fn check(&self, facts: &StateFacts, root: &Path) -> Result<OracleCounts> {
        let mut maps = self.maps.lock().unwrap();
        let target = match &maps.target {
            Target::Block { .. } => Target::Block { device: root.to_owned() },
            Target::File { names, .. } => Target::File { dir: root.to_owned(), names: names.clone() },
            Target::Nbd { .. } => anyhow::bail!("an NBD workload's writes cannot be checked on a crash state"),
        };
        maps.target = target;
        let r = crate::verify::verify(&maps)?;
        let bad = r.counts.checked - r.counts.ok;
        let mut c = OracleCounts { checked: r.counts.checked, ..Default::default() };
        if facts.past_sync {
            c.durable_ok = r.counts.ok;
            c.durable_lost = bad;
        } else {
            c.unsynced_kept = r.counts.ok;
            c.unsynced_lost = bad;
        }
        Ok(c)
    }
}

/// The workload's writes in issue order, recorded by the explorer when each one's durability
/// can be told (one thread, psync, `sync: fsync:N` or `dsync`): OUT/writes.json. The log has
/// a mark `w{k}` before write k (0-based) was issued: every fsync the workload made before
/// it had returned.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct WriteJournal {
    /// `fsync` (the file of every N-th write is fsynced after it) or `dsync` (every write is
    /// durable when it returns).
    pub sync: String,
    pub every: u64,
    /// (file index, byte offset in the file, content id of each 4 KiB block).
    pub writes: Vec<(usize, u64, Vec<u64>)>,
}

/// The oracle of fsyncs inside the workload: in a state whose horizon (the end of its epoch)
/// holds the mark `w{k}`, each write the workload had made durable before write k (fsynced
/// by then: its file's fsync after it, or O_DSYNC) must be there, or a later write to the same
/// block; after the `synced` mark every write is durable. A durable block holding an older
/// version, zeroes, another content, or whose file is gone or short is `durable_lost`. A
/// block only written unsynced holding one of its written versions is `unsynced_kept`,
/// zeroes or nothing `unsynced_lost`, anything else `garbage`. In torn states a block whose
/// every 512 B sector holds one of its allowed versions counts as holding one.
pub struct FsyncOracle {
    pub journal: WriteJournal,
    pub names: Vec<String>,
    pub seed: u64,
    /// (log entry index of mark `w{k}`, k), ascending.
    pub marks: Vec<(usize, usize)>,
    pub synced_entry: Option<usize>,
}

impl FsyncOracle {
    /// Writes durable in a state whose horizon holds the first `k` writes' marks.
    fn durable(&self, k: usize) -> Vec<bool> {
        let w = &self.journal.writes;
        let mut d = vec![false; w.len()];
        if self.journal.sync == "dsync" {
            d[..k.min(w.len())].iter_mut().for_each(|x| *x = true);
            return d;
        }
        // fsync:N: after write i (0-based) with (i+1) % N == 0 its file is fsynced
        let n = self.journal.every.max(1) as usize;
        let mut synced_files = std::collections::HashSet::new();
        for i in (0..k.min(w.len())).rev() {
            if (i + 1) % n == 0 {
                synced_files.insert(w[i].0);
            }
            d[i] = synced_files.contains(&w[i].0);
        }
        d
    }
}

impl Oracle for FsyncOracle {
    fn check(&self, facts: &StateFacts, root: &Path) -> Result<OracleCounts> {
        use std::collections::BTreeMap;
        use std::os::unix::fs::FileExt;
        const BS: usize = crate::spec::workload::config::CONTENT_BLOCK as usize;
        let all = facts.past_sync || self.synced_entry.is_some_and(|s| s < facts.horizon);
        let k = if all { self.journal.writes.len() } else { self.marks.iter().filter(|(e, _)| *e < facts.horizon).map(|(_, k)| *k).max().unwrap_or(0) };
        // past the sync every write is durable, whatever the workload's own fsyncs covered
        let durable = if all { vec![true; self.journal.writes.len()] } else { self.durable(k) };
        // per (file, block): the versions written, in order, and the last durable one's position
        let mut blocks: BTreeMap<(usize, u64), (Vec<u64>, Option<usize>)> = BTreeMap::new();
        for (i, (f, off, ids)) in self.journal.writes.iter().enumerate() {
            for (j, id) in ids.iter().enumerate() {
                let e = blocks.entry((*f, off / BS as u64 + j as u64)).or_default();
                e.0.push(*id);
                if durable[i] {
                    e.1 = Some(e.0.len() - 1);
                }
            }
        }
        let mut c = OracleCounts::default();
        let mut want = vec![0u8; BS];
        let mut got = vec![0u8; BS];
        let mut files: BTreeMap<usize, Option<std::fs::File>> = BTreeMap::new();
        for ((f, b), (versions, last_durable)) in &blocks {
            c.checked += 1;
            let file = files.entry(*f).or_insert_with(|| self.names.get(*f).and_then(|n| std::fs::File::open(root.join(n)).ok()));
            let read = file.as_ref().map(|fh| fh.read_exact_at(&mut got, b * BS as u64).is_ok()).unwrap_or(false);
            // the versions the block may hold: the last durable one and every later one (all
            // of them when none is durable)
            let allowed = &versions[last_durable.unwrap_or(0)..];
            let holds = read && {
                let whole = allowed.iter().any(|id| {
                    crate::content::fill_block(*id, self.seed, &mut want);
                    want == got
                });
                whole
                    || (facts.torn && {
                        // each 512 B sector one of the allowed versions'
                        let fills: Vec<Vec<u8>> = allowed
                            .iter()
                            .map(|id| {
                                let mut v = vec![0u8; BS];
                                crate::content::fill_block(*id, self.seed, &mut v);
                                v
                            })
                            .collect();
                        got.chunks(512).enumerate().all(|(s, sec)| fills.iter().any(|v| &v[s * 512..(s + 1) * 512] == sec))
                    })
            };
            match (last_durable.is_some(), holds) {
                (true, true) => c.durable_ok += 1,
                (true, false) => c.durable_lost += 1,
                (false, true) => c.unsynced_kept += 1,
                (false, false) if !read || got.iter().all(|&x| x == 0) => c.unsynced_lost += 1,
                (false, false) => c.garbage += 1,
            }
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_s_record_credits_the_syncs_marked_before_its_epoch_ended() {
        use crate::workload::entries::EntryEvent as E;
        let ev = |ev, after, since| LoggedEntryEvent { ev, after, since };
        // one thread: create d/a, write it, fsync it and its directory, delete it, fsync the
        // directory; each change marked at the log index given
        let events = vec![
            ev(E::Created { slot: 0, generation: 1 }, 10, None),
            ev(E::Wrote { slot: 0, generation: 1, first: 0, ids: vec![7], ok: true }, 11, Some(10)),
            ev(E::FileSynced { slot: 0, generation: 1, snap: 1 }, 12, Some(11)),
            ev(E::DirSynced { slot: 0, snap: 1 }, 13, Some(12)),
            ev(E::Deleted { slot: 0 }, 20, Some(13)),
            ev(E::DirSynced { slot: 0, snap: 2 }, 21, Some(20)),
        ];
        let o = EntriesOracle::new(EntryJournal { dir: PathBuf::new(), names: vec!["d/a".into(), "d/b".into()], seed: 1, events });
        let at = |h| {
            let (r, n) = o.record_at(h);
            let g = r.lock();
            (g.paths[0].durable, g.paths[0].pending.len(), n)
        };
        // the directory fsync's mark is the epoch's last entry or later: not credited; the
        // delete started after the thread's mark 13, past the state
        assert_eq!(at(13), (None, 1, 1));
        assert_eq!(o.record_at(13).0.lock().paths[0].versions[&1].block(0), (Some(7), vec![]), "the file fsync is credited");
        // the directory fsync is credited; the delete may have started before the end
        assert_eq!(at(14), (Some(1), 1, 2));
        assert_eq!(at(21), (Some(1), 1, 2));
        assert_eq!(at(22), (None, 0, 3), "the delete is durable");
    }

    fn oracle(sync: &str, every: u64, files: &[usize]) -> FsyncOracle {
        let writes = files.iter().enumerate().map(|(i, f)| (*f, i as u64 * 4096, vec![i as u64])).collect();
        FsyncOracle { journal: WriteJournal { sync: sync.into(), every, writes }, names: vec![], seed: 0, marks: vec![], synced_entry: None }
    }

    #[test]
    fn fsync_n_makes_durable_only_the_fsynced_files_writes_before_it() {
        // fsync:2: after writes 1 and 3 (0-based) their files (1, then 0) are fsynced
        let o = oracle("fsync", 2, &[0, 1, 0, 0, 1]);
        assert_eq!(o.durable(0), [false; 5]);
        assert_eq!(o.durable(2), [false, true, false, false, false]);
        assert_eq!(o.durable(4), [true, true, true, true, false]);
        // file 1's write 4 is never fsynced
        assert_eq!(o.durable(5), [true, true, true, true, false]);
        let d = oracle("dsync", 1, &[0, 1, 0]);
        assert_eq!(d.durable(2), [true, true, false]);
    }
}
