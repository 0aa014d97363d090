//! Operating-system plumbing every layer above may use, and which uses none of them: the
//! resource ledger and run directory, mounts and mountinfo, loop devices and their sysfs
//! knobs, processes, the FUSE control file system, and time limits for calls that may hang.

pub mod fusectl;
pub mod ledger;
pub mod limit;
pub mod loopdev;
pub mod mount;
pub mod process;
