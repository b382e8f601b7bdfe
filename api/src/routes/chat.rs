//! `POST /v1/chat/completions`: validate, admit (rate limits), enqueue an interactive job,
//! then relay its stream — as SSE chunks, or gathered into one `chat.completion`.

use super::REQUEST_ID_HEADER;
use crate::auth::Caller;
use crate::cancel::CancelOnDrop;
use crate::chunks::ChunkBuilder;
use crate::error::ApiError;
use crate::extract::ApiJson;
use crate::follow::JobFollower;
use crate::openai::request::ChatCompletionRequest;
use crate::openai::response::{completion_id, finish_reason_str, ChatCompletion};
use crate::parsers::{OutputCollector, ParsedChoice};
use crate::rate_limit;
use crate::sse::{sse_response, JobStream};
use crate::state::AppState;
use crate::validate::{
    requested_model, resolve, validate_chat, Limits, ModelParsers, ServedModel, ValidChat,
};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use fallow_protocol::job::{Completion, FinishReason, JobEvent};
use fallow_scheduler::queue::{JobKind, NewJob};
use fallow_scheduler::runners::ModelKind;
use fallow_scheduler::stream::StreamEntry;
use std::time::{Duration, Instant};
use tracing::Instrument;
use uuid::Uuid;

pub async fn create_chat_completion(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    ApiJson(wire): ApiJson<ChatCompletionRequest>,
) -> Result<Response, ApiError> {
    metrics::counter!(crate::metrics::REQUESTS).increment(1);
    let started = Instant::now();
    let request_id = headers
        .get(REQUEST_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let span = tracing::info_span!(
        "chat_completion",
        request_id = request_id.as_deref().unwrap_or(""),
        job_id = tracing::field::Empty,
        model = tracing::field::Empty,
    );
    async move {
        let model = requested_model(&wire)?.to_owned();
        tracing::Span::current().record("model", model.as_str());
        let lora_path = wire.extra.get("lora_path").cloned();
        let (limits, served) = limits(&state, &model, lora_path.as_ref()).await?;
        let mut valid = validate_chat(wire, &limits)?;
        served.apply(&mut valid.request);
        admit(&state).await?;
        let reservation =
            rate_limit::admit(&state, &caller, std::slice::from_ref(&valid.request)).await?;
        let job = enqueue(&state, &caller, &valid, request_id).await?;
        reservation.hold(&state, &[job]).await;
        tracing::Span::current().record("job_id", tracing::field::display(job));
        tracing::info!(
            stream = valid.delivery.stream,
            n = valid.request.n,
            "job enqueued"
        );
        let created = state.queue().clock().now().timestamp();
        if valid.delivery.stream {
            stream_job(&state, job, created, model, &valid, started).await
        } else {
            let (body, parsed) = await_completion(&state, job, &valid, started).await?;
            let format = &valid.request.output;
            Ok(Json(ChatCompletion::from_parsed(
                completion_id(job),
                created,
                model,
                &body,
                parsed,
                format,
            ))
            .into_response())
        }
    }
    .instrument(span)
    .await
}

/// The limits of a request for `model` (which must be served, and generate text), and the
/// model as runners serve it: a base model, or a LoRA adapter over one (`BASE:NAME`, or a
/// base with SGLang's `lora_path`).
pub(super) async fn limits(
    state: &AppState,
    model: &str,
    lora_path: Option<&serde_json::Value>,
) -> Result<(Limits, ServedModel), ApiError> {
    let models = state.catalog().list().await?;
    let (entry, served) = resolve(&models, model, lora_path)?;
    if entry.kind == ModelKind::Embedding {
        return Err(ApiError::invalid(
            "model",
            format!("`{model}` is an embedding model: it answers `/v1/embeddings` only."),
        ));
    }
    let config = state.config();
    let limits = Limits {
        max_messages: config.max_messages,
        max_n: config.max_n,
        // A runner that could not tell its context length (0) imposes no bound here;
        // the engine still refuses what does not fit.
        context_length: match entry.context_length {
            0 => u32::MAX,
            n => n,
        },
        parsers: ModelParsers {
            tool: entry.tool_parser.clone(),
            reasoning: entry.reasoning_parser.clone(),
        },
    };
    Ok((limits, served))
}

/// Refuses work the system cannot take now: a global queue over its limit (429 with
/// `Retry-After`). The tenant's own limit is enforced by the enqueue itself
/// ([`Queue::enqueue_admitted`](fallow_scheduler::queue::Queue::enqueue_admitted)), atomically.
pub(super) async fn admit(state: &AppState) -> Result<(), ApiError> {
    let queued = state.queue().queued_interactive().await?;
    let limit = state.config().global_queue_limit;
    if queued >= limit {
        return Err(ApiError::RateLimited {
            message: format!("The server is overloaded: {queued} requests are queued (limit {limit}). Retry later."),
            retry_after: Duration::from_secs(5),
        });
    }
    Ok(())
}

/// Enqueues the job within the tenant's active-job limit (429 when over it).
pub(super) async fn enqueue(
    state: &AppState,
    caller: &Caller,
    valid: &ValidChat,
    request_id: Option<String>,
) -> Result<Uuid, ApiError> {
    let job = NewJob {
        tenant_id: caller.tenant_id(),
        kind: JobKind::Interactive,
        priority: valid.priority,
        request: valid.request.clone(),
        max_attempts: state.config().max_attempts,
        request_id,
    };
    let ids = state
        .queue()
        .enqueue_admitted(std::slice::from_ref(&job))
        .await?;
    ids.into_iter()
        .next()
        .ok_or_else(|| ApiError::Internal("the enqueue returned no job id".into()))
}

/// Streams the job as SSE. The response is committed only once the job's first entries
/// arrive, so a job refused up front (prompt too long, bad request) still gets a proper
/// HTTP status instead of a 200 carrying an error event.
async fn stream_job(
    state: &AppState,
    job: Uuid,
    created: i64,
    model: String,
    valid: &ValidChat,
    started: Instant,
) -> Result<Response, ApiError> {
    let mut guard = CancelOnDrop::new(state.queue().clone(), state.relay().clone(), job);
    let mut follower = follower(state, job);
    let first = follower.next_batch().await?;
    if let Some((code, message)) = refusal(&first) {
        guard.disarm();
        return Err(ApiError::JobFailed { code, message });
    }
    let builder = ChunkBuilder::new(
        completion_id(job),
        created,
        model,
        valid.request.n,
        valid.delivery,
        false,
    )
    .with_output(&valid.request.output, job);
    let stream = JobStream {
        follower,
        builder,
        guard: Some(guard),
        started: Some(started),
        span: tracing::Span::current(),
    };
    Ok(sse_response(stream, first))
}

/// An `Error` that comes before any text: the job was refused, not interrupted.
pub(super) fn refusal(entries: &[StreamEntry]) -> Option<(String, String)> {
    for entry in entries {
        match &entry.event {
            JobEvent::Started { .. } => continue,
            JobEvent::Error { code, message } => return Some((code.clone(), message.clone())),
            JobEvent::Delta { .. } | JobEvent::Final { .. } => return None,
        }
    }
    None
}

/// Waits for the job's `Final` (or `Error`), parsing the deltas as they come (they carry
/// the token counts of the reasoning). If this future is dropped first — the client hung
/// up — or the deadline passes, the guard cancels the job.
async fn await_completion(
    state: &AppState,
    job: Uuid,
    valid: &ValidChat,
    started: Instant,
) -> Result<(Completion, Vec<ParsedChoice>), ApiError> {
    let mut guard = CancelOnDrop::new(state.queue().clone(), state.relay().clone(), job);
    let mut follower = follower(state, job);
    let mut collector = OutputCollector::new(&valid.request.output, job, valid.request.n);
    let mut first_token = false;
    loop {
        for entry in follower.next_batch().await? {
            match entry.event {
                JobEvent::Final { completion } => {
                    guard.disarm();
                    let reason = completion
                        .choices
                        .first()
                        .map_or(FinishReason::Stop, |c| c.finish_reason);
                    let e2e = started.elapsed().as_secs_f64();
                    crate::metrics::record_success(
                        finish_reason_str(reason),
                        e2e,
                        &completion.usage,
                    );
                    let parsed = collector.finish(&completion);
                    return Ok((completion, parsed));
                }
                JobEvent::Error { code, message } => {
                    guard.disarm();
                    return Err(ApiError::JobFailed { code, message });
                }
                JobEvent::Delta {
                    index, text, usage, ..
                } => {
                    if !first_token {
                        first_token = true;
                        metrics::histogram!(crate::metrics::TTFT)
                            .record(started.elapsed().as_secs_f64());
                    }
                    collector.on_delta(index, &text, &usage);
                }
                JobEvent::Started { .. } => {}
            }
        }
    }
}

/// Waits for a job's `Final`; a job error is the request's error. If this future is
/// dropped first (the client hung up) or the deadline passes, the guard cancels the job.
pub(super) async fn await_final(
    state: &AppState,
    mut guard: CancelOnDrop,
) -> Result<Completion, ApiError> {
    let mut follower = follower(state, guard.job());
    loop {
        for entry in follower.next_batch().await? {
            match entry.event {
                JobEvent::Final { completion } => {
                    guard.disarm();
                    return Ok(completion);
                }
                JobEvent::Error { code, message } => {
                    guard.disarm();
                    return Err(ApiError::JobFailed { code, message });
                }
                JobEvent::Delta { .. } | JobEvent::Started { .. } => {}
            }
        }
    }
}

pub(super) fn follower(state: &AppState, job: Uuid) -> JobFollower {
    JobFollower::new(
        state.queue().clone(),
        state.relay().clone(),
        job,
        "0".to_owned(),
        state.config().request_timeout,
    )
}
