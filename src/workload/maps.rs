//! The content maps of one workload: one for the device, or one per file (index = file index),
//! plus what they describe, so a later `verify` finds the device or files again.
//! Saved as DIR/maps.json (the index) and DIR/map.bin or DIR/map-NNNN.bin (8 B per 4 KiB block).

use super::content_map::ContentMap;
use super::files::file_name;
use crate::spec::workload::config::{CONTENT_BLOCK, Interface, Workload};
use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

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
    /// An NBD export (`interface: nbd`), by its URI.
    Nbd {
        target: crate::spec::nbd::NbdTarget,
    },
}

pub struct Maps {
    pub target: Target,
    pub seed: u64,
    pub maps: Vec<ContentMap>,
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
                })
            }
            Interface::Nbd { target } => {
                let size = crate::nbd::client::Client::connect(target).with_context(|| format!("cannot reach {target}"))?.size();
                let span = w.span.unwrap_or(size);
                if span > size {
                    bail!("span {span} is larger than {target} ({size} bytes)");
                }
                Ok(Maps {
                    target: Target::Nbd { target: target.clone() },
                    seed: w.seed,
                    maps: vec![ContentMap::try_new(span / CONTENT_BLOCK, CONTENT_BLOCK as u32, w.seed)?],
                })
            }
            // a personality's files come and go: `run` returns their maps (WorkloadResult::maps)
            Interface::File { dir, .. } if w.personality.is_some() => {
                Ok(Maps { target: Target::File { dir: dir.clone(), names: vec![] }, seed: w.seed, maps: vec![] })
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
                })
            }
        }
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
        Ok(Maps { target: idx.target, seed: idx.seed, maps })
    }
}

pub use crate::sys::file_size as device_size;
