//! `/admin/runners`: what runners there are and in which state, and the operator's three
//! levers: cordon (claim nothing new, keep working), drain (finish in-flight work, claim
//! nothing new, then report `drained`) and resume (`active` again). The runner learns of a
//! change at once (a `NOTIFY`) and at its next heartbeat at the latest.

use super::auth::Admin;
use super::{parse_id, AdminList};
use crate::error::ApiError;
use crate::state::AppState;
use axum::extract::{Path, State};
use axum::Json;
use fallow_scheduler::runners::{self, RunnerRecord};

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
    set(state, admin, id, "cordoned").await
}

pub async fn drain(
    state: State<AppState>,
    admin: Admin,
    id: Path<String>,
) -> Result<Json<RunnerRecord>, ApiError> {
    set(state, admin, id, "draining").await
}

pub async fn resume(
    state: State<AppState>,
    admin: Admin,
    id: Path<String>,
) -> Result<Json<RunnerRecord>, ApiError> {
    set(state, admin, id, "active").await
}

async fn set(
    State(state): State<AppState>,
    _admin: Admin,
    Path(id): Path<String>,
    to: &str,
) -> Result<Json<RunnerRecord>, ApiError> {
    let id = parse_id("runner", &id)?;
    let pool = state.queue().pool();
    if !runners::set_state(pool, id, to).await? {
        return Err(ApiError::NotFound(format!("No runner with id {id}.")));
    }
    tracing::info!(runner_id = %id, state = to, "runner state set by an operator");
    runners::get(pool, id)
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::NotFound(format!("No runner with id {id}.")))
}
