//! File-system stacks on faultline block devices: mkfs + mount (ext4, xfs, btrfs), btrfs raid1
//! over two devices, dedup (btrfs, or xfs with reflink) with duperemove, and a user command on
//! top. Every mount is recorded in the ledger before it is made and taken down before the
//! devices under it (see docs/stacks.md).

use crate::stack::command::{self, CommandEnv, CommandOutcome, CommandSpec};
use crate::sys::ledger::{self, LedgerFile};
use crate::sys::mount;
use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FsKind {
    Ext4,
    Xfs,
    Btrfs,
}

impl FsKind {
    pub fn name(self) -> &'static str {
        match self {
            FsKind::Ext4 => "ext4",
            FsKind::Xfs => "xfs",
            FsKind::Btrfs => "btrfs",
        }
    }
}

/// What is built on the faultline devices. Options are passed to mkfs / mount verbatim.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StackSpec {
    /// The workload uses the block device(s) directly.
    Raw,
    /// One device, one file system.
    Fs { kind: FsKind, mkfs: Vec<String>, mount: Vec<String> },
    /// btrfs with data and metadata raid1 over exactly two devices.
    BtrfsRaid1 { mkfs: Vec<String>, mount: Vec<String> },
    /// A file system that can share blocks (btrfs, or xfs with `-m reflink=1`), deduplicated
    /// with `dedupe()`.
    Dedup { kind: FsKind, mkfs: Vec<String>, mount: Vec<String> },
    /// `base` is built, then the command is the workload (`Built::run_command`).
    Command { base: Box<StackSpec>, command: CommandSpec },
}

