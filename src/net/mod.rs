//! Emulated hosts and the network between them (docs/net.md). Each host is a network
//! namespace `fl-<pid>-<name>` with one TUN device `fl0` holding its address 10.77.0.N/24;
//! every packet one host sends another leaves through its TUN device into the relay
//! (`relay`), which applies the link's faults and writes it into the other host's TUN device.
//! Namespaces are created with iproute2 (`sys::netns`) and recorded in the ledger first, so
//! `faultline cleanup` deletes them (with their devices and processes) after a crash.
//!
//! Unless told otherwise (`RelayOptions::always_relay`), each pair of hosts (up to
//! `MAX_BYPASS_HOSTS` hosts) is also joined by a veth pair, the kernel fast path a link takes
//! while no rule applies to it (`relay`, docs/net.md).
//!
//! `Network::up_veth` builds the same two hosts joined by a plain veth pair instead, no relay:
//! the baseline the relay is measured against (bench/net.sh).

pub mod control;
pub mod egress;
pub mod packet;
pub mod relay;
pub mod tun;

use crate::spec::net::{HostsSpec, NetRule};
use crate::sys::ledger::LedgerFile;
use crate::sys::netns;
use anyhow::{Context, Result, bail};
use serde_json::Value;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use relay::RelayOptions;

/// The interface each host reaches the others through.
pub const IFNAME: &str = "fl0";

/// Up to this many hosts get the veth fast path (a veth pair per pair of hosts: 120 at 16).
pub const MAX_BYPASS_HOSTS: usize = 16;

/// The veth device in a host that reaches the host at `peer` (index) directly.
pub fn bypass_ifname(peer: usize) -> String {
    format!("flp{peer}")
}

/// The address of the host at `index` (in declaration order).
pub fn address(index: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 77, (index / 250) as u8, (index % 250 + 1) as u8)
}

#[derive(Clone, Debug)]
pub struct Host {
    pub name: String,
    /// The `ip netns` name: `ip netns exec NAMESPACE cmd...` runs cmd in the host.
    pub namespace: String,
    pub address: Ipv4Addr,
}

impl Host {
    /// A command run inside this host (`ip netns exec`).
    pub fn command(&self, program: &str) -> std::process::Command {
        let mut c = std::process::Command::new("ip");
        c.args(["netns", "exec", &self.namespace, program]);
        c
    }
}

pub struct Network {
    hosts: Vec<Host>,
    relay: Option<Arc<Relay>>,
    ledger: Option<LedgerFile>,
    socket: Option<PathBuf>,
}

use relay::Relay;

fn ns_name(host: &str) -> String {
    format!("fl-{}-{host}", std::process::id())
}

impl Network {
    /// Build the hosts (namespaces, TUN devices, addresses, routes) and start the relay.
    /// Anything built is removed again if a later step fails.
    pub fn up(names: &[String], opts: RelayOptions) -> Result<Network> {
        let mut net = Network::namespaces(names)?;
        let mut ports = Vec::new();
        for (i, h) in net.hosts.iter().enumerate() {
            let fd = tun::open_in(&netns::path(&h.namespace), IFNAME).with_context(|| format!("host {}: cannot create its TUN device", h.name))?;
            let n = &h.namespace;
            let addr = format!("{}/16", h.address);
            netns::ip(&["-n", n, "addr", "add", &addr, "dev", IFNAME])?;
            // a NIC's queue: a host that sends faster than the relay forwards (possible only
            // while its links have per-packet rules) queues here, and beyond it drops, as a
            // router's queue would
            netns::ip(&["-n", n, "link", "set", IFNAME, "txqueuelen", "1000", "up"])?;
            ports.push(relay::Port { name: h.name.clone(), addr: address(i), fd, raw: false, namespace: h.namespace.clone(), bypass: vec![None; names.len()] });
        }
        if !opts.always_relay && names.len() <= MAX_BYPASS_HOSTS {
            net.bypass_links(&mut ports)?;
        }
        net.relay = Some(Arc::new(Relay::start(ports, opts)?));
        Ok(net)
    }

    /// The fast path: a veth pair per pair of hosts, each host's route to the peer (a /32,
    /// more specific than fl0's subnet) on it; the relay moves a route to fl0 while a rule
    /// applies. Reverse-path filtering is off in the hosts: a direction may take the relay
    /// while the other takes the veth.
    fn bypass_links(&self, ports: &mut [relay::Port]) -> Result<()> {
        let n = self.hosts.len();
        for h in &self.hosts {
            let out = std::process::Command::new("ip")
                .args(["netns", "exec", &h.namespace, "sysctl", "-qw", "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0"])
                .output()
                .context("cannot run sysctl in a host")?;
            if !out.status.success() {
                bail!("host {}: sysctl rp_filter=0 failed: {}", h.name, String::from_utf8_lossy(&out.stderr).trim());
            }
        }
        for a in 0..n {
            for b in a + 1..n {
                let (ha, hb) = (&self.hosts[a], &self.hosts[b]);
                let (da, db) = (bypass_ifname(b), bypass_ifname(a));
                netns::ip(&["-n", &ha.namespace, "link", "add", &da, "type", "veth", "peer", "name", &db, "netns", &hb.namespace])?;
                for (h, dev, peer) in [(ha, &da, hb), (hb, &db, ha)] {
                    netns::ip(&["-n", &h.namespace, "link", "set", dev, "up"])?;
                    netns::ip(&["-n", &h.namespace, "route", "replace", &format!("{}/32", peer.address), "dev", dev])?;
                }
                let route = |h: &Host, peer: &Host, dev: &str| -> Vec<String> {
                    ["-n", &h.namespace, "route", "replace", &format!("{}/32", peer.address), "dev", dev].map(String::from).to_vec()
                };
                ports[a].bypass[b] = Some(relay::Bypass { dev: da.clone(), to_relay: route(ha, hb, IFNAME), direct: route(ha, hb, &da) });
                ports[b].bypass[a] = Some(relay::Bypass { dev: db.clone(), to_relay: route(hb, ha, IFNAME), direct: route(hb, ha, &db) });
            }
        }
        Ok(())
    }

