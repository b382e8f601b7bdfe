//! Batch rows: creating a batch (status `validating`), reading and listing them with their
//! live request counts, and cancelling.

use super::LineError;
use crate::SchedulerError;
use chrono::{DateTime, Utc};
use sqlx::PgPool;
use uuid::Uuid;

/// OpenAI's batch statuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchStatus {
    Validating,
    Failed,
    InProgress,
    Finalizing,
    Completed,
    Expired,
    Cancelling,
    Cancelled,
}

impl BatchStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            BatchStatus::Validating => "validating",
            BatchStatus::Failed => "failed",
            BatchStatus::InProgress => "in_progress",
            BatchStatus::Finalizing => "finalizing",
            BatchStatus::Completed => "completed",
            BatchStatus::Expired => "expired",
            BatchStatus::Cancelling => "cancelling",
            BatchStatus::Cancelled => "cancelled",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "validating" => BatchStatus::Validating,
            "failed" => BatchStatus::Failed,
            "in_progress" => BatchStatus::InProgress,
            "finalizing" => BatchStatus::Finalizing,
            "completed" => BatchStatus::Completed,
            "expired" => BatchStatus::Expired,
            "cancelling" => BatchStatus::Cancelling,
            "cancelled" => BatchStatus::Cancelled,
            _ => return None,
        })
    }
    /// Nothing will change this batch any more.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            BatchStatus::Failed
                | BatchStatus::Completed
                | BatchStatus::Expired
                | BatchStatus::Cancelled
        )
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RequestCounts {
    pub total: i64,
    pub completed: i64,
    pub failed: i64,
}

/// A batch as stored, with its request counts (live while jobs run).
#[derive(Debug, Clone)]
pub struct BatchRecord {
    pub id: Uuid,
    pub tenant_id: Option<Uuid>,
    pub endpoint: String,
    pub input_file_id: Uuid,
    pub completion_window: String,
    pub status: BatchStatus,
    pub metadata: Option<serde_json::Value>,
    pub errors: Vec<LineError>,
    pub output_file_id: Option<Uuid>,
    pub error_file_id: Option<Uuid>,
    pub counts: RequestCounts,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub in_progress_at: Option<DateTime<Utc>>,
    pub finalizing_at: Option<DateTime<Utc>>,
    pub completed_at: Option<DateTime<Utc>>,
    pub failed_at: Option<DateTime<Utc>>,
    pub expired_at: Option<DateTime<Utc>>,
    pub cancelling_at: Option<DateTime<Utc>>,
    pub cancelled_at: Option<DateTime<Utc>>,
}

/// What `POST /v1/batches` creates.
#[derive(Debug, Clone)]
pub struct NewBatch {
    pub tenant_id: Option<Uuid>,
    pub endpoint: String,
    pub input_file_id: Uuid,
    pub completion_window: String,
    pub window: std::time::Duration,
    pub metadata: Option<serde_json::Value>,
}

#[derive(sqlx::FromRow)]
struct Row {
    id: Uuid,
    tenant_id: Option<Uuid>,
    endpoint: String,
    input_file_id: Uuid,
    completion_window: String,
    status: String,
    metadata: Option<serde_json::Value>,
    errors: Option<serde_json::Value>,
    output_file_id: Option<Uuid>,
    error_file_id: Option<Uuid>,
    total: i32,
    completed: i32,
    failed: i32,
    live_completed: Option<i64>,
    live_failed: Option<i64>,
    created_at: DateTime<Utc>,
    expires_at: DateTime<Utc>,
    in_progress_at: Option<DateTime<Utc>>,
    finalizing_at: Option<DateTime<Utc>>,
    completed_at: Option<DateTime<Utc>>,
    failed_at: Option<DateTime<Utc>>,
    expired_at: Option<DateTime<Utc>>,
    cancelling_at: Option<DateTime<Utc>>,
    cancelled_at: Option<DateTime<Utc>>,
}

