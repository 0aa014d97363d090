//! Networked experiments' results (docs/results.md, "Hosts and fault windows"): per client
//! host its throughput/latency series, per host the probers' samples, every fault window
//! (network, disk, host), and per window and client the performability figures: throughput
//! during vs before, latency, errors and retries, time to recover, work lost.

use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// Throughput counts as recovered once it is within this fraction of its level before.
pub const RECOVERED_WITHIN: f64 = 0.10;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct NetworkedRun {
    pub hosts: Vec<NetworkedHost>,
    /// Probe interval, s.
    pub interval_s: f64,
    /// Where the CPU figures come from (see docs/results.md).
    pub cpu_source: String,
    pub clients: Vec<ClientSeries>,
    /// Every host's samples, every interval, in time order.
    pub probes: Vec<Probe>,
    pub windows: Vec<FaultWindow>,
    /// Per window and client.
    pub window_stats: Vec<WindowStats>,
    /// The relay's per-link counters at the end (packets, dropped, delayed, ...).
    pub links: serde_json::Value,
    /// How long after the faults' clock started (network rules set, disk clock reset, host
    /// faults scheduled) the first client's workload started; the series count from the latter.
    pub start_lag_s: f64,
    /// Hosts reached through agents (run::agents; empty for namespaces faultline built): each
    /// one's channel, clock offset and, if it was lost, when and doing what.
    pub agents: Vec<NetworkedAgent>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct NetworkedAgent {
    pub host: String,
    /// How the controller reached it: `ssh root@h`, `ip netns exec NS`, ...
    pub channel: String,
    pub version: String,
    /// The agent's clock minus the controller's (its samples were moved by it), and the
    /// estimate's error bound (half the best round trip), ms.
    pub offset_ms: f64,
    pub offset_error_ms: f64,
    pub lost: Option<AgentLoss>,
}

/// An agent whose channel closed or that stopped answering during the run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AgentLoss {
    /// Seconds from the workload's start (the controller's clock).
    pub t_s: f64,
    /// What it was doing then (e.g. "running the workload").
    pub doing: String,
    pub reason: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct NetworkedHost {
    pub name: String,
    /// client | target
    pub role: String,
    pub address: String,
    pub namespace: String,
}

/// One interval of one client's workload (ends at `t_s`, seconds from the workload's start).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ClientPoint {
    pub t_s: f64,
    pub iops: f64,
    pub mib_s: f64,
    pub mean_us: f64,
    pub p99_us: f64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ClientSeries {
    pub host: String,
    pub seconds: f64,
    pub mib_s: f64,
    pub ops: u64,
    pub failed_ios: u64,
    pub io_errors: std::collections::BTreeMap<String, u64>,
    pub nbd_client: Option<super::model::CounterSnapshot>,
    pub points: Vec<ClientPoint>,
}

/// What a host prober reads from /proc and the disk server for one interval (shared by the
/// namespace run's prober and `faultline agent --probe`); counters are deltas.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct HostCounters {
    /// CPU of the host's processes, % of one CPU (user, system).
    pub cpu_user_pct: f64,
    pub cpu_system_pct: f64,
    /// The machine's CPU (/proc/stat), % of all CPUs: namespaces share the machine's CPUs.
    pub machine_user_pct: f64,
    pub machine_system_pct: f64,
    pub machine_steal_pct: f64,
    pub rss_mib: f64,
    pub mem_available_mib: f64,
    /// The host's links (the relay's fl0 and the veth fast-path links, summed; from its
    /// namespace's /proc/net/dev).
    pub rx_packets: u64,
    pub tx_packets: u64,
    pub rx_dropped: u64,
    pub tx_dropped: u64,
    /// TCP segments retransmitted by the host (its namespace's /proc/net/snmp).
    pub tcp_retrans: u64,
    /// Target: requests its disk server answered.
    pub requests: u64,
}

