//! The latency model on real loop devices, measured by fio (client side) and by the daemon's
//! own stats: a fixed service time, the size term, channels, an empirical table, populate, and
//! bad model files. Timing comparisons are always against the same disk without the model in
//! the same test, on low percentiles (the machine is shared; the tail is its noise), with
//! tolerances that the difference cannot meet without the model. The model is the same over
//! either transport, so the four timing tests each run over one (scripts/test.sh's
//! TRANSPORT_PINNED): two over classic /dev/fuse, two over FUSE over io_uring where the kernel
//! has it.

mod common;
use common::*;
use serde_json::{Value, json};
use std::path::Path;
use std::process::Command;
use std::sync::Mutex;

/// One test at a time in this binary: they measure latencies.
static SERIAL: Mutex<()> = Mutex::new(());

fn have_fio() -> bool {
    if Command::new("fio").arg("--version").output().is_ok_and(|o| o.status.success()) {
        return true;
    }
    skip("", "needs fio");
    false
}

/// Client-side completion latencies (µs) of one fio job: p10, p50, mean, IOPS.
struct Fio {
    p10: f64,
    p50: f64,
    mean: f64,
    iops: f64,
}

fn fio(dev: &Path, rw: &str, bs: &str, qd: u32, secs: u32) -> Fio {
    let out = Command::new("fio")
        .args(["--name=t", "--direct=1", "--size=64M", "--time_based", "--output-format=json"])
        .arg(format!("--filename={}", dev.display()))
        .arg(format!("--rw={rw}"))
        .arg(format!("--bs={bs}"))
        .arg(format!("--iodepth={qd}"))
        .arg(format!("--ioengine={}", if qd > 1 { "libaio" } else { "psync" }))
        .arg(format!("--runtime={secs}"))
        .output()
        .unwrap();
    assert!(out.status.success(), "fio: {}", String::from_utf8_lossy(&out.stderr));
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();
    let dir = if rw.contains("write") { "write" } else { "read" };
    let r = &j["jobs"][0][dir];
    let c = &r["clat_ns"];
    let p = |k: &str| c["percentile"][k].as_f64().unwrap() / 1e3;
    Fio { p10: p("10.000000"), p50: p("50.000000"), mean: c["mean"].as_f64().unwrap() / 1e3, iops: r["iops"].as_f64().unwrap() }
}

fn serve_with(model: Option<&str>, extra: &[&str]) -> Serve {
    let dir = tempfile::tempdir().unwrap();
    let mut args: Vec<String> = vec!["--size".into(), "256MiB".into()];
    args.extend(extra.iter().map(|s| s.to_string()));
    if let Some(m) = model {
        let p = dir.path().join("model.yaml");
        std::fs::write(&p, m).unwrap();
        args.push("--latency".into());
        args.push(p.display().to_string());
    }
    let a: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let s = Serve::start_args(&a, "rules: []\n");
    // keep the model file until the server has read it (it has: the device is up)
    drop(dir);
    s
}

fn model_stats(s: &Serve) -> Value {
    s.call(json!({"cmd": "stats"}))["latency_model"].clone()
}

