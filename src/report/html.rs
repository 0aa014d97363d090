//! report.html: one self-contained page (inline CSS and SVG, no scripts, no external URLs).
//! Every string that comes from results.json goes through `esc`.

use super::model::{Aggregate, MeanSd, Repetition, Results, SetupResult};
use super::svg::{BarChart, BarSeries, LineChart, Marker, PALETTE, Series};
use std::collections::BTreeMap;
use std::fmt::Write;

/// One results directory to show, with the label that tells it apart from the others.
pub struct Run<'a> {
    pub label: String,
    pub results: &'a Results,
}

/// Markers drawn per chart; beyond this a chart is unreadable anyway (all faults stay in faults.csv).
pub const MAX_MARKERS: usize = 5000;
/// Rows in the "files hit" table.
pub const TOP_FILES: usize = 20;

/// Escape text for HTML element content and quoted attribute values. The colon of "://" is
/// written as a character reference too, so the page's source holds no URL at all, even one
/// echoed from an experiment file (it still displays as typed).
pub fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    let mut it = s.chars().peekable();
    while let Some(c) = it.next() {
        if c == ':' && it.peek() == Some(&'/') {
            o.push_str("&#58;");
            continue;
        }
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

/// "2023-11-14 22:13:20 UTC" from Unix seconds (civil-from-days, no time zone database needed).
pub fn utc_date(unix: u64) -> String {
    let days = (unix / 86_400) as i64;
    let secs = unix % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC", secs / 3600, secs / 60 % 60, secs % 60)
}

/// A number with `dec` decimals, or none when it is whole (counts stay counts).
fn num(v: f64, dec: usize) -> String {
    if v == v.round() && v.abs() < 1e15 { format!("{}", v as i64) } else { format!("{v:.dec$}") }
}

/// mean ± sd with `dec` decimals; the sd is left out when there is nothing to spread (one repetition).
pub fn mean_sd(m: MeanSd, reps: u32, dec: usize) -> String {
    if reps < 2 { format!("{:.dec$}", m.mean) } else { format!("{:.dec$} ± {:.dec$}", m.mean, m.sd) }
}

/// mean ± sd of a count: whole numbers stay whole ("64 ± 0"), others get one decimal.
pub fn count_sd(m: MeanSd, reps: u32) -> String {
    if reps < 2 { num(m.mean, 1) } else { format!("{} ± {}", num(m.mean, 1), num(m.sd, 1)) }
}

pub const CSS: &str = "body{font-family:sans-serif;margin:1.5em;color:#222;max-width:1100px}\
table{border-collapse:collapse;margin:.5em 0 1em}th,td{border:1px solid #ccc;padding:3px 7px;text-align:right}\
th{background:#f3f3f3}td.l,th.l{text-align:left}tr.agg td{font-weight:bold;background:#fafafa}\
pre{background:#f6f6f6;padding:.6em;overflow:auto;max-height:30em}h2{border-top:2px solid #ddd;padding-top:.6em}\
.muted{color:#666}td.sd{font-weight:bold}.silent{color:#b00;font-weight:bold}td.bad{color:#d00;font-weight:bold}svg.chart{display:block;margin:.5em 0}\
.multiples{display:flex;flex-wrap:wrap;gap:4px}.multiples svg.chart{margin:0}";

pub fn render(runs: &[Run]) -> String {
    let mut h = String::new();
    let title = match runs {
        [one] => format!("faultline: {}", one.results.name),
        _ => format!("faultline: {} runs side by side", runs.len()),
    };
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title><style>{CSS}</style></head><body>\n<h1>{}</h1>\n",
        esc(&title),
        esc(&title)
    );
    for run in runs {
        header(&mut h, run, runs.len() > 1);
        failed(&mut h, run.results);
    }
    // the lead: the study's own figure, then the setups at a glance
    let setups: Vec<&SetupResult> = runs.iter().flat_map(|r| &r.results.setups).collect();
    match super::Kind::of(setups.iter().copied()) {
        super::Kind::Performability => {
            super::networked::lead(&mut h, runs);
            overview(&mut h, runs);
        }
        super::Kind::Latency => {
            super::html_slowdown::section(&mut h, runs);
            overview(&mut h, runs);
        }
        // a crash study's figure leads each setup's section (html_crash)
        super::Kind::Crash | super::Kind::Content => overview(&mut h, runs),
    }
    for run in runs {
        for s in &run.results.setups {
            setup(&mut h, if runs.len() > 1 { Some(&run.label) } else { None }, s);
        }
    }
    h.push_str("</body></html>\n");
    h
}