/// One host's sample at `t_s` (seconds from the workload's start); counters are deltas over
/// the interval ending then.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Probe {
    pub t_s: f64,
    pub host: String,
    #[serde(flatten)]
    pub sys: HostCounters,
    /// Packets the relay's network faults dropped on links into this host (rules, and delayed
    /// packets it could not keep or send in time).
    pub relay_dropped: u64,
    /// Packets into this host that its full receive queue refused (congestion, no fault).
    pub relay_backlog_full: u64,
    /// Client: its workload's completed and failed I/Os, and its NBD client's retries and
    /// timed-out requests.
    pub ops: u64,
    pub errors: u64,
    pub retries: u64,
    pub timeouts: u64,
    /// Target (our NBD server): requests in flight at the sample, and their mean over the
    /// interval (the server's queue depth; 0 for other servers).
    pub target_in_flight: u64,
    pub target_queue_depth: f64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct FaultWindow {
    /// net | disk | host
    pub kind: String,
    pub description: String,
    /// Seconds from the workload's start; `to_s: None`: sticky until the end.
    pub from_s: f64,
    pub to_s: Option<f64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct WindowStats {
    pub window: usize,
    pub client: String,
    /// Mean throughput (MiB/s) over the intervals before the window (as long as the window, at
    /// most) and over the intervals inside it; ratio = during / before.
    pub before_mib_s: Option<f64>,
    pub during_mib_s: Option<f64>,
    pub ratio: Option<f64>,
    /// Mean of the intervals' mean latency and the largest interval p99 inside the window.
    pub mean_us: Option<f64>,
    pub p99_us: Option<f64>,
    pub errors: u64,
    pub retries: u64,
    pub timeouts: u64,
    /// Time from the window's end until the first interval whose throughput is back within
    /// 10% of `before` (None: sticky, no before level, or never within the run).
    pub recovery_s: Option<f64>,
    /// Ops done below the before level during window and recovery (before rate x time - ops).
    pub ops_lost: Option<f64>,
}

/// Interval i covers (t_s[i-1], t_s[i]]; the first starts at 0.
fn spans(p: &[ClientPoint]) -> Vec<(f64, f64)> {
    let mut prev = 0.0;
    p.iter()
        .map(|x| {
            let s = (prev, x.t_s);
            prev = x.t_s;
            s
        })
        .collect()
}

fn mean(v: impl Iterator<Item = f64>) -> Option<f64> {
    let (n, s) = v.fold((0usize, 0.0), |(n, s), x| (n + 1, s + x));
    (n > 0).then(|| s / n as f64)
}

/// Time to recover: from `end` to the start of the first interval lying wholly after `end`
/// whose throughput is within 10% of `before`. None when no interval after `end` gets there.
pub fn recovery_time(points: &[ClientPoint], end: f64, before: f64) -> Option<f64> {
    spans(points)
        .into_iter()
        .zip(points)
        .find(|((s, _), p)| *s >= end - 1e-9 && p.mib_s >= before * (1.0 - RECOVERED_WITHIN))
        .map(|((s, _), _)| (s - end).max(0.0))
}

/// The figures of window `w` (index `index`) for one client; `probes` are that client's.
pub fn window_stats(index: usize, w: &FaultWindow, c: &ClientSeries, probes: &[&Probe]) -> WindowStats {
    let sp = spans(&c.points);
    let end = w.to_s.unwrap_or(f64::INFINITY);
    let len = (end.min(c.seconds) - w.from_s).max(0.0);
    // before: whole intervals inside [from - len, from), not the first (start-up)
    let before_from = (w.from_s - len.max(1.0)).max(0.0);
    let before: Vec<&ClientPoint> =
        sp.iter().zip(&c.points).skip(1).filter(|((s, e), _)| *s >= before_from - 1e-9 && *e <= w.from_s + 1e-9).map(|(_, p)| p).collect();
    // during: intervals that lie mostly inside the window
    let during: Vec<&ClientPoint> = sp.iter().zip(&c.points).filter(|((s, e), _)| (s + e) / 2.0 >= w.from_s && (s + e) / 2.0 < end).map(|(_, p)| p).collect();
    let before_mib_s = mean(before.iter().map(|p| p.mib_s));
    let during_mib_s = mean(during.iter().map(|p| p.mib_s));
    let ratio = match (before_mib_s, during_mib_s) {
        (Some(b), Some(d)) if b > 0.0 => Some(d / b),
        _ => None,
    };
    let in_window = |t: f64| t > w.from_s && t <= end + 1e-9;
    let sum = |f: fn(&Probe) -> u64| probes.iter().filter(|p| in_window(p.t_s)).map(|p| f(p)).sum::<u64>();
    let recovery_s = match (w.to_s, before_mib_s) {
        (Some(to), Some(b)) if b > 0.0 => recovery_time(&c.points, to, b),
        _ => None,
    };
    // work lost: the before rate kept up over window + recovery, minus the ops done then
    let ops_lost = before_mib_s.filter(|b| *b > 0.0).and_then(|_| {
        let stop = w.to_s.map(|t| t + recovery_s.unwrap_or(0.0)).unwrap_or(c.seconds);
        let before_iops = mean(before.iter().map(|p| p.iops))?;
        let done: f64 = sp.iter().zip(&c.points).filter(|((s, e), _)| *s >= w.from_s - 1e-9 && *e <= stop + 1e-9).map(|((s, e), p)| p.iops * (e - s)).sum();
        Some((before_iops * (stop - w.from_s) - done).max(0.0))
    });
    WindowStats {
        window: index,
        client: c.host.clone(),
        before_mib_s,
        during_mib_s,
        ratio,
        mean_us: mean(during.iter().map(|p| p.mean_us)),
        p99_us: during.iter().map(|p| p.p99_us).fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x)))),
        errors: sum(|p| p.errors),
        retries: sum(|p| p.retries),
        timeouts: sum(|p| p.timeouts),
        recovery_s,
        ops_lost,
    }
}

