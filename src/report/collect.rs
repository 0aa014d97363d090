//! From what a run measured to the results schema: the workload's statistics, the verifier's
//! findings and the fault engine's log and rule counters become `model` values. `run` calls
//! these once per repetition. Only reshaped values are converted here; values stored as their
//! producer computed them are moved in as they are (the rule: model.rs's module doc).

use super::model as rm;
use crate::fault::Target;
use crate::fault::engine::RuleStatus;
use crate::fault::log::LogEntry;
use crate::nbd::client::CounterSnapshot;
use crate::verify::{BadBlock, VerifyReport};
use crate::workload::WorkloadResult;
use std::collections::{HashMap, HashSet};

/// The faults one disk logged since the workload started (`log`, from sequence number on),
/// with the rules listed on that disk. Faulty blocks are the logged blocks inside the rule's
/// offset range (all of them for content and whole-disk rules), each counted once per rule.
pub fn injected_faults(disk: u32, block_size: u64, rules: &[RuleStatus], log: &[LogEntry]) -> Vec<rm::InjectedFault> {
    let names: HashMap<u64, String> = rules.iter().map(|r| (r.id, r.rule.name.clone().unwrap_or_default())).collect();
    let targets: HashMap<u64, &Target> = rules.iter().map(|r| (r.id, &r.rule.target)).collect();
    let bs = block_size.max(1);
    let mut seen: HashSet<(u64, u64)> = HashSet::new();
    let mut out = Vec::with_capacity(log.len());
    for e in log {
        let range = match targets.get(&e.rule) {
            Some(Target::Range { start, end }) => Some((start / bs, end.div_ceil(bs))),
            _ => None,
        };
        let mut new = 0;
        for [first, n] in &e.blocks {
            for b in *first..first.saturating_add(*n) {
                if range.is_none_or(|(s, t)| b >= s && b < t) && seen.insert((e.rule, b)) {
                    new += 1;
                }
            }
        }
        let new = if e.blocks.is_empty() { 1 } else { new };
        out.push(rm::InjectedFault {
            t_s: e.t_us as f64 / 1e6,
            rule_id: e.rule,
            rule: names.get(&e.rule).cloned().unwrap_or_default(),
            action: e.action.to_string(),
            op: e.op.map(|o| o.name().to_string()).unwrap_or_else(|| "at-rest".into()),
            offset: e.offset,
            len: e.len,
            blocks: e.block_count(),
            disk,
            new_target_blocks: Some(new),
        });
    }
    out
}

/// The counters of every rule listed on a disk.
pub fn rule_counts(rules: &[RuleStatus]) -> Vec<rm::RuleCount> {
    rules
        .iter()
        .map(|r| rm::RuleCount {
            id: r.id,
            name: r.rule.name.clone().unwrap_or_default(),
            action: r.rule.action.name().to_string(),
            op: r.rule.ops.ops().iter().map(|o| o.name()).collect::<Vec<_>>().join("+"),
            fired: r.fired,
            blocks: r.blocks,
            matched: r.matched,
            realized_ratio: r.realized_ratio.unwrap_or(0.0),
            pattern: r.rule.pattern.map(|p| p.to_string()).unwrap_or_default(),
            runs: r.runs.as_ref().map_or(0, |s| s.runs),
            run_length_mean: r.runs.as_ref().map_or(0.0, |s| s.length_mean),
            run_length_min: r.runs.as_ref().map_or(0, |s| s.length_min),
            run_length_max: r.runs.as_ref().map_or(0, |s| s.length_max),
        })
        .collect()
}

pub fn sample(s: &crate::workload::Sample) -> rm::Sample {
    rm::Sample {
        t_s: s.t,
        read_iops: s.read.iops,
        read_mib_s: s.read.mib_s,
        read_mean_us: s.read.mean_us,
        read_p99_us: s.read.p99_us,
        write_iops: s.write.iops,
        write_mib_s: s.write.mib_s,
        write_mean_us: s.write.mean_us,
        write_p99_us: s.write.p99_us,
        cpu_pct: s.cpu_pct,
        rss_mib: s.rss_mib,
    }
}

