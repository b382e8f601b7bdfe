//! An injectable `now`: production reads the system clock; tests set and advance time so
//! lease expiry and backoff can be tested without sleeping.

use chrono::{DateTime, Duration as ChronoDuration, Utc};
use std::sync::{Arc, Mutex};

#[derive(Clone, Default)]
pub struct Clock {
    fixed: Option<Arc<Mutex<DateTime<Utc>>>>,
}

impl Clock {
    /// The system clock.
    pub fn system() -> Self {
        Clock { fixed: None }
    }
    /// A clock frozen at `at` until advanced.
    pub fn fixed(at: DateTime<Utc>) -> Self {
        Clock {
            fixed: Some(Arc::new(Mutex::new(at))),
        }
    }
    pub fn now(&self) -> DateTime<Utc> {
        match &self.fixed {
            // A poisoned lock only means a test panicked mid-advance; the time is still valid.
            Some(t) => *t.lock().unwrap_or_else(|e| e.into_inner()),
            None => Utc::now(),
        }
    }
    /// Moves a fixed clock forward; no-op on the system clock.
    pub fn advance(&self, by: std::time::Duration) {
        if let Some(t) = &self.fixed {
            let mut guard = t.lock().unwrap_or_else(|e| e.into_inner());
            *guard += ChronoDuration::from_std(by).unwrap_or(ChronoDuration::zero());
        }
    }
}
