//! Commands that drive the library from the command line and need several layers at once
//! (`faultline workload` runs a workload and then the verifier). `src/main.rs` parses the
//! arguments and calls these.

pub mod host;
pub mod net;
pub mod workload;
