//! Per-layer timing of the storage stack with BPF (docs/monitor.md): where a request's time
//! goes, aggregated in the kernel. A layer of its own: uses `sys` and `spec` only.
//!
//! `block`: the block layer (queue and service time per device and op); `syscall`: the I/O
//! system calls of a set of processes; `pairs`: generic tracepoint pairs (file-system,
//! journal and driver layers, the user's own pairs); `model`: the results
//! (monitor.json, embeddable in an experiment's results); `hist`: the in-kernel histogram's
//! buckets and quantiles; `window`: the figures of each window of a `baseline: windows` run.

/// `mod skel` of a libbpf-cargo skeleton that build.rs generated (generated code: our lints
/// do not apply to it).
macro_rules! bpf_skeleton {
    ($file:literal) => {
        #[allow(
            clippy::all,
            clippy::pedantic,
            clippy::undocumented_unsafe_blocks,
            dead_code,
            unused_imports,
            unsafe_op_in_unsafe_fn,
            non_camel_case_types,
            non_snake_case,
            non_upper_case_globals
        )]
        mod skel {
            include!(concat!(env!("OUT_DIR"), "/", $file));
        }
    };
}

pub mod block;
/// The numeric `#define`s of the BPF headers (src/monitor/bpf/{block,pairs,syscall}.h), as
/// build.rs reads them: the sizes and counts the programs and these loaders share.
pub mod defines {
    include!(concat!(env!("OUT_DIR"), "/bpf_defines.rs"));
}
pub mod hist;
pub mod model;
pub mod pairs;
pub mod syscall;
pub mod window;

pub use block::BlockMonitor;
pub use model::MonitorResults;
pub use pairs::PairMonitor;
pub use syscall::SyscallMonitor;
pub use window::Windows;

pub use crate::spec::experiment::{DEFAULT_MONITOR_LAYERS, MONITOR_LAYERS};

/// A layer's name as `--layers` takes it.
pub fn parse_layer(s: &str) -> Result<String, String> {
    if MONITOR_LAYERS.contains(&s) { Ok(s.to_string()) } else { Err(format!("unknown layer `{s}`; allowed: {}", MONITOR_LAYERS.join(", "))) }
}

/// Start the tracepoint pairs for a monitor of `devices` (and processes `pids`): the built-in
/// file-system, journal and driver pairs of the `layers` asked for (`fs`, `journal`, `driver`)
/// for what is mounted on and behind the devices, and the user's `extra` pairs. Returns the running monitor (None when there is nothing to time) and
/// notes. An error only when user pairs were given and cannot be attached; the built-in ones
/// are left out with a note then.
pub fn start_pairs(
    devices: &[std::path::PathBuf],
    pids: &[u32],
    mut extra: Vec<pairs::Pair>,
    layers: &[String],
    windows: Option<std::sync::Arc<Windows>>,
) -> anyhow::Result<(Option<PairMonitor>, Vec<String>)> {
    let watched = devices.iter().map(|d| block::Watched::new(d)).collect::<anyhow::Result<Vec<_>>>()?;
    let mm: Vec<(u32, u32)> = watched.iter().map(|w| (w.major, w.minor)).collect();
    let (mut builtin, mut sums, conns, mut notes) = pairs::stack_pairs(&mm, devices);
    let asked = |l: &str| layers.iter().any(|x| x == l);
    builtin.retain(|p| asked(&p.layer));
    sums.retain(|s| asked(&s.layer));
    if !asked("fs") {
        notes.retain(|n| !n.starts_with("btrfs"));
    }
    // the FUSE connections filter the driver pairs only
    let conns = if asked("driver") { conns } else { Vec::new() };
    let mut devs: Vec<u32> = watched.iter().map(|w| (w.major << 20) | w.minor).collect();
    devs.extend(conns);
    for p in &mut extra {
        p.processes_only = !pids.is_empty();
    }
    let user = !extra.is_empty();
    if user {
        match PairMonitor::start(extra.iter().cloned().chain(builtin.iter().cloned()).collect(), sums.clone(), devs.clone(), pids.to_vec(), windows.clone()) {
            Ok(m) => return Ok((Some(m), notes)),
            Err(e) => {
                // the user's pairs alone name the problem if it is theirs
                let m = PairMonitor::start(extra, Vec::new(), devs, pids.to_vec(), windows)?;
                notes.push(format!("built-in layers (fs, journal, driver) not timed: {}", format!("{e:#}").lines().next().unwrap_or("")));
                return Ok((Some(m), notes));
            }
        }
    }
    if builtin.is_empty() && sums.is_empty() {
        return Ok((None, notes));
    }
    match PairMonitor::start(builtin, sums, devs, pids.to_vec(), windows) {
        Ok(m) => Ok((Some(m), notes)),
        Err(e) => {
            notes.push(format!("fs, journal and driver layers not timed: {}", format!("{e:#}").lines().next().unwrap_or("")));
            Ok((None, notes))
        }
    }
}