/// The repetitions that ended in an error: said before any figure, as the figures leave them out.
fn failed(h: &mut String, r: &Results) {
    if r.failed.is_empty() {
        return;
    }
    let _ = write!(
        h,
        "<p class=\"silent\">{} repetition(s) failed; their setups are left out of every table and figure below.</p><table><tr><th class=\"l\">setup</th><th>repetition</th><th class=\"l\">error</th></tr>",
        r.failed.len()
    );
    for f in &r.failed {
        let _ = write!(
            h,
            "<tr><td class=\"l\">{}</td><td>{}{}</td><td class=\"l\">{}</td></tr>",
            esc(&f.setup),
            f.repetition,
            if f.baseline { " (baseline)" } else { "" },
            esc(&f.error)
        );
    }
    h.push_str("</table>\n");
}

fn header(h: &mut String, run: &Run, several: bool) {
    let r = run.results;
    if several {
        let _ = write!(h, "<h2>Run {}</h2>", esc(&run.label));
    }
    let experiment = serde_json::to_string_pretty(&r.experiment).unwrap_or_default();
    let _ = writeln!(
        h,
        "<p>Name <b>{}</b> · started {} · faultline {} · results schema {} · {} setups</p>\
<details><summary>Experiment</summary><pre>{}</pre></details>",
        esc(&r.name),
        utc_date(r.started_unix),
        esc(&r.faultline_version),
        r.schema,
        r.setups.len(),
        esc(&experiment)
    );
}

/// Which of the per-setup columns apply to a set of setups: a column none of them has a
/// figure for (write figures of a read-only study, verification counts of a run that verified
/// nothing) is left out of the report's tables and the stdout summary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Columns {
    /// Some repetition wrote / read.
    pub write: bool,
    pub read: bool,
    /// Some repetition verified blocks, found a bad one, or cut the power.
    pub integrity: bool,
    /// Some repetition armed a disk rule or logged a fault.
    pub faults: bool,
}

impl Columns {
    pub fn of<'a>(setups: impl IntoIterator<Item = &'a SetupResult>) -> Columns {
        let mut c = Columns { write: false, read: false, integrity: false, faults: false };
        for r in setups.into_iter().flat_map(|s| &s.repetitions) {
            c.write |= r.write.ops > 0 || r.write.mib_s > 0.0;
            c.read |= r.read.ops > 0 || r.read.mib_s > 0.0;
            c.integrity |= r.integrity.blocks_checked > 0 || r.counts().failures > 0 || r.crash.is_some();
            c.faults |= !r.faults.is_empty() || !r.rules.is_empty();
        }
        c
    }
}

