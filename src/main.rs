//! The faultline CLI. Argument parsing and output only; the work is in the library.

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use faultline::frontend::control;
use faultline::spec::disk::{CpuLatency, DiskConfig, FrontendOptions, RingMode, RqAffinity, StoreSpec, check_block_size};
use faultline::spec::units::{parse_busy_poll, parse_size};
use faultline::stack::served::{Exposure, ServedDisk};
use faultline::sys::ledger;
use serde_json::{Value, json};
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Parser)]
#[command(name = "faultline", version, about = "A faulty virtual disk for storage-stack experiments")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

fn size_arg(s: &str) -> Result<u64, String> {
    parse_size(s)
}

#[derive(Subcommand)]
enum Cmd {
    /// Serve a faulty disk as /dev/loopN until SIGINT/SIGTERM; prints the device path first.
    Serve {
        /// Disk size, e.g. 8GiB (needed for ram and for a new store file).
        #[arg(long, value_parser = size_arg)]
        size: Option<u64>,
        /// Logical block size: 512B..64KiB, a power of two.
        #[arg(long, default_value = "4KiB", value_parser = size_arg)]
        block_size: u64,
        /// Backing store: ram | file:PATH | device:PATH | nbd://HOST[:PORT]/EXPORT | nbd+unix:///EXPORT?socket=PATH
        /// (a remote NBD export; timeout, retries, backoff as URI keys: docs/nbd.md).
        #[arg(long, default_value_t = DiskConfig::default().store)]
        store: StoreSpec,
        /// Confirm that a device store may be overwritten.
        #[arg(long)]
        destructive: bool,
        /// Overwrite a device even if it carries a partition table or file system.
        #[arg(long)]
        force: bool,
        /// YAML rules armed before the device appears (docs/rules.md).
        #[arg(long)]
        rules: Option<PathBuf>,
        /// A latency model (YAML, docs/latency.md): a service time for every request, per op,
        /// and optionally `channels`.
        #[arg(long, value_name = "FILE")]
        latency: Option<PathBuf>,
        /// (internal) The latency model as YAML text (`faultline run` hands its disks theirs).
        #[arg(long, hide = true, conflicts_with = "latency")]
        latency_yaml: Option<String>,
        /// Make every page of a RAM store resident before the device appears, so the disk does
        /// not change speed as it fills (default: true with --latency, else false).
        #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
        populate: Option<bool>,
        /// Control socket path (default: /run/faultline/<pid>.sock).
        #[arg(long)]
        socket: Option<PathBuf>,
        /// After each read/write, poll for the next request this long before sleeping: lower
        /// latency while requests come one at a time, at the cost of up to one CPU busy while
        /// they do. While several requests are in flight, only the per-CPU ring threads poll,
        /// their own ring, for 5 µs. 0 turns both off (max 1ms).
        #[arg(long, default_value = "50us", value_parser = parse_busy_poll)]
        busy_poll: Duration,
        /// How requests reach the daemon: `on` = FUSE over io_uring (Linux 6.14+; the kernel's
        /// switch is turned on for the mount and put back), `off` = classic /dev/fuse reads,
        /// `auto` = io_uring where it works, else classic (the start-up line says which).
        #[arg(long, value_enum, default_value_t = FrontendOptions::default().ring)]
        ring: RingMode,
        /// Which CPU completes the loop device's requests (its queue/rq_affinity): `auto` =
        /// over io_uring, the submitting CPU (2) while requests come one at a time, the
        /// device's own value otherwise (classic /dev/fuse: untouched); `keep` = never touch
        /// it; 0, 1 or 2 = that value. Put back at teardown.
        #[arg(long, value_enum, default_value_t = FrontendOptions::default().rq_affinity)]
        rq_affinity: RqAffinity,
        /// Idle CPUs' wake-up latency (/dev/cpu_dma_latency): `auto` = ask for 0 µs (idle
        /// CPUs poll instead of halting) while the disk has requests, released 10 ms after
        /// the last; `hold` = for the disk's whole life; `keep` = never ask. Machine-wide
        /// while held: what runs on the disk gets the faster wake-ups too.
        #[arg(long, value_enum, default_value_t = FrontendOptions::default().cpu_latency)]
        cpu_latency: CpuLatency,
        /// Threads serving FUSE over io_uring: 0 = one ring per CPU queue, its thread pinned to
        /// that CPU (as libfuse does), one thread busy-polling every ring while requests come
        /// one at a time; N = N threads sharing the queues (1: one thread sees every request).
        #[arg(long, default_value_t = FrontendOptions::default().ring_threads)]
        ring_threads: usize,
        /// Also serve the disk over NBD: tcp://HOST:PORT (port 0: any free port) or unix:PATH
        /// (docs/nbd.md). The export's URI is printed on stdout (libnbd form: nbd://HOST:PORT,
        /// nbd+unix:///?socket=PATH).
        #[arg(long, value_name = "ADDRESS")]
        nbd: Option<faultline::nbd::NbdAddr>,
        /// Serve over NBD only: no FUSE mount, no loop device (needs --nbd).
        #[arg(long, requires = "nbd")]
        no_loop: bool,
        /// (internal) Serve for this process (`faultline run`): when it dies, release what it
        /// built on the disk and tear down.
        #[arg(long, hide = true)]
        owned_by: Option<u32>,
    },
    /// Talk to a running `faultline serve` through its control socket.
    Fault {
        /// Control socket (default: the only running faultline serve).
        #[arg(long, global = true)]
        socket: Option<PathBuf>,
        #[command(subcommand)]
        cmd: FaultCmd,
    },
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
    Profile {
        /// Files, directories (walked, symlinks not followed) or block devices.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        #[arg(long, default_value = "4KiB", value_parser = size_arg)]
        block_size: u64,
        /// Where to write the profile (default: stdout).
        #[arg(long, short)]
        out: Option<PathBuf>,
    },
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
    Monitor {
        /// A block device to watch (repeat for several).
        #[arg(long, required_unless_present = "pid")]
        device: Vec<PathBuf>,
        /// A process whose I/O system calls to time, with the processes it forks from now on
        /// (repeat for several).
        #[arg(long)]
        pid: Vec<u32>,
        /// How long to watch (default: until Ctrl-C).
        #[arg(long, value_parser = positive_duration)]
        duration: Option<Duration>,
        /// Length of one interval of the time series (10ms or more).
        #[arg(long, default_value = "1s", value_parser = monitor_interval)]
        interval: Duration,
        /// Directory for monitor.json (created if missing).
        #[arg(long, short)]
        out: Option<PathBuf>,
        /// A tracepoint pair to time: NAME=SYS:ENTER,SYS:EXIT[,key=FIELD] (default key: the
        /// thread; repeat for several). The file-system, journal and driver layers of the
        /// devices are timed without asking.
        #[arg(long, value_parser = faultline::monitor::pairs::Pair::parse_arg)]
        pair: Vec<faultline::monitor::pairs::Pair>,
        /// Layers to time besides the block layer, comma-separated: fs, journal, driver
        /// (default: journal; docs/monitor.md says what each costs). `--pid` adds syscall.
        #[arg(long, value_delimiter = ',', default_values_t = faultline::monitor::DEFAULT_MONITOR_LAYERS.iter().map(|l| l.to_string()).collect::<Vec<_>>(),
              value_parser = faultline::monitor::parse_layer)]
        layers: Vec<String>,
    },
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
        #[arg(long, value_parser = positive_duration)]
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
        #[arg(long, default_value = "256MiB", value_parser = size_arg)]
        size: u64,
        /// raw | ext4 | xfs | btrfs | btrfs-raid1
        #[arg(long, default_value = "ext4")]
        stack: String,
        /// Also run a command whose working directory is in the mount (a busy file system).
        #[arg(long)]
        busy: bool,
    },
}