impl NetworkedRun {
    /// Compute `window_stats` for every window and client.
    pub fn analyse(&mut self) {
        let mut out = Vec::new();
        for (i, w) in self.windows.iter().enumerate() {
            for c in &self.clients {
                let probes: Vec<&Probe> = self.probes.iter().filter(|p| p.host == c.host).collect();
                out.push(window_stats(i, w, c, &probes));
            }
        }
        self.window_stats = out;
    }
}

fn opt(v: Option<f64>) -> String {
    v.map_or(String::new(), |x| format!("{x:.3}"))
}

/// windows.csv: one row per setup, repetition, window and client.
pub fn windows_csv(rows: &[(String, u32, &NetworkedRun)]) -> String {
    let mut s = String::from(
        "setup,rep,window,kind,description,from_s,to_s,client,before_mib_s,during_mib_s,ratio,mean_us,p99_us,errors,retries,timeouts,recovery_s,ops_lost\n",
    );
    for (setup, rep, st) in rows {
        for ws in &st.window_stats {
            let w = &st.windows[ws.window];
            let _ = writeln!(
                s,
                "{setup},{rep},{},{},\"{}\",{:.3},{},{},{},{},{},{},{},{},{},{},{},{}",
                ws.window,
                w.kind,
                w.description.replace('"', "'"),
                w.from_s,
                opt(w.to_s),
                ws.client,
                opt(ws.before_mib_s),
                opt(ws.during_mib_s),
                opt(ws.ratio),
                opt(ws.mean_us),
                opt(ws.p99_us),
                ws.errors,
                ws.retries,
                ws.timeouts,
                opt(ws.recovery_s),
                opt(ws.ops_lost)
            );
        }
    }
    s
}

