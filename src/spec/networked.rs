//! Networked experiments (docs/experiment.md, "Hosts"): `hosts:` (client hosts and a target
//! host, each a network namespace) and `net_faults:` (network faults between them, in windows
//! counted from the start of the workload). Plain settings and their parsing; `run::hosts`
//! builds and drives them.

use super::net::{Loss, NetFault, NetRule, Rate, parse_gilbert, parse_rate, parse_reorder};
use super::rule::DelayDist;
use super::units::{Dur, Ratio};
use serde::Deserialize;
use serde_saphyr::Spanned;
use std::time::Duration;

/// The NBD port the target listens on inside its host unless `port:` says otherwise.
pub const DEFAULT_PORT: u16 = 10809;

/// What serves the disk in the target host.
#[derive(Clone, Debug, PartialEq)]
pub enum TargetKind {
    /// `faultline serve --nbd tcp://ADDR:PORT --no-loop` with the setup's disk and `faults:`.
    Faultline,
    /// Any NBD server, started by `sh -c COMMAND` in the target host; it must listen on
    /// `$FAULTLINE_PORT` (the `port:`) on any address of the host.
    Command(String),
}

/// `hosts:` of an experiment, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct NetworkedHosts {
    /// Client host names, in address order (each runs the workload over NBD).
    pub clients: Vec<String>,
    /// The target host's name (`target`).
    pub target: String,
    pub kind: TargetKind,
    pub port: u16,
    /// The clients' NBD policy (`hosts: {nbd: ...}`); a setup's `nbd:` overrides it key by key.
    pub nbd: NbdPolicy,
    /// How often the probers sample each host (and the workload's interval, unless it sets one).
    pub interval: Duration,
    /// `agents:`: every host reached through its own channel (run::agents); empty: the hosts
    /// are namespaces faultline builds (run::hosts).
    pub agents: Vec<HostAgent>,
    pub on_agent_loss: OnAgentLoss,
}

/// How the controller reaches one host of `agents:`.
#[derive(Clone, Debug, PartialEq)]
pub enum AgentChannel {
    /// OpenSSH to `dest` ([user@]host) with extra ssh options.
    Ssh { dest: String, options: Vec<String> },
    /// A command prefix that runs a program on the host: `[ip, netns, exec, NS]`,
    /// `[kubectl, exec, -i, POD, --]`.
    Exec(Vec<String>),
}

/// One host's entry in `agents:`.
#[derive(Clone, Debug, PartialEq)]
pub struct HostAgent {
    pub host: String,
    pub channel: AgentChannel,
    /// The host's address as the other hosts reach it (the target's is the clients' NBD
    /// server address; others are needed only by net faults naming them).
    pub address: Option<String>,
    /// The faultline program on the host (default `faultline` on its PATH).
    pub faultline: String,
    /// Copy this faultline there first (to `faultline`, which must then be a path).
    pub install: bool,
}

/// What happens when an agent's channel closes or it stops answering mid-run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnAgentLoss {
    /// Tear down every host and fail the run with the reason.
    #[default]
    Abort,
    /// Finish the run without that host's later samples; the loss is in the results.
    Continue,
}

impl NetworkedHosts {
    /// Every host in address order: the target first (10.77.0.1), then the clients.
    pub fn names(&self) -> Vec<String> {
        std::iter::once(self.target.clone()).chain(self.clients.iter().cloned()).collect()
    }

    /// The clients' NBD policy in `setup` as URI query keys (`timeout=1s&retries=3`), or empty:
    /// the setup's `nbd:` keys over the experiment's `hosts: {nbd: ...}`.
    pub fn nbd_query_for(&self, setup: &super::experiment::Setup) -> String {
        setup.nbd.map_or(self.nbd, |n| n.over(self.nbd)).query()
    }
}

/// The clients' NBD policy of a networked experiment (docs/nbd.md): keys left out take the
/// client's defaults, or, in a setup's `nbd:`, the experiment's `hosts: {nbd: ...}`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct NbdPolicy {
    pub timeout: Option<Duration>,
    pub retries: Option<u32>,
}

impl NbdPolicy {
    /// These keys, the others from `base`.
    pub fn over(self, base: NbdPolicy) -> NbdPolicy {
        NbdPolicy { timeout: self.timeout.or(base.timeout), retries: self.retries.or(base.retries) }
    }

    /// As URI query keys (`timeout=1s&retries=3`), or empty.
    pub fn query(&self) -> String {
        let mut q = Vec::new();
        if let Some(t) = self.timeout {
            q.push(format!("timeout={}", super::units::format_duration(t)));
        }
        if let Some(n) = self.retries {
            q.push(format!("retries={n}"));
        }
        q.join("&")
    }
}

/// A setup's (or a matrix entry's) `nbd:`: only with `hosts:` (it is the clients' policy; a
/// disk's NBD store has `disk: {nbd: ...}`).
pub(crate) fn setup_nbd(raw: &Spanned<RawNbd>, hosts: bool, setup: &str, source: &str) -> Result<NbdPolicy, String> {
    if !hosts {
        return Err(format!(
            "{}: setup `{setup}`: `nbd` sets the clients' NBD policy of a networked experiment and needs `hosts:` (allowed without it: `disk: {{nbd: ...}}` for a disk whose store is an NBD export)",
            at(raw, source)
        ));
    }
    Ok(NbdPolicy { timeout: raw.value.timeout.map(|d| d.0), retries: raw.value.retries })
}

