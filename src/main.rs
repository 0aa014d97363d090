//! The faultline CLI: the command tree and the dispatch to `faultline::cli`, one module per
//! subcommand (argument parsing and output); the work is in the library.

use anyhow::Result;
use clap::{Parser, Subcommand};
use faultline::sys::ledger;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Parser)]
#[command(name = "faultline", version, about = "A faulty virtual disk for storage-stack experiments")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Serve a faulty disk as /dev/loopN until SIGINT/SIGTERM; prints the device path first.
    Serve(faultline::cli::serve::ServeArgs),
    /// Talk to a running `faultline serve` through its control socket.
    Fault(faultline::cli::fault::FaultArgs),
    /// Crash states (docs/crash.md): `explore` records a workload once and checks many crash
    /// states of its write log; `replay` puts one on a device.
    Crash(faultline::cli::crash::CrashArgs),
    /// Run an experiment file (docs/experiment.md): disk + stack + workload + faults, verify,
    /// write a results directory with report.html, print a summary table.
    Run {
        /// The experiment (YAML).
        file: PathBuf,
        /// Results directory (default: results/<name>-<unix time>); must be new or empty.
        #[arg(long, short)]
        out: Option<PathBuf>,
        /// Validate the file and print the setups, run nothing.
        #[arg(long)]
        check: bool,
        /// No progress bar.
        #[arg(long, short)]
        quiet: bool,
    },
    /// Release loop devices, FUSE mounts, directories and network namespaces left by faultline
    /// processes that died.
    Cleanup,
    /// Measure a duplicate-content profile from real data (files, directories, devices).
    Profile(faultline::cli::profile::ProfileArgs),
    /// Run a workload (block device or files; flags or --spec YAML, docs/workload.md); saves
    /// results, a time series and the content maps for `verify`.
    Workload(faultline::cli::workload::WorkloadArgs),
    /// Fit a latency model to a real device with fio (read-only unless --destructive names
    /// it) or to a fio result, write it as YAML, then compare a faultline disk with it
    /// against the device on the same job (docs/latency.md).
    Calibrate(faultline::cli::calibrate::CalibrateArgs),
    /// Reread every block a workload wrote and classify it: ok, corrupted (misdirected),
    /// unreadable, short, missing.
    Verify(faultline::cli::workload::VerifyArgs),
    /// Rebuild report.html from one or more results directories (several: side by side).
    Report {
        #[arg(required = true)]
        dirs: Vec<PathBuf>,
        /// Output HTML (default DIR/report.html; required with several directories).
        #[arg(long, short)]
        out: Option<PathBuf>,
    },
    /// Time the block layer of devices and the I/O system calls of processes with BPF
    /// (docs/monitor.md): per op counts, bytes, mean and percentiles, queue depth; prints a
    /// table, writes DIR/monitor.json.
    Monitor(faultline::cli::monitor::MonitorArgs),
    /// Apply host faults to running processes (docs/host.md): CPU taken away, memory
    /// pressure, freeze, kill; sticky or in windows counted from now. Reverts everything at
    /// the end, on Ctrl-C, and prints what each fault did.
    Host {
        /// A file with `host_faults: [...]` (docs/host.md).
        file: Option<PathBuf>,
        /// One fault as inline YAML, e.g. '{type: cpu, share: 50%}' (repeatable).
        #[arg(long)]
        fault: Vec<String>,
        /// A target process (repeat for several); processes it forks later are included.
        #[arg(long, required = true)]
        pid: Vec<u32>,
        /// How long to run (default: until the last window ends, or Ctrl-C if a fault is sticky).
        #[arg(long, value_parser = faultline::cli::positive_duration)]
        duration: Option<Duration>,
        /// Shell command that restarts the target after a `kill` whose window ends.
        #[arg(long)]
        restart: Option<String>,
        /// Print the records as JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// The agent of multi-host experiments (docs/cluster.md): `--stdio` speaks the agent
    /// protocol on stdin/stdout (started by a controller through ssh or another exec
    /// channel); with --ssh or --exec it starts one through that channel and reports its host,
    /// version and clock offset.
    Agent(faultline::cli::agent::AgentArgs),
    /// Emulated hosts (network namespaces) and the faulty network between them (docs/net.md).
    Net(faultline::cli::net::NetArgs),
    /// (testing) Serve RAM disks, build a stack on them and hold it until SIGINT/SIGTERM.
    #[command(hide = true)]
    StackHold {
        #[arg(long, default_value = "256MiB", value_parser = faultline::cli::size_arg)]
        size: u64,
        /// raw | ext4 | xfs | btrfs | btrfs-raid1
        #[arg(long, default_value = "ext4")]
        stack: String,
        /// Also run a command whose working directory is in the mount (a busy file system).
        #[arg(long)]
        busy: bool,
    },
}

fn main() {
    let cli = Cli::parse();
    if let Err(e) = run(cli) {
        eprintln!("faultline: error: {e:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.cmd {
        Cmd::Serve(a) => faultline::cli::serve::serve(a),
        Cmd::Fault(a) => faultline::cli::fault::fault(a),
        Cmd::Crash(a) => faultline::cli::crash::crash(a),
        Cmd::Run { file, out, check, quiet } => {
            let exp = faultline::spec::experiment::parse_experiment_file(&file).map_err(anyhow::Error::msg)?;
            if check {
                for st in &exp.setups {
                    println!("{}: stack {}, {} fault(s), repeat {}", st.name, st.stack.label(), st.faults.len(), st.repeat);
                }
                return Ok(());
            }
            faultline::run::run(&exp, &faultline::run::RunOptions { out, quiet }).map(|_| ())
        }
        Cmd::Cleanup => {
            let done = ledger::cleanup();
            if done.is_empty() {
                println!("nothing to clean up");
            }
            for l in done {
                println!("{l}");
            }
            Ok(())
        }
        Cmd::Profile(a) => faultline::cli::profile::profile(a),
        Cmd::Workload(a) => faultline::cli::workload::workload(a),
        Cmd::Calibrate(a) => faultline::cli::calibrate::calibrate(a),
        Cmd::Verify(a) => faultline::cli::workload::verify(a),
        Cmd::Monitor(a) => faultline::cli::monitor::monitor(a),
        Cmd::Host { file, fault, pid, duration, restart, json } => faultline::cli::host::run(file.as_deref(), &fault, &pid, duration, restart, json),
        Cmd::Agent(a) => faultline::cli::agent::run(a),
        Cmd::Net(a) => faultline::cli::net::net(a),
        Cmd::StackHold { size, stack, busy } => faultline::stack::hold::run(size, &stack, busy),
        Cmd::Report { dirs, out } => {
            if let [dir] = &dirs[..]
                && faultline::crash::report::is_explore_dir(dir)
            {
                println!("report: {}", faultline::crash::report::write(dir, out.as_deref())?.display());
                return Ok(());
            }
            let (runs, path) = faultline::report::rebuild(&dirs, out.as_deref())?;
            for r in &runs {
                println!("{}\n{}", r.name, faultline::report::summary_table(r));
            }
            println!("report: {}", path.display());
            Ok(())
        }
    }
}
