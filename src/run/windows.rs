//! `baseline: windows` in a local run (spec::windows, docs/experiment.md): the setup's faults
//! are armed as rules with a `window` per armed stretch on the disks' fault clocks, placed
//! where the workload's windows fall. The fault clock restarts at arm (before the monitor,
//! the files and a personality's file set are made), the workload's clock when its first op
//! can go: the offset between the two is known only then, so a thread waits for the
//! workload's start, then arms every stretch at once, within window 0 (always unarmed).

use super::disks::DiskServer;
use super::pipeline::FaultControl;
use crate::report::model::WindowClock;
use crate::spec::rule::Window;
use crate::spec::rule::yaml::FaultSpec;
use crate::spec::windows::WindowPlan;
use crate::workload::Progress;
use anyhow::{Result, bail};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// The fault clocks' restart as seen from here: the instant halfway through the restart
/// calls and their span.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Epoch {
    pub mid: Instant,
    pub span: Duration,
}

/// Restart every disk's fault clock, timing it.
pub(crate) fn restart_clocks(disks: &[&dyn FaultControl]) -> Result<(Vec<u64>, Epoch)> {
    let t0 = Instant::now();
    let seq0: Vec<u64> = disks.iter().map(|d| d.reset_epoch()).collect::<Result<_>>()?;
    let span = t0.elapsed();
    Ok((seq0, Epoch { mid: t0 + span / 2, span }))
}

/// The rules of the armed stretches of `n` windows, per disk: each fault's rule once per
/// stretch, its window moved by `offset` (the workload's start on the fault clock).
pub(crate) fn window_rules(faults: &[FaultSpec], plan: &WindowPlan, n: u32, offset: Duration, disks: usize) -> Vec<Vec<crate::fault::Rule>> {
    let mut per = vec![Vec::new(); disks];
    for (from, to) in plan.armed_spans(n) {
        for f in faults {
            let mut rule = f.rule.clone();
            rule.window = Some(Window { from: offset + from, to: Some(offset + to) });
            if let Some(d) = per.get_mut(f.disk) {
                d.push(rule);
            }
        }
    }
    per
}

