//! `faultline agent --net-faults PLAN`: the network faults one host applies to what it sends,
//! spawned by the controller through that host's agent (so it is in the agent's ledger and ends
//! with it). Two paths, chosen per fault by the controller (run::agents):
//!
//! - nftables: partition and reset as rules in chains of one table (`inet`), each chain added
//!   when its window opens and deleted when it closes;
//! - the user-space engine (net::egress): delay, jitter, rate, duplicate, reorder and loss
//!   (random or bursty), for kernels without sch_netem; its windows run on the relay's clock.
//!
//! Windows count from the run's start instant (`start_at_ns`, this host's clock). The table,
//! the TUN device and any sysctl changed are in this process's ledger before they exist, so
//! `faultline cleanup` on the host removes them after a kill -9; on SIGINT/SIGTERM it removes
//! them itself and prints one JSON line: what each path did (the engine's per-link counters).

use crate::spec::net::NetRule;
use crate::sys::ledger::LedgerFile;
use crate::sys::now_ns;
use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::io::Write;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// One nftables chain: rule statements, in place from `from` to `to` after the start.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NftChain {
    pub name: String,
    pub rules: Vec<String>,
    pub from: Duration,
    pub to: Option<Duration>,
}

/// What one host applies (the controller's plan for it).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NetPlan {
    pub host: String,
    /// The host's own address (the engine's routes take it as source).
    pub address: String,
    /// The run's start instant, this host's clock (CLOCK_REALTIME ns).
    pub start_at_ns: u64,
    /// nftables table (family inet) for `chains`.
    pub table: String,
    pub chains: Vec<NftChain>,
    /// Rules for the user-space engine, each `from` this host `to` one peer, windows from the
    /// start; and the peers (name, IPv4 address).
    pub engine: Vec<NetRule>,
    pub peers: Vec<(String, String)>,
}

fn nft(script: &str) -> Result<()> {
    let mut c = std::process::Command::new("nft")
        .args(["-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("cannot run nft (install nftables)")?;
    c.stdin.take().context("nft stdin")?.write_all(script.as_bytes())?;
    let o = c.wait_with_output()?;
    if !o.status.success() {
        bail!("nft: {}", String::from_utf8_lossy(&o.stderr).trim());
    }
    Ok(())
}

/// The instant `t_ns` (CLOCK_REALTIME) on the monotonic clock.
fn instant_of(t_ns: u64) -> Instant {
    let now = now_ns();
    if t_ns >= now {
        Instant::now() + Duration::from_nanos(t_ns - now)
    } else {
        Instant::now().checked_sub(Duration::from_nanos(now - t_ns)).unwrap_or_else(Instant::now)
    }
}

pub fn run(plan_json: &str) -> Result<()> {
    let plan: NetPlan = serde_json::from_str(plan_json).context("--net-faults: not a plan (JSON)")?;
    let stop = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGINT, stop.clone())?;
    signal_hook::flag::register(signal_hook::consts::SIGTERM, stop.clone())?;
    let mut ledger = LedgerFile::create()?;
    let t0 = instant_of(plan.start_at_ns);
    let res = apply(&plan, &mut ledger, t0, &stop);
    // undo what the ledger says was made, whatever happened
    if !plan.chains.is_empty() {
        let _ = nft(&format!("delete table inet {}\n", plan.table));
    }
    for (f, v) in &ledger.data.sysctls {
        let _ = std::fs::write(f, v);
    }
    ledger.remove();
    println!("{}", res?);
    Ok(())
}

fn apply(plan: &NetPlan, ledger: &mut LedgerFile, t0: Instant, stop: &AtomicBool) -> Result<serde_json::Value> {
    let mut egress = None;
    let tun = format!("flq{}", std::process::id());
    if !plan.engine.is_empty() {
        let local: Ipv4Addr =
            plan.address.parse().with_context(|| format!("host {}: the user-space path needs an IPv4 address, not {}", plan.host, plan.address))?;
        let peers: Vec<(String, Ipv4Addr)> = plan
            .peers
            .iter()
            .map(|(n, a)| Ok((n.clone(), a.parse().with_context(|| format!("peer {n}: the user-space path needs an IPv4 address, not {a}"))?)))
            .collect::<Result<_>>()?;
        let e = crate::net::egress::Egress::start(&plan.host, local, &peers, &tun, ledger)?;
        for r in &plan.engine {
            e.set_at(r.clone(), t0)?;
        }
        egress = Some(e);
    }
    if !plan.chains.is_empty() {
        ledger.update(|l| l.nft_tables.push(plan.table.clone()))?;
        nft(&format!("add table inet {}\n", plan.table))?;
    }
    println!("ready");
    std::io::stdout().flush()?;
    // the chains follow their windows
    let mut steps: Vec<(Duration, bool, usize)> = Vec::new();
    for (k, c) in plan.chains.iter().enumerate() {
        steps.push((c.from, true, k));
        steps.extend(c.to.map(|t| (t, false, k)));
    }
    steps.sort_by_key(|s| s.0);
    let mut errors = Vec::new();
    let mut steps = steps.into_iter().peekable();
    while !stop.load(Relaxed) {
        while let Some(&(at, on, k)) = steps.peek() {
            if Instant::now() < t0 + at {
                break;
            }
            steps.next();
            let c = &plan.chains[k];
            let script = if on {
                let mut s = format!("add chain inet {} {} {{ type filter hook output priority 0; policy accept; }}\n", plan.table, c.name);
                for x in &c.rules {
                    // packets to the engine's TUN device meet the rules when the engine sends
                    // them on (once, on the real device)
                    let skip = if egress.is_some() { format!("oifname != \"{tun}\" ") } else { String::new() };
                    s += &format!("add rule inet {} {} {skip}{x}\n", plan.table, c.name);
                }
                s
            } else {
                format!("delete chain inet {} {}\n", plan.table, c.name)
            };
            if let Err(e) = nft(&script) {
                errors.push(format!("{e:#}"));
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let engine = egress.map(|e| {
        let v = json!({"tun": tun, "paths": e.paths.iter().map(|(p, d)| json!({"peer": p, "dev": d})).collect::<Vec<_>>(), "show": e.show()});
        e.stop();
        v
    });
    Ok(json!({"host": plan.host, "nft_chains": plan.chains.len(), "nft_errors": errors, "engine": engine}))
}
