//! `POST /v1/responses`: validate (through the chat rules), admit (rate limits, the queue's
//! limits), enqueue one interactive job, store the response (unless `store: false`), then
//! answer: the finished `response`, its typed events as SSE, or at once with `queued` for a
//! background response, which polls and streams later from any api process.

use super::chat::{admit, await_final, enqueue, follower, limits, refusal};
use super::REQUEST_ID_HEADER;
use crate::auth::Caller;
use crate::cancel::CancelOnDrop;
use crate::error::ApiError;
use crate::extract::ApiJson;
use crate::openai::response::finish_reason_str;
use crate::openai::responses::{
    parse_response_id, response_id, CreateResponseRequest, ResponseObject,
};
use crate::rate_limit;
use crate::responses::answer;
use crate::responses::sse::{response_sse, ResponseStream};
use crate::responses::store::{self, StoredResponse};
use crate::state::AppState;
use crate::validate::responses::{requested_model, validate_response, ValidResponse};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use fallow_protocol::job::FinishReason;
use serde_json::Value;
use std::time::Instant;
use tracing::Instrument;
use uuid::Uuid;

pub async fn create_response(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    ApiJson(wire): ApiJson<CreateResponseRequest>,
) -> Result<Response, ApiError> {
    metrics::counter!(crate::metrics::REQUESTS).increment(1);
    let started = Instant::now();
    let request_id = headers
        .get(REQUEST_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let span = tracing::info_span!(
        "response",
        request_id = request_id.as_deref().unwrap_or(""),
        job_id = tracing::field::Empty,
        model = tracing::field::Empty,
    );
    async move {
        let model = requested_model(&wire)?.to_owned();
        tracing::Span::current().record("model", model.as_str());
        let (limits, served) = limits(&state, &model, None).await?;
        let previous = match wire.previous_response_id.as_deref() {
            Some(id) => Some(previous_response(&state, &caller, id).await?),
            None => None,
        };
        let prior = previous
            .as_ref()
            .map(|(_, items)| items.clone())
            .unwrap_or_default();
        let created = state.queue().clock().now();
        let mut valid = validate_response(wire, prior, &limits, created.timestamp())?;
        served.apply(&mut valid.chat.request);
        admit(&state).await?;
        let reservation =
            rate_limit::admit(&state, &caller, std::slice::from_ref(&valid.chat.request)).await?;
        let job = enqueue(&state, &caller, &valid.chat, request_id).await?;
        reservation.hold(&state, &[job]).await;
        tracing::Span::current().record("job_id", tracing::field::display(job));
        tracing::info!(
            stream = valid.stream,
            background = valid.background,
            "job enqueued"
        );
        if valid.settings.store {
            let row = StoredResponse {
                id: job,
                tenant_id: caller.tenant_id(),
                model: model.clone(),
                previous_response_id: previous.map(|(id, _)| id),
                input_items: valid.input_items.clone(),
                context: valid.context.clone(),
                response: None,
                created_at: created,
            };
            if let Err(err) = store::insert(state.queue().pool(), &row).await {
                crate::cancel::cancel_job(state.queue().clone(), state.relay().clone(), job).await;
                return Err(err);
            }
        }
        if valid.stream {
            return stream_response(&state, job, model, &valid, started).await;
        }
        if valid.background {
            let queued = ResponseObject::new(response_id(job), model, &valid.settings, "queued");
            return Ok(Json(queued).into_response());
        }
        let guard = CancelOnDrop::new(state.queue().clone(), state.relay().clone(), job);
        let done = await_final(&state, guard).await?;
        let response = answer::from_completion(job, &model, &valid.chat.request.output, &done)
            .ok_or_else(|| ApiError::Internal("a response job without settings".into()))?;
        let value =
            serde_json::to_value(&response).map_err(|e| ApiError::Internal(e.to_string()))?;
        if valid.settings.store {
            store::finish(state.queue().pool(), job, &value).await?;
        }
        let reason = done
            .choices
            .first()
            .map_or(FinishReason::Stop, |c| c.finish_reason);
        crate::metrics::record_success(
            finish_reason_str(reason),
            started.elapsed().as_secs_f64(),
            &done.usage,
        );
        Ok(Json(value).into_response())
    }
    .instrument(span)
    .await
}

/// The stored response a request continues, and the items it was shown and answered: 400
/// naming `previous_response_id` when it is unknown, another tenant's, not stored, or has
/// not finished.
async fn previous_response(
    state: &AppState,
    caller: &Caller,
    id: &str,
) -> Result<(Uuid, Vec<Value>), ApiError> {
    let not_found = || {
        ApiError::invalid(
            "previous_response_id",
            format!("Previous response with id `{id}` not found."),
        )
    };
    let uuid = parse_response_id(id).ok_or_else(not_found)?;
    let stored = match store::get(state.queue().pool(), uuid).await? {
        Some(stored) if caller.may_see(stored.tenant_id) => stored,
        _ => return Err(not_found()),
    };
    let response = answer::current(state, &stored).await?;
    match response.get("status").and_then(Value::as_str) {
        Some("completed") | Some("incomplete") => {}
        Some("queued") | Some("in_progress") => {
            return Err(ApiError::invalid(
                "previous_response_id",
                format!("Previous response `{id}` has not finished yet; wait for it first."),
            ))
        }
        _ => {
            return Err(ApiError::invalid(
                "previous_response_id",
                format!("Previous response `{id}` did not complete; it cannot be continued."),
            ))
        }
    }
    let mut items = stored.context;
    if let Some(Value::Array(output)) = response.get("output") {
        items.extend(output.iter().cloned());
    }
    Ok((uuid, items))
}

/// Streams the job's events. A foreground response is committed only once the job's first
/// entries arrive, so a job refused up front still gets a proper HTTP status.
async fn stream_response(
    state: &AppState,
    job: Uuid,
    model: String,
    valid: &ValidResponse,
    started: Instant,
) -> Result<Response, ApiError> {
    let mut follower = follower(state, job);
    let mut guard = (!valid.background)
        .then(|| CancelOnDrop::new(state.queue().clone(), state.relay().clone(), job));
    let first = if valid.background {
        Vec::new()
    } else {
        let first = follower.next_batch().await?;
        if let Some((code, message)) = refusal(&first) {
            if let Some(guard) = guard.as_mut() {
                guard.disarm();
            }
            return Err(ApiError::JobFailed { code, message });
        }
        first
    };
    let builder = crate::responses::builder::ResponseBuilder::new(
        job,
        model,
        &valid.settings,
        &valid.chat.request.output,
        valid.background,
    );
    let stream = ResponseStream {
        follower,
        builder,
        guard,
        starting_after: None,
        store: valid
            .settings
            .store
            .then(|| (state.queue().pool().clone(), job)),
        started: Some(started),
        span: tracing::Span::current(),
    };
    Ok(response_sse(stream, first))
}
