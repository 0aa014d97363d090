//! What the monitor reports (monitor.json; docs/monitor.md). Plain data, so the results of an
//! experiment can embed it as is. Every field has a default: files written by an older
//! faultline still load.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub const SCHEMA: u32 = 1;

/// The ops requests are sorted by, in the BPF programs' order (block.h OP_*).
pub const OPS: [&str; super::defines::NR_OPS] = ["read", "write", "flush", "discard", "other"];
/// The block layers, in block.h LAYER_* order.
pub const BLOCK_LAYERS: [&str; super::defines::NR_LAYERS] = ["block_queue", "block_service"];

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct MonitorResults {
    pub schema: u32,
    /// How the programs are attached: `tp_btf` or `raw_tp`.
    pub attach: String,
    pub interval_s: f64,
    /// From attach to detach.
    pub duration_s: f64,
    pub devices: Vec<DeviceResults>,
    /// Processes whose system calls were timed (forks after attach followed, not listed).
    pub pids: Vec<u32>,
    /// The syscall layer: one row per op (`read`, `write`, `fsync`, `open`, `fallocate`,
    /// `io_uring_enter`, `close`, `unlink`, `rename`, `stat`) that saw calls, layer `syscall`;
    /// bytes for read and write only.
    pub syscalls: Vec<LayerOp>,
    /// How the syscall layer was attached: `syscalls` (per-syscall tracepoints), or
    /// raw_syscalls as `tp_btf`, `raw_tp` or `tracepoint`; empty without it.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub syscall_attach: String,
    /// op -> calls that returned an error.
    pub syscall_errors: BTreeMap<String, u64>,
    /// Tracepoint hits the kernel skipped because a program of the monitor was already
    /// running on that CPU (BPF's recursion guard); each may be a request or call not counted.
    pub missed_events: u64,
    pub notes: Vec<String>,
    /// Tracepoint pairs (docs/monitor.md): layer `fs`, `journal`, `driver` or `user`, op the
    /// pair's name (`fuse:write`: the driver pair split by FUSE opcode); bytes are 0.
    pub stack: Vec<LayerOp>,
    /// Events whose fields are added up (jbd2_run_stats).
    pub summed: Vec<Summed>,
    /// `baseline: windows`: every layer's figures in each window's measured span (every
    /// whole window of the run, in order; docs/monitor.md, "Windows").
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub windows: Vec<MonitorWindow>,
    /// `baseline: windows`: when the monitor learnt where window 0 starts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window_start: Option<super::window::WindowStart>,
}

/// The monitor's figures of one window of a `baseline: windows` run: what it timed from a
/// start at or after the window's measured span began to an end by its end (the rule of the
/// workload's ops; jbd2_run_stats by the commit's end, the daemon between two samples of its
/// counters read inside the span near its edges). Rows as the run's, without histograms.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct MonitorWindow {
    /// The workload's window number.
    pub index: u32,
    /// The measured span, seconds since the workload started (as the workload's window).
    pub from_s: f64,
    pub to_s: f64,
    pub syscalls: Vec<LayerOp>,
    pub stack: Vec<LayerOp>,
    pub summed: Vec<Summed>,
    /// Per watched device, in `devices`' order.
    pub devices: Vec<WindowDevice>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct WindowDevice {
    pub device: String,
    /// block_queue and block_service rows.
    pub layers: Vec<LayerOp>,
    /// The disk daemon's figures between two reads of its counters inside the span (none
    /// where a read fell outside it).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub daemon: BTreeMap<String, DaemonOp>,
    /// What those figures cover, seconds since the workload started: from the end of the
    /// read after the span's start to the start of the read before its end (requests
    /// answered while a read ran may count or not).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub daemon_span: Option<[f64; 2]>,
}

