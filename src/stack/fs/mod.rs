//! File-system stacks on faultline block devices: mkfs + mount (ext4, xfs, btrfs), btrfs raid1
//! over two devices, dedup (btrfs, or xfs with reflink), and a user command on top. Every
//! mount is recorded in the ledger before it is made and taken down before the devices under
//! it (see docs/stacks.md). Here: building, mounting, cold cache and teardown; `devices`:
//! which devices are ours and what is mounted on them; `health`: btrfs counters and kernel
//! messages; `dedup`: the dedup step (`dedupe_range`: sharing given blocks with the kernel's
//! FIDEDUPERANGE ioctl) and FIEMAP.

pub use crate::spec::stack::{FsKind, StackSpec};
use crate::stack::command::{self, CommandEnv, CommandOutcome, CommandSpec};
pub use dedup::{DedupReport, Extent, FIEMAP_EXTENT_SHARED, extents, shared_bytes};
pub use dedupe_range::BlockDedupReport;
use devices::LIVE;
pub use devices::{is_own_device, release_on_device, unmount_fs, wait_unclaimed};
pub use health::{DeviceStats, parse_device_stats};

mod dedup;
mod dedupe_range;
mod devices;
mod health;
use crate::sys::ledger::{self, LedgerFile};
use crate::sys::mount;
use anyhow::{Context, Result, bail};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Clone, Debug, Default)]
pub struct BuildOptions {
    /// Allow devices that are not faultline loop devices of this process (mkfs destroys them).
    pub allow_foreign_devices: bool,
}

/// A stack built from its `StackSpec` (its file system mounted, or the raw devices). Torn down
/// by `teardown` or on drop.
pub struct BuiltStack {
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

pub(super) fn run(cmd: &mut Command) -> Result<String> {
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

pub(super) fn which(prog: &str) -> Result<PathBuf> {
    for d in ["/usr/sbin", "/usr/bin", "/sbin", "/bin", "/usr/local/sbin", "/usr/local/bin"] {
        let p = Path::new(d).join(prog);
        if p.exists() {
            return Ok(p);
        }
    }
    bail!("`{prog}` is not installed (scripts/setup.sh installs it)")
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

impl BuiltStack {
    /// Build `spec` on `devices` (faultline loop devices of this process; others are refused).
    pub fn build(spec: &StackSpec, devices: &[PathBuf]) -> Result<BuiltStack> {
        Self::build_with(spec, devices, &BuildOptions::default())
    }

    pub fn build_with(spec: &StackSpec, devices: &[PathBuf], opts: &BuildOptions) -> Result<BuiltStack> {
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
        let mut me = BuiltStack {
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
            StackSpec::Dedup { kind, mkfs, mount, .. } => {
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

    /// After a power cut: unmount without syncing anything (the device fails every request
    /// until power-on). Retried while busy; a file system that stays busy is an error, not a
    /// lazy unmount: its superblock and cache would live on, and the mount after power-on
    /// would reuse them instead of reading what survived. The mount point and its ledger
    /// entry stay for the mount after power-on.
    pub fn crash_unmount(&mut self) -> Result<()> {
        let Some(mnt) = self.mountpoint.clone() else { return Ok(()) };
        LIVE.lock().unwrap().retain(|(m, _)| *m != mnt);
        if mount::is_mounted(&mnt) && mount::unmount(&mnt, Duration::from_secs(10))? {
            for d in &self.devices {
                wait_unclaimed(d).context("after the power cut the file system stayed busy (detached lazily, still holding the device)")?;
            }
        }
        self.forget_btrfs();
        Ok(())
    }

    /// Unmount cleanly (after the replay mount, before the check), keeping the mount point.
    pub fn unmount_kept(&mut self) -> Result<()> {
        if self.unmount()? {
            bail!("{} was busy: unmounted lazily; the check would race it", self.mountpoint.as_ref().map(|m| m.display().to_string()).unwrap_or_default());
        }
        // the check must read the file system as the unmount left it, not a live one
        for d in &self.devices {
            wait_unclaimed(d).context("after the replay mount's unmount the file system stayed alive")?;
        }
        self.forget_btrfs();
        Ok(())
    }

    /// Mount again on the same mount point (after power-on: the journal replays).
    pub fn remount(&mut self) -> Result<()> {
        self.mount()
    }

    fn forget_btrfs(&self) {
        if self.kind == Some(FsKind::Btrfs)
            && let Ok(b) = which("btrfs")
        {
            for d in &self.devices {
                let _ = Command::new(&b).args(["device", "scan", "--forget"]).arg(d).output();
            }
        }
    }

    /// Drop the devices' buffer cache (BLKFLSBUF) without an fsync first. Done while the
    /// power is off (dirty pages fail to write and are dropped) and again after power-on, so
    /// nothing cached above the device reaches what the check, the mount or the oracle read.
    pub fn drop_device_cache(&self) -> Result<()> {
        for d in &self.devices {
            let f = std::fs::File::open(d).with_context(|| format!("cannot open {}", d.display()))?;
            use std::os::fd::AsRawFd;
            nix::ioctl_none!(blkflsbuf, 0x12, 97);
            // SAFETY: our open fd; the ioctl takes no argument. Its writeback of dirty pages
            // fails while the power is off: the error is expected and ignored then
            let _ = unsafe { blkflsbuf(f.as_raw_fd()) };
        }
        Ok(())
    }

    /// The file system's own read-only check on the (unmounted) device: `e2fsck -fn`,
    /// `xfs_repair -n`, `btrfs check --readonly`. None on a raw stack.
    pub fn fs_check(&self) -> Result<Option<crate::report::model::FsCheck>> {
        let Some(kind) = self.kind else { return Ok(None) };
        let (prog, args): (&str, &[&str]) = match kind {
            FsKind::Ext4 => ("e2fsck", &["-f", "-n"]),
            FsKind::Xfs => ("xfs_repair", &["-n"]),
            FsKind::Btrfs => ("btrfs", &["check", "--readonly"]),
        };
        let mut c = Command::new(which(prog)?);
        c.args(args).arg(&self.devices[0]);
        use std::os::unix::process::CommandExt;
        // SAFETY: the hook runs in the forked child before exec and makes one async-signal-safe
        // call (prctl): a check must not outlive a killed run and keep its device busy
        unsafe {
            c.pre_exec(|| crate::sys::process::die_with_parent(nix::sys::signal::Signal::SIGKILL));
        }
        let out = c.output().with_context(|| format!("cannot run {prog}"))?;
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        Ok(Some(crate::report::model::FsCheck {
            command: format!("{prog} {} {}", args.join(" "), self.devices[0].display()),
            exit_code: out.status.code(),
            verdict: if out.status.success() { "clean" } else { "errors" }.into(),
            output_tail: lines[lines.len().saturating_sub(12)..].join("\n"),
        }))
    }

    /// Environment for a command on this stack.
    pub fn command_env(&self) -> CommandEnv {
        CommandEnv { device: self.devices.first().cloned(), devices: self.devices.clone(), mount: self.mountpoint.clone(), acks: None }
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
        } else {
            // btrfs keeps scanned devices registered; forget them before the loop devices go
            self.forget_btrfs();
        }
        let _ = std::fs::remove_dir(&mnt);
        if let Some(l) = self.ledger.take() {
            l.remove();
        }
        Ok(notes)
    }
}

impl Drop for BuiltStack {
    fn drop(&mut self) {
        match self.release() {
            Ok(notes) => notes.iter().for_each(|n| eprintln!("faultline: {n}")),
            Err(e) => eprintln!("faultline: stack teardown: {e:#}"),
        }
    }
}