#[derive(Subcommand)]
enum FaultCmd {
    /// Arm the rules in a YAML file ("-" reads stdin).
    Add { file: PathBuf },
    /// List armed rules with their counters (JSON).
    List,
    /// Disarm rules by id.
    Remove { ids: Vec<u64> },
    /// Disarm all rules.
    Clear,
    /// Stop matching rules until `resume`, keeping them and their counters.
    Pause,
    /// Match the paused rules again.
    Resume,
    /// Print fault log entries as JSON lines.
    Log {
        #[arg(long, default_value_t = 0)]
        since: u64,
        #[arg(long, default_value_t = 10_000)]
        max: usize,
    },
    /// Device counters (requests, bytes, faults).
    Stats,
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
        Cmd::Serve {
            size,
            block_size,
            store,
            destructive,
            force,
            rules,
            latency,
            latency_yaml,
            populate,
            socket,
            busy_poll,
            ring,
            rq_affinity,
            cpu_latency,
            ring_threads,
            nbd,
            no_loop,
            owned_by,
        } => serve(
            DiskConfig {
                size,
                block_size: check_block_size(block_size).map_err(anyhow::Error::msg)?,
                store,
                destructive,
                force,
                latency: match (latency, latency_yaml) {
                    (Some(p), _) => Some(faultline::spec::latency::parse_latency_file(&p).map_err(anyhow::Error::msg)?),
                    (None, Some(y)) => Some(faultline::spec::latency::parse_latency(&y, "--latency-yaml").map_err(anyhow::Error::msg)?),
                    (None, None) => None,
                },
                populate,
            },
            &FrontendOptions { busy_poll, ring, rq_affinity, cpu_latency, ring_threads },
            &Exposure { loop_device: !no_loop, nbd },
            rules,
            socket,
            owned_by,
        ),
        Cmd::Fault { socket, cmd } => fault(socket, cmd),
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
        Cmd::Profile { paths, block_size, out } => profile(&paths, block_size, out),
        Cmd::Workload(a) => faultline::cli::workload::workload(a),
        Cmd::Calibrate(a) => faultline::cli::calibrate::calibrate(a),
        Cmd::Verify(a) => faultline::cli::workload::verify(a),
        Cmd::Monitor { device, pid, duration, interval, out, pair, layers } => monitor(&device, &pid, duration, interval, out, pair, &layers),
        Cmd::Host { file, fault, pid, duration, restart, json } => faultline::cli::host::run(file.as_deref(), &fault, &pid, duration, restart, json),
        Cmd::Agent(a) => faultline::cli::agent::run(a),
        Cmd::Net(a) => faultline::cli::net::net(a),
        Cmd::StackHold { size, stack, busy } => faultline::stack::hold::run(size, &stack, busy),
        Cmd::Report { dirs, out } => {
            let (runs, path) = faultline::report::rebuild(&dirs, out.as_deref())?;
            for r in &runs {
                println!("{}\n{}", r.name, faultline::report::summary_table(r));
            }
            println!("report: {}", path.display());
            Ok(())
        }
    }
}