/// hosts_timeseries.csv: every probe of every host, with the client's throughput where the
/// host is a client (the workload interval ending nearest the probe).
pub fn hosts_csv(rows: &[(String, u32, &NetworkedRun)]) -> String {
    let mut s = String::from(
        "setup,rep,t_s,host,mib_s,iops,mean_us,p99_us,ops,errors,retries,timeouts,requests,cpu_user_pct,cpu_system_pct,machine_user_pct,machine_system_pct,machine_steal_pct,rss_mib,mem_available_mib,rx_packets,tx_packets,rx_dropped,tx_dropped,tcp_retrans,relay_dropped,relay_backlog_full,target_in_flight,target_queue_depth\n",
    );
    for (setup, rep, st) in rows {
        for p in &st.probes {
            let point = st
                .clients
                .iter()
                .find(|c| c.host == p.host)
                .and_then(|c| c.points.iter().min_by(|a, b| (a.t_s - p.t_s).abs().total_cmp(&(b.t_s - p.t_s).abs())));
            let (m, i, mu, p99) = point.map_or((String::new(), String::new(), String::new(), String::new()), |c| {
                (format!("{:.3}", c.mib_s), format!("{:.1}", c.iops), format!("{:.1}", c.mean_us), format!("{:.1}", c.p99_us))
            });
            let _ = writeln!(
                s,
                "{setup},{rep},{:.3},{},{m},{i},{mu},{p99},{},{},{},{},{},{:.1},{:.1},{:.1},{:.1},{:.1},{:.1},{:.1},{},{},{},{},{},{},{},{},{:.2}",
                p.t_s,
                p.host,
                p.ops,
                p.errors,
                p.retries,
                p.timeouts,
                p.sys.requests,
                p.sys.cpu_user_pct,
                p.sys.cpu_system_pct,
                p.sys.machine_user_pct,
                p.sys.machine_system_pct,
                p.sys.machine_steal_pct,
                p.sys.rss_mib,
                p.sys.mem_available_mib,
                p.sys.rx_packets,
                p.sys.tx_packets,
                p.sys.rx_dropped,
                p.sys.tx_dropped,
                p.sys.tcp_retrans,
                p.relay_dropped,
                p.relay_backlog_full,
                p.target_in_flight,
                p.target_queue_depth
            );
        }
    }
    s
}

/// A fault window's shade: blue network, orange disk, green host.
fn window_color(kind: &str) -> &'static str {
    match kind {
        "net" => "#0072B2",
        "disk" => "#D55E00",
        _ => "#009E73",
    }
}

/// Shaded bands for fault windows (hover: kind and description).
fn bands(windows: &[FaultWindow]) -> Vec<super::svg::Band> {
    windows
        .iter()
        .map(|w| super::svg::Band { from: w.from_s, to: w.to_s, title: format!("{}: {}", w.kind, w.description), color: window_color(&w.kind).into() })
        .collect()
}

/// Every networked repetition of the runs: (setup label, setup, repetition index, its run).
fn networked_reps<'a>(runs: &'a [super::html::Run]) -> Vec<(String, u32, &'a NetworkedRun)> {
    let several = runs.len() > 1;
    runs.iter()
        .flat_map(|run| {
            run.results.setups.iter().flat_map(move |s| {
                let label = if several { format!("{} · {}", run.label, s.name) } else { s.name.clone() };
                s.repetitions.iter().filter_map(move |r| r.networked.as_deref().map(|n| (label.clone(), r.index, n)))
            })
        })
        .collect()
}

fn cell(v: Option<f64>, d: usize) -> String {
    v.map_or("-".to_string(), |x| format!("{x:.d$}"))
}

