//! The runner API's queue calls: claim (a long poll woken by `NOTIFY`, its answer replayed
//! to a runner that asks again with the same claim id), lease renewal with
//! checkpoints, and the ends of a job (complete, fail, release, cancelled). Each end is fenced by `(id, attempt)` as for a direct runner, and is
//! accepted only for a job the calling runner holds: a report on another runner's job gets
//! a 409 and changes nothing.

use super::auth::Runner;
use super::metered;
use crate::error::ApiError;
use crate::extract::ApiJson;
use crate::state::AppState;
use axum::extract::{Path, State};
use axum::Json;
use fallow_scheduler::queue::{ClaimScope, ClaimedJob};
use fallow_scheduler::runner_wire::{
    Cancelled, Claim, Claimed, Committed, Complete, Fail, Outcome, Release, Renew, Renewed,
    MAX_CLAIM_WAIT_MS,
};
use fallow_scheduler::runners::claim_replay;
use std::time::Duration;
use tokio::time::Instant;
use uuid::Uuid;

/// A claim asks again at least this often while it waits, `NOTIFY` or not.
const CLAIM_POLL: Duration = Duration::from_secs(1);

/// The longest lease a runner may ask for.
const MAX_LEASE: Duration = Duration::from_secs(600);

pub async fn claim(
    State(state): State<AppState>,
    runner: Runner,
    ApiJson(claim): ApiJson<Claim>,
) -> Result<Json<Claimed>, ApiError> {
    let id = runner.id(&state).await?;
    let lease = Duration::from_millis(claim.lease_ms);
    if lease.is_zero() || lease > MAX_LEASE {
        return Err(ApiError::invalid(
            "lease_ms",
            format!("a lease of 1 ms to {} s", MAX_LEASE.as_secs()),
        ));
    }
    // Only the models the token allows.
    let allowed = |models: Vec<String>| -> Vec<String> {
        models
            .into_iter()
            .filter(|model| runner.token.allows_model(model))
            .collect()
    };
    let (warm, cold) = (allowed(claim.warm), allowed(claim.cold));
    let scope = ClaimScope {
        warm: &warm,
        cold: &cold,
        cold_after: Duration::from_millis(claim.cold_after_ms),
    };
    // Asked again after a lost answer: the same jobs.
    if let (Some(claim_id), true) = (claim.claim_id, claim.again) {
        if let Some(jobs) = claim_replay::recall(state.relay(), id, claim_id).await? {
            return Ok(Json(holding_now(&state, id, jobs)));
        }
    }
    let deadline = Instant::now() + Duration::from_millis(claim.wait_ms.min(MAX_CLAIM_WAIT_MS));
    let queue = state.queue();
    let started = Instant::now();
    loop {
        let jobs = queue.claim_in(id, &scope, claim.limit, lease).await?;
        let now = Instant::now();
        if !jobs.is_empty() || now >= deadline {
            let outcome = if jobs.is_empty() { "empty" } else { "jobs" };
            metrics::histogram!(metered::CLAIM_SECONDS, "outcome" => outcome)
                .record((now - started).as_secs_f64());
            if let (Some(claim_id), false) = (claim.claim_id, jobs.is_empty()) {
                // Kept beside the answer, not before it: a round trip to Redis would delay
                // every claimed job's first token. A runner asks again only after its
                // answer is lost and a back-off, long after this has landed.
                let (relay, kept) = (state.relay().clone(), jobs.clone());
                tokio::spawn(async move {
                    let kept = claim_replay::remember(&relay, id, claim_id, &kept, lease);
                    if let Err(e) = kept.await {
                        tracing::warn!(error = %e, "keeping a claim's answer failed; a lost answer will not be replayed");
                    }
                });
            }
            return Ok(Json(holding_now(&state, id, jobs)));
        }
        queue.wait_for_work((deadline - now).min(CLAIM_POLL)).await;
    }
}

/// The claimed jobs' answer, once the api knows they are the runner's: their first
/// events then need no lookup, which would delay the first tokens.
fn holding_now(state: &AppState, runner: Uuid, jobs: Vec<ClaimedJob>) -> Claimed {
    let holders = &state.runner_api().holders;
    for job in &jobs {
        holders.put(job.id, runner);
    }
    Claimed { jobs }
}

pub async fn renew(
    State(state): State<AppState>,
    runner: Runner,
    ApiJson(renew): ApiJson<Renew>,
) -> Result<Json<Renewed>, ApiError> {
    let id = runner.id(&state).await?;
    let lease = Duration::from_millis(renew.lease_ms);
    if lease.is_zero() || lease > MAX_LEASE {
        return Err(ApiError::invalid(
            "lease_ms",
            format!("a lease of 1 ms to {} s", MAX_LEASE.as_secs()),
        ));
    }
    // Fenced by runner and attempt in the statement itself.
    Ok(Json(
        state
            .queue()
            .renew_with_checkpoints(id, &renew.held, lease)
            .await?,
    ))
}

/// The caller's runner id, once it is the one holding `job`.
async fn holding(state: &AppState, runner: &Runner, job: &str) -> Result<(Uuid, Uuid), ApiError> {
    let id = runner.id(state).await?;
    let job: Uuid = job
        .parse()
        .map_err(|_| ApiError::invalid("id", format!("{job:?} is not a job id")))?;
    if state.queue().holder(job).await? != Some(id) {
        return Err(not_held(job));
    }
    Ok((id, job))
}

pub(super) fn not_held(job: Uuid) -> ApiError {
    ApiError::Conflict {
        message: format!("Job {job} is not running on this runner (finished, reclaimed, or never its own); the report changes nothing."),
        code: "lease_not_held",
    }
}

pub async fn complete(
    State(state): State<AppState>,
    runner: Runner,
    Path(job): Path<String>,
    ApiJson(body): ApiJson<Complete>,
) -> Result<Json<Committed>, ApiError> {
    let (_, job) = holding(&state, &runner, &job).await?;
    let committed = state
        .queue()
        .complete(job, body.attempt, &body.completion)
        .await?;
    Ok(Json(Committed { committed }))
}

pub async fn cancelled(
    State(state): State<AppState>,
    runner: Runner,
    Path(job): Path<String>,
    ApiJson(body): ApiJson<Cancelled>,
) -> Result<Json<Committed>, ApiError> {
    let (_, job) = holding(&state, &runner, &job).await?;
    let committed = state
        .queue()
        .mark_cancelled(job, body.attempt, Some(&body.partial))
        .await?;
    Ok(Json(Committed { committed }))
}

pub async fn fail(
    State(state): State<AppState>,
    runner: Runner,
    Path(job): Path<String>,
    ApiJson(body): ApiJson<Fail>,
) -> Result<Json<Outcome>, ApiError> {
    let (_, job) = holding(&state, &runner, &job).await?;
    let queue = state.queue();
    let outcome = match &body.progress {
        Some(progress) if body.retryable => {
            queue
                .fail_and_continue(job, body.attempt, &body.error, progress)
                .await?
        }
        _ => {
            queue
                .fail(job, body.attempt, &body.error, body.retryable)
                .await?
        }
    };
    Ok(Json(Outcome { outcome }))
}

pub async fn release(
    State(state): State<AppState>,
    runner: Runner,
    Path(job): Path<String>,
    ApiJson(body): ApiJson<Release>,
) -> Result<Json<Outcome>, ApiError> {
    let (_, job) = holding(&state, &runner, &job).await?;
    let outcome = state
        .queue()
        .release(job, body.attempt, body.progress.as_ref())
        .await?;
    Ok(Json(Outcome { outcome }))
}
