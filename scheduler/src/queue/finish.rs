//! How a running job ends or goes back: completion, cancellation, failure with retry, and a
//! runner handing a job back. Every statement is fenced by `state = 'running' AND id AND
//! attempt`, so a stale or duplicate report changes nothing and says so.

use super::{notify_queued, FailOutcome, Queue};
use crate::SchedulerError;
use fallow_protocol::job::{Completion, Progress};
use std::collections::HashMap;
use uuid::Uuid;

impl Queue {
    /// Running → succeeded, fenced by `(id, attempt)`; false if the fence did not match.
    pub async fn complete(
        &self,
        id: Uuid,
        attempt: i32,
        completion: &Completion,
    ) -> Result<bool, SchedulerError> {
        let result = encode(completion)?;
        let done = sqlx::query(include_str!("queries/complete.sql"))
            .bind(id)
            .bind(attempt)
            .bind(result)
            .bind(self.clock.now())
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Running → cancelled (the runner stopped it on request), fenced.
    pub async fn mark_cancelled(
        &self,
        id: Uuid,
        attempt: i32,
        partial: Option<&Completion>,
    ) -> Result<bool, SchedulerError> {
        let partial = partial.map(encode).transpose()?;
        let done = sqlx::query(include_str!("queries/mark_cancelled.sql"))
            .bind(id)
            .bind(attempt)
            .bind(partial)
            .bind(self.clock.now())
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Running → queued with exponential backoff and jitter (if `retryable` and attempts
    /// remain) or → failed, fenced.
    pub async fn fail(
        &self,
        id: Uuid,
        attempt: i32,
        error: &str,
        retryable: bool,
    ) -> Result<FailOutcome, SchedulerError> {
        self.fail_with(id, attempt, error, retryable, None).await
    }

    /// [`Queue::fail`] for a retryable failure whose next attempt continues from `progress`
    /// (an engine failure after some tokens): even a stream that already sent tokens is
    /// retried, since its client sees the rest follow what it has. The attempt counts.
    pub async fn fail_and_continue(
        &self,
        id: Uuid,
        attempt: i32,
        error: &str,
        progress: &Progress,
    ) -> Result<FailOutcome, SchedulerError> {
        self.fail_with(id, attempt, error, true, Some(progress))
            .await
    }

    async fn fail_with(
        &self,
        id: Uuid,
        attempt: i32,
        error: &str,
        retryable: bool,
        progress: Option<&Progress>,
    ) -> Result<FailOutcome, SchedulerError> {
        let progress = progress_json(progress)?;
        let next: Option<String> = sqlx::query_scalar(include_str!("queries/fail.sql"))
            .bind(id)
            .bind(attempt)
            .bind(error)
            .bind(retryable)
            .bind(self.clock.now())
            .bind(self.backoff.base.as_secs_f64())
            .bind(self.backoff.cap.as_secs_f64())
            .bind(progress)
            .fetch_optional(&self.pool)
            .await?;
        Ok(match next.as_deref() {
            None => FailOutcome::Stale,
            Some("queued") => FailOutcome::Requeued,
            // failed, or cancelled because cancellation had been requested: either way final.
            Some(_) => FailOutcome::Failed,
        })
    }

    /// A runner hands a running job back unfinished (it is yielding its GPU), fenced. The
    /// job is runnable again at once and the hand-back does not use up an attempt. With
    /// `progress` the next runner continues from it (stored in the job's request); without,
    /// an interactive job that already streamed tokens fails instead.
    pub async fn release(
        &self,
        id: Uuid,
        attempt: i32,
        progress: Option<&Progress>,
    ) -> Result<FailOutcome, SchedulerError> {
        let progress = progress_json(progress)?;
        let mut tx = self.pool.begin().await?;
        let next: Option<(String, String)> = sqlx::query_as(include_str!("queries/release.sql"))
            .bind(id)
            .bind(attempt)
            .bind(self.clock.now())
            .bind(progress)
            .fetch_optional(&mut *tx)
            .await?;
        let outcome = match &next {
            None => FailOutcome::Stale,
            Some((state, model)) if state == "queued" => {
                notify_queued(&mut tx, &[model.as_str()]).await?;
                FailOutcome::Requeued
            }
            Some(_) => FailOutcome::Failed,
        };
        tx.commit().await?;
        Ok(outcome)
    }

    /// Queued → cancelled at once; running → `cancel_requested` (the runner stops it).
    /// Returns false if the job is unknown or already finished.
    pub async fn request_cancel(&self, id: Uuid) -> Result<bool, SchedulerError> {
        let changed: Option<String> =
            sqlx::query_scalar(include_str!("queries/request_cancel.sql"))
                .bind(id)
                .bind(self.clock.now())
                .fetch_optional(&self.pool)
                .await?;
        Ok(changed.is_some())
    }

    /// The runner holding a running job, if it runs: the runner API lets a runner report
    /// only on its own jobs.
    pub async fn holder(&self, id: Uuid) -> Result<Option<Uuid>, SchedulerError> {
        Ok(self.holders(&[id]).await?.remove(&id))
    }

    /// [`holder`](Self::holder) for many jobs in one statement: the running ones, each
    /// with its runner.
    pub async fn holders(&self, ids: &[Uuid]) -> Result<HashMap<Uuid, Uuid>, SchedulerError> {
        let rows: Vec<(Uuid, Uuid)> = sqlx::query_as(include_str!("queries/holders.sql"))
            .bind(ids)
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.into_iter().collect())
    }

    /// Marks that an interactive job has sent tokens to its client, so it must not be
    /// retried from scratch (fenced). Call it *before* appending the first delta: if the
    /// runner dies in between, the job fails rather than being replayed to the client.
    pub async fn mark_streamed(&self, id: Uuid, attempt: i32) -> Result<(), SchedulerError> {
        self.mark_all_streamed(&[(id, attempt)], None).await
    }

    /// [`mark_streamed`](Self::mark_streamed) for a step's jobs in one statement; with
    /// `runner`, only the jobs that runner holds.
    pub async fn mark_all_streamed(
        &self,
        jobs: &[(Uuid, i32)],
        runner: Option<Uuid>,
    ) -> Result<(), SchedulerError> {
        let (ids, attempts): (Vec<Uuid>, Vec<i32>) = jobs.iter().copied().unzip();
        sqlx::query(include_str!("queries/mark_streamed.sql"))
            .bind(ids)
            .bind(attempts)
            .bind(runner)
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}

/// A job's progress as the JSON its request stores.
pub(super) fn progress_json(
    progress: Option<&Progress>,
) -> Result<Option<serde_json::Value>, SchedulerError> {
    progress
        .map(serde_json::to_value)
        .transpose()
        .map_err(|e| SchedulerError::Corrupt(format!("progress not serialisable: {e}")))
}

fn encode(completion: &Completion) -> Result<serde_json::Value, SchedulerError> {
    serde_json::to_value(completion)
        .map_err(|e| SchedulerError::Corrupt(format!("completion not serialisable: {e}")))
}
