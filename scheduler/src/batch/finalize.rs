//! Finalisation: once every job of a batch is finished, a worker claims the batch (lease),
//! streams its requests in line order into two staged files — the output file (answered
//! requests) and the error file (failed, cancelled or expired ones), one line per input
//! line, in OpenAI's line shape — uploads them under fresh keys, and records them in one
//! transaction fenced by the lease. A worker that dies before that commit leaves only
//! unreferenced objects behind; the next worker starts over with new keys, so a batch ends
//! with exactly one output or error line per input line, however often finalisation ran.

use super::files::{self, FileRecord};
use super::worker::BatchWorker;
use crate::store::StagedFile;
use crate::SchedulerError;
use chrono::{DateTime, Utc};
use futures::TryStreamExt;
use serde_json::{json, Value};
use tokio::io::{AsyncWriteExt, BufWriter};
use uuid::Uuid;

/// A batch this worker holds the finalisation lease on.
#[derive(Debug, sqlx::FromRow)]
pub struct ClaimedFinalization {
    pub id: Uuid,
    pub tenant_id: Option<Uuid>,
    /// `cancelled` or `expired`; `None` ends `completed`.
    pub ending: Option<String>,
    pub lease_token: Uuid,
    /// Claims of this batch's finalisation so far, this one included.
    pub attempts: i32,
}

#[derive(sqlx::FromRow)]
struct RequestRow {
    custom_id: String,
    job_id: Uuid,
    state: Option<String>,
    model: Option<String>,
    created_at: Option<DateTime<Utc>>,
    result: Option<Value>,
    error: Option<String>,
    output: Option<Value>,
}

/// A staged JSONL file being written.
struct Sink {
    staged: StagedFile,
    writer: BufWriter<tokio::fs::File>,
    lines: i32,
}

impl Sink {
    async fn create(worker: &BatchWorker) -> Result<Sink, SchedulerError> {
        let path = worker.store.staging_path().await?;
        let file = tokio::fs::File::create(&path).await.map_err(io)?;
        Ok(Sink {
            staged: StagedFile { path },
            writer: BufWriter::new(file),
            lines: 0,
        })
    }

    async fn write(&mut self, line: &Value) -> Result<(), SchedulerError> {
        let mut bytes = serde_json::to_vec(line)
            .map_err(|e| SchedulerError::Corrupt(format!("output line: {e}")))?;
        bytes.push(b'\n');
        self.writer.write_all(&bytes).await.map_err(io)?;
        self.lines += 1;
        Ok(())
    }
}

impl BatchWorker {
    /// Claims a batch ready to finalise: all its jobs finished, or a finalisation whose
    /// worker died. Moves `in_progress` to `finalizing`.
    pub async fn claim_finalization(&self) -> Result<Option<ClaimedFinalization>, SchedulerError> {
        let now = self.queue.clock().now();
        let row = sqlx::query_as(include_str!("queries/claim_finalization.sql"))
            .bind(now)
            .bind(Uuid::new_v4())
            .bind(now + self.lease())
            .fetch_optional(self.queue.pool())
            .await?;
        Ok(row)
    }

    /// Writes and records the output and error files. Returns false when the lease was
    /// lost meanwhile (another worker finalised the batch; our objects are removed).
    pub async fn finalize(&self, batch: &ClaimedFinalization) -> Result<bool, SchedulerError> {
        let (mut output, mut errors) = (Sink::create(self).await?, Sink::create(self).await?);
        let mut rows = sqlx::query_as::<_, RequestRow>(include_str!("queries/requests.sql"))
            .bind(batch.id)
            .fetch(self.queue.pool());
        while let Some(row) = rows.try_next().await? {
            match self.result_line(batch, &row) {
                (true, line) => output.write(&line).await?,
                (false, line) => errors.write(&line).await?,
            }
        }
        drop(rows);
        let now = self.queue.clock().now();
        let output_file = self.upload(batch, &mut output, "output", now).await?;
        let error_file = self.upload(batch, &mut errors, "error", now).await?;
        let recorded = self
            .record(
                batch,
                output_file.as_ref(),
                error_file.as_ref(),
                output.lines,
                errors.lines,
            )
            .await?;
        if !recorded {
            for file in output_file.iter().chain(error_file.iter()) {
                let _ = self.store.delete(&file.object_key).await;
            }
        }
        Ok(recorded)
    }