#[derive(Deserialize, Clone)]
#[serde(untagged, expecting = "not a target; allowed: faultline, or {command: CMD}")]
pub(crate) enum RawTarget {
    Word(String),
    Command { command: String },
}

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawNbd {
    timeout: Option<Dur>,
    retries: Option<u32>,
}

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawHosts {
    clients: Option<Vec<String>>,
    target: Option<RawTarget>,
    port: Option<u16>,
    nbd: Option<RawNbd>,
    interval: Option<Dur>,
    agents: Option<Spanned<std::collections::BTreeMap<String, Spanned<RawAgent>>>>,
    on_agent_loss: Option<Spanned<String>>,
}

#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAgent {
    ssh: Option<String>,
    ssh_options: Option<Vec<String>>,
    exec: Option<Vec<String>>,
    address: Option<String>,
    faultline: Option<String>,
    install: Option<bool>,
}

fn agents(
    raw: &Spanned<std::collections::BTreeMap<String, Spanned<RawAgent>>>,
    names: &[String],
    target: &str,
    source: &str,
) -> Result<Vec<HostAgent>, String> {
    let l = at(raw, source);
    let mut out = Vec::new();
    for (host, a) in &raw.value {
        let la = at(a, source);
        if !names.contains(host) {
            return Err(format!("{la}: hosts: agents: unknown host `{host}`; the hosts are: {}", names.join(", ")));
        }
        let r = &a.value;
        let channel = match (&r.ssh, &r.exec) {
            (Some(d), None) if !d.trim().is_empty() => AgentChannel::Ssh { dest: d.clone(), options: r.ssh_options.clone().unwrap_or_default() },
            (None, Some(p)) if !p.is_empty() && !p[0].is_empty() => {
                if r.ssh_options.is_some() {
                    return Err(format!("{la}: hosts: agents: {host}: `ssh_options` needs `ssh`"));
                }
                AgentChannel::Exec(p.clone())
            }
            (Some(_), Some(_)) => return Err(format!("{la}: hosts: agents: {host}: give either `ssh` or `exec`, not both")),
            _ => {
                return Err(format!(
                    "{la}: hosts: agents: {host}: needs a channel: `ssh: USER@HOST` or `exec: [COMMAND, ...]` (e.g. [ip, netns, exec, NS] or [kubectl, exec, -i, POD, --])"
                ));
            }
        };
        if let Some(ad) = &r.address
            && ad.parse::<std::net::IpAddr>().is_err()
        {
            return Err(format!("{la}: hosts: agents: {host}: `address: {ad}` is not an IP address"));
        }
        if host == target && r.address.is_none() {
            return Err(format!("{la}: hosts: agents: {target}: needs `address` (where the clients reach its NBD server)"));
        }
        let faultline = r.faultline.clone().unwrap_or_else(|| "faultline".into());
        let install = r.install.unwrap_or(false);
        if install && !faultline.starts_with('/') {
            return Err(format!("{la}: hosts: agents: {host}: `install: true` needs `faultline: /PATH` (where the copy goes)"));
        }
        out.push(HostAgent { host: host.clone(), channel, address: r.address.clone(), faultline, install });
    }
    let missing: Vec<&String> = names.iter().filter(|n| !raw.value.contains_key(*n)).collect();
    if !missing.is_empty() {
        return Err(format!(
            "{l}: hosts: agents: no channel for {}; with `agents:` every host needs one ({})",
            missing.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", "),
            names.join(", ")
        ));
    }
    // in host order: the target first, then the clients
    out.sort_by_key(|a| names.iter().position(|n| *n == a.host));
    Ok(out)
}

fn at<T>(s: &Spanned<T>, source: &str) -> String {
    format!("{source}:{}:{}", s.referenced.line(), s.referenced.column())
}

pub(crate) fn hosts(raw: &Spanned<RawHosts>, source: &str) -> Result<NetworkedHosts, String> {
    let l = at(raw, source);
    let r = &raw.value;
    let clients = r.clients.clone().unwrap_or_else(|| vec!["client".to_string()]);
    if clients.is_empty() {
        return Err(format!("{l}: hosts: `clients` is empty; give at least one client host (default: [client])"));
    }
    let kind = match &r.target {
        None => TargetKind::Faultline,
        Some(RawTarget::Word(w)) if w == "faultline" => TargetKind::Faultline,
        Some(RawTarget::Word(w)) => {
            return Err(format!("{l}: hosts: unknown `target: {w}`; allowed: faultline, or {{command: \"nbdkit -f -p $FAULTLINE_PORT memory 1G\"}}"));
        }
        Some(RawTarget::Command { command }) if command.trim().is_empty() => return Err(format!("{l}: hosts: target `command` is empty")),
        Some(RawTarget::Command { command }) => TargetKind::Command(command.clone()),
    };
    let port = r.port.unwrap_or(DEFAULT_PORT);
    if port == 0 {
        return Err(format!("{l}: hosts: `port: 0` is not allowed; the clients need to know the port (default {DEFAULT_PORT})"));
    }
    let nbd = r.nbd.as_ref().map_or(NbdPolicy::default(), |n| NbdPolicy { timeout: n.timeout.map(|d| d.0), retries: n.retries });
    let interval = r.interval.map_or(Duration::from_secs(1), |d| d.0);
    if interval < Duration::from_millis(100) {
        return Err(format!("{l}: hosts: `interval` must be at least 100ms"));
    }
    let names: Vec<String> = std::iter::once("target".to_string()).chain(clients.iter().cloned()).collect();
    let agents = r.agents.as_ref().map(|a| agents(a, &names, "target", source)).transpose()?.unwrap_or_default();
    let on_agent_loss = match &r.on_agent_loss {
        None => OnAgentLoss::Abort,
        Some(s) if r.agents.is_none() => return Err(format!("{}: hosts: `on_agent_loss` needs `agents:`", at(s, source))),
        Some(s) => match s.value.as_str() {
            "abort" => OnAgentLoss::Abort,
            "continue" => OnAgentLoss::Continue,
            w => return Err(format!("{}: hosts: unknown `on_agent_loss: {w}`; allowed: abort (default), continue", at(s, source))),
        },
    };
    let h = NetworkedHosts { clients, target: "target".into(), kind, port, nbd, interval, agents, on_agent_loss };
    let spec = super::net::HostsSpec { hosts: h.names().into_iter().map(|name| super::net::HostSpec { name, role: super::net::HostRole::Client }).collect() };
    spec.validate().map_err(|e| format!("{l}: hosts: {e}"))?;
    Ok(h)
}

