//! Results directories: results.json (the source of truth, schema in `model` and
//! docs/results.md) and the views derived from it: timeseries.csv, faults.csv,
//! integrity.csv, report.html, and the summary table printed on stdout.

pub mod collect;
pub mod csv;
pub mod html;
pub mod html_crash;
pub mod html_slowdown;
pub mod model;
pub mod networked;
pub mod slowdown;
pub mod svg;

pub use model::*;

use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};

/// Write every file of a results directory (created if needed). The aggregates written are
/// recomputed from the repetitions, so results.json, the CSVs and the HTML always agree.
pub fn write_dir(dir: &Path, r: &Results) -> Result<()> {
    if r.schema != SCHEMA {
        bail!("results to write carry schema {}, but this faultline writes schema {SCHEMA}", r.schema);
    }
    let mut r = r.clone();
    for s in &mut r.setups {
        s.aggregate_now();
    }
    let json = serde_json::to_string_pretty(&r).context("cannot serialize results")?;
    // serde_json writes NaN/infinity as null, which would make the file unreadable later: refuse now
    serde_json::from_str::<Results>(&json).context("results hold a value JSON cannot represent (NaN or infinity in a number field?)")?;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create results directory {}", dir.display()))?;
    let files = [
        ("results.json", json),
        ("timeseries.csv", csv::timeseries(&r)),
        ("faults.csv", csv::faults(&r)),
        ("integrity.csv", csv::integrity(&r)),
        ("monitor.csv", csv::monitor(&r)),
        ("report.html", html::render(&[html::Run { label: r.name.clone(), results: &r }])),
    ];
    let mut files = files.to_vec();
    if r.setups.iter().any(|s| s.paired()) {
        files.push(("slowdown.csv", csv::slowdown(&r)));
    }
    let studies: Vec<(String, u32, &networked::NetworkedRun)> =
        r.setups.iter().flat_map(|s| s.repetitions.iter().filter_map(move |rep| rep.networked.as_deref().map(|st| (s.name.clone(), rep.index, st)))).collect();
    if !studies.is_empty() {
        files.push(("windows.csv", networked::windows_csv(&studies)));
        files.push(("hosts_timeseries.csv", networked::hosts_csv(&studies)));
    }
    for (name, text) in files {
        let p = dir.join(name);
        std::fs::write(&p, text).with_context(|| format!("cannot write {}", p.display()))?;
    }
    Ok(())
}

/// Read DIR/results.json, checking the schema version before anything else.
pub fn load_dir(dir: &Path) -> Result<Results> {
    if !dir.exists() {
        bail!("{}: no such results directory", dir.display());
    }
    if !dir.is_dir() {
        bail!("{}: not a directory; give the results directory that holds results.json", dir.display());
    }
    let path = dir.join("results.json");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("{}: not a faultline results directory: cannot read {}", dir.display(), path.display()))?;
    let v: serde_json::Value = serde_json::from_str(&text).with_context(|| format!("{}: not valid JSON", path.display()))?;
    match v.get("schema") {
        None => bail!("{}: no \"schema\" field; this is not a faultline results.json", path.display()),
        Some(s) => match s.as_u64() {
            Some(n) if n == SCHEMA as u64 => {}
            Some(n) => {
                bail!("{}: results schema version {n}, but this faultline ({}) reads schema version {SCHEMA}", path.display(), env!("CARGO_PKG_VERSION"))
            }
            None => bail!("{}: \"schema\" is {s}, expected a version number", path.display()),
        },
    }
    serde_json::from_str(&text).with_context(|| format!("{}: does not match results schema {SCHEMA}", path.display()))
}

/// What an experiment studies, which decides what its report and summary lead with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Networked (`hosts:`): throughput through fault windows.
    Performability,
    /// Slowdown against a baseline (`baseline: true`, or slowdown rows of another pairing).
    Latency,
    /// Power cuts and what survived them.
    Crash,
    /// Content faults: injected faults against reported failures.
    Content,
}

