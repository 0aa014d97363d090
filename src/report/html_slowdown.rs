//! The slowdown part of report.html (experiments with `baseline: true`), the lead of a latency
//! study's report: a scatter of baseline latency against slowdown, interval bars per op type,
//! slowdown by each matrix axis, per-layer slowdown and the block layer's queue time over time
//! (where the monitor ran), tables of the numbers, the realized slow-I/O patterns; and per
//! setup a latency CDF of baseline against injected runs.

use super::html::{Run, esc};
use super::model::{Repetition, SetupResult};
use super::slowdown::{QUEUE_SWING, SlowdownRow, THROUGHPUT, fmt_pct};
use super::svg::{Band, CdfChart, IntervalChart, IntervalRow, LineChart, PALETTE, ScatterChart, ScatterPoint, Series};
use std::collections::BTreeMap;
use std::fmt::Write;

/// Sources of the main table: what the application saw (the monitor's layers get their own).
fn app_source(s: &str) -> bool {
    s == "workload" || s == "flowop"
}

/// The monitor's layers from the application down to the device, the order "where the time
/// went" is told in.
pub const LAYER_ORDER: [&str; 9] = ["syscall", "fs", "journal", "block_queue", "block_service", "driver", "daemon", "user", "workload"];

fn layer_rank(source: &str) -> usize {
    LAYER_ORDER.iter().position(|l| *l == source).unwrap_or(LAYER_ORDER.len())
}

/// The monitor's per-layer mean-latency rows of a setup that have a usable pair, from the
/// application down (syscall, fs, journal, block queue and service, driver, daemon, the
/// user's pairs).
pub fn layer_rows(rs: &[SlowdownRow]) -> Vec<&SlowdownRow> {
    let mut v: Vec<&SlowdownRow> = rs.iter().filter(|r| !app_source(&r.source) && r.metric == "mean_us" && r.pairs > 0).collect();
    v.sort_by_key(|r| layer_rank(&r.source));
    v
}

/// Which pairing the slowdowns come from, as a note under the section's heading.
fn method_label<'a>(setups: impl Iterator<Item = &'a SetupResult>) -> String {
    let methods: std::collections::BTreeSet<&str> = setups.filter_map(|s| super::slowdown::method(&s.baseline, &s.repetitions)).collect();
    let text: Vec<&str> = methods
        .iter()
        .map(|m| match *m {
            "windows" => "paired windows: within each run the faults were armed in alternating windows; each pair is an unarmed and an armed window of one run (its Baseline is the unarmed window)",
            _ => "paired runs: each pair is a baseline run and an injected run",
        })
        .collect();
    format!("<p class=\"muted\" data-method=\"{}\">Method: {}.</p>\n", methods.iter().copied().collect::<Vec<_>>().join(" "), esc(&text.join("; ")))
}

fn cell(r: Option<&SlowdownRow>) -> String {
    match r {
        None => "<td></td>".into(),
        Some(r) => format!("<td{}>{}</td>", if r.distinguishable { " class=\"sd\"" } else { "" }, esc(&fmt_pct(r))),
    }
}

fn interval_row(label: String, r: &SlowdownRow) -> IntervalRow {
    IntervalRow { label, value: r.slowdown * 100.0, interval: r.ci_low.zip(r.ci_high).map(|(a, b)| (a * 100.0, b * 100.0)), strong: r.distinguishable }
}

/// A row in µs added per request: injected − baseline mean, and the slowdown's interval
/// turned back into µs (it is the paired differences' interval over the mean baseline).
fn added_row(label: String, r: &SlowdownRow) -> IntervalRow {
    IntervalRow {
        label,
        value: r.injected - r.baseline,
        interval: r.ci_low.zip(r.ci_high).map(|(a, b)| (a * r.baseline, b * r.baseline)),
        strong: r.distinguishable,
    }
}

fn interval_chart(title: String, rows: Vec<IntervalRow>) -> String {
    let label_width = rows.iter().map(|r| r.label.chars().count()).max().unwrap_or(10) as f64 * 6.5 + 12.0;
    IntervalChart { title, x_label: "slowdown %".into(), rows, width: 900.0, label_width: label_width.clamp(80.0, 400.0) }.render()
}

