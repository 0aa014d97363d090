//! Which devices are this process's own faultline devices, and the file systems of this
//! process mounted on them (a served disk being torn down unmounts what sits on it first).

use crate::sys::ledger;
use anyhow::Result;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// File systems of this process that are mounted, with their devices: a served disk being
/// torn down unmounts what sits on it first (`release_on_device`).
pub(super) static LIVE: Mutex<Vec<(PathBuf, Vec<PathBuf>)>> = Mutex::new(Vec::new());

/// Is `dev` a loop device backed by a FUSE file of this process (mnt-<pid>-N), or of a disk
/// server this process started (its ledger names this process as owner)?
pub fn is_own_device(dev: &Path) -> bool {
    let dev = std::fs::canonicalize(dev).unwrap_or_else(|_| dev.to_owned());
    let Some(b) = crate::sys::loopdev::backing_file(&dev) else {
        return false;
    };
    let Ok(rest) = b.strip_prefix(ledger::run_dir()) else {
        return false;
    };
    let name = rest.iter().next().unwrap_or_default().to_string_lossy();
    let Some(pid) = name.strip_prefix("mnt-").and_then(|r| r.split('-').next()).and_then(|p| p.parse::<u32>().ok()) else {
        return false;
    };
    let me = std::process::id();
    pid == me || ledger::owner_of(pid) == Some(me)
}

/// Unmount a file system: sync, plain umount retried for ~3 s (a closing file, udev), lazy
/// (MNT_DETACH) only as the last resort, never longer than the ledger's limit. Returns whether
/// it had to be lazy.
pub fn unmount_fs(p: &Path) -> Result<bool> {
    ledger::unmount_fs(p)
}

/// Unmount every file system of this process that uses `dev` (called by a served disk before
/// its loop device goes). Returns notes.
pub fn release_on_device(dev: &Path) -> Vec<String> {
    let mut notes = Vec::new();
    let mut live = LIVE.lock().unwrap();
    live.retain(|(mnt, devs)| {
        if !devs.iter().any(|d| d == dev) {
            return true;
        }
        match unmount_fs(mnt) {
            Ok(lazy) => notes.push(format!("unmounted {}{} before detaching {}", mnt.display(), if lazy { " lazily (busy)" } else { "" }, dev.display())),
            Err(e) => notes.push(format!("{e:#}")),
        }
        false
    });
    notes
}

/// A file system unmounted lazily (or just now) releases its device asynchronously, when the
/// last reference goes: so does one whose mount was copied into a mount namespace made while
/// it was mounted (`ip netns exec`, `unshare -m`; with private propagation the unmount here does
/// not reach the copy, which keeps the file system alive, its journal unwritten, until that
/// namespace ends). mkfs would refuse such a device, and a check would read a live file system.
/// Wait (up to 10 s) until the device can be opened exclusively, i.e. nothing holds it.
pub fn wait_unclaimed(dev: &Path) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let t = Instant::now();
    loop {
        match std::fs::OpenOptions::new().read(true).custom_flags(libc::O_EXCL).open(dev) {
            Ok(_) => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && t.elapsed() < Duration::from_secs(10) => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => {
                return Err(anyhow::Error::new(e)
                    .context(format!("{} is still held (a mounted file system, or a copy of its mount in another mount namespace)", dev.display())));
            }
        }
    }
}
