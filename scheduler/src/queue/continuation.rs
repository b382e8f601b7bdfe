//! Jobs whose runner died mid-generation continue from what their stream holds instead of
//! starting over: the maintenance loop rebuilds each one's [`Progress`] from its Redis
//! stream (every delta carries its token ids) and requeues it with that progress, before
//! the reaper would restart it from token zero or fail a stream that had already started.
//! When Redis lost the stream (or the appends of the last steps), the job continues from
//! its last heartbeat's checkpoint instead, unless a client has read the stream: its client
//! saw what the stream held, and only that may be continued.

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
        let lost: Vec<LostJob> = sqlx::query_as(include_str!("queries/lost_leases.sql"))
            .bind(now)
            .bind(BATCH)
            .fetch_all(&self.pool)
            .await?;
        let mut continued = 0;
        for job in lost {
            let Json(request) = &job.request;
            if request.task != Task::Generate || request.sampling.return_hidden_states {
                continue;
            }
            let events = match relay.read_all(job.id).await {
                Ok(entries) => entries.into_iter().map(|e| e.event).collect::<Vec<_>>(),
                Err(e) => {
                    tracing::warn!(job_id = %job.id, error = %e, "reading a lost job's stream failed");
                    continue;
                }
            };
            let n = request.n.max(1) as usize;
            let from_stream = Progress::from_events(n, &events);
            let checkpoint = job.checkpoint.map(|Json(p)| p);
            let Some(mut progress) = furthest(from_stream, checkpoint, job.followed) else {
                continue;
            };
            // A hand-back before the loss recorded the prompt's ids; streams and checkpoints
            // do not.
            if let Some(earlier) = &request.progress {
                progress.prompt_ids = earlier.prompt_ids.clone();
            }
            let (id, attempt) = (job.id, job.attempt);
            let generated = progress.generated();
            let progress = super::finish::progress_json(Some(&progress))?;
            let mut tx = self.pool.begin().await?;
            let model: Option<String> =
                sqlx::query_scalar(include_str!("queries/continue_lost.sql"))
                    .bind(id)
                    .bind(attempt)
                    .bind(progress)
                    .bind(now)
                    .bind(i32::try_from(generated).unwrap_or(i32::MAX))
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

#[derive(sqlx::FromRow)]
struct LostJob {
    id: Uuid,
    attempt: i32,
    request: Json<GenerateRequest>,
    checkpoint: Option<Json<Progress>>,
    /// A client has read the job's stream.
    followed: bool,
}

/// The progress to continue a lost job from: the stream's, or the checkpoint's when it holds
/// more (the stream lost appends, or Redis lost it all) and no client has read the stream.
fn furthest(
    stream: Option<Progress>,
    checkpoint: Option<Progress>,
    followed: bool,
) -> Option<Progress> {
    match (stream, checkpoint) {
        (stream, _) if followed => stream,
        (Some(stream), Some(checkpoint)) if checkpoint.generated() > stream.generated() => {
            Some(checkpoint)
        }
        (Some(stream), _) => Some(stream),
        (None, checkpoint) => checkpoint.filter(|c| c.generated() > 0 && !c.finished()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fallow_protocol::job::ChoiceProgress;

    fn progress(tokens: usize) -> Progress {
        Progress {
            choices: vec![ChoiceProgress {
                token_ids: (0..tokens as u32).collect(),
                ..ChoiceProgress::default()
            }],
            ..Progress::default()
        }
    }

    #[test]
    fn a_followed_stream_continues_only_from_what_its_client_saw() {
        assert_eq!(
            furthest(Some(progress(3)), Some(progress(9)), true),
            Some(progress(3))
        );
        assert_eq!(furthest(None, Some(progress(9)), true), None);
    }

    #[test]
    fn an_unfollowed_job_continues_from_whichever_got_further() {
        assert_eq!(
            furthest(Some(progress(3)), Some(progress(9)), false),
            Some(progress(9))
        );
        assert_eq!(
            furthest(Some(progress(9)), Some(progress(3)), false),
            Some(progress(9))
        );
        assert_eq!(furthest(None, Some(progress(4)), false), Some(progress(4)));
        assert_eq!(
            furthest(None, Some(progress(0)), false),
            None,
            "nothing to continue"
        );
        assert_eq!(furthest(None, None, false), None);
    }
}
