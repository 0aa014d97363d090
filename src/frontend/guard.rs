//! The rule every transport keeps: a panic on the request path never leaves a request
//! unanswered. Whatever panics while serving a request (a fault action, a store, the latency
//! model, a bug), the transport catches it around its call into the disk, says on stderr which
//! request it was and what the panic said, and answers the request with EIO; where it cannot
//! tell what it has already answered (an NBD connection mid-stream), it ends the connection, so
//! every request on it gets an error from the client's side. A request left unanswered would
//! hold its caller in D state and the loop device attached until the daemon is killed.
//!
//! Locks held by the panicking code stay poisoned: later requests that need them panic the same
//! way and are answered the same way.
//!
//! Test-only: `FAULTLINE_TEST_PANIC_AT=BYTE` in `faultline serve`'s environment makes every
//! read or write that covers byte BYTE of the disk panic inside the disk (`tests/request_panic.rs`).

use crate::disk::Outcome;
use std::any::Any;
use std::panic::{AssertUnwindSafe, catch_unwind};

/// Run `f` (one request's call into the disk); `Err` with the panic's message if it panicked.
/// The caller answers (or ends the connection) and says so (`report`).
pub fn caught<R>(f: impl FnOnce() -> R) -> Result<R, String> {
    // the disk's state after a panic is at worst poisoned locks (see above): observing it
    // again is another caught panic, not undefined behaviour
    catch_unwind(AssertUnwindSafe(f)).map_err(|p| message(&*p))
}

/// `f`'s outcome, or EIO if it panicked (said on stderr with `op`, `off` and `len`).
pub fn guarded(op: &str, off: u64, len: u64, f: impl FnOnce() -> Outcome) -> Outcome {
    caught(f).unwrap_or_else(|m| {
        report(op, off, len, &m, "answered with EIO");
        eio()
    })
}

pub fn eio() -> Outcome {
    Outcome { errno: Some(libc::EIO), delay: None }
}

/// One line on stderr for a request that panicked, and what was done about it.
pub fn report(op: &str, off: u64, len: u64, panic: &str, then: &str) {
    eprintln!("faultline: a {op} of {len} bytes at byte {off} panicked ({panic}); {then}");
}

fn message(p: &(dyn Any + Send)) -> String {
    match (p.downcast_ref::<&str>(), p.downcast_ref::<String>()) {
        (Some(s), _) => s.to_string(),
        (_, Some(s)) => s.clone(),
        _ => "a panic without a message".into(),
    }
}