    /// One line of the output (`true`) or error (`false`) file, in OpenAI's shape.
    fn result_line(&self, batch: &ClaimedFinalization, row: &RequestRow) -> (bool, Value) {
        let id = format!("batch_req_{}", row.job_id.simple());
        let request_id = row.job_id.simple().to_string();
        let line = |response: Value, error: Value| json!({"id": id, "custom_id": row.custom_id, "response": response, "error": error});
        match (row.state.as_deref(), &row.result) {
            (Some("succeeded"), Some(result)) => {
                match serde_json::from_value::<fallow_protocol::job::Completion>(result.clone()) {
                    Ok(done) => {
                        let created = row.created_at.map_or(0, |t| t.timestamp());
                        let model = row.model.as_deref().unwrap_or("");
                        // Rows written before output formats existed read as the default.
                        let format = row
                            .output
                            .clone()
                            .and_then(|v| serde_json::from_value(v).ok())
                            .unwrap_or_default();
                        let body = self
                            .codec
                            .response_body(row.job_id, created, model, &format, &done);
                        let response =
                            json!({"status_code": 200, "request_id": request_id, "body": body});
                        (true, line(response, Value::Null))
                    }
                    Err(e) => (
                        false,
                        line(
                            Value::Null,
                            error("internal_error", &format!("stored result unreadable: {e}")),
                        ),
                    ),
                }
            }
            (Some("failed"), _) => {
                let message = row.error.as_deref().unwrap_or("The request failed.");
                let (status, body) = self.codec.error_response("job_failed", message);
                let response =
                    json!({"status_code": status, "request_id": request_id, "body": body});
                (false, line(response, Value::Null))
            }
            (Some("cancelled"), _) if batch.ending.as_deref() == Some("expired") => (
                false,
                line(
                    Value::Null,
                    error(
                        "batch_expired",
                        "This request could not be executed before the completion window expired.",
                    ),
                ),
            ),
            (Some("cancelled"), _) => (
                false,
                line(
                    Value::Null,
                    error(
                        "batch_cancelled",
                        "This request was not executed because the batch was cancelled.",
                    ),
                ),
            ),
            _ => (
                false,
                line(
                    Value::Null,
                    error("internal_error", "The request's job was lost."),
                ),
            ),
        }
    }

    /// Uploads a staged file under a fresh key; `None` if it has no lines.
    async fn upload(
        &self,
        batch: &ClaimedFinalization,
        sink: &mut Sink,
        kind: &str,
        now: DateTime<Utc>,
    ) -> Result<Option<FileRecord>, SchedulerError> {
        sink.writer.flush().await.map_err(io)?;
        sink.writer.get_mut().sync_all().await.map_err(io)?;
        if sink.lines == 0 {
            return Ok(None);
        }
        let id = Uuid::new_v4();
        let key = super::object_key(id);
        let bytes = self.store.put_file(&key, &sink.staged.path).await?;
        Ok(Some(FileRecord {
            id,
            tenant_id: batch.tenant_id,
            purpose: "batch_output".into(),
            filename: format!("{}_{kind}.jsonl", super::batch_id(batch.id)),
            bytes: i64::try_from(bytes).unwrap_or(i64::MAX),
            object_key: key,
            created_at: now,
        }))
    }

    /// Records the files and the final status in one transaction fenced by the lease.
    async fn record(
        &self,
        batch: &ClaimedFinalization,
        output: Option<&FileRecord>,
        errors: Option<&FileRecord>,
        completed: i32,
        failed: i32,
    ) -> Result<bool, SchedulerError> {
        let mut tx = self.queue.pool().begin().await?;
        for file in output.iter().chain(errors.iter()) {
            files::insert(&mut *tx, file).await?;
        }
        let done = sqlx::query(include_str!("queries/finish.sql"))
            .bind(batch.id)
            .bind(batch.lease_token)
            .bind(output.map(|f| f.id))
            .bind(errors.map(|f| f.id))
            .bind(completed)
            .bind(failed)
            .bind(self.queue.clock().now())
            .execute(&mut *tx)
            .await?;
        if done.rows_affected() == 0 {
            return Ok(false);
        }
        tx.commit().await?;
        Ok(true)
    }
}

fn error(code: &str, message: &str) -> Value {
    json!({"code": code, "message": message})
}

fn io(e: std::io::Error) -> SchedulerError {
    SchedulerError::Store(crate::store::StoreError::Io(e))
}
