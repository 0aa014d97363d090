//! What a stack says about its health: btrfs device error counters, ext4's error count, and
//! kernel log lines that name the stack's devices.

use super::{BuiltStack, FsKind, run, which};
use crate::sys::mount;
use anyhow::{Result, bail};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::Command;

/// `btrfs device stats` counters of one device.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct DeviceStats {
    pub device: PathBuf,
    pub write_io_errs: u64,
    pub read_io_errs: u64,
    pub flush_io_errs: u64,
    pub corruption_errs: u64,
    pub generation_errs: u64,
}

impl BuiltStack {
    /// `btrfs device stats` of a btrfs stack.
    pub fn device_stats(&self) -> Result<Vec<DeviceStats>> {
        let Some(mnt) = &self.mountpoint else { bail!("no file system") };
        if self.kind != Some(FsKind::Btrfs) {
            bail!("device stats exist on btrfs only");
        }
        let out = run(Command::new(which("btrfs")?).args(["device", "stats"]).arg(mnt))?;
        Ok(parse_device_stats(&out))
    }

    /// Notes for the report: btrfs error counters per device, and kernel messages since the
    /// build that name our devices (ext4/xfs/btrfs errors, checksum failures, repairs).
    pub fn health(&self) -> Vec<String> {
        let mut notes = self.notes.clone();
        if self.kind == Some(FsKind::Btrfs) && self.mountpoint.as_ref().is_some_and(|m| mount::is_mounted(m)) {
            match self.device_stats() {
                Ok(st) => {
                    for s in st {
                        notes.push(format!(
                            "{}: write_io_errs {} read_io_errs {} flush_io_errs {} corruption_errs {} generation_errs {}",
                            s.device.display(),
                            s.write_io_errs,
                            s.read_io_errs,
                            s.flush_io_errs,
                            s.corruption_errs,
                            s.generation_errs
                        ));
                    }
                }
                Err(e) => notes.push(format!("btrfs device stats: {e:#}")),
            }
        }
        if self.kind == Some(FsKind::Ext4) {
            // ext4 counts the errors it recorded in its superblock
            if let Some(name) = self.devices[0].file_name() {
                let dir = Path::new("/sys/fs/ext4").join(name);
                let n = std::fs::read_to_string(dir.join("errors_count")).ok().and_then(|s| s.trim().parse::<u64>().ok());
                if let Some(n) = n.filter(|&n| n > 0) {
                    let first = std::fs::read_to_string(dir.join("first_error_func")).unwrap_or_default();
                    notes.push(format!("{}: ext4 errors_count {n} (first in {})", self.devices[0].display(), first.trim()));
                }
            }
        }
        notes.extend(self.kernel_messages());
        notes
    }

    /// Kernel log lines since the build that mention one of our devices.
    pub fn kernel_messages(&self) -> Vec<String> {
        self.drain_kmsg();
        self.kernel_lines.lock().unwrap().clone()
    }

    /// Read the kernel log records that arrived since the last call; keep those that name our
    /// devices; return all of them.
    pub(super) fn drain_kmsg(&self) -> Vec<String> {
        let mut all = Vec::new();
        let Some(f) = &self.kmsg else { return all };
        use std::io::Read;
        let names: Vec<String> = self.devices.iter().filter_map(|d| d.file_name()).map(|n| n.to_string_lossy().into_owned()).collect();
        let mut seen = self.kernel_lines.lock().unwrap();
        let mut buf = vec![0u8; 8192];
        loop {
            // one record per read; EAGAIN: no more; EPIPE: records overwritten, go on
            match (&*f).read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    let rec = String::from_utf8_lossy(&buf[..n]);
                    let msg = rec.split_once(';').map(|x| x.1).unwrap_or(&rec).lines().next().unwrap_or("").to_string();
                    if names.iter().any(|n| mentions(&msg, n)) {
                        seen.push(msg.clone());
                    }
                    all.push(msg);
                }
                Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
                Err(_) => break,
            }
        }
        all
    }
}

/// Does a kernel message name device `name` (loop1, not loop10)?
fn mentions(msg: &str, name: &str) -> bool {
    msg.match_indices(name).any(|(i, _)| {
        let before = msg[..i].chars().next_back();
        let after = msg[i + name.len()..].chars().next();
        matches!(before, None | Some(' ' | '(' | '/' | '[')) && !after.is_some_and(|c| c.is_ascii_alphanumeric())
    })
}

pub fn parse_device_stats(out: &str) -> Vec<DeviceStats> {
    let mut v: Vec<DeviceStats> = Vec::new();
    for line in out.lines() {
        // [/dev/loop3].corruption_errs  2
        let Some((name, rest)) = line.strip_prefix('[').and_then(|l| l.split_once("].")) else {
            continue;
        };
        let mut it = rest.split_whitespace();
        let (Some(key), Some(val)) = (it.next(), it.next().and_then(|x| x.parse::<u64>().ok())) else {
            continue;
        };
        let dev = PathBuf::from(name);
        let i = match v.iter().position(|s| s.device == dev) {
            Some(i) => i,
            None => {
                v.push(DeviceStats { device: dev, ..Default::default() });
                v.len() - 1
            }
        };
        let s = &mut v[i];
        match key {
            "write_io_errs" => s.write_io_errs = val,
            "read_io_errs" => s.read_io_errs = val,
            "flush_io_errs" => s.flush_io_errs = val,
            "corruption_errs" => s.corruption_errs = val,
            "generation_errs" => s.generation_errs = val,
            _ => {}
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_stats_parse() {
        let out = "[/dev/loop3].write_io_errs    0\n[/dev/loop3].read_io_errs     1\n[/dev/loop3].flush_io_errs    0\n[/dev/loop3].corruption_errs  7\n[/dev/loop3].generation_errs  0\n[/dev/loop4].corruption_errs  0\n";
        let v = parse_device_stats(out);
        assert_eq!(v.len(), 2);
        assert_eq!((v[0].device.as_path(), v[0].read_io_errs, v[0].corruption_errs), (Path::new("/dev/loop3"), 1, 7));
        assert_eq!(v[1].corruption_errs, 0);
    }

    #[test]
    fn kernel_lines_name_exact_devices() {
        assert!(mentions("BTRFS warning (device loop1): csum failed root 5", "loop1"));
        assert!(mentions("I/O error, dev loop1, sector 8 op 0x0:(READ)", "loop1"));
        assert!(mentions("EXT4-fs error (device loop1): ext4_find_entry", "loop1"));
        assert!(!mentions("BTRFS warning (device loop12): csum failed", "loop1"));
        assert!(!mentions("I/O error, dev loop10, sector 8", "loop1"));
        assert!(!mentions("blah xloop1 x", "loop1"));
    }

    /// The ioctl numbers nix builds are the kernel's (include/uapi/linux/fs.h).
    #[test]
    fn ioctl_numbers_match_the_kernel() {
        assert_eq!(nix::request_code_none!(0x12, 97), 0x1261); // BLKFLSBUF
        assert_eq!(nix::request_code_readwrite!(b'f', 11, 32), 0xC020_660B); // FS_IOC_FIEMAP
        assert_eq!(nix::request_code_readwrite!(0x94, 54, 24), 0xC018_9436); // FIDEDUPERANGE
    }
}
