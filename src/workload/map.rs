//! The written-content map: for every content block of the device, the id of the content last
//! written there (8 bytes per block; 0 = never written, else id + 1). Bytes are never kept:
//! verification regenerates them from (id, seed).

use anyhow::{Context, Result, bail};
use std::io::{Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

const MAGIC: &[u8; 8] = b"FLTMAP01";

pub struct ContentMap {
    pub block_size: u32,
    pub seed: u64,
    slots: Vec<AtomicU64>,
}

impl ContentMap {
    pub fn new(blocks: u64, block_size: u32, seed: u64) -> ContentMap {
        ContentMap { block_size, seed, slots: (0..blocks).map(|_| AtomicU64::new(0)).collect() }
    }

    pub fn len(&self) -> u64 {
        self.slots.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    #[inline]
    pub fn set(&self, block: u64, id: u64) {
        self.slots[block as usize].store(id + 1, Relaxed);
    }

    /// Forget a block (its write failed: its content is unknown).
    pub fn forget(&self, block: u64) {
        self.slots[block as usize].store(0, Relaxed);
    }

    #[inline]
    pub fn get(&self, block: u64) -> Option<u64> {
        match self.slots[block as usize].load(Relaxed) {
            0 => None,
            v => Some(v - 1),
        }
    }

    /// (block, id) of every written block, in block order.
    pub fn written(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        (0..self.len()).filter_map(|b| self.get(b).map(|id| (b, id)))
    }

    pub fn save(&self, path: &Path) -> Result<()> {
        let mut f = std::io::BufWriter::new(std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?);
        f.write_all(MAGIC)?;
        f.write_all(&self.block_size.to_le_bytes())?;
        f.write_all(&self.seed.to_le_bytes())?;
        f.write_all(&self.len().to_le_bytes())?;
        for s in &self.slots {
            f.write_all(&s.load(Relaxed).to_le_bytes())?;
        }
        f.flush()?;
        Ok(())
    }

    pub fn load(path: &Path) -> Result<ContentMap> {
        let mut f = std::io::BufReader::new(std::fs::File::open(path).with_context(|| format!("cannot open content map {}", path.display()))?);
        let mut magic = [0u8; 8];
        f.read_exact(&mut magic)?;
        if &magic != MAGIC {
            bail!("{} is not a faultline content map", path.display());
        }
        let mut b4 = [0u8; 4];
        let mut b8 = [0u8; 8];
        f.read_exact(&mut b4)?;
        let block_size = u32::from_le_bytes(b4);
        f.read_exact(&mut b8)?;
        let seed = u64::from_le_bytes(b8);
        f.read_exact(&mut b8)?;
        let n = u64::from_le_bytes(b8);
        let mut slots = Vec::with_capacity(n as usize);
        for _ in 0..n {
            f.read_exact(&mut b8).with_context(|| format!("{} is truncated", path.display()))?;
            slots.push(AtomicU64::new(u64::from_le_bytes(b8)));
        }
        Ok(ContentMap { block_size, seed, slots })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let m = ContentMap::new(100, 4096, 9);
        m.set(3, 0);
        m.set(50, 77);
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("map");
        m.save(&p).unwrap();
        let l = ContentMap::load(&p).unwrap();
        assert_eq!((l.block_size, l.seed, l.len()), (4096, 9, 100));
        assert_eq!(l.written().collect::<Vec<_>>(), vec![(3, 0), (50, 77)]);
    }
}
