//! Duplicate-content profiles: how many distinct block contents a real data set has at each
//! copy count. Text format (DEDISbench's): one `<duplicates> <blocks>` pair per line, meaning
//! "<blocks> distinct contents each stored <duplicates>+1 times". `#` starts a comment.
//!
//! `measure` builds a profile from real data (XXH3-128 per block); `Stream` turns one into a
//! reproducible stream of content ids.

use super::block_hash;
use anyhow::{Context, Result};
use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

#[derive(Clone, Debug, PartialEq)]
pub struct Profile {
    /// (copies >= 1, number of distinct contents with that many copies), sorted by copies.
    pub classes: Vec<(u64, u64)>,
}

impl Profile {
    /// All blocks unique.
    pub fn none() -> Profile {
        Profile { classes: vec![(1, 1)] }
    }

    pub fn parse(text: &str, source: &str) -> Result<Profile, String> {
        let mut acc: HashMap<u64, u64> = HashMap::new();
        for (i, line) in text.lines().enumerate() {
            let l = line.split('#').next().unwrap().trim();
            if l.is_empty() {
                continue;
            }
            let bad = || format!("{source}:{}: `{l}` is not `<duplicates> <blocks>` (two whole numbers, e.g. `0 1000`)", i + 1);
            let mut it = l.split_whitespace();
            let (Some(d), Some(n), None) = (it.next(), it.next(), it.next()) else { return Err(bad()) };
            let d: u64 = d.parse().map_err(|_| bad())?;
            let n: u64 = n.parse().map_err(|_| bad())?;
            if n > 0 {
                *acc.entry(d + 1).or_default() += n;
            }
        }
        if acc.is_empty() {
            return Err(format!("{source}: no `<duplicates> <blocks>` lines: the profile is empty"));
        }
        let mut classes: Vec<(u64, u64)> = acc.into_iter().collect();
        classes.sort();
        Ok(Profile { classes })
    }

    pub fn load(path: &Path) -> Result<Profile> {
        let text = std::fs::read_to_string(path).with_context(|| format!("cannot read profile {}", path.display()))?;
        Profile::parse(&text, &path.display().to_string()).map_err(anyhow::Error::msg)
    }

    pub fn to_text(&self, header: &str) -> String {
        let mut s = String::new();
        for l in header.lines() {
            s.push_str(&format!("# {l}\n"));
        }
        s.push_str(&format!("# blocks {} distinct {} dedup-ratio {:.4}\n", self.total_blocks(), self.distinct(), self.dedup_ratio()));
        for (c, n) in &self.classes {
            s.push_str(&format!("{} {n}\n", c - 1));
        }
        s
    }

    /// Logical blocks the profile describes.
    pub fn total_blocks(&self) -> u64 {
        self.classes.iter().map(|(c, n)| c * n).sum()
    }

    pub fn distinct(&self) -> u64 {
        self.classes.iter().map(|(_, n)| n).sum()
    }

    /// Logical blocks per distinct block.
    pub fn dedup_ratio(&self) -> f64 {
        self.total_blocks() as f64 / self.distinct() as f64
    }

    /// The same shape scaled to about `blocks` logical blocks (each class keeps its copy
    /// count; at least one content survives per class that had one at this scale).
    pub fn scaled(&self, blocks: u64) -> Profile {
        let f = blocks as f64 / self.total_blocks() as f64;
        let mut classes: Vec<(u64, u64)> = self.classes.iter().map(|(c, n)| (*c, (*n as f64 * f).round() as u64)).filter(|(_, n)| *n > 0).collect();
        if classes.is_empty() {
            classes.push((1, blocks.max(1)));
        }
        Profile { classes }
    }
}

/// Per-content copy counts gathered from data.
#[derive(Default)]
pub struct Measure {
    counts: HashMap<u128, u64>,
    pub blocks: u64,
    pub bytes: u64,
    pub files: u64,
    block_size: usize,
}

