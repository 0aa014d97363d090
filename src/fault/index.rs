//! Static interval index: an implicit augmented binary tree over intervals sorted by start
//! (the cgranges layout). Overlap queries cost O(log n + hits), so offset-rule matching does
//! not grow with the number of rules. Rebuilt (not edited) when the rule set changes.
//!
//! In front of the tree, a coarse occupancy bitmap (at most 2^16 buckets over [0, max end)):
//! a query whose buckets no interval touches is answered with one bit test instead of a
//! walk of cold arrays, which with many rules is most of a read's matching cost
//! (BENCHMARKS.md). Requests far from every targeted range, the usual case, take that path;
//! requests among dense rules still walk the tree.

pub struct IntervalIndex<T> {
    starts: Vec<u64>,
    ends: Vec<u64>,
    max_end: Vec<u64>,
    items: Vec<T>,
    root_level: i32,
    /// bit b set: some interval overlaps [b << shift, (b + 1) << shift)
    occupied: Vec<u64>,
    shift: u32,
}

/// Buckets of the occupancy bitmap, at most (8 KiB of bits: stays in cache).
const BUCKET_BITS: u32 = 16;
/// A query spanning more buckets than this skips the bitmap (a 1 GiB discard, say).
const MAX_BUCKETS_TESTED: u64 = 64;

impl<T> IntervalIndex<T> {
    /// Build from half-open intervals [start, end).
    pub fn build(mut v: Vec<(u64, u64, T)>) -> Self {
        v.sort_by_key(|x| x.0);
        let n = v.len();
        let mut starts = Vec::with_capacity(n);
        let mut ends = Vec::with_capacity(n);
        let mut items = Vec::with_capacity(n);
        for (s, e, t) in v {
            starts.push(s);
            ends.push(e);
            items.push(t);
        }
        let mut max_end = ends.clone();
        let root_level = index_prepare(&ends, &mut max_end);
        let top = ends.iter().copied().max().unwrap_or(0);
        let shift = (64 - top.saturating_sub(1).leading_zeros()).saturating_sub(BUCKET_BITS);
        let mut occupied = vec![0u64; ((top >> shift) as usize + 1).div_ceil(64)];
        for (&s, &e) in starts.iter().zip(&ends) {
            if s < e {
                for b in (s >> shift)..=((e - 1) >> shift) {
                    occupied[(b / 64) as usize] |= 1 << (b % 64);
                }
            }
        }
        IntervalIndex { starts, ends, max_end, items, root_level, occupied, shift }
    }

    /// False only if no interval can overlap [qs, qe) (qs < qe).
    #[inline]
    fn maybe_overlaps(&self, qs: u64, qe: u64) -> bool {
        let (b0, b1) = (qs >> self.shift, (qe - 1) >> self.shift);
        if b1 - b0 > MAX_BUCKETS_TESTED {
            return true;
        }
        (b0..=b1).any(|b| self.occupied.get((b / 64) as usize).is_some_and(|w| w & (1 << (b % 64)) != 0))
    }

    /// Call `f(start, end, item)` for every interval overlapping [qs, qe).
    #[inline]
    pub fn query(&self, qs: u64, qe: u64, mut f: impl FnMut(u64, u64, &T)) {
        let n = self.items.len() as i64;
        if n == 0 || qs >= qe || !self.maybe_overlaps(qs, qe) {
            return;
        }
        // (node, level, left-done)
        let mut stack: [(i64, i32, bool); 64] = [(0, 0, false); 64];
        let mut t = 0usize;
        stack[t] = ((1i64 << self.root_level) - 1, self.root_level, false);
        t += 1;
        while t > 0 {
            t -= 1;
            let (x, k, w) = stack[t];
            if k <= 3 {
                // small subtree: scan it linearly
                let i0 = x >> k << k;
                let i1 = (i0 + (1i64 << (k + 1)) - 1).min(n);
                let mut i = i0;
                while i < i1 && self.starts[i as usize] < qe {
                    let iu = i as usize;
                    if qs < self.ends[iu] {
                        f(self.starts[iu], self.ends[iu], &self.items[iu]);
                    }
                    i += 1;
                }
            } else if !w {
                let y = x - (1i64 << (k - 1));
                stack[t] = (x, k, true);
                t += 1;
                if y >= n || self.max_end[y as usize] > qs {
                    stack[t] = (y, k - 1, false);
                    t += 1;
                }
            } else if x < n && self.starts[x as usize] < qe {
                let xu = x as usize;
                if qs < self.ends[xu] {
                    f(self.starts[xu], self.ends[xu], &self.items[xu]);
                }
                stack[t] = (x + (1i64 << (k - 1)), k - 1, false);
                t += 1;
            }
        }
    }
}

