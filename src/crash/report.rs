//! report.html of `faultline crash explore`: led by the failures per epoch (each epoch's
//! states by outcome), then the failing states with what failed and their replay commands.
//! Read from the results directory (summary.json, states.jsonl), so `faultline report DIR`
//! rebuilds it.

use super::explore::{StateResult, Summary};
use crate::report::html::{CSS, esc};
use anyhow::{Context, Result};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Outcomes of a state, worst first: the first that applies names it in the figure.
const OUTCOMES: [(&str, &str); 4] = [("mount failed", "#7B2D26"), ("check errors", "#D55E00"), ("data lost", "#D00000"), ("ok", "#009E73")];

/// Failing states listed in the table (all are in states.jsonl and failing.txt).
const TABLE_ROWS: usize = 200;

fn outcome(r: &StateResult) -> usize {
    if r.mount != "ok" && r.mount != "none" {
        0
    } else if r.check != "clean" && r.check != "none" {
        1
    } else if r.failed {
        2
    } else {
        3
    }
}

/// Whether DIR holds the results of `crash explore` (and not of `faultline run`).
pub fn is_explore_dir(dir: &Path) -> bool {
    dir.join("summary.json").is_file() && dir.join("states.jsonl").is_file() && !dir.join("results.json").exists()
}

/// Writes DIR/report.html (or `out`) from DIR's summary.json and states.jsonl.
pub fn write(dir: &Path, out: Option<&Path>) -> Result<PathBuf> {
    let summary: Summary =
        serde_json::from_slice(&std::fs::read(dir.join("summary.json")).with_context(|| format!("cannot read {}/summary.json", dir.display()))?)
            .with_context(|| format!("{}/summary.json", dir.display()))?;
    let text = std::fs::read_to_string(dir.join("states.jsonl")).with_context(|| format!("cannot read {}/states.jsonl", dir.display()))?;
    let states = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| serde_json::from_str(l).with_context(|| format!("{}/states.jsonl:{}", dir.display(), i + 1)))
        .collect::<Result<Vec<StateResult>>>()?;
    let out = out.map_or_else(|| dir.join("report.html"), Path::to_path_buf);
    std::fs::write(&out, render(&summary, &states, dir)).with_context(|| format!("cannot write {}", out.display()))?;
    Ok(out)
}

