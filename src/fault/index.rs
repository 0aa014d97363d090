//! Static interval index: an implicit augmented binary tree over intervals sorted by start
//! (the cgranges layout). Overlap queries cost O(log n + hits), so offset-rule matching does
//! not grow with the number of rules. Rebuilt (not edited) when the rule set changes.

pub struct IntervalIndex<T> {
    starts: Vec<u64>,
    ends: Vec<u64>,
    max_end: Vec<u64>,
    items: Vec<T>,
    root_level: i32,
}

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
        IntervalIndex { starts, ends, max_end, items, root_level }
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Call `f(start, end, item)` for every interval overlapping [qs, qe).
    #[inline]
    pub fn query(&self, qs: u64, qe: u64, mut f: impl FnMut(u64, u64, &T)) {
        let n = self.items.len() as i64;
        if n == 0 || qs >= qe {
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

    #[test]
    fn matches_brute_force() {
        let mut seed = 12345u64;
        let mut rnd = |m: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % m
        };
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
}
