//! Exponential backoff with jitter, for reconnecting to the control plane: runners that
//! lost it together do not all come back in the same instant.

use super::{PlaneError, PlaneResult};
use futures::future::BoxFuture;
use std::time::Duration;
use tokio::time::Instant;

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

/// `call` again, with backoff, while the control plane is unavailable, for up to
/// `patience`; any other answer is final.
pub async fn while_unavailable<'a, T>(
    patience: Duration,
    mut call: impl FnMut() -> BoxFuture<'a, PlaneResult<T>>,
) -> PlaneResult<T> {
    let started = Instant::now();
    let mut backoff = Backoff::default();
    loop {
        match call().await {
            Err(PlaneError::Unavailable(e)) if started.elapsed() < patience => {
                tracing::warn!(error = %e, "the control plane is unavailable; asking again");
                tokio::time::sleep(backoff.delay()).await;
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;
    use std::sync::atomic::{AtomicU32, Ordering};

    const PATIENCE: Duration = Duration::from_secs(60);

    #[tokio::test(start_paused = true)]
    async fn an_unavailable_control_plane_is_asked_again_until_it_answers() {
        let tries = AtomicU32::new(0);
        let answer = while_unavailable(PATIENCE, || {
            let n = tries.fetch_add(1, Ordering::Relaxed);
            async move {
                if n < 3 {
                    Err(PlaneError::Unavailable("connection refused".into()))
                } else {
                    Ok(n)
                }
            }
            .boxed()
        })
        .await;
        assert_eq!(answer.ok(), Some(3));
    }

    #[tokio::test(start_paused = true)]
    async fn patience_runs_out_and_a_refusal_is_final() {
        let started = Instant::now();
        let answer: PlaneResult<()> = while_unavailable(PATIENCE, || {
            async { Err(PlaneError::Unavailable("down".into())) }.boxed()
        })
        .await;
        assert!(matches!(answer, Err(PlaneError::Unavailable(_))));
        assert!(started.elapsed() >= PATIENCE);

        let tries = AtomicU32::new(0);
        let answer: PlaneResult<()> = while_unavailable(PATIENCE, || {
            tries.fetch_add(1, Ordering::Relaxed);
            async { Err(PlaneError::Revoked("401".into())) }.boxed()
        })
        .await;
        assert!(matches!(answer, Err(PlaneError::Revoked(_))));
        assert_eq!(tries.load(Ordering::Relaxed), 1, "not asked again");
    }
}
