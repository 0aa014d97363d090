//! `faultline host`: host faults on running processes, from a file and/or inline YAML, until
//! the last window ends, `--duration`, or Ctrl-C; then a table (or JSON) of what each did.

use crate::host::{HostFaultRecord, Restart, Schedule, Targets, check};
use crate::spec::host::{HostFault, parse_host_faults};
use anyhow::{Context, Result, bail};
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

pub fn run(file: Option<&Path>, inline: &[String], pids: &[u32], duration: Option<Duration>, restart: Option<String>, json: bool) -> Result<()> {
    let mut faults: Vec<HostFault> = Vec::new();
    if let Some(f) = file {
        let text = crate::spec::read_text(f, "host faults file").map_err(anyhow::Error::msg)?;
        faults.extend(parse_host_faults(&text, &f.display().to_string()).map_err(anyhow::Error::msg)?);
    }
    for (i, y) in inline.iter().enumerate() {
        let doc = format!("host_faults:\n  - {y}\n");
        faults.extend(parse_host_faults(&doc, &format!("--fault #{}", i + 1)).map_err(anyhow::Error::msg)?);
    }
    if faults.is_empty() {
        bail!("no host faults: give a file with `host_faults: [...]` or --fault '{{type: cpu, share: 50%}}'");
    }
    for p in pids {
        // faultline never acts on itself: frozen, nothing would thaw it; killed, nothing would
        // revert the other faults
        if *p == std::process::id() {
            bail!("--pid {p} is this faultline process itself; give the processes to act on");
        }
        if crate::sys::process::start_time(*p).is_none() {
            bail!("process {p} is not running");
        }
    }
    check(&faults, restart.is_some())?;
    // without --duration: run to the last window's end, unless a fault is sticky
    let end = duration.or_else(|| faults.iter().map(|f| f.to).collect::<Option<Vec<_>>>().and_then(|v| v.into_iter().max()));
    let restart: Option<Restart> = restart.map(|cmd| -> Restart { Box::new(move || spawn_detached(&cmd)) });
    let mut signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM])?;
    let t0 = Instant::now();
    let sched = Schedule::start(faults, Targets { pids: pids.to_vec(), restart }, t0)?;
    eprintln!(
        "host faults on pid {} {}",
        pids.iter().map(|p| p.to_string()).collect::<Vec<_>>().join(", "),
        match end {
            Some(d) => format!("for {}", crate::spec::units::format_duration(d)),
            None => "until Ctrl-C".into(),
        }
    );
    while end.is_none_or(|d| t0.elapsed() < d) && signals.pending().next().is_none() {
        let left = end.map_or(Duration::from_millis(50), |d| d.saturating_sub(t0.elapsed()));
        std::thread::sleep(left.min(Duration::from_millis(50)));
    }
    let records = sched.stop();
    let mut out = std::io::stdout().lock();
    if json {
        writeln!(out, "{}", serde_json::to_string_pretty(&records)?)?;
    } else {
        write!(out, "{}", table(&records))?;
    }
    Ok(())
}

/// Start the restart command in its own session: it replaces the target, so it outlives us.
fn spawn_detached(cmd: &str) -> Result<Vec<u32>> {
    use std::os::unix::process::CommandExt;
    let mut c = std::process::Command::new("sh");
    c.args(["-c", cmd]).stdin(std::process::Stdio::null());
    // SAFETY: setsid is async-signal-safe and touches no memory of the parent.
    unsafe {
        c.pre_exec(|| nix::unistd::setsid().map(|_| ()).map_err(std::io::Error::from));
    }
    let child = c.spawn().with_context(|| format!("cannot run the restart command `{cmd}`"))?;
    Ok(vec![child.id()])
}

pub fn table(records: &[HostFaultRecord]) -> String {
    let mut s = format!("{:<28} {:>9} {:>9}  {}\n", "fault", "applied", "reverted", "realized");
    let at = |t: Option<f64>| t.map_or("-".into(), |t| format!("{t:.3}s"));
    for r in records {
        let mut what = Vec::new();
        if let Some(c) = r.target_cpus_used {
            what.push(format!("targets used {c:.2} CPUs"));
        }
        if let Some(c) = r.cpus_taken {
            what.push(format!("spinners took {c:.2} CPUs"));
        }
        if let Some(p) = r.memory_peak {
            what.push(format!("memory peak {}", crate::spec::units::format_size(p)));
        }
        if let Some(h) = r.memory_limit_hits {
            what.push(format!("limit hit {h} times"));
        }
        if let Some(h) = r.held {
            what.push(format!("held {}", crate::spec::units::format_size(h)));
        }
        if !r.killed.is_empty() {
            what.push(format!("killed {:?}", r.killed));
        }
        if !r.restarted.is_empty() {
            what.push(format!("restarted as {:?}", r.restarted));
        }
        if let Some(e) = &r.error {
            what.push(format!("error: {e}"));
        }
        what.extend(r.notes.iter().cloned());
        s += &format!("{:<28} {:>9} {:>9}  {}\n", r.description, at(r.applied_at_s), at(r.reverted_at_s), what.join("; "));
    }
    s
}
