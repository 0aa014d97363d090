//! The content maps of one workload: one for the device, or one per file (index = file index),
//! plus what they describe, so a later `verify` finds the device or files again.
//! Saved as DIR/maps.json (the index) and DIR/map.bin or DIR/map-NNNN.bin (8 B per 4 KiB block).

use super::content_map::ContentMap;
use super::files::file_name;
use crate::spec::workload::config::{CONTENT_BLOCK, Interface, Workload};
use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "interface", rename_all = "snake_case")]
pub enum Target {
    Block {
        device: PathBuf,
    },
    File {
        dir: PathBuf,
        names: Vec<String>,
    },
    /// An NBD export (`interface: nbd`), by its URI; the workload's offset 0 is byte `base`
    /// of the export (`Workload::base`).
    Nbd {
        target: crate::spec::nbd::NbdTarget,
        #[serde(default, skip_serializing_if = "is_zero")]
        base: u64,
    },
}

pub struct Maps {
    pub target: Target,
    pub seed: u64,
    pub maps: Vec<ContentMap>,
    /// What was acknowledged durable and what was only written (the durability oracle, for a
    /// run with a power cut); None: not tracked, and the write path pays nothing for it.
    pub durability: Option<Durability>,
}

/// The durability oracle's record of one workload (docs/crash.md, "Crash and check in a run").
/// A write is acknowledged durable when a sync that started after it completed succeeded:
/// fsync of its file (fdatasync of a device, an NBD flush), or at once with O_DSYNC. Per map
/// and block, `durable` holds the id (+ 1, 0: none) of the last such content; `unsynced`
/// lists, in issue order, every write after its block's durable content (also failed writes:
/// their bytes may have reached the disk's cache). With the file interface the files are
/// created, sized, fsynced and their directory fsynced before the workload: their directory
/// entries and sizes are durable. A personality's files are followed by `entries` instead
/// (`workload::entries`).
pub struct Durability {
    pub durable: Vec<Vec<AtomicU64>>,
    pub unsynced: Mutex<Vec<Pending>>,
    /// Set by the power cut before the power goes: a sync that returns after that promised
    /// nothing (a real cut stops the application with the disk; a file system may still
    /// answer an fsync with success without reaching the dead disk), so none is credited.
    pub power_off: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// The syncs go through a file system, so `power_off` applies. A block device's (an NBD
    /// export's) sync is the disk's own word: the disk's cache fails every flush once the
    /// power is off, so a sync that succeeded flushed wholly before the cut, even if it
    /// returns after `power_off` was set, and its writes are in the durable state.
    pub syncs_through_fs: bool,
    /// A personality's files (created and deleted as it runs): their entries, versions and
    /// contents (`durable` and `unsynced` are then empty).
    pub entries: Option<Box<super::entries::EntryOracle>>,
    /// Where a personality's record also hands its changes (`crash explore` keeps them to
    /// rebuild the record as of each crash state); None: nowhere.
    pub entry_log: Option<std::sync::Arc<dyn super::entries::EntryLog>>,
}

/// One write not (yet) acknowledged durable: map index, 4 KiB block, content id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pending {
    pub map: u32,
    pub block: u64,
    pub id: u64,
    /// The write failed: never promoted to durable by a later sync.
    pub failed: bool,
}

impl Durability {
    /// Empty records for maps of these sizes (in blocks).
    pub fn new(sizes: impl Iterator<Item = u64>) -> Result<Durability> {
        let durable = sizes
            .map(|n| {
                let n = usize::try_from(n)?;
                let mut v = Vec::new();
                v.try_reserve_exact(n).map_err(|_| anyhow::anyhow!("cannot allocate the durability oracle for {n} blocks"))?;
                v.extend((0..n).map(|_| AtomicU64::new(0)));
                Ok(v)
            })
            .collect::<Result<_>>()?;
        Ok(Durability { durable, unsynced: Mutex::new(Vec::new()), power_off: Default::default(), syncs_through_fs: true, entries: None, entry_log: None })
    }

    /// The record of a personality's run: its files' entries and versions.
    pub fn of_entries(e: super::entries::EntryOracle) -> Durability {
        Durability {
            durable: Vec::new(),
            unsynced: Mutex::new(Vec::new()),
            power_off: e.power_off.clone(),
            syncs_through_fs: true,
            entries: Some(Box::new(e)),
            entry_log: None,
        }
    }

    /// Content `id` of block `block` of map `map` is acknowledged durable.
    pub fn set_durable(&self, map: usize, block: u64, id: u64) {
        self.durable[map][block as usize].store(id + 1, Relaxed);
    }

    pub fn durable(&self, map: usize, block: u64) -> Option<u64> {
        self.durable.get(map)?.get(block as usize).and_then(|s| s.load(Relaxed).checked_sub(1))
    }

    /// Writes still unsynced when a workload thread ended.
    pub fn add_unsynced(&self, p: impl IntoIterator<Item = Pending>) {
        self.unsynced.lock().unwrap().extend(p);
    }
}

impl std::fmt::Debug for Maps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Maps").field("target", &self.target).field("seed", &self.seed).field("maps", &self.maps.len()).finish()
    }
}

#[derive(Serialize, Deserialize)]
struct Index {
    #[serde(flatten)]
    target: Target,
    seed: u64,
    map_files: Vec<String>,
}

