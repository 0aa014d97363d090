//! Control groups, v1 or v2, whichever holds the controller: a child group made for a set of
//! processes, so their CPU, memory or run state can be limited and put back. The group is made
//! under the processes' own group in that hierarchy (limits of a container or service still
//! apply above it); where cgroup v2 forbids that (the parent has processes and would need the
//! controller for its children) it goes under the hierarchy's root instead.
//!
//! A `Group` is recorded in the ledger (`CgroupRecord`) before any process is moved in, so
//! `faultline cleanup` can thaw it, move its processes back and remove it after a crash.

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Version {
    V1,
    V2,
}

/// What cleanup needs to undo a group: where it is, and where its processes came from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CgroupRecord {
    pub path: PathBuf,
    pub version: Version,
    /// The group the processes were in, where they go back to.
    pub restore_to: PathBuf,
}

/// A mounted hierarchy that has a controller (`freezer`, `cpu`, `memory`).
#[derive(Clone, Debug, PartialEq)]
pub struct Hierarchy {
    pub root: PathBuf,
    pub version: Version,
}

/// The controllers a mount of type `cgroup` (v1) carries, from its options.
fn v1_controllers(opts: &str) -> Vec<&str> {
    opts.split(',').filter(|o| matches!(*o, "cpu" | "cpuacct" | "memory" | "freezer" | "cpuset" | "pids" | "blkio" | "io" | "devices")).collect()
}

/// Find the hierarchy that has `controller`: a v1 mount carrying it, else the v2 mount where
/// its root lists it (v2's freezer needs no controller: `cgroup.freeze` is in every group).
pub fn hierarchy(controller: &str) -> Option<Hierarchy> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
    hierarchy_in(&mounts, controller, |p| std::fs::read_to_string(p).ok())
}

fn hierarchy_in(mounts: &str, controller: &str, read: impl Fn(&Path) -> Option<String>) -> Option<Hierarchy> {
    let mut v2 = None;
    for line in mounts.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 4 {
            continue;
        }
        match f[2] {
            "cgroup" if v1_controllers(f[3]).contains(&controller) => return Some(Hierarchy { root: PathBuf::from(f[1]), version: Version::V1 }),
            "cgroup2" if v2.is_none() => v2 = Some(PathBuf::from(f[1])),
            _ => {}
        }
    }
    let root = v2?;
    let has = controller == "freezer" || read(&root.join("cgroup.controllers")).is_some_and(|c| c.split_whitespace().any(|x| x == controller));
    has.then_some(Hierarchy { root, version: Version::V2 })
}

/// The group of `pid` in hierarchy `h`, as a path under its root (`/` for the root).
pub fn group_of(pid: u32, h: &Hierarchy, controller: &str) -> Result<PathBuf> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).with_context(|| format!("process {pid} is not running"))?;
    group_in(&text, h.version, controller).with_context(|| format!("process {pid} is in no {controller} group"))
}

fn group_in(text: &str, version: Version, controller: &str) -> Option<PathBuf> {
    text.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, ctrls, path) = (f.next()?, f.next()?, f.next()?);
        let hit = match version {
            Version::V2 => ctrls.is_empty(),
            Version::V1 => ctrls.split(',').any(|c| c == controller),
        };
        hit.then(|| PathBuf::from(path))
    })
}

fn under(root: &Path, rel: &Path) -> PathBuf {
    root.join(rel.strip_prefix("/").unwrap_or(rel))
}

/// Processes of a group (`cgroup.procs`).
pub fn procs(path: &Path) -> Vec<u32> {
    std::fs::read_to_string(path.join("cgroup.procs")).map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect()).unwrap_or_default()
}

fn write(path: &Path, file: &str, value: &str) -> Result<()> {
    std::fs::write(path.join(file), value).with_context(|| format!("cannot write `{value}` to {}", path.join(file).display()))
}

/// One group made for a fault, with the processes moved into it.
pub struct Group {
    pub record: CgroupRecord,
    pub controller: &'static str,
}

impl Group {
    /// Make a group named `name` in the hierarchy that has `controller`, next to (under) the
    /// group of `pids[0]`. Nothing is moved yet: record it in the ledger, then call `adopt`.
    pub fn create(controller: &'static str, name: &str, pids: &[u32]) -> Result<Group> {
        let h = hierarchy(controller).with_context(|| format!("no cgroup hierarchy has the {controller} controller on this machine"))?;
        let first = *pids.first().context("no process to put in a cgroup")?;
        let from = under(&h.root, &group_of(first, &h, controller)?);
        let mut parent = from.clone();
        if h.version == Version::V2 && controller != "freezer" && parent != h.root && !enable_v2(&parent, controller) {
            // the parent holds processes, so it cannot delegate the controller: use the root
            parent = h.root.clone();
            if !enable_v2(&parent, controller) {
                bail!("cannot enable the {controller} controller in {}", parent.join("cgroup.subtree_control").display());
            }
        } else if h.version == Version::V2 && controller != "freezer" && !enable_v2(&parent, controller) {
            bail!("cannot enable the {controller} controller in {}", parent.join("cgroup.subtree_control").display());
        }
        let path = parent.join(name);
        std::fs::create_dir(&path).with_context(|| format!("cannot create cgroup {}", path.display()))?;
        Ok(Group { record: CgroupRecord { path, version: h.version, restore_to: from }, controller })
    }

