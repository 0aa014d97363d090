//! TUN devices opened inside a host's network namespace. The relay holds the file descriptor;
//! the device lives in the host. Opened with a virtio-net header in front of each packet
//! (IFF_VNET_HDR), so that while a link has no fault the kernel may hand over whole TCP
//! segmentation bursts (up to 64 KiB, one read) and checksums left to the receiver: the
//! relay then moves a burst per system call. Offloads are turned off on a host whose
//! outgoing links have rules, so faults see the packets TCP would put on a wire.

use anyhow::{Context, Result, bail};
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// The virtio-net header in front of each packet (struct virtio_net_hdr, little endian).
pub const VNET_HDR: usize = 10;

/// Offloads the relay accepts while a host's links are clean: checksums, TCP segmentation.
const OFFLOADS: libc::c_uint = libc::TUN_F_CSUM | libc::TUN_F_TSO4 | libc::TUN_F_TSO6 | libc::TUN_F_TSO_ECN;

#[repr(C)]
struct IfReq {
    name: [libc::c_char; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// Open TUN device `ifname` in the network namespace at `ns_path` (a thread enters the
/// namespace for the open: a TUN device is created in its opener's namespace).
pub fn open_in(ns_path: &std::path::Path, ifname: &str) -> Result<OwnedFd> {
    if ifname.len() >= libc::IFNAMSIZ {
        bail!("interface name {ifname} is too long");
    }
    let ns = File::open(ns_path).with_context(|| format!("cannot open network namespace {}", ns_path.display()))?;
    let name = ifname.to_string();
    std::thread::scope(|s| {
        s.spawn(move || -> Result<OwnedFd> {
            nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).context("setns into the host's network namespace")?;
            let f = std::fs::OpenOptions::new().read(true).write(true).open("/dev/net/tun").context("cannot open /dev/net/tun")?;
            let mut req = IfReq { name: [0; libc::IFNAMSIZ], flags: (libc::IFF_TUN | libc::IFF_NO_PI | libc::IFF_VNET_HDR) as libc::c_short, _pad: [0; 22] };
            for (d, s) in req.name.iter_mut().zip(name.bytes()) {
                *d = s as libc::c_char;
            }
            // SAFETY: TUNSETIFF reads an ifreq; `req` is one, alive for the call
            if unsafe { libc::ioctl(f.as_raw_fd(), libc::TUNSETIFF, &mut req) } < 0 {
                return Err(std::io::Error::last_os_error()).context("TUNSETIFF");
            }
            let fd: OwnedFd = f.into();
            set_nonblocking(&fd)?;
            Ok(fd)
        })
        .join()
        .map_err(|_| anyhow::anyhow!("TUN open thread panicked"))?
    })
}

fn set_nonblocking(fd: &OwnedFd) -> Result<()> {
    use nix::fcntl::{FcntlArg, OFlag, fcntl};
    let fl = OFlag::from_bits_truncate(fcntl(fd, FcntlArg::F_GETFL)?);
    fcntl(fd, FcntlArg::F_SETFL(fl | OFlag::O_NONBLOCK))?;
    Ok(())
}

/// Let the kernel hand this TUN device segmentation bursts and partial checksums (`on`), or
/// finished packets of at most the MTU (`off`).
pub fn set_offloads(fd: &OwnedFd, on: bool) -> Result<()> {
    let v: libc::c_uint = if on { OFFLOADS } else { 0 };
    // SAFETY: TUNSETOFFLOAD takes its argument by value
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETOFFLOAD, v as libc::c_ulong) } < 0 {
        return Err(std::io::Error::last_os_error()).context("TUNSETOFFLOAD");
    }
    Ok(())
}

/// An eventfd that wakes the relay threads for shutdown.
pub fn eventfd() -> Result<OwnedFd> {
    // SAFETY: plain syscall; a valid result is a new fd we own
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("eventfd");
    }
    // SAFETY: fd was just returned by eventfd and is owned by nobody else
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}