impl StackSpec {
    pub fn devices_needed(&self) -> usize {
        match self {
            StackSpec::BtrfsRaid1 { .. } => 2,
            StackSpec::Command { base, .. } => base.devices_needed(),
            _ => 1,
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct BuildOptions {
    /// Allow devices that are not faultline loop devices of this process (mkfs destroys them).
    pub allow_foreign_devices: bool,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct DedupReport {
    /// Bytes of file data in extents shared with another file or offset (FIEMAP), before/after.
    pub shared_before: u64,
    pub shared_after: u64,
    /// btrfs only: `btrfs filesystem du -s` "Set shared" after deduplication.
    pub btrfs_set_shared: Option<u64>,
    /// Free space was discarded afterwards (fstrim), so freed duplicate copies are gone.
    pub trimmed: bool,
    pub seconds: f64,
    /// duperemove's own count: "net change in shared extents of: N" (bytes).
    pub duperemove_net_change: Option<i64>,
    /// duperemove's closing lines.
    pub summary: Vec<String>,
}

impl DedupReport {
    pub fn deduped(&self) -> u64 {
        self.shared_after.saturating_sub(self.shared_before)
    }
}

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

/// A built stack. Torn down by `teardown` or on drop.
pub struct Built {
    pub spec: StackSpec,
    pub devices: Vec<PathBuf>,
    pub mountpoint: Option<PathBuf>,
    kind: Option<FsKind>,
    mount_opts: Vec<String>,
    ledger: Option<LedgerFile>,
    kmsg: Option<std::fs::File>,
    kernel_lines: Mutex<Vec<String>>,
    notes: Vec<String>,
}

/// File systems of this process that are mounted, with their devices: a served disk being
/// torn down unmounts what sits on it first (`release_on_device`).
static LIVE: Mutex<Vec<(PathBuf, Vec<PathBuf>)>> = Mutex::new(Vec::new());

fn run(cmd: &mut Command) -> Result<String> {
    let shown = format!("{cmd:?}").replace('"', "");
    use std::os::unix::process::CommandExt;
    // SAFETY: the hook runs in the forked child before exec and makes one async-signal-safe
    // call (prctl): mkfs and friends must not outlive a killed run and keep its disk busy
    unsafe {
        cmd.pre_exec(|| crate::sys::process::die_with_parent(nix::sys::signal::Signal::SIGKILL));
    }
    let out = cmd.output().with_context(|| format!("cannot run `{shown}`"))?;
    if !out.status.success() {
        bail!("`{shown}` failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Wait for udev to finish probing (blkid) so a new file system is seen by mount and btrfs.
fn settle() {
    if let Ok(p) = which("udevadm") {
        let _ = Command::new(p).args(["settle", "--timeout=10"]).output();
    }
}

fn which(prog: &str) -> Result<PathBuf> {
    for d in ["/usr/sbin", "/usr/bin", "/sbin", "/bin", "/usr/local/sbin", "/usr/local/bin"] {
        let p = Path::new(d).join(prog);
        if p.exists() {
            return Ok(p);
        }
    }
    bail!("`{prog}` is not installed (scripts/setup.sh installs it)")
}

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
/// last reference goes; mkfs would then refuse the device as "in use by the system". Wait
/// (up to 10 s) until the device can be opened exclusively, i.e. nothing holds it.
fn wait_unclaimed(dev: &Path) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let t = Instant::now();
    loop {
        match std::fs::OpenOptions::new().read(true).custom_flags(libc::O_EXCL).open(dev) {
            Ok(_) => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && t.elapsed() < Duration::from_secs(10) => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => {
                return Err(
                    anyhow::Error::new(e).context(format!("{} is held by something else (a mounted file system?); mkfs would refuse it", dev.display()))
                );
            }
        }
    }
}

fn mkfs_cmd(kind: FsKind, extra: &[&str], user: &[String], devices: &[PathBuf]) -> Result<Command> {
    let (prog, force) = match kind {
        FsKind::Ext4 => ("mkfs.ext4", ["-F", "-q"]),
        FsKind::Xfs => ("mkfs.xfs", ["-f", "-q"]),
        FsKind::Btrfs => ("mkfs.btrfs", ["-f", "-q"]),
    };
    let mut c = Command::new(which(prog)?);
    c.args(force).args(extra).args(user).args(devices);
    Ok(c)
}

impl Built {
    /// Build `spec` on `devices` (faultline loop devices of this process; others are refused).
    pub fn build(spec: &StackSpec, devices: &[PathBuf]) -> Result<Built> {
        Self::build_with(spec, devices, &BuildOptions::default())
    }

    pub fn build_with(spec: &StackSpec, devices: &[PathBuf], opts: &BuildOptions) -> Result<Built> {
        let need = spec.devices_needed();
        if devices.len() != need {
            bail!("this stack needs {need} device(s), got {}", devices.len());
        }
        let base = match spec {
            StackSpec::Command { base, .. } => base.as_ref(),
            s => s,
        };
        if matches!(base, StackSpec::Command { .. }) {
            bail!("a command stack cannot be built on another command stack");
        }
        let mut me = Built {
            spec: spec.clone(),
            devices: devices.to_vec(),
            mountpoint: None,
            kind: None,
            mount_opts: vec![],
            ledger: None,
            kmsg: None,
            kernel_lines: Mutex::new(vec![]),
            notes: vec![],
        };
        // nothing is destroyed that the user did not name: a raw stack is written by the workload
        for d in devices {
            if !opts.allow_foreign_devices && !is_own_device(d) {
                bail!(
                    "refusing to use {} for a stack: it is not a faultline loop device of this process, and its contents would be overwritten (pass allow_foreign_devices to do it anyway)",
                    d.display()
                );
            }
        }
        // kernel messages from now on that name our devices go into health() (I/O errors
        // on a raw device, file-system errors, checksum failures)
        me.kmsg = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open("/dev/kmsg").ok().inspect(|f| {
            use std::os::fd::AsRawFd;
            // SAFETY: an fd we hold open for the call
            unsafe { libc::lseek(f.as_raw_fd(), 0, libc::SEEK_END) };
        });
        let (kind, mkfs): (FsKind, Command) = match base {
            StackSpec::Raw => return Ok(me),
            StackSpec::Fs { kind, mkfs, mount } => {
                me.mount_opts = mount.clone();
                (*kind, mkfs_cmd(*kind, &[], mkfs, devices)?)
            }
            StackSpec::BtrfsRaid1 { mkfs, mount } => {
                // the kernel finds the second device through device= (no global scan needed)
                me.mount_opts = devices.iter().map(|d| format!("device={}", d.display())).chain(mount.iter().cloned()).collect();
                (FsKind::Btrfs, mkfs_cmd(FsKind::Btrfs, &["-d", "raid1", "-m", "raid1"], mkfs, devices)?)
            }
            StackSpec::Dedup { kind, mkfs, mount } => {
                me.mount_opts = mount.clone();
                match kind {
                    FsKind::Btrfs => (FsKind::Btrfs, mkfs_cmd(FsKind::Btrfs, &[], mkfs, devices)?),
                    FsKind::Xfs => (FsKind::Xfs, mkfs_cmd(FsKind::Xfs, &["-m", "reflink=1"], mkfs, devices)?),
                    FsKind::Ext4 => bail!("dedup needs a file system that shares blocks: btrfs or xfs (ext4 has no reflink)"),
                }
            }
            StackSpec::Command { .. } => unreachable!(),
        };
        me.kind = Some(kind);
        for d in devices {
            wait_unclaimed(d)?;
        }
        let mut mkfs = mkfs;
        let t = Instant::now();
        loop {
            match run(&mut mkfs) {
                Ok(_) => break,
                // mkfs.btrfs stats the backing file of every mounted loop device; one behind a
                // FUSE mount whose daemon died (a crashed faultline) answers ENOTCONN
                Err(e) if format!("{e:#}").contains("Transport endpoint is not connected") => {
                    if t.elapsed() > Duration::from_secs(3) {
                        return Err(e.context("a mounted loop device is backed by a dead FUSE mount (a crashed faultline?); `faultline cleanup` releases it"));
                    }
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => return Err(e),
            }
        }
        settle();
        let mut ledger = LedgerFile::create()?;
        let mnt = ledger::run_dir().join(format!("fs-{}-{}", std::process::id(), ledger.seq));
        ledger.update(|l| l.dirs.push(mnt.clone()))?;
        me.ledger = Some(ledger);
        std::fs::create_dir_all(&mnt).with_context(|| format!("cannot create {}", mnt.display()))?;
        me.mountpoint = Some(mnt);
        me.mount()?;
        Ok(me)
    }

    fn mount(&mut self) -> Result<()> {
        let mnt = self.mountpoint.clone().expect("fs stack");
        let kind = self.kind.expect("fs stack");
        // recorded before it exists: a crash right after mount(2) is still cleaned up
        self.ledger.as_mut().unwrap().update(|l| {
            if !l.fs_mounts.contains(&mnt) {
                l.fs_mounts.push(mnt.clone())
            }
        })?;
        let mut c = Command::new(which("mount")?);
        c.args(["-t", kind.name()]);
        if !self.mount_opts.is_empty() {
            c.arg("-o").arg(self.mount_opts.join(","));
        }
        c.arg(&self.devices[0]).arg(&mnt);
        self.drain_kmsg();
        if let Err(e) = run(&mut c) {
            // mount(8) only says "wrong fs type, bad option, ..."; the kernel says which (and
            // not always naming the device, e.g. "ext4: Bad value for 'data'")
            let fsname = kind.name().to_ascii_lowercase();
            let k: Vec<String> = self.drain_kmsg().into_iter().filter(|m| m.to_ascii_lowercase().starts_with(&fsname)).collect();
            if k.is_empty() {
                return Err(e);
            }
            return Err(anyhow::anyhow!("{e:#}; kernel: {}", k[k.len().saturating_sub(3)..].join(" | ")));
        }
        LIVE.lock().unwrap().push((mnt, self.devices.clone()));
        Ok(())
    }

    fn unmount(&mut self) -> Result<bool> {
        let mnt = self.mountpoint.clone().expect("fs stack");
        LIVE.lock().unwrap().retain(|(m, _)| *m != mnt);
        if !mount::is_mounted(&mnt) {
            return Ok(false);
        }
        let _ = mount::syncfs(&mnt);
        unmount_fs(&mnt)
    }

    /// The mount options in effect, from /proc/self/mountinfo (e.g. to check `data=journal`).
    pub fn mount_options(&self) -> Option<String> {
        let mnt = self.mountpoint.as_ref()?.to_string_lossy().into_owned();
        let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
        info.lines().find_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            if f.get(4) != Some(&mnt.as_str()) {
                return None;
            }
            let sep = f.iter().position(|x| *x == "-")?;
            Some(format!("{},{}", f[5], f.get(sep + 3).unwrap_or(&"")))
        })
    }

    /// Make later reads come from the disk. File systems: unmount and mount again, which
    /// drops every cached page and metadata block of this file system only (drop_caches is
    /// global and leaves dirty data). Raw: fsync + BLKFLSBUF on each device (its buffer cache).
    pub fn cold_cache(&mut self) -> Result<()> {
        if self.mountpoint.is_none() {
            for d in &self.devices {
                let f = std::fs::File::open(d).with_context(|| format!("cannot open {}", d.display()))?;
                f.sync_all()?;
                use std::os::fd::AsRawFd;
                // BLKFLSBUF = _IO(0x12, 97)
                nix::ioctl_none!(blkflsbuf, 0x12, 97);
                // SAFETY: our open fd; the ioctl takes no argument
                if let Err(e) = unsafe { blkflsbuf(f.as_raw_fd()) } {
                    bail!("BLKFLSBUF on {}: {e}", d.display());
                }
            }
            return Ok(());
        }
        if self.unmount()? {
            bail!(
                "{} was busy: unmounted lazily, so its cache was not dropped; close files in it before cold_cache",
                self.mountpoint.as_ref().unwrap().display()
            );
        }
        self.mount()
    }

    /// Deduplicate exactly the blocks the workload wrote more than once (FIDEDUPERANGE, 4 KiB
    /// granularity; see `dedupe.rs`), then `fstrim`, so freed copies leave the disk and only
    /// the shared block carries each content.
    pub fn dedupe_blocks(&mut self, blocks: impl IntoIterator<Item = (PathBuf, u64, u64)>) -> Result<super::dedupe::BlockDedupReport> {
        let Some(mnt) = self.mountpoint.clone() else { bail!("dedupe needs a file system (this stack is raw)") };
        if self.kind == Some(FsKind::Ext4) {
            bail!("dedupe needs btrfs or xfs with reflink; this is ext4");
        }
        let _ = mount::syncfs(&mnt);
        let mut rep = super::dedupe::dedupe_blocks(blocks, 4096)?;
        let _ = mount::syncfs(&mnt);
        let trim = Command::new(which("fstrim")?).arg("-v").arg(&mnt).output();
        match &trim {
            Ok(o) if o.status.success() => rep.trimmed = String::from_utf8_lossy(&o.stdout).trim().to_string(),
            _ => self.notes.push(format!("fstrim {} failed after dedupe: freed copies may remain on the disk", mnt.display())),
        }
        Ok(rep)
    }

    /// Deduplicate the file system with `duperemove -dr` (btrfs, or xfs with reflink), then
    /// `fstrim` it.
    pub fn dedupe(&mut self) -> Result<DedupReport> {
        let Some(mnt) = self.mountpoint.clone() else { bail!("dedupe needs a file system (this stack is raw)") };
        if self.kind == Some(FsKind::Ext4) {
            bail!("dedupe needs btrfs or xfs with reflink; this is ext4");
        }
        let _ = mount::syncfs(&mnt);
        let t = Instant::now();
        let mut rep = DedupReport { shared_before: shared_bytes(&mnt)?, ..Default::default() };
        // -b 4096: workload duplicates are single 4 KiB blocks scattered in files; the default
        // 128 KiB hashing would only find runs of 32 equal blocks
        let out = run(Command::new(which("duperemove")?).args(["-dr", "-b", "4096"]).arg(&mnt))?;
        let _ = mount::syncfs(&mnt);
        // the copies dedupe freed still hold their bytes on the disk, where content-targeted
        // faults (rot by hash) would find them; discard them so only live blocks carry data
        let trim = Command::new(which("fstrim")?).arg(&mnt).output();
        rep.trimmed = trim.as_ref().is_ok_and(|o| o.status.success());
        if !rep.trimmed {
            self.notes.push(format!(
                "fstrim {} failed after dedupe: freed copies may remain on the disk ({})",
                mnt.display(),
                trim.map(|o| String::from_utf8_lossy(&o.stderr).trim().to_string()).unwrap_or_else(|e| e.to_string())
            ));
        }
        rep.seconds = t.elapsed().as_secs_f64();
        rep.summary = out
            .lines()
            .filter(|l| l.starts_with("Total files") || l.starts_with("Found ") || l.starts_with("Comparison of extent info"))
            .map(str::to_owned)
            .collect();
        rep.duperemove_net_change = out.lines().find_map(|l| l.split_once("net change in shared extents of:")).and_then(|(_, n)| n.trim().parse().ok());
        rep.shared_after = shared_bytes(&mnt)?;
        if self.kind == Some(FsKind::Btrfs) {
            let du = run(Command::new(which("btrfs")?).args(["filesystem", "du", "-s", "--raw"]).arg(&mnt))?;
            rep.btrfs_set_shared = du.lines().nth(1).and_then(|l| l.split_whitespace().nth(2)).and_then(|x| x.parse().ok());
        }
        Ok(rep)
    }

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
    fn drain_kmsg(&self) -> Vec<String> {
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

    /// Environment for a command on this stack.
    pub fn command_env(&self) -> CommandEnv {
        CommandEnv { device: self.devices.first().cloned(), devices: self.devices.clone(), mount: self.mountpoint.clone() }
    }

    /// Run the command of a `Command` stack (or `spec`) on this stack.
    pub fn run_command(&self, spec: Option<&CommandSpec>, cancel: Option<&std::sync::atomic::AtomicBool>) -> Result<CommandOutcome> {
        let spec = match (spec, &self.spec) {
            (Some(s), _) => s,
            (None, StackSpec::Command { command, .. }) => command,
            (None, _) => bail!("this stack has no command"),
        };
        command::run_command(spec, &self.command_env(), cancel)
    }

    /// Sync, unmount (retried; lazy only as the last resort, noted), let btrfs forget the
    /// devices, remove the mount point and the ledger. Returns notes (e.g. a lazy unmount).
    pub fn teardown(mut self) -> Result<Vec<String>> {
        self.release()
    }

    fn release(&mut self) -> Result<Vec<String>> {
        let mut notes = Vec::new();
        let Some(mnt) = self.mountpoint.clone() else {
            return Ok(notes);
        };
        // on error the mount point and ledger stay, for a retry or `faultline cleanup`
        let lazy = self.unmount()?;
        self.mountpoint = None;
        if lazy {
            notes.push(format!("{} was busy: unmounted lazily (MNT_DETACH); it goes away when its last user closes it", mnt.display()));
        } else if self.kind == Some(FsKind::Btrfs) {
            // btrfs keeps scanned devices registered; forget them before the loop devices go
            if let Ok(b) = which("btrfs") {
                for d in &self.devices {
                    let _ = Command::new(&b).args(["device", "scan", "--forget"]).arg(d).output();
                }
            }
        }
        let _ = std::fs::remove_dir(&mnt);
        if let Some(l) = self.ledger.take() {
            l.remove();
        }
        Ok(notes)
    }
}

impl Drop for Built {
    fn drop(&mut self) {
        match self.release() {
            Ok(notes) => notes.iter().for_each(|n| eprintln!("faultline: {n}")),
            Err(e) => eprintln!("faultline: stack teardown: {e:#}"),
        }
    }
}

use std::os::unix::fs::OpenOptionsExt;

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

/// One extent of a file, from FIEMAP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub logical: u64,
    pub physical: u64,
    pub length: u64,
    pub flags: u32,
}

pub const FIEMAP_EXTENT_SHARED: u32 = 0x2000;

/// The extents of a file (FS_IOC_FIEMAP, after syncing it).
pub fn extents(path: &Path) -> Result<Vec<Extent>> {
    #[repr(C)]
    struct FiemapHead {
        start: u64,
        length: u64,
        flags: u32,
        mapped: u32,
        count: u32,
        reserved: u32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct FiemapExtent {
        logical: u64,
        physical: u64,
        length: u64,
        reserved64: [u64; 2],
        flags: u32,
        reserved: [u32; 3],
    }
    const FIEMAP_FLAG_SYNC: u32 = 1;
    const FIEMAP_EXTENT_LAST: u32 = 1;
    const N: usize = 256;
    #[repr(C)]
    struct Req {
        head: FiemapHead,
        ext: [FiemapExtent; N],
    }
    // FS_IOC_FIEMAP = _IOWR('f', 11, struct fiemap): the number encodes the header's size, the
    // extents follow it in the same buffer
    nix::ioctl_readwrite_bad!(fiemap, nix::request_code_readwrite!(b'f', 11, size_of::<FiemapHead>()), Req);
    // struct fiemap and struct fiemap_extent (include/uapi/linux/fiemap.h)
    const _: () = assert!(size_of::<FiemapHead>() == 32 && size_of::<FiemapExtent>() == 56);
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut out = Vec::new();
    let mut start = 0u64;
    loop {
        let mut req = Req {
            head: FiemapHead { start, length: u64::MAX - start, flags: FIEMAP_FLAG_SYNC, mapped: 0, count: N as u32, reserved: 0 },
            ext: [FiemapExtent::default(); N],
        };
        // SAFETY: our open fd; `req` is a fiemap header with room for the `count` extents it names
        if let Err(e) = unsafe { fiemap(f.as_raw_fd(), &mut req) } {
            bail!("FIEMAP on {}: {e}", path.display());
        }
        let n = req.head.mapped as usize;
        if n == 0 {
            break;
        }
        for e in &req.ext[..n] {
            out.push(Extent { logical: e.logical, physical: e.physical, length: e.length, flags: e.flags });
        }
        let last = req.ext[n - 1];
        if last.flags & FIEMAP_EXTENT_LAST != 0 {
            break;
        }
        start = last.logical + last.length;
    }
    Ok(out)
}

/// Bytes of regular-file data in shared extents under `dir`.
pub fn shared_bytes(dir: &Path) -> Result<u64> {
    let mut total = 0;
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).with_context(|| format!("cannot list {}", d.display()))?.flatten() {
            let ft = e.file_type()?;
            if ft.is_dir() {
                stack.push(e.path());
            } else if ft.is_file() {
                total += extents(&e.path())?.iter().filter(|x| x.flags & FIEMAP_EXTENT_SHARED != 0).map(|x| x.length).sum::<u64>();
            }
        }
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ioctl numbers nix builds are the kernel's (include/uapi/linux/fs.h).
    #[test]
    fn ioctl_numbers_match_the_kernel() {
        assert_eq!(nix::request_code_none!(0x12, 97), 0x1261); // BLKFLSBUF
        assert_eq!(nix::request_code_readwrite!(b'f', 11, 32), 0xC020_660B); // FS_IOC_FIEMAP
        assert_eq!(nix::request_code_readwrite!(0x94, 54, 24), 0xC018_9436); // FIDEDUPERANGE
    }

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
}
