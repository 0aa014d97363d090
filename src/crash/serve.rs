//! Serving crash states: one disk over the overlay store (`overlay`), as a loop device, whose
//! state is switched on request. The explorer starts it as a child process (`faultline crash
//! serve-states`, hidden) and never serves the device it mounts and reads itself: a process
//! that did both could not finish dying when killed while its own I/O waits for its own FUSE
//! server (docs/architecture.md). `faultline crash replay` serves one state the same way.

use super::overlay::{Overlay, OverlayStore};
use super::states::{self, StateId};
use crate::disk::Disk;
use crate::disk::logwrites::Log;
use crate::stack::served::{Exposure, ServedDisk};
use crate::sys::ledger;
use anyhow::{Context, Result};
use std::io::{BufRead, Write};
use std::path::Path;
use std::sync::Arc;

/// What the served device is made of.
pub struct Source<'a> {
    pub log: &'a Path,
    pub size: u64,
    pub block_size: u32,
    pub seed: u64,
    /// The FUSE transport.
    pub ring: crate::spec::disk::RingMode,
}

fn serve(src: &Source, socket: Option<&Path>) -> Result<(ServedDisk, Arc<Overlay>, Log)> {
    let log = Log::open(src.log)?;
    let overlay = Overlay::new(src.size)?;
    let disk = Disk::over(Box::new(OverlayStore(overlay.clone())), src.block_size, None);
    let served = ServedDisk::start_disk(disk, &crate::frontend::Options { ring: src.ring, ..Default::default() }, &Exposure::default(), socket)?;
    Ok((served, overlay, log))
}

/// The explorer's child: prints the device, then for each state id read from stdin switches
/// to it and answers `ok` (or `error: ...`). Ends at the end of stdin: when the explorer is
/// gone without tearing down (killed), what it mounted on the device is released first.
pub fn serve_states(src: &Source, owned_by: u32) -> Result<()> {
    let owner = ledger::set_owner(owned_by)?;
    let (served, overlay, log) = serve(src, None)?;
    let eps = states::epochs(&log);
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", served.device().display())?;
    out.flush()?;
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let reply = line
            .trim()
            .parse::<StateId>()
            .and_then(|id| states::plan(&log, &eps, id, src.seed))
            .and_then(|p| overlay.switch(&log, &p))
            .map_or_else(|e| format!("error: {e:#}"), |_| "ok".into());
        writeln!(out, "{reply}")?;
        out.flush()?;
    }
    // stdin closed: the explorer finished (it unmounted first) or died; in that case wait
    // until none of its threads is left, then release what it mounted
    let (pid, start) = owner;
    let t = std::time::Instant::now();
    while crate::sys::process::is_running(pid, start) && t.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(10));
        if crate::sys::process::is_gone(pid, start) {
            break;
        }
    }
    if !crate::sys::process::is_running(pid, start) {
        let mut notes = Vec::new();
        ledger::release_owner(pid, start, &mut notes);
        for n in notes {
            eprintln!("faultline: explorer {pid} is gone: {n}");
        }
    }
    served.teardown()
}

/// `faultline crash replay`: serve state `id` until SIGINT/SIGTERM, printing the device first.
pub fn replay(src: &Source, id: StateId, describe: impl FnOnce(&Path)) -> Result<()> {
    let mut signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM])?;
    let log = Log::open(src.log)?;
    let eps = states::epochs(&log);
    let plan = states::plan(&log, &eps, id, src.seed)?;
    drop(log);
    let socket = ledger::run_dir().join(format!("{}.sock", std::process::id()));
    let (served, overlay, log) = serve(src, Some(&socket))?;
    overlay.switch(&log, &plan).with_context(|| format!("cannot build state {id}"))?;
    // the device's buffer cache may hold what the kernel read at attach time
    crate::crash::explore::flush_buffers(served.device())?;
    println!("{}", served.device().display());
    describe(served.device());
    let _ = signals.forever().next();
    eprintln!("faultline: tearing down");
    served.teardown()
}