/// Setups whose charts of their own are drawn (per-layer slowdown, queue over time); the
/// tables and slowdown.csv hold all.
pub const CHARTED_SETUPS: usize = 16;

/// A setup with the slowdown rows stored in its results (`SetupResult::slowdown`, computed
/// once by `aggregate_now` when the results were written).
type Setup<'a> = (&'a str, &'a SetupResult, &'a [SlowdownRow]);

/// The whole section, the lead of a latency study's report: the published figures'
/// equivalents (scatter of baseline latency against slowdown, per-op bars, slowdown by each
/// matrix axis, per-layer slowdown, the block layer's queue time over time), each with its
/// 95% intervals, then the numbers; empty when no setup has slowdown rows.
pub fn section(h: &mut String, runs: &[Run]) {
    let setups: Vec<Setup> = runs
        .iter()
        .flat_map(|r| r.results.setups.iter().map(move |s| (r.label.as_str(), s)))
        .map(|(l, s)| (l, s, s.slowdown.as_slice()))
        .filter(|(_, _, rs)| !rs.is_empty())
        .collect();
    if setups.is_empty() {
        return;
    }
    let several = runs.len() > 1;
    let name = |run: &str, s: &SetupResult| if several { format!("{run} · {}", s.name) } else { s.name.clone() };
    h.push_str(
        "<section id=\"lead\" class=\"lead-latency\"><h2>Slowdown against the baseline</h2>\n<p class=\"muted\">Each pair is a run or window without the faults (baseline) and one with them (the method is below). \
Per pair: injected / baseline − 1 for latencies, baseline / injected − 1 for throughput (so both say how much slower). \
Shown: the mean over pairs and its 95% Student t interval; <b>bold</b> (solid bars) where the interval excludes zero (docs/results.md).</p>\n",
    );
    h.push_str(&method_label(setups.iter().map(|(_, s, _)| *s)));
    scatter(h, &setups, several);
    // bars: one chart per op type, one bar per setup
    let mut by_op: BTreeMap<&str, Vec<IntervalRow>> = BTreeMap::new();
    for (run, s, rs) in &setups {
        for r in rs.iter().filter(|r| app_source(&r.source) && r.metric == "mean_us") {
            by_op.entry(r.op.as_str()).or_default().push(interval_row(name(run, s), r));
        }
    }
    if !by_op.is_empty() {
        h.push_str("<h3>Slowdown per op</h3>\n");
    }
    for (op, rows) in by_op {
        h.push_str(&interval_chart(format!("{op}: slowdown of the mean latency, with 95% interval"), rows));
    }
    by_axis(h, &setups);
    layers(h, &setups, several);
    queue_over_time(h, &setups, several);
    // the numbers: setup x op, latency slowdowns and throughput
    h.push_str("<h3>Slowdown per setup and op</h3><table><tr><th class=\"l\">Setup</th><th class=\"l\">Op</th><th>Pairs</th><th>Baseline mean µs</th><th>Injected mean µs</th><th>Mean</th><th>p50</th><th>p95</th><th>p99</th><th>Throughput</th></tr>\n");
    for (run, s, rs) in &setups {
        let ops: Vec<(&str, &str)> = {
            let mut v: Vec<(&str, &str)> = rs.iter().filter(|r| app_source(&r.source)).map(|r| (r.source.as_str(), r.op.as_str())).collect();
            v.dedup();
            v
        };
        for (src, op) in ops {
            let get = |m: &str| rs.iter().find(|r| r.source == src && r.op == op && r.metric == m);
            let mean = get("mean_us");
            let _ = writeln!(
                h,
                "<tr><td class=\"l\">{}</td><td class=\"l\">{}</td><td>{}</td><td>{:.1}</td><td>{:.1}</td>{}{}{}{}{}</tr>",
                esc(&name(run, s)),
                esc(op),
                mean.map_or(0, |r| r.pairs),
                mean.map_or(0.0, |r| r.baseline),
                mean.map_or(0.0, |r| r.injected),
                cell(mean),
                cell(get("p50_us")),
                cell(get("p95_us")),
                cell(get("p99_us")),
                cell(get(THROUGHPUT))
            );
        }
    }
    h.push_str("</table>\n");
    monitor_table(h, &setups, several);
    patterns(h, &setups, several);
    h.push_str("</section>\n");
}

