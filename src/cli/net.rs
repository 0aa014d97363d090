//! `faultline net`: emulated hosts and the faulty network between them, without an experiment
//! (docs/net.md). `up` builds the hosts and runs the relay until Ctrl-C; `set`, `clear` and
//! `show` talk to a running `up` through its control socket.

use crate::net::{Network, RelayOptions, control};
use crate::spec::net::{Loss, NetFault, NetRule, Rate, parse_gilbert, parse_host_list, parse_rate, parse_reorder, parse_window};
use crate::spec::rule::DelayDist;
use crate::spec::units::{parse_duration, parse_ratio, parse_size};
use crate::sys::ledger;
use anyhow::Result;
use serde_json::json;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Args, Debug)]
pub struct NetArgs {
    /// Control socket of the `faultline net up` to talk to (default: the only one running).
    #[arg(long, global = true)]
    socket: Option<PathBuf>,
    #[command(subcommand)]
    cmd: NetCmd,
}

#[derive(clap::Subcommand, Debug)]
enum NetCmd {
    /// Build hosts (network namespaces) joined through the relay, print their namespaces and
    /// addresses, relay until Ctrl-C (SIGINT/SIGTERM), then remove them.
    Up {
        /// Host names, comma-separated (at least two), e.g. client,target.
        #[arg(long)]
        hosts: String,
        /// After a packet, keep polling the TUN devices this long before sleeping (lower
        /// latency for one-at-a-time packets, a busy CPU while they come). 0: off.
        #[arg(long, default_value = "0us", value_parser = parse_duration)]
        busy_poll: Duration,
        /// Join the (two) hosts with a plain veth pair instead: no relay, no faults (a
        /// baseline to compare the relay with).
        #[arg(long)]
        veth: bool,
        /// Send every packet through the relay, also on links without rules (no veth fast
        /// path): the relay's own cost, as `bench/net.sh` measures it.
        #[arg(long)]
        always_relay: bool,
        /// Run the relay's thread at normal priority instead of real-time (SCHED_FIFO 1).
        #[arg(long)]
        no_realtime: bool,
    },
    /// Add a fault rule on the packets from one host to another (all given faults together).
    Set(Box<SetArgs>),
    /// Remove rules by id (none given: all).
    Clear { ids: Vec<u64> },
    /// Hosts, rules and per-link counters (JSON).
    Show,
}

#[derive(clap::Args, Debug)]
struct SetArgs {
    /// Packets sent by this host (default: any).
    #[arg(long)]
    from: Option<String>,
    /// Packets sent to this host (default: any).
    #[arg(long)]
    to: Option<String>,
    /// Also the packets going the other way (to -> from).
    #[arg(long)]
    both: bool,
    /// Fixed delay per packet, e.g. 1ms.
    #[arg(long, value_parser = parse_duration)]
    delay: Option<Duration>,
    /// Delay drawn per packet, as YAML, e.g. '{distribution: lognormal, median: 1ms, sigma: 0.5}'.
    #[arg(long, conflicts_with = "delay")]
    delay_dist: Option<String>,
    /// Uniform variation of each delay in [-J, +J] (may reorder, like netem).
    #[arg(long, value_parser = parse_duration)]
    jitter: Option<Duration>,
    /// Random loss per packet, e.g. 0.1%.
    #[arg(long, value_parser = parse_ratio)]
    loss: Option<f64>,
    /// Bursty loss (Gilbert-Elliott): P[,R[,LOSS_BAD[,LOSS_GOOD]]], e.g. 1%,25%.
    #[arg(long, conflicts_with = "loss", value_parser = parse_gilbert)]
    loss_ge: Option<Loss>,
    /// Probability that a packet is sent twice.
    #[arg(long, value_parser = parse_ratio)]
    duplicate: Option<f64>,
    /// PROB[:GAP]: hold this share of packets back by GAP (default 1ms) so later ones pass them.
    #[arg(long, value_parser = parse_reorder)]
    reorder: Option<crate::spec::net::Reorder>,
    /// Bandwidth cap, e.g. 100mbit (token bucket).
    #[arg(long, value_parser = parse_rate)]
    rate: Option<u64>,
    /// Token bucket size (bytes a burst may send at once).
    #[arg(long, default_value = "32KiB", value_parser = parse_size)]
    burst: u64,
    /// Longest wait in the rate queue (time to drain it); packets beyond it are dropped.
    #[arg(long, default_value = "50ms", value_parser = parse_duration)]
    queue: Duration,
    /// Drop every packet.
    #[arg(long)]
    partition: bool,
    /// Answer every TCP segment with a RST to its sender and drop it.
    #[arg(long)]
    reset: bool,
    /// Active only in FROM..TO (or FROM..) counted from now, e.g. 2s..5s (default: until cleared).
    #[arg(long, value_parser = parse_window)]
    window: Option<crate::spec::rule::Window>,
    /// Seed of the rule's random choices.
    #[arg(long)]
    seed: Option<u64>,
}

