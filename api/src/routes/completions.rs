//! Finished and in-flight completions by id: `GET /v1/chat/completions/{id}` returns the
//! stored result (Postgres), `GET /v1/chat/completions/{id}/stream` replays or resumes the
//! SSE stream (Redis) after `Last-Event-ID`. Another tenant's job is reported as unknown.

use crate::auth::Caller;
use crate::chunks::ChunkBuilder;
use crate::error::ApiError;
use crate::follow::{aborted, JobFollower};
use crate::openai::response::{completion_id, ChatCompletion};
use crate::sse::{sse_response, JobStream};
use crate::state::AppState;
use crate::validate::Delivery;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::HeaderMap;
use axum::response::Response;
use axum::Json;
use fallow_scheduler::queue::{JobRecord, JobState};
use uuid::Uuid;

pub async fn get_chat_completion(
    State(state): State<AppState>,
    caller: Caller,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<ChatCompletion>, ApiError> {
    let record = visible_job(&state, &caller, id).await?;
    let completion = match record.state {
        JobState::Succeeded | JobState::Cancelled => record
            .result
            .clone()
            .unwrap_or_else(|| aborted(record.request.n)),
        JobState::Failed => {
            return Err(ApiError::JobFailed {
                code: "job_failed".into(),
                message: record.error.unwrap_or_else(|| "The job failed.".into()),
            })
        }
        JobState::Queued | JobState::Running => {
            return Err(ApiError::NotFinished(format!(
                "The completion {} has not finished yet; poll again or follow its stream.",
                completion_id(record.id)
            )))
        }
    };
    Ok(Json(ChatCompletion::from_completion(
        record.id,
        record.created_at.timestamp(),
        record.model,
        &completion,
        &record.request.output,
    )))
}

/// Replays the job's stream from the start, or resumes it after `Last-Event-ID`. Usage
/// chunks are opt-in with `?include_usage=true` / `?continuous_usage_stats=true` (the
/// original request's stream options are not stored). Leaving this stream never cancels
/// the job: its reader is an observer, the original request owns the job.
pub async fn resume_chat_stream(
    State(state): State<AppState>,
    caller: Caller,
    id: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let record = visible_job(&state, &caller, id).await?;
    let after = last_event_id(&headers)?;
    let query = query.unwrap_or_default();
    let flag = |name: &str| query.split('&').any(|kv| kv == format!("{name}=true"));
    let delivery = Delivery {
        stream: true,
        include_usage: flag("include_usage"),
        continuous_usage: flag("continuous_usage_stats"),
    };
    // The stream is replayed from its start so that the parsers see every delta (a tool
    // call or a reasoning block may span the resume point); the builder sends only what
    // comes after `after`.
    let follower = JobFollower::new(
        state.queue().clone(),
        state.relay().clone(),
        record.id,
        "0".to_owned(),
        state.config().request_timeout,
    )
    .check_row_early();
    let builder = ChunkBuilder::new(
        completion_id(record.id),
        record.created_at.timestamp(),
        record.model,
        record.request.n,
        delivery,
        false,
    )
    .with_output(&record.request.output, record.id)
    .replaying_through(&after);
    Ok(sse_response(
        JobStream {
            follower,
            builder,
            guard: None,
            started: None,
            span: tracing::Span::current(),
        },
        Vec::new(),
    ))
}

/// The `Last-Event-ID` to resume after (`"0"` = from the start). Redis entry ids are
/// `<milliseconds>-<sequence>`.
fn last_event_id(headers: &HeaderMap) -> Result<String, ApiError> {
    let Some(value) = headers.get("last-event-id") else {
        return Ok("0".to_owned());
    };
    let value = value.to_str().unwrap_or("").trim();
    let valid = !value.is_empty()
        && value.split('-').count() <= 2
        && value
            .split('-')
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    if !valid {
        return Err(ApiError::invalid(
            "Last-Event-ID",
            format!(
                "`Last-Event-ID` must be a stream entry id like `1718000000000-0`, got `{value}`."
            ),
        ));
    }
    Ok(value.to_owned())
}

/// The job behind a public completion id, if it exists and the caller may see it.
async fn visible_job(
    state: &AppState,
    caller: &Caller,
    id: Result<Path<String>, PathRejection>,
) -> Result<JobRecord, ApiError> {
    let raw = id.map(|Path(id)| id).unwrap_or_default();
    let not_found = || ApiError::NotFound(format!("No chat completion found with id `{raw}`."));
    let uuid = parse_completion_id(&raw).ok_or_else(not_found)?;
    match state.queue().get(uuid).await? {
        Some(record) if caller.may_see(record.tenant_id) => Ok(record),
        _ => Err(not_found()),
    }
}

/// `chatcmpl-<uuid>` (or a bare uuid, with or without dashes).
pub fn parse_completion_id(id: &str) -> Option<Uuid> {
    Uuid::parse_str(id.strip_prefix("chatcmpl-").unwrap_or(id)).ok()
}
