//! The durability oracle's verdict after a power cut (docs/crash.md, "Crash and check in a
//! run"): every block the workload wrote is reread from the disk and classified against what
//! was acknowledged durable (`Durability::durable`) and what was only written after it
//! (`Durability::unsynced`):
//!
//! - `durable-kept`: the last durable content, nothing written after it, is there;
//! - `unsynced-kept`: one of the contents written after the last durable one is there;
//! - `unsynced-lost`: the block went back to its durable content (or, never synced, to what
//!   was there before the workload: zeros on a fresh disk and in a file's hole);
//! - `durable-lost`: acknowledged durable, now older, other or unreadable content (a failure);
//! - `garbage`: a block never synced that holds none of the contents written there (a failure);
//! - `torn`: under the `torn` survival model, every 512-byte sector holds one of the allowed
//!   contents' sector (allowed: the model keeps some sectors of a write).

use crate::content::fill_block;
use crate::workload::direct::AlignedBuf;
use crate::workload::entries::{EntryOracle, Version};
use crate::workload::maps::{Durability, Maps, Target};
use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::os::unix::fs::FileExt;
use std::path::Path;

const BLOCK: usize = 4096;
const SECTOR: usize = 512;
/// Failures listed one by one in the results (the counts cover all).
const LISTED: usize = 100;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BlockState {
    DurableKept,
    UnsyncedKept,
    UnsyncedLost,
    DurableLost,
    Garbage,
    Torn,
    /// A personality's durable file is gone (a failure listed with its `path`).
    EntryLost,
    /// A personality's durably absent path is there (a failure listed with its `path`).
    EntryReappeared,
}

/// What the oracle found, in blocks (4 KiB).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OracleCounts {
    pub checked: u64,
    pub durable_kept: u64,
    pub unsynced_kept: u64,
    pub unsynced_lost: u64,
    pub durable_lost: u64,
    pub garbage: u64,
    pub torn: u64,
    /// Files of the file interface that are gone or shorter than their durable size (their
    /// entries and sizes were made durable before the workload); with a personality, paths
    /// whose durable entry is gone.
    pub files_lost: u64,
    /// A personality's directory entries (`workload::entries`), one per path checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entries: Option<EntryCounts>,
}

/// What the oracle found of a personality's directory entries, one per path that was
/// durable or changed: its state after the cut against the durable one and the changes after.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntryCounts {
    pub checked: u64,
    /// The durable state (the file, or its absence), no change after it.
    pub durable_kept: u64,
    /// A state a change after the durable one left (a create, a delete).
    pub unsynced_kept: u64,
    /// The durable state although changes followed.
    pub unsynced_lost: u64,
    /// A durable file is gone (also counted in `files_lost`): a failure.
    pub durable_lost: u64,
    /// A path durably absent (a durable delete, or never created) is there and no create
    /// followed: a failure.
    pub reappeared: u64,
    /// The destinations of renames among the paths checked (their durable state came by a
    /// rename, or a rename onto them followed it), by the same states.
    #[serde(default)]
    pub renamed: RenameCounts,
}

/// The paths a rename replaced, by entry state (also counted in `EntryCounts`'s own fields).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenameCounts {
    pub checked: u64,
    /// Durably the renamed version (the rename was durable), found, no change after.
    pub durable_kept: u64,
    /// A later rename's (or create's, delete's) state.
    pub unsynced_kept: u64,
    /// The durable state (the previous version) although a rename followed.
    pub unsynced_lost: u64,
    /// A durable file gone (a durable rename's destination, or a durable file a rename was
    /// replacing): a failure.
    pub durable_lost: u64,
}

impl OracleReport {
    /// The reports of several workloads as one: counts added, failures listed in turn (at
    /// most 100).
    pub fn sum<'a>(reports: impl IntoIterator<Item = &'a OracleReport>) -> OracleReport {
        let mut out = OracleReport::default();
        for r in reports {
            out.counts.add_all(&r.counts);
            out.failures.extend(r.failures.iter().take(LISTED - out.failures.len().min(LISTED)).cloned());
        }
        out
    }
}

impl OracleCounts {
    /// Add another workload's counts to these.
    pub fn add_all(&mut self, o: &OracleCounts) {
        self.checked += o.checked;
        self.durable_kept += o.durable_kept;
        self.unsynced_kept += o.unsynced_kept;
        self.unsynced_lost += o.unsynced_lost;
        self.durable_lost += o.durable_lost;
        self.garbage += o.garbage;
        self.torn += o.torn;
        self.files_lost += o.files_lost;
        if let Some(e) = &o.entries {
            let m = self.entries.get_or_insert_default();
            m.checked += e.checked;
            m.durable_kept += e.durable_kept;
            m.unsynced_kept += e.unsynced_kept;
            m.unsynced_lost += e.unsynced_lost;
            m.durable_lost += e.durable_lost;
            m.reappeared += e.reappeared;
            let (a, b) = (&mut m.renamed, &e.renamed);
            a.checked += b.checked;
            a.durable_kept += b.durable_kept;
            a.unsynced_kept += b.unsynced_kept;
            a.unsynced_lost += b.unsynced_lost;
            a.durable_lost += b.durable_lost;
        }
    }