fn bad_block(file: Option<String>, b: &BadBlock) -> rm::BadBlock {
    use BadBlock as B;
    let offset = b.block() * crate::spec::workload::config::CONTENT_BLOCK;
    let (kind, errno, expected_id) = match b {
        B::Corrupted { holds: Some(_), expected_id, .. } => ("misdirected", None, *expected_id),
        B::Corrupted { expected_id, .. } => ("corrupted", None, *expected_id),
        B::Unreadable { errno, .. } => ("unreadable", Some(crate::spec::rule::errno_name(*errno)), 0),
        B::Short { .. } => ("short", None, 0),
        B::Missing { .. } => ("missing", None, 0),
    };
    rm::BadBlock { file, offset, kind: kind.to_string(), errno, expected_id }
}

pub fn integrity(v: &VerifyReport) -> rm::Integrity {
    let mut bad: Vec<rm::BadBlock> = v.bad.iter().map(|b| bad_block(None, b)).collect();
    let mut files_hit = Vec::new();
    for f in &v.files {
        let name = std::path::Path::new(&f.path).file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_else(|| f.path.clone());
        bad.extend(f.bad.iter().map(|b| bad_block(Some(name.clone()), b)));
        if !f.bad.is_empty() {
            files_hit.push(rm::FileHit { file: name, bad_blocks: f.bad.len() as u64 });
        }
    }
    files_hit.sort_by(|a, b| b.bad_blocks.cmp(&a.bad_blocks).then(a.file.cmp(&b.file)));
    let n = &v.counts;
    rm::Integrity {
        blocks_checked: n.checked,
        ok: n.ok,
        // the report counts misdirected apart from other corruption
        corrupted: n.corrupted.saturating_sub(n.misdirected),
        misdirected: n.misdirected,
        unreadable: n.unreadable,
        short: n.short,
        missing: n.missing,
        bad,
        files_hit,
    }
}

pub fn repetition(
    rep: u32,
    seconds: f64,
    w: Option<WorkloadResult>,
    v: Option<VerifyReport>,
    faults: Vec<rm::InjectedFault>,
    rules: Vec<rm::RuleCount>,
    notes: Vec<String>,
) -> rm::Repetition {
    let mut r = rm::Repetition { index: rep + 1, seconds, faults, rules, notes, ..Default::default() };
    if let Some(w) = w {
        r.read = w.read.clone();
        r.write = w.write.clone();
        r.timeseries = w.timeseries.iter().map(sample).collect();
        r.io_errors = w.errors.clone();
        r.failed_ios = w.failed_ios.len() as u64;
        r.retries = w.retries;
        r.flowops = w.flowops.clone();
        r.flowops_skipped = w.flowops_skipped;
        r.windows = w.windows.clone();
        if w.nbd_client.is_some() || !w.nbd_client_intervals.is_empty() {
            r.nbd_client = Some(rm::NbdClient { totals: w.nbd_client.unwrap_or_default(), intervals: w.nbd_client_intervals.clone() });
        }
    }
    if let Some(v) = v {
        r.integrity = integrity(&v);
    }
    r
}

/// What the disks' NBD client stores did between two readings (per disk, None for local
/// stores), summed; None when no disk has one.
pub fn nbd_client(before: &[Option<CounterSnapshot>], after: &[Option<CounterSnapshot>]) -> Option<CounterSnapshot> {
    let mut sum: Option<CounterSnapshot> = None;
    for (b, a) in before.iter().zip(after) {
        if let (Some(b), Some(a)) = (b, a) {
            let d = a.since(b);
            let s = sum.get_or_insert_with(CounterSnapshot::default);
            s.requests += d.requests;
            s.retries += d.retries;
            s.timeouts += d.timeouts;
            s.remote_errors += d.remote_errors;
            s.connection_errors += d.connection_errors;
            s.reconnects += d.reconnects;
            s.failed += d.failed;
            s.retry_ns += d.retry_ns;
        }
    }
    sum
}
