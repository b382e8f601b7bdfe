//! Validation and expansion: a worker claims one `validating` batch (with a lease), reads
//! its input file once to check every line — a bad file fails the batch with line-numbered
//! errors and creates no job — then reads it again and inserts one batch-kind job per line
//! in bulk (`unnest`, chunks of at most [`CHUNK`] lines and [`CHUNK_BYTES`] bytes) together with the `batch_requests` rows, all in one
//! transaction that also moves the batch to `in_progress`. Reading twice keeps memory flat:
//! only one line and the set of `custom_id`s are ever held.

use super::lines::{LineReader, ValidLine};
use super::worker::BatchWorker;
use super::LineError;
use crate::queue::notify_queued;
use crate::store::StoreError;
use crate::SchedulerError;
use fallow_protocol::adapter::lora_dir_queue;
use std::collections::BTreeSet;
use tokio::io::BufReader;
use uuid::Uuid;

/// Lines inserted per statement, at most.
const CHUNK: usize = 2000;
/// Bytes of input lines inserted per statement, at most: 2,000 lines of 4 MiB would make
/// one 8 GB statement.
const CHUNK_BYTES: usize = 16 << 20;

/// A validating batch this worker holds the lease on.
#[derive(Debug, sqlx::FromRow)]
pub struct ClaimedValidation {
    pub id: Uuid,
    pub tenant_id: Option<Uuid>,
    pub endpoint: String,
    pub lease_token: Uuid,
    /// Claims of this batch's validation so far, this one included.
    pub attempts: i32,
    /// `None` when the input file was deleted meanwhile.
    pub object_key: Option<String>,
}

/// What became of a claimed batch.
#[derive(Debug, PartialEq, Eq)]
pub enum Validated {
    /// Jobs created; the batch is `in_progress` with this many requests.
    Expanded(usize),
    /// The file was bad; the batch is `failed` with these errors.
    Failed(usize),
    /// The batch was cancelled or taken over meanwhile; nothing was created.
    Superseded,
}

impl BatchWorker {
    /// Claims the oldest `validating` batch whose lease is free, if any.
    pub async fn claim_validation(&self) -> Result<Option<ClaimedValidation>, SchedulerError> {
        let now = self.queue.clock().now();
        let row = sqlx::query_as(include_str!("queries/claim_validation.sql"))
            .bind(Uuid::new_v4())
            .bind(now + self.lease())
            .bind(now)
            .fetch_optional(self.queue.pool())
            .await?;
        Ok(row)
    }

    /// Validates the claimed batch's file and expands it into jobs, or fails it.
    pub async fn validate_and_expand(
        &self,
        batch: &ClaimedValidation,
    ) -> Result<Validated, SchedulerError> {
        let Some(key) = batch.object_key.as_deref() else {
            let error = file_error("input_file_missing", "The input file was deleted.");
            return self.fail_validation(batch, &[error]).await;
        };
        let (count, errors) = match self.check_file(key, &batch.endpoint).await {
            // The file's record is there but its contents are not (a store that lost it, or
            // an api that wrote to another store): retrying cannot help.
            Err(SchedulerError::Store(StoreError::NotFound(_))) => {
                let error = file_error(
                    "input_file_missing",
                    "The input file's contents are missing from the object store.",
                );
                return self.fail_validation(batch, &[error]).await;
            }
            result => result?,
        };
        if !errors.is_empty() {
            return self.fail_validation(batch, &errors).await;
        }
        if count == 0 {
            let error = file_error("empty_file", "The input file contains no requests.");
            return self.fail_validation(batch, &[error]).await;
        }
        self.expand(batch, key).await
    }

    /// First pass: every line checked; returns (valid lines, errors).
    async fn check_file(
        &self,
        key: &str,
        endpoint: &str,
    ) -> Result<(usize, Vec<LineError>), SchedulerError> {
        // A line for a model no runner serves would wait until the batch expires; fail it now.
        // With no runner up at all (a restart), nothing is known, so nothing is refused.
        let live = crate::runners::live_models(self.queue.pool()).await?;
        // Served queues: every model and adapter by id, and the lora-dir queue of each base
        // whose runner reads adapters by path.
        let served: BTreeSet<String> = live
            .iter()
            .map(|m| m.id.clone())
            .chain(
                live.iter()
                    .filter(|m| m.lora_dir)
                    .map(|m| lora_dir_queue(&m.id)),
            )
            .collect();
        let reader = BufReader::new(self.store.get(key).await?);
        let mut lines = LineReader::new(reader, endpoint, &*self.codec, self.config.max_line_bytes)
            .with_models(&live);
        let (mut count, mut errors) = (0usize, Vec::new());
        while let Some(line) = lines.next().await.map_err(store_io)? {
            let line = line.and_then(|l| unserved_model(&served, l));
            match line {
                Ok(_) => count += 1,
                // Reporting the first errors is enough to fix a file; the count stays exact.
                Err(e) if errors.len() < self.config.max_reported_errors => errors.push(e),
                Err(_) => {}
            }
            if count > self.config.max_lines {
                let message = format!("The file has more than {} requests.", self.config.max_lines);
                return Ok((count, vec![file_error("too_many_lines", &message)]));
            }
        }
        Ok((count, errors))
    }

