//! `faultline agent --stdio` and `faultline agent ping`.

use crate::cluster::{Agent, Channel, install};
use anyhow::{Context, Result, bail};
use std::io::Write;
use std::time::{Duration, Instant};

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
    /// Be a prober (what the experiment runner spawns on every host): print one JSON line of
    /// host samples (run::probe::HostSample) every INTERVAL on stdout.
    #[arg(long, value_name = "INTERVAL", value_parser = crate::spec::units::parse_duration, conflicts_with_all = ["stdio", "ssh", "exec"])]
    pub probe: Option<Duration>,
    /// With --probe: also the CPU and memory of the processes in this process group
    /// (repeatable).
    #[arg(long, requires = "probe")]
    pub probe_group: Vec<i32>,
    /// With --probe: also the requests a `faultline serve` answered, from its control socket.
    #[arg(long, requires = "probe")]
    pub probe_socket: Option<String>,
    /// With --probe: stop after this many samples.
    #[arg(long, requires = "probe")]
    pub probe_count: Option<u64>,
    /// Apply network faults on this host as the controller planned them (JSON: what a
    /// controller spawns through an agent; cluster::netfaults) until SIGINT/SIGTERM.
    #[arg(long, value_name = "PLAN", conflicts_with_all = ["stdio", "ssh", "exec", "probe"])]
    pub net_faults: Option<String>,
    /// Bench (bench/agents.sh): start an agent in each of these network namespaces
    /// (repeatable), have each stream probe samples at --bench-rate per second for
    /// --bench-seconds, count them, and print the controller's CPU per sample.
    #[arg(long, value_name = "NETNS", conflicts_with_all = ["stdio", "ssh", "exec", "probe"])]
    pub bench_netns: Vec<String>,
    #[arg(long, default_value_t = 10)]
    pub bench_rate: u32,
    #[arg(long, default_value_t = 20)]
    pub bench_seconds: u32,
}

pub fn run(a: AgentArgs) -> Result<()> {
    if a.stdio {
        return crate::cluster::agent::run_stdio();
    }
    if let Some(interval) = a.probe {
        crate::run::probe::stream(interval, &a.probe_group, a.probe_socket.as_deref(), a.probe_count, |s| {
            let mut o = std::io::stdout().lock();
            writeln!(o, "{}", serde_json::to_string(s).unwrap_or_default()).and_then(|()| o.flush()).is_ok()
        });
        return Ok(());
    }
    if let Some(plan) = &a.net_faults {
        return crate::cluster::netfaults::run(plan);
    }
    if !a.bench_netns.is_empty() {
        return bench(&a);
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

/// `--bench-netns`: agents in namespaces, each streaming samples; the controller counts what
/// arrives and reads its own CPU time (/proc/self/stat) over the streaming.
fn bench(a: &AgentArgs) -> Result<()> {
    let exe = std::env::current_exe().context("cannot find this faultline")?.display().to_string();
    let mut agents = Vec::new();
    for ns in &a.bench_netns {
        agents.push(Agent::connect(&Channel::Exec(vec!["ip".into(), "netns".into(), "exec".into(), ns.clone()]), &exe)?);
    }
    let per = u64::from(a.bench_rate) * u64::from(a.bench_seconds);
    let interval = format!("{}us", 1_000_000 / a.bench_rate.max(1));
    let cpu = || {
        let s = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
        let f: Vec<&str> = s[s.rfind(')').unwrap_or(0) + 2..].split(' ').collect();
        let g = |k: usize| f.get(k).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
        (g(11) + g(12)) / nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100) as f64
    };
    let (c0, t0) = (cpu(), Instant::now());
    let events: Vec<_> = agents.iter_mut().map(|g| g.take_events()).collect();
    for g in &mut agents {
        let argv = [exe.as_str(), "agent", "--probe", &interval, "--probe-count", &per.to_string()].map(String::from).to_vec();
        g.call(crate::cluster::proto::Op::Spawn { name: "probe".into(), argv }, Duration::from_secs(10))?;
    }
    // one thread per agent counts its samples until its prober exits
    let counters: Vec<_> = events
        .into_iter()
        .map(|rx| {
            std::thread::spawn(move || {
                let mut n = 0u64;
                while let Ok(e) = rx.recv_timeout(Duration::from_secs(30)) {
                    match e {
                        crate::cluster::proto::Event::Output { stream, line, .. }
                            if stream == "stdout" && serde_json::from_str::<crate::run::probe::HostSample>(&line).is_ok() =>
                        {
                            n += 1;
                        }
                        crate::cluster::proto::Event::Exit { .. } => break,
                        _ => {}
                    }
                }
                n
            })
        })
        .collect();
    let got: u64 = counters.into_iter().map(|t| t.join().unwrap_or(0)).sum();
    let (c1, secs) = (cpu(), t0.elapsed().as_secs_f64());
    for g in agents {
        g.shutdown()?;
    }
    let expected = per * a.bench_netns.len() as u64;
    let cpu_s = c1 - c0;
    println!("expected {expected} samples, received {got}; controller CPU {cpu_s:.3} s over {secs:.1} s ({:.1} us/sample)", cpu_s * 1e6 / got.max(1) as f64);
    println!("agents={} samples_lost={} controller_cpu_pct={:.2}", a.bench_netns.len(), expected.saturating_sub(got), cpu_s / secs * 100.0);
    Ok(())
}