impl Kind {
    /// From the setups' results: a networked repetition makes a performability study, else
    /// baselines (or stored slowdown rows) a latency study, else a power cut a crash study.
    pub fn of<'a>(setups: impl IntoIterator<Item = &'a SetupResult>) -> Kind {
        let setups: Vec<&SetupResult> = setups.into_iter().collect();
        let reps = || setups.iter().flat_map(|s| &s.repetitions);
        if reps().any(|r| r.networked.is_some()) {
            Kind::Performability
        } else if setups.iter().any(|s| s.paired() || !s.slowdown.is_empty()) {
            Kind::Latency
        } else if reps().any(|r| r.crash.is_some()) {
            Kind::Crash
        } else {
            Kind::Content
        }
    }
}

/// Plain aligned text for stdout, led like the report (`Kind`): a performability study's fault
/// windows, a latency study's slowdowns (and where the time went), else the setups' faults
/// and failures. Columns that do not apply to any setup (write figures of a read-only study,
/// verification counts of a run that verified nothing) are left out.
pub fn summary_table(r: &Results) -> String {
    let kind = Kind::of(&r.setups);
    let mut out = String::new();
    if kind == Kind::Performability {
        out.push_str(&networked::summary(r));
    }
    out.push_str(&setups_table(r, kind));
    if kind == Kind::Latency {
        out.push_str(&layers_summary(r));
    }
    out.push_str(&flowop_summary(r));
    out.push_str(&html_crash::summary(r));
    for f in &r.failed {
        out.push_str(&format!("FAILED {} repetition {}{}: {}\n", f.setup, f.repetition, if f.baseline { " (baseline)" } else { "" }, f.error));
    }
    out
}

