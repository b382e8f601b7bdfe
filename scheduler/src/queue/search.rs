//! What operators ask of the queue: how deep it is per model and priority, and which jobs
//! match a filter. Read-only; nothing here takes row locks.

use super::rows::{parse_kind, parse_state};
use super::{JobKind, JobState, Queue};
use crate::SchedulerError;
use chrono::{DateTime, Utc};
use serde::Serialize;
use uuid::Uuid;

/// Most jobs one search returns.
pub const MAX_SEARCH_LIMIT: i64 = 1000;

/// Queued and running jobs of one model at one priority.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct QueueDepth {
    pub model: String,
    pub priority: i32,
    pub queued: i64,
    pub running: i64,
}

/// Which jobs to list; every field narrows the search.
#[derive(Debug, Clone, Default)]
pub struct JobFilter {
    pub state: Option<JobState>,
    pub model: Option<String>,
    /// The tenant's name.
    pub tenant: Option<String>,
    /// At most this many, newest first (capped at [`MAX_SEARCH_LIMIT`]).
    pub limit: i64,
}

/// A job as an operator lists it (no payloads).
#[derive(Debug, Clone, Serialize)]
pub struct JobSummary {
    pub id: Uuid,
    pub tenant: Option<String>,
    pub model: String,
    pub kind: JobKind,
    pub priority: i32,
    pub state: JobState,
    pub attempt: i32,
    pub max_attempts: i32,
    pub runner_id: Option<Uuid>,
    pub cancel_requested: bool,
    pub error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
}

#[derive(sqlx::FromRow)]
struct SummaryRow {
    id: Uuid,
    tenant: Option<String>,
    model: String,
    kind: String,
    priority: i32,
    state: String,
    attempt: i32,
    max_attempts: i32,
    runner_id: Option<Uuid>,
    cancel_requested: bool,
    error: Option<String>,
    created_at: DateTime<Utc>,
    started_at: Option<DateTime<Utc>>,
    finished_at: Option<DateTime<Utc>>,
}

impl Queue {
    /// Queued and running jobs per model and priority (lower priority values run first).
    pub async fn queue_depths_by_priority(&self) -> Result<Vec<QueueDepth>, SchedulerError> {
        Ok(
            sqlx::query_as(include_str!("queries/queue_depths_by_priority.sql"))
                .fetch_all(&self.pool)
                .await?,
        )
    }

    /// Jobs matching `filter`, newest first.
    pub async fn search(&self, filter: &JobFilter) -> Result<Vec<JobSummary>, SchedulerError> {
        let rows: Vec<SummaryRow> = sqlx::query_as(include_str!("queries/search_jobs.sql"))
            .bind(filter.state.map(JobState::as_str))
            .bind(filter.model.as_deref())
            .bind(filter.tenant.as_deref())
            .bind(filter.limit.clamp(1, MAX_SEARCH_LIMIT))
            .fetch_all(&self.pool)
            .await?;
        rows.into_iter().map(JobSummary::try_from).collect()
    }
}

impl TryFrom<SummaryRow> for JobSummary {
    type Error = SchedulerError;
    fn try_from(row: SummaryRow) -> Result<Self, SchedulerError> {
        Ok(JobSummary {
            kind: parse_kind(row.id, &row.kind)?,
            state: parse_state(row.id, &row.state)?,
            id: row.id,
            tenant: row.tenant,
            model: row.model,
            priority: row.priority,
            attempt: row.attempt,
            max_attempts: row.max_attempts,
            runner_id: row.runner_id,
            cancel_requested: row.cancel_requested,
            error: row.error,
            created_at: row.created_at,
            started_at: row.started_at,
            finished_at: row.finished_at,
        })
    }
}