    /// Blocks and files whose state breaks a durability promise.
    pub fn failures(&self) -> u64 {
        self.durable_lost + self.garbage + self.files_lost + self.entries.map_or(0, |e| e.reappeared)
    }
    fn add(&mut self, s: BlockState) {
        self.checked += 1;
        match s {
            BlockState::DurableKept => self.durable_kept += 1,
            BlockState::UnsyncedKept => self.unsynced_kept += 1,
            BlockState::UnsyncedLost => self.unsynced_lost += 1,
            BlockState::DurableLost => self.durable_lost += 1,
            BlockState::Garbage => self.garbage += 1,
            BlockState::Torn => self.torn += 1,
            BlockState::EntryLost | BlockState::EntryReappeared => {}
        }
    }
}

/// One block that broke a promise.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OracleFailure {
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub file: Option<usize>,
    /// A personality's file, below the workload's directory.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub path: Option<String>,
    pub block: u64,
    pub state: BlockState,
    /// The durable content id expected there, if any.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub durable_id: Option<u64>,
    /// What was read: "zeros", "other", "unreadable (errno N)", "missing", "short".
    pub found: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct OracleReport {
    #[serde(flatten)]
    pub counts: OracleCounts,
    /// The first failing blocks (at most 100).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<OracleFailure>,
}