impl MonitorWindow {
    /// This window's figures as a whole run's (the measured span as its duration), so a
    /// window pairs as runs do.
    pub fn as_results(&self) -> MonitorResults {
        MonitorResults {
            schema: SCHEMA,
            duration_s: self.to_s - self.from_s,
            syscalls: self.syscalls.clone(),
            stack: self.stack.clone(),
            summed: self.summed.clone(),
            devices: self
                .devices
                .iter()
                .map(|d| DeviceResults { device: d.device.clone(), layers: d.layers.clone(), daemon: d.daemon.clone(), ..Default::default() })
                .collect(),
            ..Default::default()
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct Summed {
    pub layer: String,
    /// `SYS:NAME`
    pub event: String,
    /// Events counted.
    pub count: u64,
    /// The kernel's tick rate used to turn jiffies into ms (0: unknown, left in jiffies).
    pub hz: u32,
    pub fields: Vec<SummedField>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct SummedField {
    pub name: String,
    /// `ms` (from jiffies), `jiffies` (HZ unknown) or `count`.
    pub unit: String,
    pub total: f64,
    /// Per event.
    pub mean: f64,
    pub max: f64,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct DeviceResults {
    /// The path it was given as, e.g. /dev/loop3.
    pub device: String,
    /// major:minor
    pub dev: String,
    /// One row per layer and op that saw requests.
    pub layers: Vec<LayerOp>,
    pub depth: Depth,
    /// Requests not timed because their entry could not be stored in the kernel's table.
    pub untracked: u64,
    /// Completions whose issue was not seen: requests in flight at attach, or issue events
    /// the kernel did not deliver to the monitor.
    pub unmatched: u64,
    /// Requests seen issued whose completion never reached the monitor (found when the
    /// request's memory was issued again): not in the figures.
    pub lost_completions: u64,
    /// Requests seen issued and not seen completed at detach: in flight then, or completion
    /// events not delivered.
    pub inflight_at_end: u64,
    /// Requests issued before the monitor started that completed while it ran: left out of the
    /// block figures (their issue time is not known).
    pub early: u64,
    /// Completion events the block program ran for on this device (every op, partial ones
    /// too), and of them the read/write ones without bytes (not counted: a preflush write's
    /// flush end). Against the counted requests they tell a drop in the program from a
    /// completion the kernel never ran it for.
    pub completions_seen: u64,
    pub dataless: u64,
    /// The kernel's own count of the requests the device completed while the programs were
    /// attached, by op (`/sys/dev/block/M:m/stat`; empty where it keeps none): more reads and
    /// writes than the block program saw are noted (docs/monitor.md, blind spots).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub kernel_completed: BTreeMap<String, u64>,
    pub series: Vec<Interval>,
    /// The disk daemon's own figures for the device over the monitored span, by op (`faultline
    /// run` on its disks; empty elsewhere): its part of `block_service`.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub daemon: BTreeMap<String, DaemonOp>,
}

/// One op's requests as the disk daemon served them (docs/monitor.md, "the daemon's figures").
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct DaemonOp {
    pub count: u64,
    /// Mean time from the request reaching the disk to its reply being due: the store's work
    /// plus the delay the reply was held for.
    pub service_mean_us: f64,
    /// Mean delay held (delay rules and the latency model), included in `service_mean_us`.
    pub delay_mean_us: f64,
}

impl DaemonOp {
    /// From the daemon's counters (cumulative) before and after: count, service ns, delay ns.
    pub fn between(before: (u64, u64, u64), after: (u64, u64, u64)) -> Option<DaemonOp> {
        let n = after.0.checked_sub(before.0).filter(|n| *n > 0)?;
        let per = |a: u64, b: u64| a.saturating_sub(b) as f64 / n as f64 / 1000.0;
        Some(DaemonOp { count: n, service_mean_us: per(after.1, before.1), delay_mean_us: per(after.2, before.2) })
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct LayerOp {
    pub layer: String,
    pub op: String,
    pub count: u64,
    /// Request bytes (block_service only; 0 for block_queue).
    pub bytes: u64,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p95_us: f64,
    pub p99_us: f64,
    /// Upper bound of the highest non-empty bucket.
    pub max_us: f64,
    /// Non-empty buckets: [lower bound in ns, count].
    pub histogram: Vec<[u64; 2]>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct Depth {
    /// Time average of the requests in service (issued, not completed), from their service
    /// times (Little's law).
    pub mean: f64,
    /// The highest sampled depth.
    pub max: u64,
    /// [depth, samples that saw it] (sampled every interval / 10, 10 to 100 ms).
    pub histogram: Vec<[u64; 2]>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct Interval {
    /// Start of the interval, seconds after attach.
    pub t_s: f64,
    /// Requests completed in the interval, by op (ops with none are left out).
    pub ops: BTreeMap<String, IntervalOp>,
    /// Depth samples taken in the interval; their maximum; the mean requests in service
    /// (Little's law over the requests completed in it).
    pub issues: u64,
    pub depth_mean: f64,
    pub depth_max: u64,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct IntervalOp {
    pub count: u64,
    pub bytes: u64,
    pub service_mean_us: f64,
    /// Mean over the requests whose queueing was seen (see docs/monitor.md).
    pub queue_mean_us: f64,
}

impl MonitorResults {
    /// Take in the syscall layer's figures for processes `pids`.
    pub fn add_syscalls(&mut self, pids: &[u32], s: super::syscall::SyscallResults) {
        self.pids = pids.to_vec();
        self.syscalls = s.layers;
        self.syscall_errors = s.errors;
        self.syscall_attach = s.attach.into();
        for (k, rows) in s.windows {
            if let Some(w) = self.windows.get_mut(k as usize) {
                w.syscalls = rows;
            }
        }
        self.missed_events += s.missed_events;
        if s.missed_events > 0 {
            self.notes.push(format!("{} syscall events skipped by the kernel (a program of ours already running on that CPU)", s.missed_events));
        }
        self.notes.extend(s.notes);
    }

    /// The row of one device, layer and op, if it saw requests.
    pub fn row(&self, device: &str, layer: &str, op: &str) -> Option<&LayerOp> {
        self.devices.iter().find(|d| d.device == device)?.layers.iter().find(|r| r.layer == layer && r.op == op)
    }

    /// Add the tracepoint pairs' figures (`pairs::PairMonitor`).
    pub fn add_pairs(&mut self, p: super::pairs::PairResults) {
        self.stack.extend(p.rows);
        self.summed.extend(p.summed);
        for (k, rows, summed) in p.windows {
            if let Some(w) = self.windows.get_mut(k as usize) {
                w.stack.extend(rows);
                w.summed.extend(summed);
            }
        }
        self.missed_events += p.missed_events;
        if p.missed_events > 0 {
            self.notes.push(format!("{} tracepoint-pair events skipped by the kernel (a program of ours already running on that CPU)", p.missed_events));
        }
        self.notes.extend(p.notes);
    }

    /// A row of the tracepoint pairs, if it saw intervals.
    pub fn pair(&self, layer: &str, op: &str) -> Option<&LayerOp> {
        self.stack.iter().find(|r| r.layer == layer && r.op == op)
    }

    /// A fixed-width table: one line per device, layer and op.
    pub fn table(&self) -> String {
        use std::fmt::Write;
        let mut s = format!(
            "{:<12} {:<14} {:<16} {:>9} {:>11} {:>10} {:>10} {:>10} {:>10}\n",
            "device", "layer", "op", "count", "bytes", "mean_us", "p50_us", "p95_us", "p99_us"
        );
        for r in &self.syscalls {
            let _ = writeln!(
                s,
                "{:<12} {:<14} {:<16} {:>9} {:>11} {:>10.1} {:>10.1} {:>10.1} {:>10.1}",
                "processes",
                r.layer,
                r.op,
                r.count,
                if r.op == "read" || r.op == "write" { r.bytes.to_string() } else { "-".into() },
                r.mean_us,
                r.p50_us,
                r.p95_us,
                r.p99_us
            );
        }
        for r in &self.stack {
            let _ = writeln!(
                s,
                "{:<12} {:<14} {:<16} {:>9} {:>11} {:>10.1} {:>10.1} {:>10.1} {:>10.1}",
                "stack", r.layer, r.op, r.count, "-", r.mean_us, r.p50_us, r.p95_us, r.p99_us
            );
        }
        for m in &self.summed {
            let f: Vec<String> = m
                .fields
                .iter()
                .map(|f| format!("{} {:.1}{}", f.name, f.mean, if f.unit == "count" { String::new() } else { format!(" {}", f.unit) }))
                .collect();
            let _ = writeln!(s, "{:<12} {} x{}, mean per event: {}", m.layer, m.event, m.count, f.join(", "));
        }
        for d in &self.devices {
            let name = d.device.rsplit('/').next().unwrap_or(&d.device);
            for r in &d.layers {
                let _ = writeln!(
                    s,
                    "{:<12} {:<14} {:<16} {:>9} {:>11} {:>10.1} {:>10.1} {:>10.1} {:>10.1}",
                    name,
                    r.layer,
                    r.op,
                    r.count,
                    if r.layer == "block_service" { r.bytes.to_string() } else { "-".into() },
                    r.mean_us,
                    r.p50_us,
                    r.p95_us,
                    r.p99_us
                );
            }
            let _ = writeln!(s, "{name:<12} requests in service: mean {:.2}, sampled max {}", d.depth.mean, d.depth.max);
            for (op, o) in &d.daemon {
                let _ = writeln!(
                    s,
                    "{name:<12} {:<14} {op:<16} {:>9} {:>11} {:>10.1}  (held delay mean {:.1})",
                    "daemon", o.count, "-", o.service_mean_us, o.delay_mean_us
                );
            }
            if d.unmatched > 0 || d.inflight_at_end > 0 || d.lost_completions > 0 {
                let _ = writeln!(
                    s,
                    "{name:<12} {} completions without an issue time, {} issues whose completion was not seen, {} in flight at detach",
                    d.unmatched, d.lost_completions, d.inflight_at_end
                );
            }
            if d.untracked > 0 {
                let _ = writeln!(s, "{name:<12} {} requests not timed (no room in the kernel's issue-time table)", d.untracked);
            }
        }
        s
    }
}
