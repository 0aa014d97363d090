//! Paired windows within one run (`baseline: windows`, docs/experiment.md): the setup's faults
//! are armed in alternating windows of one workload run, and the slowdown comes from pairs of
//! (unarmed, armed) windows. Both sides use this one layout: the run arms the armed windows'
//! rules on the disk's fault clock, the workload sorts each completed op into the window that
//! holds it. Pair j is windows 2j and 2j+1; its order alternates, (off, on) for even j and
//! (on, off) for odd j, so a drift that is linear in time cancels over two pairs.

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The window layout of a run, in the workload's time (from its start); in results.json
/// each duration in seconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WindowPlan {
    /// Length of one window (one unarmed or armed phase).
    #[serde(with = "secs")]
    pub length: Duration,
    /// Left out at the start of every window: an op that starts in it counts for no window
    /// (the queue and caches settle after the faults came or went).
    #[serde(with = "secs")]
    pub settle: Duration,
    /// Before window 0: the run's start, measured by no window.
    #[serde(with = "secs")]
    pub warmup: Duration,
}

/// A duration as seconds (a JSON number).
mod secs {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;
    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let v = f64::deserialize(d)?;
        Duration::try_from_secs_f64(v).map_err(serde::de::Error::custom)
    }
}

impl Default for WindowPlan {
    fn default() -> Self {
        WindowPlan { length: Duration::from_secs(5), settle: Duration::from_secs(1), warmup: Duration::ZERO }
    }
}

impl WindowPlan {
    /// Windows that fit wholly in a run of `duration`.
    pub fn count(&self, duration: Duration) -> u32 {
        (duration.saturating_sub(self.warmup).as_nanos() / self.length.as_nanos().max(1)) as u32
    }

    /// Whether window `k` has the faults armed: off, on | on, off | off, on | ...
    pub fn armed(k: u32) -> bool {
        (k / 2 + k) % 2 == 1
    }

    /// Start of window `k` in the workload's time.
    pub fn start(&self, k: u32) -> Duration {
        self.warmup + self.length * k
    }

    /// The window an op belongs to, from its start and end (ns since the workload started):
    /// the one whose measured span `[start + settle, start + length)` holds both. None: it
    /// started in the warm-up or a settle, or it ended in a later window.
    pub fn window_of(&self, start_ns: u64, end_ns: u64) -> Option<u32> {
        let (warm, len, settle) = (self.warmup.as_nanos() as u64, self.length.as_nanos() as u64, self.settle.as_nanos() as u64);
        if start_ns < warm || len == 0 || end_ns < start_ns {
            return None;
        }
        let k = (start_ns - warm) / len;
        let from = warm + k * len;
        (start_ns >= from + settle && end_ns <= from + len).then_some(k as u32)
    }

    /// The armed stretches of the first `n` windows as `[from, to)` in the workload's time,
    /// consecutive armed windows merged (on, on at a pair boundary is one stretch).
    pub fn armed_spans(&self, n: u32) -> Vec<(Duration, Duration)> {
        let mut out: Vec<(Duration, Duration)> = Vec::new();
        for k in (0..n).filter(|&k| Self::armed(k)) {
            let (a, b) = (self.start(k), self.start(k + 1));
            match out.last_mut() {
                Some(last) if last.1 == a => last.1 = b,
                _ => out.push((a, b)),
            }
        }
        out
    }

    /// One-line description for notes: "5s windows (1s settle, 0s warm-up)".
    pub fn describe(&self) -> String {
        use super::units::format_duration as fd;
        format!("{} windows ({} settle, {} warm-up)", fd(self.length), fd(self.settle), fd(self.warmup))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(len_ms: u64, settle_ms: u64, warm_ms: u64) -> WindowPlan {
        WindowPlan { length: Duration::from_millis(len_ms), settle: Duration::from_millis(settle_ms), warmup: Duration::from_millis(warm_ms) }
    }

    #[test]
    fn order_alternates_per_pair() {
        let armed: Vec<bool> = (0..8).map(WindowPlan::armed).collect();
        assert_eq!(armed, [false, true, true, false, false, true, true, false]);
        // every pair holds one armed and one unarmed window
        for j in 0..50 {
            assert_ne!(WindowPlan::armed(2 * j), WindowPlan::armed(2 * j + 1));
        }
    }

    /// By hand, 100 ms windows with a 20 ms settle after a 50 ms warm-up: window k spans
    /// [50 + 100k, 150 + 100k) ms and measures [70 + 100k, 150 + 100k).
    #[test]
    fn samples_fall_in_the_window_that_holds_them() {
        let p = plan(100, 20, 50);
        let ms = |x: u64| x * 1_000_000;
        assert_eq!(p.window_of(ms(10), ms(11)), None, "warm-up");
        assert_eq!(p.window_of(ms(60), ms(61)), None, "window 0's settle");
        assert_eq!(p.window_of(ms(70), ms(71)), Some(0), "first instant measured");
        assert_eq!(p.window_of(ms(149), ms(150)), Some(0), "ends at the window's end");
        assert_eq!(p.window_of(ms(149), ms(150) + 1), None, "ends in the next window");
        assert_eq!(p.window_of(ms(150), ms(151)), None, "window 1's settle");
        assert_eq!(p.window_of(ms(170) - 1, ms(171)), None);
        assert_eq!(p.window_of(ms(170), ms(171)), Some(1));
        assert_eq!(p.window_of(ms(960), ms(961)), None, "window 9 starts at 950 ms: its settle");
        assert_eq!(p.window_of(ms(1_020), ms(1_049)), Some(9));
        assert_eq!(p.count(Duration::from_millis(1_049)), 9, "window 9 ends at 1050 ms");
        assert_eq!(p.count(Duration::from_millis(1_050)), 10);
        assert_eq!(p.count(Duration::from_millis(40)), 0);
    }

    #[test]
    fn armed_spans_merge_neighbours() {
        let p = plan(100, 20, 50);
        let d = Duration::from_millis;
        // windows 1, 2 | 5, 6 | 9 armed of 10
        assert_eq!(p.armed_spans(10), [(d(150), d(350)), (d(550), d(750)), (d(950), d(1050))]);
        assert_eq!(p.armed_spans(2), [(d(150), d(250))]);
        assert!(p.armed_spans(1).is_empty());
    }
}
