//! The runner API's registry calls: register (checked against the token), deregister,
//! heartbeat, the runner's state and its own state changes, warm models, drain deadlines,
//! evictions, warm replicas and pool turns. Each runs the statement a direct runner runs,
//! for the runner registered with the caller's token only.

use super::auth::Runner;
use crate::error::ApiError;
use crate::extract::ApiJson;
use crate::state::AppState;
use axum::extract::State;
use axum::Json;
use fallow_scheduler::runner_wire::{
    DrainLeft, Evictions, Heartbeat, PoolTurn, PoolTurnAsked, Register, Registered, Replicas,
    ReportState, StateIs, Warm,
};
use fallow_scheduler::runners::{self, tokens};
use fallow_scheduler::SchedulerError;

/// Registers the caller: its pool and models must be what its token allows. A new
/// registration with the same token replaces the runner registered before (marked dead, its
/// jobs continued elsewhere).
pub async fn register(
    State(state): State<AppState>,
    runner: Runner,
    ApiJson(Register { mut info, id }): ApiJson<Register>,
) -> Result<Json<Registered>, ApiError> {
    let token = &runner.token;
    if let Some(pool) = &token.pool {
        if info.pool == runners::DEFAULT_POOL {
            info.pool = pool.clone(); // the token's pool, when the runner names none
        }
    }
    token
        .check_offer(&info.pool, info.models.iter().map(|m| m.id.as_str()))
        .map_err(|refused| {
            ApiError::PermissionDenied(format!("{refused}; the runner is refused."))
        })?;
    info.warm.retain(|model| token.allows_model(model));
    let pool = state.queue().pool();
    // Again as itself only when it is the token's runner; otherwise a fresh id.
    let runner_id = match id.filter(|id| token.runner_id == Some(*id)) {
        Some(id) => {
            runners::register_as(pool, id, &info).await?;
            id
        }
        None => runners::register(pool, &info).await?,
    };
    if !tokens::bind_runner(pool, token.id, runner_id).await? {
        runners::deregister(pool, runner_id).await?;
        return Err(ApiError::InvalidRunnerToken);
    }
    state.runner_api().tokens.clear();
    tracing::info!(%runner_id, token = %token.name, pool = %info.pool, "runner registered through the runner API");
    Ok(Json(Registered { runner_id }))
}

pub async fn deregister(
    State(state): State<AppState>,
    runner: Runner,
) -> Result<Json<serde_json::Value>, ApiError> {
    let id = runner.id(&state).await?;
    runners::deregister(state.queue().pool(), id).await?;
    Ok(Json(serde_json::json!({})))
}

pub async fn heartbeat(
    State(state): State<AppState>,
    runner: Runner,
    ApiJson(beat): ApiJson<Heartbeat>,
) -> Result<Json<StateIs>, ApiError> {
    let id = runner.id(&state).await?;
    let state = runners::heartbeat(state.queue().pool(), id, beat.in_flight)
        .await
        .map_err(forgotten)?;
    Ok(Json(StateIs { state: Some(state) }))
}

/// The registry forgot the runner (its row was removed): it must register again.
fn forgotten(err: SchedulerError) -> ApiError {
    match err {
        SchedulerError::NotFound(_) => ApiError::Conflict {
            message: "The registry no longer knows this runner; register again.".into(),
            code: "runner_not_registered",
        },
        other => other.into(),
    }
}

pub async fn get_state(
    State(state): State<AppState>,
    runner: Runner,
) -> Result<Json<StateIs>, ApiError> {
    let id = runner.id(&state).await?;
    Ok(Json(StateIs {
        state: runners::state(state.queue().pool(), id).await?,
    }))
}

pub async fn report_state(
    State(state): State<AppState>,
    runner: Runner,
    ApiJson(report): ApiJson<ReportState>,
) -> Result<Json<StateIs>, ApiError> {
    let id = runner.id(&state).await?;
    let now = runners::report_state(state.queue().pool(), id, &report.from, report.to)
        .await
        .map_err(forgotten)?;
    Ok(Json(StateIs { state: Some(now) }))
}

pub async fn set_warm(
    State(state): State<AppState>,
    runner: Runner,
    ApiJson(Warm { mut warm }): ApiJson<Warm>,
) -> Result<Json<Warm>, ApiError> {
    let id = runner.id(&state).await?;
    warm.retain(|model| runner.token.allows_model(model));
    runners::set_warm(state.queue().pool(), id, &warm).await?;
    Ok(Json(Warm { warm }))
}

pub async fn drain_left(
    State(state): State<AppState>,
    runner: Runner,
) -> Result<Json<DrainLeft>, ApiError> {
    let id = runner.id(&state).await?;
    let left = runners::drain_left(state.queue().pool(), id).await?;
    Ok(Json(DrainLeft {
        left_ms: left.map(|left| u64::try_from(left.as_millis()).unwrap_or(u64::MAX)),
    }))
}

pub async fn take_evictions(
    State(state): State<AppState>,
    runner: Runner,
) -> Result<Json<Evictions>, ApiError> {
    let id = runner.id(&state).await?;
    Ok(Json(Evictions {
        models: runners::take_evictions(state.queue().pool(), id).await?,
    }))
}

pub async fn warm_replicas(
    State(state): State<AppState>,
    runner: Runner,
) -> Result<Json<Replicas>, ApiError> {
    runner.id(&state).await?;
    let mut replicas = runners::warm_replicas(state.queue().pool()).await?;
    replicas.retain(|model, _| runner.token.allows_model(model));
    Ok(Json(Replicas { replicas }))
}

pub async fn pool_turn(
    State(state): State<AppState>,
    runner: Runner,
    ApiJson(asked): ApiJson<PoolTurnAsked>,
) -> Result<Json<PoolTurn>, ApiError> {
    let id = runner.id(&state).await?;
    if !(0.0..=1.0).contains(&asked.max_share) {
        return Err(ApiError::invalid("max_share", "a share from 0 to 1"));
    }
    let turn =
        runners::pool_turn(state.queue().pool(), id, asked.owner_idle, asked.max_share).await?;
    Ok(Json(PoolTurn { turn }))
}
