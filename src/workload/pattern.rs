//! Access patterns: which block of a region the next request touches.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::Distribution;

pub use crate::spec::workload::config::Pattern;

/// Generates block indexes in [0, n) for one thread's region.
pub struct PatternGen {
    kind: Pattern,
    n: u64,
    next: u64,
    rng: SmallRng,
    zipf: Option<rand_distr::Zipf<f64>>,
    /// NURand parameters: A (a 2^k-1 mask) and C.
    nurand: (u64, u64),
    /// Odd multiplier coprime with n, scattering zipf ranks over the region.
    scatter: u64,
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

impl PatternGen {
    pub fn new(kind: Pattern, n: u64, seed: u64) -> PatternGen {
        assert!(n > 0);
        let mut rng = SmallRng::seed_from_u64(seed);
        let zipf = match kind {
            Pattern::Zipf(theta) => Some(rand_distr::Zipf::new(n as f64, theta).expect("valid zipf")),
            _ => None,
        };
        // TPC-C uses NURand(8191, 1, 100000) for items: A about n/12, rounded to 2^k-1
        let a = ((n / 12).max(1).next_power_of_two() - 1).max(1);
        let c = rng.random_range(0..=a);
        let mut scatter = (0x9E37_79B9_7F4A_7C15u64 % n.max(2)) | 1;
        while gcd(scatter, n) != 1 {
            scatter += 2;
        }
        PatternGen { kind, n, next: 0, rng, zipf, nurand: (a, c), scatter }
    }

    #[inline]
    pub fn next_block(&mut self) -> u64 {
        match self.kind {
            Pattern::Sequential => {
                let b = self.next;
                self.next = (self.next + 1) % self.n;
                b
            }
            Pattern::Uniform => self.rng.random_range(0..self.n),
            Pattern::Hotspot => {
                let (a, c) = self.nurand;
                let x = self.rng.random_range(0..=a) | self.rng.random_range(0..self.n);
                (x + c) % self.n
            }
            Pattern::Zipf(_) => {
                let rank = self.zipf.as_ref().unwrap().sample(&mut self.rng) as u64 - 1;
                ((rank as u128 * self.scatter as u128) % self.n as u128) as u64
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hist(p: Pattern, n: u64, draws: usize) -> Vec<u64> {
        let mut g = PatternGen::new(p, n, 3);
        let mut h = vec![0u64; n as usize];
        for _ in 0..draws {
            h[g.next_block() as usize] += 1;
        }
        h
    }

    #[test]
    fn sequential_wraps() {
        let mut g = PatternGen::new(Pattern::Sequential, 3, 0);
        assert_eq!((0..7).map(|_| g.next_block()).collect::<Vec<_>>(), vec![0, 1, 2, 0, 1, 2, 0]);
    }

    #[test]
    fn uniform_is_flat_and_skewed_ones_are_skewed() {
        let n = 1000;
        let draws = 200_000;
        let u = hist(Pattern::Uniform, n, draws);
        // each bucket ~ Binomial(200k, 1/1000): mean 200, sd ~14; 6 sd bounds
        assert!(u.iter().all(|c| (116..=284).contains(c)), "uniform bucket out of bounds");
        let top_share = |mut h: Vec<u64>| {
            h.sort_unstable_by(|a, b| b.cmp(a));
            h[..(n as usize / 10)].iter().sum::<u64>() as f64 / draws as f64
        };
        let z = top_share(hist(Pattern::Zipf(1.2), n, draws));
        assert!(z > 0.8, "zipf 1.2: top 10% of blocks got {z:.2} of the accesses");
        let h = top_share(hist(Pattern::Hotspot, n, draws));
        assert!(h > 0.3 && h < 0.95, "hotspot: top 10% got {h:.2}");
        assert!(top_share(u) < 0.15);
        assert_eq!("zipf:0.9".parse::<Pattern>().unwrap(), Pattern::Zipf(0.9));
        assert!("zigzag".parse::<Pattern>().is_err());
        for bad in ["zipf:inf", "zipf:NaN", "zipf:0", "zipf:-1"] {
            assert!(bad.parse::<Pattern>().unwrap_err().contains("allowed: sequential"), "{bad}");
        }
    }
}
