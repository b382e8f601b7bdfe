//! Cluster-wide gauges read from Postgres when `/metrics` is scraped, named after vLLM's:
//! `fallow:num_requests_waiting` / `fallow:num_requests_running` per model (queued and
//! running jobs across every runner) and `fallow:runners` per state. Reading at scrape time
//! keeps them right with any number of api processes: each reports the same truth.
//!
//! `/metrics` needs no credentials, and its two aggregate queries share the pool with
//! runner heartbeats in `fallow dev`. So the gauges are read at most once per
//! [`ApiConfig::gauge_ttl`](crate::ApiConfig::gauge_ttl) (1 s), and concurrent scrapes
//! wait for one read instead of each running its own.
//! Like the recorder they feed, the cache is per process.

use crate::state::AppState;
use fallow_scheduler::runners::{self, RunnerState};
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub const NUM_REQUESTS_WAITING: &str = "fallow:num_requests_waiting";
pub const NUM_REQUESTS_RUNNING: &str = "fallow:num_requests_running";
pub const RUNNERS: &str = "fallow:runners";

/// Models reported before, so one whose jobs all finished drops to 0 instead of keeping
/// its last value.
static SEEN_MODELS: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// When the gauges were last read. An async lock: a scrape that finds a read under way
/// waits for it rather than starting another.
static LAST_READ: tokio::sync::Mutex<Option<Instant>> = tokio::sync::Mutex::const_new(None);

/// Sets the gauges from Postgres unless they were read within the TTL; on a database
/// error they keep their last values.
pub async fn refresh(state: &AppState) {
    at_most_every(&LAST_READ, state.config().gauge_ttl, || async {
        if let Err(e) = refresh_inner(state).await {
            tracing::warn!(error = %e, "reading queue and runner gauges failed");
        }
    })
    .await;
}

/// Runs `read` unless it ran less than `ttl` ago. A failed read counts as a read too, so
/// a struggling database is not asked again at every scrape.
async fn at_most_every<F, Fut>(last: &tokio::sync::Mutex<Option<Instant>>, ttl: Duration, read: F)
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = ()>,
{
    let mut last = last.lock().await;
    if last.is_some_and(|at| at.elapsed() < ttl) {
        return;
    }
    read().await;
    *last = Some(Instant::now());
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn scrapes_within_the_ttl_read_the_database_once() {
        let last = tokio::sync::Mutex::const_new(None);
        let reads = AtomicUsize::new(0);
        let read = || async {
            reads.fetch_add(1, Ordering::SeqCst);
        };
        let ttl = Duration::from_millis(200);
        at_most_every(&last, ttl, read).await;
        at_most_every(&last, ttl, read).await;
        assert_eq!(
            reads.load(Ordering::SeqCst),
            1,
            "the second scrape reused the gauges"
        );
        tokio::time::sleep(ttl + Duration::from_millis(50)).await;
        at_most_every(&last, ttl, read).await;
        assert_eq!(
            reads.load(Ordering::SeqCst),
            2,
            "gauges are read again after the TTL"
        );
    }

    #[tokio::test]
    async fn concurrent_scrapes_share_one_read() {
        let last = tokio::sync::Mutex::const_new(None);
        let reads = AtomicUsize::new(0);
        let read = || async {
            reads.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let ttl = Duration::from_secs(1);
        tokio::join!(
            at_most_every(&last, ttl, read),
            at_most_every(&last, ttl, read),
            at_most_every(&last, ttl, read),
        );
        assert_eq!(reads.load(Ordering::SeqCst), 1);
    }
}
