//! A personality's file sets laid out the way filebench's `fileset_populate` does it
//! (fileset.c): a tree whose mean depth is ln(entries) / ln(meandirwidth), each directory
//! drawing its depth and width from gamma distributions (shape 1.5, filebench's default
//! `dirgamma`), the root going on until every file has a place; each file's size drawn from
//! gamma(shape 1.5, mean `meanfilesize`) and a `prealloc` percentage of them existing before
//! the timed phase. Sizes are rounded to the nearest 4 KiB (content is mapped in 4 KiB
//! blocks; see docs/workload.md). Pure and seeded: the same seed gives the same layout.

use crate::spec::workload::config::{CONTENT_BLOCK, Personality, PersonalitySpec};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Gamma};
use std::path::PathBuf;

/// filebench's default `dirgamma` (1500 / 1000) and the size distribution's shape.
const DIR_GAMMA: f64 = 1.5;

/// One file of a file set.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// Relative to the workload's directory: `<fileset>/<dir serial>/.../<file serial>`.
    pub path: PathBuf,
    /// Bytes a whole-file write writes (filebench's `fse_size`), a multiple of 4 KiB.
    pub size: u64,
    /// Exists (written to `size`) before the timed phase.
    pub prealloc: bool,
    /// Index of its file set in `Layout::sets`.
    pub set: usize,
}

/// A named file set: `entries[first..first + count]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Set {
    pub name: &'static str,
    pub first: usize,
    pub count: usize,
    /// filebench's `readonly`: opened O_RDONLY.
    pub readonly: bool,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Layout {
    pub sets: Vec<Set>,
    pub entries: Vec<Entry>,
    /// Every directory holding files (relative), parents before children.
    pub dirs: Vec<PathBuf>,
}

struct Params {
    name: &'static str,
    nfiles: u64,
    meandirwidth: u64,
    meanfilesize: u64,
    size_gamma: f64,
    prealloc_pct: u8,
    readonly: bool,
}

/// The file sets of a personality: `bigfileset`, plus webserver's one-file `logfiles`.
pub fn layout(p: &PersonalitySpec, seed: u64) -> Layout {
    let big = Params {
        name: "bigfileset",
        nfiles: p.nfiles,
        meandirwidth: p.meandirwidth,
        meanfilesize: p.meanfilesize,
        size_gamma: p.size_gamma,
        prealloc_pct: p.prealloc_pct,
        readonly: p.kind == Personality::Webserver,
    };
    let mut sets = vec![big];
    if p.kind == Personality::Webserver {
        // webserver.f: logfiles, entries=1, same size distribution, prealloc (100%)
        sets.push(Params { name: "logfiles", nfiles: 1, readonly: false, prealloc_pct: 100, ..sets[0] });
    }
    let mut out = Layout { sets: Vec::new(), entries: Vec::new(), dirs: Vec::new() };
    for (i, s) in sets.iter().enumerate() {
        let mut rng = SmallRng::seed_from_u64(seed ^ 0xF11E_5E70_0000_0000 ^ i as u64);
        let first = out.entries.len();
        let mut g = Gen { p: s, set: i, rng: &mut rng, meandepth: depth_of(s), made: 0, out: &mut out };
        g.subdir(None, 1, 0.0);
        out.sets.push(Set { name: s.name, first, count: out.entries.len() - first, readonly: s.readonly });
    }
    out
}

/// filebench: meandepth = ln(entries + leafdirs) / ln(meandirwidth).
fn depth_of(s: &Params) -> f64 {
    if s.meandirwidth < 2 {
        return 1.0;
    }
    (s.nfiles as f64).ln() / (s.meandirwidth as f64).ln()
}

/// A gamma draw with shape `DIR_GAMMA` (or `shape`) and this mean; 0 for a mean of 0.
fn gamma(rng: &mut SmallRng, shape: f64, mean: f64) -> f64 {
    if mean <= 0.0 {
        return 0.0;
    }
    Gamma::new(shape, mean / shape).expect("positive shape and scale").sample(rng)
}

/// A file size: gamma(shape, mean), rounded to the nearest 4 KiB (0 allowed: filebench's
/// sizes can be below one block, and an empty file is a valid file).
pub fn file_size(rng: &mut SmallRng, shape: f64, mean: u64) -> u64 {
    let x = gamma(rng, shape, mean as f64);
    ((x / CONTENT_BLOCK as f64).round() as u64) * CONTENT_BLOCK
}

struct Gen<'g> {
    p: &'g Params,
    set: usize,
    rng: &'g mut SmallRng,
    meandepth: f64,
    /// Files placed so far.
    made: u64,
    out: &'g mut Layout,
}