/// Baseline mean latency against slowdown: one point per setup and op, a colour per op, the
/// slowdown's interval as a whisker.
fn scatter(h: &mut String, setups: &[Setup], several: bool) {
    let mut groups: Vec<String> = Vec::new();
    let mut points = Vec::new();
    for (run, s, rs) in setups {
        for r in rs.iter().filter(|r| app_source(&r.source) && r.metric == "mean_us") {
            let g = match groups.iter().position(|x| x == &r.op) {
                Some(i) => i,
                None => {
                    groups.push(r.op.clone());
                    groups.len() - 1
                }
            };
            let who = if several { format!("{run} · {}", s.name) } else { s.name.clone() };
            points.push(ScatterPoint {
                x: r.baseline,
                y: r.slowdown * 100.0,
                group: g,
                title: format!("{who} {}: {:.1} µs, {}", r.op, r.baseline, fmt_pct(r)),
                interval: r.ci_low.zip(r.ci_high).map(|(a, b)| (a * 100.0, b * 100.0)),
            });
        }
    }
    if points.is_empty() {
        return;
    }
    let c = ScatterChart {
        title: "Baseline mean latency vs slowdown (one point per setup and op, 95% interval)".into(),
        x_label: "baseline mean latency µs (log)".into(),
        y_label: "slowdown %".into(),
        groups,
        points,
        width: 900.0,
        height: 380.0,
    };
    h.push_str(&c.render());
}

/// Pooled slowdown of several setups' rows: the mean of all their pairs' relative differences
/// (`per_pair`) and its 95% t interval.
pub fn pooled(rows: &[&SlowdownRow]) -> SlowdownRow {
    let all: Vec<f64> = rows.iter().flat_map(|r| r.per_pair.iter().copied()).collect();
    let (mean, ci) = super::slowdown::mean_ci(&all);
    SlowdownRow {
        pairs: all.len() as u32,
        slowdown: mean,
        ci_low: ci.map(|c| c.0),
        ci_high: ci.map(|c| c.1),
        distinguishable: ci.is_some_and(|(lo, hi)| lo > 0.0 || hi < 0.0),
        per_pair: all,
        ..Default::default()
    }
}

/// Matrix studies: for every axis with two or more entries (pattern, file system or ext4
/// tuple, read:write mix, personality...), the slowdown of the workload's mean read and write
/// latency per entry, pooled over the setups with that entry (`pooled`), entries in the
/// file's order.
fn by_axis(h: &mut String, setups: &[Setup]) {
    let mut axes: Vec<&str> = Vec::new();
    for (_, s, _) in setups {
        for (a, _) in &s.axes {
            if !axes.contains(&a.as_str()) {
                axes.push(a);
            }
        }
    }
    for axis in axes {
        let mut entries: Vec<&str> = Vec::new();
        for (_, s, _) in setups {
            if let Some((_, e)) = s.axes.iter().find(|(a, _)| a == axis)
                && !entries.contains(&e.as_str())
            {
                entries.push(e);
            }
        }
        if entries.len() < 2 {
            continue;
        }
        let mut rows = Vec::new();
        for e in &entries {
            for op in ["read", "write"] {
                let mine: Vec<&SlowdownRow> = setups
                    .iter()
                    .filter(|(_, s, _)| s.axes.iter().any(|(a, x)| a == axis && x == e))
                    .flat_map(|(_, _, rs)| rs.iter().filter(|r| r.source == "workload" && r.op == op && r.metric == "mean_us"))
                    .collect();
                if mine.is_empty() {
                    continue;
                }
                let p = pooled(&mine);
                rows.push(interval_row(format!("{e} · {op} ({} setups, {} pairs)", mine.len(), p.pairs), &p));
            }
        }
        if !rows.is_empty() {
            let _ = write!(h, "<h3>Slowdown by {}</h3>", esc(axis));
            h.push_str(&interval_chart(format!("by {axis}: slowdown of the mean read and write latency, pooled over setups, with 95% interval"), rows));
        }
    }
}

