//! Named network namespaces through iproute2's `ip netns` (the /run/netns bind-mount
//! convention, so `ip netns exec NAME ...` works on them): create, delete, and the processes
//! inside one. The CLI rather than netlink: these are a handful of calls per run, off any
//! hot path, and `ip` is already needed to run commands in a host.

use anyhow::{Context, Result, bail};
use std::path::PathBuf;
use std::process::Command;

/// The bind mount that holds a named namespace open.
pub fn path(name: &str) -> PathBuf {
    PathBuf::from("/run/netns").join(name)
}

pub fn exists(name: &str) -> bool {
    path(name).exists()
}

/// Run `ip ARGS...`; the error carries its stderr.
pub fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip").args(args).output().context("cannot run `ip` (install iproute2)")?;
    if !out.status.success() {
        bail!("`ip {}` failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

pub fn add(name: &str) -> Result<()> {
    ip(&["netns", "add", name])
}

/// Pids of the processes whose network namespace is `name`.
pub fn pids(name: &str) -> Vec<i32> {
    let Ok(out) = Command::new("ip").args(["netns", "pids", name]).output() else { return vec![] };
    String::from_utf8_lossy(&out.stdout).split_whitespace().filter_map(|p| p.parse().ok()).collect()
}

/// Kill every process inside the namespace (they were started there by us: a host's server
/// or workload), then delete it; its devices (TUN, veth) go with it. Returns what was done.
pub fn delete(name: &str) -> Result<Vec<String>> {
    let mut log = Vec::new();
    if !exists(name) {
        return Ok(log);
    }
    let t = std::time::Instant::now();
    loop {
        let p = pids(name);
        if p.is_empty() {
            break;
        }
        if t.elapsed() > std::time::Duration::from_secs(5) {
            bail!("processes {p:?} in network namespace {name} survived SIGKILL");
        }
        for pid in p {
            if nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL).is_ok() {
                log.push(format!("killed process {pid} in network namespace {name}"));
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    ip(&["netns", "delete", name])?;
    log.push(format!("deleted network namespace {name}"));
    Ok(log)
}
