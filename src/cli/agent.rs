//! `faultline agent --stdio` and `faultline agent ping`.

use crate::cluster::{Agent, Channel, install};
use anyhow::{Result, bail};

#[derive(clap::Args)]
pub struct AgentArgs {
    /// Speak the agent protocol on stdin/stdout (what a controller starts).
    #[arg(long, conflicts_with_all = ["ssh", "exec"])]
    pub stdio: bool,
    /// Start an agent over OpenSSH at this destination ([user@]host) and report on it.
    #[arg(long)]
    pub ssh: Option<String>,
    /// An ssh option, e.g. `-p 2222` as two values (repeatable).
    #[arg(long, allow_hyphen_values = true, requires = "ssh")]
    pub ssh_option: Vec<String>,
    /// Start an agent through this command prefix instead, e.g. "ip netns exec NS" (split on
    /// spaces).
    #[arg(long, conflicts_with = "ssh")]
    pub exec: Option<String>,
    /// The faultline program on the host (a path, or a name on its PATH).
    #[arg(long, default_value = "faultline")]
    pub faultline: String,
    /// Copy this faultline to the --faultline path on the host first (opt-in).
    #[arg(long)]
    pub install: bool,
    /// Round trips for the clock-offset estimate.
    #[arg(long, default_value_t = 16)]
    pub rounds: usize,
}

pub fn run(a: AgentArgs) -> Result<()> {
    if a.stdio {
        return crate::cluster::agent::run_stdio();
    }
    let channel = match (&a.ssh, &a.exec) {
        (Some(dest), _) => Channel::Ssh { dest: dest.clone(), options: a.ssh_option.clone() },
        (None, Some(prefix)) => Channel::Exec(prefix.split_whitespace().map(String::from).collect()),
        (None, None) => bail!("give --stdio (be an agent), or --ssh DEST / --exec PREFIX (start one and report)"),
    };
    if a.install {
        install(&channel, &a.faultline)?;
    }
    let mut agent = Agent::connect(&channel, &a.faultline)?;
    let o = agent.clock_offset(a.rounds)?;
    println!(
        "agent on {} via `{}`: faultline {}, protocol {}, pid {}; clock offset {:+.3} ms ± {:.3} ms (best round trip {:.3} ms of {})",
        agent.hello.host,
        channel.describe(),
        agent.hello.version,
        agent.hello.protocol,
        agent.hello.pid,
        o.offset_ns as f64 / 1e6,
        o.error_ns as f64 / 1e6,
        o.rtt_ns as f64 / 1e6,
        a.rounds
    );
    agent.shutdown()
}
