//! Crash states of a write log: epochs (the writes between two flushes), and the states a
//! crash at the end of an epoch can leave, each named by a stable id that rebuilds it.
//!
//! - `eN`: the flush boundary: every entry through epoch N (the disk honoured every flush and
//!   the crash came right after epoch N's flush; for the last epoch, which no flush ends:
//!   every entry of the log).
//! - `eN-sK`: everything through epoch N-1, plus the K-th random subset of epoch N's writes
//!   and discards (each kept with probability 1/2; CrashMonkey's random subsets).
//! - `eN-tK`: everything through epoch N-1, plus the K-th torn variant of epoch N: each 512 B
//!   sector of each write kept with probability 1/2 (a later write's kept sector wins), each
//!   discard kept or not.
//!
//! FUA writes are durable once completed: every state keeps them whole. The random choices
//! come from (seed, N, kind, K) alone, so an id and the seed rebuild the same state anywhere.

use crate::disk::logwrites::{Kind, Log};
use anyhow::{Result, bail};
use rand::{Rng, SeedableRng};
use std::fmt;

/// Sector granularity of torn variants.
pub const TORN_SECTOR: u64 = 512;

/// Epoch `n` = entries `[start, end)`; `flushed`: a flush ends it (else it is the log's tail).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Epoch {
    pub n: usize,
    pub start: usize,
    pub end: usize,
    pub flushed: bool,
    /// Writes and discards in it.
    pub writes: usize,
}

/// Split `log` at its flushes. A pure FLUSH entry closes its epoch; a write carrying a preflush
/// starts the next one (everything before it is durable, it is not yet).
pub fn epochs(log: &Log) -> Vec<Epoch> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut writes = 0;
    for (i, e) in log.entries.iter().enumerate() {
        let (close_before, close_after) = match e.kind {
            Kind::Flush => (false, true),
            Kind::Write { .. } if e.preflush() => (true, false),
            _ => (false, false),
        };
        if close_before {
            out.push(Epoch { n: out.len(), start, end: i, flushed: true, writes });
            start = i;
            writes = 0;
        }
        if matches!(e.kind, Kind::Write { .. } | Kind::Discard) {
            writes += 1;
        }
        if close_after {
            out.push(Epoch { n: out.len(), start, end: i + 1, flushed: true, writes });
            start = i + 1;
            writes = 0;
        }
    }
    if start < log.entries.len() || out.is_empty() {
        out.push(Epoch { n: out.len(), start, end: log.entries.len(), flushed: false, writes });
    }
    out
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Variant {
    Boundary,
    Subset(u32),
    Torn(u32),
}

/// A crash state's id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StateId {
    pub epoch: usize,
    pub variant: Variant,
}

impl fmt::Display for StateId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.variant {
            Variant::Boundary => write!(f, "e{}", self.epoch),
            Variant::Subset(k) => write!(f, "e{}-s{k}", self.epoch),
            Variant::Torn(k) => write!(f, "e{}-t{k}", self.epoch),
        }
    }
}

impl std::str::FromStr for StateId {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<StateId> {
        let bad = || anyhow::anyhow!("state id {s:?}: expected eN (a flush boundary), eN-sK (a random subset) or eN-tK (a torn variant), e.g. e12-s3");
        let rest = s.strip_prefix('e').ok_or_else(bad)?;
        let (e, v) = match rest.split_once('-') {
            Some((e, v)) => (e, Some(v)),
            None => (rest, None),
        };
        let epoch = e.parse().map_err(|_| bad())?;
        let variant = match v {
            None => Variant::Boundary,
            Some(v) => {
                let (kind, k) = v.split_at(1.min(v.len()));
                let k = k.parse().map_err(|_| bad())?;
                match kind {
                    "s" => Variant::Subset(k),
                    "t" => Variant::Torn(k),
                    _ => return Err(bad()),
                }
            }
        };
        Ok(StateId { epoch, variant })
    }
}

/// What a state keeps on top of its base: whole entries, or some sectors of entries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Keep {
    Whole(usize),
    /// Entry index and, per 512 B sector of it, kept or not.
    Sectors(usize, Vec<bool>),
}

