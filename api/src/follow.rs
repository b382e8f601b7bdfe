//! Following one job's Redis stream from the api: blocking reads from the last seen entry,
//! an overall deadline, and a fallback to Postgres (the source of truth) when the stream
//! stays quiet — the stream may have expired, or the job may have been failed by the lease
//! reaper without a runner left to write its last event.

use crate::error::ApiError;
use fallow_protocol::job::{Completion, FinishReason, JobEvent};
use fallow_scheduler::queue::{JobState, Queue};
use fallow_scheduler::stream::{StreamEntry, TokenRelay};
use std::time::Duration;
use tokio::time::Instant;
use uuid::Uuid;

/// Longest single blocking read; bounds how stale the deadline check can get.
const READ_BLOCK: Duration = Duration::from_secs(2);
/// Quiet time after which the job row is consulted.
const CHECK_DB_AFTER: Duration = Duration::from_secs(5);
/// Failed reads retried (with doubling pauses from `RETRY_PAUSE`) before a Redis hiccup
/// fails the request: the relay's reader connections do not retry on their own.
const READ_RETRIES: u32 = 3;
const RETRY_PAUSE: Duration = Duration::from_millis(200);

pub struct JobFollower {
    queue: Queue,
    relay: TokenRelay,
    job: Uuid,
    cursor: String,
    deadline: Instant,
    timeout: Duration,
    quiet_since: Instant,
    failures: u32,
}

impl JobFollower {
    /// Follows `job` from after the entry `after` (`"0"` = from the start).
    pub fn new(
        queue: Queue,
        relay: TokenRelay,
        job: Uuid,
        after: String,
        timeout: Duration,
    ) -> Self {
        let now = Instant::now();
        JobFollower {
            queue,
            relay,
            job,
            cursor: after,
            deadline: now + timeout,
            timeout,
            quiet_since: now,
            failures: 0,
        }
    }

    /// Consult Postgres after the first empty read instead of after a quiet spell: for a
    /// resumed stream the job has often finished and its stream may have expired.
    pub fn check_row_early(mut self) -> Self {
        if let Some(past) = self.quiet_since.checked_sub(CHECK_DB_AFTER) {
            self.quiet_since = past;
        }
        self
    }

    /// The next entries of the stream; waits until there are some, the job turns out to be
    /// finished in Postgres (a synthesised last entry), or the deadline passes (`Timeout`).
    pub async fn next_batch(&mut self) -> Result<Vec<StreamEntry>, ApiError> {
        loop {
            let now = Instant::now();
            if now >= self.deadline {
                return Err(ApiError::Timeout(self.timeout));
            }
            let block = READ_BLOCK.min(self.deadline - now);
            let entries = match self.relay.read_after(self.job, &self.cursor, block).await {
                Ok(entries) => {
                    self.failures = 0;
                    entries
                }
                Err(err) if self.failures < READ_RETRIES => {
                    let pause = RETRY_PAUSE * 2u32.pow(self.failures);
                    self.failures += 1;
                    tracing::warn!(job = %self.job, error = %err, ?pause, "stream read failed; retrying");
                    tokio::time::sleep(
                        pause.min(self.deadline.saturating_duration_since(Instant::now())),
                    )
                    .await;
                    continue;
                }
                Err(err) => return Err(err.into()),
            };
            if let Some(last) = entries.last() {
                self.cursor = last.id.clone();
                self.quiet_since = Instant::now();
                return Ok(entries);
            }
            if self.quiet_since.elapsed() >= CHECK_DB_AFTER {
                self.quiet_since = Instant::now();
                if let Some(event) = self.event_from_row().await? {
                    return Ok(vec![StreamEntry {
                        id: self.cursor.clone(),
                        event,
                    }]);
                }
            }
        }
    }

    /// The job's last event as Postgres knows it, if the job has ended.
    async fn event_from_row(&self) -> Result<Option<JobEvent>, ApiError> {
        let Some(record) = self.queue.get(self.job).await? else {
            return Ok(Some(JobEvent::Error {
                code: "not_found".into(),
                message: format!("The job {} no longer exists.", self.job),
            }));
        };
        Ok(match record.state {
            JobState::Queued | JobState::Running => None,
            JobState::Succeeded => Some(match record.result {
                Some(completion) => JobEvent::Final { completion },
                None => JobEvent::Error {
                    code: "internal".into(),
                    message: "The job succeeded but stored no result.".into(),
                },
            }),
            JobState::Cancelled => Some(match record.result {
                Some(completion) => JobEvent::Final { completion },
                None => JobEvent::Final {
                    completion: aborted(record.request.n),
                },
            }),
            JobState::Failed => Some(JobEvent::Error {
                code: "job_failed".into(),
                message: record.error.unwrap_or_else(|| "The job failed.".to_owned()),
            }),
        })
    }
}

/// An empty completion whose choices all ended by `abort`.
pub(crate) fn aborted(n: u32) -> Completion {
    Completion {
        choices: (0..n)
            .map(|index| fallow_protocol::job::ChoiceResult {
                index,
                text: String::new(),
                finish_reason: FinishReason::Abort,
                matched_stop: None,
                logprobs: None,
                hidden_states: None,
                routed_experts: None,
            })
            .collect(),
        usage: Default::default(),
        ..Default::default()
    }
}
