//! `POST /runner/v1/events`: one engine step's events for all the caller's jobs, appended to
//! their Redis streams in one pipelined round trip, in order, after the jobs whose first
//! tokens they carry are marked `streamed` in Postgres. Events for a job the caller
//! does not hold are refused (listed in the answer) and the rest go ahead. That a runner
//! holds a job is known from its claim, or looked up once, and trusted for a few seconds,
//! so a step costs no query.

use super::auth::Runner;
use crate::error::ApiError;
use crate::extract::ApiJson;
use crate::state::AppState;
use axum::extract::State;
use axum::Json;
use fallow_scheduler::runner_wire::{Append, Appended, MAX_EVENTS_PER_APPEND};
use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use uuid::Uuid;

/// How long a job's holder is trusted without asking Postgres again, when it is the caller.
/// A job leaves its holder only when its lease expires or is revoked; a refusal is never
/// taken from the cache.
const HOLDER_TTL: Duration = Duration::from_secs(5);

/// The largest stream cap a runner may ask for: far beyond any request's entries.
const MAX_CAP: usize = 1 << 24;

/// Which runner held which job, as recently looked up.
#[derive(Default)]
pub struct HolderCache {
    entries: Mutex<HashMap<Uuid, (Uuid, Instant)>>,
}

impl HolderCache {
    fn get(&self, job: Uuid) -> Option<Uuid> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries
            .get(&job)
            .filter(|(_, at)| at.elapsed() < HOLDER_TTL)
            .map(|(runner, _)| *runner)
    }

    /// Notes that `runner` holds `job`, as just looked up or claimed.
    pub(super) fn put(&self, job: Uuid, runner: Uuid) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if entries.len() > 100_000 {
            entries.retain(|_, (_, at)| at.elapsed() < HOLDER_TTL);
        }
        entries.insert(job, (runner, Instant::now()));
    }
}

pub async fn append(
    State(state): State<AppState>,
    runner: Runner,
    ApiJson(Append { streamed, events }): ApiJson<Append>,
) -> Result<Json<Appended>, ApiError> {
    let id = runner.id(&state).await?;
    for (param, len) in [("events", events.len()), ("streamed", streamed.len())] {
        if len > MAX_EVENTS_PER_APPEND {
            return Err(ApiError::invalid(
                param,
                format!("{len} {param} in one append; the limit is {MAX_EVENTS_PER_APPEND}"),
            ));
        }
    }
    let holders = &state.runner_api().holders;
    let jobs: HashSet<Uuid> = events.iter().map(|e| e.job).collect();
    // Unknown, or cached as another runner's: the job may have moved here since (a
    // continuation), so Postgres answers, for all such jobs in one statement.
    let (mut held, unsure): (HashSet<Uuid>, HashSet<Uuid>) = jobs
        .into_iter()
        .partition(|job| holders.get(*job) == Some(id));
    let mut refused = Vec::new();
    if !unsure.is_empty() {
        let unsure: Vec<Uuid> = unsure.into_iter().collect();
        let found = state.queue().holders(&unsure).await?;
        for job in unsure {
            match found.get(&job) {
                Some(&holder) if holder == id => {
                    holders.put(job, holder);
                    held.insert(job);
                }
                Some(&holder) => {
                    holders.put(job, holder);
                    refused.push(job);
                }
                None => refused.push(job),
            }
        }
    }
    let mut caps = HashMap::new();
    let mut accepted = Vec::with_capacity(events.len());
    for event in events.into_iter().filter(|e| held.contains(&e.job)) {
        caps.insert(event.job, event.cap.map(|cap| cap.min(MAX_CAP)));
        accepted.push((event.job, event.event));
    }
    // The marks before the tokens: fenced by this runner as holder in the statement itself.
    if !streamed.is_empty() {
        let marks: Vec<(Uuid, i32)> = streamed.iter().map(|m| (m.job, m.attempt)).collect();
        state.queue().mark_all_streamed(&marks, Some(id)).await?;
    }
    state
        .relay()
        .append_capped(&accepted, |job| caps.get(&job).copied().flatten())
        .await?;
    if !refused.is_empty() {
        tracing::warn!(runner = %id, ?refused, "events for jobs the runner does not hold were refused");
    }
    Ok(Json(Appended {
        appended: accepted.len(),
        refused,
    }))
}
