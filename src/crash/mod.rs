//! Crash-state exploration (docs/crash.md, "Exploring crash states"): record a workload's
//! writes once in dm-log-writes format (`disk::record`, `disk::logwrites`), then check many
//! crash states of the log, each on a copy-on-write view of a RAM base (`overlay`) served as
//! a real loop device (`serve`): every flush boundary, random subsets and torn variants of
//! each epoch (`states`), each with mount + the oracle (`oracle`) + the file system's check
//! (`explore`); report.html of the results (`report`).

pub mod explore;
pub mod oracle;
pub mod overlay;
pub mod report;
pub mod serve;
pub mod states;
