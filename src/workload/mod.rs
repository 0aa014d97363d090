//! Driving I/O against a device: access patterns, the written-content map, and the block
//! workload engine (psync). File interface, io_uring, rate limits and time series grow here.

pub mod direct;
pub mod engine;
pub mod map;
pub mod pattern;
