//! Keeping a batch's lease while its worker validates or finalises it: a 50,000-line file
//! with a json_schema per line can take longer than one lease, and without renewal a
//! second worker would take the batch over and do the work again (its fenced commit would
//! then lose). The renewal runs beside the work and ends with it.

use super::worker::BatchWorker;
use std::future::Future;
use std::time::Duration;
use uuid::Uuid;

impl BatchWorker {
    /// Runs `work` while renewing the lease `token` on `batch` every third of a lease.
    pub(super) async fn holding_lease<T>(
        &self,
        batch: Uuid,
        token: Uuid,
        work: impl Future<Output = T>,
    ) -> T {
        // A task of its own: checking a line blocks the work's thread for as long as the
        // line takes, and the renewal must not wait for that. Nor for the work's transaction,
        // which may hold the batch's row that the renewal updates.
        let renewer = self.clone();
        let _renewal = Renewal(tokio::spawn(async move {
            renewer.renew_forever(batch, token).await;
        }));
        work.await
    }

    async fn renew_forever(&self, batch: Uuid, token: Uuid) {
        let every = (self.config.lease / 3).max(Duration::from_millis(10));
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            self.renew_lease(batch, token).await;
        }
    }

    async fn renew_lease(&self, batch: Uuid, token: Uuid) {
        let renewed = sqlx::query(include_str!("queries/renew_lease.sql"))
            .bind(batch)
            .bind(token)
            .bind(self.queue.clock().now() + self.lease())
            .execute(self.queue.pool())
            .await;
        match renewed {
            Ok(done) if done.rows_affected() == 0 => {
                // Cancelled while validating, or taken over: the work's fenced commit finds
                // out and gives up.
                tracing::debug!(batch = %super::batch_id(batch), "batch lease no longer ours");
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(batch = %super::batch_id(batch), error = %e, "could not renew a batch lease")
            }
        }
    }
}

/// Ends the renewal when the work ends, or is dropped.
struct Renewal(tokio::task::JoinHandle<()>);

impl Drop for Renewal {
    fn drop(&mut self) {
        self.0.abort();
    }
}
