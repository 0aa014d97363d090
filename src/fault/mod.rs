//! Fault rules, the matching engine and the fault log. Knows nothing of FUSE or stores.

pub mod engine;
pub mod index;
pub mod log;
pub mod rule;

pub use engine::{Engine, Plan, StoreMode};
pub use rule::{Action, Op, Rule, Target};