/// One `net_faults:` entry: a NetRule with the faults as keys of their own.
#[derive(Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawNetFault {
    name: Option<String>,
    from: Option<String>,
    to: Option<String>,
    both: Option<bool>,
    window: Option<super::rule::yaml::RawWindow>,
    seed: Option<u64>,
    delay: Option<Dur>,
    jitter: Option<Dur>,
    loss: Option<Ratio>,
    /// Gilbert-Elliott loss "P[,R[,LOSS_BAD[,LOSS_GOOD]]]".
    loss_bursts: Option<String>,
    duplicate: Option<Ratio>,
    /// "PROB" or "PROB:GAP".
    reorder: Option<String>,
    /// e.g. 100mbit.
    rate: Option<String>,
    partition: Option<bool>,
    reset: Option<bool>,
}

/// A validated `net_faults:` entry.
#[derive(Clone, Debug, PartialEq)]
pub struct NetFaultSpec {
    pub name: Option<String>,
    pub rule: NetRule,
}

impl NetFaultSpec {
    /// A short description for results and the report, e.g. "client->target delay 1ms".
    pub fn describe(&self) -> String {
        let r = &self.rule;
        let f = &r.fault;
        let mut what = Vec::new();
        if let Some(DelayDist::Fixed(d)) = f.delay {
            what.push(format!("delay {}", super::units::format_duration(d)));
        } else if f.delay.is_some() {
            what.push("delay (distribution)".into());
        }
        if let Some(j) = f.jitter {
            what.push(format!("jitter {}", super::units::format_duration(j)));
        }
        match f.loss {
            Some(Loss::Random { probability }) => what.push(format!("loss {}%", probability * 100.0)),
            Some(l @ Loss::GilbertElliott { .. }) => what.push(format!("bursty loss {:.3}%", l.mean() * 100.0)),
            None => {}
        }
        if let Some(d) = f.duplicate {
            what.push(format!("duplicate {}%", d * 100.0));
        }
        if let Some(r) = f.reorder {
            what.push(format!("reorder {}%", r.probability * 100.0));
        }
        if let Some(r) = f.rate {
            what.push(format!("rate {} kbit/s", r.bits_per_sec / 1000));
        }
        if f.partition {
            what.push("partition".into());
        }
        if f.reset {
            what.push("reset".into());
        }
        let arrow = if r.both { "<->" } else { "->" };
        format!("{}{arrow}{} {}", r.from.as_deref().unwrap_or("*"), r.to.as_deref().unwrap_or("*"), what.join(", "))
    }
}

pub(crate) fn net_faults(raw: Vec<Spanned<RawNetFault>>, hosts: Option<&NetworkedHosts>, source: &str) -> Result<Vec<NetFaultSpec>, String> {
    let mut out = Vec::new();
    for (i, s) in raw.into_iter().enumerate() {
        let l = at(&s, source);
        let Some(h) = hosts else {
            return Err(format!("{l}: `net_faults` needs `hosts:` (the hosts whose links they hit)"));
        };
        let label = match &s.value.name {
            Some(n) => format!("net fault #{} ({n})", i + 1),
            None => format!("net fault #{}", i + 1),
        };
        out.push(net_fault(s.value, h).map_err(|e| format!("{l}: {label}: {e}"))?);
    }
    Ok(out)
}

