//! Batches: OpenAI's Batch API on the job queue. A batch is an uploaded JSONL file of chat
//! requests; each line becomes one batch-kind job, and once every job has finished the batch
//! is finalised into an output file and an error file with exactly one line per input line.
//!
//! `status` moves `validating → in_progress → finalizing → completed`, or ends `failed`
//! (a bad file), `expired` (past its completion window, with what finished) or, via
//! `cancelling`, `cancelled`. The steps that take time — validating a file and finalising
//! a batch — are claimed with a lease (`lease_token`, `lease_expires_at`), so any number of
//! workers can run and a crashed worker's batch is taken over when its lease passes. Every
//! step ends in one fenced transaction, which makes them idempotent.
//!
//! - [`files`]: file metadata rows (contents live in the [`crate::store`]).
//! - [`records`]: batch rows — create, read, list, cancel, live request counts.
//! - [`lines`]: reading and checking input lines, with line numbers.
//! - [`expand`]: validating a file and expanding it into jobs in bulk (`unnest`).
//! - [`finalize`]: writing the output and error files and recording them.
//! - [`worker`]: the loop that drives validation, expiry and finalisation.
//! - `lease`: the lease renewed while a worker validates or finalises a batch.
//! - `failed_rounds`: a failed validation or finalisation retried with a backoff, then failed
//!   with its reason.
//!
//! **API Boundary**: turning a line's `body` into a `GenerateRequest`, and a finished job
//! into the response body, is the api's business (the same code as the sync endpoint); it
//! comes in as a [`BatchCodec`].

pub mod expand;
mod failed_rounds;
pub mod files;
pub mod finalize;
mod lease;
pub mod lines;
pub mod records;
pub mod worker;

pub use files::FileRecord;
pub use records::{BatchRecord, BatchStatus, NewBatch, RequestCounts};
pub use worker::{BatchConfig, BatchWorker};

use fallow_protocol::job::{Completion, GenerateRequest};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// A batch line's request after validation, with the job priority it runs at.
#[derive(Debug, Clone)]
pub struct LineRequest {
    pub request: GenerateRequest,
    /// Always in the batch band, below every interactive priority.
    pub priority: i32,
}

/// One entry of a batch's `errors.data` (OpenAI's shape).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LineError {
    pub code: String,
    pub message: String,
    pub param: Option<String>,
    /// 1-based line of the input file; `None` for file-wide problems.
    pub line: Option<u64>,
}

/// The api's conversions, handed to the scheduler so that a batch line is validated and
/// answered by exactly the code the synchronous endpoint uses.
pub trait BatchCodec: Send + Sync + 'static {
    /// Validates a line's `body` (for `endpoint`) against the live `models` (empty when
    /// none is known). `Err` is `(param, message)`.
    fn parse_body(
        &self,
        endpoint: &str,
        body: serde_json::Value,
        models: &[crate::runners::ModelEntry],
    ) -> Result<LineRequest, (Option<String>, String)>;
    /// The response body of a finished job, as the synchronous endpoint would answer it
    /// (`output`: how the request asked its text to be read).
    fn response_body(
        &self,
        job: Uuid,
        created: i64,
        model: &str,
        output: &fallow_protocol::job::OutputFormat,
        completion: &Completion,
    ) -> serde_json::Value;
    /// Status code and error body for a job that failed with `code`/`message`.
    fn error_response(&self, code: &str, message: &str) -> (u16, serde_json::Value);
}

/// `batch_<uuid without dashes>`.
pub fn batch_id(id: Uuid) -> String {
    format!("batch_{}", id.simple())
}

/// `file-<uuid without dashes>`.
pub fn file_id(id: Uuid) -> String {
    format!("file-{}", id.simple())
}

/// The uuid behind a public id with the given prefix (or a bare uuid).
pub fn parse_public_id(id: &str, prefix: &str) -> Option<Uuid> {
    Uuid::parse_str(id.strip_prefix(prefix).unwrap_or(id)).ok()
}

/// The object key of a file's contents.
pub fn object_key(file: Uuid) -> String {
    format!("files/{}", file.simple())
}
