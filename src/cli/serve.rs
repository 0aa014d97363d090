//! `faultline serve`: one faulty disk, served as /dev/loopN (and/or over NBD) until
//! SIGINT/SIGTERM or until the run that owns it is gone, with its control socket
//! (docs/control.md).

use super::size_arg;
use crate::spec::disk::{CpuLatency, DiskConfig, DiskSpec, FrontendOptions, RingMode, RqAffinity, StoreSpec, check_block_size};
use crate::spec::units::parse_busy_poll;
use crate::stack::served::{Exposure, ServedDisk};
use crate::sys::ledger;
use anyhow::{Context, Result};
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Args)]
pub struct ServeArgs {
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
    /// Make every page of a RAM store resident before the device appears, so the disk does
    /// not change speed as it fills (default: true with --latency, else false).
    #[arg(long, value_name = "BOOL", num_args = 0..=1, default_missing_value = "true")]
    populate: Option<bool>,
    /// A volatile write cache (docs/crash.md): `volatile` = writes are durable once a flush
    /// (or FUA) after them completes, and `faultline fault power-cut` loses what its survival
    /// model says; `none` = every acknowledged write is durable.
    #[arg(long, value_enum, default_value_t = DiskConfig::default().write_cache)]
    write_cache: crate::disk::cache::CacheMode,
    /// The most unflushed bytes the volatile cache holds; at the bound it writes everything
    /// back, as a flush would (docs/crash.md).
    #[arg(long, default_value = "256MiB", value_parser = size_arg)]
    write_cache_size: u64,
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
    nbd: Option<crate::frontend::nbd::NbdAddr>,
    /// Serve over NBD only: no FUSE mount, no loop device (needs --nbd).
    #[arg(long, requires = "nbd")]
    no_loop: bool,
    /// (internal) The whole disk as one JSON document (`spec::disk::DiskSpec`): how
    /// `faultline run` hands each disk server its disk, in place of the disk's flags.
    #[arg(long, hide = true, value_name = "JSON", conflicts_with_all = SPEC_FLAGS)]
    spec_json: Option<String>,
    /// (internal) Serve for this process (`faultline run`): when it dies, release what it
    /// built on the disk and tear down.
    #[arg(long, hide = true)]
    owned_by: Option<u32>,
}

/// The flags `--spec-json` stands for.
const SPEC_FLAGS: [&str; 14] = [
    "size",
    "block_size",
    "store",
    "destructive",
    "force",
    "latency",
    "populate",
    "write_cache",
    "write_cache_size",
    "busy_poll",
    "ring",
    "rq_affinity",
    "cpu_latency",
    "ring_threads",
];

pub fn serve(a: ServeArgs) -> Result<()> {
    let spec = match &a.spec_json {
        Some(json) => {
            let d: DiskSpec = serde_json::from_str(json).context("--spec-json: not a disk spec")?;
            check_block_size(d.disk.block_size as u64).map_err(|e| anyhow::anyhow!("--spec-json: {e}"))?;
            d
        }
        None => DiskSpec {
            disk: DiskConfig {
                size: a.size,
                block_size: check_block_size(a.block_size).map_err(anyhow::Error::msg)?,
                store: a.store,
                destructive: a.destructive,
                force: a.force,
                latency: a.latency.map(|p| crate::spec::latency::parse_latency_file(&p)).transpose().map_err(anyhow::Error::msg)?,
                populate: a.populate,
                write_cache: a.write_cache,
                write_cache_size: a.write_cache_size,
            },
            front: FrontendOptions {
                busy_poll: a.busy_poll,
                ring: a.ring,
                rq_affinity: a.rq_affinity,
                cpu_latency: a.cpu_latency,
                ring_threads: a.ring_threads,
            },
        },
    };
    run(spec.disk, &spec.front, &Exposure { loop_device: !a.no_loop, nbd: a.nbd }, a.rules, a.socket, a.owned_by)
}

fn run(cfg: DiskConfig, front: &FrontendOptions, how: &Exposure, rules: Option<PathBuf>, socket: Option<PathBuf>, owned_by: Option<u32>) -> Result<()> {
    let owner = owned_by.map(ledger::set_owner).transpose()?;
    // catch signals from the start so a Ctrl-C during set-up still tears down
    let mut signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM])?;
    let socket = socket.unwrap_or_else(|| ledger::run_dir().join(format!("{}.sock", std::process::id())));
    let served = ServedDisk::start_as(
        &cfg,
        front,
        how,
        |d| match &rules {
            Some(p) => crate::spec::rule::yaml::parse_rules_file(p, d.geometry()).map_err(anyhow::Error::msg),
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
            crate::spec::units::format_size(served.disk.size()),
            served.disk.describe_store(),
            match served.disk.latency().map(|l| l.model()) {
                Some(m) => format!(
                    ", latency model for {}{}",
                    crate::spec::rule::Op::ALL.iter().filter(|o| m.op(**o).is_some()).map(|o| o.name()).collect::<Vec<_>>().join("/"),
                    m.channels.map(|c| format!(", {c} channel(s)")).unwrap_or_default() + &m.depth.map(|d| format!(" of depth {d}")).unwrap_or_default()
                ),
                None => String::new(),
            },
            served.disk.block_size(),
            served.disk.engine().list().len(),
            if front.busy_poll.is_zero() { "off".into() } else { crate::spec::units::format_duration(front.busy_poll) },
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
    let owner_running = || owner.is_none_or(|(p, t)| crate::sys::process::is_running(p, t));
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
        let gone = || crate::sys::process::is_gone(pid, start);
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