#[test]
fn fixed_service_time_and_size_term() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !have_fio() {
        return;
    }
    // same disk settings, without and with the model; reads of 4 KiB and 128 KiB
    let s = serve_with(None, &["--ring", "off"]);
    let (b4, b128) = (fio(&s.dev, "randread", "4k", 1, 3), fio(&s.dev, "randread", "128k", 1, 3));
    s.stop();
    let s = serve_with(Some("read: {distribution: fixed, mean: 50us, per_kib: 1us}\n"), &["--ring", "off"]);
    let (m4, m128) = (fio(&s.dev, "randread", "4k", 1, 3), fio(&s.dev, "randread", "128k", 1, 3));
    let st = model_stats(&s);
    s.stop();
    eprintln!(
        "4k: p10 {:.1} -> {:.1}, p50 {:.1} -> {:.1}; 128k: p10 {:.1} -> {:.1}, p50 {:.1} -> {:.1}",
        b4.p10, m4.p10, b4.p50, m4.p50, b128.p10, m128.p10, b128.p50, m128.p50
    );
    // 4 KiB: 50 + 4 x 1 µs from arrival at the daemon; the part of the base path inside the
    // daemon is hidden by it, so the difference is at most the service time and, on a busy
    // machine, at least most of it
    let d4 = m4.p10 - b4.p10;
    assert!((35.0..=80.0).contains(&d4), "4 KiB reads: +{d4:.1} µs at p10 with a 54 µs model");
    // 128 KiB: 50 + 128 µs; the size term makes them (128 - 4) µs slower than 4 KiB ones
    // beyond what the base path already adds for the size. Over /dev/fuse the late reply
    // leaves the delay thread, and on some machines the client sees tens of µs more at p10
    // while the daemon's own service times (below) are exact: the upper bound allows that,
    // the lower one still needs the size term
    let extra = (m128.p10 - m4.p10) - (b128.p10 - b4.p10);
    assert!((124.0 * 0.7..=124.0 * 1.3 + 100.0).contains(&extra), "size term: 128 KiB reads +{extra:.1} µs over 4 KiB ones, model says 124");
    // the daemon's own figures: the sampled service times
    let r = &st["ops"]["read"];
    assert!(r["count"].as_u64().unwrap() > 100, "{st}");
    let p50 = r["service"]["p50_us"].as_f64().unwrap();
    assert!((54.0 * 0.99..=178.0 * 1.01).contains(&p50), "{st}");
    assert!(r["wait"]["mean_us"].as_f64().unwrap() < 0.01, "no channels, no waiting: {st}");
}

#[test]
fn one_channel_queues_requests() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !have_fio() {
        return;
    }
    let service = 200.0;
    let ring = ["--ring", ring_where_available()];
    let s = serve_with(Some("read: 200us\n"), &ring);
    let free = fio(&s.dev, "randread", "4k", 4, 3);
    s.stop();
    let s = serve_with(Some("read: 200us\nchannels: 1\n"), &ring);
    let one = fio(&s.dev, "randread", "4k", 4, 3);
    let st = model_stats(&s);
    s.stop();
    eprintln!("QD4: unlimited {:.0} IOPS (mean {:.0} µs), 1 channel {:.0} IOPS (mean {:.0} µs); {st}", free.iops, free.mean, one.iops, one.mean);
    // one channel serves one request per 200 µs at most
    let cap = 1e6 / service;
    assert!(one.iops <= cap * 1.03, "1 channel of {service} µs: {:.0} IOPS, cap {cap:.0}", one.iops);
    assert!(free.iops > one.iops * 1.4, "unlimited channels at QD4 should beat one: {:.0} vs {:.0}", free.iops, one.iops);
    // requests waited behind each other: at QD4, up to 3 service times
    let w = &st["ops"]["read"]["wait"];
    assert!(w["mean_us"].as_f64().unwrap() > service * 0.5, "{st}");
    assert!(w["p99_us"].as_f64().unwrap() <= service * 3.0 * 1.05 + 50.0, "{st}");
    assert_eq!(st["channels"], json!(1));
}

