//! `faultline crash`: explore the crash states of a workload's write log, replay one
//! (docs/crash.md, "Exploring crash states").

use crate::crash::explore::{self, Meta, Options};
use crate::crash::serve::{self, Source};
use crate::crash::states::{self, StateId, Variant};
use crate::disk::logwrites::Log;
use crate::spec::disk::RingMode;
use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use std::path::PathBuf;

#[derive(Args)]
pub struct CrashArgs {
    #[command(subcommand)]
    cmd: CrashCmd,
}

#[derive(Subcommand)]
enum CrashCmd {
    /// Run the experiment's first setup once recording every write, then check its crash
    /// states: every flush boundary after the workload started, plus random subsets and torn
    /// variants of each epoch's writes; each is mounted (the journal replays), checked by the
    /// oracle and by the file system's own check. With --log, explore a dm-log-writes log
    /// recorded elsewhere instead.
    Explore {
        /// The experiment (YAML); its first setup's disk, stack (raw or one file system) and
        /// workload are used.
        #[arg(required_unless_present = "log", conflicts_with = "log")]
        experiment: Option<PathBuf>,
        /// A dm-log-writes log recorded elsewhere (dm-log-writes, `faultline fault record`).
        #[arg(long, requires = "stack")]
        log: Option<PathBuf>,
        /// With --log: what the log holds: ext4, xfs, btrfs or raw (no mount, no check).
        #[arg(long)]
        stack: Option<String>,
        /// With --log: the device size (default: the end of the log's furthest write, rounded up to 1 MiB).
        #[arg(long, value_parser = super::size_arg)]
        size: Option<u64>,
        /// With --log: the served device's logical block size.
        #[arg(long, default_value_t = 4096)]
        block_size: u32,
        /// With --log: mount options for the states (comma separated).
        #[arg(long, default_value = "")]
        mount: String,
        /// With --log: the served states' FUSE transport (an experiment's is its disk's `ring`).
        #[arg(long, value_enum, requires = "log", default_value = "auto")]
        ring: RingMode,
        /// With --log: explore from the epoch holding this mark on (default: every epoch).
        #[arg(long)]
        start_mark: Option<String>,
        /// Random subsets and torn variants checked per epoch (each).
        #[arg(long, default_value_t = 2)]
        per_epoch: u32,
        /// Seed of the subsets and torn variants (default: drawn; it is in explore.json).
        #[arg(long)]
        seed: Option<u64>,
        /// Results directory (default results/crash-<name>-<unix time>); new or empty.
        #[arg(long, short)]
        out: Option<PathBuf>,
        /// Check at most this many states.
        #[arg(long)]
        max_states: Option<usize>,
        /// No progress lines.
        #[arg(long, short)]
        quiet: bool,
    },
    /// Put one explored state on a loop device (and a control socket) until Ctrl-C.
    Replay {
        /// The results directory of `crash explore`.
        results: PathBuf,
        /// The state's id (e12, e12-s3, e12-t0; states.jsonl and failing.txt list them).
        state: String,
    },
    /// (internal) The explorer's state server.
    #[command(hide = true)]
    ServeStates {
        #[arg(long)]
        log: PathBuf,
        #[arg(long)]
        size: u64,
        #[arg(long)]
        block_size: u32,
        #[arg(long)]
        seed: u64,
        #[arg(long, value_enum)]
        ring: RingMode,
        #[arg(long)]
        owned_by: u32,
    },
}

