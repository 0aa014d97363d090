//! Fault rules, the matching engine and the fault log. Knows nothing of FUSE or stores.

pub mod engine;
pub mod index;
pub mod log;
pub mod pattern;

pub use crate::spec::rule::{Action, Op, Rule, Target};
pub use engine::{Engine, Plan, StoreMode};
