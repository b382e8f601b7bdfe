//! Exponential backoff with jitter, for reconnecting to the control plane: runners that
//! lost it together do not all come back in the same instant.

use std::time::Duration;

/// Exponential backoff with jitter, from 100 ms to 5 s.
#[derive(Default)]
pub struct Backoff {
    tries: u32,
}

impl Backoff {
    /// How long to wait before the next try.
    pub fn delay(&mut self) -> Duration {
        let base = 100u64.saturating_mul(1 << self.tries.min(6)).min(5_000);
        self.tries += 1;
        // Jitter from the clock's nanoseconds: enough to spread reconnecting runners.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| u64::from(d.subsec_nanos()))
            .unwrap_or(0);
        Duration::from_millis(base / 2 + nanos % (base / 2 + 1))
    }

    pub fn reset(&mut self) {
        self.tries = 0;
    }
}