/// A held delay (`hold: device`) on every 10th read holds the device's one implicit channel
/// for 1 ms, so at QD 8 the reads behind it wait; the same delay on the path only makes its own
/// read late. Bounds from the model: the holds are served one after another, so at most 10
/// reads complete per 1 ms held (IOPS <= 10,000), and a closed loop of 8 reads then has a mean
/// latency of at least 8 / 10,000 s = 800 µs (Little's law); on the path the mean is the base
/// latency plus 1 ms / 10, and the IOPS are not capped by the delay.
#[test]
fn held_delay_queues_the_reads_behind_it() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !have_fio() {
        return;
    }
    let (delay_us, every, qd) = (1000.0, 10.0, 8.0);
    let rules = |hold: &str| format!("rules:\n  - {{type: delay, op: read, delay: 1ms, hold: {hold}, pattern: {{interval: {{every: 10}}}}}}\n");
    let s = Serve::start_args(&["--size", "256MiB", "--ring", "off"], &rules("path"));
    let path = fio(&s.dev, "randread", "4k", qd as u32, 3);
    let pst = s.call(json!({"cmd": "stats"}));
    s.stop();
    let s = Serve::start_args(&["--size", "256MiB", "--ring", "off"], &rules("device"));
    let held = fio(&s.dev, "randread", "4k", qd as u32, 3);
    let hst = s.call(json!({"cmd": "stats"}));
    s.stop();
    eprintln!(
        "QD8, 1 ms on every 10th read: path {:.0} IOPS mean {:.0} µs; held {:.0} IOPS mean {:.0} µs; held stats {}",
        path.iops, path.mean, held.iops, held.mean, hst["held"]
    );
    let cap = every / delay_us * 1e6;
    assert!(held.iops <= cap * 1.03, "held: {:.0} IOPS, the model allows at most {cap:.0}", held.iops);
    let floor = qd * delay_us / every;
    assert!(held.mean >= floor * 0.97, "held: mean {:.0} µs, the model says at least {floor:.0}", held.mean);
    // on the path the delay caps nothing: the reads behind a delayed one go on (how far the
    // path run gets depends on the machine's own latency at QD 8, 100-800 µs here: compared
    // with the held run, not with a figure); each 10th read is still 1 ms late
    assert!(path.iops > held.iops * 1.2, "path: {:.0} IOPS, held {:.0}", path.iops, held.iops);
    assert!(path.mean >= delay_us / every * 0.97 && path.mean < held.mean, "path: mean {:.0} µs (held {:.0})", path.mean, held.mean);
    // the daemon's account: every 10th read held, the others waited behind them
    let h = &hst["held"];
    let reads = hst["service"]["read"]["count"].as_f64().unwrap();
    let n = h["held"].as_f64().unwrap();
    assert!((n / reads - 1.0 / every).abs() < 0.01, "{n} of {reads} reads held: {hst}");
    assert!(h["waited"].as_u64().unwrap() as f64 > n, "the reads behind the holds waited: {h}");
    assert!((h["held_us"].as_f64().unwrap() / n - delay_us).abs() < 1.0, "{h}");
    assert!(pst.get("held").is_none(), "a path delay holds nothing: {pst}");
}

#[test]
fn empirical_table_is_recovered_by_the_daemon() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let s = serve_with(Some("read: {distribution: empirical, percentiles: {p0: 20us, p50: 40us, p90: 100us, p100: 200us}}\nseed: 3\n"), &[]);
    let d = s.open();
    for i in 0..3000u64 {
        read_block(&d, (i * 7) % 4096).unwrap();
    }
    let st = model_stats(&s);
    drop(d);
    s.stop();
    let sv = &st["ops"]["read"]["service"];
    let (p50, p99, mean) = (sv["p50_us"].as_f64().unwrap(), sv["p99_us"].as_f64().unwrap(), sv["mean_us"].as_f64().unwrap());
    // the table's p50, p99 (linear between p90 and p100: 190) and mean (the areas of the
    // three linear pieces: 0.5 x 30 + 0.4 x 70 + 0.1 x 150 = 58)
    assert!((p50 - 40.0).abs() <= 40.0 * 0.05, "p50 {p50}: {st}");
    assert!((p99 - 190.0).abs() <= 190.0 * 0.05, "p99 {p99}: {st}");
    assert!((mean - 58.0).abs() <= 58.0 * 0.05, "mean {mean}: {st}");
}

fn rss_bytes(pid: u32) -> u64 {
    let t = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = t.lines().find_map(|l| l.strip_prefix("VmRSS:")).unwrap().trim().trim_end_matches("kB").trim().parse().unwrap();
    kib * 1024
}

