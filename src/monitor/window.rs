//! The monitor in a `baseline: windows` run (docs/monitor.md, "Windows"): every program sorts
//! what it times into the workload's windows in the kernel (src/monitor/bpf/win.bpf.h), by the
//! rule the workload sorts its ops by (an interval counts for window k when it starts at or
//! after the window's measured span begins and ends by its end: `WindowPlan::window_of`), on
//! the clock both read (CLOCK_MONOTONIC). The window layout is fixed at load; window 0's start
//! is set once the workload started (`Windows::start`); the figures are read at detach.

use crate::spec::windows::WindowPlan;
use anyhow::{Context, Result};
use libbpf_rs::{MapCore, MapFlags, MapHandle};
use std::sync::Mutex;
use std::time::Instant;

/// The windows a monitor sorts into, shared by its loaders and the runner.
pub struct Windows {
    pub plan: WindowPlan,
    /// Whole windows in the run.
    pub n: u32,
    /// Every loaded program set's `win_t0` map, and the start once set (ns, monotonic).
    clocks: Mutex<(Vec<MapHandle>, Option<u64>)>,
    /// The block monitor's attach (ns, monotonic): the origin of its interval series.
    series_t0: Mutex<Option<u64>>,
}

/// Where window 0 started on the monitor's clock, in results.json (`monitor.window_start`).
#[derive(serde::Serialize, serde::Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct WindowStart {
    /// When the monitor was given the workload's start, seconds into the workload: windows
    /// whose measured span began earlier have no monitor figures.
    pub set_at_s: f64,
    /// How far the workload's start on the monitor's clock may be off: half the span of the
    /// two clock reads that bracket it (ns).
    pub error_ns: u64,
    /// The workload's start on the block layer's interval series (`devices[].series`, whose
    /// `t_s` count from the monitor's attach), seconds: `t_s` minus this is the workload's time.
    pub series_offset_s: f64,
}

impl Windows {
    pub fn new(plan: WindowPlan, n: u32) -> Windows {
        Windows { plan, n, clocks: Mutex::new((Vec::new(), None)), series_t0: Mutex::new(None) }
    }

    /// The block monitor attached at `t0` (ns, monotonic): its series' origin.
    pub(super) fn series_origin(&self, t0: u64) {
        *self.series_t0.lock().unwrap_or_else(|e| e.into_inner()) = Some(t0);
    }

    /// `win_n`, `win_len_ns`, `win_settle_ns` for a program set's read-only data.
    pub(super) fn rodata(&self) -> (u32, u64, u64) {
        (self.n, self.plan.length.as_nanos() as u64, self.plan.settle.as_nanos() as u64)
    }

    /// Size a per-window hash map for `per_window` keys in each window, allocated as used.
    pub(super) fn size_map(&self, map: &mut libbpf_rs::OpenMapMut<'_>, per_window: u32) -> Result<()> {
        map.set_map_flags(libbpf_rs::libbpf_sys::BPF_F_NO_PREALLOC)?;
        map.set_max_entries(self.n.saturating_mul(per_window).clamp(1, 1 << 22))?;
        Ok(())
    }

    /// Keep a loaded program set's `win_t0` map, to set it when the workload starts (at once
    /// if it has).
    pub(super) fn register(&self, map: &libbpf_rs::MapMut<'_>) -> Result<()> {
        let h = MapHandle::try_from(map).context("cannot keep the window clock's map")?;
        let mut c = self.clocks.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t0) = c.1 {
            set(&h, t0)?;
        }
        c.0.push(h);
        Ok(())
    }

    /// The workload started at `start`: window 0 starts `warmup` later. From now on every
    /// program counts what falls in a window.
    pub fn start(&self, start: Instant) -> Result<WindowStart> {
        let (mono, error_ns) = monotonic_of(start);
        let t0 = mono + self.plan.warmup.as_nanos() as u64;
        let mut c = self.clocks.lock().unwrap_or_else(|e| e.into_inner());
        for h in &c.0 {
            set(h, t0)?;
        }
        c.1 = Some(t0);
        let origin = *self.series_t0.lock().unwrap_or_else(|e| e.into_inner());
        let series_offset_s = origin.map_or(0.0, |o| (mono as f64 - o as f64) / 1e9);
        Ok(WindowStart { set_at_s: start.elapsed().as_secs_f64(), error_ns, series_offset_s })
    }

    /// Whether window `k`'s measured span began after the start was set at `set_at_s`.
    pub fn covered(&self, k: u32, set_at_s: f64) -> bool {
        (self.plan.start(k) + self.plan.settle).as_secs_f64() >= set_at_s
    }

    /// Window `k`'s measured span in the workload's time, seconds.
    pub fn span(&self, k: u32) -> (f64, f64) {
        ((self.plan.start(k) + self.plan.settle).as_secs_f64(), self.plan.start(k + 1).as_secs_f64())
    }
}

fn set(h: &MapHandle, t0: u64) -> Result<()> {
    h.update(&0u32.to_ne_bytes(), &t0.to_ne_bytes(), MapFlags::ANY).context("cannot set the windows' start in the monitor")
}