impl SetArgs {
    fn rule(self) -> Result<NetRule> {
        let delay = match (self.delay, self.delay_dist) {
            (Some(d), _) => Some(DelayDist::Fixed(d)),
            (None, Some(y)) => Some(crate::spec::rule::yaml::parse_delay_yaml(&y, "--delay-dist").map_err(anyhow::Error::msg)?),
            _ => None,
        };
        let fault = NetFault {
            delay,
            jitter: self.jitter,
            loss: self.loss.map(|probability| Loss::Random { probability }).or(self.loss_ge),
            duplicate: self.duplicate,
            reorder: self.reorder,
            rate: self.rate.map(|bits_per_sec| Rate { bits_per_sec, burst: self.burst, queue: self.queue }),
            partition: self.partition,
            reset: self.reset,
        };
        fault.validate().map_err(anyhow::Error::msg)?;
        Ok(NetRule { from: self.from, to: self.to, both: self.both, window: self.window, seed: self.seed, fault })
    }
}

pub fn net(a: NetArgs) -> Result<()> {
    match a.cmd {
        NetCmd::Up { hosts, busy_poll, veth, always_relay, no_realtime } => {
            up(&parse_host_list(&hosts).map_err(anyhow::Error::msg)?, RelayOptions { busy_poll, always_relay, normal_priority: no_realtime }, veth, a.socket)
        }
        NetCmd::Set(s) => {
            let rule = (*s).rule()?;
            let r = control::call(&socket(a.socket)?, &json!({"cmd": "set", "rule": rule}))?;
            println!("{r}");
            Ok(())
        }
        NetCmd::Clear { ids } => {
            let req = if ids.is_empty() { json!({"cmd": "clear"}) } else { json!({"cmd": "clear", "ids": ids}) };
            println!("{}", control::call(&socket(a.socket)?, &req)?);
            Ok(())
        }
        NetCmd::Show => {
            println!("{}", serde_json::to_string_pretty(&control::call(&socket(a.socket)?, &json!({"cmd": "show"}))?)?);
            Ok(())
        }
    }
}

fn socket(given: Option<PathBuf>) -> Result<PathBuf> {
    super::find_socket(given, |l| l.net_socket.clone(), "`faultline net up`")
}

fn up(hosts: &[String], opts: RelayOptions, veth: bool, socket: Option<PathBuf>) -> Result<()> {
    // catch signals from the start so a Ctrl-C during set-up still tears down
    let mut signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM])?;
    let path = socket.unwrap_or_else(|| ledger::run_dir().join(format!("net-{}.sock", std::process::id())));
    if !veth {
        crate::sys::check_new_socket(&path)?;
    }
    let mut net = if veth { Network::up_veth(hosts)? } else { Network::up(hosts, opts)? };
    if !veth {
        std::fs::create_dir_all(ledger::run_dir())?;
        net.serve_control(&path)?;
    }
    {
        let mut out = std::io::stdout().lock();
        for h in net.hosts() {
            writeln!(out, "host {} namespace {} address {}", h.name, h.namespace, h.address)?;
        }
        if veth {
            writeln!(out, "veth baseline (no relay); Ctrl-C to remove")?;
        } else {
            // the line tests and scripts wait for
            writeln!(out, "relay ready; control socket {}; Ctrl-C to remove", path.display())?;
        }
        out.flush()?;
    }
    while signals.pending().next().is_none() {
        std::thread::sleep(Duration::from_millis(50));
    }
    for l in net.down()? {
        eprintln!("faultline: {l}");
    }
    Ok(())
}