/// Rows of cells as aligned text: the first `left` columns left-aligned, the others right.
pub fn align(rows: &[Vec<String>], left: usize) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let width: Vec<usize> = (0..cols).map(|c| rows.iter().map(|r| r.get(c).map_or(0, |v| v.chars().count())).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for row in rows {
        let cells: Vec<String> =
            row.iter().enumerate().map(|(c, v)| if c < left { format!("{v:<w$}", w = width[c]) } else { format!("{v:>w$}", w = width[c]) }).collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// One row per setup with the columns that apply; a latency study's mean-latency slowdowns of
/// the workload's writes and reads (whichever it did) with their 95% intervals.
fn setups_table(r: &Results, kind: Kind) -> String {
    let cols = html::Columns::of(&r.setups);
    let mut head: Vec<&str> = vec!["setup", "stack", "reps"];
    if cols.write {
        head.extend(["write MiB/s", "write p99 us"]);
    }
    if cols.read {
        head.extend(["read MiB/s", "read p99 us"]);
    }
    if cols.faults {
        head.push("faults");
    }
    head.push("app errors");
    if cols.integrity {
        head.extend(["silent", "detected", "failures"]);
    }
    let ops: Vec<&str> =
        if kind == Kind::Latency { ["write", "read"].into_iter().filter(|op| if *op == "write" { cols.write } else { cols.read }).collect() } else { vec![] };
    for op in &ops {
        head.push(if *op == "write" { "write slowdown" } else { "read slowdown" });
    }
    let mut rows: Vec<Vec<String>> = vec![head.iter().map(|s| s.to_string()).collect()];
    for s in &r.setups {
        let a = Aggregate::from(s.repetitions.as_slice());
        let n = a.repetitions;
        let mut row = vec![s.name.clone(), s.stack.clone(), n.to_string()];
        let p99 = |f: fn(&Repetition) -> f64| MeanSd::of(&s.repetitions.iter().map(f).collect::<Vec<_>>());
        if cols.write {
            row.extend([html::mean_sd(a.write_mib_s, n, 1), html::mean_sd(a.write_p99_us, n, 0)]);
        }
        if cols.read {
            row.extend([html::mean_sd(a.read_mib_s, n, 1), html::mean_sd(p99(|x| x.read.p99_us), n, 0)]);
        }
        if cols.faults {
            row.push(html::count_sd(a.faults_injected, n));
        }
        row.push(html::count_sd(a.app_errors, n));
        if cols.integrity {
            row.extend([html::count_sd(a.silent, n), html::count_sd(a.detected, n), html::count_sd(a.failures, n)]);
        }
        if !ops.is_empty() {
            let sd = &s.slowdown;
            for op in &ops {
                row.push(
                    sd.iter().find(|x| x.source == "workload" && x.op == *op && x.metric == "mean_us").map(slowdown::fmt_pct).unwrap_or_else(|| "-".into()),
                );
            }
        }
        rows.push(row);
    }
    align(&rows, 2)
}

/// A latency study's per-layer slowdowns (the BPF monitor's), one line per setup: where the
/// time went; empty where no setup was monitored.
fn layers_summary(r: &Results) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    for s in &r.setups {
        let layers = html_slowdown::layer_rows(&s.slowdown);
        if layers.is_empty() {
            continue;
        }
        let _ = writeln!(out, "{}: slowdown of the mean latency per layer (baseline mean µs, slowdown [95% interval])", s.name);
        let rows: Vec<Vec<String>> =
            layers.iter().map(|x| vec![format!("  {}", x.source), x.op.clone(), format!("{:.1}", x.baseline), slowdown::fmt_pct(x)]).collect();
        out.push_str(&align(&rows, 2));
    }
    if !out.is_empty() {
        out.insert(0, '\n');
    }
    out
}

/// Personality setups: per setup and flowop, the mean over repetitions of ops/s, mean and
/// p99 latency; empty when no setup ran a personality.
fn flowop_summary(r: &Results) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    for s in &r.setups {
        let mut names: Vec<&String> = s.repetitions.iter().flat_map(|x| x.flowops.keys()).collect();
        names.sort();
        names.dedup();
        if names.is_empty() {
            continue;
        }
        let n = s.repetitions.len().max(1) as f64;
        let _ = writeln!(out, "\n{}: flowops (mean over {} repetitions)", s.name, s.repetitions.len());
        let sd = &s.slowdown;
        let paired = s.paired();
        let _ = write!(out, "  {:<15} {:>10} {:>10} {:>10} {:>10} {:>10}", "flowop", "ops/s", "mean us", "p50 us", "p95 us", "p99 us");
        let _ = writeln!(out, "{}", if paired { "  mean slowdown [95% CI]" } else { "" });
        for name in names {
            let m = |f: &dyn Fn(&model::FlowopStats) -> f64| s.repetitions.iter().filter_map(|x| x.flowops.get(name)).map(f).sum::<f64>() / n;
            let _ = write!(
                out,
                "  {name:<15} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>10.1}",
                m(&|f| f.ops_s),
                m(&|f| f.mean_us),
                m(&|f| f.p50_us),
                m(&|f| f.p95_us),
                m(&|f| f.p99_us)
            );
            let cell = sd.iter().find(|x| x.source == "flowop" && &x.op == name && x.metric == "mean_us").map(slowdown::fmt_pct);
            let _ = writeln!(out, "{}", cell.map(|c| format!("  {c}")).unwrap_or_default());
        }
        let ratios: Vec<f64> = s.repetitions.iter().filter_map(|x| x.flowop_read_write_ratio()).collect();
        if !ratios.is_empty() {
            let _ = writeln!(out, "  R:W (readwholefile : writewholefile + appendfilerand) = {:.2}", ratios.iter().sum::<f64>() / ratios.len() as f64);
        }
    }
    out
}

/// `faultline report DIR... [-o OUT]`: rebuild report.html from one or more results
/// directories (several runs side by side). Returns the loaded runs and the file written.
pub fn rebuild(dirs: &[PathBuf], out: Option<&Path>) -> Result<(Vec<Results>, PathBuf)> {
    let out = match (dirs, out) {
        ([], _) => bail!("no results directory given"),
        (_, Some(o)) => o.to_path_buf(),
        ([one], None) => one.join("report.html"),
        (_, None) => bail!("{} results directories given: say where the combined report goes with -o OUT.html", dirs.len()),
    };
    let runs: Vec<Results> = dirs.iter().map(|d| load_dir(d)).collect::<Result<_>>()?;
    let labelled: Vec<html::Run> = runs
        .iter()
        .zip(dirs)
        .map(|(r, d)| html::Run { label: if dirs.len() == 1 { r.name.clone() } else { format!("{} ({})", r.name, d.display()) }, results: r })
        .collect();
    let page = html::render(&labelled);
    std::fs::write(&out, page).with_context(|| format!("cannot write {}", out.display()))?;
    Ok((runs, out))
}