/// The setups at a glance: one row per setup, mean ± sd over repetitions, with the columns
/// that apply (`Columns`); titled as the study of injected faults vs failures where the runs
/// verified their data.
fn overview(h: &mut String, runs: &[Run]) {
    let several = runs.len() > 1;
    let cols = Columns::of(runs.iter().flat_map(|r| &r.results.setups));
    if cols.integrity {
        h.push_str(
            "<h2>Injected faults vs reported failures</h2>\n<p class=\"muted\">Mean ± sample standard deviation over repetitions. \
Failures = silent + detected bad blocks at verification; silent = wrong data returned without an error; \
detected = unreadable, short or missing; app errors = I/Os that failed during the run (definitions: docs/results.md).</p>\n<table class=\"overview\"><tr>",
        );
    } else {
        h.push_str(
            "<h2>Setups</h2>\n<p class=\"muted\">Mean ± sample standard deviation over repetitions; app errors = I/Os that failed during the run \
(definitions: docs/results.md).</p>\n<table class=\"overview\"><tr>",
        );
    }
    if several {
        h.push_str("<th class=\"l\">Run</th>");
    }
    h.push_str("<th class=\"l\">Setup</th><th class=\"l\">Stack</th><th>Reps</th>");
    if cols.write {
        h.push_str("<th>Write MiB/s</th>");
    }
    if cols.read {
        h.push_str("<th>Read MiB/s</th>");
    }
    if cols.write {
        h.push_str("<th>Write p99 µs</th>");
    }
    if cols.read {
        h.push_str("<th>Read p99 µs</th>");
    }
    if cols.faults {
        h.push_str("<th>Faults injected</th>");
    }
    if cols.integrity {
        h.push_str("<th>Failures</th><th>Silent</th><th>Detected</th>");
    }
    h.push_str("<th>App errors</th></tr>\n");
    for run in runs {
        for s in &run.results.setups {
            let a = Aggregate::from(s.repetitions.as_slice());
            let n = a.repetitions;
            h.push_str("<tr>");
            if several {
                let _ = write!(h, "<td class=\"l\">{}</td>", esc(&run.label));
            }
            let _ = write!(
                h,
                "<td class=\"l\"><a href=\"#{}\">{}</a></td><td class=\"l\">{}</td><td>{n}</td>",
                anchor(if several { Some(&run.label) } else { None }, &s.name),
                esc(&s.name),
                esc(&s.stack)
            );
            if cols.write {
                let _ = write!(h, "<td>{}</td>", mean_sd(a.write_mib_s, n, 1));
            }
            if cols.read {
                let _ = write!(h, "<td>{}</td>", mean_sd(a.read_mib_s, n, 1));
            }
            if cols.write {
                let _ = write!(h, "<td>{}</td>", mean_sd(a.write_p99_us, n, 1));
            }
            if cols.read {
                let _ = write!(h, "<td>{}</td>", mean_sd(MeanSd::of(&s.repetitions.iter().map(|r| r.read.p99_us).collect::<Vec<_>>()), n, 1));
            }
            if cols.faults {
                let _ = write!(h, "<td>{}</td>", count_sd(a.faults_injected, n));
            }
            if cols.integrity {
                let silent_class = if a.silent.mean > 0.0 { "silent" } else { "" };
                let _ = write!(
                    h,
                    "<td>{}</td><td class=\"{silent_class}\">{}</td><td>{}</td>",
                    count_sd(a.failures, n),
                    count_sd(a.silent, n),
                    count_sd(a.detected, n)
                );
            }
            let _ = writeln!(h, "<td>{}</td></tr>", count_sd(a.app_errors, n));
        }
    }
    h.push_str("</table>\n");
}

/// An id for a setup's section; hex-encoded so any name gives a valid, unique fragment.
fn anchor(run: Option<&str>, setup: &str) -> String {
    let key = format!("{}\u{1f}{setup}", run.unwrap_or(""));
    let hex: String = key.bytes().map(|b| format!("{b:02x}")).collect();
    format!("setup-{hex}")
}

