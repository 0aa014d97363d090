//! Assembling what runs on the disk, and taking it down again: the resource ledger that lets
//! `faultline cleanup` undo what a crashed run left behind, served disks, file-system stacks
//! (ext4/xfs/btrfs, btrfs raid1, dedup) and user commands on top (docs/stacks.md).

pub mod command;
pub mod fs;
pub mod hold;
pub mod served;