#[test]
fn populate_makes_the_store_resident_before_the_device_appears() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let size = 256u64 << 20;
    // measured as soon as the device line is out: the store was populated before that
    let s = serve_with(None, &["--populate"]);
    let with = rss_bytes(s.pid());
    s.stop();
    let s = serve_with(None, &[]);
    let without = rss_bytes(s.pid());
    s.stop();
    // a latency model populates by default; `--populate false` turns it off
    let s = serve_with(Some("read: 10us\n"), &[]);
    let model = rss_bytes(s.pid());
    s.stop();
    let s = serve_with(Some("read: 10us\n"), &["--populate", "false"]);
    let model_off = rss_bytes(s.pid());
    s.stop();
    eprintln!("RSS: populate {with}, none {without}, model {model}, model with --populate false {model_off}");
    assert!(with >= size, "populated: RSS {with} < disk size {size}");
    assert!(model >= size, "a model populates by default: RSS {model}");
    assert!(without < size / 2 && model_off < size / 2, "unpopulated stores stay sparse: {without}, {model_off}");
}

#[test]
fn populate_refuses_a_disk_larger_than_memory() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(total) = faultline::sys::mem_total() else {
        skip("", "no MemTotal in /proc/meminfo");
        return;
    };
    let size = format!("{}MiB", (total >> 20) * 2);
    let out = Command::new(bin()).args(["serve", "--size", &size, "--populate"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("cannot populate") && err.contains("memory"), "{err}");
}

#[test]
fn bad_latency_files_name_file_line_and_what_is_allowed() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    for (text, line, want) in [
        ("read: 50us\nwrite: {distribution: gamma, mean: 3us}\n", 2, "allowed: fixed, uniform, normal, lognormal, pareto, empirical, histogram"),
        ("read: 50us\nchannels: 0\n", 2, "allowed: 1 to"),
        ("read:\n  distribution: empirical\n  percentiles: {p50: 20us, p90: 10us}\n", 2, "must not decrease"),
        ("read: 50us\nflush: 3parsecs\n", 2, "unknown duration unit"),
        ("read: 50us\nreads: 3us\n", 2, "unknown field"),
    ] {
        let p = dir.path().join("bad.yaml");
        std::fs::write(&p, text).unwrap();
        let out = Command::new(bin()).args(["serve", "--size", "64MiB", "--latency"]).arg(&p).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        // our own checks and the YAML reader's alike say FILE:LINE:COL
        let at = format!("{}:{line}:", p.display());
        assert!(!out.status.success() && err.contains(&at) && err.contains(want), "want {at} and {want:?}, got {err}");
    }
}

/// The p-th percentile (0..1) of an op's table in a model file.
fn model_at(path: &Path, op: faultline::spec::rule::Op, q: f64) -> f64 {
    let m = faultline::spec::latency::parse_latency_file(path).unwrap();
    let pts = m.op(op).unwrap().base.points().unwrap().to_vec();
    faultline::spec::latency::empirical_at(&pts, q).as_secs_f64() * 1e6
}

/// A faultline disk with a known model is the "real device": calibrate measures it (read-only),
/// fits, and the fitted table recovers the known one (the path on top is taken off).
#[test]
fn calibrate_recovers_a_known_model() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !have_fio() {
        return;
    }
    let known = "read: {distribution: empirical, percentiles: {p0: 80us, p50: 100us, p90: 150us, p100: 300us}}\n";
    let s = serve_with(Some(known), &["--ring", ring_where_available()]);
    let dir = tempfile::tempdir().unwrap();
    let out_path = dir.path().join("fitted.yaml");
    let out = Command::new(bin()).arg("calibrate").arg(&s.dev).args(["--runtime", "3", "--size", "128MiB", "-o"]).arg(&out_path).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success());
    // fio's --readonly: the device was never written
    let st = s.call(json!({"cmd": "stats"}));
    assert_eq!(st["latency_model"]["ops"].get("write"), None, "calibrate wrote to the device: {st}");
    s.stop();
    let op = faultline::spec::rule::Op::Read;
    let (p10, p50, p90) = (model_at(&out_path, op, 0.1), model_at(&out_path, op, 0.5), model_at(&out_path, op, 0.9));
    eprintln!("fitted p10 {p10:.1} µs (known 84), p50 {p50:.1} µs (known 100), p90 {p90:.1} µs (known 150)");
    // the shared 2-CPU machine's noise lands in both the "device" measurement and the probes,
    // and away from the median it is most of what is measured (at load average 30, fio saw a
    // p90 of 330 µs for a known 150; the path's spread puts the fit's p10 30 µs low), so the
    // median is asserted, which is what the fit's correction aims at; the raw measurement (the
    // known model plus the whole kernel and FUSE path, twice over: the measured disk is a
    // faultline disk too) lies outside these bounds (129-157 µs in the runs seen)
    assert!((75.0..=125.0).contains(&p50), "fitted p50 {p50:.1} µs, known 100");
    assert!(p10 <= p50 && p50 <= p90, "the table must not decrease");
    assert!(stdout.contains("p95") && stdout.contains("ratio") && stdout.contains("goal"), "{stdout}");
}

