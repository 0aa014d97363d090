//! Driving I/O against a device. For now only the O_DIRECT block access the demo and tests use;
//! the full workload engine (patterns, io_uring, stats) grows here.

pub mod direct;
