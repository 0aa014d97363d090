//! The relay's rule engine on a real host, for the packets this host sends to named peers
//! (what tc netem does on an egress queue, for kernels without sch_netem): a TUN device in the
//! host's own namespace, each faulted peer's /32 routed through it while one of its rules is
//! active or about to be (the relay's `Bypass`, so windows start and end on the relay's
//! clock), and the packets sent on through a raw IP socket per peer (IP_HDRINCL) bound to the
//! device the host's routes reach that peer by (SO_BINDTODEVICE: the route lookup then skips
//! the /32 through the TUN device). Offloads stay off on the TUN device (a raw socket takes
//! only finished packets). IPv4 only.
//!
//! The TUN device is not persistent: it and its routes vanish when this process ends, however
//! it ends. It is also in the caller's ledger, with any rp_filter changed (a strict reverse-path
//! filter would drop the peer's answers, which come back on the direct device).

use super::relay::{Bypass, Port, Relay, RelayOptions};
use super::tun;
use crate::spec::net::NetRule;
use crate::sys::ledger::LedgerFile;
use anyhow::{Context, Result, bail};
use serde_json::Value;
use std::net::Ipv4Addr;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::time::Instant;

pub struct Egress {
    relay: Relay,
    /// (peer, device it is reached by)
    pub paths: Vec<(String, String)>,
}

/// `ip -j ARGS` as JSON.
fn ip_json(args: &[&str]) -> Result<Value> {
    let out = std::process::Command::new("ip").arg("-j").args(args).output().context("cannot run `ip` (install iproute2)")?;
    if !out.status.success() {
        bail!("`ip {}` failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    serde_json::from_slice(&out.stdout).with_context(|| format!("`ip -j {}`: not JSON", args.join(" ")))
}

/// A raw IPv4 socket that sends whole packets (IPPROTO_RAW implies IP_HDRINCL) out of `dev`
/// to `peer` (connected, so a plain write sends), non-blocking (a full queue drops).
fn raw_socket(dev: &str, peer: Ipv4Addr) -> Result<OwnedFd> {
    // SAFETY: plain syscall; a valid result is a new descriptor we own
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, libc::IPPROTO_RAW) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("raw IP socket");
    }
    // SAFETY: fd was just returned by socket and is owned by nobody else
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let raw = std::os::fd::AsRawFd::as_raw_fd(&fd);
    // SAFETY: SO_BINDTODEVICE reads `dev.len()` bytes of the name, alive for the call
    if unsafe { libc::setsockopt(raw, libc::SOL_SOCKET, libc::SO_BINDTODEVICE, dev.as_ptr().cast(), dev.len() as libc::socklen_t) } < 0 {
        return Err(std::io::Error::last_os_error()).with_context(|| format!("SO_BINDTODEVICE {dev}"));
    }
    let sa = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr { s_addr: u32::from(peer).to_be() },
        sin_zero: [0; 8],
    };
    // SAFETY: connect reads a sockaddr_in of the size given, alive for the call
    if unsafe { libc::connect(raw, (&sa as *const libc::sockaddr_in).cast(), std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t) } < 0 {
        return Err(std::io::Error::last_os_error()).with_context(|| format!("connect the raw socket to {peer}"));
    }
    Ok(fd)
}

impl Egress {
    /// The engine for packets from this host (`local`, `local_addr`) to `peers` (name,
    /// address), through TUN device `tun`; recorded in `ledger` before each thing is made.
    pub fn start(local: &str, local_addr: Ipv4Addr, peers: &[(String, Ipv4Addr)], tun_name: &str, ledger: &mut LedgerFile) -> Result<Egress> {
        let mut paths = Vec::new();
        for (name, addr) in peers {
            let r = ip_json(&["route", "get", &addr.to_string()])?;
            let dev = r[0]["dev"].as_str().with_context(|| format!("no route to peer {name} ({addr})"))?.to_string();
            if dev == "lo" {
                bail!("peer {name} ({addr}) is this host");
            }
            paths.push((name.clone(), dev));
        }
        let mut devs: Vec<&str> = paths.iter().map(|p| p.1.as_str()).collect();
        devs.sort();
        devs.dedup();
        // the peers' answers come back on the direct device while the route to them points at
        // the TUN device: a strict reverse-path filter (1) there would drop them; loose (2)
        // checks only that a route back exists (the effective value is the larger of `all` and
        // the device's)
        for d in &devs {
            let f = PathBuf::from(format!("/proc/sys/net/ipv4/conf/{d}/rp_filter"));
            let all = std::fs::read_to_string("/proc/sys/net/ipv4/conf/all/rp_filter").unwrap_or_default();
            let old = std::fs::read_to_string(&f).unwrap_or_default();
            if all.trim() == "1" || old.trim() == "1" {
                ledger.update(|l| l.sysctls.push((f.clone(), old.trim().to_string())))?;
                std::fs::write(&f, "2").with_context(|| format!("cannot set {} to 2 (loose)", f.display()))?;
            }
        }
        let mtu = devs.iter().filter_map(|d| ip_json(&["link", "show", "dev", d]).ok().and_then(|v| v[0]["mtu"].as_u64())).min().unwrap_or(1500);
        ledger.update(|l| l.net_devices.push(tun_name.to_string()))?;
        let fd = tun::open_in(std::path::Path::new("/proc/self/ns/net"), tun_name).context("cannot create the TUN device")?;
        crate::sys::netns::ip(&["link", "set", tun_name, "mtu", &mtu.to_string(), "txqueuelen", "1000", "up"])?;
        let n = peers.len() + 1;
        let route = |addr: &Ipv4Addr, on: bool| -> Vec<String> {
            let dst = format!("{addr}/32");
            if on {
                ["route", "replace", &dst, "dev", tun_name, "src", &local_addr.to_string()].map(String::from).to_vec()
            } else {
                ["route", "del", &dst, "dev", tun_name].map(String::from).to_vec()
            }
        };
        let mut ports = vec![Port {
            name: local.to_string(),
            addr: local_addr,
            fd,
            raw: false,
            namespace: String::new(),
            bypass: std::iter::once(None)
                .chain(peers.iter().zip(&paths).map(|((_, a), (_, dev))| Some(Bypass { dev: dev.clone(), to_relay: route(a, true), direct: route(a, false) })))
                .collect(),
        }];
        for ((name, addr), (_, dev)) in peers.iter().zip(&paths) {
            ports.push(Port {
                name: name.clone(),
                addr: *addr,
                fd: raw_socket(dev, *addr).with_context(|| format!("peer {name}"))?,
                raw: true,
                namespace: String::new(),
                bypass: vec![None; n],
            });
        }
        Ok(Egress { relay: Relay::start(ports, RelayOptions::default())?, paths })
    }

    /// Install a rule whose window counts from `at`.
    pub fn set_at(&self, rule: NetRule, at: Instant) -> Result<u64> {
        self.relay.set_at(rule, at)
    }

    /// Rules and per-link counters (the relay's `show`).
    pub fn show(&self) -> Value {
        self.relay.show()
    }

    /// Stop; the TUN device and its routes go when its descriptor closes.
    pub fn stop(self) {
        self.relay.stop();
    }
}
