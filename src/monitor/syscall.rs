//! Loader of src/monitor/bpf/syscall.bpf.c: the time the I/O system calls of a set of
//! processes (and of the processes they fork after attach) take from entry to exit, per op,
//! aggregated in the kernel like the block layer. Same thread design as `block`.
//!
//! Attached to the per-syscall tracepoints of the calls timed (`syscalls:sys_enter_pread64`,
//! ...), so nothing of ours runs for the machine's other system calls; where the kernel has
//! no such events (no `CONFIG_FTRACE_SYSCALLS`), or an attach type is forced, to
//! `raw_syscalls` (every system call of every process, the number tested first).

use super::block::{Flavor, flavors, lookup_sum, recursion_misses};
use super::model::LayerOp;
use super::window::Windows;
use anyhow::{Context, Result, anyhow, bail};
use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{Link, MapCore, MapFlags, TracepointCategory, TracepointOpts};
use std::collections::BTreeMap;
use std::mem::MaybeUninit;
use std::sync::{Arc, mpsc};

bpf_skeleton!("syscall.skel.rs");
use skel::{OpenSyscallSkel, SyscallSkel, SyscallSkelBuilder};

/// The syscall layer's ops, in the order of the BPF map (syscall.h NR_SYS_OPS).
pub const SYS_OPS: [&str; super::defines::NR_SYS_OPS] = ["read", "write", "fsync", "open", "fallocate", "io_uring_enter", "close", "unlink", "rename", "stat"];

/// Which per-syscall tracepoints (`syscalls:sys_enter_NAME`, `sys_exit_NAME`) are which op;
/// those the kernel lacks (another architecture's names) are skipped.
const SYSCALL_EVENTS: [(&str, u32); 31] = [
    ("read", 0),
    ("pread64", 0),
    ("readv", 0),
    ("preadv", 0),
    ("preadv2", 0),
    ("write", 1),
    ("pwrite64", 1),
    ("writev", 1),
    ("pwritev", 1),
    ("pwritev2", 1),
    ("fsync", 2),
    ("fdatasync", 2),
    ("sync_file_range", 2),
    ("syncfs", 2),
    ("openat", 3),
    ("openat2", 3),
    ("open", 3),
    ("creat", 3),
    ("fallocate", 4),
    ("io_uring_enter", 5),
    ("close", 6),
    ("close_range", 6),
    ("unlink", 7),
    ("unlinkat", 7),
    ("rename", 8),
    ("renameat", 8),
    ("renameat2", 8),
    ("newstat", 9),
    ("newlstat", 9),
    ("newfstat", 9),
    ("newfstatat", 9),
    // statx; stat, lstat, fstat are the 32-bit architectures' names
];

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
        (libc::SYS_close, 6),
        (libc::SYS_unlinkat, 7),
        (libc::SYS_renameat2, 8),
        (libc::SYS_statx, 9),
    ];
    #[cfg(target_arch = "x86_64")]
    v.extend([
        (libc::SYS_open, 3),
        (libc::SYS_creat, 3),
        (libc::SYS_close_range, 6),
        (libc::SYS_unlink, 7),
        (libc::SYS_rename, 8),
        (libc::SYS_renameat, 8),
        (libc::SYS_stat, 9),
        (libc::SYS_lstat, 9),
        (libc::SYS_fstat, 9),
        (libc::SYS_newfstatat, 9),
    ]);
    v
}

/// The per-syscall tracepoints of `SYSCALL_EVENTS` and `statx` this kernel has.
fn syscall_events() -> Result<Vec<(&'static str, u32)>> {
    let dir = super::pairs::tracefs()?.join("events/syscalls");
    let have: Vec<_> = SYSCALL_EVENTS
        .iter()
        .copied()
        .chain([("statx", 9), ("stat", 9), ("lstat", 9), ("fstat", 9)])
        .filter(|(n, _)| dir.join(format!("sys_enter_{n}")).is_dir() && dir.join(format!("sys_exit_{n}")).is_dir())
        .collect();
    if !have.iter().any(|(n, _)| *n == "read") {
        bail!("no per-syscall tracepoints in {} (a kernel without CONFIG_FTRACE_SYSCALLS)", dir.display());
    }
    Ok(have)
}

