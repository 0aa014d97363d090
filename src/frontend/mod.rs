//! Exposing the disk to the kernel: a FUSE file attached to a loop device (/dev/loopN), and the
//! control socket. No fault logic here.

pub mod control;
pub mod cpu_latency;
pub mod delay;
pub mod fuse;
pub mod guard;
pub mod nbd;
pub mod poll;
pub mod steer;
pub mod uring;

use crate::disk::Disk;
pub use crate::spec::disk::{DEFAULT_BUSY_POLL, FrontendOptions as Options};
use crate::sys::ledger::LedgerFile;
use crate::sys::loopdev;
use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Fail early, with the reason, where the front end cannot work.
pub fn preflight() -> Result<()> {
    // SAFETY: geteuid has no arguments and cannot fail
    if unsafe { libc::geteuid() } != 0 {
        bail!("faultline must run as root: it mounts FUSE and attaches loop devices");
    }
    use std::os::unix::fs::FileTypeExt;
    match std::fs::metadata("/dev/fuse") {
        Ok(m) if m.file_type().is_char_device() => {}
        Ok(_) => bail!("/dev/fuse is not a character device; FUSE is unavailable here"),
        Err(e) => bail!("/dev/fuse is missing ({e}); load the fuse module or run where FUSE is available (containers: --device /dev/fuse)"),
    }
    if !Path::new("/dev/loop-control").exists() {
        bail!("/dev/loop-control is missing: this kernel has no loop device support");
    }
    Ok(())
}

/// A disk exposed as a kernel block device.
pub struct Exposed {
    pub device: PathBuf,
    pub mountpoint: PathBuf,
    /// how requests reach the daemon: "io_uring", or "/dev/fuse" with the reason the ring
    /// was not used
    pub transport: String,
    /// why `--cpu-latency auto` could not ask (no /dev/cpu_dma_latency, ...), if so
    pub cpu_latency_unavailable: Option<String>,
    session: Option<fuser::BackgroundSession>,
    ring: Option<uring::RingServer>,
    poller: Arc<poll::Poller>,
}

impl Exposed {
    /// Mount the disk as a FUSE file and attach it to a loop device, recording each step.
    pub fn new(disk: Arc<Disk>, opts: &Options, ledger: &mut LedgerFile) -> Result<Exposed> {
        // before anything is made: with FAULTLINE_RING=off the kernel's switch is never touched
        let unavailable = uring::unavailable()?;
        let base = crate::sys::ledger::run_dir();
        let mountpoint = base.join(format!("mnt-{}-{}", std::process::id(), ledger.seq));
        std::fs::create_dir_all(&mountpoint).with_context(|| format!("cannot create {}", mountpoint.display()))?;
        ledger.update(|l| l.dirs.push(mountpoint.clone()))?;

        let mut cfg = fuser::Config::default();
        cfg.n_threads = Some(2);
        cfg.clone_fd = true;
        cfg.mount_options = vec![fuser::MountOption::FSName("faultline".into()), fuser::MountOption::Subtype("faultline".into())];
        // the ring and its buffers exist before the mount, so INIT asks for io_uring only
        // when it can be had; the kernel switch stays on until the ring is registered
        let mut transport = String::from("/dev/fuse");
        let (prepared, switch) = match opts.ring {
            uring::RingMode::Off => (None, None),
            mode => match unavailable
                .map_or_else(|| uring::Prepared::new(opts.ring_threads).and_then(|p| Ok((p, uring::Switch::on()?))), |why| Err(anyhow::anyhow!(why)))
            {
                Ok((p, sw)) => (Some(p), Some(sw)),
                Err(e) if mode == uring::RingMode::On => {
                    return Err(e.context("FUSE over io_uring was asked for (ring: on)"));
                }
                Err(e) => {
                    transport = format!("/dev/fuse (no io_uring: {e:#})");
                    (None, None)
                }
            },
        };
        ledger.update(|l| l.mounts.push(mountpoint.clone()))?;
        let bs = disk.block_size();
        let poller = Arc::new(poll::Poller::new(opts.busy_poll));
        let mut cpu_latency_unavailable = None;
        match cpu_latency::Hold::open(opts.cpu_latency, Arc::downgrade(&poller)) {
            Ok(Some(h)) => poller.hold_with(h),
            Ok(None) => {}
            // the default degrades to leaving the machine alone (said at start-up and in a
            // run's notes); an explicit `hold` fails
            Err(e) if opts.cpu_latency == cpu_latency::CpuLatency::Auto => cpu_latency_unavailable = Some(format!("{e:#}")),
            Err(e) => return Err(e),
        }
        let attrs = fuse::NodeAttrs::new(disk.clone());
        let session = fuser::Session::new(fuse::DiskFs::new(disk.clone(), attrs.clone(), poller.clone(), prepared.is_some()), &mountpoint, &cfg)
            .with_context(|| format!("cannot mount FUSE at {}", mountpoint.display()))?;
        use std::os::fd::AsFd;
        let dup = || session.as_fd().try_clone_to_owned().context("cannot dup the /dev/fuse fd");
        poller.attach(dup()?);
        let ring_fd = match prepared {
            Some(_) => Some(dup()?),
            None => None,
        };
        let session = session.spawn().context("cannot start the FUSE threads")?;
        let mut me = Exposed {
            device: PathBuf::new(),
            mountpoint: mountpoint.clone(),
            transport,
            cpu_latency_unavailable,
            session: Some(session),
            ring: None,
            poller: poller.clone(),
        };
        if let (Some(p), Some(fd)) = (prepared, ring_fd) {
            match p.serve(disk, fd, poller.clone(), attrs) {
                Ok(r) => {
                    me.ring = Some(r);
                    me.transport = "io_uring".into();
                }
                Err(e) if opts.ring == uring::RingMode::On => {
                    return Err(e.context("FUSE over io_uring was asked for (ring: on)"));
                }
                // a refused registration turns the connection's io_uring off: fuser serves
                Err(e) => me.transport = format!("/dev/fuse (no io_uring: {e:#})"),
            }
        }
        drop(switch);
        let file = mountpoint.join(fuse::FILE_NAME);
        // the loop device's logical sector size: the disk's block size, at most 4 KiB
        let device = loopdev::attach(&file, bs.min(4096))?;
        ledger.update(|l| {
            l.loops.push((device.clone(), file.clone()));
            l.device = Some(device.clone());
        })?;
        me.device = device.clone();
        // `auto` needs the ring's overlap signal (a sweep of several requests); the classic
        // path's two threads take queued requests one by one and look serial at any depth
        let mode = match opts.rq_affinity {
            steer::RqAffinity::Auto if me.ring.is_none() => steer::RqAffinity::Keep,
            m => m,
        };
        let steer = steer::Steer::open(&device, mode, |original| ledger.update(|l| l.rq_affinity.push((device.clone(), original))))?;
        if let Some(s) = steer {
            me.poller.steer_with(s);
        }
        Ok(me)
    }

