//! Assembling what runs on the disk, and taking it down again. For now: the resource ledger
//! that lets `faultline cleanup` undo what a crashed run left behind.

pub mod ledger;
pub mod served;
