//! The crash section of a setup (docs/crash.md, "Crash and check in a run"): led by its
//! figure, one bar per power cut with what the durability oracle found in the blocks the
//! workload wrote (durable-lost in red), beside the cut's model, what the cache kept and
//! lost, and the check's verdict; then a table with the check's and the application's
//! output. Also the stdout lines of `faultline run` for the cuts.

use super::html::esc;
use super::model::{CrashRecord, Repetition, Results};
use crate::verify::crash::OracleCounts;
use std::fmt::Write;

/// The oracle's states in the order they are drawn, with their colours; red is a failure.
const STATES: [(&str, &str); 6] = [
    ("durable-kept", "#009E73"),
    ("unsynced-kept", "#56B4E9"),
    ("unsynced-lost", "#BBBBBB"),
    ("torn", "#E69F00"),
    ("garbage", "#7A0000"),
    ("durable-lost", "#D00000"),
];

fn values(c: &OracleCounts) -> [u64; 6] {
    [c.durable_kept, c.unsynced_kept, c.unsynced_lost, c.torn, c.garbage, c.durable_lost]
}

fn cuts(reps: &[Repetition]) -> Vec<(u32, &CrashRecord)> {
    reps.iter().filter_map(|r| r.crash.as_deref().map(|c| (r.index, c))).collect()
}

