//! Time limits for calls that can block for good (an unmount or a detach on a device whose
//! FUSE server died): the call runs on its own thread, and the caller stops waiting.

use anyhow::{Result, anyhow};
use std::time::Duration;

/// Run `f` on a helper thread and wait at most `limit` for it. On timeout the thread is left
/// behind (it may be in uninterruptible sleep) and the error says what did not finish.
pub fn within<T: Send + 'static>(limit: Duration, what: &str, f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    std::thread::Builder::new().name("faultline-limited".into()).spawn(move || {
        let _ = tx.send(f());
    })?;
    match rx.recv_timeout(limit) {
        Ok(r) => r,
        Err(_) => Err(anyhow!("{what} did not finish within {} s (a device below it may be stuck)", limit.as_secs_f64())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gives_up_on_a_stuck_call() {
        let r = within(Duration::from_millis(50), "sleeping", || {
            std::thread::sleep(Duration::from_secs(2));
            Ok(())
        });
        assert!(r.unwrap_err().to_string().contains("sleeping did not finish"));
        assert_eq!(within(Duration::from_secs(5), "adding", || Ok(1 + 1)).unwrap(), 2);
    }
}