    /// Two hosts joined by a veth pair, no relay and no faults (the benchmark's baseline).
    pub fn up_veth(names: &[String]) -> Result<Network> {
        if names.len() != 2 {
            bail!("a veth network joins exactly two hosts; got {}", names.len());
        }
        let net = Network::namespaces(names)?;
        let (a, b) = (&net.hosts[0], &net.hosts[1]);
        netns::ip(&["-n", &a.namespace, "link", "add", IFNAME, "type", "veth", "peer", "name", IFNAME, "netns", &b.namespace])?;
        for h in &net.hosts {
            netns::ip(&["-n", &h.namespace, "addr", "add", &format!("{}/16", h.address), "dev", IFNAME])?;
            netns::ip(&["-n", &h.namespace, "link", "set", IFNAME, "up"])?;
        }
        Ok(net)
    }

    /// The namespaces with loopback up, recorded in a ledger before each is created.
    fn namespaces(names: &[String]) -> Result<Network> {
        let spec =
            HostsSpec { hosts: names.iter().map(|n| crate::spec::net::HostSpec { name: n.clone(), role: crate::spec::net::HostRole::Client }).collect() };
        spec.validate().map_err(anyhow::Error::msg)?;
        let mut net = Network { hosts: Vec::new(), relay: None, ledger: Some(LedgerFile::create()?), socket: None };
        for (i, name) in names.iter().enumerate() {
            let ns = ns_name(name);
            if netns::exists(&ns) {
                bail!("network namespace {ns} exists already (a run of a process with this pid that was not cleaned up? run `faultline cleanup`)");
            }
            net.ledger.as_mut().unwrap().update(|l| l.netns.push(ns.clone()))?;
            netns::add(&ns)?;
            netns::ip(&["-n", &ns, "link", "set", "lo", "up"])?;
            net.hosts.push(Host { name: name.clone(), namespace: ns, address: address(i) });
        }
        Ok(net)
    }

    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    pub fn host(&self, name: &str) -> Option<&Host> {
        self.hosts.iter().find(|h| h.name == name)
    }

    fn relay(&self) -> Result<&Relay> {
        self.relay.as_deref().context("this network has no relay (a veth baseline)")
    }

    /// Install a fault rule; returns its id.
    pub fn set(&self, rule: NetRule) -> Result<u64> {
        self.relay()?.set(rule)
    }

    /// Remove rules by id, or all (None).
    pub fn clear(&self, ids: Option<&[u64]>) -> Result<usize> {
        self.relay()?.clear(ids)
    }

    /// Hosts, rules and per-link counters (the control socket's `show`).
    pub fn show(&self) -> Result<Value> {
        Ok(self.relay()?.show())
    }

    /// Serve the control socket at `path` (recorded in the ledger, removed at teardown).
    pub fn serve_control(&mut self, path: &Path) -> Result<()> {
        let relay = self.relay.clone().context("this network has no relay (a veth baseline)")?;
        if let Some(l) = self.ledger.as_mut() {
            l.update(|l| l.net_socket = Some(path.to_owned()))?;
        }
        control::start(path, relay)?;
        self.socket = Some(path.to_owned());
        Ok(())
    }

    /// Stop the relay and delete the namespaces (killing what still runs in them). Returns
    /// what was done; an error names what could not be removed (the ledger then stays for
    /// `faultline cleanup`).
    pub fn down(mut self) -> Result<Vec<String>> {
        self.teardown()
    }

    fn teardown(&mut self) -> Result<Vec<String>> {
        let mut log = Vec::new();
        if let Some(r) = self.relay.take() {
            // the control thread holds a clone; stopping through the shared flag suffices
            match Arc::try_unwrap(r) {
                Ok(r) => r.stop(),
                Err(r) => r.halt(),
            }
        }
        let mut failed = Vec::new();
        for h in self.hosts.drain(..).rev() {
            match netns::delete(&h.namespace) {
                Ok(done) => log.extend(done),
                Err(e) => failed.push(format!("{}: {e:#}", h.namespace)),
            }
        }
        if let Some(s) = self.socket.take() {
            let _ = std::fs::remove_file(s);
        }
        if !failed.is_empty() {
            self.ledger.take(); // kept on disk for `faultline cleanup`
            bail!("could not delete network namespaces: {}", failed.join("; "));
        }
        if let Some(l) = self.ledger.take() {
            l.remove();
        }
        Ok(log)
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        if self.ledger.is_some()
            && let Err(e) = self.teardown()
        {
            eprintln!("faultline: {e:#}");
        }
    }
}