fn setup(h: &mut String, run: Option<&str>, s: &SetupResult) {
    let a = Aggregate::from(s.repetitions.as_slice());
    let label = match run {
        Some(r) => format!("{r} · {}", s.name),
        None => s.name.clone(),
    };
    let _ = writeln!(
        h,
        "<section id=\"{}\"><h2>{}</h2><p>Stack <b>{}</b>{}</p>",
        anchor(run, &s.name),
        esc(&label),
        esc(&s.stack),
        if s.description.is_empty() { String::new() } else { format!(" · {}", esc(&s.description)) }
    );
    repetitions_table(h, s, &a);
    super::html_crash::section(h, &s.repetitions);
    h.push_str(&throughput_chart(&label, &s.repetitions));
    latency_table(h, &s.repetitions);
    flowops_table(h, &s.repetitions);
    h.push_str(&latency_chart(&label, &s.repetitions));
    h.push_str(&super::html_slowdown::cdf_chart(&label, s));
    monitor_table(h, &s.repetitions);
    monitor_layers_table(h, &s.repetitions);
    rules_table(h, &s.repetitions);
    host_faults_table(h, &s.repetitions);
    h.push_str(&super::networked::html(&s.repetitions));
    files_table(h, &s.repetitions);
    let notes: Vec<(u32, &String)> = s.repetitions.iter().flat_map(|r| r.notes.iter().map(move |n| (r.index, n))).collect();
    if !notes.is_empty() {
        let _ = write!(h, "<details><summary>Notes ({})</summary><pre>", notes.len());
        for (i, n) in notes {
            let _ = writeln!(h, "[rep {i}] {}", esc(n));
        }
        h.push_str("</pre></details>\n");
    }
    h.push_str("</section>\n");
}

fn repetitions_table(h: &mut String, s: &SetupResult, a: &Aggregate) {
    h.push_str("<h3>Faults and failures per repetition</h3><table><tr><th>Rep</th><th>Seconds</th><th>Write MiB/s</th><th>Read MiB/s</th>\
<th>Faults injected</th><th>Failures</th><th>Silent</th><th>Detected</th><th>App errors</th><th class=\"l\">Errors seen</th><th>Retries</th><th>Blocks checked</th></tr>\n");
    for r in &s.repetitions {
        let c = r.counts();
        let errs: Vec<String> = r.io_errors.iter().map(|(k, v)| format!("{k} {v}")).collect();
        let i = &r.integrity;
        let _ = writeln!(
            h,
            "<tr><td>{}</td><td>{:.2}</td><td>{:.1}</td><td>{:.1}</td><td>{}</td><td>{}</td>\
<td title=\"corrupted {} + misdirected {}\">{}</td><td title=\"unreadable {} + short {} + missing {}\">{}</td><td>{}</td><td class=\"l\">{}</td><td>{}</td><td>{}</td></tr>",
            r.index,
            r.seconds,
            r.write.mib_s,
            r.read.mib_s,
            c.faults_injected,
            c.failures,
            i.corrupted,
            i.misdirected,
            c.silent,
            i.unreadable,
            i.short,
            i.missing,
            c.detected,
            c.app_errors,
            esc(&errs.join(", ")),
            r.retries,
            i.blocks_checked
        );
    }
    let n = a.repetitions;
    let _ = writeln!(
        h,
        "<tr class=\"agg\"><td>mean</td><td></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td></td><td></td><td></td></tr></table>",
        mean_sd(a.write_mib_s, n, 1),
        mean_sd(a.read_mib_s, n, 1),
        count_sd(a.faults_injected, n),
        count_sd(a.failures, n),
        count_sd(a.silent, n),
        count_sd(a.detected, n),
        count_sd(a.app_errors, n),
    );
}

