//! A stored response by id: `GET /v1/responses/{id}` (the object, or with `?stream=true` its
//! events again, after `starting_after`), `POST …/cancel` (background responses),
//! `DELETE …`, and `GET …/input_items` (a page of its input items). Unknown ids, another
//! tenant's responses and `store: false` responses are all 404.

use crate::auth::Caller;
use crate::error::ApiError;
use crate::follow::JobFollower;
use crate::openai::responses::{parse_response_id, response_id};
use crate::responses::answer;
use crate::responses::sse::{response_sse, ResponseStream};
use crate::responses::store::{self, StoredResponse};
use crate::state::AppState;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use std::time::Duration;

/// `input_items` pages hold at most this many items (OpenAI's bound), 20 by default.
const MAX_PAGE: usize = 100;
const DEFAULT_PAGE: usize = 20;

pub async fn get_response(
    State(state): State<AppState>,
    caller: Caller,
    id: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let stored = visible(&state, &caller, id).await?;
    let query = Query::parse(query.as_deref());
    if query.flag("stream")? {
        return resume(&state, &stored, query.number("starting_after")?).await;
    }
    Ok(Json(answer::current(&state, &stored).await?).into_response())
}

/// The response's events from the start of its job's stream, those after `starting_after`
/// sent. Leaving it never cancels the job.
async fn resume(
    state: &AppState,
    stored: &StoredResponse,
    starting_after: Option<u64>,
) -> Result<Response, ApiError> {
    let Some(record) = state.queue().get(stored.id).await? else {
        return Err(ApiError::invalid(
            "stream",
            format!(
                "The events of `{}` are no longer available; retrieve it without `stream`.",
                response_id(stored.id)
            ),
        ));
    };
    // A finished job's stream expires; rebuilt from its final record, its events would be
    // numbered differently from those the client saw, so it may only start over.
    if starting_after.is_some()
        && record.state.is_finished()
        && !state.relay().exists(record.id).await?
    {
        return Err(ApiError::invalid(
            "starting_after",
            format!(
                "The event stream of `{}` has expired, so its events cannot be resumed where you left off; stream it again without `starting_after`, or retrieve it without `stream`.",
                response_id(stored.id)
            ),
        ));
    }
    let settings = answer::settings(&record.request.output)
        .ok_or_else(|| ApiError::Internal("a stored response's job is not a response".into()))?;
    let follower = JobFollower::new(
        state.queue().clone(),
        state.relay().clone(),
        record.id,
        "0".to_owned(),
        state.config().request_timeout,
    )
    .check_row_early();
    let stream = ResponseStream {
        follower,
        builder: answer::builder(&record, &settings),
        guard: None,
        starting_after,
        store: None,
        started: None,
        span: tracing::Span::current(),
    };
    Ok(response_sse(stream, Vec::new()))
}