fn serve(cfg: DiskConfig, front: &FrontendOptions, how: &Exposure, rules: Option<PathBuf>, socket: Option<PathBuf>, owned_by: Option<u32>) -> Result<()> {
    let owner = owned_by.map(ledger::set_owner).transpose()?;
    // catch signals from the start so a Ctrl-C during set-up still tears down
    let mut signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM])?;
    let socket = socket.unwrap_or_else(|| ledger::run_dir().join(format!("{}.sock", std::process::id())));
    let served = ServedDisk::start_as(
        &cfg,
        front,
        how,
        |d| match &rules {
            Some(p) => faultline::spec::rules::parse_rules_file(p, d.geometry()).map_err(anyhow::Error::msg),
            None => Ok(vec![]),
        },
        Some(&socket),
    )?;
    // first line: the loop device, or the NBD URI when there is none; with both, the URI second
    let mut out = std::io::stdout().lock();
    if !served.device().as_os_str().is_empty() {
        writeln!(out, "{}", served.device().display())?;
    }
    if let Some(u) = served.nbd_uri() {
        writeln!(out, "{u}")?;
    }
    out.flush()?;
    drop(out);
    // a run's server shares the run's stderr: its start-up line would only be noise there
    if owner.is_none() {
        eprintln!(
            "faultline: serving {} ({} store{}, {} B blocks, {} rules, busy poll {}, requests over {}, rq_affinity {}, cpu latency {}) on {}; control socket {}; Ctrl-C to stop",
            faultline::spec::units::format_size(served.disk.size()),
            served.disk.describe_store(),
            match served.disk.latency().map(|l| l.model()) {
                Some(m) => format!(
                    ", latency model for {}{}",
                    faultline::spec::rule::Op::ALL.iter().filter(|o| m.op(**o).is_some()).map(|o| o.name()).collect::<Vec<_>>().join("/"),
                    m.channels.map(|c| format!(", {c} channel(s)")).unwrap_or_default()
                ),
                None => String::new(),
            },
            served.disk.block_size(),
            served.disk.engine().list().len(),
            if front.busy_poll.is_zero() { "off".into() } else { faultline::spec::units::format_duration(front.busy_poll) },
            served.transport(),
            front.rq_affinity,
            match served.cpu_latency_unavailable() {
                Some(why) => format!("{} (unavailable: {why})", front.cpu_latency),
                None => front.cpu_latency.to_string(),
            },
            [served.device().display().to_string(), served.nbd_uri().unwrap_or_default()]
                .into_iter()
                .filter(|s| !s.is_empty())
                .collect::<Vec<_>>()
                .join(" and "),
            socket.display()
        );
    }
    // until a signal, or until the owner is gone (its death signal may have come before the
    // handler was in place)
    let owner_running = || owner.is_none_or(|(p, t)| faultline::sys::process::is_running(p, t));
    loop {
        if let Some(sig) = signals.pending().next() {
            if owner.is_none() {
                eprintln!("faultline: signal {sig}, tearing down");
            }
            break;
        }
        if !owner_running() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    if let Some((pid, start)) = owner {
        // a killed owner's threads may still wait for this disk: keep serving until they
        // are gone, then take down what it built on the disk (file systems, commands)
        let gone = || faultline::sys::process::is_gone(pid, start);
        // an owner that is still running after a moment sent the signal itself (a run tearing
        // down its disk): nothing of it waits for the disk, so there is nothing to wait for
        let t = std::time::Instant::now();
        while owner_running() && t.elapsed() < std::time::Duration::from_millis(200) {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let t = std::time::Instant::now();
        while !owner_running() && !gone() && t.elapsed() < std::time::Duration::from_secs(10) {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        if !owner_running() {
            quiet_if_stderr_closed();
            let mut notes = Vec::new();
            ledger::release_owner(pid, start, &mut notes);
            for n in notes {
                eprintln!("faultline: run {pid} is gone: {n}");
            }
        }
    }
    served.teardown()
}

/// A run's stderr may have been a pipe read by the run itself: with no reader left, writing
/// to it fails and `eprintln!` would panic mid-teardown. Point stderr at /dev/null then.
fn quiet_if_stderr_closed() {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use std::os::fd::AsFd;
    let err = std::io::stderr();
    let mut fds = [PollFd::new(err.as_fd(), PollFlags::POLLOUT)];
    let broken = poll(&mut fds, PollTimeout::ZERO).is_ok() && fds[0].revents().is_some_and(|r| r.contains(PollFlags::POLLERR));
    if broken && let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        let _ = nix::unistd::dup2_stderr(null.as_fd());
    }
}

/// `monitor --duration`, `host --duration`: 0 watched or applied nothing and reported success.
fn positive_duration(s: &str) -> Result<Duration, String> {
    let d = faultline::spec::units::parse_duration(s)?;
    if d.is_zero() {
        return Err(format!("`{s}` ends before anything is done; allowed: more than 0 (or leave it out: until Ctrl-C)"));
    }
    Ok(d)
}

/// `monitor --interval`: at least 10ms, as an experiment's `monitor: {interval}` (a 0 was taken).
fn monitor_interval(s: &str) -> Result<Duration, String> {
    let d = faultline::spec::units::parse_duration(s)?;
    if d < Duration::from_millis(10) {
        return Err(format!("`{s}` is too short; allowed: 10ms or more"));
    }
    Ok(d)
}

fn monitor(
    devices: &[PathBuf],
    pids: &[u32],
    duration: Option<Duration>,
    interval: Duration,
    out: Option<PathBuf>,
    pairs: Vec<faultline::monitor::pairs::Pair>,
    layers: &[String],
) -> Result<()> {
    // found out only after the whole watch
    if let Some(o) = out.as_ref().filter(|o| o.exists() && !o.is_dir()) {
        bail!("--out {}: exists and is not a directory; give a directory for monitor.json (created if missing)", o.display());
    }
    let mut signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM])?;
    let (pm, pair_notes) = faultline::monitor::start_pairs(devices, pids, pairs, layers)?;
    let sys = if pids.is_empty() { None } else { Some(faultline::monitor::SyscallMonitor::start(pids)?) };
    let m = if devices.is_empty() { None } else { Some(faultline::monitor::BlockMonitor::start(devices, interval)?) };
    let attach = m.as_ref().map(|m| m.attach).or(sys.as_ref().map(|s| s.attach)).unwrap_or("");
    let mut what: Vec<String> = devices.iter().map(|d| d.display().to_string()).collect();
    what.extend(pids.iter().map(|p| format!("pid {p}")));
    // the line tests and scripts wait for: from here on requests are timed
    println!(
        "monitoring {} ({attach}){}",
        what.join(", "),
        match duration {
            Some(d) => format!(" for {}", faultline::spec::units::format_duration(d)),
            None => "; Ctrl-C to stop".into(),
        }
    );
    std::io::stdout().flush()?;
    let t = std::time::Instant::now();
    while duration.is_none_or(|d| t.elapsed() < d) && signals.pending().next().is_none() {
        let left = duration.map_or(Duration::from_millis(50), |d| d.saturating_sub(t.elapsed()));
        std::thread::sleep(left.min(Duration::from_millis(50)));
    }
    let mut res = match m {
        Some(m) => m.stop()?,
        None => faultline::monitor::MonitorResults {
            schema: faultline::monitor::model::SCHEMA,
            attach: attach.into(),
            interval_s: interval.as_secs_f64(),
            duration_s: t.elapsed().as_secs_f64(),
            ..Default::default()
        },
    };
    if let Some(s) = sys {
        res.add_syscalls(pids, s.stop()?);
    }
    if let Some(p) = pm {
        res.add_pairs(p.stop()?);
    }
    res.notes.extend(pair_notes);
    print!("{}", res.table());
    for n in &res.notes {
        println!("note: {n}");
    }
    if let Some(dir) = out {
        std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let path = dir.join("monitor.json");
        std::fs::write(&path, serde_json::to_string_pretty(&res)? + "\n").with_context(|| format!("cannot write {}", path.display()))?;
        println!("results: {}", path.display());
    }
    Ok(())
}