/// Throughput over time, one colour per repetition (write solid, read dashed), and a red
/// vertical line at every injected fault.
pub fn throughput_chart(title: &str, reps: &[Repetition]) -> String {
    let mut series = Vec::new();
    for (k, r) in reps.iter().enumerate() {
        let color = PALETTE[k % PALETTE.len()].to_string();
        let has = |f: fn(&super::model::Sample) -> f64| r.timeseries.iter().any(|x| f(x) > 0.0);
        if has(|x| x.write_mib_s) || r.write.ops > 0 {
            series.push(Series {
                name: format!("rep {} write", r.index),
                color: color.clone(),
                dashed: false,
                points: r.timeseries.iter().map(|x| (x.t_s, x.write_mib_s)).collect(),
            });
        }
        if has(|x| x.read_mib_s) || r.read.ops > 0 {
            series.push(Series {
                name: format!("rep {} read", r.index),
                color,
                dashed: true,
                points: r.timeseries.iter().map(|x| (x.t_s, x.read_mib_s)).collect(),
            });
        }
    }
    let all: Vec<(usize, u32, &super::model::InjectedFault)> =
        reps.iter().enumerate().flat_map(|(k, r)| r.faults.iter().map(move |f| (k, r.index, f))).collect();
    let markers = all
        .iter()
        .take(MAX_MARKERS)
        .map(|(k, i, f)| Marker {
            x: f.t_s,
            color: PALETTE[k % PALETTE.len()].to_string(),
            title: format!("rep {i} · {:.3} s · {} {} · rule {} {} · offset {} · {} blocks", f.t_s, f.action, f.op, f.rule_id, f.rule, f.offset, f.blocks),
        })
        .collect();
    let chart = LineChart {
        title: format!("Throughput over time: {title}"),
        x_label: "seconds since the workload started".into(),
        y_label: "MiB/s".into(),
        series,
        markers,
        width: 900.0,
        height: 340.0,
        extent: None,
    };
    let mut s = chart.render();
    if reps.iter().all(|r| r.timeseries.is_empty()) {
        s.push_str("<p class=\"muted\">No time series recorded.</p>");
    }
    if all.len() > MAX_MARKERS {
        let _ = write!(s, "<p class=\"muted\">{} of {} fault markers drawn; all are in faults.csv.</p>", MAX_MARKERS, all.len());
    }
    s.push('\n');
    s
}

fn latency_table(h: &mut String, reps: &[Repetition]) {
    h.push_str(
        "<h3>Latency (µs)</h3><table><tr><th>Rep</th><th class=\"l\">Op</th><th>Ops</th><th>IOPS</th><th>Mean</th><th>Stddev</th>\
<th>p50</th><th>p90</th><th>p99</th><th>p99.9</th><th>Max</th></tr>\n",
    );
    for r in reps {
        for (op, o) in [("write", &r.write), ("read", &r.read)] {
            if o.ops == 0 {
                continue;
            }
            let _ = writeln!(
                h,
                "<tr><td>{}</td><td class=\"l\">{op}</td><td>{}</td><td>{:.0}</td><td>{:.1}</td><td>{:.1}</td><td>{:.1}</td><td>{:.1}</td><td>{:.1}</td><td>{:.1}</td><td>{:.1}</td></tr>",
                r.index, o.ops, o.iops, o.mean_us, o.stddev_us, o.p50_us, o.p90_us, o.p99_us, o.p999_us, o.max_us
            );
        }
    }
    h.push_str("</table>\n");
}

/// Personality repetitions: one row per flowop type (whole-flowop latency), and the R:W
/// ratio of read to write flowops.
fn flowops_table(h: &mut String, reps: &[Repetition]) {
    if reps.iter().all(|r| r.flowops.is_empty()) {
        return;
    }
    h.push_str(
        "<h3>Flowops (µs)</h3><table><tr><th>Rep</th><th class=\"l\">Flowop</th><th>Ops</th><th>Ops/s</th><th>MiB</th><th>Mean</th>\
<th>p50</th><th>p95</th><th>p99</th><th>Max</th></tr>\n",
    );
    for r in reps {
        for (name, f) in &r.flowops {
            let _ = writeln!(
                h,
                "<tr><td>{}</td><td class=\"l\">{}</td><td>{}</td><td>{:.1}</td><td>{:.1}</td><td>{:.1}</td><td>{:.1}</td><td>{:.1}</td><td>{:.1}</td><td>{:.1}</td></tr>",
                r.index,
                esc(name),
                f.ops,
                f.ops_s,
                f.bytes as f64 / (1 << 20) as f64,
                f.mean_us,
                f.p50_us,
                f.p95_us,
                f.p99_us,
                f.max_us
            );
        }
    }
    h.push_str("</table>\n<p class=\"muted\">R:W (readwholefile : writewholefile + appendfilerand) per repetition: ");
    let ratios: Vec<String> = reps.iter().map(|r| r.flowop_read_write_ratio().map(|x| format!("{x:.2}")).unwrap_or_else(|| "-".into())).collect();
    h.push_str(&ratios.join(", "));
    let skipped: u64 = reps.iter().map(|r| r.flowops_skipped).sum();
    if skipped > 0 {
        let _ = write!(h, "; {skipped} flowops skipped (no file available)");
    }
    h.push_str("</p>\n");
}

