//! Per-layer timing of the storage stack with BPF (docs/monitor.md): where a request's time
//! goes, aggregated in the kernel. A layer of its own: uses `sys` and `spec` only.
//!
//! `block`: the block layer (queue and service time per device and op); `syscall`: the I/O
//! system calls of a set of processes; `model`: the results
//! (monitor.json, embeddable in an experiment's results); `hist`: the in-kernel histogram's
//! buckets and quantiles.

pub mod block;
pub mod hist;
pub mod model;
pub mod syscall;

pub use block::BlockMonitor;
pub use model::MonitorResults;
pub use syscall::SyscallMonitor;

/// A monitor's thread, started by `Running::spawn`: it loads and attaches its programs, says
/// which attach type worked (or why none did), then runs until `stop` and returns its results.
pub struct Running<T> {
    stop: std::sync::mpsc::Sender<()>,
    thread: std::thread::JoinHandle<anyhow::Result<T>>,
    /// `tp_btf` or `raw_tp`.
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
