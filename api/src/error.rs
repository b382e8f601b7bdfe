//! The api's one error type and its one table to HTTP: every failure a client can see is an
//! [`ApiError`], and [`ApiError::status_and_body`] is the only place that decides its status
//! code and OpenAI-style envelope (`{"error":{"message","type","param","code"}}`). Streams
//! reuse the same envelope for their in-band error event.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use fallow_scheduler::SchedulerError;
use serde::Serialize;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The body is not valid JSON, has a wrong type, or breaks a validation rule.
    #[error("{message}")]
    InvalidRequest {
        message: String,
        param: Option<String>,
        code: Option<&'static str>,
    },
    #[error("You didn't provide an API key. Send it as `Authorization: Bearer <key>`.")]
    MissingApiKey,
    #[error("Incorrect API key provided.")]
    InvalidApiKey,
    /// The runner API was called without a live runner token.
    #[error("The runner API needs a live runner token as `Authorization: Bearer <token>`; this one is missing, unknown or revoked.")]
    InvalidRunnerToken,
    /// Authenticated, but not allowed here (a tenant key on the admin API).
    #[error("{0}")]
    PermissionDenied(String),
    #[error("The model `{0}` does not exist or you do not have access to it.")]
    ModelNotFound(String),
    /// An unknown route, job or resource.
    #[error("{0}")]
    NotFound(String),
    #[error("Method {0} is not allowed for this URL.")]
    MethodNotAllowed(String),
    /// The completion exists but has not finished yet.
    #[error("{0}")]
    NotFinished(String),
    /// The request clashes with what exists (a live runner token's name); `code` says how.
    #[error("{message}")]
    Conflict { message: String, code: &'static str },
    #[error("Request body too large: the limit is {limit} bytes.")]
    PayloadTooLarge { limit: usize },
    /// A body sent with another `Content-Type` than the endpoint reads.
    #[error("Unsupported Content-Type {got}: this endpoint expects `{expected}`.")]
    UnsupportedMediaType { expected: &'static str, got: String },
    #[error("{message}")]
    RateLimited {
        message: String,
        retry_after: Duration,
    },
    /// A tenant's requests or tokens per minute are used up; `limit` (`requests` or
    /// `tokens`) is the error's `type`, as OpenAI sends it.
    #[error("{message}")]
    RateLimitReached {
        limit: &'static str,
        message: String,
        retry_after: Duration,
    },
    /// Postgres or Redis is unreachable.
    #[error("The service is temporarily unavailable: {0}")]
    Unavailable(String),
    #[error("The request timed out after {}s waiting for the model; the job was cancelled.", .0.as_secs())]
    Timeout(Duration),
    /// The job ended with an error reported by its runner (or the reaper).
    #[error("{message}")]
    JobFailed { code: String, message: String },
    #[error("Internal server error: {0}")]
    Internal(String),
}

/// OpenAI's error envelope.
#[derive(Debug, Serialize)]
pub struct ErrorEnvelope {
    pub error: ErrorBody,
}

#[derive(Debug, Serialize)]
pub struct ErrorBody {
    pub message: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<String>,
}

impl ApiError {
    /// A validation failure naming the offending parameter.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError::InvalidRequest {
            message: message.into(),
            param: Some(param.into()),
            code: None,
        }
    }

    /// The table: status, `type` and `code` of every error.
    fn table(&self) -> (StatusCode, &'static str, Option<&str>) {
        use StatusCode as S;
        const INVALID: &str = "invalid_request_error";
        match self {
            ApiError::InvalidRequest { code, .. } => (S::BAD_REQUEST, INVALID, *code),
            ApiError::MissingApiKey | ApiError::InvalidApiKey => (
                S::UNAUTHORIZED,
                "authentication_error",
                Some("invalid_api_key"),
            ),
            ApiError::InvalidRunnerToken => (
                S::UNAUTHORIZED,
                "authentication_error",
                Some("invalid_runner_token"),
            ),
            ApiError::PermissionDenied(_) => {
                (S::FORBIDDEN, "permission_error", Some("permission_denied"))
            }
            ApiError::ModelNotFound(_) => (S::NOT_FOUND, INVALID, Some("model_not_found")),
            ApiError::NotFound(_) => (S::NOT_FOUND, INVALID, Some("not_found")),
            ApiError::MethodNotAllowed(_) => {
                (S::METHOD_NOT_ALLOWED, INVALID, Some("method_not_allowed"))
            }
            ApiError::NotFinished(_) => (S::CONFLICT, INVALID, Some("completion_not_finished")),
            ApiError::Conflict { code, .. } => (S::CONFLICT, INVALID, Some(code)),
            ApiError::PayloadTooLarge { .. } => {
                (S::PAYLOAD_TOO_LARGE, INVALID, Some("payload_too_large"))
            }
            ApiError::UnsupportedMediaType { .. } => (
                S::UNSUPPORTED_MEDIA_TYPE,
                INVALID,
                Some("unsupported_media_type"),
            ),
            ApiError::RateLimited { .. } => (
                S::TOO_MANY_REQUESTS,
                "rate_limit_error",
                Some("rate_limit_exceeded"),
            ),
            ApiError::RateLimitReached { limit, .. } => {
                (S::TOO_MANY_REQUESTS, *limit, Some("rate_limit_exceeded"))
            }
            ApiError::Unavailable(_) => (
                S::SERVICE_UNAVAILABLE,
                "service_unavailable_error",
                Some("service_unavailable"),
            ),
            ApiError::Timeout(_) => (S::GATEWAY_TIMEOUT, "timeout_error", Some("timeout")),
            ApiError::JobFailed { code, .. } => {
                let (status, kind) = job_error_status(code);
                (status, kind, Some(code.as_str()))
            }
            ApiError::Internal(_) => (S::INTERNAL_SERVER_ERROR, "server_error", None),
        }
    }

    /// The request parameter an error is about, if any.
    fn param(&self) -> Option<String> {
        match self {
            ApiError::InvalidRequest { param, .. } => param.clone(),
            ApiError::ModelNotFound(_) => Some("model".into()),
            _ => None,
        }
    }

    /// Status and OpenAI envelope of this error.
    pub fn status_and_body(&self) -> (StatusCode, ErrorEnvelope) {
        let (status, kind, code) = self.table();
        let body = ErrorBody {
            message: self.to_string(),
            kind,
            param: self.param(),
            code: code.map(str::to_owned),
        };
        (status, ErrorEnvelope { error: body })
    }
}

