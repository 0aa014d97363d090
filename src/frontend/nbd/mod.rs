//! The disk served over the Network Block Device protocol (`faultline serve --nbd`): one of the
//! three transports that call the top of the disk's layer chain. The wire format is `crate::nbd`
//! (shared with the client store); `server` holds the sessions, late replies go through
//! `frontend::delay`.
//! docs/nbd.md says what is supported.

pub mod server;

use crate::disk::Disk;
use anyhow::{Context, Result, bail};
use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// Where the server listens: `tcp://HOST:PORT` (port 0: any free port) or `unix:PATH`.
#[derive(Clone, Debug, PartialEq)]
pub enum NbdAddr {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl std::str::FromStr for NbdAddr {
    type Err = String;
    fn from_str(s: &str) -> Result<NbdAddr, String> {
        if let Some(hp) = s.strip_prefix("tcp://") {
            let hp = hp.trim_end_matches('/');
            let mut addrs = hp.to_socket_addrs().map_err(|e| format!("`{s}`: {e} (expected tcp://HOST:PORT, e.g. tcp://127.0.0.1:10809)"))?;
            return addrs.next().map(NbdAddr::Tcp).ok_or_else(|| format!("`{s}`: no address"));
        }
        if let Some(p) = s.strip_prefix("unix:")
            && !p.is_empty()
        {
            return Ok(NbdAddr::Unix(PathBuf::from(p)));
        }
        Err(format!("`{s}` is not an NBD address; allowed: tcp://HOST:PORT, unix:PATH"))
    }
}

/// The export as libnbd's URI names it (nbdinfo, nbdcopy, nbdsh -u, qemu accept it).
pub fn uri(addr: &NbdAddr) -> String {
    match addr {
        NbdAddr::Tcp(SocketAddr::V4(a)) => format!("nbd://{}:{}", a.ip(), a.port()),
        NbdAddr::Tcp(SocketAddr::V6(a)) => format!("nbd://[{}]:{}", a.ip(), a.port()),
        NbdAddr::Unix(p) => format!("nbd+unix:///?socket={}", p.display()),
    }
}

enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

/// A listening NBD server. Dropping it stops accepting, ends every connection and waits for
/// their threads.
pub struct NbdServer {
    shared: Arc<server::Shared>,
    /// The address actually bound (a TCP port 0 resolved).
    pub addr: NbdAddr,
    listen_fd: i32,
    accept: Option<std::thread::JoinHandle<()>>,
}

impl NbdServer {
    pub fn start(disk: Arc<Disk>, addr: &NbdAddr) -> Result<NbdServer> {
        let (listener, addr) = match addr {
            NbdAddr::Tcp(a) => {
                let l = TcpListener::bind(a).with_context(|| format!("cannot listen on tcp://{a}"))?;
                let bound = l.local_addr()?;
                (Listener::Tcp(l), NbdAddr::Tcp(bound))
            }
            NbdAddr::Unix(p) => {
                if p.exists() {
                    // a socket nobody answers on is a leftover; anything else is not ours
                    use std::os::unix::fs::FileTypeExt;
                    let is_sock = std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_socket());
                    if !is_sock || std::os::unix::net::UnixStream::connect(p).is_ok() {
                        bail!("{} exists{}", p.display(), if is_sock { " and a server answers on it" } else { " and is not a socket" });
                    }
                    std::fs::remove_file(p)?;
                }
                let l = UnixListener::bind(p).with_context(|| format!("cannot listen on unix:{}", p.display()))?;
                (Listener::Unix(l), NbdAddr::Unix(p.clone()))
            }
        };
        let shared = Arc::new(server::Shared::new(disk));
        let listen_fd = match &listener {
            Listener::Tcp(l) => l.as_raw_fd(),
            Listener::Unix(l) => l.as_raw_fd(),
        };
        let sh = shared.clone();
        let accept = std::thread::Builder::new().name("faultline-nbd-accept".into()).spawn(move || accept_loop(&sh, listener))?;
        Ok(NbdServer { shared, addr, listen_fd, accept: Some(accept) })
    }

    pub fn uri(&self) -> String {
        uri(&self.addr)
    }

    /// The server's request counters (the control socket's `stats` shows them as `nbd_server`).
    pub fn counters(&self) -> Arc<crate::nbd::ServerCounters> {
        self.shared.counters.clone()
    }

    /// Connections refused because the limit was reached, since the start.
    pub fn refused(&self) -> u64 {
        self.shared.refused.load(Ordering::Relaxed)
    }
}

fn accept_loop(sh: &Arc<server::Shared>, l: Listener) {
    loop {
        let got = match &l {
            Listener::Tcp(l) => l.accept().map(|(s, a)| (crate::nbd::sock::Sock::Tcp(s), a.to_string())),
            Listener::Unix(l) => l.accept().map(|(s, _)| (crate::nbd::sock::Sock::Unix(s), "a unix socket client".to_string())),
        };
        if sh.stop.load(Ordering::Relaxed) {
            return;
        }
        match got {
            Ok((s, peer)) => sh.admit(s, peer),
            // out of file descriptors and the like: wait a little rather than spin
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(10)),
        }
    }
}

impl Drop for NbdServer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        // wakes the blocked accept(2) with an error (Linux); the listener is closed by its thread
        // SAFETY: a plain syscall on the listening socket, which the accept thread keeps open
        // until it is joined below
        unsafe { libc::shutdown(self.listen_fd, libc::SHUT_RDWR) };
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        self.shared.close_all();
        if let NbdAddr::Unix(p) = &self.addr {
            let _ = std::fs::remove_file(p);
        }
    }
}
