//! `POST /v1/completions` (the legacy completions API): validate, admit, enqueue one
//! interactive job per prompt (each with the request's `n`), then gather their results into
//! one `text_completion`, or merge their streams into one SSE stream of chunks.

use super::chat::{admit, await_final, follower, refusal};
use super::REQUEST_ID_HEADER;
use crate::auth::Caller;
use crate::cancel::CancelOnDrop;
use crate::error::ApiError;
use crate::extract::ApiJson;
use crate::openai::completions::{text_completion_id, CompletionRequest, TextCompletion};
use crate::state::AppState;
use crate::text_chunks::{TextChunkBuilder, TextFrame};
use crate::validate::{requested_model, validate_completion, ValidCompletion};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::Event;
use axum::response::{IntoResponse, Response};
use axum::Json;
use fallow_protocol::job::{Completion, JobEvent, TextFormat};
use fallow_scheduler::queue::{JobKind, NewJob};
use fallow_scheduler::stream::StreamEntry;
use futures::stream::{self, Stream, StreamExt};
use std::collections::VecDeque;
use tracing::Instrument;
use uuid::Uuid;

pub async fn create_completion(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    ApiJson(wire): ApiJson<CompletionRequest>,
) -> Result<Response, ApiError> {
    metrics::counter!(crate::metrics::REQUESTS).increment(1);
    let request_id = headers
        .get(REQUEST_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let span = tracing::info_span!(
        "completion",
        request_id = request_id.as_deref().unwrap_or(""),
        model = tracing::field::Empty,
    );
    async move {
        let model = requested_model(&wire.common)?.to_owned();
        tracing::Span::current().record("model", model.as_str());
        let lora_path = wire.common.extra.get("lora_path").cloned();
        let (limits, served) = super::chat::limits(&state, &model, lora_path.as_ref()).await?;
        let valid = validate_completion(wire, &limits)?;
        admit(&state).await?;
        let requests: Vec<_> = valid
            .jobs()
            .map(|mut request| {
                served.apply(&mut request);
                request
            })
            .collect();
        let reservation = crate::rate_limit::admit(&state, &caller, &requests).await?;
        // All prompts in one admission: each is a job, and all of them count against the
        // tenant's active-job limit, or none is enqueued.
        let new_jobs: Vec<NewJob> = requests
            .into_iter()
            .map(|request| NewJob {
                tenant_id: caller.tenant_id(),
                kind: JobKind::Interactive,
                priority: valid.priority,
                request,
                max_attempts: state.config().max_attempts,
                request_id: request_id.clone(),
            })
            .collect();
        let jobs: Vec<CancelOnDrop> = state
            .queue()
            .enqueue_admitted(&new_jobs)
            .await?
            .into_iter()
            .map(|id| CancelOnDrop::new(state.queue().clone(), state.relay().clone(), id))
            .collect();
        let ids: Vec<Uuid> = jobs.iter().map(CancelOnDrop::job).collect();
        reservation.hold(&state, &ids).await;
        tracing::info!(
            jobs = ids.len(),
            stream = valid.delivery.stream,
            "completion jobs enqueued"
        );
        let id = text_completion_id(ids[0]);
        let created = state.queue().clock().now().timestamp();
        if valid.delivery.stream {
            stream_jobs(&state, jobs, id, created, model, &valid).await
        } else {
            let completions = await_jobs(&state, jobs).await?;
            let echo: Vec<Option<String>> = if valid.echo {
                valid.prompt_texts.clone()
            } else {
                vec![None; completions.len()]
            };
            let format = TextFormat {
                logprobs: valid.logprobs,
                echo: valid.echo,
            };
            let body = TextCompletion::from_jobs(
                id,
                created,
                model,
                valid.n,
                &format,
                &echo,
                &completions,
            );
            Ok(Json(body).into_response())
        }
    }
    .instrument(span)
    .await
}

/// Waits for every job's `Final`; the first error fails the request (the guards of the
/// other jobs cancel them).
async fn await_jobs(
    state: &AppState,
    guards: Vec<CancelOnDrop>,
) -> Result<Vec<Completion>, ApiError> {
    let waits = guards.into_iter().map(|guard| await_final(state, guard));
    futures::future::try_join_all(waits).await
}

/// Streams the jobs as one SSE stream. Each job's first entries are read before the
/// response is committed, so a job refused up front still gets a proper HTTP status.
async fn stream_jobs(
    state: &AppState,
    guards: Vec<CancelOnDrop>,
    id: String,
    created: i64,
    model: String,
    valid: &ValidCompletion,
) -> Result<Response, ApiError> {
    let mut builder = TextChunkBuilder::new(id, created, model, valid);
    let mut pending = VecDeque::new();
    let mut sources = Vec::with_capacity(guards.len());
    for (prompt, mut guard) in guards.into_iter().enumerate() {
        let mut follower = follower(state, guard.job());
        let first = follower.next_batch().await?;
        if let Some((code, message)) = refusal(&first) {
            guard.disarm();
            return Err(ApiError::JobFailed { code, message });
        }
        let ended = first.iter().any(|e| ends_job(&e.event));
        if ended {
            guard.disarm();
        }
        for entry in &first {
            pending.extend(builder.on_event(prompt, &entry.event));
        }
        if !ended {
            sources.push(job_entries(prompt, follower, guard).boxed());
        }
    }
    let merged = stream::select_all(sources);
    let events = stream::unfold(
        (builder, pending, merged, false),
        |(mut builder, mut pending, mut merged, mut closed)| async move {
            loop {
                if let Some(frame) = pending.pop_front() {
                    return Some((Ok(to_event(frame)), (builder, pending, merged, closed)));
                }
                if closed {
                    return None;
                }
                if builder.is_done() {
                    closed = true;
                    return Some((
                        Ok(Event::default().data("[DONE]")),
                        (builder, pending, merged, closed),
                    ));
                }
                match merged.next().await {
                    Some((prompt, Ok(entries))) => {
                        for entry in &entries {
                            pending.extend(builder.on_event(prompt, &entry.event));
                        }
                    }
                    Some((_, Err(err))) => {
                        pending.push_back(TextFrame::Error(err));
                        closed = true;
                        pending.push_back(TextFrame::Done);
                    }
                    None => {
                        closed = true;
                        pending.push_back(TextFrame::Done);
                    }
                }
            }
        },
    );
    Ok(crate::sse::sse_events(events))
}

type Batch = (usize, Result<Vec<StreamEntry>, ApiError>);

/// One job's entries, batch by batch, until its `Final` or `Error`; the guard cancels the
/// job if the stream is dropped before.
fn job_entries(
    prompt: usize,
    follower: crate::follow::JobFollower,
    guard: CancelOnDrop,
) -> impl Stream<Item = Batch> + Send {
    stream::unfold(Some((follower, guard)), move |state| async move {
        let (mut follower, mut guard) = state?;
        match follower.next_batch().await {
            Ok(entries) => {
                if entries.iter().any(|e| ends_job(&e.event)) {
                    guard.disarm();
                    Some(((prompt, Ok(entries)), None))
                } else {
                    Some(((prompt, Ok(entries)), Some((follower, guard))))
                }
            }
            // The guard stays armed: a timed out or broken stream cancels its job.
            Err(err) => Some(((prompt, Err(err)), None)),
        }
    })
}

fn ends_job(event: &JobEvent) -> bool {
    matches!(event, JobEvent::Final { .. } | JobEvent::Error { .. })
}

fn to_event(frame: TextFrame) -> Event {
    let data = match frame {
        TextFrame::Done => return Event::default().data("[DONE]"),
        TextFrame::Chunk(chunk) => serde_json::to_string(&chunk),
        TextFrame::Error(err) => serde_json::to_string(&err.status_and_body().1),
    };
    Event::default().data(data.unwrap_or_else(|err| {
        format!(r#"{{"error":{{"message":"could not encode a chunk: {err}","type":"server_error","param":null,"code":null}}}}"#)
    }))
}
