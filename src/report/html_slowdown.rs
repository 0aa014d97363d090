//! The slowdown part of report.html (experiments with `baseline: true`): a table and interval
//! bars per setup and op type, a scatter of baseline latency against slowdown, the realized
//! slow-I/O patterns, and per setup a latency CDF of baseline against injected runs.

use super::html::{Run, esc};
use super::model::{Repetition, SetupResult};
use super::slowdown::{SlowdownRow, THROUGHPUT, fmt_pct, rows};
use super::svg::{CdfChart, IntervalChart, IntervalRow, PALETTE, ScatterChart, ScatterPoint, Series};
use std::collections::BTreeMap;
use std::fmt::Write;

/// Sources of the main table: what the application saw (the monitor's layers get their own).
fn app_source(s: &str) -> bool {
    s == "workload" || s == "flowop"
}

/// Slowdown rows of a setup, recomputed from its repetitions (so a report of an older file
/// or of hand-edited results agrees with its runs).
fn setup_rows(s: &SetupResult) -> Vec<SlowdownRow> {
    rows(&s.baseline, &s.repetitions)
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

/// The whole section; empty when no setup has baseline runs.
pub fn section(h: &mut String, runs: &[Run]) {
    let setups: Vec<(&str, &SetupResult, Vec<SlowdownRow>)> = runs
        .iter()
        .flat_map(|r| r.results.setups.iter().map(move |s| (r.label.as_str(), s)))
        .filter(|(_, s)| s.paired())
        .map(|(l, s)| (l, s, setup_rows(s)))
        .collect();
    if setups.is_empty() {
        return;
    }
    let several = runs.len() > 1;
    let name = |run: &str, s: &SetupResult| if several { format!("{run} · {}", s.name) } else { s.name.clone() };
    h.push_str(
        "<h2>Slowdown against the baseline</h2>\n<p class=\"muted\">Each repetition ran twice, first without faults (baseline), then with them. \
Per pair: injected / baseline − 1 for latencies, baseline / injected − 1 for throughput (so both say how much slower). \
Shown: the mean over pairs and its 95% Student t interval; <b>bold</b> where the interval excludes zero (docs/results.md).</p>\n",
    );
    h.push_str(&method_label(setups.iter().map(|(_, s, _)| *s)));
    // the main table: setup x op, latency slowdowns and throughput
    h.push_str("<table><tr><th class=\"l\">Setup</th><th class=\"l\">Op</th><th>Pairs</th><th>Baseline mean µs</th><th>Injected mean µs</th><th>Mean</th><th>p50</th><th>p95</th><th>p99</th><th>Throughput</th></tr>\n");
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
    // bars: one chart per op type, one bar per setup
    let mut by_op: BTreeMap<&str, Vec<IntervalRow>> = BTreeMap::new();
    for (run, s, rs) in &setups {
        for r in rs.iter().filter(|r| app_source(&r.source) && r.metric == "mean_us") {
            by_op.entry(r.op.as_str()).or_default().push(IntervalRow {
                label: name(run, s),
                value: r.slowdown * 100.0,
                interval: r.ci_low.zip(r.ci_high).map(|(a, b)| (a * 100.0, b * 100.0)),
                strong: r.distinguishable,
            });
        }
    }
    for (op, rows) in by_op {
        let label_width = rows.iter().map(|r| r.label.chars().count()).max().unwrap_or(10) as f64 * 6.5 + 12.0;
        let c = IntervalChart {
            title: format!("{op}: slowdown of the mean latency, with 95% interval"),
            x_label: "slowdown %".into(),
            rows,
            width: 900.0,
            label_width: label_width.clamp(80.0, 400.0),
        };
        h.push_str(&c.render());
    }
    scatter(h, &setups, several);
    monitor_table(h, &setups, several);
    patterns(h, &setups, several);
}

/// Baseline mean latency against slowdown: one point per setup and op, a colour per op.
fn scatter(h: &mut String, setups: &[(&str, &SetupResult, Vec<SlowdownRow>)], several: bool) {
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
            });
        }
    }
    if points.is_empty() {
        return;
    }
    let c = ScatterChart {
        title: "Baseline mean latency vs slowdown (one point per setup and op)".into(),
        x_label: "baseline mean latency µs (log)".into(),
        y_label: "slowdown %".into(),
        groups,
        points,
        width: 900.0,
        height: 380.0,
    };
    h.push_str(&c.render());
}

/// The monitor's per-layer slowdowns, where the runs were monitored.
fn monitor_table(h: &mut String, setups: &[(&str, &SetupResult, Vec<SlowdownRow>)], several: bool) {
    let any = setups.iter().any(|(_, _, rs)| rs.iter().any(|r| !app_source(&r.source)));
    if !any {
        return;
    }
    h.push_str("<h3>Slowdown per kernel layer (BPF monitor)</h3><table><tr><th class=\"l\">Setup</th><th class=\"l\">Layer</th><th class=\"l\">Op</th><th>Baseline mean µs</th><th>Mean</th><th>p99</th><th>Throughput</th></tr>\n");
    for (run, s, rs) in setups {
        let mut keys: Vec<(&str, &str)> = rs.iter().filter(|r| !app_source(&r.source)).map(|r| (r.source.as_str(), r.op.as_str())).collect();
        keys.dedup();
        for (src, op) in keys {
            let get = |m: &str| rs.iter().find(|r| r.source == src && r.op == op && r.metric == m);
            let who = if several { format!("{run} · {}", s.name) } else { s.name.clone() };
            let _ = writeln!(
                h,
                "<tr><td class=\"l\">{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td><td>{:.1}</td>{}{}{}</tr>",
                esc(&who),
                esc(src),
                esc(op),
                get("mean_us").map_or(0.0, |r| r.baseline),
                cell(get("mean_us")),
                cell(get("p99_us")),
                cell(get(THROUGHPUT))
            );
        }
    }
    h.push_str("</table>\n");
}

/// What the patterns did in the injected runs: asked pattern, realized ratio and runs.
fn patterns(h: &mut String, setups: &[(&str, &SetupResult, Vec<SlowdownRow>)], several: bool) {
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
