//! Jobs whose runner died mid-generation continue from what their stream holds instead of
//! starting over: the maintenance loop rebuilds each one's [`Progress`] from its Redis
//! stream (every delta carries its token ids) and requeues it with that progress, before
//! the reaper would restart it from token zero or fail a stream that had already started.

use fallow_protocol::job::{GenerateRequest, Progress, Task};
use sqlx::types::Json;
use uuid::Uuid;

use super::{notify_queued, Queue};
use crate::stream::TokenRelay;
use crate::SchedulerError;

/// Candidates read per pass.
const BATCH: i64 = 200;

impl Queue {
    /// Requeues every lost job (lease expired, attempts left) whose stream tells how far it
    /// got, with that progress. Returns how many; the rest are left to
    /// [`Queue::reap_expired`]. A stream that cannot be read or folded leaves its job there.
    pub async fn continue_lost(&self, relay: &TokenRelay) -> Result<u64, SchedulerError> {
        let now = self.clock.now();
        let lost: Vec<(Uuid, i32, Json<GenerateRequest>)> =
            sqlx::query_as(include_str!("queries/lost_leases.sql"))
                .bind(now)
                .bind(BATCH)
                .fetch_all(&self.pool)
                .await?;
        let mut continued = 0;
        for (id, attempt, Json(request)) in lost {
            if request.task != Task::Generate || request.sampling.return_hidden_states {
                continue;
            }
            let events = match relay.read_all(id).await {
                Ok(entries) => entries.into_iter().map(|e| e.event).collect::<Vec<_>>(),
                Err(e) => {
                    tracing::warn!(job_id = %id, error = %e, "reading a lost job's stream failed");
                    continue;
                }
            };
            let n = request.n.max(1) as usize;
            let Some(mut progress) = Progress::from_events(n, &events) else {
                continue;
            };
            // A hand-back before the loss recorded the prompt's ids; the stream does not.
            if let Some(earlier) = &request.progress {
                progress.prompt_ids = earlier.prompt_ids.clone();
            }
            let progress = super::finish::progress_json(Some(&progress))?;
            let mut tx = self.pool.begin().await?;
            let model: Option<String> =
                sqlx::query_scalar(include_str!("queries/continue_lost.sql"))
                    .bind(id)
                    .bind(attempt)
                    .bind(progress)
                    .bind(now)
                    .fetch_optional(&mut *tx)
                    .await?;
            if let Some(model) = &model {
                notify_queued(&mut tx, &[model.as_str()]).await?;
                continued += 1;
            }
            tx.commit().await?;
        }
        Ok(continued)
    }
}