fn profile(paths: &[PathBuf], block_size: u64, out: Option<PathBuf>) -> Result<()> {
    let bs = check_block_size(block_size).map_err(anyhow::Error::msg)? as usize;
    if let Some(o) = &out {
        faultline::sys::check_out_file(o, "-o")?;
    }
    let mut m = faultline::content::profile::Measure::new(bs);
    for p in paths {
        m.add_path(p)?;
    }
    // a profile of nothing said `1 blocks, 1 distinct` and was written as if measured
    if m.bytes == 0 {
        bail!(
            "{}: no data to measure ({} files, 0 bytes); give files, directories or block devices that hold data",
            paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(" "),
            m.files
        );
    }
    let prof = m.profile();
    let header = format!(
        "measured by `faultline profile --block-size {}` from: {}\n{} files, {} bytes",
        faultline::spec::units::format_size(bs as u64),
        paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(" "),
        m.files,
        m.bytes
    );
    let text = prof.to_text(&header);
    eprintln!(
        "profile: {} blocks, {} distinct, dedup ratio {:.3}, most copies {}",
        prof.total_blocks(),
        prof.distinct(),
        prof.dedup_ratio(),
        prof.classes.last().map(|c| c.0).unwrap_or(0)
    );
    match out {
        Some(o) => std::fs::write(&o, text).with_context(|| format!("cannot write {}", o.display())),
        None => {
            print!("{text}");
            Ok(())
        }
    }
}