/// The lead of a performability report: every setup's client throughput over time as small
/// multiples on one scale (the same seconds and MiB/s axes everywhere, so the setups compare at
/// a glance) with the fault windows shaded, then one table of every window's figures.
pub fn lead(h: &mut String, runs: &[super::html::Run]) {
    use super::svg::{LineChart, PALETTE, Series};
    let reps = networked_reps(runs);
    if reps.is_empty() {
        return;
    }
    let xmax = reps
        .iter()
        .flat_map(|(_, _, n)| n.clients.iter().flat_map(|c| c.points.iter().map(|p| p.t_s)).chain(n.windows.iter().filter_map(|w| w.to_s)))
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max);
    let ymax = reps.iter().flat_map(|(_, _, n)| n.clients.iter().flat_map(|c| c.points.iter().map(|p| p.mib_s))).filter(|v| v.is_finite()).fold(0.0, f64::max);
    h.push_str(
        "<section id=\"lead\" class=\"lead-performability\"><h2>Throughput through the fault windows</h2>\n<p class=\"muted\">Each client's throughput per interval, \
one chart per setup, all on the same axes; shaded: fault windows (blue network, orange disk, green host). Hover a window for what it did.</p>\n<div class=\"multiples\">",
    );
    // one chart per setup: its repetitions' clients (a colour per repetition and client)
    let mut setups: Vec<&str> = reps.iter().map(|(l, _, _)| l.as_str()).collect();
    setups.dedup();
    for label in setups {
        let mine: Vec<&(String, u32, &NetworkedRun)> = reps.iter().filter(|(l, _, _)| l == label).collect();
        let several = mine.len() > 1;
        let mut series = Vec::new();
        for (_, index, n) in &mine {
            for c in &n.clients {
                series.push(Series {
                    name: if several { format!("rep {index} {}", c.host) } else { c.host.clone() },
                    color: PALETTE[series.len() % PALETTE.len()].into(),
                    dashed: false,
                    points: c.points.iter().map(|p| (p.t_s, p.mib_s)).collect(),
                });
            }
        }
        // the windows of all its repetitions, each once
        let mut windows: Vec<FaultWindow> = Vec::new();
        for (_, _, n) in &mine {
            for w in &n.windows {
                if !windows.contains(w) {
                    windows.push(w.clone());
                }
            }
        }
        let chart = LineChart {
            title: label.to_string(),
            x_label: "s".into(),
            y_label: "MiB/s".into(),
            series,
            markers: vec![],
            width: 360.0,
            height: 200.0,
            extent: Some((xmax, ymax)),
        };
        h.push_str(&chart.render_with_bands(&bands(&windows)));
    }
    h.push_str(
        "</div>\n<h3>Fault windows</h3><p class=\"muted\">Per window and client: mean throughput before the window (as long as the window) and during it, \
their ratio, the time from the window's end until throughput is back within 10% of before (- : not within the run, or a sticky fault), \
and the work lost: the ops the before rate would have done over window and recovery, minus those done.</p>\n",
    );
    let rows: Vec<(Option<&str>, u32, &NetworkedRun)> = reps.iter().map(|(l, i, n)| (Some(l.as_str()), *i, *n)).collect();
    window_table(h, &rows);
    h.push_str("</section>\n");
}

/// The fault-window table, one row per repetition, window and client: `rows` are (setup
/// label, or None for a setup's own section, which leaves the column out; repetition; run).
fn window_table(h: &mut String, rows: &[(Option<&str>, u32, &NetworkedRun)]) {
    use super::html::esc;
    let setup = rows.iter().any(|r| r.0.is_some());
    h.push_str("<table><tr>");
    if setup {
        h.push_str("<th class=\"l\">Setup</th>");
    }
    h.push_str(
        "<th>Rep</th><th class=\"l\">Window</th><th>From..to (s)</th><th class=\"l\">Client</th><th>Before MiB/s</th><th>During MiB/s</th><th>Ratio</th>\
<th>Mean µs</th><th>p99 µs</th><th>Errors</th><th>Retries</th><th>Timeouts</th><th>Recovery (s)</th><th>Work lost (ops)</th></tr>\n",
    );
    for (label, index, n) in rows {
        for ws in &n.window_stats {
            let Some(w) = n.windows.get(ws.window) else { continue };
            h.push_str("<tr>");
            if setup {
                let _ = write!(h, "<td class=\"l\">{}</td>", esc(label.unwrap_or_default()));
            }
            let _ = writeln!(
                h,
                "<td>{index}</td><td class=\"l\">{} {}</td><td>{:.1}..{}</td><td class=\"l\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&w.kind),
                esc(&w.description),
                w.from_s,
                w.to_s.map_or("end".into(), |t| format!("{t:.1}")),
                esc(&ws.client),
                cell(ws.before_mib_s, 2),
                cell(ws.during_mib_s, 2),
                cell(ws.ratio, 3),
                cell(ws.mean_us, 0),
                cell(ws.p99_us, 0),
                ws.errors,
                ws.retries,
                ws.timeouts,
                cell(ws.recovery_s, 1),
                cell(ws.ops_lost, 0)
            );
        }
    }
    h.push_str("</table>\n");
}