/// The figure: per cut a horizontal bar of the oracle's block states (or the application
/// check's acked/lost figures for a command stack), and what the cut and the check said.
pub fn figure(reps: &[Repetition]) -> String {
    let cuts = cuts(reps);
    if cuts.is_empty() {
        return String::new();
    }
    let (w, row, top, left, bar_w) = (1040.0, 26.0, 50.0, 70.0, 460.0);
    let h = top + row * cuts.len() as f64 + 40.0;
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" class="chart crash-figure" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="11">"#
    );
    let _ = write!(
        s,
        r#"<text x="{left}" y="16" font-size="13" font-weight="bold">Power cuts: what survived (blocks the workload wrote, by the durability oracle)</text>"#
    );
    let _ = write!(s, r##"<text x="{}" y="{}" fill="#444">cut · cache kept/lost · check · application</text>"##, left + bar_w + 12.0, top - 6.0);
    for (k, (rep, c)) in cuts.iter().enumerate() {
        let y = top + k as f64 * row;
        let _ = write!(s, r#"<text x="{}" y="{:.1}" text-anchor="end">rep {rep}</text>"#, left - 6.0, y + 14.0);
        match (&c.oracle, c.app_check.as_ref()) {
            (Some(o), _) => {
                let vals = values(&o.counts);
                let total = vals.iter().sum::<u64>().max(1) as f64;
                let mut x = left;
                for ((name, colour), v) in STATES.iter().zip(vals) {
                    if v == 0 {
                        continue;
                    }
                    let bw = bar_w * v as f64 / total;
                    let _ = write!(
                        s,
                        r#"<rect class="state-{name}" x="{x:.1}" y="{:.1}" width="{bw:.1}" height="{:.1}" fill="{colour}"><title>{name}: {v} blocks</title></rect>"#,
                        y + 3.0,
                        row - 8.0
                    );
                    x += bw;
                }
                if o.counts.checked == 0 {
                    let _ = write!(s, r##"<text x="{left}" y="{:.1}" fill="#444">no written block</text>"##, y + 14.0);
                }
            }
            (None, Some(a)) => {
                // an application: acked commits, the lost ones in red
                let acked = a.figures.get("acked").copied().unwrap_or(0.0);
                let lost = a.figures.get("lost").copied().unwrap_or(0.0).max(0.0);
                if acked > 0.0 {
                    let lw = bar_w * (lost / acked).min(1.0);
                    let _ = write!(
                        s,
                        r##"<rect x="{left}" y="{:.1}" width="{:.1}" height="{:.1}" fill="#009E73"><title>acked and present: {}</title></rect><rect class="state-durable-lost" x="{:.1}" y="{:.1}" width="{lw:.1}" height="{:.1}" fill="#D00000"><title>acked and lost: {lost}</title></rect>"##,
                        y + 3.0,
                        bar_w - lw,
                        row - 8.0,
                        acked - lost,
                        left + bar_w - lw,
                        y + 3.0,
                        row - 8.0
                    );
                } else {
                    let _ = write!(s, r##"<text x="{left}" y="{:.1}" fill="#444">application check: {}</text>"##, y + 14.0, esc(&a.verdict));
                }
            }
            (None, None) => {
                let why = if !c.fired { "no cut: its trigger never came" } else { "not verified (see the table)" };
                let _ = write!(s, r##"<text x="{left}" y="{:.1}" fill="#444">{why}</text>"##, y + 14.0);
            }
        }
        let check = match (&c.check, &c.mount) {
            (_, Some(m)) if m != "ok" => "mount failed".to_string(),
            (Some(ch), _) => ch.verdict.clone(),
            (None, _) => "-".into(),
        };
        let cache = c
            .cut
            .as_ref()
            .map(|r| format!("kept {}/lost {}{}", r.kept, r.lost, if r.torn > 0 { format!("/torn {}", r.torn) } else { String::new() }))
            .unwrap_or_else(|| "-".into());
        let colour = if check == "clean" || check == "-" { "#222" } else { "#D00000" };
        let app = c.app_check.as_ref().map(|a| {
            let lost = a.figures.get("lost").copied().unwrap_or(0.0);
            let bad = a.verdict != "consistent" || lost > 0.0;
            let figs: Vec<String> = a.figures.iter().map(|(k, v)| format!("{k} {v}")).collect();
            let text = if figs.is_empty() { a.verdict.clone() } else { format!("{} ({})", a.verdict, figs.join(", ")) };
            format!(" · <tspan fill=\"{}\">{}</tspan>", if bad { "#D00000" } else { "#222" }, esc(&text))
        });
        let _ = write!(
            s,
            r#"<text x="{:.1}" y="{:.1}">{} · {} · <tspan fill="{colour}">{}</tspan>{}</text>"#,
            left + bar_w + 12.0,
            y + 14.0,
            esc(&format!("{} {}", c.model.map(|m| m.to_string()).unwrap_or_default(), c.trigger)),
            esc(&cache),
            esc(&check),
            app.unwrap_or_default()
        );
    }
    // legend
    let ly = top + row * cuts.len() as f64 + 16.0;
    let mut x = left;
    for (name, colour) in STATES {
        let _ =
            write!(s, r#"<rect x="{x:.1}" y="{:.1}" width="10" height="10" fill="{colour}"/><text x="{:.1}" y="{ly:.1}">{name}</text>"#, ly - 9.0, x + 14.0);
        x += 14.0 + 7.0 * name.len() as f64 + 18.0;
    }
    s.push_str("</svg>");
    s
}

/// The crash section: figure, then one row per cut.
pub fn section(h: &mut String, reps: &[Repetition]) {
    let cuts = cuts(reps);
    if cuts.is_empty() {
        return;
    }
    h.push_str("<h3>Crash and check</h3>\n");
    h.push_str(&figure(reps));
    h.push_str(
        "<table class=\"crash\"><tr><th>Rep</th><th class=\"l\">Cut</th><th>At s</th><th>Unflushed</th><th>Kept</th><th>Lost</th><th>Torn</th>\
<th class=\"l\">Check</th><th>Durable kept</th><th>Durable lost</th><th>Garbage</th><th>Unsynced lost</th><th>Unsynced kept</th><th>Torn blocks</th><th>Files lost</th><th class=\"l\">Application</th></tr>\n",
    );
    for (rep, c) in &cuts {
        let r = c.cut.clone().unwrap_or_default();
        let check = match (&c.check, &c.mount) {
            (_, Some(m)) if m != "ok" => format!("<td class=\"l bad\">mount failed: {}</td>", esc(m)),
            (Some(ch), _) => format!(
                "<td class=\"l{}\"><details><summary>{} ({})</summary><pre>{}</pre></details></td>",
                if ch.verdict == "clean" { "" } else { " bad" },
                esc(&ch.verdict),
                esc(&ch.command),
                esc(&ch.output_tail)
            ),
            (None, _) => "<td class=\"l\">-</td>".into(),
        };
        let oracle = oracle_cells(c.oracle.as_ref());
        let app = match &c.app_check {
            Some(a) => {
                let figs: Vec<String> = a.figures.iter().map(|(k, v)| format!("{k} {v}")).collect();
                let bad = a.verdict != "consistent" || a.figures.get("lost").is_some_and(|l| *l > 0.0);
                format!(
                    "<td class=\"l{}\"><details><summary>{}{}</summary><pre>$ {}\n{}\n{}</pre></details></td>",
                    if bad { " bad" } else { "" },
                    esc(&a.verdict),
                    if figs.is_empty() { String::new() } else { format!(": {}", esc(&figs.join(", "))) },
                    esc(&a.command),
                    esc(&a.stdout_tail),
                    esc(&a.stderr_tail)
                )
            }
            None => match c.acks {
                Some(n) => format!("<td class=\"l\">{n} acks</td>"),
                None => "<td class=\"l\">-</td>".into(),
            },
        };
        let _ = writeln!(
            h,
            "<tr><td>{rep}</td><td class=\"l\">{} {} (seed {})</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>{check}{oracle}{app}</tr>",
            esc(&c.model.map(|m| m.to_string()).unwrap_or_default()),
            esc(&c.trigger),
            c.seed,
            if c.fired { format!("{:.3}", c.t_s) } else { "not cut".into() },
            r.unflushed,
            r.kept,
            r.lost,
            r.torn,
        );
        // a networked cut with several clients: each client's slice and oracle below its cut
        if c.clients.len() > 1 {
            for k in &c.clients {
                let _ = writeln!(
                    h,
                    "<tr class=\"client\"><td></td><td class=\"l\" colspan=\"6\">client {}: bytes {}..{} of the disk, {} failed I/O(s)</td><td class=\"l\">-</td>{}<td class=\"l\">-</td></tr>",
                    esc(&k.host),
                    k.offset,
                    k.offset + k.length,
                    k.failed_ios,
                    oracle_cells(Some(&k.oracle))
                );
            }
        }
    }
    h.push_str("</table>\n");
}

/// The oracle's cells of a table row (durable kept ... files lost), durable losses in red.
fn oracle_cells(o: Option<&crate::verify::crash::OracleReport>) -> String {
    let red = |v: u64| if v > 0 { format!("<td class=\"bad\">{v}</td>") } else { format!("<td>{v}</td>") };
    match o {
        Some(o) => {
            let n = &o.counts;
            format!(
                "<td>{}</td>{}{}<td>{}</td><td>{}</td><td>{}</td>{}",
                n.durable_kept,
                red(n.durable_lost),
                red(n.garbage),
                n.unsynced_lost,
                n.unsynced_kept,
                n.torn,
                match n.entries {
                    // a personality: its paths' entries beside the files lost
                    Some(e) => {
                        let bad = n.files_lost + e.reappeared > 0;
                        format!(
                            "<td{}>{} <span title=\"directory entries: checked, durable kept, unsynced kept, unsynced lost, reappeared\">(entries {}: {}/{}/{}, {} reappeared)</span>{}</td>",
                            if bad { " class=\"bad\"" } else { "" },
                            n.files_lost,
                            e.checked,
                            e.durable_kept,
                            e.unsynced_kept,
                            e.unsynced_lost,
                            e.reappeared,
                            if e.renamed.checked > 0 {
                                format!(
                                    " <span title=\"rename destinations: checked, durable lost, durable kept\">(renamed {}: {} lost, {} durable kept)</span>",
                                    e.renamed.checked, e.renamed.durable_lost, e.renamed.durable_kept
                                )
                            } else {
                                String::new()
                            }
                        )
                    }
                    None => red(n.files_lost),
                }
            )
        }
        None => "<td>-</td><td>-</td><td>-</td><td>-</td><td>-</td><td>-</td><td>-</td>".into(),
    }
}

/// One stdout line per cut for `faultline run`'s summary; empty without cuts.
pub fn summary(r: &Results) -> String {
    let mut out = String::new();
    for s in &r.setups {
        for (rep, c) in cuts(&s.repetitions) {
            let _ = write!(out, "crash: {} rep {rep}: {} {}", s.name, c.model.map(|m| m.to_string()).unwrap_or_default(), c.trigger);
            if !c.fired {
                out.push_str(": no cut (its trigger never came)\n");
                continue;
            }
            let _ = write!(out, " (cut at {:.3} s)", c.t_s);
            if let Some(k) = &c.cut {
                let _ = write!(out, ": unflushed {} kept {} lost {}", k.unflushed, k.kept, k.lost);
                if k.torn > 0 {
                    let _ = write!(out, " torn {}", k.torn);
                }
            }
            if let Some(m) = c.mount.as_ref().filter(|m| *m != "ok") {
                let _ = write!(out, "; mount FAILED: {}", m.lines().next().unwrap_or(""));
            }
            if let Some(ch) = &c.check {
                let _ = write!(out, "; {} {}", ch.command.split_whitespace().next().unwrap_or(""), ch.verdict);
            }
            if let Some(o) = &c.oracle {
                let n = &o.counts;
                let _ = write!(
                    out,
                    "; oracle: durable-lost {} garbage {} files-lost {} unsynced-lost {} unsynced-kept {} torn {} durable-kept {}",
                    n.durable_lost, n.garbage, n.files_lost, n.unsynced_lost, n.unsynced_kept, n.torn, n.durable_kept
                );
                if c.clients.len() > 1 {
                    for k in &c.clients {
                        let n = &k.oracle.counts;
                        let _ = write!(
                            out,
                            "; client {} (bytes {}..{}, {} failed I/Os): durable-lost {} garbage {} unsynced-lost {} unsynced-kept {} torn {} durable-kept {}",
                            k.host,
                            k.offset,
                            k.offset + k.length,
                            k.failed_ios,
                            n.durable_lost,
                            n.garbage,
                            n.unsynced_lost,
                            n.unsynced_kept,
                            n.torn,
                            n.durable_kept
                        );
                    }
                }
                if let Some(e) = &n.entries {
                    let _ = write!(
                        out,
                        "; entries: checked {} durable-lost {} reappeared {} unsynced-lost {} unsynced-kept {} durable-kept {}",
                        e.checked, e.durable_lost, e.reappeared, e.unsynced_lost, e.unsynced_kept, e.durable_kept
                    );
                    let r = &e.renamed;
                    if r.checked > 0 {
                        let _ = write!(
                            out,
                            "; renamed: checked {} durable-lost {} unsynced-lost {} unsynced-kept {} durable-kept {}",
                            r.checked, r.durable_lost, r.unsynced_lost, r.unsynced_kept, r.durable_kept
                        );
                    }
                }
            }
            if let Some(a) = &c.app_check {
                let figs: Vec<String> = a.figures.iter().map(|(k, v)| format!("{k} {v}")).collect();
                let _ = write!(out, "; application: {}{}", a.verdict, if figs.is_empty() { String::new() } else { format!(" ({})", figs.join(", ")) });
            }
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::model::{AppCheck, FsCheck};
    use crate::verify::crash::OracleReport;

    fn rep(i: u32, c: CrashRecord) -> Repetition {
        Repetition { index: i, crash: Some(Box::new(c)), ..Default::default() }
    }

    /// durable-lost is drawn and printed in red, an application's lost commits too; a clean
    /// cut has no red at all.
    #[test]
    fn failures_are_red_and_clean_cuts_are_not() {
        let clean = CrashRecord {
            fired: true,
            model: Some(crate::disk::cache::SurvivalModel::KeepPrefix),
            trigger: "after 10 ops".into(),
            check: Some(FsCheck { command: "e2fsck -f -n /dev/loop9".into(), exit_code: Some(0), verdict: "clean".into(), output_tail: String::new() }),
            mount: Some("ok".into()),
            oracle: Some(OracleReport { counts: OracleCounts { checked: 10, durable_kept: 8, unsynced_lost: 2, ..Default::default() }, failures: vec![] }),
            ..Default::default()
        };
        let mut h = String::new();
        section(&mut h, &[rep(1, clean.clone())]);
        assert!(h.contains("crash-figure") && h.contains("state-durable-kept") && !h.contains("state-durable-lost") && !h.contains("class=\"bad\""), "{h}");
        let mut lost = clean.clone();
        lost.oracle.as_mut().unwrap().counts.durable_lost = 3;
        let mut app = clean;
        app.oracle = None;
        app.app_check =
            Some(AppCheck { verdict: "inconsistent".into(), figures: [("acked".to_string(), 100.0), ("lost".to_string(), 4.0)].into(), ..Default::default() });
        let mut h = String::new();
        section(&mut h, &[rep(1, lost), rep(2, app)]);
        assert!(h.contains("<td class=\"bad\">3</td>") && h.matches("state-durable-lost").count() == 2, "{h}");
        assert!(h.contains("inconsistent: acked 100, lost 4"), "{h}");
        assert_eq!(section_len(&[]), 0, "no cut, no section");
    }

    /// A networked cut with two clients: a row per client below the cut's (its slice, its
    /// failed I/Os, its oracle), the durable losses of the client that has them in red.
    #[test]
    fn a_cut_with_several_clients_has_a_row_per_client() {
        let counts = |kept, lost| OracleReport {
            counts: OracleCounts { checked: kept + lost, durable_kept: kept, durable_lost: lost, ..Default::default() },
            failures: vec![],
        };
        let client = |host: &str, offset, kept, lost| crate::report::model::ClientOracle {
            host: host.into(),
            offset,
            length: 32 << 20,
            failed_ios: 3,
            oracle: counts(kept, lost),
        };
        let c = CrashRecord {
            fired: true,
            trigger: "after 10 flushes".into(),
            oracle: Some(counts(17, 2)),
            clients: vec![client("a", 0, 10, 0), client("b", 32 << 20, 7, 2)],
            ..Default::default()
        };
        let mut h = String::new();
        section(&mut h, &[rep(1, c.clone())]);
        assert_eq!(h.matches("<tr class=\"client\">").count(), 2, "{h}");
        assert!(h.contains("client a: bytes 0..33554432 of the disk, 3 failed I/O(s)</td><td class=\"l\">-</td><td>10</td><td>0</td>"), "{h}");
        assert!(
            h.contains("client b: bytes 33554432..67108864 of the disk, 3 failed I/O(s)</td><td class=\"l\">-</td><td>7</td><td class=\"bad\">2</td>"),
            "{h}"
        );
        // one client: its row would repeat the cut's
        let mut one = c;
        one.clients.truncate(1);
        let mut h = String::new();
        section(&mut h, &[rep(1, one)]);
        assert!(!h.contains("class=\"client\""), "{h}");
    }

    fn section_len(reps: &[Repetition]) -> usize {
        let mut h = String::new();
        section(&mut h, reps);
        h.len()
    }
}
