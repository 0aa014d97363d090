//! Loader of src/monitor/bpf/syscall.bpf.c: the time the I/O system calls of a set of
//! processes (and of the processes they fork after attach) take from entry to exit, per op,
//! aggregated in the kernel like the block layer. Same thread design as `block`.

use super::block::{Flavor, flavors, lookup_sum, recursion_misses};
use super::model::LayerOp;
use anyhow::{Context, Result, anyhow, bail};
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{Link, MapCore, MapFlags};
use std::collections::BTreeMap;
use std::mem::MaybeUninit;
use std::sync::mpsc;

bpf_skeleton!("syscall.skel.rs");
use skel::{OpenSyscallSkel, SyscallSkel, SyscallSkelBuilder};

/// The syscall layer's ops, in the order of the BPF map (syscall.h NR_SYS_OPS).
pub const SYS_OPS: [&str; 6] = ["read", "write", "fsync", "open", "fallocate", "io_uring_enter"];

/// Which syscalls are which op, by this architecture's numbers.
fn syscall_ops() -> Vec<(libc::c_long, u32)> {
    let mut v = vec![
        (libc::SYS_read, 0),
        (libc::SYS_pread64, 0),
        (libc::SYS_readv, 0),
        (libc::SYS_preadv, 0),
        (libc::SYS_preadv2, 0),
        (libc::SYS_write, 1),
        (libc::SYS_pwrite64, 1),
        (libc::SYS_writev, 1),
        (libc::SYS_pwritev, 1),
        (libc::SYS_pwritev2, 1),
        (libc::SYS_fsync, 2),
        (libc::SYS_fdatasync, 2),
        (libc::SYS_sync_file_range, 2),
        (libc::SYS_syncfs, 2),
        (libc::SYS_openat, 3),
        (libc::SYS_openat2, 3),
        (libc::SYS_fallocate, 4),
        (libc::SYS_io_uring_enter, 5),
    ];
    #[cfg(target_arch = "x86_64")]
    v.extend([(libc::SYS_open, 3), (libc::SYS_creat, 3)]);
    v
}

/// The syscall layer's figures.
#[derive(Clone, Debug, Default)]
pub struct SyscallResults {
    pub attach: &'static str,
    pub layers: Vec<LayerOp>,
    /// op -> calls that returned an error
    pub errors: BTreeMap<String, u64>,
    /// Events the kernel skipped (see `MonitorResults::missed_events`).
    pub missed_events: u64,
}

/// A running syscall monitor.
pub type SyscallMonitor = super::Running<SyscallResults>;

impl SyscallMonitor {
    /// Watch processes `pids` (thread-group ids) and what they fork from now on.
    pub fn start(pids: &[u32]) -> Result<SyscallMonitor> {
        if pids.is_empty() {
            bail!("the syscall monitor needs at least one process");
        }
        for p in pids {
            if !std::path::Path::new(&format!("/proc/{p}")).exists() {
                bail!("no process {p}");
            }
        }
        let pids = pids.to_vec();
        SyscallMonitor::spawn("monitor-syscall", Box::new(move |ready, stop| run(&pids, ready, stop)))
    }
}

fn open_flavor(storage: &mut MaybeUninit<libbpf_rs::OpenObject>, flavor: Flavor) -> Result<OpenSyscallSkel<'_>> {
    let mut open = SyscallSkelBuilder::default().open(storage).context("cannot open the syscall BPF object")?;
    let p = &mut open.progs;
    for (prog, f) in [
        (&mut p.btf_sys_enter, Flavor::TpBtf),
        (&mut p.btf_sys_exit, Flavor::TpBtf),
        (&mut p.btf_fork, Flavor::TpBtf),
        (&mut p.raw_sys_enter, Flavor::RawTp),
        (&mut p.raw_sys_exit, Flavor::RawTp),
        (&mut p.raw_fork, Flavor::RawTp),
        (&mut p.tp_sys_enter, Flavor::Tracepoint),
        (&mut p.tp_sys_exit, Flavor::Tracepoint),
        (&mut p.tp_fork, Flavor::Tracepoint),
    ] {
        prog.set_autoload(f == flavor);
    }
    Ok(open)
}

/// The flavour's programs: fork hook, enter, exit.
fn progs<'a>(skel: &'a SyscallSkel<'_>, flavor: Flavor) -> [&'a libbpf_rs::ProgramMut<'a>; 3] {
    let p = &skel.progs;
    match flavor {
        Flavor::TpBtf => [&p.btf_fork, &p.btf_sys_enter, &p.btf_sys_exit],
        Flavor::RawTp => [&p.raw_fork, &p.raw_sys_enter, &p.raw_sys_exit],
        Flavor::Tracepoint => [&p.tp_fork, &p.tp_sys_enter, &p.tp_sys_exit],
    }
}

fn load_attach<'o>(open: OpenSyscallSkel<'o>, flavor: Flavor, pids: &[u32]) -> Result<(SyscallSkel<'o>, Vec<Link>)> {
    let skel = open.load().context("cannot load the syscall BPF programs")?;
    for (nr, op) in syscall_ops() {
        skel.maps.sysops.update(&(nr as u32).to_ne_bytes(), &(op + 1u32).to_ne_bytes(), MapFlags::ANY).context("cannot set the syscall table")?;
    }
    for p in pids {
        skel.maps.tgids.update(&p.to_ne_bytes(), &[1u8], MapFlags::ANY).context("cannot set the watched processes")?;
    }
    // the fork hook first, so no child forked while attaching is missed
    let links =
        progs(&skel, flavor).iter().map(|p| p.attach().with_context(|| format!("cannot attach {}", p.name().to_string_lossy()))).collect::<Result<Vec<_>>>()?;
    Ok((skel, links))
}

fn run(pids: &[u32], ready: mpsc::Sender<Result<&'static str>>, stop: mpsc::Receiver<()>) -> Result<SyscallResults> {
    let flavors = match flavors(true) {
        Ok(f) => f,
        Err(e) => {
            let _ = ready.send(Err(anyhow!("{e:#}")));
            return Err(e);
        }
    };
    let mut storage: Vec<MaybeUninit<libbpf_rs::OpenObject>> = (0..flavors.len()).map(|_| MaybeUninit::uninit()).collect();
    let ((skel, links), flavor, _) =
        super::load_first("syscall", &mut storage, &flavors, &ready, |store, flavor| open_flavor(store, flavor).and_then(|o| load_attach(o, flavor, pids)))?;
    let attach = flavor.name();
    let _ = ready.send(Ok(attach));
    let _ = stop.recv();
    drop(links);
    let mut out = SyscallResults { attach, missed_events: progs(&skel, flavor).iter().map(|p| recursion_misses(*p)).sum(), ..Default::default() };
    for (op, name) in SYS_OPS.iter().enumerate() {
        let v = lookup_sum(&skel.maps.sys_hists, op as u32)?;
        let errors = lookup_sum(&skel.maps.sys_stats, op as u32)?[0];
        if errors > 0 {
            out.errors.insert(name.to_string(), errors);
        }
        out.layers.extend(super::block::layer_row("syscall", name.to_string(), &v, true));
    }
    Ok(out)
}
