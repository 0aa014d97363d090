//! User-facing input and the settings it produces: units, rules, disks, stacks, workloads and
//! experiment files. Parses and validates; never does I/O beyond reading the file. The bottom
//! layer: it imports no other layer of faultline (only `content`, for block hashes), and the
//! layers consume its plain typed settings.

pub mod disk;
pub mod experiment;
pub mod host;
pub mod latency;
pub mod nbd;
pub mod net;
pub mod rule;
pub mod rules;
pub mod stack;
pub mod study;
pub mod units;
pub mod workload;
