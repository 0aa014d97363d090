//! The resource ledger: JSON files under /run/faultline/runs, one per unit a process builds
//! (a served disk, a file-system stack, a command), named `<pid>-<n>.json` so one process can
//! hold several. Each is rewritten before and after a resource is created (mount point, FUSE
//! mount, loop device, control socket, file-system mount, process group). `cleanup` releases
//! the resources of processes that are gone, in an order that cannot hang (docs/architecture.md):
//! FUSE connections aborted first, then what sits on the devices (process groups, file-system
//! mounts), then loop devices, FUSE mounts, sockets and directories, each step time-limited.

use super::{fusectl, limit, loopdev, mount, process};
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Duration;

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
    /// The process this one serves disks for (pid, start time): a disk server started by
    /// `faultline run` ends, releasing what its owner built on its disks, when the owner dies.
    pub owner: Option<(u32, u64)>,
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
    /// Control groups made for host faults (thawed, emptied and removed before anything else).
    pub cgroups: Vec<super::cgroup::CgroupRecord>,
    /// Network namespaces (by `ip netns` name) of emulated hosts (src/net): their processes
    /// are killed and the namespaces deleted, which takes their TUN and veth devices along.
    pub netns: Vec<String>,
    /// The control socket of a network relay (`faultline net up`), apart from a disk's.
    pub net_socket: Option<PathBuf>,
    /// nftables tables (family inet) of network faults an agent applied on this host.
    pub nft_tables: Vec<String>,
    /// Network devices made in this process's own namespace (an agent's TUN device, whose
    /// routes go with it).
    pub net_devices: Vec<String>,
    /// Sysctl files changed, with the value found (put back).
    pub sysctls: Vec<(PathBuf, String)>,
    /// The network namespace the ledger was made in (inode of its ns file): the nftables
    /// tables, devices and sysctls above are that namespace's, wherever `cleanup` runs.
    pub net_ns: Option<u64>,
}

pub struct LedgerFile {
    path: PathBuf,
    /// Process-unique number of this ledger; names its file and the unit's directories.
    pub seq: u64,
    pub data: Ledger,
}

static NEXT_SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The process this one serves disks for, recorded in every ledger it creates (`Ledger::owner`).
static OWNER: std::sync::OnceLock<(u32, u64)> = std::sync::OnceLock::new();

/// Make this process a disk server of `pid` (call before the first ledger is created).
pub fn set_owner(pid: u32) -> Result<(u32, u64)> {
    let start = process::start_time(pid).with_context(|| format!("process {pid} (the owner) is not running"))?;
    let _ = OWNER.set((pid, start));
    Ok((pid, start))
}

/// The process a disk server's ledgers name as their owner.
pub fn owner_of(pid: u32) -> Option<u32> {
    all().into_iter().find(|(_, l)| l.pid == pid).and_then(|(_, l)| l.owner).map(|(p, _)| p)
}