/// Start the thread that arms the windows' rules once the workload has started; `n`
/// windows. Its result: None if the workload never started (it failed first).
pub(crate) fn spawn_armer(
    disks: Vec<Arc<DiskServer>>,
    faults: Vec<FaultSpec>,
    plan: WindowPlan,
    n: u32,
    epoch: Epoch,
    progress: Arc<Progress>,
    done: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Result<Option<WindowClock>>> {
    std::thread::spawn(move || {
        let Some(start) = wait_for_start(&progress, &done) else { return Ok(None) };
        let offset = start.saturating_duration_since(epoch.mid);
        let per = window_rules(&faults, &plan, n, offset, disks.len());
        let mut armed = 0;
        for (d, rules) in disks.iter().zip(per) {
            if !rules.is_empty() {
                armed += rules.len() as u32;
                FaultControl::arm(&**d, rules)?;
            }
        }
        let at = start.elapsed();
        let first = plan.start(1);
        if at >= first {
            bail!(
                "baseline: windows: the windows' rules were armed {:.3} s into the workload, after the first armed window began ({:.3} s): make `warmup` or `length` longer",
                at.as_secs_f64(),
                first.as_secs_f64()
            );
        }
        Ok(Some(WindowClock { offset_s: offset.as_secs_f64(), uncertainty_s: epoch.span.as_secs_f64(), armed_at_s: at.as_secs_f64(), rules: armed }))
    })
}

/// The disk daemons' service counters read near one edge of a window's measured span, and
/// when the reads began and ended (seconds into the workload).
pub(crate) struct DaemonSample {
    pub from_s: f64,
    pub to_s: f64,
    pub counts: Vec<Option<super::ServiceCounts>>,
}

/// What the monitor's window thread saw: when the monitor got the workload's start, and the
/// daemons' counters near the edges of each window it reached, (window, read at its span's
/// start, read before its end).
pub(crate) struct MonitorClock {
    pub start: crate::monitor::window::WindowStart,
    pub edges: Vec<(u32, DaemonSample, DaemonSample)>,
}

/// Start the thread that gives the monitor the workload's start (the windows' clock in the
/// kernel) as soon as the workload has one, then reads the daemons' counters (`sample`) at
/// the edges of every window's measured span until the workload is done: at its start the
/// read begins after the edge, at its end it is aimed to end before it (twice the longest
/// wake-up and read so far, at least 5 ms, ahead), so what is counted between two reads was
/// answered inside the span. Its result: None if the workload never started.
pub(crate) fn spawn_monitor_clock(
    windows: Arc<crate::monitor::Windows>,
    sample: impl Fn() -> Vec<Option<super::ServiceCounts>> + Send + 'static,
    progress: Arc<Progress>,
    done: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Result<Option<MonitorClock>>> {
    std::thread::spawn(move || {
        let Some(start) = wait_for_start(&progress, &done) else { return Ok(None) };
        let ws = windows.start(start)?;
        let plan = windows.plan;
        // the longest wake-up past its time and read so far: a read before an edge starts
        // twice their sum (at least 5 ms) ahead of it
        let mut longest = Duration::ZERO;
        // read at `edge`, or ending by it (`before`); None once the workload is done
        let mut read = |edge: Duration, before: bool| -> Option<DaemonSample> {
            let at = if before { edge.saturating_sub((longest * 2).max(Duration::from_millis(5))) } else { edge };
            loop {
                let left = at.saturating_sub(start.elapsed());
                if left.is_zero() {
                    break;
                }
                if done.load(Relaxed) {
                    return None;
                }
                std::thread::sleep(left.min(Duration::from_millis(50)));
            }
            let a = start.elapsed();
            let counts = sample();
            let b = start.elapsed();
            longest = longest.max(b.saturating_sub(at));
            Some(DaemonSample { from_s: a.as_secs_f64(), to_s: b.as_secs_f64(), counts })
        };
        let mut edges = Vec::new();
        for k in 0..windows.n {
            let Some(from) = read(plan.start(k) + plan.settle, false) else { break };
            let Some(to) = read(plan.start(k + 1), true) else { break };
            edges.push((k, from, to));
        }
        Ok(Some(MonitorClock { start: ws, edges }))
    })
}

/// The workload's first I/O, once it was issued; None if the run ended first.
fn wait_for_start(progress: &Progress, done: &AtomicBool) -> Option<std::time::Instant> {
    loop {
        if let Some(s) = progress.start.get() {
            return Some(*s);
        }
        if done.load(Relaxed) {
            return None;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_cover_the_armed_stretches_moved_by_the_offset() {
        let geo = crate::spec::rule::check::DiskGeometry { size: 1 << 30, block_size: 4096 };
        let rule = crate::spec::rule::yaml::parse_rules("rules:\n  - {type: delay, delay: 10us}\n", "t", geo).unwrap().remove(0);
        let f = |disk| FaultSpec {
            rule: rule.clone(),
            deferred: None,
            trigger: crate::spec::rule::yaml::Trigger::Start,
            by_content: None,
            disk,
            allow_repeat: false,
            label: "rule #1".into(),
        };
        let plan = WindowPlan { length: Duration::from_secs(1), settle: Duration::from_millis(200), warmup: Duration::ZERO };
        let off = Duration::from_millis(2500);
        let per = window_rules(&[f(0), f(1)], &plan, 7, off, 2);
        let s = Duration::from_secs;
        // windows 1-2 and 5-6 armed of 7
        let want = [Window { from: off + s(1), to: Some(off + s(3)) }, Window { from: off + s(5), to: Some(off + s(7)) }];
        for d in &per {
            assert_eq!(d.iter().map(|r| r.window.unwrap()).collect::<Vec<_>>(), want);
        }
    }
}
