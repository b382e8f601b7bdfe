//! The batch worker: one loop (per scheduler process) that expires batches past their
//! completion window, validates and expands new batches, and finalises finished ones. Every
//! step claims its batch with a lease and `SKIP LOCKED`, so any number of workers can run.

use super::BatchCodec;
use crate::queue::Queue;
use crate::store::ObjectStore;
use crate::stream::TokenRelay;
use crate::SchedulerError;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct BatchConfig {
    /// How often the worker looks for work when idle.
    pub poll_every: Duration,
    /// How long a claimed validation or finalisation holds its batch; its worker renews
    /// the lease every third of it, so another worker takes over only from a dead one.
    pub lease: Duration,
    /// Longest accepted input line.
    pub max_line_bytes: usize,
    /// Most requests in one batch.
    pub max_lines: usize,
    /// Errors reported in a failed batch's `errors` (the first ones).
    pub max_reported_errors: usize,
    /// Attempts each batch job gets.
    pub max_attempts: i32,
    /// Rounds of validation, and of finalisation, that may fail (the store or database
    /// failing) before the batch fails with the reason.
    pub max_rounds: i32,
    /// The wait after a failed round, times the rounds so far.
    pub retry_after: Duration,
}

impl Default for BatchConfig {
    fn default() -> Self {
        BatchConfig {
            poll_every: Duration::from_millis(500),
            lease: Duration::from_secs(600),
            max_line_bytes: 4 << 20,
            max_lines: 50_000,
            max_reported_errors: 100,
            max_attempts: 3,
            max_rounds: 5,
            retry_after: Duration::from_secs(10),
        }
    }
}

#[derive(Clone)]
pub struct BatchWorker {
    pub(super) queue: Queue,
    pub(super) store: ObjectStore,
    pub(super) codec: Arc<dyn BatchCodec>,
    pub(super) config: BatchConfig,
    relay: Option<TokenRelay>,
}

impl BatchWorker {
    pub fn new(
        queue: Queue,
        store: ObjectStore,
        codec: Arc<dyn BatchCodec>,
        config: BatchConfig,
    ) -> Self {
        BatchWorker {
            queue,
            store,
            codec,
            config,
            relay: None,
        }
    }

    /// Lets cancellation reach running jobs' runners at once (otherwise they finish).
    pub fn with_relay(mut self, relay: TokenRelay) -> Self {
        self.relay = Some(relay);
        self
    }

    pub(super) fn lease(&self) -> chrono::Duration {
        chrono::Duration::from_std(self.config.lease).unwrap_or(chrono::Duration::minutes(10))
    }

    /// Cancels queued jobs of batches past their window; returns how many.
    pub async fn expire_due(&self) -> Result<u64, SchedulerError> {
        let done = sqlx::query(include_str!("queries/expire.sql"))
            .bind(self.queue.clock().now())
            .execute(self.queue.pool())
            .await?;
        Ok(done.rows_affected())
    }

    /// Signals runners of jobs a cancel flagged (best effort: they also finish on their own).
    pub async fn signal_cancel(&self, jobs: &[uuid::Uuid]) {
        let Some(relay) = &self.relay else { return };
        for job in jobs {
            if let Err(e) = relay.signal_cancel(*job).await {
                tracing::warn!(%job, error = %e, "could not signal a batch job's cancel");
            }
        }
    }

    /// One round: expiry, then every validation and finalisation that is ready. Returns
    /// whether anything was done. A batch whose validation or finalisation fails is given
    /// back with a backoff (or failed, after `max_rounds`): the others go on.
    pub async fn run_once(&self) -> Result<bool, SchedulerError> {
        let mut worked = self.expire_due().await? > 0;
        while let Some(batch) = self.claim_validation().await? {
            let work = self.validate_and_expand(&batch);
            match self.holding_lease(batch.id, batch.lease_token, work).await {
                Ok(outcome) => {
                    tracing::info!(batch = %super::batch_id(batch.id), ?outcome, "batch validated")
                }
                Err(e) => self.validation_round_failed(&batch, &e).await?,
            }
            worked = true;
        }
        while let Some(batch) = self.claim_finalization().await? {
            let work = self.finalize(&batch);
            match self.holding_lease(batch.id, batch.lease_token, work).await {
                Ok(recorded) => {
                    tracing::info!(batch = %super::batch_id(batch.id), recorded, "batch finalised")
                }
                Err(e) => self.finalization_round_failed(&batch, &e).await?,
            }
            worked = true;
        }
        Ok(worked)
    }
}

/// Runs the worker until `shutdown` resolves.
pub async fn run(worker: BatchWorker, shutdown: impl std::future::Future<Output = ()>) {
    let mut tick = tokio::time::interval(worker.config.poll_every.max(Duration::from_millis(10)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            _ = tick.tick() => {
                if let Err(e) = worker.run_once().await {
                    tracing::warn!(error = %e, "batch worker round failed");
                }
            }
        }
    }
}
