//! `faultline monitor`: time the block layer of devices and the I/O system calls of processes
//! with BPF (docs/monitor.md), print a table, write monitor.json.

use super::positive_duration;
use anyhow::{Context, Result, bail};
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Args)]
pub struct MonitorArgs {
    /// A block device to watch (repeat for several).
    #[arg(long, required_unless_present = "pid")]
    device: Vec<PathBuf>,
    /// A process whose I/O system calls to time, with the processes it forks from now on
    /// (repeat for several).
    #[arg(long)]
    pid: Vec<u32>,
    /// How long to watch (default: until Ctrl-C).
    #[arg(long, value_parser = positive_duration)]
    duration: Option<Duration>,
    /// Length of one interval of the time series (10ms or more).
    #[arg(long, default_value = "1s", value_parser = monitor_interval)]
    interval: Duration,
    /// Directory for monitor.json (created if missing).
    #[arg(long, short)]
    out: Option<PathBuf>,
    /// A tracepoint pair to time: NAME=SYS:ENTER,SYS:EXIT[,key=FIELD] (default key: the
    /// thread; repeat for several). The file-system, journal and driver layers of the
    /// devices are timed without asking.
    #[arg(long, value_parser = crate::monitor::pairs::Pair::parse_arg)]
    pair: Vec<crate::monitor::pairs::Pair>,
    /// Layers to time besides the block layer, comma-separated: fs, journal, driver
    /// (default: journal; docs/monitor.md says what each costs). `--pid` adds syscall.
    #[arg(long, value_delimiter = ',', default_values_t = crate::monitor::DEFAULT_MONITOR_LAYERS.iter().map(|l| l.to_string()).collect::<Vec<_>>(),
          value_parser = crate::monitor::parse_layer)]
    layers: Vec<String>,
}

pub fn monitor(a: MonitorArgs) -> Result<()> {
    watch(&a.device, &a.pid, a.duration, a.interval, a.out, a.pair, &a.layers)
}

/// `monitor --interval`: at least 10ms, as an experiment's `monitor: {interval}`.
fn monitor_interval(s: &str) -> Result<Duration, String> {
    let d = crate::spec::units::parse_duration(s)?;
    if d < Duration::from_millis(10) {
        return Err(format!("`{s}` is too short; allowed: 10ms or more"));
    }
    Ok(d)
}

fn watch(
    devices: &[PathBuf],
    pids: &[u32],
    duration: Option<Duration>,
    interval: Duration,
    out: Option<PathBuf>,
    pairs: Vec<crate::monitor::pairs::Pair>,
    layers: &[String],
) -> Result<()> {
    // found out only after the whole watch
    if let Some(o) = out.as_ref().filter(|o| o.exists() && !o.is_dir()) {
        bail!("--out {}: exists and is not a directory; give a directory for monitor.json (created if missing)", o.display());
    }
    let mut signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM])?;
    let (pm, pair_notes) = crate::monitor::start_pairs(devices, pids, pairs, layers, None)?;
    let sys = if pids.is_empty() { None } else { Some(crate::monitor::SyscallMonitor::start(pids, None)?) };
    let m = if devices.is_empty() { None } else { Some(crate::monitor::BlockMonitor::start(devices, interval, None)?) };
    let attach = m.as_ref().map(|m| m.attach).or(sys.as_ref().map(|s| s.attach)).unwrap_or("");
    let mut what: Vec<String> = devices.iter().map(|d| d.display().to_string()).collect();
    what.extend(pids.iter().map(|p| format!("pid {p}")));
    // the line tests and scripts wait for: from here on requests are timed
    println!(
        "monitoring {} ({attach}){}",
        what.join(", "),
        match duration {
            Some(d) => format!(" for {}", crate::spec::units::format_duration(d)),
            None => "; Ctrl-C to stop".into(),
        }
    );
    std::io::stdout().flush()?;
    let t = std::time::Instant::now();
    while duration.is_none_or(|d| t.elapsed() < d) && signals.pending().next().is_none() {
        let left = duration.map_or(Duration::from_millis(50), |d| d.saturating_sub(t.elapsed()));
        std::thread::sleep(left.min(Duration::from_millis(50)));
    }
    let mut res = match m {
        Some(m) => m.stop()?,
        None => crate::monitor::MonitorResults {
            schema: crate::monitor::model::SCHEMA,
            attach: attach.into(),
            interval_s: interval.as_secs_f64(),
            duration_s: t.elapsed().as_secs_f64(),
            ..Default::default()
        },
    };
    if let Some(s) = sys {
        res.add_syscalls(pids, s.stop()?);
    }
    if let Some(p) = pm {
        res.add_pairs(p.stop()?);
    }
    res.notes.extend(pair_notes);
    print!("{}", res.table());
    for n in &res.notes {
        println!("note: {n}");
    }
    if let Some(dir) = out {
        std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let path = dir.join("monitor.json");
        std::fs::write(&path, serde_json::to_string_pretty(&res)? + "\n").with_context(|| format!("cannot write {}", path.display()))?;
        println!("results: {}", path.display());
    }
    Ok(())
}
