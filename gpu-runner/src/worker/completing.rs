//! Completions on their way to Postgres. A finished job leaves the in-flight table at once
//! (its tokens are out), but until its completion commits the runner still holds its lease:
//! the heartbeat keeps renewing it, and a completion that fails (Postgres restarting, a
//! network blip) is retried with a backoff instead of leaving the job to the reaper, which
//! would run it again or fail a stream that already ended well.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use uuid::Uuid;

/// The leases of completions not yet committed. Cheap to clone.
#[derive(Clone, Default)]
pub struct Completing {
    held: Arc<Mutex<HashMap<Uuid, i32>>>,
}

impl Completing {
    /// Holds `(job, attempt)` until the returned guard drops.
    pub fn hold(&self, job: Uuid, attempt: i32) -> CompletingGuard {
        self.lock().insert(job, attempt);
        CompletingGuard {
            completing: self.clone(),
            job,
        }
    }

    /// The `(id, attempt)` leases held, for the heartbeat to renew.
    pub fn leases(&self) -> Vec<(Uuid, i32)> {
        self.lock()
            .iter()
            .map(|(id, attempt)| (*id, *attempt))
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, i32>> {
        // The map stays consistent whatever a panicking holder did: insert and remove only.
        self.held
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Releases its lease from [`Completing`] when dropped.
pub struct CompletingGuard {
    completing: Completing,
    job: Uuid,
}

impl Drop for CompletingGuard {
    fn drop(&mut self) {
        self.completing.lock().remove(&self.job);
    }
}

/// How often and how patiently a failing completion is tried again.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    pub tries: u32,
    pub first_wait: Duration,
    pub max_wait: Duration,
}

impl Default for RetryPolicy {
    /// About two minutes in all: longer than a Postgres restart, shorter than a client waits.
    fn default() -> Self {
        RetryPolicy {
            tries: 30,
            first_wait: Duration::from_millis(200),
            max_wait: Duration::from_secs(5),
        }
    }
}

/// Runs `attempt` until it settles (`Ok`: committed, or refused as stale by the fence) or
/// `policy.tries` are spent; returns the last outcome.
pub async fn until_settled<T, E, F, Fut>(policy: RetryPolicy, mut attempt: F) -> Result<T, E>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: std::fmt::Display,
{
    let mut wait = policy.first_wait;
    let mut tries = 1;
    loop {
        match attempt().await {
            Ok(done) => return Ok(done),
            Err(e) if tries >= policy.tries => return Err(e),
            Err(e) => {
                tracing::warn!(error = %e, tries, ?wait, "completing a job failed; retrying");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(policy.max_wait);
                tries += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn quick(tries: u32) -> RetryPolicy {
        RetryPolicy {
            tries,
            first_wait: Duration::from_millis(1),
            max_wait: Duration::from_millis(2),
        }
    }

    #[tokio::test]
    async fn a_completion_that_fails_twice_is_retried_until_it_commits() {
        let calls = AtomicU32::new(0);
        let outcome = until_settled(quick(5), || async {
            match calls.fetch_add(1, Ordering::SeqCst) {
                0 | 1 => Err("database unavailable"),
                _ => Ok(true),
            }
        })
        .await;
        assert_eq!(outcome, Ok(true));
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_stale_completion_settles_at_once() {
        let calls = AtomicU32::new(0);
        let outcome: Result<bool, &str> = until_settled(quick(5), || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Ok(false)
        })
        .await;
        assert_eq!(outcome, Ok(false));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn retries_stop_after_the_policys_tries() {
        let calls = AtomicU32::new(0);
        let outcome: Result<bool, &str> = until_settled(quick(3), || async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err("down")
        })
        .await;
        assert_eq!(outcome, Err("down"));
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn a_held_lease_is_renewed_until_its_guard_drops() {
        let completing = Completing::default();
        let job = Uuid::new_v4();
        let guard = completing.hold(job, 2);
        assert_eq!(completing.leases(), vec![(job, 2)]);
        drop(guard);
        assert!(completing.leases().is_empty());
    }
}