/// CLOCK_MONOTONIC now, ns: bpf_ktime_get_ns's clock, and Instant's on Linux.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC)");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// `at` on CLOCK_MONOTONIC in ns (Instant keeps it but does not show it): an Instant read
/// between two reads of the clock is their midpoint, within half their span (the error).
fn monotonic_of(at: Instant) -> (u64, u64) {
    let a = monotonic_ns();
    let now = Instant::now();
    let b = monotonic_ns();
    let mid = a + (b - a) / 2;
    let back = now.saturating_duration_since(at).as_nanos() as u64;
    (mid.saturating_sub(back), (b - a).div_ceil(2))
}

/// Every entry of a per-window hash map: (window, index, value words).
pub(super) fn read(map: &libbpf_rs::MapMut<'_>) -> Result<Vec<(u32, u32, Vec<u64>)>> {
    let mut out = Vec::new();
    for key in map.keys() {
        let Some(v) = map.lookup(&key, MapFlags::ANY)? else { continue };
        let k = u64::from_ne_bytes(key.as_slice().try_into().context("a window key of 8 bytes")?);
        out.push(((k >> 32) as u32, k as u32, super::block::words(&v)));
    }
    out.sort_by_key(|e| (e.0, e.1));
    Ok(out)
}

/// A note when a program set left intervals in windows uncounted (its `win_lost` map).
pub(super) fn lost_note(map: &libbpf_rs::MapMut<'_>, what: &str) -> Option<String> {
    let v = map.lookup(&0u32.to_ne_bytes(), MapFlags::ANY).ok()??;
    let n = u64::from_ne_bytes(v.get(..8)?.try_into().ok()?);
    (n > 0).then(|| format!("windows: {n} {what} intervals in windows left uncounted (no kernel memory at hand for their window's histogram)"))
}

/// One window's layer row from a histogram's words, without the buckets (the quantiles keep
/// what the per-window slowdown needs; results.json stays small).
pub(super) fn row(layer: &str, op: String, v: &[u64], with_bytes: bool) -> Option<super::model::LayerOp> {
    let mut r = super::block::layer_row(layer, op, v, with_bytes)?;
    r.histogram.clear();
    Some(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn ns(d: Duration) -> u64 {
        d.as_nanos() as u64
    }

    /// The kernel's own window test (win.bpf.h's `window_of`, run through the block program
    /// set's `win_probe` with BPF_PROG_RUN) at the edges of a measured span, by hand: 100 ms
    /// windows, 20 ms settle, 50 ms warm-up, the workload started at T: window 0 measures
    /// [T + 70, T + 150] ms, window 1 [T + 170, T + 250]. An interval is in a window when it
    /// starts at or after the span's first ns and ends by its last, as the workload's ops.
    #[test]
    fn kernel_window_membership_is_exact_at_the_edges() {
        let plan = WindowPlan { length: Duration::from_millis(100), settle: Duration::from_millis(20), warmup: Duration::from_millis(50) };
        let w = Windows::new(plan, 3);
        let t = 1_000_000_000_000u64; // the workload's start on the monotonic clock
        let t0 = t + ns(plan.warmup);
        let ms = |x: u64| t + x * 1_000_000;
        let cases = [
            (ms(70), ms(71), Some(0), "the span's first ns"),
            (ms(70) - 1, ms(71), None, "one ns before it: the settle"),
            (ms(149), ms(150), Some(0), "ends at the span's end"),
            (ms(149), ms(150) + 1, None, "ends one ns into window 1"),
            (ms(150), ms(150), None, "window 1's settle"),
            (ms(170), ms(250), Some(1), "all of window 1's span"),
            (ms(40), ms(80), None, "starts in the warm-up"),
            (ms(380), ms(381), None, "window 3's span: beyond the 3 windows"),
            (ms(80), ms(79), None, "ends before it starts"),
        ];
        let got = match super::super::block::window_probe(&w, t0, &cases.iter().map(|c| (c.0, c.1)).collect::<Vec<_>>()) {
            Ok(g) => g,
            Err(e) if format!("{e:#}").contains("Operation not permitted") => {
                eprintln!("skipped: BPF not permitted here: {e:#}");
                return;
            }
            Err(e) => panic!("{e:#}"),
        };
        for (c, g) in cases.iter().zip(&got) {
            assert_eq!(*g, c.2, "{}: [{}, {}] ns after the start", c.3, c.0 - t, c.1 - t);
            // the same rule as the workload's ops
            assert_eq!(plan.window_of(c.0 - t, c.1 - t).filter(|k| *k < 3), c.2, "{}", c.3);
        }
        // before the start is set, nothing counts
        let none = super::super::block::window_probe(&w, 0, &[(ms(70), ms(71))]).unwrap();
        assert_eq!(none, [None]);
    }

    #[test]
    fn an_instant_maps_to_the_monotonic_clock() {
        let a = monotonic_ns();
        let i = Instant::now();
        let b = monotonic_ns();
        let (m, err) = monotonic_of(i);
        assert!(err < 1_000_000, "{err} ns");
        assert!(m + err >= a && m <= b + err, "{a} <= {m} (+- {err}) <= {b}");
    }
}
