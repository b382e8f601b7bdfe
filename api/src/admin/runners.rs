//! `/admin/runners`: what runners there are, in which state and with which models warm, and
//! the operator's levers: cordon (claim nothing new, keep working), drain (finish in-flight
//! work, claim nothing new, then report `drained`), resume (`active` again) and evict (unload
//! a model, once its jobs are done). The runner learns of a change at once (a `NOTIFY`) and
//! at its next heartbeat at the latest.

use super::auth::Admin;
use super::{parse_id, AdminList};
use crate::error::ApiError;
use crate::extract::ApiJson;
use crate::state::AppState;
use axum::extract::{Path, State};
use axum::Json;
use fallow_scheduler::runners::{self, RunnerRecord, RunnerState};
use serde::Deserialize;

pub async fn list(
    State(state): State<AppState>,
    _admin: Admin,
) -> Result<Json<AdminList<RunnerRecord>>, ApiError> {
    Ok(Json(AdminList::new(
        runners::list(state.queue().pool()).await?,
    )))
}

pub async fn show(
    State(state): State<AppState>,
    _admin: Admin,
    Path(id): Path<String>,
) -> Result<Json<RunnerRecord>, ApiError> {
    let id = parse_id("runner", &id)?;
    runners::get(state.queue().pool(), id)
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::NotFound(format!("No runner with id {id}.")))
}

pub async fn cordon(
    state: State<AppState>,
    admin: Admin,
    id: Path<String>,
) -> Result<Json<RunnerRecord>, ApiError> {
    set(state, admin, id, RunnerState::Cordoned).await
}

/// Longest drain deadline an operator may give (a day); past it, drain without one.
const MAX_DRAIN_DEADLINE_SECONDS: f64 = 86_400.0;

/// The optional body of a drain: `{"deadline_seconds": N}`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Drain {
    deadline_seconds: Option<f64>,
}

/// Drains a runner; with `deadline_seconds` in the body, the runner hands back what it still
/// holds at the deadline (other runners continue those jobs). An empty body drains without
/// a deadline.
pub async fn drain(
    State(state): State<AppState>,
    _admin: Admin,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Result<Json<RunnerRecord>, ApiError> {
    let id = parse_id("runner", &id)?;
    let drain: Drain = if body.iter().all(u8::is_ascii_whitespace) {
        Drain::default()
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| ApiError::invalid("deadline_seconds", format!("Invalid body: {e}.")))?
    };
    let deadline = match drain.deadline_seconds {
        None => None,
        Some(s) if s.is_finite() && (0.0..=MAX_DRAIN_DEADLINE_SECONDS).contains(&s) => {
            Some(std::time::Duration::from_secs_f64(s))
        }
        Some(s) => {
            return Err(ApiError::invalid(
                "deadline_seconds",
                format!(
                    "deadline_seconds must be between 0 and {MAX_DRAIN_DEADLINE_SECONDS}, got {s}."
                ),
            ))
        }
    };
    let pool = state.queue().pool();
    if !runners::drain(pool, id, deadline).await? {
        return Err(ApiError::NotFound(format!("No runner with id {id}.")));
    }
    tracing::info!(runner_id = %id, ?deadline, "runner drained by an operator");
    runners::get(pool, id)
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::NotFound(format!("No runner with id {id}.")))
}

pub async fn resume(
    state: State<AppState>,
    admin: Admin,
    id: Path<String>,
) -> Result<Json<RunnerRecord>, ApiError> {
    set(state, admin, id, RunnerState::Active).await
}

async fn set(
    State(state): State<AppState>,
    _admin: Admin,
    Path(id): Path<String>,
    to: RunnerState,
) -> Result<Json<RunnerRecord>, ApiError> {
    let id = parse_id("runner", &id)?;
    let pool = state.queue().pool();
    if !runners::set_state(pool, id, to).await? {
        return Err(ApiError::NotFound(format!("No runner with id {id}.")));
    }
    tracing::info!(runner_id = %id, state = %to, "runner state set by an operator");
    runners::get(pool, id)
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::NotFound(format!("No runner with id {id}.")))
}

#[derive(Debug, Deserialize)]
pub struct Evict {
    model: String,
}

/// Asks the runner to unload a model (at once if idle, else when its jobs are done). The
/// model stays on offer: a later job loads it again.
pub async fn evict(
    State(state): State<AppState>,
    _admin: Admin,
    Path(id): Path<String>,
    ApiJson(evict): ApiJson<Evict>,
) -> Result<Json<RunnerRecord>, ApiError> {
    let id = parse_id("runner", &id)?;
    let pool = state.queue().pool();
    let runner = runners::get(pool, id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("No runner with id {id}.")))?;
    if !runner.models.iter().any(|m| m.id == evict.model) {
        return Err(ApiError::invalid(
            "model",
            format!("Runner {id} does not serve the model `{}`.", evict.model),
        ));
    }
    if !runners::request_evict(pool, id, &evict.model).await? {
        return Err(ApiError::NotFound(format!("No runner with id {id}.")));
    }
    tracing::info!(runner_id = %id, model = %evict.model, "model eviction requested by an operator");
    Ok(Json(runner))
}