impl Maps {
    /// Empty maps sized for the workload: the device span, or each file's size.
    pub fn new(w: &Workload) -> Result<Maps> {
        match &w.interface {
            Interface::Block { device } => {
                let size = device_size(device)?;
                let span = w.span.unwrap_or(size);
                if span > size {
                    bail!("span {span} is larger than {} ({size} bytes)", device.display());
                }
                Ok(Maps {
                    target: Target::Block { device: device.clone() },
                    seed: w.seed,
                    maps: vec![ContentMap::try_new(span / CONTENT_BLOCK, CONTENT_BLOCK as u32, w.seed)?],
                    durability: None,
                })
            }
            Interface::Nbd { target } => {
                let size = crate::nbd::client::Client::connect(target).with_context(|| format!("cannot reach {target}"))?.size();
                let span = w.span.unwrap_or(size.saturating_sub(w.base));
                if w.base.checked_add(span).is_none_or(|end| end > size) {
                    bail!("span {span} from byte {} is larger than {target} ({size} bytes)", w.base);
                }
                Ok(Maps {
                    target: Target::Nbd { target: target.clone(), base: w.base },
                    seed: w.seed,
                    maps: vec![ContentMap::try_new(span / CONTENT_BLOCK, CONTENT_BLOCK as u32, w.seed)?],
                    durability: None,
                })
            }
            // a personality's files come and go: `run` returns their maps (WorkloadResult::maps)
            Interface::File { dir, .. } if w.personality.is_some() => {
                Ok(Maps { target: Target::File { dir: dir.clone(), names: vec![] }, seed: w.seed, maps: vec![], durability: None })
            }
            Interface::File { dir, count, size } => {
                // a slot (8 bytes) per 4 KiB block of every file, and a name and a map per file:
                // more than the machine has is an error, not an aborted allocation
                let need = (*count as u64).checked_mul(size / CONTENT_BLOCK * 8 + 64);
                let fmt = crate::spec::units::format_size;
                match need {
                    None => bail!("{count} files of {}: their content maps would need more than 2^64 bytes", fmt(*size)),
                    Some(n) if crate::sys::mem_total().is_some_and(|m| n > m) => {
                        bail!("{count} files of {}: their content maps need {}, more than this machine's memory", fmt(*size), fmt(n))
                    }
                    Some(_) => {}
                }
                Ok(Maps {
                    target: Target::File { dir: dir.clone(), names: (0..*count as usize).map(file_name).collect() },
                    seed: w.seed,
                    maps: (0..*count).map(|_| ContentMap::try_new(size / CONTENT_BLOCK, CONTENT_BLOCK as u32, w.seed)).collect::<Result<_>>()?,
                    durability: None,
                })
            }
        }
    }

    /// Track durability (the oracle) for this workload's writes.
    pub fn track_durability(&mut self) -> Result<()> {
        let mut d = Durability::new(self.maps.iter().map(|m| m.len()))?;
        d.syncs_through_fs = match &self.target {
            Target::Nbd { .. } => false,
            Target::Block { device } => !std::fs::metadata(device).is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_block_device(&m.file_type())),
            Target::File { .. } => true,
        };
        self.durability = Some(d);
        Ok(())
    }

    /// Path of file `i` (file interface).
    pub fn file_path(&self, i: usize) -> Option<PathBuf> {
        match &self.target {
            Target::File { dir, names } => names.get(i).map(|n| dir.join(n)),
            Target::Block { .. } | Target::Nbd { .. } => None,
        }
    }

    /// Blocks written (with a known content).
    pub fn written_blocks(&self) -> u64 {
        self.maps.iter().map(|m| m.written().count() as u64).sum()
    }

    pub fn save(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let map_files: Vec<String> = match self.target {
            Target::Block { .. } | Target::Nbd { .. } => vec!["map.bin".into()],
            Target::File { .. } => (0..self.maps.len()).map(|i| format!("map-{i:04}.bin")).collect(),
        };
        for (m, f) in self.maps.iter().zip(&map_files) {
            m.save(&dir.join(f))?;
        }
        let idx = Index { target: self.target.clone(), seed: self.seed, map_files };
        std::fs::write(dir.join("maps.json"), serde_json::to_vec_pretty(&idx)?).with_context(|| format!("cannot write {}/maps.json", dir.display()))
    }

    /// Load what `save` wrote. `dir` is the results directory (or its maps.json).
    pub fn load(dir: &Path) -> Result<Maps> {
        let dir = if dir.is_file() { dir.parent().unwrap_or(Path::new(".")) } else { dir };
        let p = dir.join("maps.json");
        let text = std::fs::read(&p).with_context(|| format!("cannot read {} (saved by `faultline workload --out`)", p.display()))?;
        let idx: Index = serde_json::from_slice(&text).with_context(|| format!("{} is not a faultline maps index", p.display()))?;
        let maps = idx.map_files.iter().map(|f| ContentMap::load(&dir.join(f))).collect::<Result<Vec<_>>>()?;
        Ok(Maps { target: idx.target, seed: idx.seed, maps, durability: None })
    }
}

pub use crate::sys::file_size as device_size;

fn is_zero(n: &u64) -> bool {
    *n == 0
}