    /// Detach the loop device, then unmount (the other order reports busy).
    pub fn teardown(mut self) -> Result<()> {
        self.release()
    }

    fn release(&mut self) -> Result<()> {
        let mut first_err = None;
        if !self.device.as_os_str().is_empty() {
            // before the detach: the setting stays with loopN for whoever attaches it next
            if let Some(Err(e)) = self.poller.steer().map(|s| s.restore()) {
                first_err.get_or_insert(e);
            }
            if let Err(e) = loopdev::detach(&self.device) {
                first_err.get_or_insert(e);
            }
            self.device = PathBuf::new();
        }
        // the ring thread ends once the unmount has ended every entry
        let ring = self.ring.take();
        if let Some(s) = self.session.take() {
            // The connection ends when the last user of the disk file is gone. Someone else
            // holding the loop device open (udev probing it, another run's blkid) defers the
            // loop's detach, and with it its hold on the file: the unmount is then lazy and
            // the FUSE threads and the ring would wait for as long as that lasts. Everything
            // of ours is released by now, so after a grace period abort the connection.
            let watchdog = crate::sys::fusectl::connection_of(&self.mountpoint).map(|conn| {
                let done = Arc::new((std::sync::Mutex::new(false), std::sync::Condvar::new()));
                let d = done.clone();
                let t = std::thread::spawn(move || {
                    let (m, c) = &*d;
                    let g = c.wait_timeout_while(m.lock().unwrap_or_else(|e| e.into_inner()), ABORT_AFTER, |done| !*done).map(|r| r.0);
                    if g.is_ok_and(|g| !*g) {
                        match crate::sys::fusectl::abort(conn) {
                            Ok(_) => eprintln!("faultline: FUSE connection {conn} still in use {ABORT_AFTER:?} after its unmount (a copy of the mount in another mount namespace, or the loop device held open elsewhere): aborted"),
                            Err(e) => eprintln!("faultline: cannot abort FUSE connection {conn}: {e:#}"),
                        }
                    }
                });
                (done, t)
            });
            // umount_and_join unmounts and waits for the FUSE threads
            if let Err(e) = s.umount_and_join()
                && crate::sys::mount::is_mounted(&self.mountpoint)
                && let Err(e2) = crate::sys::mount::unmount(&self.mountpoint, Duration::from_secs(1))
            {
                first_err.get_or_insert(e2.context(format!("after fuser: {e}")));
            }
            if let Some((done, t)) = watchdog {
                *done.0.lock().unwrap_or_else(|e| e.into_inner()) = true;
                done.1.notify_all();
                let _ = t.join();
            }
        }
        drop(ring);
        let _ = std::fs::remove_dir(&self.mountpoint);
        match first_err {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }
}

/// How long a torn-down disk's FUSE connection may outlive its unmount before it is aborted.
const ABORT_AFTER: Duration = Duration::from_secs(5);

impl Drop for Exposed {
    fn drop(&mut self) {
        if let Err(e) = self.release() {
            eprintln!("faultline: teardown: {e:#}");
        }
    }
}
