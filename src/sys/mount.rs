//! Mounts: /proc/self/mountinfo (one parser, honouring its octal escapes), unmounting FUSE and
//! file-system mounts, and syncfs.

use anyhow::{Context, Result, bail};
use nix::errno::Errno;
use nix::mount::{MntFlags, umount2};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// One line of /proc/self/mountinfo.
#[derive(Clone, Debug, PartialEq)]
pub struct MountInfo {
    /// st_dev of the mounted file system (for FUSE, the connection's number is the minor)
    pub dev: (u32, u32),
    pub mount_point: PathBuf,
    pub fs_type: String,
    pub source: String,
}

/// Undo mountinfo's escapes: space, tab, newline and backslash appear as `\ooo`.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parse mountinfo text (see proc_pid_mountinfo(5)).
pub fn parse(text: &str) -> Vec<MountInfo> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let (maj, min) = f.get(2)?.split_once(':')?;
            let sep = f.iter().position(|x| *x == "-")?;
            Some(MountInfo {
                dev: (maj.parse().ok()?, min.parse().ok()?),
                mount_point: PathBuf::from(unescape(f.get(4)?)),
                fs_type: f.get(sep + 1)?.to_string(),
                source: unescape(f.get(sep + 2)?),
            })
        })
        .collect()
}

pub fn mounts() -> Vec<MountInfo> {
    std::fs::read_to_string("/proc/self/mountinfo").map(|t| parse(&t)).unwrap_or_default()
}

/// The mount at `p`, if `p` is a mount point (the last one mounted there).
pub fn find(p: &Path) -> Option<MountInfo> {
    mounts().into_iter().rev().find(|m| m.mount_point == p)
}

/// The mount holding `p` (the deepest mount point above it).
pub fn containing(p: &Path) -> Option<MountInfo> {
    let p = std::fs::canonicalize(p).ok()?;
    mounts().into_iter().filter(|m| p.starts_with(&m.mount_point)).max_by_key(|m| m.mount_point.components().count())
}

/// The type of the file system holding `p` (`ext4`, `fuse.NAME`, `tmpfs`...).
pub fn fs_type(p: &Path) -> Option<String> {
    containing(p).map(|m| m.fs_type)
}

pub fn is_mounted(p: &Path) -> bool {
    find(p).is_some()
}

/// Mount points of the file systems on the block device with this device number.
pub fn on_device(dev: (u32, u32)) -> Vec<PathBuf> {
    mounts().into_iter().filter(|m| m.dev == dev).map(|m| m.mount_point).collect()
}

/// Unmount: plain umount retried while busy (a closing file, udev) for ~`busy`, then lazy
/// (MNT_DETACH) as the last resort. Returns whether it had to be lazy.
pub fn unmount(p: &Path, busy: Duration) -> Result<bool> {
    let t = std::time::Instant::now();
    let last = loop {
        match umount2(p, MntFlags::empty()) {
            Ok(()) => return Ok(false),
            Err(Errno::EINVAL | Errno::ENOENT) => return Ok(false), // not mounted (any more)
            Err(Errno::EBUSY) if t.elapsed() < busy => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => break e,
        }
    };
    match umount2(p, MntFlags::MNT_DETACH) {
        Ok(()) => Ok(true),
        Err(e) => bail!("cannot unmount {}: {last}; lazy unmount failed too: {e}", p.display()),
    }
}

/// Flush a mounted file system's dirty data and metadata to its device.
pub fn syncfs(p: &Path) -> Result<()> {
    let f = std::fs::File::open(p).with_context(|| format!("cannot open {}", p.display()))?;
    nix::unistd::syncfs(&f).with_context(|| format!("syncfs {}", p.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_escaped_mount_points() {
        let t = "36 35 98:0 / /mnt/my\\040disk rw,noatime master:1 - ext4 /dev/loop\\0401 rw,errors=continue\n\
                 40 25 0:52 / /run/faultline/mnt-1-0 rw shared:9 - fuse.faultline faultline rw,user_id=0\n";
        let m = parse(t);
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].mount_point, Path::new("/mnt/my disk"));
        assert_eq!(m[0].source, "/dev/loop 1");
        assert_eq!(m[0].dev, (98, 0));
        assert_eq!(m[1].fs_type, "fuse.faultline");
        assert_eq!(m[1].dev, (0, 52));
        assert_eq!(unescape("a\\134b\\011"), "a\\b\t");
        assert_eq!(unescape("trailing\\04"), "trailing\\04");
    }

    #[test]
    fn the_root_is_mounted() {
        assert!(is_mounted(Path::new("/")));
        assert!(!is_mounted(Path::new("/surely/not/a/mount/point")));
    }
}
