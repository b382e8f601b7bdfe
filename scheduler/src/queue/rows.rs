//! Rows as Postgres returns them, and their conversion into the typed records callers see.
//! Enum columns are text and payloads JSONB; anything that does not parse is reported as
//! `SchedulerError::Corrupt` rather than panicking.

use super::{ClaimedJob, JobKind, JobRecord, JobState};
use crate::SchedulerError;
use chrono::{DateTime, Utc};
use fallow_protocol::job::{Completion, GenerateRequest};
use serde::de::DeserializeOwned;
use uuid::Uuid;

#[derive(sqlx::FromRow)]
pub(super) struct JobRow {
    id: Uuid,
    tenant_id: Option<Uuid>,
    model: String,
    kind: String,
    priority: i32,
    state: String,
    attempt: i32,
    max_attempts: i32,
    runner_id: Option<Uuid>,
    cancel_requested: bool,
    request: serde_json::Value,
    result: Option<serde_json::Value>,
    error: Option<String>,
    created_at: DateTime<Utc>,
    finished_at: Option<DateTime<Utc>>,
}

impl TryFrom<JobRow> for JobRecord {
    type Error = SchedulerError;
    fn try_from(row: JobRow) -> Result<Self, SchedulerError> {
        Ok(JobRecord {
            id: row.id,
            tenant_id: row.tenant_id,
            kind: parse_kind(row.id, &row.kind)?,
            state: parse_state(row.id, &row.state)?,
            request: decode(row.id, "request", row.request)?,
            result: row
                .result
                .map(|r| decode::<Completion>(row.id, "result", r))
                .transpose()?,
            model: row.model,
            priority: row.priority,
            attempt: row.attempt,
            max_attempts: row.max_attempts,
            runner_id: row.runner_id,
            cancel_requested: row.cancel_requested,
            error: row.error,
            created_at: row.created_at,
            finished_at: row.finished_at,
        })
    }
}

/// What `claim.sql` returns; `rank` is kept only to restore claim order, because
/// `UPDATE … RETURNING` does not preserve the CTE's `ORDER BY`.
#[derive(sqlx::FromRow)]
pub(super) struct ClaimedRow {
    pub id: Uuid,
    pub attempt: i32,
    pub kind: String,
    pub rank: i64,
    pub request: serde_json::Value,
    pub created_at: DateTime<Utc>,
    pub generated_tokens: i32,
}

impl TryFrom<ClaimedRow> for ClaimedJob {
    type Error = SchedulerError;
    fn try_from(row: ClaimedRow) -> Result<Self, SchedulerError> {
        Ok(ClaimedJob {
            id: row.id,
            attempt: row.attempt,
            kind: parse_kind(row.id, &row.kind)?,
            request: decode::<GenerateRequest>(row.id, "request", row.request)?,
            created_at: row.created_at,
            generated_before: u32::try_from(row.generated_tokens).unwrap_or(0),
        })
    }
}

pub(super) fn parse_kind(id: Uuid, kind: &str) -> Result<JobKind, SchedulerError> {
    JobKind::parse(kind)
        .ok_or_else(|| SchedulerError::Corrupt(format!("job {id}: unknown kind {kind:?}")))
}

pub(super) fn parse_state(id: Uuid, state: &str) -> Result<JobState, SchedulerError> {
    JobState::parse(state)
        .ok_or_else(|| SchedulerError::Corrupt(format!("job {id}: unknown state {state:?}")))
}

fn decode<T: DeserializeOwned>(
    id: Uuid,
    column: &str,
    value: serde_json::Value,
) -> Result<T, SchedulerError> {
    serde_json::from_value(value)
        .map_err(|e| SchedulerError::Corrupt(format!("job {id}: {column}: {e}")))
}