fn net_fault(r: RawNetFault, h: &NetworkedHosts) -> Result<NetFaultSpec, String> {
    let loss = match (r.loss, &r.loss_bursts) {
        (Some(_), Some(_)) => return Err("give either `loss` or `loss_bursts`, not both".into()),
        (Some(p), None) => Some(Loss::Random { probability: p.0 }),
        (None, Some(g)) => Some(parse_gilbert(g).map_err(|e| format!("loss_bursts: {e}"))?),
        (None, None) => None,
    };
    let rate = r
        .rate
        .as_deref()
        .map(|t| parse_rate(t).map(|bits_per_sec| Rate { bits_per_sec, burst: 32 << 10, queue: Duration::from_millis(50) }))
        .transpose()
        .map_err(|e| format!("rate: {e}"))?;
    let fault = NetFault {
        delay: r.delay.map(|d| DelayDist::Fixed(d.0)),
        jitter: r.jitter.map(|d| d.0),
        loss,
        duplicate: r.duplicate.map(|d| d.0),
        reorder: r.reorder.as_deref().map(parse_reorder).transpose().map_err(|e| format!("reorder: {e}"))?,
        rate,
        partition: r.partition.unwrap_or(false),
        reset: r.reset.unwrap_or(false),
    };
    let window = r.window.map(super::rule::yaml::parse_window).transpose()?;
    let rule = NetRule { from: r.from, to: r.to, both: r.both.unwrap_or(false), window, seed: r.seed, fault };
    rule.validate(&h.names())?;
    // through agents the hosts' own kernels match packets by address: every host the rule
    // reaches needs one
    if !h.agents.is_empty() {
        let names = h.names();
        let involved: Vec<&String> = names.iter().filter(|n| rule.from.as_ref().is_none_or(|f| f == *n) || rule.to.as_ref().is_none_or(|t| t == *n)).collect();
        let without: Vec<&str> = involved.iter().filter(|n| h.agents.iter().any(|a| a.host == ***n && a.address.is_none())).map(|n| n.as_str()).collect();
        if !without.is_empty() {
            return Err(format!("through agents, net faults match the hosts' addresses: give `address` to {} under `hosts: agents:`", without.join(", ")));
        }
    }
    Ok(NetFaultSpec { name: r.name, rule })
}

/// Host faults in a networked experiment act on the target host's processes: `host:` may be
/// left out or say the target's name.
pub(crate) fn check_host_faults(faults: &[super::host::HostFault], hosts: Option<&NetworkedHosts>, source: &str) -> Result<(), String> {
    for f in faults {
        match (&f.host, hosts) {
            (None, _) => {}
            (Some(n), Some(h)) if *n == h.target => {}
            (Some(n), Some(h)) => {
                return Err(format!("{source}: host fault on host `{n}`: host faults act on the target host's processes; allowed: host: {}", h.target));
            }
            (Some(n), None) => return Err(format!("{source}: host fault on host `{n}`: `host:` needs `hosts:` in the experiment")),
        }
    }
    Ok(())
}

/// A setup of a networked experiment: the target host serves a plain disk (`stack: raw`, the
/// default), host faults name the target.
pub(crate) fn check_setup(s: &super::experiment::Setup, hosts: Option<&NetworkedHosts>, source: &str) -> Result<(), String> {
    check_host_faults(&s.host_faults, hosts, source)?;
    let Some(h) = hosts else { return Ok(()) };
    if s.stack != super::stack::StackSpec::Raw {
        return Err(format!(
            "{source}: setup `{}`: with `hosts:` the target serves the disk itself over NBD; leave `stack` out (raw); got {}",
            s.name,
            s.stack.label()
        ));
    }
    if let TargetKind::Command(_) = h.kind
        && !s.faults.is_empty()
    {
        return Err(format!("{source}: setup `{}`: disk `faults:` need `target: faultline` (a command's server has its own disk)", s.name));
    }
    if let Some(c) = &s.power_cut {
        check_power_cut(c, &s.name, h)?;
    }
    Ok(())
}

/// A power cut of the target host (docs/crash.md, "A power cut in a networked experiment"):
/// faultline's own disk server (it holds the volatile cache the model applies to). Any number
/// of clients, on namespace hosts or through agents: each writes its own slice of the disk
/// (`Experiment::client_workload`; through agents it travels as `--base`/`--span`/`--seed`
/// and each client's record stays in its own workload process on its host).
fn check_power_cut(c: &super::rule::yaml::PowerCutSpec, setup: &str, h: &NetworkedHosts) -> Result<(), String> {
    let at = format!("{}: {}: setup `{setup}`", c.at, c.label);
    if let TargetKind::Command(cmd) = &h.kind {
        return Err(format!(
            "{at}: a power cut needs `target: faultline`: faultline's disk server holds the volatile write cache whose unflushed writes the cut loses; the command target (`{cmd}`) serves a disk of its own that faultline cannot cut (allowed: `hosts: {{target: faultline}}` with `disk: {{write_cache: volatile}}`)"
        ));
    }
    Ok(())
}

impl super::experiment::Experiment {
    /// The workload the first client host runs in `setup` (`client_workload` of client 0).
    pub fn workload_for_client(&self, setup: &super::experiment::Setup, uri: &str) -> Result<super::workload::Workload, String> {
        self.client_workload(setup, uri, 0)
    }

