//! The results directory and `faultline report`: files, round trip, CSV rows, HTML content
//! (charts, fault markers, no external URLs, escaping), aggregate math, CLI errors.

use faultline::report::*;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

const HOSTILE: &str = "ext4 <script>alert(1)</script> \"q\" & 'a'";

fn ops(mib_s: f64, p99: f64) -> OpStats {
    OpStats {
        ops: 1000,
        bytes: 4096 * 1000,
        mean_us: 1.0 / 3.0,
        stddev_us: 0.1,
        p50_us: 8.0,
        p90_us: 12.5,
        p99_us: p99,
        p999_us: p99 * 2.0,
        max_us: 9000.25,
        iops: mib_s * 256.0,
        mib_s,
        ..Default::default()
    }
}

fn rep(index: u32, write_mib_s: f64, faults: &[(f64, u64)], bad: &[(&str, Option<&str>)], failed_ios: u64) -> Repetition {
    let timeseries = (1..=10)
        .map(|t| Sample {
            t_s: t as f64 * 0.5,
            write_mib_s: write_mib_s + t as f64 * 0.1,
            write_iops: 100.0,
            read_mib_s: 0.0,
            cpu_pct: 37.5,
            rss_mib: 12.0,
            ..Default::default()
        })
        .collect();
    let faults = faults
        .iter()
        .enumerate()
        .map(|(i, &(t_s, blocks))| InjectedFault {
            t_s,
            rule_id: 7,
            rule: "flip <b>last</b>".into(),
            action: "bitflip".into(),
            op: "write".into(),
            offset: 4096 * i as u64,
            len: 4096,
            blocks,
            ..Default::default()
        })
        .collect();
    let mut integrity = Integrity { blocks_checked: 1000, ..Default::default() };
    let mut hit: BTreeMap<String, u64> = BTreeMap::new();
    for (i, (kind, file)) in bad.iter().enumerate() {
        match *kind {
            "corrupted" => integrity.corrupted += 1,
            "misdirected" => integrity.misdirected += 1,
            "unreadable" => integrity.unreadable += 1,
            "short" => integrity.short += 1,
            "missing" => integrity.missing += 1,
            k => panic!("kind {k}"),
        }
        integrity.bad.push(BadBlock {
            file: file.map(String::from),
            offset: 4096 * i as u64,
            kind: kind.to_string(),
            errno: (*kind == "unreadable").then(|| "EIO".to_string()),
            expected_id: 1000 + i as u64,
        });
        if let Some(f) = file {
            *hit.entry(f.to_string()).or_default() += 1;
        }
    }
    integrity.ok = integrity.blocks_checked - bad.len() as u64;
    integrity.files_hit = hit.into_iter().map(|(file, bad_blocks)| FileHit { file, bad_blocks }).collect();
    Repetition {
        index,
        seconds: 5.0,
        read: OpStats::default(),
        write: ops(write_mib_s, 100.0 + index as f64),
        timeseries,
        faults,
        rules: vec![RuleCount {
            id: 7,
            name: "flip <b>last</b>".into(),
            action: "bitflip".into(),
            op: "write".into(),
            fired: 2,
            blocks: 2,
            ..Default::default()
        }],
        io_errors: if failed_ios > 0 { BTreeMap::from([("write:EIO".to_string(), failed_ios)]) } else { BTreeMap::new() },
        failed_ios,
        retries: 0,
        integrity,
        notes: vec!["dmesg: <i>BTRFS warning</i>".into()],
        monitor: None,
        ..Default::default()
    }
}