impl Gen<'_> {
    /// fileset_populate_subdir: `parent` None is the root, which goes on until every file
    /// has a place; others hold up to their drawn width of files (leaf) or subdirectories.
    fn subdir(&mut self, parent: Option<&PathBuf>, serial: u64, depth: f64) {
        let depth = depth + 1.0;
        let name = format!("{serial:08}");
        let path = match parent {
            None => PathBuf::from(self.p.name).join(name),
            Some(p) => p.join(name),
        };
        let mut randepth = gamma(self.rng, DIR_GAMMA, self.meandepth).trunc();
        let mut ranwidth = gamma(self.rng, DIR_GAMMA, self.p.meandirwidth as f64);
        if randepth == 0.0 {
            randepth = 1.0;
        }
        if ranwidth == 0.0 {
            ranwidth = 1.0;
        }
        let leaf = depth >= randepth;
        let mut dir_listed = false;
        let mut i = 1u64;
        while (parent.is_none() || (i as f64) < ranwidth + 1.0) && self.made < self.p.nfiles {
            if parent.is_some() && leaf {
                if !dir_listed {
                    self.out.dirs.push(path.clone());
                    dir_listed = true;
                }
                let size = file_size(self.rng, self.p.size_gamma, self.p.meanfilesize);
                let prealloc = self.rng.random_range(0..100u8) < self.p.prealloc_pct;
                self.out.entries.push(Entry { path: path.join(format!("{i:08}")), size, prealloc, set: self.set });
                self.made += 1;
            } else {
                self.subdir(Some(&path), i, depth);
            }
            i += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn file_count_dirs_and_seeded() {
        for p in [Personality::Fileserver, Personality::Webserver, Personality::Varmail] {
            let spec = p.defaults().scaled(0.1);
            let l = layout(&spec, 7);
            assert_eq!(l.sets[0].count as u64, spec.nfiles, "{p:?}");
            assert_eq!(l, layout(&spec, 7), "same seed, same layout");
            assert_ne!(l, layout(&spec, 8));
            // every file's directory is listed, paths are unique
            let mut seen = std::collections::HashSet::new();
            for e in &l.entries {
                assert!(l.dirs.contains(&e.path.parent().unwrap().to_path_buf()));
                assert!(seen.insert(e.path.clone()));
                assert_eq!(e.size % CONTENT_BLOCK, 0);
            }
        }
        let l = layout(&Personality::Webserver.defaults(), 1);
        assert_eq!((l.sets[1].name, l.sets[1].count), ("logfiles", 1));
        assert!(l.entries[l.sets[1].first].prealloc);
    }

    #[test]
    fn sizes_follow_the_gamma_mean() {
        // fileserver: mean 128 KiB over 10000 files; gamma(1.5) has cv 0.82, so the sample
        // mean's standard error is under 1%: 4% is a tolerance that can fail
        let spec = Personality::Fileserver.defaults();
        let l = layout(&spec, 3);
        let mean = l.entries.iter().map(|e| e.size).sum::<u64>() as f64 / l.entries.len() as f64;
        assert!((mean / spec.meanfilesize as f64 - 1.0).abs() < 0.04, "mean size {mean}");
        // and it is a distribution, not a constant: about a quarter below half the mean
        let small = l.entries.iter().filter(|e| e.size < spec.meanfilesize / 2).count() as f64 / l.entries.len() as f64;
        assert!((0.15..0.35).contains(&small), "{small}");
        let pre = l.entries.iter().filter(|e| e.prealloc).count() as f64 / l.entries.len() as f64;
        assert!((pre - 0.8).abs() < 0.03, "prealloc share {pre}");
    }

    #[test]
    fn directory_width_is_the_mean_width() {
        // fileserver: 10000 files, mean width 20, so about 500 leaf directories of ~20 files
        let l = layout(&Personality::Fileserver.defaults(), 5);
        let mut per_dir: HashMap<PathBuf, usize> = HashMap::new();
        for e in &l.entries {
            *per_dir.entry(e.path.parent().unwrap().to_path_buf()).or_default() += 1;
        }
        let mean = l.entries.len() as f64 / per_dir.len() as f64;
        assert!((15.0..26.0).contains(&mean), "mean files per directory {mean} ({} dirs)", per_dir.len());
        // the tree has depth: each directory draws its depth (mean ln(10000)/ln(20) ~ 3), and
        // deep subtrees hold more of the files, so a file sits deeper than that on average
        let depth = l.entries.iter().map(|e| e.path.components().count() - 2).sum::<usize>() as f64 / l.entries.len() as f64;
        assert!((2.0..12.0).contains(&depth), "mean depth {depth}");
        // varmail (width 1000000): all files in one directory
        let v = layout(&Personality::Varmail.defaults(), 5);
        let dirs: std::collections::HashSet<_> = v.entries.iter().map(|e| e.path.parent().unwrap().to_path_buf()).collect();
        assert_eq!(dirs.len(), 1);
    }
}