    /// The workload client host `client` (its index in `hosts: {clients}`) runs in `setup`:
    /// the experiment's block workload, sent over NBD to `uri` (`interface: nbd`). Without a
    /// power cut every client addresses the whole export. With one, each client must be the
    /// only writer of its blocks (the oracle follows one writer per block), so the disk is cut
    /// into one slice per client (`client_slices`): the client's offset 0 is its slice's first
    /// byte (`Workload::base`), it addresses `span` bytes of it (default: all of it), and with
    /// several clients client i's content seed is the workload's seed + i, so one client's
    /// content found in another's slice is `garbage`, not a match.
    pub fn client_workload(&self, setup: &super::experiment::Setup, uri: &str, client: usize) -> Result<super::workload::Workload, String> {
        let Some(w) = setup.workload.as_ref().or(self.workload.as_ref()) else {
            return Err(format!("{}: setup `{}` has no workload", self.source, setup.name));
        };
        let mut w = w.clone();
        if let Some(i) = &w.value.interface
            && i.value != "block"
            && i.value != "nbd"
        {
            return Err(format!(
                "{}:{}:{}: interface: `{}`: the clients of `hosts:` run block workloads over NBD; leave `interface` out",
                self.source,
                i.referenced.line(),
                i.referenced.column(),
                i.value
            ));
        }
        let span = |v: String| Spanned { value: v, referenced: w.referenced, defined: w.defined };
        w.value.interface = Some(span("nbd".into()));
        w.value.target = Some(span(uri.to_string()));
        w.value.device = None;
        let user_span = w.value.span.take();
        if w.value.interval.is_none()
            && let Some(h) = &self.hosts
        {
            w.value.interval = Some(Spanned { value: Dur(h.interval), referenced: w.referenced, defined: w.defined });
        }
        let mut out = super::workload::resolve(&w.value, &self.source, None)?;
        let (Some(h), Some(_)) = (&self.hosts, &setup.power_cut) else { return Ok(out) };
        let n = h.clients.len();
        let slice = client_slice(setup.disk.size(), n, out.block_size).map_err(|e| format!("{}: setup `{}`: {e}", self.source, setup.name))?;
        let len = match &user_span {
            Some(s) if s.value.0 > slice => {
                return Err(format!(
                    "{}:{}:{}: workload: span: {} is larger than each client's slice of the disk: with a power cut each of the {n} client(s) writes only its own slice ({} / {n}, in whole blocks of {} = {}); allowed: at most {}, or leave `span` out (each client addresses its whole slice)",
                    self.source,
                    s.referenced.line(),
                    s.referenced.column(),
                    super::units::format_size(s.value.0),
                    super::units::format_size(setup.disk.size()),
                    super::units::format_size(out.block_size),
                    super::units::format_size(slice),
                    super::units::format_size(slice),
                ));
            }
            Some(s) => s.value.0,
            None => slice,
        };
        if len / out.block_size < out.threads as u64 {
            return Err(format!(
                "{}: setup `{}`: each client's {} of the disk holds {} block(s) of {}, fewer than its {} threads; allowed: at least one block per thread (a larger disk, a larger `span`, fewer clients or threads)",
                self.source,
                setup.name,
                super::units::format_size(len),
                len / out.block_size,
                super::units::format_size(out.block_size),
                out.threads
            ));
        }
        out.base = client as u64 * slice;
        out.span = Some(len);
        if n > 1 {
            out.seed = out.seed.wrapping_add(client as u64);
        }
        Ok(out)
    }
}

/// The bytes of each client's slice of a `size`-byte disk shared by `clients` writers with a
/// power cut: an equal part, in whole workload blocks (so every slice starts on a block of
/// the workload and of the disk).
pub fn client_slice(size: u64, clients: usize, block_size: u64) -> Result<u64, String> {
    if size == 0 {
        return Err("a power cut in a networked experiment cuts the disk into one slice per client and needs its size (allowed: `disk: {size: ...}`)".into());
    }
    let slice = size / clients.max(1) as u64 / block_size * block_size;
    if slice == 0 {
        return Err(format!("the disk ({size} bytes) has less than one block of {block_size} per client ({clients})"));
    }
    Ok(slice)
}

#[cfg(test)]
mod tests {
    use super::super::experiment::parse_experiment;
    use super::*;
    use crate::spec::rule::Window;

    const BASE: &str = "name: t\nhosts: {clients: [client, client-2], nbd: {timeout: 1s, retries: 2}}\nworkload: {block_size: 8KiB, duration: 5s}\n";

    #[test]
    fn hosts_and_net_faults_parse() {
        let e = parse_experiment(
            &format!("{BASE}net_faults:\n  - {{from: client, to: target, both: true, delay: 1ms, loss: 0.1%, window: {{from: 10s, to: 20s}}}}\n"),
            "e.yaml",
        )
        .unwrap();
        let h = e.hosts.as_ref().unwrap();
        assert_eq!(h.names(), ["target", "client", "client-2"]);
        assert_eq!(h.nbd.query(), "timeout=1s&retries=2");
        let r = &e.setups[0].net_faults[0].rule;
        assert_eq!(r.fault.delay, Some(DelayDist::Fixed(Duration::from_millis(1))));
        assert_eq!(r.fault.loss, Some(Loss::Random { probability: 0.001 }));
        assert_eq!(r.window, Some(Window { from: Duration::from_secs(10), to: Some(Duration::from_secs(20)) }));
        assert!(r.both && r.covers("target", "client"));
        let w = e.workload_for_client(&e.setups[0], "nbd://10.77.0.1:10809/").unwrap();
        assert!(matches!(w.interface, crate::spec::workload::Interface::Nbd { .. }));
    }

    #[test]
    fn bad_input_names_the_place_and_what_is_allowed() {
        let err = parse_experiment(&format!("{BASE}net_faults:\n  - {{from: clint, delay: 1ms}}\n"), "e.yaml").unwrap_err();
        assert!(err.starts_with("e.yaml:5:") && err.contains("unknown host `clint`") && err.contains("target, client, client-2"), "{err}");
        let err = parse_experiment("name: t\nworkload: {duration: 1s}\nnet_faults:\n  - {delay: 1ms}\n", "e.yaml").unwrap_err();
        assert!(err.contains("needs `hosts:`"), "{err}");
        let err = parse_experiment(&format!("{BASE}host_faults:\n  - {{type: cpu, share: 50%, host: client}}\n"), "e.yaml").unwrap_err();
        assert!(err.contains("allowed: host: target"), "{err}");
        let err = parse_experiment(&format!("{BASE}stack: ext4\n"), "e.yaml").unwrap_err();
        assert!(err.contains("leave `stack` out"), "{err}");
        let err = parse_experiment("name: t\nhosts: {target: nbdkit}\nworkload: {duration: 1s}\n", "e.yaml").unwrap_err();
        assert!(err.starts_with("e.yaml:2:") && err.contains("allowed: faultline"), "{err}");
    }

