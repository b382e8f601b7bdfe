//! The job queue in Postgres: the source of truth for every job's state.
//!
//! A job moves `queued → running → succeeded | failed | cancelled`, and may go back from
//! `running` to `queued` (a retry, an expired lease, a runner handing it back). Every change
//! after the claim is fenced by `(id, attempt)`: each claim increments `attempt`, so a runner
//! that lost its lease can no longer change the job. All times come from the injectable
//! [`Clock`] and are bound as parameters (never SQL `now()`), so tests can move time.
//!
//! The statements live in `queries/*.sql`, one per operation:
//! - [`enqueue`](Queue::enqueue): insert + `NOTIFY fallow_jobs` (a wake-up hint only).
//! - `admission.rs`: an interactive enqueue within the tenant's `max_active_jobs`, atomically.
//! - `claim.rs`: claiming (`SKIP LOCKED`) and lease renewal.
//! - `finish.rs`: completion, cancellation, failure with retry, hand-back.
//! - `housekeeping.rs`: reaping expired leases and pruning finished jobs.
//! - `search.rs`: what operators ask: depth per model and priority, job search.
//! - `wake.rs`: waiting for the `NOTIFY` hint.

use crate::clock::Clock;
use crate::SchedulerError;
use chrono::{DateTime, Utc};
use fallow_protocol::job::{Completion, GenerateRequest};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

mod admission;
mod claim;
mod continuation;
mod enqueue;
mod finish;
mod housekeeping;
mod rows;
mod search;
mod wake;

pub use claim::{Checkpoint, ClaimScope, LeaseRenewal};
pub use search::{JobFilter, JobSummary, QueueDepth, MAX_SEARCH_LIMIT};

/// Interactive requests outrank batch ones. Lower priority values are served first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobKind {
    Interactive,
    Batch,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    Queued,
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

/// A job to insert.
#[derive(Debug, Clone)]
pub struct NewJob {
    pub tenant_id: Option<Uuid>,
    pub kind: JobKind,
    /// Lower runs first; the api maps the request's `priority` onto this.
    pub priority: i32,
    pub request: GenerateRequest,
    pub max_attempts: i32,
    /// Echoed `X-Request-Id`, for logs.
    pub request_id: Option<String>,
}

/// A job as stored.
#[derive(Debug, Clone)]
pub struct JobRecord {
    pub id: Uuid,
    pub tenant_id: Option<Uuid>,
    pub model: String,
    pub kind: JobKind,
    pub priority: i32,
    pub state: JobState,
    pub attempt: i32,
    pub max_attempts: i32,
    pub runner_id: Option<Uuid>,
    pub cancel_requested: bool,
    pub request: GenerateRequest,
    pub result: Option<Completion>,
    pub error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
}

/// A job a runner now holds, fenced by `(id, attempt)`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClaimedJob {
    pub id: Uuid,
    pub attempt: i32,
    pub kind: JobKind,
    pub request: GenerateRequest,
    pub created_at: DateTime<Utc>,
    /// The most tokens an earlier attempt is known to have generated: those beyond the
    /// request's progress are generated again.
    pub generated_before: u32,
}

/// What `fail` did with the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FailOutcome {
    /// Back to `queued`, runnable again after the backoff.
    Requeued,
    /// Out of attempts (or not retryable): now `failed`.
    Failed,
    /// The `(id, attempt)` fence did not match: nothing changed.
    Stale,
}

impl JobKind {
    pub fn as_str(self) -> &'static str {
        match self {
            JobKind::Interactive => "interactive",
            JobKind::Batch => "batch",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "interactive" => Some(JobKind::Interactive),
            "batch" => Some(JobKind::Batch),
            _ => None,
        }
    }
}

impl JobState {
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Running => "running",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "queued" => Some(JobState::Queued),
            "running" => Some(JobState::Running),
            "succeeded" => Some(JobState::Succeeded),
            "failed" => Some(JobState::Failed),
            "cancelled" => Some(JobState::Cancelled),
            _ => None,
        }
    }
    /// Succeeded, failed or cancelled: nothing will change this job any more.
    pub fn is_finished(self) -> bool {
        matches!(
            self,
            JobState::Succeeded | JobState::Failed | JobState::Cancelled
        )
    }
}