/// The syscall layer's figures.
#[derive(Clone, Debug, Default)]
pub struct SyscallResults {
    /// `syscalls` (per-syscall tracepoints), or raw_syscalls as `tp_btf`, `raw_tp` or `tracepoint`.
    pub attach: &'static str,
    pub layers: Vec<LayerOp>,
    /// op -> calls that returned an error
    pub errors: BTreeMap<String, u64>,
    /// Events the kernel skipped (see `MonitorResults::missed_events`).
    pub missed_events: u64,
    /// Why the layer fell back to raw_syscalls, if it did.
    pub notes: Vec<String>,
    /// `baseline: windows`: (window, its rows).
    pub windows: Vec<(u32, Vec<LayerOp>)>,
}

/// A running syscall monitor.
pub type SyscallMonitor = super::Running<SyscallResults>;

impl SyscallMonitor {
    /// Watch processes `pids` (thread-group ids) and what they fork from now on.
    /// With `windows`, per window too (`SyscallResults::windows`).
    pub fn start(pids: &[u32], windows: Option<Arc<Windows>>) -> Result<SyscallMonitor> {
        if pids.is_empty() {
            bail!("the syscall monitor needs at least one process");
        }
        for p in pids {
            if !std::path::Path::new(&format!("/proc/{p}")).exists() {
                bail!("no process {p}");
            }
        }
        let pids = pids.to_vec();
        SyscallMonitor::spawn("monitor-syscall", Box::new(move |ready, stop| run(&pids, windows.as_deref(), ready, stop)))
    }
}

/// Open the object, sized and set for `windows` where given.
fn open_object<'o>(storage: &'o mut MaybeUninit<libbpf_rs::OpenObject>, windows: Option<&Windows>) -> Result<OpenSyscallSkel<'o>> {
    let mut open = SyscallSkelBuilder::default().open(storage).context("cannot open the syscall BPF object")?;
    if let Some(w) = windows {
        let rodata = open.maps.rodata_data.as_deref_mut().context("no rodata in the syscall BPF object")?;
        (rodata.win_n, rodata.win_len_ns, rodata.win_settle_ns) = w.rodata();
        w.size_map(&mut open.maps.whists, SYS_OPS.len() as u32)?;
    }
    Ok(open)
}

fn open_flavor<'o>(storage: &'o mut MaybeUninit<libbpf_rs::OpenObject>, flavor: Flavor, windows: Option<&Windows>) -> Result<OpenSyscallSkel<'o>> {
    let mut open = open_object(storage, windows)?;
    let p = &mut open.progs;
    p.sc_enter.set_autoload(false);
    p.sc_exit.set_autoload(false);
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

/// The per-syscall tracepoints: enter and exit programs attached to each event of `events`
/// with its op as the cookie; forks followed by the classic `sched_process_fork` tracepoint.
fn load_events<'o>(
    storage: &'o mut MaybeUninit<libbpf_rs::OpenObject>,
    events: &[(&str, u32)],
    pids: &[u32],
    windows: Option<&Windows>,
) -> Result<(SyscallSkel<'o>, Vec<Link>)> {
    let mut open = open_object(storage, windows)?;
    let p = &mut open.progs;
    for prog in [
        &mut p.btf_sys_enter,
        &mut p.btf_sys_exit,
        &mut p.btf_fork,
        &mut p.raw_sys_enter,
        &mut p.raw_sys_exit,
        &mut p.raw_fork,
        &mut p.tp_sys_enter,
        &mut p.tp_sys_exit,
    ] {
        prog.set_autoload(false);
    }
    let skel = open.load().context("cannot load the syscall BPF programs")?;
    for p in pids {
        skel.maps.tgids.update(&p.to_ne_bytes(), &[1u8], MapFlags::ANY).context("cannot set the watched processes")?;
    }
    let mut links = vec![skel.progs.tp_fork.attach().context("cannot attach tp_fork")?];
    for (name, op) in events {
        for (prog, ev) in [(&skel.progs.sc_enter, format!("sys_enter_{name}")), (&skel.progs.sc_exit, format!("sys_exit_{name}"))] {
            let opts = TracepointOpts { cookie: *op as u64, ..Default::default() };
            links.push(
                prog.attach_tracepoint_with_opts(TracepointCategory::Custom("syscalls".into()), &ev, opts)
                    .with_context(|| format!("cannot attach to syscalls:{ev}"))?,
            );
        }
    }
    Ok((skel, links))
}