    #[test]
    fn agents_give_every_host_a_channel() {
        let base = "name: t\nhosts:\n  clients: [c1, c2]\n  on_agent_loss: continue\n  agents:\n";
        let ok = format!(
            "{base}    target: {{ssh: root@10.0.0.5, ssh_options: [-p, '2222'], address: 10.0.0.5}}\n    c1: {{exec: [ip, netns, exec, n1]}}\n    c2: {{exec: [kubectl, exec, -i, pod, --], faultline: /opt/fl, install: true}}\nworkload: {{duration: 1s}}\n"
        );
        let e = parse_experiment(&ok, "e.yaml").unwrap();
        let h = e.hosts.unwrap();
        assert_eq!(h.on_agent_loss, OnAgentLoss::Continue);
        assert_eq!(h.agents.iter().map(|a| a.host.as_str()).collect::<Vec<_>>(), ["target", "c1", "c2"]);
        assert_eq!(h.agents[0].channel, AgentChannel::Ssh { dest: "root@10.0.0.5".into(), options: vec!["-p".into(), "2222".into()] });
        assert!(h.agents[2].install && h.agents[2].faultline == "/opt/fl");
        let err =
            parse_experiment(&format!("{base}    target: {{exec: [x], address: 1.2.3.4}}\n    c1: {{exec: [x]}}\nworkload: {{duration: 1s}}\n"), "e.yaml")
                .unwrap_err();
        assert!(err.starts_with("e.yaml:6:") && err.contains("no channel for c2"), "{err}");
        let err = parse_experiment(&format!("{base}    target: {{exec: [x]}}\nworkload: {{duration: 1s}}\n"), "e.yaml").unwrap_err();
        assert!(err.starts_with("e.yaml:6:") && err.contains("needs `address`"), "{err}");
        let err = parse_experiment(&format!("{base}    c3: {{exec: [x]}}\nworkload: {{duration: 1s}}\n"), "e.yaml").unwrap_err();
        assert!(err.contains("unknown host `c3`") && err.contains("target, c1, c2"), "{err}");
        let err = parse_experiment(&format!("{base}    target: {{address: 1.2.3.4}}\nworkload: {{duration: 1s}}\n"), "e.yaml").unwrap_err();
        assert!(err.contains("needs a channel"), "{err}");
        let nf = format!("{ok}net_faults:\n  - {{from: c1, to: target, loss: 1%}}\n");
        let err = parse_experiment(&nf, "e.yaml").unwrap_err();
        assert!(err.starts_with("e.yaml:11:") && err.contains("give `address` to c1"), "{err}");
        assert!(parse_experiment(&nf.replace("c1: {exec: [ip, netns, exec, n1]}", "c1: {exec: [ip, netns, exec, n1], address: 10.0.0.6}"), "e.yaml").is_ok());
        let err = parse_experiment("name: t\nhosts: {on_agent_loss: stop}\nworkload: {duration: 1s}\n", "e.yaml").unwrap_err();
        assert!(err.contains("needs `agents:`"), "{err}");
    }

    #[test]
    fn the_published_case_study_takes_agents_with_only_hosts_changed() {
        let text = include_str!("../../examples/performability.yaml");
        let ns = parse_experiment(text, "performability.yaml").unwrap();
        let (a, b) = (text.find("hosts:\n").unwrap(), text.find("disk:").unwrap());
        let hosts = "hosts:\n  clients: [client]\n  target: faultline\n  nbd: {timeout: 2s, retries: 3}\n  interval: 1s\n  agents:\n    target: {ssh: root@storage1, address: 192.168.10.5}\n    client: {ssh: root@load1, address: 192.168.10.6}\n";
        let ag = parse_experiment(&format!("{}{hosts}{}", &text[..a], &text[b..]), "performability.yaml").unwrap();
        let (h1, h2) = (ns.hosts.clone().unwrap(), ag.hosts.clone().unwrap());
        assert!(h1.agents.is_empty() && h2.agents.len() == 2);
        assert_eq!(NetworkedHosts { agents: vec![], ..h2 }, h1);
        assert_eq!(format!("{:?}", ns.setups), format!("{:?}", ag.setups));
    }

    #[test]
    fn a_kill_of_the_target_only_through_agents() {
        let text = include_str!("../../examples/performability.yaml");
        let kill = "  - name: kill\n    host_faults:\n      - {type: kill, host: target, window: {from: 10s, to: 20s}}\n";
        let e = parse_experiment(&format!("{text}{kill}"), "p.yaml").unwrap_err();
        assert!(e.contains("p.yaml:") && e.contains("agents"), "{e}");
        let (a, b) = (text.find("hosts:\n").unwrap(), text.find("disk:").unwrap());
        let hosts = "hosts:\n  clients: [client]\n  agents:\n    target: {ssh: root@storage1, address: 192.168.10.5}\n    client: {ssh: root@load1, address: 192.168.10.6}\n";
        let ag = parse_experiment(&format!("{}{hosts}{}{kill}", &text[..a], &text[b..]), "p.yaml").unwrap();
        assert!(matches!(ag.setups.last().unwrap().host_faults[0].action, crate::spec::host::HostAction::Kill));
    }