/// The BPF monitor's block-layer figures (docs/monitor.md), one row per repetition, device,
/// layer and op; nothing when no repetition was monitored.
fn monitor_table(h: &mut String, reps: &[Repetition]) {
    if reps.iter().all(|r| r.monitor.is_none()) {
        return;
    }
    h.push_str(
        "<h3>Block layer (BPF monitor, µs)</h3><p class=\"muted\">Queue: bio queued until the driver is handed the request; \
service: driver handed the request until it completed; daemon: the disk daemon's own service time, held delay included (docs/monitor.md). Depth: requests in service, time average, and the sampled maximum.</p>\
<table><tr><th>Rep</th><th class=\"l\">Device</th><th class=\"l\">Layer</th><th class=\"l\">Op</th><th>Requests</th><th>MiB</th>\
<th>Mean</th><th>p50</th><th>p95</th><th>p99</th><th>Depth mean</th><th>Depth max</th></tr>\n",
    );
    for r in reps {
        let Some(m) = &r.monitor else { continue };
        for d in &m.devices {
            for l in &d.layers {
                let service = l.layer == "block_service";
                let _ = writeln!(
                    h,
                    "<tr><td>{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td><td>{}</td><td>{}</td><td>{:.1}</td><td>{:.1}</td><td>{:.1}</td><td>{:.1}</td><td>{}</td><td>{}</td></tr>",
                    r.index,
                    esc(&d.device),
                    esc(&l.layer),
                    esc(&l.op),
                    l.count,
                    if service { format!("{:.1}", l.bytes as f64 / 1048576.0) } else { "-".into() },
                    l.mean_us,
                    l.p50_us,
                    l.p95_us,
                    l.p99_us,
                    if service { format!("{:.2}", d.depth.mean) } else { "-".into() },
                    if service { d.depth.max.to_string() } else { "-".into() },
                );
            }
            for (op, o) in &d.daemon {
                let _ = writeln!(
                    h,
                    "<tr><td>{}</td><td class=\"l\">{}</td><td class=\"l\">daemon (held delay {:.1})</td><td class=\"l\">{}</td><td>{}</td><td>-</td><td>{:.1}</td><td>-</td><td>-</td><td>-</td><td>-</td><td>-</td></tr>",
                    r.index,
                    esc(&d.device),
                    o.delay_mean_us,
                    esc(op),
                    o.count,
                    o.service_mean_us,
                );
            }
        }
    }
    h.push_str("</table>\n");
}

