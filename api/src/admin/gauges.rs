//! Cluster-wide gauges read from Postgres when `/metrics` is scraped, named after vLLM's:
//! `fallow:num_requests_waiting` / `fallow:num_requests_running` per model (queued and
//! running jobs across every runner) and `fallow:runners` per state. Reading at scrape time
//! keeps them right with any number of api processes: each reports the same truth.

use crate::state::AppState;
use fallow_scheduler::runners::{self, RunnerState};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

pub const NUM_REQUESTS_WAITING: &str = "fallow:num_requests_waiting";
pub const NUM_REQUESTS_RUNNING: &str = "fallow:num_requests_running";
pub const RUNNERS: &str = "fallow:runners";

/// Models reported before, so one whose jobs all finished drops to 0 instead of keeping
/// its last value.
static SEEN_MODELS: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// Sets the gauges from Postgres; on a database error they keep their last values.
pub async fn refresh(state: &AppState) {
    if let Err(e) = refresh_inner(state).await {
        tracing::warn!(error = %e, "reading queue and runner gauges failed");
    }
}

async fn refresh_inner(state: &AppState) -> Result<(), fallow_scheduler::SchedulerError> {
    let depths = state.queue().queue_depths_by_priority().await?;
    let runners = runners::list(state.queue().pool()).await?;
    let mut per_model: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    // Every model a runner serves is reported, at 0 when nothing waits for it.
    for model in runners.iter().flat_map(|r| &r.models) {
        per_model.entry(model.id.clone()).or_default();
    }
    for d in depths {
        let entry = per_model.entry(d.model).or_default();
        entry.0 += d.queued;
        entry.1 += d.running;
    }
    {
        // A poisoned lock only means another scrape panicked; the set is still usable.
        let mut seen = SEEN_MODELS.lock().unwrap_or_else(|e| e.into_inner());
        for model in seen.iter() {
            per_model.entry(model.clone()).or_default();
        }
        seen.extend(per_model.keys().cloned());
    }
    for (model, (queued, running)) in per_model {
        metrics::gauge!(NUM_REQUESTS_WAITING, "model_name" => model.clone()).set(queued as f64);
        metrics::gauge!(NUM_REQUESTS_RUNNING, "model_name" => model).set(running as f64);
    }
    for runner_state in RunnerState::ALL {
        let n = runners.iter().filter(|r| r.state == runner_state).count();
        metrics::gauge!(RUNNERS, "state" => runner_state.as_str()).set(n as f64);
    }
    Ok(())
}
