//! The written-content map: for every content block of the device, the id of the content last
//! written there (8 bytes per block; 0 = never written, else id + 1). Bytes are never kept:
//! verification regenerates them from (id, seed).

use anyhow::{Context, Result, bail};
use std::io::{Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// 02: content blocks from the seed's segment pool (`content::Pool`). A 01 map names contents
/// whose bytes were generated differently: it cannot be verified, so it is refused.
const MAGIC: &[u8; 8] = b"FLTMAP02";
/// Magic, block size (u32), seed, slot count (u64s): the slots follow.
const HEADER: u64 = 8 + 4 + 8 + 8;

/// `n` zeroed slots, or an error naming the size if they cannot be had.
fn zeroed_slots(n: u64) -> Result<Vec<AtomicU64>> {
    let too_big = || anyhow::anyhow!("cannot allocate a content map of {n} blocks ({} bytes)", n.saturating_mul(8));
    let n = usize::try_from(n).map_err(|_| too_big())?;
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| too_big())?;
    v.extend((0..n).map(|_| AtomicU64::new(0)));
    Ok(v)
}

pub struct ContentMap {
    pub block_size: u32,
    pub seed: u64,
    slots: Vec<AtomicU64>,
}

impl ContentMap {
    pub fn new(blocks: u64, block_size: u32, seed: u64) -> ContentMap {
        ContentMap { block_size, seed, slots: (0..blocks).map(|_| AtomicU64::new(0)).collect() }
    }

    /// Like `new`, for a size that comes from the user: a map too big to allocate is an
    /// error naming its size.
    pub fn try_new(blocks: u64, block_size: u32, seed: u64) -> Result<ContentMap> {
        Ok(ContentMap { block_size, seed, slots: zeroed_slots(blocks)? })
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
        // a file shorter than the header is named as such, not by the read's `failed to fill
        // whole buffer`
        let short = || format!("{} is not a faultline content map: shorter than its {HEADER}-byte header", path.display());
        let mut magic = [0u8; 8];
        f.read_exact(&mut magic).with_context(short)?;
        if &magic == b"FLTMAP01" {
            bail!(
                "{} is a content map of an older faultline, whose generated block content differs from this one's: it cannot be verified; run the workload again to make a new map",
                path.display()
            );
        }
        if &magic != MAGIC {
            bail!("{} is not a faultline content map", path.display());
        }
        let mut b4 = [0u8; 4];
        let mut b8 = [0u8; 8];
        f.read_exact(&mut b4).with_context(short)?;
        let block_size = u32::from_le_bytes(b4);
        f.read_exact(&mut b8).with_context(short)?;
        let seed = u64::from_le_bytes(b8);
        f.read_exact(&mut b8).with_context(short)?;
        let n = u64::from_le_bytes(b8);
        if !block_size.is_power_of_two() || !(512..=1 << 20).contains(&block_size) {
            bail!("{} is not a faultline content map (block size {block_size})", path.display());
        }
        // the header says how many slots follow: the file must hold exactly those
        let len = f.get_ref().metadata()?.len();
        if n.checked_mul(8).and_then(|b| b.checked_add(HEADER)) != Some(len) {
            bail!("{} is truncated or damaged: its header counts {n} blocks, the file has {len} bytes", path.display());
        }
        let mut slots = zeroed_slots(n)?;
        for s in slots.iter_mut() {
            f.read_exact(&mut b8).with_context(|| format!("{} is truncated", path.display()))?;
            *s.get_mut() = u64::from_le_bytes(b8);
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

    /// A map of the earlier content generator names bytes this build cannot regenerate.
    #[test]
    fn older_maps_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("map");
        ContentMap::new(3, 4096, 9).save(&p).unwrap();
        let mut b = std::fs::read(&p).unwrap();
        b[..8].copy_from_slice(b"FLTMAP01");
        std::fs::write(&p, &b).unwrap();
        let e = ContentMap::load(&p).err().expect("an older map").to_string();
        assert!(e.contains("older faultline") && e.contains("run the workload again"), "{e}");
    }

    /// Sizes from the user or from a file: an error, not an aborted allocation.
    #[test]
    fn impossible_sizes_are_errors() {
        let e = ContentMap::try_new(u64::MAX / 4096, 4096, 1).err().expect("a map of 2^52 blocks").to_string();
        assert!(e.contains("cannot allocate a content map of 4503599627370495 blocks"), "{e}");
        // a header that claims more blocks than the file holds
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("map");
        ContentMap::new(3, 4096, 9).save(&p).unwrap();
        let mut b = std::fs::read(&p).unwrap();
        b[20..28].copy_from_slice(&u64::MAX.to_le_bytes());
        std::fs::write(&p, &b).unwrap();
        let e = ContentMap::load(&p).err().expect("a damaged map").to_string();
        assert!(e.contains("truncated or damaged") && e.contains("18446744073709551615 blocks"), "{e}");
        // cut inside the header: the error names the file and its header's size
        for cut in [3, 10, 20] {
            std::fs::write(&p, &b[..cut]).unwrap();
            let e = format!("{:#}", ContentMap::load(&p).err().expect("a cut map"));
            assert!(e.contains(&p.display().to_string()) && e.contains("shorter than its 28-byte header"), "{e}");
        }
    }
}