/// Where the time went: per setup, the slowdown of the mean latency at each layer the monitor
/// timed, from the workload's view down to the disk daemon.
fn layers(h: &mut String, setups: &[Setup], several: bool) {
    let with: Vec<&Setup> = setups.iter().filter(|(_, _, rs)| !layer_rows(rs).is_empty()).collect();
    if with.is_empty() {
        return;
    }
    h.push_str("<h3>Slowdown per layer (BPF monitor)</h3><p class=\"muted\">Time added to each layer's mean latency per request, with its 95% interval, \
from the application down: syscall, fs, journal (jbd2 commit and its phases), block queue and service, driver (FUSE requests of the loop device), \
daemon (the disk server's own service time, held delays included). Added µs rather than percent: a layer of 1 µs that gains 10 µs is +1000% and \
says less than a layer of 100 µs that gains 10 µs. A delay held in the device shows from the daemon up to the block service, and in the calls that wait for it. \
Percentages, and the kernel's per-commit phase times (<code>jbd2_run_stats:*</code>, in jiffies), are in the table below.</p>\n");
    for (run, s, rs) in with.iter().take(CHARTED_SETUPS) {
        let who = if several { format!("{run} · {}", s.name) } else { s.name.clone() };
        // jbd2_run_stats rows are whole jiffies: left to the table
        let rows: Vec<IntervalRow> = rs
            .iter()
            .filter(|r| r.source == "workload" && r.metric == "mean_us")
            .chain(layer_rows(rs).into_iter().filter(|r| !r.op.starts_with("jbd2_run_stats:")))
            .map(|r| added_row(format!("{} {}", r.source, r.op), r))
            .collect();
        let c = IntervalChart {
            title: format!("{who}: where the time went (µs added to the mean latency per request, per layer)"),
            x_label: "µs added (injected − baseline mean)".into(),
            label_width: (rows.iter().map(|r| r.label.chars().count()).max().unwrap_or(10) as f64 * 6.5 + 12.0).clamp(80.0, 400.0),
            rows,
            width: 900.0,
        };
        h.push_str(&c.render());
    }
    if with.len() > CHARTED_SETUPS {
        let _ =
            write!(h, "<p class=\"muted\">Charts for the first {CHARTED_SETUPS} of {} setups; all are in the table below and slowdown.csv.</p>", with.len());
    }
}