    #[test]
    fn the_published_disk_faults_are_one_line_each() {
        let e = parse_experiment(
            &format!(
                "{BASE}faults:\n  - {{type: error, op: any, probability: 50%, window: {{from: 2m, to: 3m}}}}\n  - {{type: error, op: read, errno: EIO, target: {{offset: 0, length: 64MiB}}, window: {{from: 2m}}}}\n"
            ),
            "e.yaml",
        )
        .unwrap();
        let f = &e.setups[0].faults;
        assert_eq!(f.len(), 2);
        assert_eq!(f[0].rule.window, Some(Window { from: Duration::from_secs(120), to: Some(Duration::from_secs(180)) }));
        assert_eq!(f[1].rule.window, Some(Window { from: Duration::from_secs(120), to: None }));
    }

    /// A power cut of the target host: faultline's target, namespace hosts, any number of
    /// clients; each refusal names the cut's place, what is wrong and what is allowed.
    #[test]
    fn power_cuts_of_the_target_host() {
        let cut = "faults:\n  - {type: power-cut, model: keep-prefix, when: {after_flushes: 20}}\n";
        let one = "name: t\nhosts: {clients: [client]}\ndisk: {write_cache: volatile}\nworkload: {sync: 'fsync:8', duration: 5s}\n";
        let e = parse_experiment(&format!("{one}{cut}"), "e.yaml").unwrap();
        let c = e.setups[0].power_cut.as_ref().unwrap();
        assert_eq!((c.at.as_str(), c.model), ("e.yaml:6:5", crate::spec::disk::SurvivalModel::KeepPrefix));
        // through agents too, with one client or several (each its own slice, as on namespace hosts)
        let agents = "name: t\nhosts: {clients: [client], agents: {target: {ssh: root@s, address: 10.0.0.5}, client: {ssh: root@c}}}\ndisk: {write_cache: volatile}\nworkload: {duration: 5s}\n";
        let e = parse_experiment(&format!("{agents}{cut}"), "e.yaml").unwrap();
        assert!(e.setups[0].power_cut.is_some() && !e.hosts.as_ref().unwrap().agents.is_empty());
        let two = "name: t\nhosts: {clients: [a, b], agents: {target: {ssh: root@s, address: 10.0.0.5}, a: {ssh: root@a}, b: {ssh: root@b}}}\ndisk: {size: 64MiB, write_cache: volatile}\nworkload: {duration: 5s, content: {seed: 3}}\n";
        let e = parse_experiment(&format!("{two}{cut}"), "e.yaml").unwrap();
        let ws: Vec<_> = (0..2).map(|i| e.client_workload(&e.setups[0], "nbd://10.0.0.5:10809/", i).unwrap()).collect();
        assert_eq!(ws.iter().map(|w| (w.base, w.span, w.seed)).collect::<Vec<_>>(), [(0, Some(32 << 20), 3), (32 << 20, Some(32 << 20), 4)]);
        let bad = [
            (
                "name: t\nhosts: {clients: [client], target: {command: 'nbdkit -f -p $FAULTLINE_PORT memory 1G'}}\ndisk: {write_cache: volatile}\nworkload: {duration: 5s}\n",
                "e.yaml:6:5: fault #1: setup `t`: a power cut needs `target: faultline`",
            ),
            ("name: t\nhosts: {clients: [client]}\nworkload: {duration: 5s}\n\n", "e.yaml:6:5: fault #1: a power cut needs a disk with a volatile write cache"),
        ];
        for (head, want) in bad {
            let err = parse_experiment(&format!("{head}{cut}"), "e.yaml").unwrap_err();
            assert!(err.starts_with(want), "{err}");
            assert!(err.contains("allowed") || err.contains("add `disk: {write_cache: volatile}`"), "{err}");
        }
    }