/// What a reread of one block gave.
pub enum Read<'a> {
    Data(&'a [u8]),
    /// The read failed (errno).
    Unreadable(i32),
    /// The file is gone or ends before the block.
    Absent(&'static str),
}

/// Classify one block: `durable` is its last durable content id, `later` the contents written
/// after it (issue order), `torn_ok` whether sector-wise mixes are allowed (the `torn` model).
pub fn classify(got: &Read, durable: Option<u64>, later: &[u64], seed: u64, torn_ok: bool) -> BlockState {
    let lost = if durable.is_some() { BlockState::DurableLost } else { BlockState::UnsyncedLost };
    let got = match got {
        Read::Data(d) => *d,
        Read::Unreadable(_) => return if durable.is_some() { BlockState::DurableLost } else { BlockState::Garbage },
        Read::Absent(_) => return lost,
    };
    let mut want = vec![0u8; BLOCK];
    let base: Vec<u8> = match durable {
        Some(id) => {
            fill_block(id, seed, &mut want);
            want.clone()
        }
        None => vec![0u8; BLOCK],
    };
    if got == &base[..] {
        return if later.is_empty() { BlockState::DurableKept } else { BlockState::UnsyncedLost };
    }
    let mut cands = vec![base];
    for id in later.iter().rev() {
        fill_block(*id, seed, &mut want);
        if got == &want[..] {
            return BlockState::UnsyncedKept;
        }
        cands.push(want.clone());
    }
    if torn_ok && !later.is_empty() && (0..BLOCK / SECTOR).all(|s| cands.iter().any(|c| c[s * SECTOR..(s + 1) * SECTOR] == got[s * SECTOR..(s + 1) * SECTOR])) {
        return BlockState::Torn;
    }
    if durable.is_some() { BlockState::DurableLost } else { BlockState::Garbage }
}

fn describe(got: &Read) -> String {
    match got {
        Read::Data(d) if d.iter().all(|b| *b == 0) => "zeros".into(),
        Read::Data(_) => "other".into(),
        Read::Unreadable(e) => format!("unreadable (errno {e})"),
        Read::Absent(w) => (*w).into(),
    }
}

/// Reread every block the workload wrote (device O_DIRECT; files O_DIRECT or after dropping
/// their cache; an NBD export through a new client of its own) and classify it. `torn_ok`: the cut's model was `torn`.
pub fn verify_crash(maps: &Maps, torn_ok: bool) -> Result<OracleReport> {
    let Some(d) = &maps.durability else { bail!("the workload did not track durability (no power cut was planned)") };
    if let Some(e) = &d.entries {
        let Target::File { dir, .. } = &maps.target else { bail!("a personality's record names files") };
        return verify_entries(e, dir, maps.seed, torn_ok);
    }
    let mut later: Vec<HashMap<u64, Vec<u64>>> = vec![HashMap::new(); maps.maps.len()];
    for p in d.unsynced.lock().unwrap().iter() {
        later[p.map as usize].entry(p.block).or_default().push(p.id);
    }
    let mut rep = OracleReport::default();
    let mut buf = AlignedBuf::new(BLOCK);
    match &maps.target {
        Target::Block { device } => {
            let f = super::open_direct(device, false).with_context(|| format!("cannot open {} with O_DIRECT", device.display()))?;
            let len = crate::workload::maps::device_size(device)?;
            one(&mut |b, off| f.read_exact_at(b, off), len, d, 0, &later[0], maps.seed, torn_ok, None, &mut buf, &mut rep);
        }
        Target::File { dir, names } => {
            for (i, name) in names.iter().enumerate() {
                let p = dir.join(name);
                match super::open_uncached(&p) {
                    Ok((f, _)) => {
                        let len = f.metadata()?.len();
                        if len < maps.maps[i].len() * BLOCK as u64 {
                            rep.counts.files_lost += 1;
                        }
                        one(&mut |b, off| f.read_exact_at(b, off), len, d, i, &later[i], maps.seed, torn_ok, Some(i), &mut buf, &mut rep);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        rep.counts.files_lost += 1;
                        each(d, i, &later[i], maps.maps[i].len(), &mut |b, dur, l| {
                            record(&mut rep, Some(i), b, dur, &Read::Absent("missing"), classify(&Read::Absent("missing"), dur, l, maps.seed, torn_ok))
                        });
                    }
                    Err(e) => return Err(anyhow::Error::new(e).context(format!("cannot open {}", p.display()))),
                }
            }
        }
        // the export through a fresh client (no cache above the server's disk): a networked
        // experiment's target after power-on. The workload's region starts at `base`: the
        // blocks are read there, and failures name the export's blocks
        Target::Nbd { target, base } => {
            let c = crate::nbd::client::Client::connect(target).with_context(|| format!("cannot reach {target} to read what survived"))?;
            let len = c.size().saturating_sub(*base);
            one(&mut |b, off| c.read(base + off, b), len, d, 0, &later[0], maps.seed, torn_ok, None, &mut buf, &mut rep);
            for f in &mut rep.failures {
                f.block += base / BLOCK as u64;
            }
        }
    }
    Ok(rep)
}

/// Called with (block, durable id, later ids).
type BlockVisitor<'a> = &'a mut dyn FnMut(u64, Option<u64>, &[u64]);

/// Every block of map `m` that was written.
fn each(d: &Durability, m: usize, later: &HashMap<u64, Vec<u64>>, blocks: u64, f: BlockVisitor<'_>) {
    for b in 0..blocks {
        let dur = d.durable(m, b);
        let l = later.get(&b).map(Vec::as_slice).unwrap_or(&[]);
        if dur.is_some() || !l.is_empty() {
            f(b, dur, l);
        }
    }
}

/// Reads a whole buffer at a byte offset (a device, a file, an NBD export).
type Reader<'a> = &'a mut dyn FnMut(&mut [u8], u64) -> std::io::Result<()>;

#[allow(clippy::too_many_arguments)]
fn one(
    read: Reader<'_>,
    len: u64,
    d: &Durability,
    m: usize,
    later: &HashMap<u64, Vec<u64>>,
    seed: u64,
    torn_ok: bool,
    file: Option<usize>,
    buf: &mut AlignedBuf,
    rep: &mut OracleReport,
) {
    let blocks = d.durable[m].len() as u64;
    each(d, m, later, blocks, &mut |b, dur, l| {
        let got = if (b + 1) * BLOCK as u64 > len {
            Read::Absent("short")
        } else {
            match read(&mut buf[..], b * BLOCK as u64) {
                Ok(()) => Read::Data(&buf[..]),
                Err(e) => Read::Unreadable(e.raw_os_error().unwrap_or(libc::EIO)),
            }
        };
        let s = classify(&got, dur, l, seed, torn_ok);
        record(rep, file, b, dur, &got, s);
    });
}

fn record(rep: &mut OracleReport, file: Option<usize>, block: u64, durable_id: Option<u64>, got: &Read, s: BlockState) {
    rep.counts.add(s);
    if matches!(s, BlockState::DurableLost | BlockState::Garbage) && rep.failures.len() < LISTED {
        rep.failures.push(OracleFailure { file, path: None, block, state: s, durable_id, found: describe(got) });
    }
}

/// A personality's files after a cut (docs/crash.md, "Directory entries"). Per path that was
/// durable or changed: is it there; if so, which version may it be (the durable one, or one a
/// create or rename after it made) explains what it holds with the fewest failures, then the most
/// blocks kept: its blocks are classified as that version's, and blocks of the file that
/// version never wrote must read as zeros (a created file holds nothing else), else they are
/// `garbage`. Blocks are counted for the version found; a path absent as allowed counts none.
/// The destinations of renames are counted again in `EntryCounts::renamed`.
pub fn verify_entries(o: &EntryOracle, dir: &Path, seed: u64, torn_ok: bool) -> Result<OracleReport> {
    let g = o.lock();
    let mut w = EntryWalk { dir, seed, torn_ok, buf: AlignedBuf::new(BLOCK), rep: OracleReport::default(), ec: EntryCounts::default() };
    for (i, (p, name)) in g.paths.iter().zip(&o.names).enumerate() {
        let before = w.ec;
        w.entry(p, i, name)?;
        let ec = &mut w.ec;
        if p.renamed() && ec.checked > before.checked {
            let r = &mut ec.renamed;
            r.checked += 1;
            r.durable_kept += ec.durable_kept - before.durable_kept;
            r.unsynced_kept += ec.unsynced_kept - before.unsynced_kept;
            r.unsynced_lost += ec.unsynced_lost - before.unsynced_lost;
            r.durable_lost += ec.durable_lost - before.durable_lost;
        }
    }
    w.rep.counts.entries = Some(w.ec);
    Ok(w.rep)
}

/// The walk of `verify_entries` over a directory: how blocks are classified, and the block
/// report and entry counts so far.
struct EntryWalk<'a> {
    dir: &'a Path,
    seed: u64,
    torn_ok: bool,
    buf: AlignedBuf,
    rep: OracleReport,
    ec: EntryCounts,
}

