//! OpenAI's batch objects and `POST /v1/batches` body, and the [`ChatBatchCodec`] that lets
//! the scheduler validate batch lines and build their responses with exactly the code the
//! synchronous `/v1/chat/completions` endpoint uses.

use crate::error::ApiError;
use crate::openai::request::ChatCompletionRequest;
use crate::openai::response::ChatCompletion;
use crate::validate::{validate_chat, Limits, BATCH_PRIORITY_BASE};
use fallow_scheduler::batch::{batch_id, file_id, BatchCodec, BatchRecord, LineError, LineRequest};
use fallow_scheduler::job::{Completion, OutputFormat};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// The one endpoint batches may target.
pub const CHAT_ENDPOINT: &str = "/v1/chat/completions";

#[derive(Debug, Deserialize)]
pub struct CreateBatchRequest {
    pub input_file_id: Option<String>,
    pub endpoint: Option<String>,
    pub completion_window: Option<String>,
    #[serde(default)]
    pub metadata: Option<serde_json::Value>,
}

#[derive(Debug, Serialize)]
pub struct BatchObject {
    pub id: String,
    pub object: &'static str,
    pub endpoint: String,
    pub errors: Option<BatchErrors>,
    pub input_file_id: String,
    pub completion_window: String,
    pub status: &'static str,
    pub output_file_id: Option<String>,
    pub error_file_id: Option<String>,
    pub created_at: i64,
    pub in_progress_at: Option<i64>,
    pub expires_at: Option<i64>,
    pub finalizing_at: Option<i64>,
    pub completed_at: Option<i64>,
    pub failed_at: Option<i64>,
    pub expired_at: Option<i64>,
    pub cancelling_at: Option<i64>,
    pub cancelled_at: Option<i64>,
    pub request_counts: RequestCountsOut,
    pub metadata: Option<serde_json::Value>,
}

#[derive(Debug, Serialize)]
pub struct BatchErrors {
    pub object: &'static str,
    pub data: Vec<LineError>,
}

#[derive(Debug, Serialize)]
pub struct RequestCountsOut {
    pub total: i64,
    pub completed: i64,
    pub failed: i64,
}

impl From<&BatchRecord> for BatchObject {
    fn from(b: &BatchRecord) -> Self {
        let ts = |t: Option<chrono::DateTime<chrono::Utc>>| t.map(|t| t.timestamp());
        BatchObject {
            id: batch_id(b.id),
            object: "batch",
            endpoint: b.endpoint.clone(),
            errors: (!b.errors.is_empty()).then(|| BatchErrors {
                object: "list",
                data: b.errors.clone(),
            }),
            input_file_id: file_id(b.input_file_id),
            completion_window: b.completion_window.clone(),
            status: b.status.as_str(),
            output_file_id: b.output_file_id.map(file_id),
            error_file_id: b.error_file_id.map(file_id),
            created_at: b.created_at.timestamp(),
            in_progress_at: ts(b.in_progress_at),
            expires_at: Some(b.expires_at.timestamp()),
            finalizing_at: ts(b.finalizing_at),
            completed_at: ts(b.completed_at),
            failed_at: ts(b.failed_at),
            expired_at: ts(b.expired_at),
            cancelling_at: ts(b.cancelling_at),
            cancelled_at: ts(b.cancelled_at),
            request_counts: RequestCountsOut {
                total: b.counts.total,
                completed: b.counts.completed,
                failed: b.counts.failed,
            },
            metadata: b.metadata.clone(),
        }
    }
}

/// Batch lines through the sync endpoint's validation and response building.
pub struct ChatBatchCodec {
    limits: Limits,
}

impl ChatBatchCodec {
    pub fn new(config: &crate::ApiConfig) -> Self {
        ChatBatchCodec {
            limits: Limits {
                max_messages: config.max_messages,
                max_n: config.max_n,
                // The engine refuses a prompt that does not fit its model; that request then
                // ends in the error file like any other failure.
                context_length: u32::MAX,
                // Lines are validated without the model catalog: tool calls are read in the
                // default syntax and reasoning is left in the content.
                parsers: Default::default(),
            },
        }
    }
}

impl BatchCodec for ChatBatchCodec {
    fn parse_body(
        &self,
        endpoint: &str,
        body: serde_json::Value,
    ) -> Result<LineRequest, (Option<String>, String)> {
        if endpoint != CHAT_ENDPOINT {
            return Err((None, format!("The endpoint `{endpoint}` is not supported.")));
        }
        let wire: ChatCompletionRequest = serde_path_to_error::deserialize(body).map_err(|e| {
            let path = e.path().to_string();
            (
                Some(path.clone()),
                format!("Invalid value for `{path}`: {}", e.into_inner()),
            )
        })?;
        let valid = validate_chat(wire, &self.limits).map_err(|e| {
            let (_, envelope) = e.status_and_body();
            (envelope.error.param, envelope.error.message)
        })?;
        let mut request = valid.request;
        // Results are collected, never streamed, so every batch job stays retryable.
        request.stream = false;
        Ok(LineRequest {
            request,
            priority: BATCH_PRIORITY_BASE + valid.priority,
        })
    }

    fn response_body(
        &self,
        job: Uuid,
        created: i64,
        model: &str,
        output: &OutputFormat,
        completion: &Completion,
    ) -> serde_json::Value {
        let body =
            ChatCompletion::from_completion(job, created, model.to_owned(), completion, output);
        serde_json::to_value(body).unwrap_or(serde_json::Value::Null)
    }

    fn error_response(&self, code: &str, message: &str) -> (u16, serde_json::Value) {
        let error = ApiError::JobFailed {
            code: code.to_owned(),
            message: message.to_owned(),
        };
        let (status, envelope) = error.status_and_body();
        (
            status.as_u16(),
            serde_json::to_value(envelope).unwrap_or(serde_json::Value::Null),
        )
    }
}