    /// With a power cut each client writes its own slice of the disk: equal parts in whole
    /// workload blocks, client i from i x slice, its own content seed, a `span` inside it
    /// kept, a larger one refused at its place. Without a cut every client addresses the
    /// whole export with the same workload.
    #[test]
    fn several_clients_of_a_cut_each_write_their_own_slice() {
        let cut = "faults:\n  - {type: power-cut, model: lose-all, when: {after_ops: 100}}\n";
        let head = |clients: &str, w: &str| {
            format!(
                "name: t\nhosts: {{clients: [{clients}]}}\ndisk: {{size: 64MiB, write_cache: volatile}}\nworkload: {{block_size: 8KiB, sync: 'fsync:8', duration: 5s, content: {{seed: 7}}{w}}}\n"
            )
        };
        let uri = "nbd://10.77.0.1:10809/";
        let slices = |text: &str, n: usize| {
            let e = parse_experiment(text, "e.yaml").unwrap();
            (0..n).map(|i| e.client_workload(&e.setups[0], uri, i).map(|w| (w.base, w.span, w.seed)).unwrap()).collect::<Vec<_>>()
        };
        assert_eq!(slices(&format!("{}{cut}", head("a, b", "")), 2), [(0, Some(32 << 20), 7), (32 << 20, Some(32 << 20), 8)]);
        // three clients: a third of the disk each, in whole 8 KiB blocks, none past its end
        let s = slices(&format!("{}{cut}", head("a, b, c", "")), 3);
        let slice = (64u64 << 20) / 3 / 8192 * 8192;
        assert_eq!(s, [(0, Some(slice), 7), (slice, Some(slice), 8), (2 * slice, Some(slice), 9)]);
        assert!(s.windows(2).all(|p| p[0].0 + p[0].1.unwrap() <= p[1].0) && 3 * slice <= 64 << 20);
        // one client: the whole disk, the workload's own seed
        assert_eq!(slices(&format!("{}{cut}", head("a", "")), 1), [(0, Some(64 << 20), 7)]);
        // a span is each client's bytes from the start of its slice
        assert_eq!(slices(&format!("{}{cut}", head("a, b", ", span: 1MiB")), 2), [(0, Some(1 << 20), 7), (32 << 20, Some(1 << 20), 8)]);
        let err = parse_experiment(&format!("{}{cut}", head("a, b", ", span: 40MiB")), "e.yaml").unwrap_err();
        assert!(
            err.starts_with("e.yaml:4:")
                && err.contains("span: 40MiB is larger than each client's slice of the disk")
                && err.contains("allowed: at most 32MiB"),
            "{err}"
        );
        // without a cut nothing changes: the whole export, the same seed, for every client
        assert_eq!(slices(&head("a, b", ", span: 40MiB"), 2), [(0, None, 7), (0, None, 7)]);
        // the example: two clients, 16 MiB at the start of each half of a 1 GiB disk
        let ex = slices(include_str!("../../examples/crash-target.yaml"), 2);
        assert_eq!(ex.iter().map(|s| (s.0, s.1)).collect::<Vec<_>>(), [(0, Some(16 << 20)), (512 << 20, Some(16 << 20))]);
        assert_eq!(ex[1].2, ex[0].2 + 1);
    }

    /// A setup's `nbd:` overrides the experiment's `hosts: {nbd: ...}` key by key, in
    /// `setups:` and in a matrix axis; without `hosts:` it is refused with its place.
    #[test]
    fn a_setup_s_nbd_policy_overrides_the_experiment_s_key_by_key() {
        let e = parse_experiment(
            &format!("{BASE}setups:\n  - {{name: ours}}\n  - {{name: published, nbd: {{retries: 0}}}}\n  - {{name: slow, nbd: {{timeout: 5s}}}}\n"),
            "e.yaml",
        )
        .unwrap();
        let h = e.hosts.as_ref().unwrap();
        let q: Vec<String> = e.setups.iter().map(|s| h.nbd_query_for(s)).collect();
        assert_eq!(q, ["timeout=1s&retries=2", "timeout=1s&retries=0", "timeout=5s&retries=2"]);
        // a matrix: the policy from one axis, the net faults of the other axis's entries
        let m = parse_experiment(
            &format!(
                "{BASE}matrix:\n  fault:\n    - {{name: none}}\n    - {{name: delay, net_faults: [{{both: true, delay: 1ms}}]}}\n  client:\n    - {{name: published, nbd: {{retries: 0}}}}\n    - {{name: ours}}\n"
            ),
            "e.yaml",
        )
        .unwrap();
        let h = m.hosts.as_ref().unwrap();
        let q: Vec<(&str, String, usize)> = m.setups.iter().map(|s| (s.name.as_str(), h.nbd_query_for(s), s.net_faults.len())).collect();
        let want = [
            ("none/published", "timeout=1s&retries=0".to_string(), 0),
            ("none/ours", "timeout=1s&retries=2".into(), 0),
            ("delay/published", "timeout=1s&retries=0".into(), 1),
            ("delay/ours", "timeout=1s&retries=2".into(), 1),
        ];
        assert_eq!(q, want);
        let err = parse_experiment("name: t\nworkload: {duration: 1s}\nsetups:\n  - name: a\n    nbd: {retries: 0}\n", "e.yaml").unwrap_err();
        assert!(err.starts_with("e.yaml:5:10: setup `a`: `nbd` sets the clients' NBD policy of a networked experiment and needs `hosts:`"), "{err}");
        let err = parse_experiment(&format!("{BASE}setups:\n  - {{name: a, nbd: {{retries: 0, connections: 2}}}}\n"), "e.yaml").unwrap_err();
        assert!(err.contains("connections"), "{err}");
    }

    /// The published study runs each fault with the published clients and ours, each pair
    /// next to each other under the same faults.
    #[test]
    fn the_published_study_pairs_the_published_clients_with_ours() {
        let e = parse_experiment(include_str!("../../examples/performability-published.yaml"), "p.yaml").unwrap();
        let h = e.hosts.as_ref().unwrap();
        assert_eq!(e.setups.len(), 14);
        for pair in e.setups.chunks(2) {
            let (p, o) = (&pair[0], &pair[1]);
            let fault = p.name.strip_suffix("/published").unwrap_or_else(|| panic!("{}", p.name));
            assert_eq!(o.name, format!("{fault}/ours"));
            assert_eq!((h.nbd_query_for(p), h.nbd_query_for(o)), ("timeout=2s&retries=0".into(), "timeout=2s&retries=3".into()));
            assert_eq!((&p.net_faults, &p.faults.len(), &p.host_faults.len()), (&o.net_faults, &o.faults.len(), &o.host_faults.len()));
            assert!(!p.net_faults.is_empty(), "{}: the baseline delay", p.name);
        }
        assert!(e.setups.iter().any(|s| !s.host_faults.is_empty()) && e.setups.iter().any(|s| !s.faults.is_empty()));
    }
}
