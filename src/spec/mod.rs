//! User-facing input: units and rules files. Parses and validates; never does I/O beyond reading the file.

pub mod experiment;
pub mod rules;
pub mod units;
pub mod workload;