/// The BPF monitor's other layers (docs/monitor.md): syscalls, file system, journal, driver and
/// the user's tracepoint pairs, one row per repetition, layer and op; nothing when none.
fn monitor_layers_table(h: &mut String, reps: &[Repetition]) {
    if reps.iter().all(|r| r.monitor.as_ref().is_none_or(|m| m.stack.is_empty() && m.syscalls.is_empty())) {
        return;
    }
    h.push_str(
        "<h3>Stack layers (BPF monitor, µs)</h3><p class=\"muted\">Time between tracepoint pairs: fs (file-system operations), \
journal (jbd2 commit phases), driver (the loop device's FUSE requests, by opcode), user (the experiment's pairs); docs/monitor.md.</p>\
<table><tr><th>Rep</th><th class=\"l\">Layer</th><th class=\"l\">Op</th><th>Count</th><th>Mean</th><th>p50</th><th>p95</th><th>p99</th></tr>\n",
    );
    for r in reps {
        let Some(m) = &r.monitor else { continue };
        for l in m.syscalls.iter().chain(&m.stack) {
            let _ = writeln!(
                h,
                "<tr><td>{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td><td>{}</td><td>{:.1}</td><td>{:.1}</td><td>{:.1}</td><td>{:.1}</td></tr>",
                r.index,
                esc(&l.layer),
                esc(&l.op),
                l.count,
                l.mean_us,
                l.p50_us,
                l.p95_us,
                l.p99_us
            );
        }
        for sm in &m.summed {
            let f: Vec<String> = sm
                .fields
                .iter()
                .map(|f| format!("{} {:.1}{}", f.name, f.mean, if f.unit == "count" { String::new() } else { format!(" {}", f.unit) }))
                .collect();
            let _ = writeln!(
                h,
                "<tr><td>{}</td><td class=\"l\">{}</td><td class=\"l\" colspan=\"6\">{} ×{}, mean per event: {}</td></tr>",
                r.index,
                esc(&sm.layer),
                esc(&sm.event),
                sm.count,
                esc(&f.join(", "))
            );
        }
    }
    h.push_str("</table>\n");
}

/// Latency percentiles as grouped bars (log scale), one bar per repetition and op; empty
/// when no operation completed.
pub fn latency_chart(title: &str, reps: &[Repetition]) -> String {
    let mut series = Vec::new();
    for r in reps {
        for (op, o) in [("write", &r.write), ("read", &r.read)] {
            if o.ops == 0 {
                continue;
            }
            series.push(BarSeries {
                name: format!("rep {} {op}", r.index),
                color: PALETTE[series.len() % PALETTE.len()].to_string(),
                values: vec![o.p50_us, o.p90_us, o.p99_us, o.p999_us, o.max_us],
            });
        }
    }
    if series.is_empty() {
        return String::new();
    }
    let chart = BarChart {
        title: format!("Latency percentiles: {title}"),
        y_label: "µs (log scale)".into(),
        groups: ["p50", "p90", "p99", "p99.9", "max"].iter().map(|s| s.to_string()).collect(),
        series,
        width: 900.0,
        height: 300.0,
    };
    let mut s = chart.render();
    s.push('\n');
    s
}

fn rules_table(h: &mut String, reps: &[Repetition]) {
    if reps.iter().all(|r| r.rules.is_empty()) {
        return;
    }
    h.push_str("<h3>Rules</h3><table><tr><th>Rep</th><th>Id</th><th class=\"l\">Name</th><th class=\"l\">Action</th><th class=\"l\">Op</th><th class=\"l\">Pattern</th><th>Matched</th><th>Fired</th><th>Ratio</th><th>Runs (mean/min/max length)</th><th>Blocks</th></tr>\n");
    for r in reps {
        for c in &r.rules {
            let runs = if c.runs == 0 { String::new() } else { format!("{} ({:.1}/{}/{})", c.runs, c.run_length_mean, c.run_length_min, c.run_length_max) };
            let _ = writeln!(
                h,
                "<tr><td>{}</td><td>{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td><td>{}</td><td>{}</td><td>{:.4}</td><td>{}</td><td>{}</td></tr>",
                r.index,
                c.id,
                esc(&c.name),
                esc(&c.action),
                esc(&c.op),
                esc(&c.pattern),
                c.matched,
                c.fired,
                c.realized_ratio,
                runs,
                c.blocks
            );
        }
    }
    h.push_str("</table>\n");
}

