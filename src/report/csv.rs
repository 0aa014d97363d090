//! CSV views of results.json: one row per sample, per injected fault, per bad block.
//! RFC 4180 quoting; a header row first.

use super::model::Results;
use std::fmt::Write;

/// Quote a field when it holds a comma, quote, or line break.
pub fn field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) { format!("\"{}\"", s.replace('"', "\"\"")) } else { s.to_string() }
}

fn row(out: &mut String, fields: &[String]) {
    out.push_str(&fields.join(","));
    out.push('\n');
}

pub const TIMESERIES_HEADER: &str =
    "setup,repetition,t_s,read_iops,read_mib_s,read_mean_us,read_p99_us,write_iops,write_mib_s,write_mean_us,write_p99_us,cpu_pct,rss_mib";
pub const FAULTS_HEADER: &str = "setup,repetition,t_s,rule_id,rule,action,op,offset,len,blocks";
pub const INTEGRITY_HEADER: &str = "setup,repetition,file,offset,kind,errno,expected_id";

pub fn timeseries(r: &Results) -> String {
    let mut out = format!("{TIMESERIES_HEADER}\n");
    for s in &r.setups {
        for rep in &s.repetitions {
            for x in &rep.timeseries {
                let mut f = vec![field(&s.name), rep.index.to_string()];
                for v in [
                    x.t_s,
                    x.read_iops,
                    x.read_mib_s,
                    x.read_mean_us,
                    x.read_p99_us,
                    x.write_iops,
                    x.write_mib_s,
                    x.write_mean_us,
                    x.write_p99_us,
                    x.cpu_pct,
                    x.rss_mib,
                ] {
                    f.push(v.to_string());
                }
                row(&mut out, &f);
            }
        }
    }
    out
}

pub fn faults(r: &Results) -> String {
    let mut out = format!("{FAULTS_HEADER}\n");
    for s in &r.setups {
        for rep in &s.repetitions {
            for x in &rep.faults {
                row(
                    &mut out,
                    &[
                        field(&s.name),
                        rep.index.to_string(),
                        x.t_s.to_string(),
                        x.rule_id.to_string(),
                        field(&x.rule),
                        field(&x.action),
                        field(&x.op),
                        x.offset.to_string(),
                        x.len.to_string(),
                        x.blocks.to_string(),
                    ],
                );
            }
        }
    }
    out
}

pub fn integrity(r: &Results) -> String {
    let mut out = format!("{INTEGRITY_HEADER}\n");
    for s in &r.setups {
        for rep in &s.repetitions {
            for b in &rep.integrity.bad {
                let _ = writeln!(
                    out,
                    "{},{},{},{},{},{},{}",
                    field(&s.name),
                    rep.index,
                    field(b.file.as_deref().unwrap_or("")),
                    b.offset,
                    field(&b.kind),
                    field(b.errno.as_deref().unwrap_or("")),
                    b.expected_id
                );
            }
        }
    }
    out
}

pub const SLOWDOWN_HEADER: &str = "setup,source,op,metric,pairs,baseline,injected,slowdown,ci_low,ci_high,distinguishable";

/// One row per setup, source, op and metric of `slowdown` (setups with baseline runs only);
/// an empty interval where there is none (fewer than two pairs).
pub fn slowdown(r: &Results) -> String {
    let mut out = format!("{SLOWDOWN_HEADER}\n");
    let opt = |v: Option<f64>| v.map(|x| x.to_string()).unwrap_or_default();
    for s in &r.setups {
        for x in &s.slowdown {
            row(
                &mut out,
                &[
                    field(&s.name),
                    field(&x.source),
                    field(&x.op),
                    field(&x.metric),
                    x.pairs.to_string(),
                    x.baseline.to_string(),
                    x.injected.to_string(),
                    x.slowdown.to_string(),
                    opt(x.ci_low),
                    opt(x.ci_high),
                    x.distinguishable.to_string(),
                ],
            );
        }
    }
    out
}

pub const MONITOR_HEADER: &str = "setup,repetition,device,layer,op,count,bytes,mean_us,p50_us,p95_us,p99_us,max_us";

/// The BPF monitor's rows (docs/monitor.md): block layer per device, syscall and tracepoint
/// pairs (fs, journal, driver, user) with device `-`, and the disk daemon's means per device
/// (`daemon_service`, `daemon_delay`; percentiles empty).
pub fn monitor(r: &Results) -> String {
    let mut out = format!("{MONITOR_HEADER}\n");
    for s in &r.setups {
        for rep in &s.repetitions {
            let Some(m) = &rep.monitor else { continue };
            let rows =
                m.devices.iter().flat_map(|d| d.layers.iter().map(move |l| (d.device.as_str(), l))).chain(m.syscalls.iter().chain(&m.stack).map(|l| ("-", l)));
            for (dev, l) in rows {
                let _ = writeln!(
                    out,
                    "{},{},{},{},{},{},{},{:.3},{:.3},{:.3},{:.3},{:.3}",
                    field(&s.name),
                    rep.index,
                    field(dev),
                    field(&l.layer),
                    field(&l.op),
                    l.count,
                    l.bytes,
                    l.mean_us,
                    l.p50_us,
                    l.p95_us,
                    l.p99_us,
                    l.max_us
                );
            }
            // the disk daemon's part (no histogram: means only)
            for d in &m.devices {
                for (op, o) in &d.daemon {
                    for (layer, mean) in [("daemon_service", o.service_mean_us), ("daemon_delay", o.delay_mean_us)] {
                        let _ = writeln!(out, "{},{},{},{layer},{},{},0,{mean:.3},,,,", field(&s.name), rep.index, field(&d.device), field(op), o.count);
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(field("plain"), "plain");
        assert_eq!(field("a,b"), "\"a,b\"");
        assert_eq!(field("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(field("two\nlines"), "\"two\nlines\"");
    }
}
