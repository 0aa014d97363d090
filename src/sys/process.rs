//! Processes and process groups, told apart from recycled pids by their start time.

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

/// Process start time (clock ticks since boot, /proc/PID/stat field 22), with the state
/// letter (field 3): tells a live process from a recycled pid, and a zombie from the living.
fn stat(pid: u32) -> Option<(char, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // fields after the command (which may contain spaces) start after the last ')'
    let rest = &stat[stat.rfind(')')? + 2..];
    let mut f = rest.split(' ');
    let state = f.next()?.chars().next()?;
    Some((state, f.nth(18)?.parse().ok()?))
}

/// CPU time (user + system) a process has used so far, all its threads included.
pub fn cpu_time(pid: u32) -> Option<std::time::Duration> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let f: Vec<&str> = s[s.rfind(')')? + 2..].split(' ').collect();
    // utime and stime: fields 14 and 15, the 12th and 13th after the command
    let ticks = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100).max(1) as u64;
    Some(std::time::Duration::from_nanos(ticks.saturating_mul(1_000_000_000 / hz)))
}

/// The process group of a process (/proc/PID/stat field 5).
pub fn group_of(pid: u32) -> Option<i32> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s[s.rfind(')')? + 2..].split(' ').nth(2)?.parse().ok()
}

pub fn start_time(pid: u32) -> Option<u64> {
    stat(pid).map(|(_, t)| t)
}

/// Is the process that started at `start` still running? A zombie is not: it was killed or
/// has exited, even if one of its threads still waits for I/O to finish (`is_gone`).
pub fn is_running(pid: u32, start: u64) -> bool {
    matches!(stat(pid), Some((state, t)) if t == start && state != 'Z' && state != 'X')
}

/// Has the process that started at `start` ended completely: no thread left in the kernel
/// (a killed process's thread waiting for a disk keeps its files, and so its mounts, busy)?
pub fn is_gone(pid: u32, start: u64) -> bool {
    match stat(pid) {
        Some((state, t)) if t == start => (state == 'Z' || state == 'X') && threads(pid) <= 1,
        _ => true,
    }
}

/// Threads of a process still in the kernel (a killed process's zombie leader can have a
/// thread left that waits for I/O to finish).
fn threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task")).map(|d| d.count()).unwrap_or(0)
}

/// SIGKILL a process group we started, unless its leader's pid now belongs to someone else.
pub fn kill_group(pgid: i32, start: u64) -> bool {
    if pgid <= 1 {
        return false;
    }
    match start_time(pgid as u32) {
        Some(t) if t != start => false, // pid recycled: not our group
        // leader alive, or gone while members may remain (a pgid is not reused while the
        // group exists)
        _ => killpg(Pid::from_raw(pgid), Signal::SIGKILL).is_ok(),
    }
}

pub fn group_exists(pgid: i32) -> bool {
    pgid > 1 && killpg(Pid::from_raw(pgid), None).is_ok()
}

/// Send `sig` to a process if it is still the one that started at `start`.
pub fn signal(pid: u32, start: u64, sig: Signal) -> bool {
    start_time(pid) == Some(start) && kill(Pid::from_raw(pid as i32), sig).is_ok()
}

/// Ask the kernel to send `sig` to this (child) process when its parent dies; for use in a
/// `pre_exec` hook, where only async-signal-safe calls are allowed.
pub fn die_with_parent(sig: Signal) -> std::io::Result<()> {
    nix::sys::prctl::set_pdeathsig(sig).map_err(std::io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_runs_and_a_recycled_pid_does_not() {
        let me = std::process::id();
        let t = start_time(me).unwrap();
        assert!(is_running(me, t));
        assert!(!is_running(me, t + 1));
    }

    #[test]
    fn a_zombie_is_not_running() {
        let mut c = std::process::Command::new("true").spawn().unwrap();
        let pid = c.id();
        let t = start_time(pid).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while is_running(pid, t) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(!is_running(pid, t), "an exited, unreaped child counts as dead");
        assert!(is_gone(pid, t));
        c.wait().unwrap();
    }
}