    /// Second pass: inserts the jobs and request rows, then moves the batch to `in_progress`,
    /// all in one transaction fenced by the lease and by `status = 'validating'`.
    async fn expand(
        &self,
        batch: &ClaimedValidation,
        key: &str,
    ) -> Result<Validated, SchedulerError> {
        // Each job's request records how its model writes (tool calls, reasoning), so its
        // output line reads like a synchronous answer.
        let live = crate::runners::live_models(self.queue.pool()).await?;
        let reader = BufReader::new(self.store.get(key).await?);
        let mut lines = LineReader::new(
            reader,
            &batch.endpoint,
            &*self.codec,
            self.config.max_line_bytes,
        )
        .with_models(&live);
        let mut tx = self.queue.pool().begin().await?;
        let mut models = BTreeSet::new();
        let (mut chunk, mut total) = (Vec::with_capacity(CHUNK), 0usize);
        let mut chunk_bytes = 0usize;
        loop {
            let next = lines.next().await.map_err(store_io)?;
            let done = next.is_none();
            match next {
                Some(Ok(line)) => {
                    chunk_bytes += line.bytes;
                    chunk.push(line);
                }
                // The file changed between the passes (it cannot through the api): give up.
                Some(Err(e)) => {
                    drop(tx);
                    return self.fail_validation(batch, &[e]).await;
                }
                None => {}
            }
            if chunk.len() == CHUNK || chunk_bytes >= CHUNK_BYTES || (done && !chunk.is_empty()) {
                total += chunk.len();
                models.extend(chunk.iter().map(|l| l.request.request.queue_model()));
                self.insert_chunk(&mut tx, batch, &chunk).await?;
                chunk.clear();
                chunk_bytes = 0;
            }
            if done {
                break;
            }
        }
        let moved = sqlx::query(include_str!("queries/start.sql"))
            .bind(batch.id)
            .bind(batch.lease_token)
            .bind(i32::try_from(total).unwrap_or(i32::MAX))
            .bind(self.queue.clock().now())
            .execute(&mut *tx)
            .await?;
        if moved.rows_affected() == 0 {
            drop(tx);
            self.release(batch).await?;
            return Ok(Validated::Superseded);
        }
        let models: Vec<&str> = models.iter().map(String::as_str).collect();
        notify_queued(&mut tx, &models).await?;
        tx.commit().await?;
        Ok(Validated::Expanded(total))
    }

    async fn insert_chunk(
        &self,
        tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
        batch: &ClaimedValidation,
        chunk: &[ValidLine],
    ) -> Result<(), SchedulerError> {
        let job_ids: Vec<Uuid> = chunk.iter().map(|_| Uuid::new_v4()).collect();
        let line_nos: Vec<i32> = chunk
            .iter()
            .map(|l| i32::try_from(l.line).unwrap_or(i32::MAX))
            .collect();
        let custom_ids: Vec<&str> = chunk.iter().map(|l| l.custom_id.as_str()).collect();
        let queues: Vec<String> = chunk
            .iter()
            .map(|l| l.request.request.queue_model())
            .collect();
        let models: Vec<&str> = queues.iter().map(String::as_str).collect();
        let priorities: Vec<i32> = chunk.iter().map(|l| l.request.priority).collect();
        let mut requests = Vec::with_capacity(chunk.len());
        for line in chunk {
            requests.push(
                serde_json::to_value(&line.request.request).map_err(|e| {
                    SchedulerError::Corrupt(format!("request not serialisable: {e}"))
                })?,
            );
        }
        sqlx::query(include_str!("queries/expand.sql"))
            .bind(batch.id)
            .bind(batch.tenant_id)
            .bind(&job_ids)
            .bind(&line_nos)
            .bind(&custom_ids)
            .bind(&models)
            .bind(&priorities)
            .bind(&requests)
            .bind(self.config.max_attempts.max(1))
            .bind(self.queue.clock().now())
            .bind(super::batch_id(batch.id))
            .execute(&mut **tx)
            .await?;
        Ok(())
    }

    pub(super) async fn fail_validation(
        &self,
        batch: &ClaimedValidation,
        errors: &[LineError],
    ) -> Result<Validated, SchedulerError> {
        let errors_json = serde_json::to_value(errors)
            .map_err(|e| SchedulerError::Corrupt(format!("batch errors: {e}")))?;
        let done = sqlx::query(include_str!("queries/fail_validation.sql"))
            .bind(batch.id)
            .bind(batch.lease_token)
            .bind(errors_json)
            .bind(self.queue.clock().now())
            .execute(self.queue.pool())
            .await?;
        if done.rows_affected() == 0 {
            self.release(batch).await?;
            return Ok(Validated::Superseded);
        }
        Ok(Validated::Failed(errors.len()))
    }

    /// Gives the lease up (the batch was cancelled while being validated).
    async fn release(&self, batch: &ClaimedValidation) -> Result<(), SchedulerError> {
        sqlx::query(include_str!("queries/release_validation.sql"))
            .bind(batch.id)
            .bind(batch.lease_token)
            .execute(self.queue.pool())
            .await?;
        Ok(())
    }
}

pub(super) fn file_error(code: &str, message: &str) -> LineError {
    LineError {
        code: code.to_owned(),
        message: message.to_owned(),
        param: None,
        line: None,
    }
}

fn store_io(e: std::io::Error) -> SchedulerError {
    SchedulerError::Store(crate::store::StoreError::Io(e))
}

fn unserved_model(served: &BTreeSet<String>, line: ValidLine) -> Result<ValidLine, LineError> {
    let model = line.request.request.queue_model();
    if served.is_empty() || served.contains(&model) {
        return Ok(line);
    }
    Err(LineError {
        code: "model_not_found".to_owned(),
        message: format!("Line {}: the model `{model}` does not exist.", line.line),
        param: Some("body.model".to_owned()),
        line: Some(line.line),
    })
}