impl EntryWalk<'_> {
    /// One path: its entry state into `ec`, its blocks into `rep`.
    fn entry(&mut self, p: &crate::workload::entries::PathRecord, i: usize, name: &Path) -> Result<()> {
        let (seed, torn_ok) = (self.seed, self.torn_ok);
        let changed = !p.pending.is_empty();
        let path = self.dir.join(name);
        let found = match super::open_uncached(&path) {
            Ok((f, _)) => {
                let len = f.metadata().with_context(|| format!("cannot stat {}", path.display()))?.len();
                Some(Ok((f, len)))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => Some(Err(e.raw_os_error().unwrap_or(libc::EIO))),
        };
        let (rep, ec) = (&mut self.rep, &mut self.ec);
        let Some(found) = found else {
            match p.durable {
                Some(d) if !p.pending_delete() => {
                    ec.checked += 1;
                    ec.durable_lost += 1;
                    rep.counts.files_lost += 1;
                    entry_failure(rep, i, name, BlockState::EntryLost, "missing");
                    let v = &p.versions[&d];
                    for b in v.blocks() {
                        let (dur, later) = v.block(b);
                        let got = Read::Absent("missing");
                        let s = classify(&got, dur, &later, seed, torn_ok);
                        record_at(rep, i, name, b, dur, &got, s);
                    }
                }
                None if !changed => {}
                // absent as it durably was, though created since
                None => {
                    ec.checked += 1;
                    ec.unsynced_lost += 1;
                }
                // a delete after the durable state was kept
                Some(_) => {
                    ec.checked += 1;
                    ec.unsynced_kept += 1;
                }
            }
            return Ok(());
        };
        ec.checked += 1;
        let cands = p.candidates();
        if cands.is_empty() {
            ec.reappeared += 1;
            entry_failure(rep, i, name, BlockState::EntryReappeared, "present");
            return Ok(());
        }
        let mut best: Option<(u64, OracleReport)> = None;
        for c in cands {
            let local = version_report(&found, &p.versions[&c], i, name, seed, torn_ok, &mut self.buf);
            let score = |r: &OracleReport| (r.counts.failures(), u64::MAX - (r.counts.durable_kept + r.counts.unsynced_kept + r.counts.torn));
            if best.as_ref().is_none_or(|(_, b)| score(&local) < score(b)) {
                best = Some((c, local));
            }
        }
        let (version, local) = best.expect("at least one candidate");
        let (rep, ec) = (&mut self.rep, &mut self.ec);
        if Some(version) == p.durable {
            if changed {
                ec.unsynced_lost += 1;
            } else {
                ec.durable_kept += 1;
            }
        } else {
            ec.unsynced_kept += 1;
        }
        let c = local.counts;
        rep.counts.checked += c.checked;
        rep.counts.durable_kept += c.durable_kept;
        rep.counts.unsynced_kept += c.unsynced_kept;
        rep.counts.unsynced_lost += c.unsynced_lost;
        rep.counts.durable_lost += c.durable_lost;
        rep.counts.garbage += c.garbage;
        rep.counts.torn += c.torn;
        let room = LISTED.saturating_sub(rep.failures.len());
        rep.failures.extend(local.failures.into_iter().take(room));
        Ok(())
    }
}