pub fn crash(a: CrashArgs) -> Result<()> {
    match a.cmd {
        CrashCmd::Explore { experiment, log, stack, size, block_size, mount, ring, start_mark, per_epoch, seed, out, max_states, quiet } => {
            let seed = seed.unwrap_or_else(rand::random);
            let name = match (&experiment, &log) {
                (Some(e), _) | (None, Some(e)) => e.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "log".into()),
                (None, None) => unreachable!("clap requires one"),
            };
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs();
            let out = out.unwrap_or_else(|| PathBuf::from(format!("results/crash-{name}-{now}")));
            let opts = Options { per_epoch, seed, out: out.clone(), quiet, max_states };
            if let Some(e) = &experiment {
                // the file is read (and its errors said) before anything is created
                crate::spec::experiment::parse_experiment_file(e).map_err(anyhow::Error::msg)?;
            }
            let meta = match (experiment, log) {
                (Some(e), _) => {
                    explore::prepare_out(&out)?;
                    explore::record(&e, &opts)?
                }
                (None, Some(l)) => {
                    let stack = stack.expect("clap requires --stack with --log");
                    if !["ext4", "xfs", "btrfs", "raw"].contains(&stack.as_str()) {
                        bail!("--stack {stack}: expected ext4, xfs, btrfs or raw");
                    }
                    let lg = Log::open(&l)?;
                    let size = size.unwrap_or_else(|| lg.extent().div_ceil(1 << 20).max(1) << 20);
                    if size < lg.extent() {
                        bail!("--size {size}: the log writes up to byte {}", lg.extent());
                    }
                    let first_epoch = match &start_mark {
                        None => 0,
                        Some(m) => {
                            let at = lg.find_mark(m).with_context(|| format!("{}: no mark named {m:?}", l.display()))?;
                            states::epochs(&lg).iter().position(|e| e.end > at).unwrap_or(0)
                        }
                    };
                    explore::prepare_out(&out)?;
                    Meta {
                        log: std::path::absolute(&l)?,
                        size,
                        block_size,
                        seed,
                        per_epoch,
                        fs: stack,
                        mount: mount.split(',').filter(|s| !s.is_empty()).map(String::from).collect(),
                        first_epoch,
                        synced_entry: None,
                        source: l.display().to_string(),
                        ring,
                    }
                }
                (None, None) => unreachable!("clap requires one"),
            };
            let s = explore::explore(&meta, &opts)?;
            println!(
                "{} states of {} epochs checked in {:.1} s ({:.1}/s): {} failing{}; results in {}",
                s.states,
                s.epochs - s.first_epoch,
                s.seconds,
                s.states_per_s,
                s.failing,
                if s.not_checked > 0 { format!(", {} not checked (--max-states)", s.not_checked) } else { String::new() },
                out.display()
            );
            println!("report: {}", crate::crash::report::write(&out, None)?.display());
            if s.failing > 0 {
                println!("failing states (replay commands in {}/failing.txt):", out.display());
                for l in std::fs::read_to_string(out.join("failing.txt"))?.lines().take(20) {
                    println!("  {l}");
                }
            }
            Ok(())
        }
        CrashCmd::Replay { results, state } => {
            let meta = Meta::load(&results)?;
            let id: StateId = state.parse()?;
            let log_path = meta.log_path(&results);
            let lg = Log::open(&log_path)?;
            let eps = states::epochs(&lg);
            let Some(ep) = eps.get(id.epoch) else {
                bail!("state {id} does not exist: {} has epochs e0 to e{}", results.display(), eps.len().saturating_sub(1));
            };
            match id.variant {
                Variant::Boundary => {}
                Variant::Subset(k) | Variant::Torn(k) if k >= meta.per_epoch => {
                    bail!(
                        "state {id} does not exist: this exploration made {} subsets and torn variants per epoch (numbered 0 to {})",
                        meta.per_epoch,
                        meta.per_epoch.saturating_sub(1)
                    )
                }
                Variant::Subset(_) if ep.writes < 2 => bail!("state {id} does not exist: epoch {} has {} write(s), no subsets", id.epoch, ep.writes),
                Variant::Torn(_) if ep.writes < 1 => bail!("state {id} does not exist: epoch {} has no writes", id.epoch),
                _ => {}
            }
            drop(lg);
            let src = Source { log: &log_path, size: meta.size, block_size: meta.block_size, seed: meta.seed, ring: meta.ring };
            serve::replay(&src, id, |dev| {
                eprintln!(
                    "faultline: state {id} of {} on {}{}; Ctrl-C to stop",
                    results.display(),
                    dev.display(),
                    match meta.fs_kind() {
                        Some(k) => format!(" ({}: mount -t {} {} /mnt)", k.name(), k.name(), dev.display()),
                        None => String::new(),
                    }
                )
            })
        }
        CrashCmd::ServeStates { log, size, block_size, seed, ring, owned_by } => {
            serve::serve_states(&Source { log: &log, size, block_size, seed, ring }, owned_by)
        }
    }
}
