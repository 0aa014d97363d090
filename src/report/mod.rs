//! Results directories: results.json (the source of truth, schema in `model` and
//! docs/results.md) and the views derived from it: timeseries.csv, faults.csv,
//! integrity.csv, report.html, and the summary table printed on stdout.

pub mod collect;
pub mod csv;
pub mod html;
pub mod html_crash;
pub mod html_explore;
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

/// Plain aligned text, one row per setup, for stdout.
pub fn summary_table(r: &Results) -> String {
    let mut head = vec!["setup", "stack", "reps", "write MiB/s", "p99 us", "faults", "app errors", "silent", "detected", "failures"];
    // with baselines: the slowdown of the mean read and write latency, with its 95% interval
    let paired = r.setups.iter().any(|s| s.paired());
    if paired {
        head.extend(["write slowdown", "read slowdown"]);
    }
    let mut rows: Vec<Vec<String>> = vec![head.iter().map(|s| s.to_string()).collect()];
    for s in &r.setups {
        let a = Aggregate::from(s.repetitions.as_slice());
        let n = a.repetitions;
        rows.push(vec![
            s.name.clone(),
            s.stack.clone(),
            n.to_string(),
            html::mean_sd(a.write_mib_s, n, 1),
            html::mean_sd(a.write_p99_us, n, 0),
            html::count_sd(a.faults_injected, n),
            html::count_sd(a.app_errors, n),
            html::count_sd(a.silent, n),
            html::count_sd(a.detected, n),
            html::count_sd(a.failures, n),
        ]);
        if paired {
            let sd = slowdown::rows(&s.baseline, &s.repetitions);
            for op in ["write", "read"] {
                let cell =
                    sd.iter().find(|x| x.source == "workload" && x.op == op && x.metric == "mean_us").map(slowdown::fmt_pct).unwrap_or_else(|| "-".into());
                rows.last_mut().expect("pushed").push(cell);
            }
        }
    }
    let cols = head.len();
    let width: Vec<usize> = (0..cols).map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for row in &rows {
        let cells: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(c, v)| {
                // names left-aligned, numbers right-aligned
                if c < 2 { format!("{v:<w$}", w = width[c]) } else { format!("{v:>w$}", w = width[c]) }
            })
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out.push_str(&flowop_summary(r));
    out.push_str(&html_crash::summary(r));
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
        let sd = slowdown::rows(&s.baseline, &s.repetitions);
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