impl LedgerFile {
    /// A new ledger of this process (one per unit: served disk, stack, command).
    pub fn create() -> Result<LedgerFile> {
        let dir = ledger_dir();
        std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let pid = std::process::id();
        let seq = NEXT_SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let data = Ledger {
            pid,
            start_time: process::start_time(pid).unwrap_or(0),
            owner: OWNER.get().copied(),
            net_ns: ns_inode(Path::new("/proc/thread-self/ns/net")),
            ..Default::default()
        };
        let path = dir.join(format!("{pid}-{seq}.json"));
        // a file of that name is left by a dead process whose pid we now have: release its
        // resources before our own records overwrite it
        if let Ok(old) = std::fs::read(&path).map_err(anyhow::Error::from).and_then(|b| Ok(serde_json::from_slice::<Ledger>(&b)?))
            && old.start_time != data.start_time
        {
            let mut log = Vec::new();
            release_upper(&old, &mut log);
            release(&old, &mut log);
            for l in log {
                eprintln!("faultline: stale ledger {}: {l}", path.display());
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
    let Ok(rd) = std::fs::read_dir(ledger_dir()) else {
        return vec![];
    };
    rd.flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .filter_map(|e| {
            let l: Ledger = serde_json::from_slice(&std::fs::read(e.path()).ok()?).ok()?;
            Some((e.path(), l))
        })
        .collect()
}

fn is_alive(l: &Ledger) -> bool {
    process::is_running(l.pid, l.start_time)
}

/// Limits of the steps of a release: none may hang `cleanup` or a server's teardown.
const UNMOUNT_LIMIT: Duration = Duration::from_secs(10);
const DETACH_LIMIT: Duration = Duration::from_secs(15);
/// How long an orphaned disk server gets to finish its own teardown before it is stopped.
const ORPHAN_GRACE: Duration = Duration::from_secs(10);

/// Release everything recorded by dead processes. Returns one line per action, including what
/// could not be released and why (its ledger is then kept for the next `cleanup`).
pub fn cleanup() -> Vec<String> {
    let mut done = Vec::new();
    // a dead run may have frozen its own disk server (a host fault's freeze): thawed, the
    // server sees its owner gone and tears itself down, instead of being killed frozen below
    // and leaving its records for the next `cleanup`
    for (_, l) in all().iter().filter(|(_, l)| !is_alive(l)) {
        release_cgroups(l, &mut done);
    }
    stop_orphans(&mut done);
    // a process group killed below may hold a faultline process with ledgers of its own (an
    // agent's command): once it is gone, its ledgers are dead too and get the next pass
    let mut seen = std::collections::HashSet::new();
    for _ in 0..3 {
        let dead: Vec<(PathBuf, Ledger)> = all().into_iter().filter(|(p, l)| !is_alive(l) && !seen.contains(p)).collect();
        if dead.is_empty() {
            break;
        }
        seen.extend(dead.iter().map(|(p, _)| p.clone()));
        let killed = cleanup_pass(&dead, &mut done);
        if killed.is_empty() {
            break;
        }
        wait_ledgers_of(&killed);
    }
    done
}

/// Wait (bounded) until the faultline processes in the killed process groups have ended: a
/// killed process may take a while to exit (its TUN device or sockets are torn down under the
/// kernel's network lock).
fn wait_ledgers_of(groups: &[i32]) {
    let t = std::time::Instant::now();
    while t.elapsed() < Duration::from_secs(30) {
        let live = all().into_iter().any(|(_, l)| is_alive(&l) && process::group_of(l.pid).is_some_and(|g| groups.contains(&g)));
        if !live {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One release pass over dead ledgers; returns the process groups it killed.
fn cleanup_pass(dead: &[(PathBuf, Ledger)], done: &mut Vec<String>) -> Vec<i32> {
    let before = done.len();
    // a frozen process (a host fault's freeze) may be the one everything else waits for
    for (_, l) in dead {
        release_cgroups(l, done);
    }
    // a dead server's FUSE connection may hold a killed process in uninterruptible sleep,
    // and with it every unmount below: abort the connections before anything else
    for (_, l) in dead {
        abort_fuse(l, done);
    }
    // a dead process's command keeps its file system busy, and the file system may sit on a
    // loop device recorded in another of its ledgers: kill every process group first, then
    // unmount every file system, and only then let devices go
    for (_, l) in dead {
        release_procs(l, done);
    }
    for (_, l) in dead {
        release_upper(l, done);
    }
    let mut pids = Vec::new();
    for (path, l) in dead {
        if release(l, done) {
            let _ = std::fs::remove_file(path);
            if !pids.contains(&l.pid) {
                pids.push(l.pid);
            }
        } else {
            done.push(format!("kept {} for the next `faultline cleanup`", path.display()));
        }
    }
    for pid in pids {
        done.push(format!("forgot run of pid {pid}"));
    }
    let killed: Vec<i32> = dead.iter().flat_map(|(_, l)| l.procs.iter().map(|p| p.0)).collect();
    if done[before..].iter().any(|d| d.starts_with("killed process group")) { killed } else { Vec::new() }
}

/// Disk servers whose owner died tear themselves down; one that does not finish in time (or
/// ignores the owner's death) is stopped, so its resources can be released here.
fn stop_orphans(log: &mut Vec<String>) {
    let orphans: Vec<Ledger> = all().into_iter().map(|(_, l)| l).filter(|l| is_alive(l) && l.owner.is_some_and(|(p, t)| !process::is_running(p, t))).collect();
    let t = std::time::Instant::now();
    for l in &orphans {
        while is_alive(l) && t.elapsed() < ORPHAN_GRACE {
            std::thread::sleep(Duration::from_millis(20));
        }
        if is_alive(l) {
            use nix::sys::signal::Signal;
            process::signal(l.pid, l.start_time, Signal::SIGTERM);
            let t2 = std::time::Instant::now();
            while is_alive(l) && t2.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(20));
            }
            if is_alive(l) {
                process::signal(l.pid, l.start_time, Signal::SIGKILL);
                log.push(format!("killed disk server {} (its run had died and it did not finish)", l.pid));
                let t3 = std::time::Instant::now();
                while is_alive(l) && t3.elapsed() < Duration::from_secs(5) {
                    std::thread::sleep(Duration::from_millis(20));
                }
            } else {
                log.push(format!("stopped disk server {} (its run had died)", l.pid));
            }
        }
    }
}

/// Thaw, empty and remove the control groups of host faults.
fn release_cgroups(l: &Ledger, log: &mut Vec<String>) {
    for c in &l.cgroups {
        if c.path.exists() {
            match super::cgroup::release(c) {
                Ok(()) => log.push(format!("removed cgroup {} (its processes back in {})", c.path.display(), c.restore_to.display())),
                Err(e) => log.push(format!("could not remove cgroup {}: {e:#}", c.path.display())),
            }
        }
    }
}

/// Abort the FUSE connections behind a dead ledger's mounts (see sys/fusectl.rs).
fn abort_fuse(l: &Ledger, log: &mut Vec<String>) {
    for m in &l.mounts {
        if let Some(n) = fusectl::connection_of(m) {
            match fusectl::abort(n) {
                Ok(true) => log.push(format!("aborted FUSE connection {n} of {}", m.display())),
                Ok(false) => {}
                Err(e) => log.push(format!("could not abort FUSE connection {n} of {}: {e:#}", m.display())),
            }
        }
    }
}

fn release_procs(l: &Ledger, log: &mut Vec<String>) {
    for &(pgid, st) in &l.procs {
        if process::kill_group(pgid, st) {
            log.push(format!("killed process group {pgid}"));
            // give the kernel a moment to close their files, so the unmount below is clean
            let t = std::time::Instant::now();
            while process::group_exists(pgid) && t.elapsed() < Duration::from_secs(5) {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

/// Unmount a file system, time-limited; the error names what is stuck.
pub fn unmount_fs(m: &Path) -> Result<bool> {
    if let Ok(f) = std::fs::File::open(m) {
        let _ = nix::unistd::syncfs(&f);
    }
    let p = m.to_owned();
    limit::within(UNMOUNT_LIMIT, &format!("unmounting {}", m.display()), move || mount::unmount(&p, Duration::from_secs(3)))
}

/// What sits on top of the devices: process groups, then file-system mounts.
pub fn release_upper(l: &Ledger, log: &mut Vec<String>) {
    release_procs(l, log);
    for m in &l.fs_mounts {
        if mount::is_mounted(m) {
            match unmount_fs(m) {
                Ok(false) => log.push(format!("unmounted {}", m.display())),
                Ok(true) => log.push(format!("unmounted {} lazily (it was busy)", m.display())),
                Err(e) => log.push(format!("could not unmount {}: {e:#}", m.display())),
            }
        }
    }
}

/// Release what a dead owner built on top of its disks (process groups, file-system mounts)
/// and forget its ledgers: a disk server does this before its own teardown. The owner's
/// hosts (network namespaces) are left to `faultline cleanup`: the server may run in one,
/// and deleting it stops every process inside, the server first.
pub fn release_owner(pid: u32, start_time: u64, log: &mut Vec<String>) {
    for (path, l) in all().into_iter().filter(|(_, l)| l.pid == pid && l.start_time == start_time) {
        release_upper(&l, log);
        if l.netns.is_empty() && release(&l, log) {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Undo a ledger's devices in safe order (call `release_upper` first): loop devices, FUSE
/// mounts, then socket and dirs. Returns false if something had to be left (said in `log`).
pub fn release(l: &Ledger, log: &mut Vec<String>) -> bool {
    release_cgroups(l, log);
    let mut complete = l.cgroups.iter().all(super::cgroup::gone);
    for (dev, backing) in &l.loops {
        match loopdev::backing_file(dev) {
            Some(b) if b == *backing => {
                // a mount nobody recorded (the user's own) keeps the device busy: say so, and
                // leave the device rather than pull it from under that mount
                let above = loopdev::dev_number(dev).map(mount::on_device).unwrap_or_default();
                if let Some(m) = above.first() {
                    let ours = l.fs_mounts.contains(m);
                    log.push(format!(
                        "could not detach {}: it is still mounted on {}{}; unmount it, then run `faultline cleanup` again",
                        dev.display(),
                        m.display(),
                        if ours { "" } else { ", which faultline did not record" }
                    ));
                    complete = false;
                    continue;
                }
                restore_rq_affinity(l, dev, log);
                let d = dev.clone();
                match limit::within(DETACH_LIMIT, &format!("detaching {}", dev.display()), move || loopdev::detach(&d)) {
                    Ok(()) => log.push(format!("detached {}", dev.display())),
                    Err(e) => {
                        log.push(format!("could not detach {}: {e:#}", dev.display()));
                        complete = false;
                    }
                }
            }
            // detached (by hand, or a teardown cut short): the setting outlives the
            // attachment and a later `losetup` of the device inherits it, so put it back
            None => restore_rq_affinity(l, dev, log),
            Some(_) => {} // reused by someone else: not ours any more
        }
    }
    if !complete {
        return false;
    }
    for m in &l.mounts {
        if mount::is_mounted(m) {
            let p = m.clone();
            match limit::within(UNMOUNT_LIMIT, &format!("unmounting {}", m.display()), move || mount::unmount(&p, Duration::from_secs(1))) {
                Ok(_) => log.push(format!("unmounted {}", m.display())),
                Err(e) => {
                    log.push(format!("could not unmount {}: {e:#}", m.display()));
                    complete = false;
                }
            }
        }
    }
    for n in &l.netns {
        match super::netns::delete(n) {
            Ok(done) => log.extend(done),
            Err(e) => {
                log.push(format!("could not delete network namespace {n}: {e:#}"));
                complete = false;
            }
        }
    }
    release_net(l, log);
    if let Some(s) = &l.socket {
        let _ = std::fs::remove_file(s);
    }
    if let Some(s) = &l.net_socket {
        let _ = std::fs::remove_file(s);
    }
    for d in l.dirs.iter().rev() {
        if std::fs::remove_dir(d).is_ok() {
            log.push(format!("removed {}", d.display()));
        }
    }
    complete
}

/// The inode of a namespace file (`/proc/PID/ns/net`, `/run/netns/NAME`): a namespace's identity.
fn ns_inode(f: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(f).ok().map(|m| m.ino())
}

/// A file that opens network namespace `ino`: a named one's bind mount, or a process inside it.
fn find_net_ns(ino: u64) -> Option<PathBuf> {
    let named = std::fs::read_dir("/run/netns").into_iter().flatten().flatten().map(|e| e.path());
    let procs = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().bytes().all(|b| b.is_ascii_digit()))
        .map(|e| e.path().join("ns/net"));
    named.chain(procs).find(|f| ns_inode(f) == Some(ino))
}

/// An agent's network faults on a host: its nftables tables, devices, changed sysctls, undone
/// in the namespace they were made in (an agent may run inside one, e.g. `ip netns exec`):
/// entered from a thread of its own; none of it is done here, in another namespace, where
/// a device of the same name may be someone else's.
fn release_net(l: &Ledger, log: &mut Vec<String>) {
    if l.nft_tables.is_empty() && l.net_devices.is_empty() && l.sysctls.is_empty() {
        return;
    }
    let Some(ino) = l.net_ns.filter(|i| ns_inode(Path::new("/proc/thread-self/ns/net")) != Some(*i)) else {
        return release_net_here(l, log);
    };
    let Some(f) = find_net_ns(ino) else {
        // nothing holds the namespace open any more: it is gone, with its tables and devices
        log.push(format!("network namespace {ino} of pid {}'s network faults is gone, and with it what they made", l.pid));
        return;
    };
    let l2 = l.clone();
    let entered = std::thread::spawn(move || -> Result<Vec<String>> {
        let ns = std::fs::File::open(&f).with_context(|| format!("cannot open {}", f.display()))?;
        nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).with_context(|| format!("cannot enter {}", f.display()))?;
        let mut log = Vec::new();
        release_net_here(&l2, &mut log);
        Ok(log)
    })
    .join();
    match entered {
        Ok(Ok(done)) => log.extend(done),
        Ok(Err(e)) => log.push(format!("could not undo pid {}'s network faults in namespace {ino}: {e:#}", l.pid)),
        Err(_) => log.push(format!("could not undo pid {}'s network faults in namespace {ino}", l.pid)),
    }
}

/// `release_net` in the calling thread's namespace.
fn release_net_here(l: &Ledger, log: &mut Vec<String>) {
    for t in &l.nft_tables {
        let ok = std::process::Command::new("nft").args(["delete", "table", "inet", t]).stderr(std::process::Stdio::null()).status().is_ok_and(|s| s.success());
        if ok {
            log.push(format!("deleted nftables table inet {t}"));
        }
    }
    for d in &l.net_devices {
        let ok = std::process::Command::new("ip").args(["link", "del", d]).stderr(std::process::Stdio::null()).status().is_ok_and(|s| s.success());
        if ok {
            log.push(format!("deleted network device {d}"));
        }
    }
    for (f, v) in &l.sysctls {
        if std::fs::read_to_string(f).is_ok_and(|now| now.trim() != v) && std::fs::write(f, v).is_ok() {
            log.push(format!("restored {} to {v}", f.display()));
        }
    }
}

/// Put back the rq_affinity found on one of our loop devices, if the run changed it.
fn restore_rq_affinity(l: &Ledger, dev: &Path, log: &mut Vec<String>) {
    for (d, v) in l.rq_affinity.iter().filter(|(d, _)| d == dev) {
        // a device node that is gone has nothing to restore
        if loopdev::rq_affinity(d).is_ok_and(|now| now != *v) {
            match loopdev::set_rq_affinity(d, *v) {
                Ok(()) => log.push(format!("restored rq_affinity {v} on {}", d.display())),
                Err(e) => log.push(format!("could not restore rq_affinity on {}: {e:#}", d.display())),
            }
        }
    }
}
