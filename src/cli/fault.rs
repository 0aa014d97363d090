//! `faultline fault`: a client of a running `faultline serve`'s control socket
//! (docs/control.md), through the typed `Client`.

use crate::disk::cache::SurvivalModel;
use crate::frontend::control::Client;
use anyhow::Result;
use serde::Serialize;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct FaultArgs {
    /// Control socket (default: the only running faultline serve).
    #[arg(long, global = true)]
    socket: Option<PathBuf>,
    #[command(subcommand)]
    cmd: FaultCmd,
}

#[derive(clap::Subcommand)]
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
    /// Cut the disk's power: the volatile write cache keeps what the survival model says of
    /// the writes since the last flush, and every request fails until `power-on`
    /// (docs/crash.md). Needs `serve --write-cache volatile`.
    PowerCut {
        /// What survives of the unflushed writes.
        #[arg(long, value_enum, default_value_t = SurvivalModel::LoseAll)]
        model: SurvivalModel,
        /// The model's random choices (default: drawn, and printed).
        #[arg(long)]
        seed: Option<u64>,
    },
    /// Power the disk on after a cut: requests are served again.
    PowerOn,
    /// Record every write, discard and flush from now on to a dm-log-writes log FILE
    /// (docs/crash.md); `--stop` ends the recording.
    Record {
        #[arg(required_unless_present = "stop")]
        file: Option<PathBuf>,
        #[arg(long, conflicts_with = "file")]
        stop: bool,
    },
    /// Add a named MARK entry to the recording (replay-log's --end-mark NAME).
    Mark { name: String },
}

pub fn fault(a: FaultArgs) -> Result<()> {
    let c = Client::socket(&super::find_socket(a.socket, |l| l.socket.clone(), "`faultline serve`")?);
    match a.cmd {
        FaultCmd::Add { file } => {
            let text = if file.as_os_str() == "-" {
                std::io::read_to_string(std::io::stdin())?
            } else {
                crate::spec::read_text(&file, "rules file").map_err(anyhow::Error::msg)?
            };
            // the server names the text `rules`: name the file instead, in the snippet's
            // ` --> rules:L:C` too
            let ids = c.add(text).map_err(|e| {
                anyhow::anyhow!(
                    "{}",
                    e.to_string().replacen("rules:", &format!("{}:", file.display()), 1).replacen(" --> rules:", &format!(" --> {}:", file.display()), 1)
                )
            })?;
            // one line however many rules (a 100k-rule file would print 100k lines pretty),
            // the count first for a reader, every id after it for a script
            println!("{}", serde_json::json!({"armed": ids.len(), "ids": ids}));
        }
        FaultCmd::List => pretty(&c.list()?)?,
        FaultCmd::Remove { ids } => pretty(&serde_json::json!({"removed": c.remove(ids)?}))?,
        FaultCmd::Clear => pretty(&serde_json::json!({"removed": c.clear()?}))?,
        FaultCmd::Pause => pretty(&serde_json::json!({"paused": c.pause()?}))?,
        FaultCmd::Resume => pretty(&serde_json::json!({"resumed": c.resume()?}))?,
        FaultCmd::Log { since, max } => {
            for e in c.log(since, max)? {
                println!("{}", serde_json::to_string(&e)?);
            }
        }
        FaultCmd::Stats => pretty(&c.stats()?)?,
        FaultCmd::PowerCut { model, seed } => pretty(&c.power_cut(model, seed)?)?,
        FaultCmd::PowerOn => {
            c.power_on()?;
            pretty(&serde_json::json!({"powered": true}))?
        }
        FaultCmd::Record { file, .. } => {
            // the server writes the file: name it from here, not from the server's directory
            let file = file.map(|f| std::path::absolute(&f)).transpose()?;
            pretty(&c.record(file)?)?
        }
        FaultCmd::Mark { name } => pretty(&serde_json::json!({"entry": c.mark(&name)?}))?,
    }
    Ok(())
}

/// A result as indented JSON.
fn pretty<T: Serialize>(v: &T) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}