/// Fill `max` (initialised to the ends) with subtree maxima; returns the root level.
fn index_prepare(ends: &[u64], max: &mut [u64]) -> i32 {
    let n = ends.len() as i64;
    if n == 0 {
        return 0;
    }
    let mut last_i = 0i64;
    let mut last = 0u64;
    let mut i = 0i64;
    while i < n {
        last_i = i;
        last = ends[i as usize];
        max[i as usize] = last;
        i += 2;
    }
    let mut k = 1i32;
    while (1i64 << k) <= n {
        let x = 1i64 << (k - 1);
        let i0 = (x << 1) - 1;
        let step = x << 2;
        let mut i = i0;
        while i < n {
            let el = max[(i - x) as usize];
            let er = if i + x < n { max[(i + x) as usize] } else { last };
            max[i as usize] = ends[i as usize].max(el).max(er);
            i += step;
        }
        last_i = if (last_i >> k) & 1 == 1 { last_i - x } else { last_i + x };
        if last_i < n && max[last_i as usize] > last {
            last = max[last_i as usize];
        }
        k += 1;
    }
    k - 1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn brute(v: &[(u64, u64, usize)], qs: u64, qe: u64) -> Vec<usize> {
        let mut r: Vec<usize> = v.iter().filter(|x| x.0 < qe && qs < x.1).map(|x| x.2).collect();
        r.sort();
        r
    }

    /// A seeded xorshift64 draw in [0, m).
    fn xorshift(mut seed: u64) -> impl FnMut(u64) -> u64 {
        move |m| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % m
        }
    }

    #[test]
    fn matches_brute_force() {
        let mut rnd = xorshift(12345u64);
        for n in [0usize, 1, 2, 3, 7, 8, 9, 33, 100, 1000, 5000] {
            let mut v = Vec::new();
            for i in 0..n {
                let s = rnd(100_000);
                let len = if rnd(10) == 0 { rnd(50_000) + 1 } else { rnd(100) + 1 };
                v.push((s, s + len, i));
            }
            let idx = IntervalIndex::build(v.clone());
            for _ in 0..300 {
                let qs = rnd(110_000);
                let qe = qs + rnd(5000) + 1;
                let mut got = Vec::new();
                idx.query(qs, qe, |_, _, &i| got.push(i));
                got.sort();
                assert_eq!(got, brute(&v, qs, qe), "n={n} q=[{qs},{qe})");
            }
        }
    }

    /// Sparse intervals over a large space (buckets much larger than a byte): the bitmap must
    /// never hide an overlap, including intervals that span buckets and queries at the edges.
    #[test]
    fn occupancy_bitmap_never_hides_an_overlap() {
        let mut rnd = xorshift(99u64);
        let space = 1u64 << 36;
        let v: Vec<(u64, u64, usize)> = (0..300)
            .map(|i| {
                let s = rnd(space);
                let len = if i % 10 == 0 { rnd(1 << 24) + 1 } else { rnd(1 << 13) + 1 };
                (s, s + len, i)
            })
            .collect();
        let idx = IntervalIndex::build(v.clone());
        assert!(idx.shift > 12, "buckets should be coarse here (shift {})", idx.shift);
        let mut queries: Vec<(u64, u64)> = (0..20_000)
            .map(|_| {
                let qs = rnd(space + (1 << 30));
                (qs, qs + rnd(1 << 17) + 1)
            })
            .collect();
        // the edges of every interval, and a query spanning more buckets than the bitmap tests
        for &(s, e, _) in &v {
            queries.extend([(s.saturating_sub(1), s), (s, s + 1), (e - 1, e), (e, e + 4096)]);
        }
        queries.push((0, space));
        let mut skipped = 0;
        for (qs, qe) in queries {
            let mut got = Vec::new();
            idx.query(qs, qe, |_, _, &i| got.push(i));
            got.sort();
            assert_eq!(got, brute(&v, qs, qe), "q=[{qs},{qe})");
            skipped += usize::from(!idx.maybe_overlaps(qs, qe));
        }
        assert!(skipped > 10_000, "the bitmap answered only {skipped} queries alone");
    }
}
