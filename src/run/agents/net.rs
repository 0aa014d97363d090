//! The network faults of an agents run: planned per sending host (nftables in the kernel for
//! partition and reset, the user-space engine for the rest), each host's helper (`faultline
//! agent --net-faults`, cluster::netfaults) applying them, and its report at the end.

use super::CALL_LIMIT;
use super::remote::{Remote, Shared};
pub(super) use crate::cluster::netfaults::NetPlan;
use crate::cluster::netfaults::NftChain;
use crate::cluster::proto::Op;
use crate::spec::experiment::Setup;
use crate::spec::networked::NetworkedHosts;
use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Whether a network fault needs the user-space engine on the sending host: all but
/// partition and reset, which nftables does in the kernel. Loss too: a drop in the sender's
/// output hook hits a whole segmentation burst and is reported to the socket, which resends
/// at once (docs/net.md, "Loss in the kernel"); the engine drops single wire packets.
fn needs_engine(f: &crate::spec::net::NetFault) -> bool {
    f.delay.is_some() || f.jitter.is_some() || f.rate.is_some() || f.duplicate.is_some() || f.reorder.is_some() || f.loss.is_some()
}

/// Plan the network faults on the sending hosts (one `faultline agent --net-faults` each),
/// or say why a host cannot apply one (before anything runs). Also says per host which path
/// each fault takes.
pub(super) fn plan_net_faults(setup: &Setup, hosts: &NetworkedHosts, remotes: &[Arc<Remote>], table: &str) -> Result<(Vec<NetPlan>, Vec<String>)> {
    let addr = |h: &str| -> Result<String> {
        remotes.iter().find(|r| r.spec.host == h).and_then(|r| r.spec.address.clone()).with_context(|| format!("host `{h}` has no `address` in `agents:`"))
    };
    let names = hosts.names();
    let mut plans: Vec<NetPlan> = Vec::new();
    let mut paths: Vec<String> = Vec::new();
    for (i, n) in setup.net_faults.iter().enumerate() {
        let label = format!("net fault #{} ({})", i + 1, n.describe());
        let f = &n.rule.fault;
        let pairs: Vec<(String, String)> = {
            let froms: Vec<String> = n.rule.from.clone().map_or_else(|| names.clone(), |f| vec![f]);
            let tos: Vec<String> = n.rule.to.clone().map_or_else(|| names.clone(), |t| vec![t]);
            let mut p: Vec<(String, String)> = froms.iter().flat_map(|a| tos.iter().filter(move |b| *b != a).map(move |b| (a.clone(), b.clone()))).collect();
            if n.rule.both {
                let rev: Vec<(String, String)> = p.iter().map(|(a, b)| (b.clone(), a.clone())).collect();
                p.extend(rev);
            }
            p.sort();
            p.dedup();
            p
        };
        let window = n.rule.window;
        let (from, to) = (window.map_or(Duration::ZERO, |w| w.from), window.and_then(|w| w.to));
        let engine = needs_engine(f);
        for (a, b) in &pairs {
            let k = match plans.iter().position(|p| p.host == *a) {
                Some(k) => k,
                None => {
                    plans.push(NetPlan { host: a.clone(), address: addr(a)?, table: table.to_string(), ..Default::default() });
                    plans.len() - 1
                }
            };
            let ip = addr(b)?;
            let p = &mut plans[k];
            if engine {
                if ip.parse::<std::net::Ipv4Addr>().is_err() || p.address.parse::<std::net::Ipv4Addr>().is_err() {
                    bail!("{label}: host {a} -> {b}: the user-space path (delay, jitter, rate, duplicate, reorder, loss) takes IPv4 addresses only");
                }
                if !p.peers.iter().any(|x| x.0 == *b) {
                    p.peers.push((b.clone(), ip.clone()));
                }
                p.engine.push(crate::spec::net::NetRule {
                    from: Some(a.clone()),
                    to: Some(b.clone()),
                    both: false,
                    window: Some(crate::spec::rule::Window { from, to }),
                    seed: n.rule.seed,
                    fault: f.clone(),
                });
                paths.push(format!("{label}: {a} -> {b}: user space (TUN + raw socket on {a})"));
                continue;
            }
            let mut stmt: Vec<String> = Vec::new();
            if f.partition {
                stmt.push("drop".into());
            }
            if f.reset {
                stmt.push("meta l4proto tcp reject with tcp reset".into());
            }
            let fam = if ip.contains(':') { "ip6" } else { "ip" };
            let chain = format!("f{i}");
            let rules: Vec<String> = stmt.iter().map(|s| format!("{fam} daddr {ip} {s}")).collect();
            match p.chains.iter_mut().find(|c| c.name == chain) {
                Some(c) => c.rules.extend(rules),
                None => p.chains.push(NftChain { name: chain, rules, from, to }),
            }
            paths.push(format!("{label}: {a} -> {b}: nftables on {a}"));
        }
    }
    // every host checks it has what its path needs
    for p in &plans {
        let r = remotes.iter().find(|r| r.spec.host == p.host).context("host")?;
        if !p.chains.is_empty() {
            let (ok, text) = r.exec(&["nft", "list", "tables"], None).unwrap_or((false, "cannot run nft".into()));
            if !ok {
                bail!("net faults need nftables (`nft`) on host `{}`: {}", p.host, text.trim());
            }
        }
        if !p.engine.is_empty() {
            let (ok, text) =
                r.exec(&["sh", "-c", "test -c /dev/net/tun || { echo no /dev/net/tun; exit 1; }; ip -V"], None).unwrap_or((false, "cannot run sh".into()));
            if !ok {
                bail!(
                    "host `{}`: delay, jitter, rate, duplicate, reorder and loss need a TUN device (/dev/net/tun) and iproute2 there: {}",
                    p.host,
                    text.trim()
                );
            }
        }
    }
    Ok((plans, paths))
}