fn run(pids: &[u32], windows: Option<&Windows>, ready: mpsc::Sender<Result<&'static str>>, stop: mpsc::Receiver<()>) -> Result<SyscallResults> {
    // the per-syscall tracepoints unless an attach type is forced (FAULTLINE_MONITOR_ATTACH)
    let forced = std::env::var("FAULTLINE_MONITOR_ATTACH").is_ok_and(|v| !v.is_empty());
    let mut fallback_why = None;
    if !forced {
        let mut store = MaybeUninit::uninit();
        match syscall_events().and_then(|ev| load_events(&mut store, &ev, pids, windows)) {
            Ok((skel, links)) => {
                if let Some(w) = windows
                    && let Err(e) = w.register(&skel.maps.win_t0)
                {
                    let _ = ready.send(Err(anyhow!("{e:#}")));
                    return Err(e);
                }
                let _ = ready.send(Ok("syscalls"));
                let _ = stop.recv();
                drop(links);
                let progs = [&skel.progs.tp_fork, &skel.progs.sc_enter, &skel.progs.sc_exit];
                return results(&skel, "syscalls", progs.iter().map(|p| recursion_misses(*p)).sum(), None, windows.is_some());
            }
            Err(e) => fallback_why = Some(format!("{e:#}{}", super::block::libbpf_log_tail())),
        }
    }
    let flavors = match flavors(true) {
        Ok(f) => f,
        Err(e) => {
            let _ = ready.send(Err(anyhow!("{e:#}")));
            return Err(e);
        }
    };
    let mut storage: Vec<MaybeUninit<libbpf_rs::OpenObject>> = (0..flavors.len()).map(|_| MaybeUninit::uninit()).collect();
    let ((skel, links), flavor, _) = super::load_first("syscall", &mut storage, &flavors, &ready, |store, flavor| {
        open_flavor(store, flavor, windows).and_then(|o| load_attach(o, flavor, pids))
    })?;
    if let Some(w) = windows
        && let Err(e) = w.register(&skel.maps.win_t0)
    {
        let _ = ready.send(Err(anyhow!("{e:#}")));
        return Err(e);
    }
    let attach = flavor.name();
    let _ = ready.send(Ok(attach));
    let _ = stop.recv();
    drop(links);
    let why = fallback_why
        .map(|w| format!("syscall layer on raw_syscalls ({attach}: every system call of the machine runs its programs): {}", w.lines().next().unwrap_or("")));
    results(&skel, attach, progs(&skel, flavor).iter().map(|p| recursion_misses(*p)).sum(), why, windows.is_some())
}

fn results(skel: &SyscallSkel<'_>, attach: &'static str, missed_events: u64, note: Option<String>, windows: bool) -> Result<SyscallResults> {
    let mut out = SyscallResults { attach, missed_events, notes: note.into_iter().collect(), ..Default::default() };
    for (op, name) in SYS_OPS.iter().enumerate() {
        let v = lookup_sum(&skel.maps.sys_hists, op as u32)?;
        let errors = lookup_sum(&skel.maps.sys_stats, op as u32)?[0];
        if errors > 0 {
            out.errors.insert(name.to_string(), errors);
        }
        out.layers.extend(super::block::layer_row("syscall", name.to_string(), &v, true));
    }
    if windows {
        out.notes.extend(super::window::lost_note(&skel.maps.win_lost, "syscall"));
        for (k, op, v) in super::window::read(&skel.maps.whists)? {
            let Some(name) = SYS_OPS.get(op as usize) else { continue };
            let Some(r) = super::window::row("syscall", name.to_string(), &v, true) else { continue };
            match out.windows.last_mut() {
                Some((last, rows)) if *last == k => rows.push(r),
                _ => out.windows.push((k, vec![r])),
            }
        }
    }
    Ok(out)
}
