//! `/admin/queue` and `/admin/jobs`: how deep the queue is per model and priority, which
//! jobs match a filter, and cancelling a job (queued: at once; running: its runner stops
//! it within one engine step).

use super::auth::Admin;
use super::{parse_id, AdminList};
use crate::error::ApiError;
use crate::state::AppState;
use axum::extract::{Path, Query, State};
use axum::Json;
use fallow_scheduler::queue::{JobFilter, JobState, JobSummary, QueueDepth};
use serde::{Deserialize, Serialize};

pub async fn queue_depth(
    State(state): State<AppState>,
    _admin: Admin,
) -> Result<Json<AdminList<QueueDepth>>, ApiError> {
    Ok(Json(AdminList::new(
        state.queue().queue_depths_by_priority().await?,
    )))
}

#[derive(Debug, Deserialize)]
pub struct SearchParams {
    state: Option<String>,
    model: Option<String>,
    tenant: Option<String>,
    limit: Option<i64>,
}

pub async fn search(
    State(state): State<AppState>,
    _admin: Admin,
    params: Result<Query<SearchParams>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<AdminList<JobSummary>>, ApiError> {
    let Query(params) = params.map_err(|e| ApiError::invalid("query", e.body_text()))?;
    let job_state = params
        .state
        .as_deref()
        .map(|s| {
            JobState::parse(s).ok_or_else(|| {
                ApiError::invalid(
                    "state",
                    format!(
                        "unknown job state {s:?}; expected queued, running, succeeded, failed or cancelled"
                    ),
                )
            })
        })
        .transpose()?;
    let filter = JobFilter {
        state: job_state,
        model: params.model,
        tenant: params.tenant,
        limit: params.limit.unwrap_or(100),
    };
    Ok(Json(AdminList::new(state.queue().search(&filter).await?)))
}

#[derive(Debug, Serialize)]
pub struct CancelAnswer {
    id: uuid::Uuid,
    /// Whether this call changed anything (false: the job had already finished).
    cancel_requested: bool,
    state: JobState,
}

pub async fn cancel(
    State(state): State<AppState>,
    _admin: Admin,
    Path(id): Path<String>,
) -> Result<Json<CancelAnswer>, ApiError> {
    let id = parse_id("job", &id)?;
    let changed = state.queue().request_cancel(id).await?;
    if changed {
        // Tell the runner now; its heartbeat would notice the flag anyway.
        if let Err(e) = state.relay().signal_cancel(id).await {
            tracing::warn!(job = %id, error = %e, "could not signal cancellation to runners");
        }
        tracing::info!(job = %id, "job cancelled by an operator");
    }
    let job = state
        .queue()
        .get(id)
        .await?
        .ok_or_else(|| ApiError::NotFound(format!("No job with id {id}.")))?;
    Ok(Json(CancelAnswer {
        id,
        cancel_requested: changed,
        state: job.state,
    }))
}