impl Measure {
    pub fn new(block_size: usize) -> Measure {
        Measure { block_size, ..Default::default() }
    }

    /// Count every block of a stream; a short last block is zero-padded (as a file system
    /// stores it).
    pub fn add_reader(&mut self, mut r: impl Read) -> std::io::Result<()> {
        let bs = self.block_size;
        let mut buf = vec![0u8; bs * 256];
        let mut fill = 0usize;
        loop {
            let n = r.read(&mut buf[fill..])?;
            fill += n;
            if n == 0 || fill == buf.len() {
                let whole = fill / bs * bs;
                for c in buf[..whole].chunks_exact(bs) {
                    *self.counts.entry(block_hash(c)).or_default() += 1;
                }
                self.blocks += (whole / bs) as u64;
                self.bytes += whole as u64;
                buf.copy_within(whole..fill, 0);
                fill -= whole;
                if n == 0 {
                    if fill > 0 {
                        buf[fill..bs].fill(0);
                        *self.counts.entry(block_hash(&buf[..bs])).or_default() += 1;
                        self.blocks += 1;
                        self.bytes += fill as u64;
                    }
                    return Ok(());
                }
            }
        }
    }

    /// Walk files, directories (recursively, not following symlinks) and block devices.
    pub fn add_path(&mut self, p: &Path) -> Result<()> {
        let meta = std::fs::symlink_metadata(p).with_context(|| format!("cannot stat {}", p.display()))?;
        let ft = meta.file_type();
        use std::os::unix::fs::FileTypeExt;
        if ft.is_dir() {
            let mut entries: Vec<_> = std::fs::read_dir(p).with_context(|| format!("cannot list {}", p.display()))?.flatten().map(|e| e.path()).collect();
            entries.sort();
            for e in entries {
                self.add_path(&e)?;
            }
        } else if ft.is_file() || ft.is_block_device() {
            let f = std::fs::File::open(p).with_context(|| format!("cannot open {}", p.display()))?;
            self.add_reader(std::io::BufReader::with_capacity(1 << 20, f)).with_context(|| format!("cannot read {}", p.display()))?;
            self.files += 1;
        }
        // symlinks, sockets, fifos: skipped (not data)
        Ok(())
    }

    pub fn profile(&self) -> Profile {
        let mut by_copies: HashMap<u64, u64> = HashMap::new();
        for c in self.counts.values() {
            *by_copies.entry(*c).or_default() += 1;
        }
        let mut classes: Vec<(u64, u64)> = by_copies.into_iter().collect();
        classes.sort();
        if classes.is_empty() {
            return Profile::none();
        }
        Profile { classes }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_print() {
        let p = Profile::parse("# kernel\n0 100\n1 10 # pairs\n\n4 2\n", "p").unwrap();
        assert_eq!(p.classes, vec![(1, 100), (2, 10), (5, 2)]);
        assert_eq!(p.total_blocks(), 130);
        assert_eq!(p.distinct(), 112);
        assert_eq!(Profile::parse(&p.to_text("x"), "q").unwrap(), p);
        assert!(Profile::parse("1 2 3\n", "f").unwrap_err().contains("f:1:"));
        assert!(Profile::parse("# nothing\n", "f").is_err());
    }

    #[test]
    fn measure_counts_duplicates() {
        let mut data = vec![0u8; 4096 * 6];
        for (i, id) in [1u64, 2, 1, 3, 1, 2].iter().enumerate() {
            crate::content::fill_block(*id, 0, &mut data[i * 4096..(i + 1) * 4096]);
        }
        data.extend_from_slice(b"tail");
        let mut m = Measure::new(4096);
        m.add_reader(&data[..]).unwrap();
        assert_eq!(m.blocks, 7);
        // id1 x3, id2 x2, id3 x1, padded tail x1
        assert_eq!(m.profile().classes, vec![(1, 2), (2, 1), (3, 1)]);
    }
}