    /// Move the processes in (each with all its threads).
    pub fn adopt(&self, pids: &[u32]) -> Result<()> {
        for p in pids {
            write(&self.record.path, "cgroup.procs", &p.to_string()).with_context(|| format!("cannot move process {p} into {}", self.record.path.display()))?;
        }
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.record.path
    }

    /// Limit the group to `cpus` CPUs' worth of time per period (v1 CFS quota, v2 cpu.max).
    pub fn set_cpu_limit(&self, cpus: f64, period: Duration) -> Result<()> {
        let period_us = period.as_micros().max(1000) as u64;
        let quota = ((cpus * period_us as f64).round() as u64).max(1000);
        match self.record.version {
            Version::V1 => {
                write(self.path(), "cpu.cfs_period_us", &period_us.to_string())?;
                write(self.path(), "cpu.cfs_quota_us", &quota.to_string())
            }
            Version::V2 => write(self.path(), "cpu.max", &format!("{quota} {period_us}")),
        }
    }

    /// CPU time the group's processes used since it was made.
    pub fn cpu_usage(&self) -> Option<Duration> {
        match self.record.version {
            // v1's cpu hierarchy usually shares its mount with cpuacct ("cpu,cpuacct"); where it
            // does not, the caller measures from /proc instead
            Version::V1 => std::fs::read_to_string(self.path().join("cpuacct.usage")).ok()?.trim().parse().ok().map(Duration::from_nanos),
            Version::V2 => {
                let s = std::fs::read_to_string(self.path().join("cpu.stat")).ok()?;
                s.lines().find_map(|l| l.strip_prefix("usage_usec ")).and_then(|v| v.trim().parse().ok()).map(Duration::from_micros)
            }
        }
    }

    /// Limit memory (v1 memory.limit_in_bytes, v2 memory.max): above it the kernel reclaims
    /// the group's pages, swaps, and in the end OOM-kills inside the group.
    pub fn set_memory_limit(&self, bytes: u64) -> Result<()> {
        match self.record.version {
            Version::V1 => write(self.path(), "memory.limit_in_bytes", &bytes.to_string()),
            Version::V2 => write(self.path(), "memory.max", &bytes.to_string()),
        }
    }

    /// Memory charged to the group now, and its peak where the kernel tracks one.
    pub fn memory_usage(&self) -> (Option<u64>, Option<u64>) {
        let read = |f: &str| std::fs::read_to_string(self.path().join(f)).ok().and_then(|s| s.trim().parse().ok());
        match self.record.version {
            Version::V1 => (read("memory.usage_in_bytes"), read("memory.max_usage_in_bytes")),
            Version::V2 => (read("memory.current"), read("memory.peak")),
        }
    }

    /// Freeze or thaw every process of the group, and wait until the kernel says it is done.
    pub fn set_frozen(&self, frozen: bool) -> Result<()> {
        set_frozen(&self.record, frozen)
    }

    /// Move the processes back where they came from, then remove the group.
    pub fn release(self) -> Result<()> {
        release(&self.record)
    }
}

/// Enable `controller` for the children of `parent` (v2); true when it is (or already was).
fn enable_v2(parent: &Path, controller: &str) -> bool {
    let on = |p: &Path| std::fs::read_to_string(p.join("cgroup.subtree_control")).is_ok_and(|s| s.split_whitespace().any(|c| c == controller));
    on(parent) || (std::fs::write(parent.join("cgroup.subtree_control"), format!("+{controller}")).is_ok() && on(parent))
}

const FREEZE_LIMIT: Duration = Duration::from_secs(5);