/// Wait until each sending host's network faults say `ready` (in place before T); one that
/// ends or is silent for `CALL_LIMIT` fails the run with its stderr.
pub(super) fn wait_net_ready(plans: &[NetPlan], gathered: &Shared) -> Result<()> {
    for p in plans {
        let key = (p.host.clone(), "net-faults".to_string());
        let t = Instant::now();
        loop {
            {
                let g = gathered.lock().unwrap();
                if g.stdout.get(&key).is_some_and(|v| v.iter().any(|l| l == "ready")) {
                    break;
                }
                if g.exits.contains_key(&key) || t.elapsed() > CALL_LIMIT {
                    let why = g.stderr.get(&key).map(|v| v.join(" | ")).unwrap_or_default();
                    bail!("host {}: cannot apply its network faults: {why}", p.host);
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    Ok(())
}

pub(super) fn nft_table(tag: &str) -> String {
    format!("faultline_{}", tag.replace('-', "_"))
}

/// End each host's network faults (it removes them) and say what they did.
pub(super) fn net_reports(remotes: &[Arc<Remote>], plans: &[NetPlan], g: &Shared) -> Vec<String> {
    let mut notes = Vec::new();
    for p in plans {
        let Some(r) = remotes.iter().find(|r| r.spec.host == p.host && !r.is_lost()) else { continue };
        let key = (p.host.clone(), "net-faults".to_string());
        let _ = r.call(Op::Kill { name: "net-faults".into(), signal: Some(libc::SIGINT) }, CALL_LIMIT);
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(10) && !g.lock().unwrap().exits.contains_key(&key) {
            std::thread::sleep(Duration::from_millis(10));
        }
        let g = g.lock().unwrap();
        let Some(v) = g.stdout.get(&key).and_then(|v| v.iter().rev().find_map(|l| serde_json::from_str::<Value>(l).ok())) else {
            notes.push(format!("host {}: network faults: no report: {}", p.host, g.stderr.get(&key).map(|v| v.join(" | ")).unwrap_or_default()));
            continue;
        };
        for e in v["nft_errors"].as_array().into_iter().flatten() {
            notes.push(format!("host {}: {}", p.host, e.as_str().unwrap_or_default()));
        }
        for l in v["engine"]["show"]["links"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|l| l["from"] == json!(p.host) && !l["rules"].as_array().is_none_or(|r| r.is_empty()))
        {
            notes.push(format!(
                "network: user space on {} -> {} (via {}): packets {}, delayed {}, dropped {}, duplicated {}, reordered {}, overdue {}, late route switches {}, lateness p99 {} us",
                l["from"].as_str().unwrap_or_default(),
                l["to"].as_str().unwrap_or_default(),
                v["engine"]["paths"].as_array().into_iter().flatten().find(|x| x["peer"] == l["to"]).and_then(|x| x["dev"].as_str()).unwrap_or("?"),
                l["packets"],
                l["delayed"],
                l["dropped"],
                l["duplicated"],
                l["reordered"],
                l["overdue"],
                l["late_switches"],
                l["lateness_us"]["p99"],
            ));
        }
    }
    notes
}