fn find_socket(socket: Option<PathBuf>) -> Result<PathBuf> {
    if let Some(s) = socket {
        return Ok(s);
    }
    let live: Vec<PathBuf> = ledger::live().into_iter().filter_map(|l| l.socket).collect();
    match live.len() {
        1 => Ok(live.into_iter().next().unwrap()),
        0 => bail!("no running `faultline serve` found; start one or pass --socket"),
        _ => bail!(
            "{} faultline serve processes are running; pick one with --socket ({})",
            live.len(),
            live.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
        ),
    }
}

fn fault(socket: Option<PathBuf>, cmd: FaultCmd) -> Result<()> {
    let sock = find_socket(socket)?;
    let req = match &cmd {
        FaultCmd::Add { file } => {
            let text = if file.as_os_str() == "-" {
                std::io::read_to_string(std::io::stdin())?
            } else {
                faultline::spec::read_text(file, "rules file").map_err(anyhow::Error::msg)?
            };
            json!({"cmd": "add", "rules": text})
        }
        FaultCmd::List => json!({"cmd": "list"}),
        FaultCmd::Remove { ids } => json!({"cmd": "remove", "ids": ids}),
        FaultCmd::Clear => json!({"cmd": "clear"}),
        FaultCmd::Pause => json!({"cmd": "pause"}),
        FaultCmd::Resume => json!({"cmd": "resume"}),
        FaultCmd::Log { since, max } => json!({"cmd": "log", "since": since, "max": max}),
        FaultCmd::Stats => json!({"cmd": "stats"}),
    };
    let res = control::call(&sock, &req).map_err(|e| {
        // name the file in rule errors
        match &cmd {
            // the snippet's ` --> rules:L:C` too (it kept the server's name for the text)
            FaultCmd::Add { file } => anyhow::anyhow!(
                "{}",
                e.to_string().replacen("rules:", &format!("{}:", file.display()), 1).replacen(" --> rules:", &format!(" --> {}:", file.display()), 1)
            ),
            _ => e,
        }
    })?;
    match (&cmd, &res) {
        (FaultCmd::Log { .. }, Value::Array(v)) => {
            for e in v {
                println!("{e}");
            }
        }
        // one line however many rules (a 100k-rule file would print 100k lines pretty), the
        // count first for a reader, every id after it for a script
        (FaultCmd::Add { .. }, Value::Object(m)) => {
            let ids = m.get("ids").cloned().unwrap_or_else(|| json!([]));
            let n = ids.as_array().map_or(0, Vec::len);
            println!("{}", json!({"armed": n, "ids": ids}));
        }
        _ => println!("{}", serde_json::to_string_pretty(&res)?),
    }
    Ok(())
}