/// The block layer's queue time over each run, small multiples on one scale: per setup the
/// injected repetitions (solid) and their baselines (dashed), one colour per pair, for the op
/// that spent the most time queued.
fn queue_over_time(h: &mut String, setups: &[Setup], several: bool) {
    use super::slowdown::queue_over_time as series_of;
    let mut charts = Vec::new();
    for (run, s, _) in setups {
        let total = |op: &str| s.repetitions.iter().flat_map(|r| series_of(r, op)).map(|p| p.1).sum::<f64>();
        let op = if total("write") >= total("read") { "write" } else { "read" };
        // paired windows: every repetition on the workload's clock, its armed windows shaded
        let windowed = s.window_plan.filter(|_| s.repetitions.iter().all(|r| super::slowdown::queue_over_workload(r, op).is_some()));
        let mut series = Vec::new();
        for (k, r) in s.repetitions.iter().enumerate() {
            let color = PALETTE[k % PALETTE.len()].to_string();
            let base = s.baseline.get(k).map(|b| series_of(b, op)).unwrap_or_default();
            if !base.is_empty() {
                series.push(Series { name: format!("rep {} base", r.index), color: color.clone(), dashed: true, points: base });
            }
            let inj = if windowed.is_some() { super::slowdown::queue_over_workload(r, op).unwrap_or_default() } else { series_of(r, op) };
            if !inj.is_empty() {
                series.push(Series { name: format!("rep {}", r.index), color, dashed: false, points: inj });
            }
        }
        let bands: Vec<Band> = windowed.map_or_else(Vec::new, |p| {
            let n = s.repetitions.iter().map(|r| r.windows.len() as u32).max().unwrap_or(0);
            (0..n)
                .filter(|k| crate::spec::windows::WindowPlan::armed(*k))
                .map(|k| Band {
                    from: p.start(k).as_secs_f64(),
                    to: Some(p.start(k + 1).as_secs_f64()),
                    title: format!("window {k}: armed"),
                    color: "#D55E00".into(),
                })
                .collect()
        });
        if series.iter().any(|x| x.points.len() >= 2) {
            let who = if several { format!("{run} · {}", s.name) } else { s.name.clone() };
            charts.push((format!("{who}: {op}"), series, bands));
        }
    }
    if charts.is_empty() {
        return;
    }
    let pts = || charts.iter().flat_map(|(_, se, _)| se.iter().flat_map(|x| x.points.iter()));
    let xmax = pts().map(|p| p.0).filter(|v| v.is_finite()).fold(0.0, f64::max);
    let ymax = pts().map(|p| p.1).filter(|v| v.is_finite()).fold(0.0, f64::max);
    h.push_str("<h3>Block layer queue time over time</h3><p class=\"muted\">Mean time requests waited in the block layer (allocation to the driver), \
per monitor interval (<code>monitor: {interval}</code>), injected runs solid, their baselines dashed, all charts on one scale; \
in paired-windows setups every repetition on the workload's clock, its armed windows shaded. \
Slow requests held in the device fill the queue while a burst lasts and let it drain after: the queue time rises and falls with the bursts.</p><div class=\"multiples\">");
    let n = charts.len();
    for (title, series, bands) in charts.into_iter().take(CHARTED_SETUPS) {
        let c = LineChart {
            title,
            x_label: if bands.is_empty() { "s after the monitor attached" } else { "s into the workload (shaded: armed windows)" }.into(),
            y_label: "queue µs".into(),
            series,
            markers: vec![],
            width: 440.0,
            height: 220.0,
            extent: Some((xmax, ymax)),
        };
        h.push_str(&c.render_with_bands(&bands));
    }
    h.push_str("</div>\n");
    if n > CHARTED_SETUPS {
        let _ = write!(h, "<p class=\"muted\">Charts for the first {CHARTED_SETUPS} of {n} setups.</p>");
    }
}

/// The monitor's per-layer slowdowns, where the runs were monitored.
fn monitor_table(h: &mut String, setups: &[Setup], several: bool) {
    let any = setups.iter().any(|(_, _, rs)| rs.iter().any(|r| !app_source(&r.source)));
    if !any {
        return;
    }
    h.push_str("<h3>Slowdown per kernel layer (BPF monitor)</h3><table><tr><th class=\"l\">Setup</th><th class=\"l\">Layer</th><th class=\"l\">Op</th><th>Baseline mean µs</th><th>Mean</th><th>p99</th><th>Throughput</th><th>Queue swing</th></tr>\n");
    for (run, s, rs) in setups {
        let mut keys: Vec<(&str, &str)> = rs.iter().filter(|r| !app_source(&r.source)).map(|r| (r.source.as_str(), r.op.as_str())).collect();
        keys.sort_by_key(|k| layer_rank(k.0));
        keys.dedup();
        for (src, op) in keys {
            let get = |m: &str| rs.iter().find(|r| r.source == src && r.op == op && r.metric == m);
            let who = if several { format!("{run} · {}", s.name) } else { s.name.clone() };
            let _ = writeln!(
                h,
                "<tr><td class=\"l\">{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td><td>{:.1}</td>{}{}{}{}</tr>",
                esc(&who),
                esc(src),
                esc(op),
                get("mean_us").map_or(0.0, |r| r.baseline),
                cell(get("mean_us")),
                cell(get("p99_us")),
                cell(get(THROUGHPUT)),
                cell(get(QUEUE_SWING))
            );
        }
    }
    h.push_str("</table>\n");
}

