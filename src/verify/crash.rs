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
use crate::workload::maps::{Durability, Maps, Target};
use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::os::unix::fs::FileExt;

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
    /// entries and sizes were made durable before the workload).
    pub files_lost: u64,
}

impl OracleCounts {
    /// Blocks and files whose state breaks a durability promise.
    pub fn failures(&self) -> u64 {
        self.durable_lost + self.garbage + self.files_lost
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
        }
    }
}

/// One block that broke a promise.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OracleFailure {
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub file: Option<usize>,
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
        // experiment's target after power-on
        Target::Nbd { target } => {
            let c = crate::nbd::client::Client::connect(target).with_context(|| format!("cannot reach {target} to read what survived"))?;
            let len = c.size();
            one(&mut |b, off| c.read(off, b), len, d, 0, &later[0], maps.seed, torn_ok, None, &mut buf, &mut rep);
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
        rep.failures.push(OracleFailure { file, block, state: s, durable_id, found: describe(got) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

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