/// The blocks of a present file classified as `v`'s (see `verify_entries`); `found` is the
/// open file and its length, or the errno its open failed with.
fn version_report(
    found: &std::result::Result<(std::fs::File, u64), i32>,
    v: &Version,
    i: usize,
    name: &Path,
    seed: u64,
    torn_ok: bool,
    buf: &mut AlignedBuf,
) -> OracleReport {
    let mut rep = OracleReport::default();
    let blocks = v.blocks();
    for &b in &blocks {
        let (dur, later) = v.block(b);
        let got = match found {
            Err(e) => Read::Unreadable(*e),
            Ok((_, len)) if (b + 1) * BLOCK as u64 > *len => Read::Absent("short"),
            Ok((f, _)) => match f.read_exact_at(&mut buf[..], b * BLOCK as u64) {
                Ok(()) => Read::Data(&buf[..]),
                Err(e) => Read::Unreadable(e.raw_os_error().unwrap_or(libc::EIO)),
            },
        };
        let s = classify(&got, dur, &later, seed, torn_ok);
        record_at(&mut rep, i, name, b, dur, &got, s);
    }
    // the rest of the file: nothing was written there in this version
    if let Ok((f, len)) = found {
        for b in 0..len.div_ceil(BLOCK as u64) {
            if blocks.binary_search(&b).is_ok() {
                continue;
            }
            let got = match f.read_at(&mut buf[..], b * BLOCK as u64) {
                Ok(n) => {
                    buf[n..].fill(0);
                    if buf.iter().all(|x| *x == 0) {
                        continue;
                    }
                    Read::Data(&buf[..])
                }
                Err(e) => Read::Unreadable(e.raw_os_error().unwrap_or(libc::EIO)),
            };
            record_at(&mut rep, i, name, b, None, &got, BlockState::Garbage);
        }
    }
    rep
}

fn record_at(rep: &mut OracleReport, i: usize, name: &Path, block: u64, durable_id: Option<u64>, got: &Read, s: BlockState) {
    let before = rep.failures.len();
    record(rep, Some(i), block, durable_id, got, s);
    if let Some(f) = rep.failures.get_mut(before) {
        f.path = Some(name.display().to_string());
    }
}

