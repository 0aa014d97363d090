//! `faultline stack-hold` (hidden, for tests and manual checks): serve RAM disks in this
//! process, build a stack on them, optionally start a command that keeps the file system busy,
//! print what was built and hold it until SIGINT/SIGTERM. The busy command's `sleep` is a
//! second process of its group, so it outlives a kill -9 (only the group's main process gets
//! PDEATHSIG), like a database's helper would. Killing it with -9 leaves exactly the
//! state `faultline cleanup` must undo.

use crate::disk::{DiskConfig, StoreSpec};
use crate::stack::command::{Cmdline, CommandSpec};
use crate::stack::fs::{BuiltStack, FsKind, StackSpec};
use crate::stack::served::ServedDisk;
use anyhow::{Result, bail};
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

pub fn run(size: u64, stack: &str, busy: bool) -> Result<()> {
    let spec = match stack {
        "raw" => StackSpec::Raw,
        "ext4" => StackSpec::Fs { kind: FsKind::Ext4, mkfs: vec![], mount: vec![] },
        "xfs" => StackSpec::Fs { kind: FsKind::Xfs, mkfs: vec![], mount: vec![] },
        "btrfs" => StackSpec::Fs { kind: FsKind::Btrfs, mkfs: vec![], mount: vec![] },
        "btrfs-raid1" => StackSpec::BtrfsRaid1 { mkfs: vec![], mount: vec![] },
        s => bail!("--stack `{s}`: allowed: raw, ext4, xfs, btrfs, btrfs-raid1"),
    };
    let stop = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGINT, stop.clone())?;
    signal_hook::flag::register(signal_hook::consts::SIGTERM, stop.clone())?;
    let cfg = DiskConfig {
        size: Some(size),
        block_size: 4096,
        store: StoreSpec::Ram,
        destructive: false,
        force: false,
        latency: None,
        populate: None,
        ..Default::default()
    };
    // declared before the stack so they drop after it
    let mut disks = Vec::new();
    for _ in 0..spec.devices_needed() {
        disks.push(ServedDisk::start(&cfg, &Default::default(), |_| Ok(vec![]), None)?);
    }
    let devices: Vec<_> = disks.iter().map(|d| d.device().to_owned()).collect();
    let built = BuiltStack::build(&spec, &devices)?;
    let mut out = std::io::stdout().lock();
    for d in &devices {
        writeln!(out, "device {}", d.display())?;
    }
    if let Some(m) = &built.mountpoint {
        writeln!(out, "mount {}", m.display())?;
    }
    std::thread::scope(|s| -> Result<()> {
        if busy {
            let cmd =
                CommandSpec { command: Cmdline::Shell("sleep 100000 & echo $! > busy.pid; wait".into()), timeout: None, cwd: None, acks: false, check: None };
            let (b, st) = (&built, &stop);
            s.spawn(move || b.run_command(Some(&cmd), Some(st)));
            let pidfile = built.mountpoint.as_ref().map(|m| m.join("busy.pid"));
            while pidfile.as_ref().is_some_and(|p| std::fs::read_to_string(p).map(|s| s.trim().is_empty()).unwrap_or(true)) {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
        writeln!(out, "ready")?;
        out.flush()?;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        Ok(())
    })?;
    for n in built.teardown()? {
        eprintln!("faultline: {n}");
    }
    for d in disks {
        d.teardown()?;
    }
    Ok(())
}