fn sample_results(name: &str) -> Results {
    let mut setups = vec![
        SetupResult {
            name: "raw-bitflip".into(),
            stack: "raw".into(),
            description: "raw device, bit flip by offset".into(),
            repetitions: vec![
                rep(0, 100.0, &[(1.0, 1), (2.0, 1)], &[("corrupted", None), ("corrupted", None)], 0),
                rep(1, 110.0, &[(1.1, 1), (2.1, 1)], &[("corrupted", None), ("misdirected", None)], 0),
                rep(2, 120.0, &[(0.9, 1), (2.2, 1), (4.0, 1)], &[("corrupted", None), ("corrupted", None), ("corrupted", None)], 0),
            ],
            aggregate: Aggregate::default(),
            ..Default::default()
        },
        SetupResult {
            name: HOSTILE.into(),
            stack: "ext4".into(),
            description: "a <marquee>hostile</marquee> description".into(),
            repetitions: vec![
                rep(0, 80.0, &[(1.5, 0)], &[("unreadable", Some("f3")), ("short", Some("f<1>")), ("missing", Some("f3"))], 2),
                rep(1, 82.5, &[(1.7, 0), (3.0, 8)], &[("unreadable", Some("f3"))], 4),
            ],
            aggregate: Aggregate::default(),
            ..Default::default()
        },
    ];
    for s in &mut setups {
        s.aggregate_now();
    }
    Results {
        schema: SCHEMA,
        faultline_version: "0.1.0".into(),
        name: name.into(),
        started_unix: 1_700_000_000,
        experiment: serde_json::json!({"name": name, "faults": [{"type": "bitflip", "note": "</pre><script>x()</script>"}], "link": "https://example.org/x"}),
        setups,
        failed: Vec::new(),
    }
}

fn count<T>(r: &Results, f: impl Fn(&Repetition) -> Vec<T>) -> usize {
    r.setups.iter().flat_map(|s| &s.repetitions).map(|x| f(x).len()).sum()
}

fn lines(p: &Path) -> usize {
    std::fs::read_to_string(p).unwrap().lines().count()
}

#[test]
fn write_dir_files_roundtrip_and_csv_rows() {
    let dir = tempfile::tempdir().unwrap();
    let r = sample_results("run-a");
    write_dir(dir.path(), &r).unwrap();
    for f in ["results.json", "timeseries.csv", "faults.csv", "integrity.csv", "report.html"] {
        assert!(dir.path().join(f).is_file(), "{f} missing");
    }
    assert_eq!(load_dir(dir.path()).unwrap(), r);
    assert_eq!(lines(&dir.path().join("timeseries.csv")), 1 + count(&r, |x| x.timeseries.clone()));
    assert_eq!(lines(&dir.path().join("faults.csv")), 1 + count(&r, |x| x.faults.clone()));
    assert_eq!(lines(&dir.path().join("integrity.csv")), 1 + count(&r, |x| x.integrity.bad.clone()));
    assert_eq!(count(&r, |x| x.faults.clone()), 10);
    assert_eq!(count(&r, |x| x.integrity.bad.clone()), 11);
    let integ = std::fs::read_to_string(dir.path().join("integrity.csv")).unwrap();
    assert!(integ.contains(",f3,0,unreadable,EIO,1000\n"), "{integ}");
    // the hostile setup name is quoted (it holds a quote) and its quotes doubled
    assert!(integ.contains("\"ext4 <script>alert(1)</script> \"\"q\"\" & 'a'\",0,"), "{integ}");
}

#[test]
fn write_dir_fills_aggregates() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = sample_results("agg");
    r.setups[0].aggregate = Aggregate::default(); // stale: must be recomputed on write
    write_dir(dir.path(), &r).unwrap();
    let back = load_dir(dir.path()).unwrap();
    assert_eq!(back.setups[0].aggregate.repetitions, 3);
    assert_eq!(back.setups[0].aggregate.write_mib_s.mean, 110.0);
}

#[test]
fn aggregate_math_on_known_numbers() {
    let r = sample_results("m");
    let a = Aggregate::from(r.setups[0].repetitions.as_slice());
    assert_eq!(a.repetitions, 3);
    // write 100, 110, 120 MiB/s: mean 110, sample sd 10
    assert_eq!(a.write_mib_s, MeanSd { mean: 110.0, sd: 10.0 });
    // p99 100, 101, 102
    assert_eq!(a.write_p99_us, MeanSd { mean: 101.0, sd: 1.0 });
    // faults 2, 2, 3 blocks
    assert!((a.faults_injected.mean - 7.0 / 3.0).abs() < 1e-12);
    assert!((a.faults_injected.sd - (1.0f64 / 3.0).sqrt()).abs() < 1e-12);
    // silent = corrupted + misdirected: 2, 2, 3; nothing detected
    assert_eq!(a.silent.mean, a.faults_injected.mean);
    assert_eq!(a.detected, MeanSd { mean: 0.0, sd: 0.0 });
    assert_eq!(a.failures, a.silent);

    let b = Aggregate::from(r.setups[1].repetitions.as_slice());
    // faults: rep 0 one fault without blocks -> 1; rep 1: 1 + 8 = 9; mean 5, sd sqrt(32)
    assert_eq!(b.faults_injected.mean, 5.0);
    assert!((b.faults_injected.sd - 32f64.sqrt()).abs() < 1e-12);
    // detected = unreadable + short + missing: 3 and 1
    assert_eq!(b.detected.mean, 2.0);
    assert_eq!(b.silent.mean, 0.0);
    assert_eq!(b.failures, b.detected);
    // app errors = failed I/Os: 2 and 4
    assert_eq!(b.app_errors.mean, 3.0);
    assert!((b.app_errors.sd - 2f64.sqrt()).abs() < 1e-12);
}

