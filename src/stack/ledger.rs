//! The resource ledger: one JSON file per live faultline process under /run/faultline/runs,
//! rewritten before and after each resource is created (mount point, FUSE mount, loop device,
//! control socket). `cleanup` releases the resources of processes that are gone.

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

pub fn run_dir() -> PathBuf {
    std::env::var_os("FAULTLINE_RUN_DIR").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/run/faultline"))
}

fn ledger_dir() -> PathBuf {
    run_dir().join("runs")
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Ledger {
    pub pid: u32,
    /// Process start time (clock ticks since boot, /proc/PID/stat field 22): tells a live
    /// process from a recycled pid.
    pub start_time: u64,
    /// Directories we created (removed last, innermost first).
    pub dirs: Vec<PathBuf>,
    /// FUSE mount points.
    pub mounts: Vec<PathBuf>,
    /// Loop devices with the file they must be backed by (never detach someone else's).
    pub loops: Vec<(PathBuf, PathBuf)>,
    pub socket: Option<PathBuf>,
    pub device: Option<PathBuf>,
}

pub struct LedgerFile {
    path: PathBuf,
    pub data: Ledger,
}

pub fn proc_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // fields after the command (which may contain spaces) start after the last ')'
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split(' ').nth(19)?.parse().ok()
}

impl LedgerFile {
    /// A ledger for this process.
    pub fn create() -> Result<LedgerFile> {
        let dir = ledger_dir();
        std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let pid = std::process::id();
        let data = Ledger { pid, start_time: proc_start_time(pid).unwrap_or(0), ..Default::default() };
        let f = LedgerFile { path: dir.join(format!("{pid}.json")), data };
        f.save()?;
        Ok(f)
    }

    /// Write atomically (tmp + rename) so a crash never leaves half a ledger.
    pub fn save(&self) -> Result<()> {
        let tmp = self.path.with_extension("tmp");
        std::fs::write(&tmp, serde_json::to_vec_pretty(&self.data)?)?;
        std::fs::rename(&tmp, &self.path).with_context(|| format!("cannot write ledger {}", self.path.display()))
    }

    pub fn update(&mut self, f: impl FnOnce(&mut Ledger)) -> Result<()> {
        f(&mut self.data);
        self.save()
    }

    pub fn remove(self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Ledgers of faultline processes that are still running.
pub fn live() -> Vec<Ledger> {
    all().into_iter().filter(|(_, l)| is_alive(l)).map(|(_, l)| l).collect()
}

fn all() -> Vec<(PathBuf, Ledger)> {
    let Ok(rd) = std::fs::read_dir(ledger_dir()) else { return vec![] };
    rd.flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .filter_map(|e| {
            let l: Ledger = serde_json::from_slice(&std::fs::read(e.path()).ok()?).ok()?;
            Some((e.path(), l))
        })
        .collect()
}

fn is_alive(l: &Ledger) -> bool {
    proc_start_time(l.pid).is_some_and(|t| t == l.start_time)
}

/// Release everything recorded by dead processes. Returns one line per action.
pub fn cleanup() -> Vec<String> {
    let mut done = Vec::new();
    for (path, l) in all() {
        if is_alive(&l) {
            continue;
        }
        release(&l, &mut done);
        let _ = std::fs::remove_file(&path);
        done.push(format!("forgot run of pid {}", l.pid));
    }
    done
}

/// Undo a ledger's resources in safe order: loop devices, then mounts, then socket and dirs.
pub fn release(l: &Ledger, log: &mut Vec<String>) {
    for (dev, backing) in &l.loops {
        match crate::frontend::loopdev::backing_file(dev) {
            Some(b) if b == *backing => match crate::frontend::loopdev::detach(dev) {
                Ok(()) => log.push(format!("detached {}", dev.display())),
                Err(e) => log.push(format!("could not detach {}: {e:#}", dev.display())),
            },
            _ => {} // gone, or reused by someone else: not ours any more
        }
    }
    for m in &l.mounts {
        if is_mounted(m) {
            match crate::frontend::unmount(m) {
                Ok(()) => log.push(format!("unmounted {}", m.display())),
                Err(e) => log.push(format!("could not unmount {}: {e:#}", m.display())),
            }
        }
    }
    if let Some(s) = &l.socket {
        let _ = std::fs::remove_file(s);
    }
    for d in l.dirs.iter().rev() {
        if std::fs::remove_dir(d).is_ok() {
            log.push(format!("removed {}", d.display()));
        }
    }
}

pub fn is_mounted(p: &Path) -> bool {
    let Ok(m) = std::fs::read_to_string("/proc/self/mountinfo") else { return false };
    let want = p.to_string_lossy();
    m.lines().any(|l| l.split(' ').nth(4) == Some(&want))
}
