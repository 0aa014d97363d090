//! The resource ledger: JSON files under /run/faultline/runs, one per unit a process builds
//! (a served disk, a file-system stack, a command), named `<pid>-<n>.json` so one process can
//! hold several. Each is rewritten before and after a resource is created (mount point, FUSE
//! mount, loop device, control socket, file-system mount, process group). `cleanup` releases
//! the resources of processes that are gone: first what sits on top of the devices (process
//! groups, file-system mounts) for every dead ledger, then loop devices, FUSE mounts, sockets
//! and directories.

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
#[serde(default)] // ledgers written by older versions lack the newer fields
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
    /// File-system mounts on our loop devices (released before any loop device or FUSE mount).
    pub fs_mounts: Vec<PathBuf>,
    /// Process groups we started (pgid, start time of the leader), killed before unmounting.
    pub procs: Vec<(i32, u64)>,
    /// Our loop devices' rq_affinity as found (frontend/steer.rs), put back before detaching.
    pub rq_affinity: Vec<(PathBuf, u8)>,
}

pub struct LedgerFile {
    path: PathBuf,
    /// Process-unique number of this ledger; names its file and the unit's directories.
    pub seq: u64,
    pub data: Ledger,
}

static NEXT_SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

pub fn proc_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // fields after the command (which may contain spaces) start after the last ')'
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split(' ').nth(19)?.parse().ok()
}

impl LedgerFile {
    /// A new ledger of this process (one per unit: served disk, stack, command).
    pub fn create() -> Result<LedgerFile> {
        let dir = ledger_dir();
        std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let pid = std::process::id();
        let seq = NEXT_SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let data = Ledger { pid, start_time: proc_start_time(pid).unwrap_or(0), ..Default::default() };
        let path = dir.join(format!("{pid}-{seq}.json"));
        // a file of that name is left by a dead process whose pid we now have: release its
        // resources before our own records overwrite it
        if let Ok(old) = std::fs::read(&path).map_err(anyhow::Error::from).and_then(|b| Ok(serde_json::from_slice::<Ledger>(&b)?)) {
            if old.start_time != data.start_time {
                let mut log = Vec::new();
                release(&old, &mut log);
                for l in log {
                    eprintln!("faultline: stale ledger {}: {l}", path.display());
                }
            }
        }
        let f = LedgerFile { path, seq, data };
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
    let dead: Vec<(PathBuf, Ledger)> = all().into_iter().filter(|(_, l)| !is_alive(l)).collect();
    // a dead process's command keeps its file system busy, and the file system may sit on a
    // loop device recorded in another of its ledgers: kill every process group first, then
    // unmount every file system, and only then let devices go
    for (_, l) in &dead {
        release_procs(l, &mut done);
    }
    for (_, l) in &dead {
        release_upper(l, &mut done);
    }
    let mut pids = Vec::new();
    for (path, l) in &dead {
        release(l, &mut done);
        let _ = std::fs::remove_file(path);
        if !pids.contains(&l.pid) {
            pids.push(l.pid);
        }
    }
    for pid in pids {
        done.push(format!("forgot run of pid {pid}"));
    }
    done
}

/// Kill a process group we started, unless its leader's pid now belongs to someone else.
pub fn kill_group(pgid: i32, start_time: u64) -> bool {
    if pgid <= 1 {
        return false;
    }
    match proc_start_time(pgid as u32) {
        Some(t) if t != start_time => false, // pid recycled: not our group
        // leader alive, or gone while members may remain (a pgid is not reused while the
        // group exists)
        _ => unsafe { libc::kill(-pgid, libc::SIGKILL) == 0 },
    }
}

fn group_exists(pgid: i32) -> bool {
    unsafe { libc::kill(-pgid, 0) == 0 }
}

fn release_procs(l: &Ledger, log: &mut Vec<String>) {
    for &(pgid, st) in &l.procs {
        if kill_group(pgid, st) {
            log.push(format!("killed process group {pgid}"));
            // give the kernel a moment to close their files, so the unmount below is clean
            let t = std::time::Instant::now();
            while group_exists(pgid) && t.elapsed() < std::time::Duration::from_secs(5) {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
    }
}

/// What sits on top of the devices: process groups, then file-system mounts.
fn release_upper(l: &Ledger, log: &mut Vec<String>) {
    release_procs(l, log);
    for m in &l.fs_mounts {
        if is_mounted(m) {
            match crate::stack::fs::unmount_fs(m) {
                Ok(false) => log.push(format!("unmounted {}", m.display())),
                Ok(true) => log.push(format!("unmounted {} lazily (it was busy)", m.display())),
                Err(e) => log.push(format!("could not unmount {}: {e:#}", m.display())),
            }
        }
    }
}

/// Undo a ledger's resources in safe order: process groups and file-system mounts, loop
/// devices, FUSE mounts, then socket and dirs.
pub fn release(l: &Ledger, log: &mut Vec<String>) {
    release_upper(l, log);
    for (dev, backing) in &l.loops {
        match crate::frontend::loopdev::backing_file(dev) {
            Some(b) if b == *backing => {
                restore_rq_affinity(l, dev, log);
                match crate::frontend::loopdev::detach(dev) {
                    Ok(()) => log.push(format!("detached {}", dev.display())),
                    Err(e) => log.push(format!("could not detach {}: {e:#}", dev.display())),
                }
            }
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

/// Put back the rq_affinity found on one of our loop devices, if the run changed it.
fn restore_rq_affinity(l: &Ledger, dev: &Path, log: &mut Vec<String>) {
    for (d, v) in l.rq_affinity.iter().filter(|(d, _)| d == dev) {
        if crate::frontend::steer::read(d).ok() != Some(*v) {
            match crate::frontend::steer::write(d, *v) {
                Ok(()) => log.push(format!("restored rq_affinity {v} on {}", d.display())),
                Err(e) => log.push(format!("could not restore rq_affinity on {}: {e:#}", d.display())),
            }
        }
    }
}

pub fn is_mounted(p: &Path) -> bool {
    let Ok(m) = std::fs::read_to_string("/proc/self/mountinfo") else { return false };
    let want = p.to_string_lossy();
    m.lines().any(|l| l.split(' ').nth(4) == Some(&want))
}