/// A fio JSON result brought by the user: with --no-subtract the table is fio's percentiles.
#[test]
fn calibrate_from_fio_json() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !have_fio() {
        return;
    }
    let s = serve_with(None, &[]);
    let dir = tempfile::tempdir().unwrap();
    let json_path = dir.path().join("r.json");
    let o = Command::new("fio")
        .args(["--name=t", "--direct=1", "--readonly", "--rw=randread", "--bs=4k", "--size=64M", "--runtime=1", "--time_based", "--output-format=json"])
        .arg(format!("--filename={}", s.dev.display()))
        .output()
        .unwrap();
    s.stop();
    std::fs::write(&json_path, &o.stdout).unwrap();
    let j: Value = serde_json::from_slice(&o.stdout).unwrap();
    let out_path = dir.path().join("m.yaml");
    let r =
        Command::new(bin()).arg("calibrate").arg("--from-fio").arg(&json_path).args(["--no-subtract", "--no-compare", "-o"]).arg(&out_path).output().unwrap();
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let want = j["jobs"][0]["read"]["clat_ns"]["percentile"]["50.000000"].as_f64().unwrap() / 1e3;
    let got = model_at(&out_path, faultline::spec::rule::Op::Read, 0.5);
    assert!((got - want).abs() < 0.01, "p50 {got} µs, fio said {want}");
    // a file that is neither JSON nor a latency log
    std::fs::write(&json_path, "hello\n").unwrap();
    let r = Command::new(bin()).arg("calibrate").arg("--from-fio").arg(&json_path).args(["--no-compare", "-o"]).arg(&out_path).output().unwrap();
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(!r.status.success() && err.contains("line 1") && err.contains("latency log"), "{err}");
}

/// An experiment's `disk: {latency}` reaches its disk server, and results carry the model's
/// figures per repetition (the model is not in the fault log).
#[test]
fn experiment_results_carry_the_latency_model() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("exp.yaml");
    std::fs::write(
        &f,
        "name: lm\ndisk: {size: 128MiB, latency: {read: 30us, write: {distribution: uniform, min: 20us, max: 40us}, channels: 2}}\nstack: raw\nworkload: {size: 8MiB, block_size: 64KiB, pattern: sequential, mix: {write: 100}}\n",
    )
    .unwrap();
    let out = dir.path().join("results");
    let o = Command::new(bin()).arg("run").arg(&f).arg("--out").arg(&out).arg("-q").output().unwrap();
    assert!(o.status.success(), "faultline run failed:\n{}\n{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    let r = faultline::report::load_dir(&out).unwrap();
    let rep = &r.setups[0].repetitions[0];
    assert!(rep.faults.is_empty(), "the model is not a fault: {:?}", rep.faults);
    let lm = &rep.latency_model;
    assert_eq!(lm.len(), 1, "{lm:?}");
    assert_eq!(lm[0].stats.channels, Some(2));
    let w = &lm[0].stats.ops["write"];
    assert!(w.count > 0 && (20.0..=40.0).contains(&w.service.p50_us), "{lm:?}");
    // (a reply whose service time had passed by the time the store was done goes at once and
    // is not counted late: a debug build's 64 KiB copy can take 30 µs)
    assert!(lm[0].reply_lateness.is_some(), "{lm:?}");
}
