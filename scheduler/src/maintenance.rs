//! The maintenance loop: mark silent runners dead, continue or reap expired leases (jobs
//! whose runner died: from their streams where those tell how far they got, else from the
//! start), cancel queued interactive jobs whose client is gone, and prune old finished jobs,
//! each on its own cadence, until shutdown. Any number of scheduler processes may run it at
//! once: every statement is idempotent and fenced.

use crate::queue::Queue;
use crate::stream::TokenRelay;
use std::time::Duration;
use tokio::time::MissedTickBehavior;

pub struct MaintenanceConfig {
    pub reap_every: Duration,
    pub prune_every: Duration,
    pub retention: Duration,
    /// A queued interactive job older than this has no client any more (the api's request
    /// timeout, plus a margin) and is cancelled.
    pub abandoned_after: Duration,
}

impl Default for MaintenanceConfig {
    fn default() -> Self {
        MaintenanceConfig {
            reap_every: Duration::from_secs(5),
            prune_every: Duration::from_secs(300),
            retention: Duration::from_secs(7 * 24 * 3600),
            abandoned_after: Duration::from_secs(660),
        }
    }
}

/// Runs until `shutdown` resolves.
pub async fn run(
    queue: Queue,
    relay: TokenRelay,
    config: MaintenanceConfig,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let mut reap = tokio::time::interval(config.reap_every.max(Duration::from_millis(10)));
    let mut prune = tokio::time::interval(config.prune_every.max(Duration::from_millis(10)));
    // After a stall (e.g. Postgres down), run once rather than in a burst.
    reap.set_missed_tick_behavior(MissedTickBehavior::Delay);
    prune.set_missed_tick_behavior(MissedTickBehavior::Delay);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            _ = reap.tick() => reap_once(&queue, &relay, config.abandoned_after).await,
            _ = prune.tick() => prune_once(&queue, config.retention).await,
        }
    }
}

async fn reap_once(queue: &Queue, relay: &TokenRelay, abandoned_after: Duration) {
    // Dead runners first: their jobs' leases are expired, so this same pass requeues them.
    match crate::runners::mark_dead(queue.pool(), crate::runners::LIVENESS_WINDOW).await {
        Ok(dead) if dead.is_empty() => {}
        Ok(dead) => tracing::warn!(runners = ?dead, "runners went silent; marked dead"),
        Err(e) => tracing::warn!(error = %e, "marking silent runners dead failed"),
    }
    match queue.continue_lost(relay).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(jobs = n, "lost jobs continue from their streams"),
        Err(e) => tracing::warn!(error = %e, "continuing lost jobs failed"),
    }
    match queue.reap_expired().await {
        Ok(0) => {}
        Ok(n) => tracing::info!(jobs = n, "reaped expired leases"),
        Err(e) => tracing::warn!(error = %e, "reaping expired leases failed"),
    }
    match queue.cancel_abandoned(abandoned_after).await {
        Ok(0) => {}
        Ok(n) => tracing::warn!(
            jobs = n,
            "cancelled queued interactive jobs whose client is gone"
        ),
        Err(e) => tracing::warn!(error = %e, "cancelling abandoned jobs failed"),
    }
}

async fn prune_once(queue: &Queue, retention: Duration) {
    match queue.prune_finished(retention).await {
        Ok(0) => {}
        Ok(n) => tracing::info!(jobs = n, "pruned finished jobs"),
        Err(e) => tracing::warn!(error = %e, "pruning finished jobs failed"),
    }
}
