//! What is built on the faultline disks (`stack:` in experiments, `faultline stack-hold`): the
//! settings; `stack::fs` builds them.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FsKind {
    Ext4,
    Xfs,
    Btrfs,
}

impl FsKind {
    pub fn name(self) -> &'static str {
        match self {
            FsKind::Ext4 => "ext4",
            FsKind::Xfs => "xfs",
            FsKind::Btrfs => "btrfs",
        }
    }
}

/// What is built on the faultline devices. Options are passed to mkfs / mount verbatim.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StackSpec {
    /// The workload uses the block device(s) directly.
    Raw,
    /// One device, one file system.
    Fs { kind: FsKind, mkfs: Vec<String>, mount: Vec<String> },
    /// btrfs with data and metadata raid1 over exactly two devices.
    BtrfsRaid1 { mkfs: Vec<String>, mount: Vec<String> },
    /// A file system that can share blocks (btrfs, or xfs with `-m reflink=1`), deduplicated
    /// with `dedupe()`.
    Dedup {
        kind: FsKind,
        mkfs: Vec<String>,
        mount: Vec<String>,
        /// Deduplicate with duperemove instead of sharing exactly the copies the content map lists.
        #[serde(default)]
        with_duperemove: bool,
    },
    /// `base` is built, then the command is the workload (`BuiltStack::run_command`).
    Command { base: Box<StackSpec>, command: CommandSpec },
}

impl StackSpec {
    /// How many faultline disks the stack is built on.
    pub fn devices_needed(&self) -> usize {
        match self {
            StackSpec::BtrfsRaid1 { .. } => 2,
            StackSpec::Command { base, .. } => base.devices_needed(),
            _ => 1,
        }
    }

    /// Does the workload see a directory (file interface) rather than the device?
    pub fn has_fs(&self) -> bool {
        match self {
            StackSpec::Raw => false,
            StackSpec::Command { base, .. } => base.has_fs(),
            _ => true,
        }
    }

    /// The stack's name in results and reports: raw, ext4, btrfs-raid1, dedup-xfs, command-ext4, ...
    pub fn label(&self) -> String {
        match self {
            StackSpec::Raw => "raw".into(),
            StackSpec::Fs { kind, .. } => kind.name().into(),
            StackSpec::BtrfsRaid1 { .. } => "btrfs-raid1".into(),
            StackSpec::Dedup { kind, .. } => format!("dedup-{}", kind.name()),
            StackSpec::Command { base, .. } => match base.as_ref() {
                StackSpec::Raw => "command".into(),
                b => format!("command-{}", b.label()),
            },
        }
    }
}

/// `"shell string"` (run by `sh -c`) or `[argv, ...]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged, expecting = "not a command; allowed: a shell command as one string, or a list of arguments")]
pub enum Cmdline {
    Shell(String),
    Argv(Vec<String>),
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CommandSpec {
    pub command: Cmdline,
    /// Killed (whole process group) after this long.
    #[serde(default)]
    pub timeout: Option<Duration>,
    /// Working directory (default: the mount point if any, else the current directory).
    #[serde(default)]
    pub cwd: Option<PathBuf>,
    /// Give the command FAULTLINE_ACKS, a file outside the faulty disk (in the repetition's
    /// results) where it appends one line per acknowledged commit (docs/crash.md).
    #[serde(default)]
    pub acks: bool,
    /// Run after a power cut, power-on and remount, with FAULTLINE_ACKS, FAULTLINE_MOUNT and
    /// FAULTLINE_DEVICE(S) set: exit 0 = consistent; a JSON object as its last stdout line
    /// gives its figures (`lost` > 0 is shown as a failure).
    #[serde(default)]
    pub check: Option<Cmdline>,
}