/// The stdout lead of a performability study: one line per setup, repetition, window and
/// client with the window's figures; empty without networked repetitions.
pub fn summary(r: &super::model::Results) -> String {
    let run = super::html::Run { label: r.name.clone(), results: r };
    let reps = networked_reps(std::slice::from_ref(&run));
    let mut rows = vec![
        ["setup", "rep", "window", "client", "before MiB/s", "during MiB/s", "ratio", "recovery s", "work lost ops", "errors"]
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>(),
    ];
    for (label, index, n) in &reps {
        for ws in &n.window_stats {
            let Some(w) = n.windows.get(ws.window) else { continue };
            let to = w.to_s.map_or("end".into(), |t| format!("{t:.0}"));
            rows.push(vec![
                label.clone(),
                index.to_string(),
                format!("{} {:.0}..{to}s", w.kind, w.from_s),
                ws.client.clone(),
                cell(ws.before_mib_s, 2),
                cell(ws.during_mib_s, 2),
                cell(ws.ratio, 3),
                cell(ws.recovery_s, 1),
                cell(ws.ops_lost, 0),
                ws.errors.to_string(),
            ]);
        }
    }
    if rows.len() == 1 {
        return String::new();
    }
    format!("fault windows (throughput before and during each window, per client):\n{}\n", super::align(&rows, 4))
}