/// Open, load and attach a BPF object with the first attach flavour that works, best first
/// (`block::flavors`: all, or the one `FAULTLINE_MONITOR_ATTACH` forces): `one` does it for one
/// flavour into its own storage. Returns its result, the flavour, and why the better ones
/// failed (one line each, empty when the first worked); or an error naming every attempt's
/// reason with libbpf's last messages, which is also sent to `ready`.
pub(super) fn load_first<'o, T>(
    what: &str,
    storage: &'o mut [std::mem::MaybeUninit<libbpf_rs::OpenObject>],
    flavors: &[block::Flavor],
    ready: &std::sync::mpsc::Sender<anyhow::Result<&'static str>>,
    mut one: impl FnMut(&'o mut std::mem::MaybeUninit<libbpf_rs::OpenObject>, block::Flavor) -> anyhow::Result<T>,
) -> anyhow::Result<(T, block::Flavor, Vec<String>)> {
    use anyhow::anyhow;
    libbpf_rs::set_print(Some((libbpf_rs::PrintLevel::Warn, block::libbpf_print)));
    let mut tried = Vec::new();
    for (store, flavor) in storage.iter_mut().zip(flavors) {
        match one(store, *flavor) {
            Ok(t) => {
                block::libbpf_log_tail();
                return Ok((t, *flavor, tried.iter().map(|t: &String| t.lines().next().unwrap_or("").to_string()).collect()));
            }
            Err(e) => tried.push(format!("{}: {e:#}{}", flavor.name(), block::libbpf_log_tail())),
        }
    }
    let msg = tried.join("\n");
    let hint = if msg.contains("Operation not permitted") || msg.contains("EPERM") {
        " (BPF needs root, or CAP_BPF and CAP_PERFMON, and no lockdown forbidding it)"
    } else {
        ""
    };
    let err = anyhow!("BPF {what} monitor unavailable{hint}: {msg}");
    let _ = ready.send(Err(anyhow!("{err:#}")));
    Err(err)
}

/// A monitor's thread, started by `Running::spawn`: it loads and attaches its programs, says
/// which attach type worked (or why none did), then runs until `stop` and returns its results.
pub struct Running<T> {
    stop: std::sync::mpsc::Sender<()>,
    thread: std::thread::JoinHandle<anyhow::Result<T>>,
    /// `tp_btf` or `raw_tp` (`tracepoint` for the pairs).
    pub attach: &'static str,
}

/// What a monitor thread is handed: where to say it is ready, and where `stop` arrives.
type Body<T> = dyn FnOnce(std::sync::mpsc::Sender<anyhow::Result<&'static str>>, std::sync::mpsc::Receiver<()>) -> anyhow::Result<T> + Send;

impl<T: Send + 'static> Running<T> {
    /// Start `body` on a thread named `name`; returns once it is attached, or with the reason
    /// it could not be.
    fn spawn(name: &str, body: Box<Body<T>>) -> anyhow::Result<Running<T>> {
        use anyhow::{Context, anyhow};
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel();
        let thread = std::thread::Builder::new().name(name.into()).spawn(move || body(ready_tx, stop_rx)).context("cannot start the monitor thread")?;
        match ready_rx.recv() {
            Ok(Ok(attach)) => Ok(Running { stop: stop_tx, thread, attach }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => Err(match thread.join() {
                Ok(Err(e)) => e,
                _ => anyhow!("the monitor thread died while loading"),
            }),
        }
    }

    /// Detach and return the results.
    pub fn stop(self) -> anyhow::Result<T> {
        let _ = self.stop.send(());
        self.thread.join().map_err(|_| anyhow::anyhow!("the monitor thread panicked"))?
    }
}
