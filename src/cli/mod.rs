//! The subcommands: each parses its own arguments (clap) and drives the library.
//! `src/main.rs` is the command tree and dispatches to these.

pub mod agent;
pub mod calibrate;
pub mod crash;
pub mod fault;
pub mod host;
pub mod monitor;
pub mod net;
pub mod profile;
pub mod serve;
pub mod workload;

use crate::sys::ledger::{self, Ledger};
use anyhow::{Result, bail};
use std::path::PathBuf;
use std::time::Duration;

/// A size flag (`4KiB`, `1GiB`).
pub fn size_arg(s: &str) -> Result<u64, String> {
    crate::spec::units::parse_size(s)
}

/// `monitor --duration`, `host --duration`: more than 0 (a zero duration would do nothing and
/// still report success).
pub fn positive_duration(s: &str) -> Result<Duration, String> {
    let d = crate::spec::units::parse_duration(s)?;
    if d.is_zero() {
        return Err(format!("`{s}` ends before anything is done; allowed: more than 0 (or leave it out: until Ctrl-C)"));
    }
    Ok(d)
}

/// The control socket to talk to: `given`, else the only live process (by the ledger) whose
/// ledger names one through `socket_of`; `what` names those processes in errors.
pub fn find_socket(given: Option<PathBuf>, socket_of: impl Fn(&Ledger) -> Option<PathBuf>, what: &str) -> Result<PathBuf> {
    if let Some(s) = given {
        return Ok(s);
    }
    let live: Vec<PathBuf> = ledger::live().iter().filter_map(socket_of).collect();
    match live.len() {
        1 => Ok(live.into_iter().next().unwrap()),
        0 => bail!("no running {what} found; start one or pass --socket"),
        n => {
            bail!("{n} {what} processes are running; pick one with --socket ({})", live.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "))
        }
    }
}
