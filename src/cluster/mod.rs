//! Experiments across machines (docs/cluster.md): agents on every host, reached through an
//! existing exec channel (OpenSSH, `ip netns exec`, `kubectl exec -i`), speaking JSON lines
//! on their standard input and output. No listening port and no authentication of our own.
//!
//! `proto` is the wire format, `agent` the agent (`faultline agent --stdio`), `controller` the
//! side that starts agents, estimates their clock offsets and sends them work, `jsonl` the
//! lines a client's `faultline workload --jsonl` sends the controller.

pub mod agent;
pub mod controller;
pub mod jsonl;
pub mod netfaults;
pub mod proto;

pub use controller::{Agent, Channel, ClockOffset, install};