/// A state as data: every entry before `base_end` applied, then `keep` in order.
#[derive(Clone, Debug)]
pub struct Plan {
    pub id: StateId,
    pub base_end: usize,
    pub keep: Vec<Keep>,
    /// Of the epoch's writes and discards: kept whole, lost whole, torn.
    pub kept: u64,
    pub lost: u64,
    pub torn: u64,
}

fn rng(seed: u64, epoch: usize, kind: u64, k: u32) -> rand::rngs::StdRng {
    // splitmix-style mixing: distinct (epoch, kind, k) give unrelated streams
    let mut x =
        seed ^ (epoch as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ kind.wrapping_mul(0xBF58_476D_1CE4_E5B9) ^ (k as u64).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 31;
    rand::rngs::StdRng::seed_from_u64(x)
}

/// The plan of state `id` of `log` (epochs from `epochs`) with the exploration's `seed`.
pub fn plan(log: &Log, eps: &[Epoch], id: StateId, seed: u64) -> Result<Plan> {
    let Some(ep) = eps.get(id.epoch) else {
        bail!("state {id}: the log has epochs e0 to e{} (no e{})", eps.len().saturating_sub(1), id.epoch);
    };
    let mut p = Plan { id, base_end: ep.start, keep: vec![], kept: 0, lost: 0, torn: 0 };
    let writes = || (ep.start..ep.end).filter(|&i| matches!(log.entries[i].kind, Kind::Write { .. } | Kind::Discard));
    match id.variant {
        Variant::Boundary => {
            p.base_end = ep.end;
            p.kept = ep.writes as u64;
        }
        Variant::Subset(k) => {
            let mut r = rng(seed, id.epoch, 1, k);
            for i in writes() {
                if log.entries[i].fua() || r.random_bool(0.5) {
                    p.keep.push(Keep::Whole(i));
                    p.kept += 1;
                } else {
                    p.lost += 1;
                }
            }
        }
        Variant::Torn(k) => {
            let mut r = rng(seed, id.epoch, 2, k);
            for i in writes() {
                let e = &log.entries[i];
                if e.fua() {
                    p.keep.push(Keep::Whole(i));
                    p.kept += 1;
                    continue;
                }
                match e.kind {
                    Kind::Discard => {
                        if r.random_bool(0.5) {
                            p.keep.push(Keep::Whole(i));
                            p.kept += 1;
                        } else {
                            p.lost += 1;
                        }
                    }
                    _ => {
                        let mask: Vec<bool> = (0..e.len.div_ceil(TORN_SECTOR)).map(|_| r.random_bool(0.5)).collect();
                        match mask.iter().filter(|&&b| b).count() {
                            0 => p.lost += 1,
                            n if n == mask.len() => {
                                p.keep.push(Keep::Whole(i));
                                p.kept += 1;
                            }
                            _ => {
                                p.keep.push(Keep::Sectors(i, mask));
                                p.torn += 1;
                            }
                        }
                    }
                }
            }
        }
    }
    Ok(p)
}

/// Every state an exploration checks, in order: for each epoch from `first` on, its subsets
/// and torn variants (up to `per_epoch` each; none when the epoch has fewer than 2 writes),
/// then its flush boundary.
pub fn enumerate(eps: &[Epoch], first: usize, per_epoch: u32) -> Vec<StateId> {
    let mut out = Vec::new();
    for ep in eps.iter().skip(first) {
        if ep.writes >= 2 {
            for k in 0..per_epoch {
                out.push(StateId { epoch: ep.n, variant: Variant::Subset(k) });
            }
        }
        if ep.writes >= 1 {
            for k in 0..per_epoch {
                out.push(StateId { epoch: ep.n, variant: Variant::Torn(k) });
            }
        }
        out.push(StateId { epoch: ep.n, variant: Variant::Boundary });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_print_and_parse() {
        for s in ["e0", "e12-s3", "e7-t0"] {
            assert_eq!(s.parse::<StateId>().unwrap().to_string(), s);
        }
        for s in ["", "12", "e", "e1-x2", "e1-s", "ex-s1", "e1-s-1"] {
            assert!(s.parse::<StateId>().is_err(), "{s}");
        }
    }
}