/// The figure: per epoch a bar of its states, stacked by outcome.
fn figure(states: &[StateResult]) -> String {
    let mut per: BTreeMap<usize, [u64; 4]> = BTreeMap::new();
    for r in states {
        per.entry(r.epoch).or_default()[outcome(r)] += 1;
    }
    if per.is_empty() {
        return String::new();
    }
    let max = per.values().map(|c| c.iter().sum::<u64>()).max().unwrap_or(1).max(1) as f64;
    let (left, top, plot_h, w) = (56.0, 40.0, 220.0, 1040.0);
    let slot = ((w - left - 20.0) / per.len() as f64).min(40.0);
    let h = top + plot_h + 60.0;
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" class="chart explore-figure" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="11">"#
    );
    let _ = write!(
        s,
        r#"<text x="{left}" y="16" font-size="13" font-weight="bold">Crash states per epoch, by outcome (the first that applies: mount, check, data)</text>"#
    );
    let y_of = |v: f64| top + plot_h - plot_h * v / max;
    for t in crate::report::svg::nice_ticks(max, 4) {
        let y = y_of(t);
        let _ = write!(
            s,
            r##"<line x1="{left}" x2="{:.1}" y1="{y:.1}" y2="{y:.1}" stroke="#e4e4e4"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            left + slot * per.len() as f64,
            left - 4.0,
            y + 4.0,
            crate::report::svg::fmt_tick(t)
        );
    }
    let label_every = (per.len() / 25).max(1);
    for (k, (epoch, counts)) in per.iter().enumerate() {
        let x = left + slot * k as f64 + slot * 0.1;
        let bw = slot * 0.8;
        let mut acc = 0.0;
        for ((name, colour), n) in OUTCOMES.iter().zip(counts).rev() {
            if *n == 0 {
                continue;
            }
            let (y0, y1) = (y_of(acc), y_of(acc + *n as f64));
            let _ = write!(
                s,
                r#"<rect class="outcome-{}" x="{x:.1}" y="{y1:.1}" width="{bw:.1}" height="{:.1}" fill="{colour}"><title>epoch {epoch}: {n} {name}</title></rect>"#,
                name.replace(' ', "-"),
                y0 - y1
            );
            acc += *n as f64;
        }
        if k % label_every == 0 {
            let _ = write!(s, r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{epoch}</text>"#, x + bw / 2.0, top + plot_h + 14.0);
        }
    }
    let _ = write!(s, r#"<text x="{left}" y="{:.1}">epoch (writes between two flushes); height: states checked</text>"#, top + plot_h + 30.0);
    let mut x = left;
    let ly = top + plot_h + 50.0;
    for (name, colour) in OUTCOMES {
        let _ =
            write!(s, r#"<rect x="{x:.1}" y="{:.1}" width="10" height="10" fill="{colour}"/><text x="{:.1}" y="{ly:.1}">{name}</text>"#, ly - 9.0, x + 14.0);
        x += 14.0 + 7.0 * name.len() as f64 + 18.0;
    }
    s.push_str("</svg>");
    s
}

pub fn render(summary: &Summary, states: &[StateResult], dir: &Path) -> String {
    let mut h = String::new();
    let title = format!("faultline crash explore: {} ({})", summary.source, summary.fs);
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title><style>{CSS}</style></head><body>\n<h1>{}</h1>\n",
        esc(&title),
        esc(&title)
    );
    let _ = writeln!(
        h,
        "<p>{} states of {} epochs (from epoch {}) checked in {:.1} s ({:.1}/s); <b{}>{} failing</b>{}; {} log entries; oracle: {}.</p>",
        summary.states,
        summary.epochs.saturating_sub(summary.first_epoch),
        summary.first_epoch,
        summary.seconds,
        summary.states_per_s,
        if summary.failing > 0 { " class=\"silent\"" } else { "" },
        summary.failing,
        if summary.not_checked > 0 { format!(", {} not checked (--max-states)", summary.not_checked) } else { String::new() },
        summary.log_entries,
        esc(&summary.oracle)
    );
    h.push_str(&figure(states));
    let failing: Vec<&StateResult> = states.iter().filter(|r| r.failed).collect();
    h.push_str("<h2>Failing states</h2>\n");
    if failing.is_empty() {
        h.push_str("<p>None: every state mounted, its check was clean and the oracle found nothing lost that was promised.</p>\n");
    } else {
        // the `entries` oracle's counts of paths, beside the blocks'
        let entries = failing.iter().any(|r| r.oracle.as_ref().is_some_and(|o| o.entries.is_some()));
        let _ = writeln!(
            h,
            "<table class=\"failing\"><tr><th class=\"l\">State</th><th>Epoch</th><th class=\"l\">Variant</th><th>Kept</th><th>Lost</th><th>Torn</th>\
<th class=\"l\">Mount</th><th class=\"l\">Check</th><th>Durable lost</th><th>Garbage</th><th>Unsynced lost</th>{}<th class=\"l\">Why</th><th class=\"l\">Replay</th></tr>",
            if entries { "<th>Entries lost</th><th>Reappeared</th>" } else { "" }
        );
        let red = |v: u64| if v > 0 { format!("<td class=\"bad\">{v}</td>") } else { format!("<td>{v}</td>") };
        for r in failing.iter().take(TABLE_ROWS) {
            let check = if r.check_output.is_empty() {
                format!("<td class=\"l{}\">{}</td>", if r.check == "clean" || r.check == "none" { "" } else { " bad" }, esc(&r.check))
            } else {
                format!("<td class=\"l bad\"><details><summary>{}</summary><pre>{}</pre></details></td>", esc(&r.check), esc(&r.check_output))
            };
            let mut oracle = match &r.oracle {
                Some(o) => format!("{}{}<td>{}</td>", red(o.durable_lost), red(o.garbage), o.unsynced_lost),
                None => "<td>-</td><td>-</td><td>-</td>".into(),
            };
            if entries {
                oracle += &match r.oracle.as_ref().and_then(|o| o.entries) {
                    Some(e) => format!("{}{}", red(e.durable_lost), red(e.reappeared)),
                    None => "<td>-</td><td>-</td>".into(),
                };
            }
            let _ = writeln!(
                h,
                "<tr><td class=\"l\">{}</td><td>{}</td><td class=\"l\">{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"l{}\">{}</td>{check}{oracle}<td class=\"l\">{}</td><td class=\"l\"><code>faultline crash replay {} {}</code></td></tr>",
                esc(&r.id),
                r.epoch,
                esc(&r.variant),
                r.kept,
                r.lost,
                r.torn,
                if r.mount == "ok" || r.mount == "none" { "" } else { " bad" },
                esc(&r.mount),
                esc(&r.reasons.join("; ")),
                esc(&dir.display().to_string()),
                esc(&r.id)
            );
        }
        h.push_str("</table>\n");
        if failing.len() > TABLE_ROWS {
            let _ = writeln!(h, "<p class=\"muted\">The first {TABLE_ROWS} of {} failing states; all are in failing.txt and states.jsonl.</p>", failing.len());
        }
    }
    h.push_str("</body></html>\n");
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(id: &str, epoch: usize, mount: &str, check: &str, failed: bool) -> StateResult {
        StateResult {
            id: id.into(),
            epoch,
            variant: "prefix".into(),
            base_entries: 0,
            kept: 1,
            lost: 2,
            torn: 0,
            mount: mount.into(),
            check: check.into(),
            check_exit: None,
            check_output: String::new(),
            oracle: None,
            failed,
            reasons: if failed { vec![format!("{mount}/{check}")] } else { vec![] },
            ms: 1.0,
        }
    }

    #[test]
    fn outcomes_take_the_first_that_applies() {
        assert_eq!(outcome(&state("a", 0, "EINVAL", "none", true)), 0);
        assert_eq!(outcome(&state("a", 0, "ok", "errors", true)), 1);
        assert_eq!(outcome(&state("a", 0, "ok", "clean", true)), 2);
        assert_eq!(outcome(&state("a", 0, "ok", "clean", false)), 3);
        assert_eq!(outcome(&state("a", 0, "none", "none", false)), 3);
    }

    #[test]
    fn failing_states_are_listed_with_their_replay_commands_and_counted_per_epoch() {
        let states = vec![state("e1", 1, "ok", "clean", false), state("e2-s0", 2, "ok", "errors", true), state("e2-s1", 2, "ok", "clean", false)];
        let summary = Summary {
            source: "x.yaml".into(),
            fs: "ext4".into(),
            log_entries: 9,
            epochs: 3,
            first_epoch: 1,
            states: 3,
            failing: 1,
            not_checked: 0,
            failing_per_epoch: [(2, 1)].into(),
            seconds: 1.0,
            states_per_s: 3.0,
            oracle: "blocks".into(),
        };
        let html = render(&summary, &states, Path::new("/tmp/out <x>"));
        assert!(html.contains("faultline crash replay /tmp/out &lt;x&gt; e2-s0"), "{html}");
        assert!(!html.contains("replay /tmp/out &lt;x&gt; e1<"), "a passing state is listed");
        assert_eq!(html.matches("class=\"outcome-ok\"").count(), 2, "one ok bar per epoch");
        assert!(html.contains("<title>epoch 2: 1 check errors</title>"), "{html}");
        assert!(html.contains("<title>epoch 2: 1 ok</title>"));
        let none = render(&summary, &states[..1], Path::new("/d"));
        assert!(none.contains("<p>None:"));
        assert!(!html.contains("Entries lost"), "no entry columns without the entries oracle");
        // the entries oracle's paths get their own columns, losses in red
        let mut lost = state("e3-s0", 3, "ok", "clean", true);
        let entries = crate::verify::crash::EntryCounts { checked: 9, durable_kept: 6, durable_lost: 2, reappeared: 1, ..Default::default() };
        lost.oracle = Some(super::super::oracle::OracleCounts { checked: 20, durable_ok: 18, durable_lost: 2, entries: Some(entries), ..Default::default() });
        let html = render(&summary, &[lost], Path::new("/d"));
        assert!(html.contains("<th>Entries lost</th><th>Reappeared</th>"), "{html}");
        assert!(html.contains("<td class=\"bad\">2</td><td class=\"bad\">1</td><td class=\"l\">"), "{html}");
    }
}