fn set_frozen(r: &CgroupRecord, frozen: bool) -> Result<()> {
    let t = Instant::now();
    match r.version {
        Version::V1 => {
            let want = if frozen { "FROZEN" } else { "THAWED" };
            write(&r.path, "freezer.state", want)?;
            // FREEZING while tasks are still on their way to the fridge
            while std::fs::read_to_string(r.path.join("freezer.state")).map(|s| s.trim() != want).unwrap_or(false) {
                if t.elapsed() > FREEZE_LIMIT {
                    bail!("{} did not become {want} within {FREEZE_LIMIT:?}", r.path.display());
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        Version::V2 => {
            write(&r.path, "cgroup.freeze", if frozen { "1" } else { "0" })?;
            let want = if frozen { "frozen 1" } else { "frozen 0" };
            while std::fs::read_to_string(r.path.join("cgroup.events")).map(|s| !s.lines().any(|l| l == want)).unwrap_or(false) {
                if t.elapsed() > FREEZE_LIMIT {
                    bail!("{} did not report `{want}` within {FREEZE_LIMIT:?}", r.path.display());
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
    Ok(())
}

/// Is the group gone? Only where its hierarchy is mounted can one tell: a disk server in a
/// host's namespace (`ip netns exec` mounts a /sys of its own, without the cgroup mounts) sees
/// no group at all, and must leave the record to `faultline cleanup`.
pub fn gone(r: &CgroupRecord) -> bool {
    use nix::sys::statfs::{CGROUP_SUPER_MAGIC, CGROUP2_SUPER_MAGIC, statfs};
    if r.path.exists() {
        return false;
    }
    // the nearest existing ancestor: a group of the hierarchy, or the hierarchy is not here
    r.path.ancestors().find(|a| a.exists()).and_then(|a| statfs(a).ok()).is_some_and(|s| {
        let t = s.filesystem_type();
        t == CGROUP_SUPER_MAGIC || t == CGROUP2_SUPER_MAGIC
    })
}

/// Undo a group: thaw it (a frozen process cannot be moved out on v1, and must never be left
/// frozen), move its processes back, remove it. Used by `Group::release` and by cleanup.
pub fn release(r: &CgroupRecord) -> Result<()> {
    if !r.path.exists() {
        return Ok(());
    }
    let frozen = match r.version {
        Version::V1 => std::fs::read_to_string(r.path.join("freezer.state")).is_ok_and(|s| s.trim() != "THAWED"),
        Version::V2 => std::fs::read_to_string(r.path.join("cgroup.freeze")).is_ok_and(|s| s.trim() == "1"),
    };
    if frozen {
        set_frozen(r, false)?;
    }
    // processes exit and fork while we move them: go round until the group is empty
    let t = Instant::now();
    loop {
        let left = procs(&r.path);
        if left.is_empty() {
            break;
        }
        for p in left {
            // a process that exited meanwhile cannot be moved, and need not be
            let _ = std::fs::write(r.restore_to.join("cgroup.procs"), p.to_string());
        }
        if t.elapsed() > Duration::from_secs(5) {
            bail!("cannot move the processes of {} back to {}: {:?} remain", r.path.display(), r.restore_to.display(), procs(&r.path));
        }
    }
    // rmdir of an emptied group can fail briefly while exiting tasks are still counted
    let t = Instant::now();
    loop {
        match std::fs::remove_dir(&r.path) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) if t.elapsed() > Duration::from_secs(2) => return Err(e).with_context(|| format!("cannot remove cgroup {}", r.path.display())),
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0\n\
cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0\n\
cgroup /sys/fs/cgroup/freezer cgroup rw,relatime,freezer 0 0\n\
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0\n";
    const UNIFIED: &str = "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid 0 0\n";

    #[test]
    fn v1_mounts_win_over_the_unified_one() {
        let none = |_: &Path| None;
        assert_eq!(hierarchy_in(HYBRID, "cpu", none), Some(Hierarchy { root: "/sys/fs/cgroup/cpu".into(), version: Version::V1 }));
        assert_eq!(hierarchy_in(HYBRID, "freezer", none).unwrap().root, PathBuf::from("/sys/fs/cgroup/freezer"));
        // a controller bound to no v1 mount and not listed by the v2 root is not available
        assert_eq!(hierarchy_in(HYBRID, "io", none), None);
    }

    #[test]
    fn v2_needs_the_controller_listed_at_its_root() {
        let listed = |_: &Path| Some("cpuset cpu io memory pids\n".to_string());
        assert_eq!(hierarchy_in(UNIFIED, "memory", listed).unwrap().version, Version::V2);
        assert_eq!(hierarchy_in(UNIFIED, "memory", |_: &Path| Some("pids\n".into())), None);
        // v2's freezer is built in
        assert!(hierarchy_in(UNIFIED, "freezer", |_: &Path| None).is_some());
    }

    #[test]
    fn group_lines_by_version() {
        let t = "9:name=systemd:/\n4:memory:/process_api/x\n2:cpu,cpuacct:/a\n0::/user.slice/s\n";
        assert_eq!(group_in(t, Version::V1, "memory"), Some(PathBuf::from("/process_api/x")));
        assert_eq!(group_in(t, Version::V1, "cpu"), Some(PathBuf::from("/a")));
        assert_eq!(group_in(t, Version::V2, "memory"), Some(PathBuf::from("/user.slice/s")));
        assert_eq!(group_in(t, Version::V1, "freezer"), None);
    }
}