pub async fn cancel_response(
    State(state): State<AppState>,
    caller: Caller,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let stored = visible(&state, &caller, id).await?;
    let current = answer::current(&state, &stored).await?;
    if current.get("background") != Some(&Value::Bool(true)) {
        return Err(ApiError::invalid(
            "response_id",
            "Only responses created with `background: true` can be cancelled.",
        ));
    }
    if !matches!(
        current.get("status").and_then(Value::as_str),
        Some("queued" | "in_progress")
    ) {
        return Ok(Json(current));
    }
    crate::cancel::cancel_job(state.queue().clone(), state.relay().clone(), stored.id).await;
    // A running job stops within an engine step or two; wait briefly for its row to end.
    for _ in 0..50 {
        let now = answer::current(&state, &stored).await?;
        if !matches!(
            now.get("status").and_then(Value::as_str),
            Some("queued" | "in_progress")
        ) {
            return Ok(Json(now));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Still running: its runner has been told; it reads as cancelled from now on.
    let mut now = answer::current(&state, &stored).await?;
    if let Some(obj) = now.as_object_mut() {
        obj.insert("status".into(), json!("cancelled"));
    }
    Ok(Json(now))
}

pub async fn delete_response(
    State(state): State<AppState>,
    caller: Caller,
    id: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let stored = visible(&state, &caller, id).await?;
    store::delete(state.queue().pool(), stored.id).await?;
    Ok(Json(
        json!({"id": response_id(stored.id), "object": "response", "deleted": true}),
    ))
}

pub async fn list_input_items(
    State(state): State<AppState>,
    caller: Caller,
    id: Result<Path<String>, PathRejection>,
    RawQuery(query): RawQuery,
) -> Result<Json<Value>, ApiError> {
    let stored = visible(&state, &caller, id).await?;
    let query = Query::parse(query.as_deref());
    let limit = match query.number("limit")? {
        None => DEFAULT_PAGE,
        Some(n) if (1..=MAX_PAGE as u64).contains(&n) => n as usize,
        Some(n) => {
            return Err(ApiError::invalid(
                "limit",
                format!("`limit` must be between 1 and {MAX_PAGE}, got {n}."),
            ))
        }
    };
    let mut items = stored.input_items;
    match query.get("order") {
        None | Some("desc") => items.reverse(),
        Some("asc") => {}
        Some(other) => {
            return Err(ApiError::invalid(
                "order",
                format!("`order` must be `asc` or `desc`, got `{other}`."),
            ))
        }
    }
    let start = match query.get("after") {
        None => 0,
        Some(after) => {
            let at = items
                .iter()
                .position(|item| item.get("id").and_then(Value::as_str) == Some(after));
            match at {
                Some(at) => at + 1,
                None => {
                    return Err(ApiError::invalid(
                        "after",
                        format!("No input item `{after}` in this response."),
                    ))
                }
            }
        }
    };
    let rest = items.get(start..).unwrap_or_default();
    let page: Vec<Value> = rest.iter().take(limit).cloned().collect();
    let id_of = |item: Option<&Value>| item.and_then(|i| i.get("id")).cloned();
    Ok(Json(json!({
        "object": "list",
        "data": page,
        "first_id": id_of(page.first()),
        "last_id": id_of(page.last()),
        "has_more": rest.len() > limit,
    })))
}

/// The stored response behind a public id, if the caller may see it.
async fn visible(
    state: &AppState,
    caller: &Caller,
    id: Result<Path<String>, PathRejection>,
) -> Result<StoredResponse, ApiError> {
    let raw = id.map(|Path(id)| id).unwrap_or_default();
    let not_found = || ApiError::NotFound(format!("Response with id `{raw}` not found."));
    let uuid = parse_response_id(&raw).ok_or_else(not_found)?;
    match store::get(state.queue().pool(), uuid).await? {
        Some(stored) if caller.may_see(stored.tenant_id) => Ok(stored),
        _ => Err(not_found()),
    }
}

/// A query string's `name=value` pairs (values are ids, numbers and words: no decoding).
struct Query<'a>(Vec<(&'a str, &'a str)>);

impl<'a> Query<'a> {
    fn parse(query: Option<&'a str>) -> Self {
        Query(
            query
                .unwrap_or_default()
                .split('&')
                .filter(|kv| !kv.is_empty())
                .map(|kv| kv.split_once('=').unwrap_or((kv, "")))
                .collect(),
        )
    }

    fn get(&self, name: &str) -> Option<&'a str> {
        self.0.iter().find(|(k, _)| *k == name).map(|(_, v)| *v)
    }

    fn flag(&self, name: &str) -> Result<bool, ApiError> {
        match self.get(name) {
            None | Some("false") => Ok(false),
            Some("true") => Ok(true),
            Some(other) => Err(ApiError::invalid(
                name,
                format!("`{name}` must be `true` or `false`, got `{other}`."),
            )),
        }
    }

    fn number(&self, name: &str) -> Result<Option<u64>, ApiError> {
        self.get(name)
            .map(|v| {
                v.parse().map_err(|_| {
                    ApiError::invalid(
                        name,
                        format!("`{name}` must be a non-negative integer, got `{v}`."),
                    )
                })
            })
            .transpose()
    }
}
