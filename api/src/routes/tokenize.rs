//! `POST /tokenize` and `POST /detokenize` (vLLM / SGLang). The api holds no model, so each
//! becomes a small interactive job that the runner answers from the model's tokenizer and
//! chat template, without an engine step; the answer comes back in the job's `Final`.

use super::chat::{admit, follower};
use crate::auth::Caller;
use crate::cancel::CancelOnDrop;
use crate::error::ApiError;
use crate::extract::ApiJson;
use crate::openai::tokenize::{
    DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse,
};
use crate::state::AppState;
use crate::validate::{detokenize_model, tokenize_model, validate_detokenize, validate_tokenize};
use axum::extract::State;
use axum::Json;
use fallow_protocol::job::{GenerateRequest, JobEvent, Tokenized};
use fallow_scheduler::queue::{JobKind, NewJob};

pub async fn tokenize(
    State(state): State<AppState>,
    caller: Caller,
    ApiJson(wire): ApiJson<TokenizeRequest>,
) -> Result<Json<TokenizeResponse>, ApiError> {
    let model = tokenize_model(&wire)?;
    let (limits, served) = super::chat::limits(&state, &model, None).await?;
    let mut request = validate_tokenize(wire, &limits)?;
    served.apply(&mut request);
    let tokenized = run(&state, &caller, request).await?;
    Ok(Json(TokenizeResponse {
        count: tokenized.tokens.len(),
        tokens: tokenized.tokens,
        max_model_len: tokenized.max_model_len,
    }))
}

pub async fn detokenize(
    State(state): State<AppState>,
    caller: Caller,
    ApiJson(wire): ApiJson<DetokenizeRequest>,
) -> Result<Json<DetokenizeResponse>, ApiError> {
    let model = detokenize_model(&wire)?;
    let (_, served) = super::chat::limits(&state, &model, None).await?;
    let mut request = validate_detokenize(wire)?;
    served.apply(&mut request);
    let tokenized = run(&state, &caller, request).await?;
    Ok(Json(DetokenizeResponse {
        prompt: tokenized.text,
    }))
}

/// Enqueues the job and waits for its answer.
async fn run(
    state: &AppState,
    caller: &Caller,
    request: GenerateRequest,
) -> Result<Tokenized, ApiError> {
    admit(state).await?;
    let job = state
        .queue()
        .enqueue_admitted(&[NewJob {
            tenant_id: caller.tenant_id(),
            kind: JobKind::Interactive,
            priority: 0,
            request,
            max_attempts: state.config().max_attempts,
            request_id: None,
        }])
        .await?
        .into_iter()
        .next()
        .ok_or_else(|| ApiError::Internal("the enqueue returned no job id".into()))?;
    let mut guard = CancelOnDrop::new(state.queue().clone(), state.relay().clone(), job);
    let mut follower = follower(state, job);
    loop {
        for entry in follower.next_batch().await? {
            match entry.event {
                JobEvent::Final { completion } => {
                    guard.disarm();
                    return completion.tokenized.ok_or_else(|| {
                        ApiError::Internal("the runner answered without tokens".into())
                    });
                }
                JobEvent::Error { code, message } => {
                    guard.disarm();
                    return Err(ApiError::JobFailed { code, message });
                }
                JobEvent::Started { .. } | JobEvent::Delta { .. } => {}
            }
        }
    }
}