#[test]
fn html_is_self_contained_escaped_with_one_chart_per_setup() {
    let dir = tempfile::tempdir().unwrap();
    let r = sample_results("run <b>bold</b>");
    write_dir(dir.path(), &r).unwrap();
    let h = std::fs::read_to_string(dir.path().join("report.html")).unwrap();
    // per setup: throughput over time and latency percentiles
    assert_eq!(h.matches("<svg").count(), 2 * r.setups.len());
    assert_eq!(h.matches("Throughput over time: ").count(), r.setups.len());
    assert_eq!(h.matches("Latency percentiles: ").count(), r.setups.len());
    // one bar per repetition (write only) and percentile
    assert_eq!(h.matches("class=\"bar\"").count(), 5 * count(&r, |x| vec![x.index]));
    assert_eq!(h.matches("class=\"fault-marker\"").count(), count(&r, |x| x.faults.clone()));
    let no_ns = h.replace("xmlns=\"http://www.w3.org/2000/svg\"", "");
    assert!(!no_ns.contains("http://") && !no_ns.contains("https://"), "external URL in report.html");
    assert!(
        !h.contains("<script") && !h.contains("<marquee") && !h.contains("<b>last") && !h.contains("<b>bold") && !h.contains("<i>BTRFS"),
        "unescaped text from results"
    );
    assert!(h.contains("ext4 &lt;script&gt;alert(1)&lt;/script&gt; &quot;q&quot; &amp; &#39;a&#39;"));
    assert!(h.contains("2023-11-14 22:13:20 UTC"));
    // the study table: the raw setup's faults and failures as mean ± sd
    assert!(h.contains("<td>110.0 ± 10.0</td>"), "write MiB/s mean ± sd missing");
    assert!(h.contains("https&#58;//example.org/x"), "echoed URL kept as text");
    // files hit: f3 has 2 + 1 bad blocks over two repetitions
    assert!(h.contains("<td class=\"l\">f3</td><td>3</td><td>2</td>"), "files hit table");
    assert!(h.contains("f&lt;1&gt;"));
    // latency percentiles and per-rule counts
    assert!(h.contains("p99.9") && h.contains("9000.2"));
    assert!(h.contains("flip &lt;b&gt;last&lt;/b&gt;"));
}

#[test]
fn summary_table_has_one_row_per_setup() {
    let r = sample_results("s");
    let t = summary_table(&r);
    let rows: Vec<&str> = t.lines().collect();
    assert_eq!(rows.len(), 1 + r.setups.len(), "{t}");
    assert!(rows[0].starts_with("setup") && rows[0].contains("failures"));
    assert!(rows[1].starts_with("raw-bitflip") && rows[1].contains("110.0 ± 10.0"), "{t}");
    // columns line up: every row is as wide as the header
    assert!(rows.iter().all(|l| l.chars().count() == rows[0].chars().count()), "{t}");
}

#[test]
fn non_finite_numbers_are_refused_when_writing() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = sample_results("nan");
    r.setups[0].repetitions[0].write.mean_us = f64::NAN;
    let e = format!("{:#}", write_dir(dir.path(), &r).unwrap_err());
    assert!(e.contains("NaN"), "{e}");
    assert!(!dir.path().join("results.json").exists());
}

fn faultline(args: &[&str]) -> (bool, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_faultline")).args(args).output().unwrap();
    (o.status.success(), String::from_utf8_lossy(&o.stdout).into(), String::from_utf8_lossy(&o.stderr).into())
}

