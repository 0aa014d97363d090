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
