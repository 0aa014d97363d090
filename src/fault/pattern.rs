//! Slow-I/O patterns: which of a rule's matches fire, as a pure function of (seed, match index).
//!
//! The index numbers a rule's matches in arrival order (its `matched` counter), so deciding
//! takes no lock and the same seed gives the same firings. Run statistics (runs of consecutive
//! fired indexes) are derived from the same function: a fired index whose predecessor is not
//! selected starts a run, one whose successor is not selected ends it.

use crate::content::seeded_hash;
use crate::spec::rule::Pattern;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// A uniform draw in [0,1) from (seed, n): reproducible per rule and match index.
pub fn unit(seed: u64, n: u64) -> f64 {
    (seeded_hash(seed, &n.to_le_bytes()) >> 11) as f64 / (1u64 << 53) as f64
}

/// Salt of the burst positions, so they do not follow the random pattern's draws.
const BURST_SALT: u64 = 0x6275_7273_7400_0000;

/// Where the run of burst period `k` starts inside the period. Kept below `period - length`
/// so at least one unselected match follows every run: runs never merge across periods and
/// each is exactly `length` long (a ratio of 1 selects everything: one endless run).
fn burst_offset(seed: u64, length: u64, period: u64, k: u64) -> u64 {
    match period.saturating_sub(length) {
        0 => 0,
        room => seeded_hash(seed ^ BURST_SALT, &k.to_le_bytes()) % room,
    }
}

/// Does the pattern select match `n`?
#[inline]
pub fn selects(p: &Pattern, seed: u64, n: u64) -> bool {
    match *p {
        Pattern::Random { ratio } => unit(seed, n) < ratio,
        Pattern::Burst { length, period, .. } => {
            // parsed rules have length <= period; a rule armed as JSON may not
            let period = period.max(length).max(1);
            let (k, r) = (n / period, n % period);
            let o = burst_offset(seed, length, period, k);
            r >= o && r - o < length
        }
        Pattern::Interval { every } => n % every.max(1) == every.max(1) - 1,
    }
}

/// First index of the run of selected matches that holds `n` (which the pattern selects).
fn run_start(p: &Pattern, seed: u64, n: u64) -> u64 {
    match *p {
        Pattern::Burst { length, period, .. } if period > length => (n / period) * period + burst_offset(seed, length, period, n / period),
        Pattern::Interval { every } if every > 1 => n,
        // random: runs are short unless the ratio is close to 1 (mean 1 / (1 - ratio)); the
        // scan's total work equals the run lengths, i.e. one evaluation per fired match
        _ => {
            let mut s = n;
            while s > 0 && selects(p, seed, s - 1) {
                s -= 1;
            }
            s
        }
    }
}

/// Live run counters of one rule (atomics; updated only when the rule fires).
pub struct RunCounters {
    started: AtomicU64,
    completed: AtomicU64,
    completed_len: AtomicU64,
    min: AtomicU64,
    max: AtomicU64,
}

impl Default for RunCounters {
    fn default() -> Self {
        RunCounters {
            started: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            completed_len: AtomicU64::new(0),
            min: AtomicU64::new(u64::MAX),
            max: AtomicU64::new(0),
        }
    }
}

/// Runs of consecutive fired matches. Lengths are over completed runs (the next match is
/// known not to be selected); a run still going, or cut short by `times`, counts in `runs` only.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RunStats {
    /// Runs started.
    pub runs: u64,
    pub completed: u64,
    pub length_mean: f64,
    pub length_min: u64,
    pub length_max: u64,
}

impl RunCounters {
    /// Match `n` fired under pattern `p`.
    #[inline]
    pub fn fired(&self, p: &Pattern, seed: u64, n: u64) {
        if n == 0 || !selects(p, seed, n - 1) {
            self.started.fetch_add(1, Relaxed);
        }
        if n < u64::MAX && !selects(p, seed, n + 1) {
            let len = n + 1 - run_start(p, seed, n);
            self.completed.fetch_add(1, Relaxed);
            self.completed_len.fetch_add(len, Relaxed);
            self.min.fetch_min(len, Relaxed);
            self.max.fetch_max(len, Relaxed);
        }
    }