#[test]
fn cli_combines_two_runs() {
    let t = tempfile::tempdir().unwrap();
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    let mut rb = sample_results("run-b");
    rb.setups[0].name = "btrfs-raid1-flip".into();
    rb.setups[0].stack = "btrfs-raid1".into();
    write_dir(&a, &sample_results("run-a")).unwrap();
    write_dir(&b, &rb).unwrap();
    let out = t.path().join("both.html");
    let (ok, stdout, stderr) = faultline(&["report", a.to_str().unwrap(), b.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("raw-bitflip") && stdout.contains("btrfs-raid1-flip"), "{stdout}");
    let h = std::fs::read_to_string(&out).unwrap();
    assert!(h.contains("run-a (") && h.contains("run-b ("), "runs labelled by name and dir");
    assert!(h.contains(">raw-bitflip<") && h.contains(">btrfs-raid1-flip<"));
    // both runs' setups: 2 + 2 setups with two charts each, and every fault of both runs marked
    assert_eq!(h.matches("<svg").count(), 8);
    let faults = count(&sample_results("x"), |x| x.faults.clone()) + count(&rb, |x| x.faults.clone());
    assert_eq!(h.matches("class=\"fault-marker\"").count(), faults);

    // several dirs need -o
    let (ok, _, stderr) = faultline(&["report", a.to_str().unwrap(), b.to_str().unwrap()]);
    assert!(!ok && stderr.contains("-o"), "{stderr}");

    // one dir: rebuilds DIR/report.html
    std::fs::remove_file(a.join("report.html")).unwrap();
    let (ok, _, stderr) = faultline(&["report", a.to_str().unwrap()]);
    assert!(ok, "{stderr}");
    assert!(a.join("report.html").is_file());
}

#[test]
fn cli_errors_are_clear() {
    let t = tempfile::tempdir().unwrap();
    let missing = t.path().join("nope");
    let (ok, _, e) = faultline(&["report", missing.to_str().unwrap()]);
    assert!(!ok && e.contains(missing.to_str().unwrap()) && e.contains("no such results directory"), "{e}");

    let empty = t.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let (ok, _, e) = faultline(&["report", empty.to_str().unwrap()]);
    assert!(!ok && e.contains("results.json") && e.contains("not a faultline results directory"), "{e}");

    let v2 = t.path().join("v2");
    write_dir(&v2, &sample_results("v2")).unwrap();
    let p = v2.join("results.json");
    let text = std::fs::read_to_string(&p).unwrap().replacen("\"schema\": 1", "\"schema\": 2", 1);
    std::fs::write(&p, text).unwrap();
    let (ok, _, e) = faultline(&["report", v2.to_str().unwrap()]);
    assert!(!ok && e.contains(p.to_str().unwrap()) && e.contains("schema version 2") && e.contains("reads schema version 1"), "{e}");

    // right version, wrong shape: the file, and serde's line/column
    let bad = t.path().join("bad");
    std::fs::create_dir(&bad).unwrap();
    std::fs::write(bad.join("results.json"), "{\"schema\": 1, \"name\": 5}").unwrap();
    let (ok, _, e) = faultline(&["report", bad.to_str().unwrap()]);
    assert!(!ok && e.contains("does not match results schema 1") && e.contains("line 1"), "{e}");
}

/// A read-only networked repetition: one client reading 10 MiB/s for 10 s, 2 MiB/s inside a
/// window from 4 s to 6 s (the window's figures computed as a run computes them).
fn networked_rep(index: u32, during: f64) -> Repetition {
    use faultline::report::networked::{ClientPoint, ClientSeries, FaultWindow, NetworkedRun};
    let mib: Vec<f64> = (1..=10).map(|t| if (5..=6).contains(&t) { during } else { 10.0 }).collect();
    let points = mib.iter().enumerate().map(|(i, m)| ClientPoint { t_s: (i + 1) as f64, iops: m * 128.0, mib_s: *m, mean_us: 800.0, p99_us: 2000.0 }).collect();
    let mut n = NetworkedRun {
        clients: vec![ClientSeries { host: "client".into(), seconds: 10.0, points, ..Default::default() }],
        windows: vec![FaultWindow { kind: "net".into(), description: "delay 1ms".into(), from_s: 4.0, to_s: Some(6.0) }],
        ..Default::default()
    };
    n.analyse();
    Repetition { index, read: OpStats { ops: 10_000, mib_s: 8.4, p99_us: 2000.0, ..Default::default() }, networked: Some(Box::new(n)), ..Default::default() }
}

fn results_of(name: &str, setups: Vec<SetupResult>) -> Results {
    Results {
        schema: SCHEMA,
        faultline_version: "0.1.0".into(),
        name: name.into(),
        started_unix: 1_700_000_000,
        experiment: serde_json::json!({}),
        setups,
        failed: Vec::new(),
    }
}

/// A paired latency study: writes and reads of 100 µs at baseline, `slow` µs more injected;
/// a monitor whose block service carries the delay and whose queue time swings in the
/// injected runs; a matrix axis `pattern` with two entries.
fn latency_setup(name: &str, pattern: &str, slow: f64) -> SetupResult {
    use faultline::monitor::model::{DeviceResults, Interval, IntervalOp, LayerOp, MonitorResults};
    let l = |layer: &str, op: &str, mean: f64| LayerOp {
        layer: layer.into(),
        op: op.into(),
        count: 100,
        mean_us: mean,
        p50_us: mean,
        p95_us: mean,
        p99_us: mean,
        ..Default::default()
    };
    let rep = |index: u32, extra: f64, jitter: f64| {
        let o = |base: f64| OpStats {
            ops: 1000,
            mean_us: base + extra + jitter,
            p50_us: base + extra,
            p95_us: base + extra,
            p99_us: base + extra,
            iops: 1e6 / (base + extra + jitter),
            mib_s: 4.0,
            ..Default::default()
        };
        let series = (0..6)
            .map(|t| Interval {
                t_s: t as f64 * 0.1,
                ops: [("write".to_string(), IntervalOp { count: 10, queue_mean_us: 1.0 + if t % 2 == 0 { extra } else { 0.0 }, ..Default::default() })].into(),
                ..Default::default()
            })
            .collect();
        let m = MonitorResults {
            duration_s: 1.0,
            stack: vec![l("journal", "commit", 500.0 + jitter), l("driver", "fuse:write", 40.0 + extra + jitter)],
            devices: vec![DeviceResults {
                device: "/dev/loop9".into(),
                layers: vec![l("block_queue", "write", 1.0 + jitter / 10.0), l("block_service", "write", 60.0 + extra + jitter)],
                series,
                ..Default::default()
            }],
            ..Default::default()
        };
        Repetition {
            index,
            write: o(100.0),
            read: o(90.0),
            monitor: Some(m),
            rules: vec![RuleCount { name: "slow".into(), matched: 100, fired: 10, ..Default::default() }],
            ..Default::default()
        }
    };
    let mut s = SetupResult {
        name: name.into(),
        stack: "ext4".into(),
        baseline: (1..=3).map(|i| rep(i, 0.0, i as f64)).collect(),
        repetitions: (1..=3).map(|i| rep(i, slow, i as f64 * 1.5)).collect(),
        axes: vec![("pattern".into(), pattern.into())],
        ..Default::default()
    };
    s.aggregate_now();
    s
}

fn lead_of(h: &str) -> (usize, usize) {
    let lead = h.find("<section id=\"lead\"").unwrap_or(usize::MAX);
    let first_setup = h.find("<section id=\"setup-").unwrap_or(usize::MAX);
    (lead, first_setup)
}

/// The report and the stdout summary lead with the study's own figure: a performability
/// study with every setup's throughput as small multiples with its fault windows shaded and
/// the window table; a latency study with its slowdown figures (scatter, per-op bars, by
/// matrix axis, per layer, queue over time); a content-fault study with the faults-vs-failures
/// table. Columns that do not apply are left out: a read-only study has no write columns.
#[test]
fn the_lead_follows_the_kind_of_study_and_columns_that_do_not_apply_are_left_out() {
    // performability, read-only
    let perf = results_of(
        "perf",
        vec![
            SetupResult { name: "baseline".into(), stack: "raw".into(), repetitions: vec![networked_rep(0, 10.0)], ..Default::default() },
            SetupResult { name: "delay-1ms".into(), stack: "raw".into(), repetitions: vec![networked_rep(0, 2.0)], ..Default::default() },
        ],
    );
    assert_eq!(Kind::of(&perf.setups), Kind::Performability);
    let h = html::render(&[html::Run { label: "perf".into(), results: &perf }]);
    let (lead, first_setup) = lead_of(&h);
    assert!(h.contains("class=\"lead-performability\"") && lead < first_setup, "no performability lead before the setups");
    let overview = h.find("<table class=\"overview\"").unwrap();
    assert!(lead < overview, "the lead comes before the setups table");
    assert!(h[..lead].matches("<h2>").count() == 0, "nothing else leads");
    // small multiples: one chart per setup, each shading its window, on one scale
    let multiples = &h[h.find("<div class=\"multiples\">").unwrap()..];
    let multiples = &multiples[..multiples.find("</div>").unwrap()];
    assert_eq!(multiples.matches("<svg").count(), 2);
    assert_eq!(multiples.matches("class=\"fault-window\"").count(), 2);
    let ticks = |svg: &str| svg.matches("text-anchor=\"end\">").count();
    let charts: Vec<&str> = multiples.split("<svg").skip(1).collect();
    assert_eq!(ticks(charts[0]), ticks(charts[1]), "both charts have the same y grid");
    assert!(charts[0].contains(">10</text>") && charts[1].contains(">10</text>"), "the baseline's 10 MiB/s sets both scales");
    // the window table: before 10, during 2, ratio 0.2
    assert!(h.contains("<td>10.00</td><td>2.00</td><td>0.200</td>"), "window figures of delay-1ms");
    // read-only: no write column, no verification column
    let ov = &h[overview..overview + h[overview..].find("</table>").unwrap()];
    assert!(ov.contains("Read MiB/s") && !ov.contains("Write") && !ov.contains("Silent"), "{ov}");
    assert!(!h.contains("Injected faults vs reported failures"));
    let t = summary_table(&perf);
    assert!(t.starts_with("fault windows"), "{t}");
    assert!(t.lines().any(|l| l.starts_with("delay-1ms") && l.contains("net 4..6s") && l.contains("0.200")), "{t}");
    let head = t.lines().find(|l| l.starts_with("setup ") && l.contains("reps")).unwrap();
    assert!(head.contains("read MiB/s") && !head.contains("write") && !head.contains("silent"), "{t}");

    // latency study
    let lat = results_of("lat", vec![latency_setup("random-10", "random-10", 20.0), latency_setup("burst-10", "burst-10", 40.0)]);
    assert_eq!(Kind::of(&lat.setups), Kind::Latency);
    let h = html::render(&[html::Run { label: "lat".into(), results: &lat }]);
    let (lead, first_setup) = lead_of(&h);
    assert!(h.contains("class=\"lead-latency\"") && lead < first_setup && lead < h.find("<table class=\"overview\"").unwrap());
    let lead_html = &h[lead..lead + h[lead..].find("</section>").unwrap()];
    let scatter = lead_html.find("Baseline mean latency vs slowdown").unwrap();
    assert!(scatter < lead_html.find("<table").unwrap(), "figures first, then the numbers");
    assert_eq!(lead_html.matches("class=\"pt-ci\"").count(), 4, "2 setups x (read, write), each with its interval");
    assert!(lead_html.contains("Slowdown by pattern") && lead_html.contains("burst-10 · write (1 setups, 3 pairs)"));
    assert!(lead_html.contains("random-10: where the time went") && lead_html.contains("driver fuse:write"));
    assert!(lead_html.contains("Block layer queue time over time"));
    let t = summary_table(&lat);
    let head = t.lines().next().unwrap();
    assert!(head.contains("write slowdown") && head.contains("read slowdown") && !head.contains("silent"), "{t}");
    let layers = &t[t.find("random-10: slowdown of the mean latency per layer").expect("per-layer lines")..];
    assert!(layers.lines().nth(1).unwrap().starts_with("  journal"), "from the application down: journal before block: {t}");
    assert!(layers.lines().any(|l| l.starts_with("  block_service") && l.contains(" write ") && l.contains("+")), "{t}");

    // content faults: as before, the faults vs failures table leads
    let content = sample_results("content");
    assert_eq!(Kind::of(&content.setups), Kind::Content);
    let h = html::render(&[html::Run { label: "c".into(), results: &content }]);
    assert!(!h.contains("<section id=\"lead\""));
    let first_h2 = h.find("<h2>").unwrap();
    assert!(h[first_h2..].starts_with("<h2>Injected faults vs reported failures</h2>"));
    let ov = &h[first_h2..first_h2 + h[first_h2..].find("</table>").unwrap()];
    assert!(ov.contains("Write MiB/s") && ov.contains("Silent") && !ov.contains("Read MiB/s"), "a write-only study has no read column: {ov}");
}