impl TryFrom<Row> for BatchRecord {
    type Error = SchedulerError;
    fn try_from(r: Row) -> Result<Self, SchedulerError> {
        let status = BatchStatus::parse(&r.status)
            .ok_or_else(|| SchedulerError::Corrupt(format!("batch status {:?}", r.status)))?;
        let errors = match r.errors {
            Some(v) => serde_json::from_value(v)
                .map_err(|e| SchedulerError::Corrupt(format!("batch errors: {e}")))?,
            None => Vec::new(),
        };
        // Finished batches carry their final counts; running ones are counted live.
        let counts = match (r.live_completed, r.live_failed) {
            (Some(completed), Some(failed)) if !status.is_final() => RequestCounts {
                total: r.total.into(),
                completed,
                failed,
            },
            _ => RequestCounts {
                total: r.total.into(),
                completed: r.completed.into(),
                failed: r.failed.into(),
            },
        };
        Ok(BatchRecord {
            id: r.id,
            tenant_id: r.tenant_id,
            endpoint: r.endpoint,
            input_file_id: r.input_file_id,
            completion_window: r.completion_window,
            status,
            metadata: r.metadata,
            errors,
            output_file_id: r.output_file_id,
            error_file_id: r.error_file_id,
            counts,
            created_at: r.created_at,
            expires_at: r.expires_at,
            in_progress_at: r.in_progress_at,
            finalizing_at: r.finalizing_at,
            completed_at: r.completed_at,
            failed_at: r.failed_at,
            expired_at: r.expired_at,
            cancelling_at: r.cancelling_at,
            cancelled_at: r.cancelled_at,
        })
    }
}

pub async fn create(
    pool: &PgPool,
    batch: &NewBatch,
    now: DateTime<Utc>,
) -> Result<BatchRecord, SchedulerError> {
    let id = Uuid::new_v4();
    let window = chrono::Duration::from_std(batch.window)
        .map_err(|e| SchedulerError::Corrupt(format!("completion window: {e}")))?;
    sqlx::query(include_str!("queries/create.sql"))
        .bind(id)
        .bind(batch.tenant_id)
        .bind(&batch.endpoint)
        .bind(batch.input_file_id)
        .bind(&batch.completion_window)
        .bind(&batch.metadata)
        .bind(now)
        .bind(now + window)
        .execute(pool)
        .await?;
    get(pool, id, None)
        .await?
        .ok_or_else(|| SchedulerError::Corrupt("inserted batch not found".into()))
}

/// The batch if it exists and `tenant` may see it (`None` sees all).
pub async fn get(
    pool: &PgPool,
    id: Uuid,
    tenant: Option<Uuid>,
) -> Result<Option<BatchRecord>, SchedulerError> {
    let row: Option<Row> = sqlx::query_as(include_str!("queries/get.sql"))
        .bind(id)
        .bind(tenant)
        .fetch_optional(pool)
        .await?;
    row.map(BatchRecord::try_from).transpose()
}

/// Newest first; `after` is the last id of the previous page.
pub async fn list(
    pool: &PgPool,
    tenant: Option<Uuid>,
    after: Option<Uuid>,
    limit: i64,
) -> Result<Vec<BatchRecord>, SchedulerError> {
    let rows: Vec<Row> = sqlx::query_as(include_str!("queries/list.sql"))
        .bind(tenant)
        .bind(after)
        .bind(limit)
        .fetch_all(pool)
        .await?;
    rows.into_iter().map(BatchRecord::try_from).collect()
}

/// Cancels a validating or running batch: status `cancelling`, queued jobs cancelled at
/// once, running ones flagged. Returns the ids of the jobs still running (their runners
/// should be signalled). A batch in any other status is left alone.
pub async fn cancel(
    pool: &PgPool,
    id: Uuid,
    now: DateTime<Utc>,
) -> Result<Vec<Uuid>, SchedulerError> {
    let rows: Vec<(Uuid, String)> = sqlx::query_as(include_str!("queries/cancel.sql"))
        .bind(id)
        .bind(now)
        .fetch_all(pool)
        .await?;
    Ok(rows
        .into_iter()
        .filter(|(_, state)| state == "running")
        .map(|(id, _)| id)
        .collect())
}
