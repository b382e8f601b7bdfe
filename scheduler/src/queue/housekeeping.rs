//! Taking back jobs whose runner stopped heartbeating, cancelling queued interactive jobs
//! whose client is gone, and deleting old finished jobs. All work in bounded batches so a
//! large backlog never holds many row locks at once.

use super::Queue;
use crate::SchedulerError;
use chrono::Duration as ChronoDuration;
use std::time::Duration;
use uuid::Uuid;

/// Rows per statement for reaping and pruning.
const BATCH: i64 = 1000;

impl Queue {
    /// Returns expired leases to `queued` (or fails them when out of attempts, or when an
    /// interactive job already streamed tokens). Returns how many changed.
    pub async fn reap_expired(&self) -> Result<u64, SchedulerError> {
        let now = self.clock.now();
        let mut total = 0u64;
        loop {
            let reaped: Vec<Uuid> = sqlx::query_scalar(include_str!("queries/reap_expired.sql"))
                .bind(now)
                .bind(self.backoff.base.as_secs_f64())
                .bind(self.backoff.cap.as_secs_f64())
                .bind(BATCH)
                .fetch_all(&self.pool)
                .await?;
            total += reaped.len() as u64;
            if (reaped.len() as i64) < BATCH {
                return Ok(total);
            }
        }
    }

    /// Cancels queued interactive jobs created more than `deadline` ago (the api's request
    /// timeout, past which no client waits for them). Returns how many.
    pub async fn cancel_abandoned(&self, deadline: Duration) -> Result<u64, SchedulerError> {
        let deadline = ChronoDuration::from_std(deadline).unwrap_or(ChronoDuration::MAX);
        let now = self.clock.now();
        let Some(cutoff) = now.checked_sub_signed(deadline) else {
            return Ok(0);
        };
        let mut total = 0u64;
        loop {
            let cancelled: Vec<Uuid> =
                sqlx::query_scalar(include_str!("queries/cancel_abandoned.sql"))
                    .bind(cutoff)
                    .bind(now)
                    .bind(BATCH)
                    .fetch_all(&self.pool)
                    .await?;
            total += cancelled.len() as u64;
            if (cancelled.len() as i64) < BATCH {
                return Ok(total);
            }
        }
    }

    /// Deletes finished jobs older than `retention`.
    pub async fn prune_finished(&self, retention: Duration) -> Result<u64, SchedulerError> {
        let retention = ChronoDuration::from_std(retention).unwrap_or(ChronoDuration::MAX);
        let now = self.clock.now();
        // A retention longer than history itself prunes nothing.
        let Some(cutoff) = now.checked_sub_signed(retention) else {
            return Ok(0);
        };
        let mut total = 0u64;
        loop {
            let deleted = sqlx::query(include_str!("queries/prune_finished.sql"))
                .bind(cutoff)
                .bind(BATCH)
                .execute(&self.pool)
                .await?
                .rows_affected();
            total += deleted;
            if deleted < BATCH as u64 {
                return Ok(total);
            }
        }
    }
}
