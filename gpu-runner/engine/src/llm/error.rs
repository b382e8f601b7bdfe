//! What can go wrong in the engine loop, with stable machine-readable codes.

use crate::backend::BackendError;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The request breaks a rule that no amount of waiting fixes (names the field).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// Prompt plus `max_tokens` exceed the model's context or the KV pool.
    #[error("{0}")]
    ContextLengthExceeded(String),
    #[error("request {0} is already in the engine")]
    DuplicateRequest(u64),
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// Bookkeeping disagreed with itself; the engine should be rebuilt.
    #[error("engine invariant broken: {0}")]
    Internal(String),
}

impl EngineError {
    /// A stable code for job events and API errors.
    pub fn code(&self) -> &'static str {
        match self {
            EngineError::InvalidRequest(_) => "invalid_request",
            EngineError::ContextLengthExceeded(_) => "context_length_exceeded",
            EngineError::DuplicateRequest(_) => "duplicate_request",
            EngineError::Backend(_) => "backend_error",
            EngineError::Internal(_) => "internal_error",
        }
    }

    /// Whether the request itself is at fault (as opposed to the engine).
    pub fn is_client_error(&self) -> bool {
        matches!(
            self,
            EngineError::InvalidRequest(_)
                | EngineError::ContextLengthExceeded(_)
                | EngineError::DuplicateRequest(_)
        )
    }
}