    pub fn stats(&self) -> RunStats {
        let completed = self.completed.load(Relaxed);
        RunStats {
            runs: self.started.load(Relaxed),
            completed,
            length_mean: if completed == 0 { 0.0 } else { self.completed_len.load(Relaxed) as f64 / completed as f64 },
            length_min: if completed == 0 { 0 } else { self.min.load(Relaxed) },
            length_max: self.max.load(Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const N: u64 = 1_000_000;

    /// (selected count, run lengths) over indexes [0, N), by brute force.
    fn scan(p: &Pattern, seed: u64) -> (u64, Vec<u64>) {
        scan_n(p, seed, N)
    }

    fn scan_n(p: &Pattern, seed: u64, upto: u64) -> (u64, Vec<u64>) {
        let (mut count, mut runs, mut cur) = (0, Vec::new(), 0u64);
        for n in 0..upto {
            if selects(p, seed, n) {
                count += 1;
                cur += 1;
            } else if cur > 0 {
                runs.push(cur);
                cur = 0;
            }
        }
        if cur > 0 {
            runs.push(cur);
        }
        (count, runs)
    }

    /// The counters, fed every selected index in [0, N) as the engine would.
    fn counted(p: &Pattern, seed: u64) -> RunStats {
        let c = RunCounters::default();
        (0..N).filter(|n| selects(p, seed, *n)).for_each(|n| c.fired(p, seed, n));
        c.stats()
    }

    #[test]
    fn random_is_binomial_and_seeded() {
        let p = Pattern::Random { ratio: 0.10 };
        let (count, runs) = scan(&p, 7);
        // Binomial(1e6, 0.1): sd = 300; 5 sd
        assert!((98_500..=101_500).contains(&count), "{count}");
        assert_ne!(scan(&p, 8).0, count, "another seed, another draw");
        assert_eq!(scan(&p, 7).0, count, "same seed, same draw");
        // the same draws as `probability`
        assert!((0..1000).all(|n| selects(&p, 7, n) == (unit(7, n) < 0.10)));
        let s = counted(&p, 7);
        assert_eq!(s.runs, runs.len() as u64);
        assert_eq!(s.completed, runs.len() as u64 - u64::from(selects(&p, 7, N - 1) && selects(&p, 7, N)));
        assert_eq!(s.length_max, *runs.iter().max().unwrap());
        assert_eq!(s.length_min, 1);
        // mean run length of a Bernoulli(0.1) sequence: 1 / 0.9
        assert!((s.length_mean - 1.0 / 0.9).abs() < 0.01, "{}", s.length_mean);
    }

    #[test]
    fn burst_is_exact_runs_of_length() {
        let p = Pattern::Burst { ratio: 0.01, length: 1000, period: 100_000 };
        let (count, runs) = scan(&p, 3);
        assert_eq!(count, 10_000);
        assert_eq!(runs, vec![1000; 10]);
        // one run inside each period, at a seeded position that varies across periods
        let starts: Vec<u64> = (0..10).map(|k| (k * 100_000..(k + 1) * 100_000).find(|n| selects(&p, 3, *n)).unwrap() % 100_000).collect();
        assert!(starts.windows(2).any(|w| w[0] != w[1]), "{starts:?}");
        assert_ne!(starts, (0..10).map(|k| (k * 100_000..(k + 1) * 100_000).find(|n| selects(&p, 4, *n)).unwrap() % 100_000).collect::<Vec<_>>());
        let s = counted(&p, 3);
        assert_eq!(s, RunStats { runs: 10, completed: 10, length_mean: 1000.0, length_min: 1000, length_max: 1000 });
        // short periods: runs still never merge
        let p = Pattern::Burst { ratio: 0.5, length: 3, period: 6 };
        let (count, runs) = scan_n(&p, 1, 600_000);
        assert_eq!(count, 300_000);
        assert!(runs.iter().all(|l| *l == 3) && runs.len() == 100_000, "{}", runs.len());
        // everything: one run
        let p = Pattern::Burst { ratio: 1.0, length: 5, period: 5 };
        assert_eq!(scan(&p, 1), (N, vec![N]));
        assert_eq!(counted(&p, 1).runs, 1);
    }

    #[test]
    fn interval_is_every_nth() {
        let p = Pattern::Interval { every: 100 };
        let (count, runs) = scan(&p, 0);
        assert_eq!(count, N / 100);
        assert!(runs.iter().all(|l| *l == 1));
        let idx: Vec<u64> = (0..N).filter(|n| selects(&p, 0, *n)).collect();
        assert_eq!(idx[0], 99);
        assert!(idx.windows(2).all(|w| w[1] - w[0] == 100));
        assert_eq!(counted(&p, 0), RunStats { runs: 10_000, completed: 10_000, length_mean: 1.0, length_min: 1, length_max: 1 });
        let p = Pattern::Interval { every: 1 };
        assert_eq!(scan(&p, 0), (N, vec![N]));
        assert_eq!(counted(&p, 0), RunStats { runs: 1, ..Default::default() });
    }
}
