//! `POST /runner/v1/events`: one engine step's events for all the caller's jobs, appended to
//! their Redis streams in one pipelined round trip, in order. Events for a job the caller
//! does not hold are refused (listed in the answer) and the rest go ahead. Which runner
//! holds a job is looked up once and trusted for a few seconds, so a step costs no query.

use super::auth::Runner;
use crate::error::ApiError;
use crate::extract::ApiJson;
use crate::state::AppState;
use axum::extract::State;
use axum::Json;
use fallow_scheduler::runner_wire::{Append, MAX_EVENTS_PER_APPEND};
use serde::Serialize;
use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use uuid::Uuid;

/// How long a job's holder is trusted without asking Postgres again. A job changes holder
/// only when its lease expires, which takes far longer.
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

    fn put(&self, job: Uuid, runner: Uuid) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if entries.len() > 100_000 {
            entries.retain(|_, (_, at)| at.elapsed() < HOLDER_TTL);
        }
        entries.insert(job, (runner, Instant::now()));
    }
}

#[derive(Debug, Serialize)]
pub struct Appended {
    pub appended: usize,
    /// Jobs whose events were refused: not (or no longer) running on this runner.
    pub refused: Vec<Uuid>,
}

pub async fn append(
    State(state): State<AppState>,
    runner: Runner,
    ApiJson(Append { events }): ApiJson<Append>,
) -> Result<Json<Appended>, ApiError> {
    let id = runner.id(&state).await?;
    if events.len() > MAX_EVENTS_PER_APPEND {
        return Err(ApiError::invalid(
            "events",
            format!(
                "{} events in one append; the limit is {MAX_EVENTS_PER_APPEND}",
                events.len()
            ),
        ));
    }
    let holders = &state.runner_api().holders;
    let mut held = HashSet::new();
    let mut refused = Vec::new();
    let jobs: HashSet<Uuid> = events.iter().map(|e| e.job).collect();
    for job in jobs {
        let holder = match holders.get(job) {
            Some(holder) => Some(holder),
            None => {
                let holder = state.queue().holder(job).await?;
                if let Some(holder) = holder {
                    holders.put(job, holder);
                }
                holder
            }
        };
        if holder == Some(id) {
            held.insert(job);
        } else {
            refused.push(job);
        }
    }
    let mut caps = HashMap::new();
    let mut accepted = Vec::with_capacity(events.len());
    for event in events.into_iter().filter(|e| held.contains(&e.job)) {
        caps.insert(event.job, event.cap.map(|cap| cap.min(MAX_CAP)));
        accepted.push((event.job, event.event));
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