/// Host faults on the disk servers (docs/host.md): planned and realized windows, effect.
fn host_faults_table(h: &mut String, reps: &[Repetition]) {
    if reps.iter().all(|r| r.host_faults.is_empty()) {
        return;
    }
    h.push_str("<h3>Host faults</h3><table><tr><th>Rep</th><th class=\"l\">Fault</th><th>Window (s)</th><th>Applied at</th><th>Reverted at</th><th class=\"l\">Realized</th></tr>\n");
    let s = |t: Option<f64>| t.map_or("-".to_string(), |t| format!("{t:.3}"));
    for r in reps {
        for f in &r.host_faults {
            let mut what = Vec::new();
            if let Some(c) = f.target_cpus_used {
                what.push(format!("targets used {c:.2} CPUs"));
            }
            if let Some(c) = f.cpus_taken {
                what.push(format!("spinners took {c:.2} CPUs"));
            }
            if let Some(p) = f.memory_peak {
                what.push(format!("memory peak {}", crate::spec::units::format_size(p)));
            }
            if let Some(n) = f.memory_limit_hits {
                what.push(format!("limit hit {n} times"));
            }
            if let Some(e) = &f.error {
                what.push(format!("error: {e}"));
            }
            let _ = writeln!(
                h,
                "<tr><td>{}</td><td class=\"l\">{}</td><td>{:.3}..{}</td><td>{}</td><td>{}</td><td class=\"l\">{}</td></tr>",
                r.index,
                esc(&f.description),
                f.from_s,
                f.to_s.map_or("end".to_string(), |t| format!("{t:.3}")),
                s(f.applied_at_s),
                s(f.reverted_at_s),
                esc(&what.join("; "))
            );
        }
    }
    h.push_str("</table>\n");
}

/// Files hit, summed over repetitions, most bad blocks first.
pub fn files_hit(reps: &[Repetition]) -> Vec<(String, u64, u32)> {
    let mut by: BTreeMap<&str, (u64, u32)> = BTreeMap::new();
    for r in reps {
        for f in &r.integrity.files_hit {
            let e = by.entry(&f.file).or_default();
            e.0 += f.bad_blocks;
            e.1 += 1;
        }
    }
    let mut v: Vec<(String, u64, u32)> = by.into_iter().map(|(f, (b, n))| (f.to_string(), b, n)).collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    v
}

fn files_table(h: &mut String, reps: &[Repetition]) {
    let files = files_hit(reps);
    if files.is_empty() {
        return;
    }
    let _ = writeln!(
        h,
        "<h3>Files hit ({} files; top {})</h3><table><tr><th class=\"l\">File</th><th>Bad blocks (all reps)</th><th>Reps hit</th></tr>",
        files.len(),
        TOP_FILES.min(files.len())
    );
    for (f, b, n) in files.iter().take(TOP_FILES) {
        let _ = writeln!(h, "<tr><td class=\"l\">{}</td><td>{b}</td><td>{n}</td></tr>", esc(f));
    }
    h.push_str("</table>\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup() {
        assert_eq!(esc("see https://x.org a:b"), "see https&#58;//x.org a:b");
        assert_eq!(esc("<script>alert('x')</script> & \"q\""), "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;q&quot;");
    }

    #[test]
    fn dates() {
        assert_eq!(utc_date(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc_date(1_700_000_000), "2023-11-14 22:13:20 UTC");
        assert_eq!(utc_date(951_782_400), "2000-02-29 00:00:00 UTC");
    }

    #[test]
    fn mean_sd_format() {
        assert_eq!(count_sd(MeanSd { mean: 64.0, sd: 0.0 }, 3), "64 ± 0");
        assert_eq!(count_sd(MeanSd { mean: 379.5, sd: 12.31 }, 5), "379.5 ± 12.3");
        assert_eq!(count_sd(MeanSd { mean: 7.0, sd: 0.0 }, 1), "7");
        assert_eq!(mean_sd(MeanSd { mean: 110.0, sd: 10.0 }, 3, 1), "110.0 ± 10.0");
        assert_eq!(mean_sd(MeanSd { mean: 101.0, sd: 1.0 }, 1, 0), "101");
    }

    #[test]
    fn anchors_are_unique_and_safe() {
        let a = anchor(None, "a\"b");
        assert!(a.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
        assert_ne!(anchor(Some("r1"), "x"), anchor(Some("r2"), "x"));
    }
}