/// The report's section for a networked setup: per repetition, each client's throughput over
/// time with every fault window shaded, and the per-window table.
pub fn html(reps: &[super::model::Repetition]) -> String {
    use super::html::esc;
    use super::svg::{LineChart, PALETTE, Series};
    let mut h = String::new();
    for r in reps {
        let Some(st) = r.networked.as_deref() else { continue };
        let chart = LineChart {
            title: format!("Throughput over time, repetition {} (shaded: fault windows; blue network, orange disk, green host)", r.index),
            x_label: "seconds from the workload's start".into(),
            y_label: "MiB/s".into(),
            series: st
                .clients
                .iter()
                .enumerate()
                .map(|(i, c)| Series {
                    name: c.host.clone(),
                    color: PALETTE[i % PALETTE.len()].into(),
                    dashed: false,
                    points: c.points.iter().map(|p| (p.t_s, p.mib_s)).collect(),
                })
                .collect(),
            markers: vec![],
            width: 860.0,
            height: 300.0,
            extent: None,
        };
        let bands = bands(&st.windows);
        h.push_str(&chart.render_with_bands(&bands));
        h.push_str("<h3>Fault windows</h3>");
        window_table(&mut h, &[(None, r.index, st)]);
        if !st.agents.is_empty() {
            h.push_str("<h3>Agents</h3><p>Every sample is on the controller's clock: the agent's time minus its offset (estimated from round trips; the error bound is half the best round trip).</p><table><tr><th>Rep</th><th class=\"l\">Host</th><th class=\"l\">Channel</th><th>Offset ms</th><th>± ms</th><th class=\"l\">Lost</th></tr>\n");
            for a in &st.agents {
                let lost = a.lost.as_ref().map_or("-".to_string(), |l| format!("at {:.1} s while {}: {}", l.t_s, l.doing, l.reason));
                let _ = writeln!(
                    h,
                    "<tr><td>{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td><td>{:+.3}</td><td>{:.3}</td><td class=\"l\">{}</td></tr>",
                    r.index,
                    esc(&a.host),
                    esc(&a.channel),
                    a.offset_ms,
                    a.offset_error_ms,
                    esc(&lost)
                );
            }
            h.push_str("</table>\n");
        }
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_json_keeps_host_counters_flat() {
        let p =
            Probe { t_s: 2.0, host: "target".into(), sys: HostCounters { cpu_user_pct: 1.5, requests: 7, ..Default::default() }, ops: 3, ..Default::default() };
        let v = serde_json::to_value(&p).unwrap();
        assert_eq!(v["cpu_user_pct"], 1.5);
        assert_eq!(v["requests"], 7);
        assert!(v.get("sys").is_none(), "{v}");
        assert_eq!(serde_json::from_value::<Probe>(v).unwrap(), p);
    }

    fn series(mib: &[f64]) -> ClientSeries {
        let points = mib
            .iter()
            .enumerate()
            .map(|(i, m)| ClientPoint { t_s: (i + 1) as f64, iops: m * 128.0, mib_s: *m, mean_us: 100.0 / m.max(0.1), p99_us: 0.0 })
            .collect();
        ClientSeries { host: "client".into(), seconds: mib.len() as f64, points, ..Default::default() }
    }

    #[test]
    fn recovery_time_counts_from_the_window_end_to_the_first_interval_back_within_10_percent() {
        // 10 MiB/s, a window from 4 s to 6 s at 2, then 5 and 8.5 (both more than 10% below),
        // back at 9.5 (within 10%) in the interval starting at 8 s: 2 s after the end
        let c = series(&[10.0, 10.0, 10.0, 10.0, 2.0, 2.0, 5.0, 8.5, 9.5, 10.0]);
        assert_eq!(recovery_time(&c.points, 6.0, 10.0), Some(2.0));
        // back at once: 0
        let c2 = series(&[10.0, 10.0, 10.0, 10.0, 2.0, 2.0, 9.2, 10.0]);
        assert_eq!(recovery_time(&c2.points, 6.0, 10.0), Some(0.0));
        // never
        let c3 = series(&[10.0, 10.0, 2.0, 2.0, 5.0]);
        assert_eq!(recovery_time(&c3.points, 4.0, 10.0), None);
    }

    #[test]
    fn window_figures_from_a_hand_made_series() {
        let c = series(&[10.0, 10.0, 10.0, 10.0, 2.0, 2.0, 5.0, 8.5, 9.5, 10.0]);
        let w = FaultWindow { kind: "net".into(), description: "d".into(), from_s: 4.0, to_s: Some(6.0) };
        let p = [
            Probe { t_s: 5.0, host: "client".into(), errors: 3, retries: 2, ..Default::default() },
            Probe { t_s: 9.0, host: "client".into(), errors: 7, ..Default::default() },
        ];
        let refs: Vec<&Probe> = p.iter().collect();
        let s = window_stats(0, &w, &c, &refs);
        assert_eq!(s.before_mib_s, Some(10.0));
        assert_eq!(s.during_mib_s, Some(2.0));
        assert_eq!(s.ratio, Some(0.2));
        assert_eq!((s.errors, s.retries), (3, 2));
        assert_eq!(s.recovery_s, Some(2.0));
        // 1280 iops before; 4 s (window + recovery) at that rate minus what was done
        let done = (2.0 + 2.0 + 5.0 + 8.5) * 128.0;
        assert!((s.ops_lost.unwrap() - (1280.0 * 4.0 - done)).abs() < 1e-6);
        // sticky: no recovery
        let sticky = FaultWindow { to_s: None, ..w };
        assert_eq!(window_stats(0, &sticky, &c, &refs).recovery_s, None);
    }
}
