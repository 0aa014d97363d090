//! `faultline profile`: measure a duplicate-content profile from real data (files,
//! directories, devices) for workloads to reproduce (docs/workload.md).

use super::size_arg;
use crate::spec::disk::check_block_size;
use anyhow::{Context, Result, bail};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct ProfileArgs {
    /// Files, directories (walked, symlinks not followed) or block devices.
    #[arg(required = true)]
    paths: Vec<PathBuf>,
    #[arg(long, default_value = "4KiB", value_parser = size_arg)]
    block_size: u64,
    /// Where to write the profile (default: stdout).
    #[arg(long, short)]
    out: Option<PathBuf>,
}

pub fn profile(a: ProfileArgs) -> Result<()> {
    measure(&a.paths, a.block_size, a.out)
}

fn measure(paths: &[PathBuf], block_size: u64, out: Option<PathBuf>) -> Result<()> {
    let bs = check_block_size(block_size).map_err(anyhow::Error::msg)? as usize;
    if let Some(o) = &out {
        crate::sys::check_out_file(o, "-o")?;
    }
    let mut m = crate::content::profile::Measure::new(bs);
    for p in paths {
        m.add_path(p)?;
    }
    // a profile must be measured from data: an empty input is an error, not a profile
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
        crate::spec::units::format_size(bs as u64),
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