/// What the patterns did in the injected runs: asked pattern, realized ratio and runs.
fn patterns(h: &mut String, setups: &[Setup], several: bool) {
    let any = setups.iter().any(|(_, s, _)| s.repetitions.iter().any(|r| r.rules.iter().any(|x| x.matched > 0)));
    if !any {
        return;
    }
    h.push_str("<h3>Realized slow-I/O patterns (injected runs, mean over repetitions)</h3><table><tr><th class=\"l\">Setup</th><th class=\"l\">Rule</th><th class=\"l\">Pattern</th><th>Matched</th><th>Fired</th><th>Realized ratio</th><th>Runs</th><th>Run length mean</th><th>min</th><th>max</th></tr>\n");
    for (run, s, _) in setups {
        let mut names: Vec<&str> = s.repetitions.iter().flat_map(|r| r.rules.iter().map(|x| x.name.as_str())).collect();
        names.sort();
        names.dedup();
        for rule in names {
            let rs: Vec<&super::model::RuleCount> = s.repetitions.iter().flat_map(|r| r.rules.iter().filter(|x| x.name == rule)).collect();
            let n = rs.len().max(1) as f64;
            let mean = |f: &dyn Fn(&super::model::RuleCount) -> f64| rs.iter().map(|x| f(x)).sum::<f64>() / n;
            let who = if several { format!("{run} · {}", s.name) } else { s.name.clone() };
            let _ = writeln!(
                h,
                "<tr><td class=\"l\">{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td><td>{:.0}</td><td>{:.0}</td><td>{:.2}%</td><td>{:.1}</td><td>{:.1}</td><td>{}</td><td>{}</td></tr>",
                esc(&who),
                esc(rule),
                esc(rs.first().map_or("", |x| x.pattern.as_str())),
                mean(&|x| x.matched as f64),
                mean(&|x| x.fired as f64),
                mean(&|x| x.realized_ratio) * 100.0,
                mean(&|x| x.runs as f64),
                mean(&|x| x.run_length_mean),
                rs.iter().map(|x| x.run_length_min).min().unwrap_or(0),
                rs.iter().map(|x| x.run_length_max).max().unwrap_or(0)
            );
        }
    }
    h.push_str("</table>\n");
}

/// Each op's CDF averaged over repetitions: the latency at each quantile, mean over the runs.
fn mean_cdf(reps: &[Repetition], op: &str) -> Vec<(f64, f64)> {
    let mut acc: BTreeMap<u64, (f64, u32)> = BTreeMap::new();
    for r in reps {
        let cdf = match op {
            "read" => &r.read.cdf,
            "write" => &r.write.cdf,
            f => match r.flowops.get(f) {
                Some(x) => &x.cdf,
                None => continue,
            },
        };
        for [q, us] in cdf {
            let e = acc.entry((q * 1e6).round() as u64).or_default();
            e.0 += us;
            e.1 += 1;
        }
    }
    acc.into_iter().map(|(q, (sum, n))| (sum / n as f64, q as f64 / 1e6)).collect()
}

/// Per setup: latency CDFs of baseline (dashed) and injected (solid) runs, one colour per op
/// (a personality's flowops, else the workload's reads and writes); empty without baselines.
pub fn cdf_chart(title: &str, s: &SetupResult) -> String {
    if s.baseline.is_empty() {
        return String::new();
    }
    let mut ops: Vec<String> = s.repetitions.iter().flat_map(|r| r.flowops.iter().filter(|(_, f)| !f.cdf.is_empty()).map(|(k, _)| k.clone())).collect();
    ops.sort();
    ops.dedup();
    if ops.is_empty() {
        for (op, has) in [("read", s.repetitions.iter().any(|r| !r.read.cdf.is_empty())), ("write", s.repetitions.iter().any(|r| !r.write.cdf.is_empty()))] {
            if has {
                ops.push(op.to_string());
            }
        }
    }
    let mut series = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()].to_string();
        for (reps, dashed, kind) in [(&s.baseline, true, " (base)"), (&s.repetitions, false, "")] {
            let points = mean_cdf(reps, op);
            if !points.is_empty() {
                series.push(Series { name: format!("{op}{kind}"), color: color.clone(), dashed, points });
            }
        }
    }
    if series.is_empty() {
        return String::new();
    }
    let c = CdfChart { title: format!("{title}: latency CDF, baseline (dashed) vs injected (solid)"), series, width: 900.0, height: 360.0 };
    format!("<h3>Latency CDF</h3><p class=\"muted\">Latency at each quantile, mean over repetitions.</p>{}", c.render())
}
