//! `POST /v1/embeddings`: validate against the model's entry (an embedding model), admit
//! (rate limits), enqueue an interactive job, wait for its vectors.

use super::chat::{admit, await_final};
use crate::auth::Caller;
use crate::cancel::CancelOnDrop;
use crate::error::ApiError;
use crate::extract::ApiJson;
use crate::openai::embeddings::{EmbeddingList, EmbeddingRequest};
use crate::rate_limit;
use crate::state::AppState;
use crate::validate::{embedding_model, validate_embeddings};
use axum::extract::State;
use axum::Json;
use fallow_scheduler::queue::{JobKind, NewJob};
use std::time::Instant;

pub async fn create_embeddings(
    State(state): State<AppState>,
    caller: Caller,
    ApiJson(wire): ApiJson<EmbeddingRequest>,
) -> Result<Json<EmbeddingList>, ApiError> {
    metrics::counter!(crate::metrics::REQUESTS).increment(1);
    let started = Instant::now();
    let model = embedding_model(&wire)?;
    let entry = state.catalog().find(&model).await?;
    let request = validate_embeddings(wire, &entry)?;
    let format = request.output.embeddings.unwrap_or_default();
    admit(&state).await?;
    let reservation = rate_limit::admit(&state, &caller, std::slice::from_ref(&request)).await?;
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
    reservation.hold(&state, &[job]).await;
    let guard = CancelOnDrop::new(state.queue().clone(), state.relay().clone(), job);
    let completion = await_final(&state, guard).await?;
    crate::metrics::record_success("stop", started.elapsed().as_secs_f64(), &completion.usage);
    Ok(Json(EmbeddingList::from_completion(
        model,
        format,
        &completion,
    )?))
}
