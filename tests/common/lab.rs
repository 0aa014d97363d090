//! Hosts for tests as network namespaces joined by a bridge, built with iproute2 as a user
//! would build a lab (no faultline involved): a switch namespace holds the bridge, each host
//! namespace one end of a veth pair with its address. Removed on drop.

use std::process::Command;

pub struct Lab {
    pub prefix: String,
    /// (host name, namespace, address)
    pub hosts: Vec<(String, String, String)>,
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().unwrap();
    assert!(out.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
}

impl Lab {
    /// Hosts `names` at 10.99.0.1, .2, ... (in their own namespaces, so no clash with the
    /// machine's or other tests' addresses).
    pub fn new(tag: &str, names: &[&str]) -> Lab {
        let prefix = format!("fl-lab-{}", super::unique(tag));
        let sw = format!("{prefix}-sw");
        let mut lab = Lab { prefix: prefix.clone(), hosts: vec![] };
        ip(&["netns", "add", &sw]);
        ip(&["-n", &sw, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", &sw, "link", "set", "br0", "up"]);
        for (i, n) in names.iter().enumerate() {
            let ns = format!("{prefix}-{n}");
            let addr = format!("10.99.0.{}", i + 1);
            ip(&["netns", "add", &ns]);
            let (a, b) = (format!("v{i}"), format!("p{i}"));
            ip(&["-n", &ns, "link", "add", &a, "type", "veth", "peer", "name", &b, "netns", &sw]);
            ip(&["-n", &sw, "link", "set", &b, "master", "br0", "up"]);
            ip(&["-n", &ns, "addr", "add", &format!("{addr}/24"), "dev", &a]);
            ip(&["-n", &ns, "link", "set", &a, "up"]);
            ip(&["-n", &ns, "link", "set", "lo", "up"]);
            lab.hosts.push((n.to_string(), ns, addr));
        }
        lab
    }

    pub fn ns(&self, host: &str) -> &str {
        &self.hosts.iter().find(|h| h.0 == host).expect("lab host").1
    }
    pub fn addr(&self, host: &str) -> &str {
        &self.hosts.iter().find(|h| h.0 == host).expect("lab host").2
    }
    /// The `agents:` block of an experiment reaching `hosts` (in this order) by `ip netns
    /// exec`, each running the faultline at `faultline`.
    pub fn exec_agents_yaml(&self, hosts: &[&str], faultline: &str) -> String {
        let mut a = "  agents:\n".to_string();
        for h in hosts {
            a += &format!("    {h}: {{exec: [ip, netns, exec, {}], address: {}, faultline: {faultline}}}\n", self.ns(h), self.addr(h));
        }
        a
    }
    /// Pids of processes in a host's namespace.
    pub fn pids(&self, host: &str) -> Vec<i32> {
        let out = Command::new("ip").args(["netns", "pids", self.ns(host)]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).split_whitespace().filter_map(|p| p.parse().ok()).collect()
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for (_, ns, _) in &self.hosts {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
        let _ = Command::new("ip").args(["netns", "del", &format!("{}-sw", self.prefix)]).status();
    }
}