/// Status and `type` for an error code a runner reported on the job stream.
fn job_error_status(code: &str) -> (StatusCode, &'static str) {
    match code {
        "context_length_exceeded"
        | "invalid_request"
        | "invalid_request_error"
        | "preparation_timeout" => (StatusCode::BAD_REQUEST, "invalid_request_error"),
        "model_not_found" => (StatusCode::NOT_FOUND, "invalid_request_error"),
        "overloaded" | "unavailable" | "runner_lost" | "runner_shutdown" | "runner_yielded" => {
            (StatusCode::SERVICE_UNAVAILABLE, "service_unavailable_error")
        }
        "timeout" => (StatusCode::GATEWAY_TIMEOUT, "timeout_error"),
        _ => (StatusCode::INTERNAL_SERVER_ERROR, "server_error"),
    }
}

impl From<SchedulerError> for ApiError {
    fn from(err: SchedulerError) -> Self {
        match err {
            SchedulerError::Database(_) | SchedulerError::Redis(_) => {
                ApiError::Unavailable(err.to_string())
            }
            SchedulerError::NotFound(what) => ApiError::NotFound(what),
            SchedulerError::TenantOverLimit { active, asked, limit } => ApiError::RateLimited {
                message: format!(
                    "Rate limit reached: {active} requests in flight for this API key and {asked} more asked; the limit is {limit}."
                ),
                retry_after: Duration::from_secs(1),
            },
            SchedulerError::Store(fallow_scheduler::store::StoreError::NotFound(_)) => {
                ApiError::NotFound("The file's contents are missing from the object store.".into())
            }
            SchedulerError::Store(fallow_scheduler::store::StoreError::S3(_)) => {
                ApiError::Unavailable(err.to_string())
            }
            SchedulerError::Migrate(_)
            | SchedulerError::MigrationsPending { .. }
            | SchedulerError::Corrupt(_)
            | SchedulerError::Store(_) => {
                ApiError::Internal(err.to_string())
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, envelope) = self.status_and_body();
        metrics::counter!(crate::metrics::REQUEST_ERRORS, "type" => envelope.error.kind)
            .increment(1);
        if status.is_server_error() {
            tracing::warn!(status = status.as_u16(), error = %self, "request failed");
        } else {
            tracing::debug!(status = status.as_u16(), error = %self, "request rejected");
        }
        let mut response = (status, axum::Json(envelope)).into_response();
        if let ApiError::RateLimited { retry_after, .. }
        | ApiError::RateLimitReached { retry_after, .. } = &self
        {
            // Whole seconds, rounded up so a client never retries before the reset; the
            // milliseconds too, which OpenAI's SDKs read first.
            let millis = retry_after.as_millis().max(1);
            let secs = millis.div_ceil(1000).to_string();
            if let Ok(value) = HeaderValue::from_str(&secs) {
                response.headers_mut().insert(header::RETRY_AFTER, value);
            }
            if let Ok(value) = HeaderValue::from_str(&millis.to_string()) {
                response.headers_mut().insert("retry-after-ms", value);
            }
        }
        response
    }
}

#[cfg(test)]
#[path = "error_tests.rs"]
mod tests;
