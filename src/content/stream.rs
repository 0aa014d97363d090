//! A reproducible stream of content ids with a profile's duplicate structure.
//!
//! One cycle of the stream is a seeded random permutation of the profile's multiset of blocks:
//! over `total_blocks` writes every content appears exactly its number of copies, so the
//! written data has the profile's dedup ratio, and each single write draws a content with
//! probability proportional to its copies. Writes past one cycle start a new cycle with fresh
//! ids and a new permutation. The id of write n is computed directly (no state), so any
//! thread can ask "what will write n carry?" and faults can be aimed before the data exists.

use super::profile::Profile;
use super::seeded_hash;

#[derive(Clone, Debug)]
struct Class {
    copies: u64,
    /// First logical index of this class in the (unpermuted) cycle.
    start: u64,
    /// First content id (within a cycle) of this class.
    first_id: u64,
    count: u64,
}

#[derive(Clone, Debug)]
pub struct Stream {
    classes: Vec<Class>,
    total: u64,
    distinct: u64,
    seed: u64,
    half_bits: u32,
}

impl Stream {
    pub fn new(profile: &Profile, seed: u64) -> Stream {
        let mut classes = Vec::new();
        let (mut start, mut first_id) = (0, 0);
        // most duplicated first, so "the most duplicated content" is id 0 of each cycle
        for &(copies, count) in profile.classes.iter().rev() {
            classes.push(Class { copies, start, first_id, count });
            start += copies * count;
            first_id += count;
        }
        let total = start.max(1);
        let bits = 64 - (total - 1).leading_zeros();
        Stream { classes, total, distinct: first_id.max(1), seed, half_bits: bits.div_ceil(2).max(1) }
    }

    /// Blocks per cycle.
    pub fn cycle_len(&self) -> u64 {
        self.total
    }

    /// Content id carried by write number `n` (0-based, in write order).
    pub fn id_at(&self, n: u64) -> u64 {
        // all unique (profile none): any order is the profile; skip the permutation's cost
        if self.distinct == self.total {
            return n;
        }
        let cycle = n / self.total;
        let p = self.permute(n % self.total, cycle);
        let k = self.classes.partition_point(|c| c.start <= p) - 1;
        let c = &self.classes[k];
        cycle * self.distinct + c.first_id + (p - c.start) / c.copies
    }

    /// Copies of `id` in its cycle.
    pub fn copies_of(&self, id: u64) -> u64 {
        let local = id % self.distinct;
        let k = self.classes.partition_point(|c| c.first_id <= local) - 1;
        self.classes[k].copies
    }

    /// The content with the most copies in the first cycle (ties: the lowest id).
    pub fn most_duplicated(&self) -> u64 {
        0
    }

    /// The i-th content with a single copy in the first cycle, if the profile has that many.
    pub fn unique(&self, i: u64) -> Option<u64> {
        let c = self.classes.iter().find(|c| c.copies == 1)?;
        (i < c.count).then_some(c.first_id + i)
    }

    /// Seeded bijection on [0, total): a 4-round Feistel network on the smallest even-bit
    /// domain that holds `total`, cycle-walking until the value lands inside.
    fn permute(&self, x: u64, cycle: u64) -> u64 {
        let h = self.half_bits;
        let mask = (1u64 << h) - 1;
        let key = self.seed ^ cycle.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let mut v = x;
        loop {
            let (mut l, mut r) = (v >> h, v & mask);
            for round in 0..4u64 {
                let f = seeded_hash(key ^ round, &r.to_le_bytes()) & mask;
                (l, r) = (r, l ^ f);
            }
            v = (l << h) | r;
            if v < self.total {
                return v;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn one_cycle_has_the_profile_exactly() {
        let p = Profile::parse("0 500\n1 100\n9 20\n99 1\n", "t").unwrap();
        let s = Stream::new(&p, 7);
        assert_eq!(s.cycle_len(), p.total_blocks());
        let mut counts: HashMap<u64, u64> = HashMap::new();
        for n in 0..s.cycle_len() {
            *counts.entry(s.id_at(n)).or_default() += 1;
        }
        for (id, c) in &counts {
            assert_eq!(*c, s.copies_of(*id), "id {id}");
        }
        assert_eq!(counts.len() as u64, p.distinct());
        assert_eq!(counts[&s.most_duplicated()], 100);
        assert_eq!(counts[&s.unique(3).unwrap()], 1);
        // the next cycle uses fresh ids
        assert!(s.id_at(s.cycle_len()) >= p.distinct());
        // reproducible, and the seed matters
        let s2 = Stream::new(&p, 7);
        let s3 = Stream::new(&p, 8);
        let a: Vec<u64> = (0..200).map(|n| s.id_at(n)).collect();
        assert_eq!(a, (0..200).map(|n| s2.id_at(n)).collect::<Vec<_>>());
        assert_ne!(a, (0..200).map(|n| s3.id_at(n)).collect::<Vec<_>>());
    }
}