fn entry_failure(rep: &mut OracleReport, i: usize, name: &Path, state: BlockState, found: &str) {
    if rep.failures.len() < LISTED {
        rep.failures.push(OracleFailure { file: Some(i), path: Some(name.display().to_string()), block: 0, state, durable_id: None, found: found.into() });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    /// Several clients' reports as one: every count added (entries too), failures in turn,
    /// at most 100 listed.
    #[test]
    fn reports_sum_count_by_count() {
        let f = |block| OracleFailure { file: None, path: None, block, state: BlockState::DurableLost, durable_id: Some(1), found: "zeros".into() };
        let a = OracleReport {
            counts: OracleCounts { checked: 10, durable_kept: 6, unsynced_lost: 2, durable_lost: 2, ..Default::default() },
            failures: vec![f(1), f(2)],
        };
        let b = OracleReport {
            counts: OracleCounts {
                checked: 200,
                durable_kept: 50,
                garbage: 150,
                entries: Some(EntryCounts { checked: 3, reappeared: 1, ..Default::default() }),
                ..Default::default()
            },
            failures: (100..200).map(f).collect(),
        };
        let s = OracleReport::sum([&a, &b]);
        let c = s.counts;
        assert_eq!((c.checked, c.durable_kept, c.unsynced_lost, c.durable_lost, c.garbage), (210, 56, 2, 2, 150));
        assert_eq!(c.entries.map(|e| (e.checked, e.reappeared)), Some((3, 1)));
        assert_eq!(c.failures(), a.counts.failures() + b.counts.failures());
        assert_eq!(s.failures.len(), LISTED);
        assert_eq!((s.failures[0].block, s.failures[1].block, s.failures[2].block, s.failures[99].block), (1, 2, 100, 197));
    }

    fn content(id: u64) -> Vec<u8> {
        let mut b = vec![0u8; BLOCK];
        fill_block(id, 7, &mut b);
        b
    }

    #[test]
    fn each_state_from_what_was_read() {
        let (a, b, c) = (content(1), content(2), content(3));
        let zeros = vec![0u8; BLOCK];
        let st = |got: &[u8], dur: Option<u64>, later: &[u64], torn| classify(&Read::Data(got), dur, later, 7, torn);
        // synced, nothing after: kept, or lost when anything else is there
        assert_eq!(st(&a, Some(1), &[], false), BlockState::DurableKept);
        assert_eq!(st(&zeros, Some(1), &[], false), BlockState::DurableLost);
        assert_eq!(st(&b, Some(1), &[], false), BlockState::DurableLost);
        // synced, then rewritten twice: any of the later contents, or back to the durable one
        assert_eq!(st(&c, Some(1), &[2, 3], false), BlockState::UnsyncedKept);
        assert_eq!(st(&b, Some(1), &[2, 3], false), BlockState::UnsyncedKept);
        assert_eq!(st(&a, Some(1), &[2, 3], false), BlockState::UnsyncedLost);
        assert_eq!(st(&zeros, Some(1), &[2, 3], false), BlockState::DurableLost);
        // never synced: zeros is what was there before
        assert_eq!(st(&zeros, None, &[2], false), BlockState::UnsyncedLost);
        assert_eq!(st(&b, None, &[2], false), BlockState::UnsyncedKept);
        assert_eq!(st(&a, None, &[2], false), BlockState::Garbage);
        // the file or block is gone
        assert_eq!(classify(&Read::Absent("missing"), Some(1), &[], 7, false), BlockState::DurableLost);
        assert_eq!(classify(&Read::Absent("short"), None, &[2], 7, false), BlockState::UnsyncedLost);
        assert_eq!(classify(&Read::Unreadable(5), None, &[2], 7, false), BlockState::Garbage);
    }

    /// The record follows the workload's syncs: with fsync:N every block ends durable (the
    /// run's last fsync too); with O_DIRECT and no fsync nothing is acknowledged durable. The
    /// oracle then tells a lost durable block from a lost unsynced one on the real files.
    #[test]
    fn durability_follows_the_syncs_of_a_real_workload() {
        use crate::workload::{Interface, Maps, SyncMode, Workload};
        for (sync, engine) in [
            (SyncMode::Fsync(3), crate::workload::IoEngine::Psync),
            (SyncMode::Direct, crate::workload::IoEngine::IoUring),
            (SyncMode::Dsync, crate::workload::IoEngine::Psync),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let mut w = Workload::new(Interface::File { dir: dir.path().to_path_buf(), count: 2, size: 256 << 10 });
            (w.sync, w.engine, w.threads, w.size, w.seed) = (sync, engine, 2, Some(768 << 10), 5);
            w.pattern = crate::spec::workload::config::Pattern::Uniform;
            w.fit_profile();
            let mut maps = Maps::new(&w).unwrap();
            maps.track_durability().unwrap();
            let res = crate::workload::run(&w, &maps, None, None).unwrap();
            assert!(res.errors.is_empty(), "{sync:?}: {:?}", res.errors);
            let rep = verify_crash(&maps, false).unwrap();
            let written = maps.written_blocks();
            assert!(written > 40, "{written}");
            assert_eq!(rep.counts.checked, written, "{sync:?}: every written block is classified");
            match sync {
                // nothing unsynced is left after the run's own fsync; O_DSYNC is durable at once
                SyncMode::Fsync(_) | SyncMode::Dsync => assert_eq!(rep.counts.durable_kept, written, "{sync:?}: {:?}", rep.counts),
                // O_DIRECT reaches the device but no flush followed: written, never durable
                _ => assert_eq!(rep.counts.unsynced_kept, written, "{sync:?}: {:?}", rep.counts),
            }
            assert_eq!(rep.counts.failures(), 0);
            // a block lost: durable -> durable-lost (a failure); unsynced -> unsynced-lost
            let (b, _) = maps.maps[1].written().next().unwrap();
            let f = std::fs::OpenOptions::new().write(true).open(maps.file_path(1).unwrap()).unwrap();
            f.write_all_at(&[0u8; BLOCK], b * BLOCK as u64).unwrap();
            f.sync_all().unwrap();
            let after = verify_crash(&maps, false).unwrap();
            match sync {
                SyncMode::Direct => assert_eq!((after.counts.unsynced_lost, after.counts.failures()), (1, 0), "{:?}", after.counts),
                _ => {
                    assert_eq!((after.counts.durable_lost, after.failures.len()), (1, 1), "{:?}", after.counts);
                    assert_eq!((after.failures[0].file, after.failures[0].block, after.failures[0].found.as_str()), (Some(1), b, "zeros"));
                }
            }
            // a file gone: its entry was made durable before the workload
            std::fs::remove_file(maps.file_path(0).unwrap()).unwrap();
            let gone = verify_crash(&maps, false).unwrap();
            assert_eq!(gone.counts.files_lost, 1);
            assert!(gone.counts.failures() >= 1);
        }
    }

    /// varmail (4 threads, 3000 flowops) in `dir` with the durability record, `keys` added
    /// to its workload: the run, which must have no error.
    fn varmail(dir: &std::path::Path, keys: &str) -> crate::workload::WorkloadResult {
        let y = format!("workload:\n  personality: varmail\n  dir: {}\n  scale: 0.05\n  threads: 4\n  ops: 3000\n  {keys}\n", dir.display());
        let w = crate::spec::workload::parse_workload(&y, "t.yaml", None).unwrap();
        let mut maps = crate::workload::Maps::new(&w).unwrap();
        maps.track_durability().unwrap();
        let res = crate::workload::run(&w, &maps, None, None).unwrap();
        assert!(res.errors.is_empty(), "{:?}", res.errors);
        res
    }

    /// A real varmail run on a temporary directory, followed as for a power cut (none comes):
    /// with `fsync_dir` created files become durable entries, without it none does; every path
    /// is found in its last state (no failure); then a durable file removed, a durable block
    /// zeroed and a durably absent path created are each a failure of their own kind.
    #[test]
    fn a_personality_s_entries_and_contents_follow_its_fsyncs() {
        for fsync_dir in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let res = varmail(dir.path(), &format!("fsync_dir: {fsync_dir}"));
            let maps = res.maps.unwrap();
            let e = maps.durability.as_ref().unwrap().entries.as_ref().unwrap();
            let created_durable = e.lock().paths.iter().filter(|p| p.durable.is_some_and(|g| g > 1)).count();
            if fsync_dir {
                assert!(created_durable > 5, "{created_durable}");
            } else {
                assert_eq!(created_durable, 0, "no directory fsync: no created file is a durable entry");
            }
            let rep = verify_crash(&maps, false).unwrap();
            let c = rep.counts;
            let ec = c.entries.unwrap();
            assert_eq!((c.failures(), ec.durable_lost, ec.reappeared), (0, 0, 0), "{c:?} {:?}", rep.failures);
            assert_eq!(c.durable_kept + c.unsynced_kept + c.unsynced_lost + c.durable_lost + c.garbage + c.torn, c.checked);
            assert!(c.durable_kept > 0 && ec.checked > 10, "{c:?}");
            assert_eq!(ec.checked, ec.durable_kept + ec.unsynced_kept + ec.unsynced_lost, "{ec:?}");
            if !fsync_dir {
                continue;
            }
            // a durable file, unchanged since, with durable blocks: remove one, zero another's block
            let (gone, zeroed, absent) = {
                let g = e.lock();
                let stable: Vec<usize> = (0..g.paths.len())
                    .filter(|&i| g.paths[i].pending.is_empty() && g.paths[i].durable.is_some_and(|v| !g.paths[i].versions[&v].durable.is_empty()))
                    .collect();
                let absent = (0..g.paths.len()).find(|&i| g.paths[i].pending.is_empty() && g.paths[i].durable.is_none()).unwrap();
                (stable[0], stable[1], absent)
            };
            std::fs::remove_file(dir.path().join(&e.names[gone])).unwrap();
            let b = {
                let g = e.lock();
                let v = &g.paths[zeroed].versions[&g.paths[zeroed].durable.unwrap()];
                *v.durable.keys().min().unwrap()
            };
            let f = std::fs::OpenOptions::new().write(true).open(dir.path().join(&e.names[zeroed])).unwrap();
            f.write_all_at(&[0u8; BLOCK], b * BLOCK as u64).unwrap();
            f.sync_all().unwrap();
            std::fs::write(dir.path().join(&e.names[absent]), b"back").unwrap();
            let after = verify_crash(&maps, false).unwrap();
            let (c, ec) = (after.counts, after.counts.entries.unwrap());
            assert_eq!((ec.durable_lost, ec.reappeared, c.files_lost), (1, 1, 1), "{ec:?}");
            assert!(c.durable_lost >= 2, "the removed file's durable blocks and the zeroed one: {c:?}");
            let states: Vec<(Option<String>, BlockState)> = after.failures.iter().map(|f| (f.path.clone(), f.state)).collect();
            for (i, st) in [(gone, BlockState::EntryLost), (absent, BlockState::EntryReappeared), (zeroed, BlockState::DurableLost)] {
                assert!(states.contains(&(Some(e.names[i].display().to_string()), st)), "{st:?} of {}: {states:?}", e.names[i].display());
            }
        }
    }

    /// varmail with `replace: true` and `fsync_dir`, followed as for a power cut (none comes):
    /// renames become durable entries and every path is found in its last state; then the
    /// classic failures of a replace are each seen: a durably renamed file truncated to zero
    /// (ext4's "zero-length file after a crash"), one gone, and a renamed-away temp back.
    #[test]
    fn a_replace_workload_s_renames_are_followed_and_their_losses_seen() {
        let dir = tempfile::tempdir().unwrap();
        let res = varmail(dir.path(), "fsync_dir: true\n  replace: true");
        let renames = res.flowops["renamefile"].ops;
        assert!(renames > 50, "{renames} renames in 3000 flowops");
        assert!(res.flowops.contains_key("writewholefile"), "{:?}", res.flowops.keys());
        let maps = res.maps.unwrap();
        let e = maps.durability.as_ref().unwrap().entries.as_ref().unwrap();
        let n = e.names.len() / 2;
        let rep = verify_crash(&maps, false).unwrap();
        let (c, ec) = (rep.counts, rep.counts.entries.unwrap());
        assert_eq!((c.failures(), ec.durable_lost, ec.reappeared), (0, 0, 0), "{c:?} {:?}", rep.failures);
        let r = ec.renamed;
        assert!(r.checked > 5 && r.durable_kept > 5, "{r:?}");
        assert_eq!(r.checked, r.durable_kept + r.unsynced_kept + r.unsynced_lost + r.durable_lost, "{r:?}");
        // no temp is left: each rename took its temp away, and the directory fsync after it
        // made that durable
        let temps = std::fs::read_dir(dir.path().join(e.names[0].parent().unwrap()))
            .unwrap()
            .filter(|d| d.as_ref().unwrap().file_name().to_string_lossy().ends_with(".tmp"))
            .count();
        assert_eq!(temps, 0);
        // two destinations of durable renames with durable content, and a temp renamed away
        let (zeroed, gone, temp) = {
            let g = e.lock();
            let d: Vec<usize> = (0..n)
                .filter(|&i| {
                    g.paths[i].pending.is_empty()
                        && g.paths[i].durable_renamed
                        && g.paths[i].durable.is_some_and(|v| !g.paths[i].versions[&v].durable.is_empty())
                })
                .collect();
            let t = (n..2 * n).find(|&i| g.paths[i].pending.is_empty() && g.paths[i].durable.is_none() && g.paths[i - n].durable_renamed).unwrap();
            (d[0], d[1], t)
        };
        std::fs::OpenOptions::new().write(true).open(dir.path().join(&e.names[zeroed])).unwrap().set_len(0).unwrap();
        std::fs::remove_file(dir.path().join(&e.names[gone])).unwrap();
        std::fs::write(dir.path().join(&e.names[temp]), b"back").unwrap();
        let after = verify_crash(&maps, false).unwrap();
        let (c, ec) = (after.counts, after.counts.entries.unwrap());
        assert_eq!((ec.durable_lost, ec.renamed.durable_lost, ec.reappeared), (1, 1, 1), "{ec:?}");
        assert!(c.durable_lost >= 2, "the emptied file's durable blocks and the removed one's: {c:?}");
        let states: Vec<(Option<String>, BlockState, String)> = after.failures.iter().map(|f| (f.path.clone(), f.state, f.found.clone())).collect();
        let name = |i: usize| Some(e.names[i].display().to_string());
        assert!(states.contains(&(name(zeroed), BlockState::DurableLost, "short".into())), "{states:?}");
        assert!(states.contains(&(name(gone), BlockState::EntryLost, "missing".into())), "{states:?}");
        assert!(states.contains(&(name(temp), BlockState::EntryReappeared, "present".into())), "{states:?}");
    }

    #[test]
    fn torn_sectors_are_allowed_only_under_the_torn_model() {
        let (a, b) = (content(1), content(2));
        // first half of the new write, second half of the durable content
        let mut mix = b[..BLOCK / 2].to_vec();
        mix.extend_from_slice(&a[BLOCK / 2..]);
        assert_eq!(classify(&Read::Data(&mix), Some(1), &[2], 7, true), BlockState::Torn);
        assert_eq!(classify(&Read::Data(&mix), Some(1), &[2], 7, false), BlockState::DurableLost);
        // a never-synced block torn over zeros
        let mut z = vec![0u8; BLOCK];
        z[..SECTOR].copy_from_slice(&b[..SECTOR]);
        assert_eq!(classify(&Read::Data(&z), None, &[2], 7, true), BlockState::Torn);
        assert_eq!(classify(&Read::Data(&z), None, &[2], 7, false), BlockState::Garbage);
        // a sector that is in no allowed content is no tear
        let mut bad = mix.clone();
        bad[100] ^= 1;
        assert_eq!(classify(&Read::Data(&bad), Some(1), &[2], 7, true), BlockState::DurableLost);
        // a durable block with nothing written after it cannot be torn
        assert_eq!(classify(&Read::Data(&mix), Some(1), &[], 7, true), BlockState::DurableLost);
    }
}
