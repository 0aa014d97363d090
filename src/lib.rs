//! faultline: a virtual faulty disk, and the experiments run on it (workloads, stacks, faults,
//! verification, reports).
//! Layers, one folder each (see docs/architecture.md): spec -> disk + fault -> frontend, nbd -> stack.

pub mod cli;
pub mod cluster;
pub mod content;
pub mod crash;
pub mod disk;
pub mod fault;
pub mod frontend;
pub mod host;
pub mod mem;
pub mod monitor;
pub mod nbd;
pub mod net;
pub mod report;
pub mod run;
pub mod spec;
pub mod stack;
pub mod sys;
pub mod verify;
pub mod workload;