/// Retry backoff: `min(cap, base · 2^(attempt−1))`, then jittered to 50–100 % of that so
/// jobs that failed together do not come back together.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    pub base: Duration,
    pub cap: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(60),
        }
    }
}

/// The Postgres channel carrying "a job was queued for model X" hints.
pub const NOTIFY_CHANNEL: &str = "fallow_jobs";

/// Sends the "work queued" hint for each distinct model in one statement, inside the caller's
/// transaction, so runners wake only once the jobs are visible (on commit).
pub(crate) async fn notify_queued(
    conn: &mut sqlx::PgConnection,
    models: &[&str],
) -> Result<(), SchedulerError> {
    let distinct: std::collections::BTreeSet<&str> = models.iter().copied().collect();
    let distinct: Vec<&str> = distinct.into_iter().collect();
    sqlx::query(include_str!("queries/notify_queued.sql"))
        .bind(NOTIFY_CHANNEL)
        .bind(&distinct)
        .execute(conn)
        .await?;
    Ok(())
}

#[derive(Clone)]
pub struct Queue {
    pool: PgPool,
    clock: Clock,
    backoff: Backoff,
    /// Shared by clones, so one `LISTEN` connection serves every waiter of this queue.
    wake: Arc<wake::WakeHub>,
}

impl Queue {
    pub fn new(pool: PgPool, clock: Clock) -> Self {
        Queue {
            pool,
            clock,
            backoff: Backoff::default(),
            wake: Arc::new(wake::WakeHub::default()),
        }
    }
    /// Replaces the retry backoff (tests use a tiny one).
    pub fn with_backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }
    pub fn clock(&self) -> &Clock {
        &self.clock
    }
    pub fn backoff(&self) -> Backoff {
        self.backoff
    }
    pub async fn get(&self, id: Uuid) -> Result<Option<JobRecord>, SchedulerError> {
        let row: Option<rows::JobRow> = sqlx::query_as(include_str!("queries/get.sql"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        row.map(JobRecord::try_from).transpose()
    }
    /// Jobs of this tenant that are queued or running.
    pub async fn active_for_tenant(&self, tenant_id: Uuid) -> Result<i64, SchedulerError> {
        let n: i64 = sqlx::query_scalar(include_str!("queries/active_for_tenant.sql"))
            .bind(tenant_id)
            .fetch_one(&self.pool)
            .await?;
        Ok(n)
    }
    /// Interactive jobs of this tenant that are queued or running (for per-tenant limits).
    /// Batch jobs do not count: a tenant's big batch must not lock it out of interactive use.
    pub async fn active_interactive_for_tenant(
        &self,
        tenant_id: Uuid,
    ) -> Result<i64, SchedulerError> {
        let n: i64 = sqlx::query_scalar(include_str!("queries/active_interactive_for_tenant.sql"))
            .bind(tenant_id)
            .fetch_one(&self.pool)
            .await?;
        Ok(n)
    }
    /// All queued jobs.
    pub async fn queued_total(&self) -> Result<i64, SchedulerError> {
        let n: i64 = sqlx::query_scalar(include_str!("queries/queued_total.sql"))
            .fetch_one(&self.pool)
            .await?;
        Ok(n)
    }
    /// Queued interactive jobs (for the global queue limit). Batch backlogs do not count:
    /// they wait behind interactive work by priority and must not cause 429s.
    pub async fn queued_interactive(&self) -> Result<i64, SchedulerError> {
        let n: i64 = sqlx::query_scalar(include_str!("queries/queued_interactive.sql"))
            .fetch_one(&self.pool)
            .await?;
        Ok(n)
    }
    /// Queued jobs per model, for operators.
    pub async fn queue_depths(&self) -> Result<Vec<(String, i64)>, SchedulerError> {
        let rows = sqlx::query_as(include_str!("queries/queue_depths.sql"))
            .fetch_all(&self.pool)
            .await?;
        Ok(rows)
    }
}
