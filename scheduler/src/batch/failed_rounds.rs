//! What a worker does when validating or finalising a batch fails for a reason other than the
//! file (the object store or the database failing): it gives the batch back with a backoff
//! that grows with each round, so other batches go on and a retry comes later; after
//! `max_rounds` the batch fails with the last error as its reason instead of staying
//! `validating` or `finalizing` for ever.

use super::expand::{file_error, ClaimedValidation};
use super::finalize::ClaimedFinalization;
use super::worker::BatchWorker;
use crate::SchedulerError;
use uuid::Uuid;

impl BatchWorker {
    pub(super) async fn validation_round_failed(
        &self,
        batch: &ClaimedValidation,
        error: &SchedulerError,
    ) -> Result<(), SchedulerError> {
        let id = super::batch_id(batch.id);
        if batch.attempts < self.config.max_rounds {
            tracing::warn!(batch = %id, attempts = batch.attempts, %error, "batch validation failed; retrying later");
            return self
                .back_off(batch.id, batch.lease_token, batch.attempts)
                .await;
        }
        tracing::error!(batch = %id, attempts = batch.attempts, %error, "batch validation failed for good");
        let reason = file_error("validation_failed", &give_up_message(batch.attempts, error));
        self.fail_validation(batch, &[reason]).await?;
        Ok(())
    }

    pub(super) async fn finalization_round_failed(
        &self,
        batch: &ClaimedFinalization,
        error: &SchedulerError,
    ) -> Result<(), SchedulerError> {
        let id = super::batch_id(batch.id);
        if batch.attempts < self.config.max_rounds {
            tracing::warn!(batch = %id, attempts = batch.attempts, %error, "batch finalisation failed; retrying later");
            return self
                .back_off(batch.id, batch.lease_token, batch.attempts)
                .await;
        }
        tracing::error!(batch = %id, attempts = batch.attempts, %error, "batch finalisation failed for good");
        let reason = file_error(
            "finalization_failed",
            &give_up_message(batch.attempts, error),
        );
        let errors = serde_json::to_value([reason])
            .map_err(|e| SchedulerError::Corrupt(format!("batch errors: {e}")))?;
        sqlx::query(include_str!("queries/fail_finalization.sql"))
            .bind(batch.id)
            .bind(batch.lease_token)
            .bind(errors)
            .bind(self.queue.clock().now())
            .execute(self.queue.pool())
            .await?;
        Ok(())
    }

    /// Gives the lease up; no worker claims the batch again for `retry_after × attempts`.
    async fn back_off(
        &self,
        batch: Uuid,
        lease: Uuid,
        attempts: i32,
    ) -> Result<(), SchedulerError> {
        let wait = self
            .config
            .retry_after
            .saturating_mul(u32::try_from(attempts.max(1)).unwrap_or(1));
        let wait = chrono::Duration::from_std(wait).unwrap_or(chrono::Duration::hours(1));
        sqlx::query(include_str!("queries/back_off.sql"))
            .bind(batch)
            .bind(lease)
            .bind(self.queue.clock().now() + wait)
            .execute(self.queue.pool())
            .await?;
        Ok(())
    }
}

fn give_up_message(attempts: i32, error: &SchedulerError) -> String {
    format!("The batch could not be processed after {attempts} attempts; the last error: {error}")
}
