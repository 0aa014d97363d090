//! Loop devices through losetup(8): attach a file in direct-I/O mode, detach, inspect.

use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Attach `file` to a free loop device with direct I/O; returns /dev/loopN.
pub fn attach(file: &Path, sector_size: u32) -> Result<PathBuf> {
    let out = Command::new("losetup")
        .args(["--find", "--show", "--direct-io=on", "--sector-size", &sector_size.to_string()])
        .arg(file)
        .output()
        .context("cannot run losetup (util-linux)")?;
    if !out.status.success() {
        bail!("losetup could not attach {}: {}", file.display(), String::from_utf8_lossy(&out.stderr).trim());
    }
    let dev = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    // losetup falls back to buffered I/O silently when direct I/O is refused; we need it
    let name = dev.file_name().unwrap_or_default().to_string_lossy().to_string();
    let dio = std::fs::read_to_string(format!("/sys/block/{name}/loop/dio")).unwrap_or_default();
    if dio.trim() != "1" {
        let _ = detach(&dev);
        bail!("{} was attached without direct I/O (sysfs dio={}); faultline needs it so every request reaches the disk", dev.display(), dio.trim());
    }
    Ok(dev)
}

pub fn detach(dev: &Path) -> Result<()> {
    // udev may still hold the device briefly after a change; retry a little
    let mut last = String::new();
    for i in 0..50 {
        let out = Command::new("losetup").arg("-d").arg(dev).output().context("cannot run losetup")?;
        if out.status.success() {
            return wait_detached(dev);
        }
        last = String::from_utf8_lossy(&out.stderr).trim().to_string();
        if backing_file(dev).is_none() {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_millis(20 * (i + 1).min(10)));
    }
    bail!("losetup -d {}: {last}", dev.display())
}

/// `losetup -d` on a device someone still holds open (udev probing after a write, a client
/// closing late) only marks it for auto-clear; wait until the kernel has really let go, so the
/// FUSE file behind it can be unmounted cleanly.
fn wait_detached(dev: &Path) -> Result<()> {
    let t = std::time::Instant::now();
    while backing_file(dev).is_some() {
        if t.elapsed() > std::time::Duration::from_secs(10) {
            bail!("{} is still attached 10 s after losetup -d: something holds it open (see `fuser -v {}`)", dev.display(), dev.display());
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    Ok(())
}

/// The file a loop device is attached to, if any.
pub fn backing_file(dev: &Path) -> Option<PathBuf> {
    let name = dev.file_name()?.to_string_lossy().to_string();
    let b = std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file")).ok()?;
    let b = b.trim();
    (!b.is_empty()).then(|| PathBuf::from(b))
}

/// The sysfs file of a loop device's rq_affinity (the CPU its completions run on).
pub fn rq_affinity_path(device: &Path) -> PathBuf {
    let name = device.file_name().unwrap_or_default().to_string_lossy();
    PathBuf::from(format!("/sys/block/{name}/queue/rq_affinity"))
}

/// Read a loop device's rq_affinity (0, 1 or 2).
pub fn rq_affinity(device: &Path) -> Result<u8> {
    let p = rq_affinity_path(device);
    let s = std::fs::read_to_string(&p).with_context(|| format!("cannot read {}", p.display()))?;
    match s.trim() {
        v @ ("0" | "1" | "2") => Ok(v.as_bytes()[0] - b'0'),
        v => bail!("{} holds '{v}', not 0, 1 or 2", p.display()),
    }
}

/// Write a loop device's rq_affinity (`cleanup` puts a crashed run's change back with it).
pub fn set_rq_affinity(device: &Path, v: u8) -> Result<()> {
    let p = rq_affinity_path(device);
    std::fs::write(&p, [b'0' + v]).with_context(|| format!("cannot write {v} to {}", p.display()))
}

/// The device number (major, minor) of a block device node.
pub fn dev_number(dev: &Path) -> Option<(u32, u32)> {
    use std::os::unix::fs::MetadataExt;
    let rdev = std::fs::metadata(dev).ok()?.rdev();
    Some((nix::sys::stat::major(rdev) as u32, nix::sys::stat::minor(rdev) as u32))
}
