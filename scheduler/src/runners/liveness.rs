//! Noticing runners that went silent. A runner not heard from within [`LIVENESS_WINDOW`] is
//! not live: claims, the model listing, warm replica counts and pool turns leave it out, and
//! the maintenance loop marks it `dead` and expires the leases of the jobs it holds at once,
//! so the lease reaper requeues them (fenced by `(id, attempt)`, with its usual rules for
//! streamed interactive jobs) on the same maintenance tick instead of waiting out each lease.
//! If the runner was only stalled, its next heartbeat makes it `active` again and its lease
//! renewal reports those jobs as lost, so it drops them.

use crate::SchedulerError;
use sqlx::PgPool;
use std::time::Duration;
use uuid::Uuid;

/// Silence after which a runner is no longer live, and is marked dead: three missed
/// heartbeats at the runner's longest heartbeat interval (10 s). One window for both, so the
/// moment a runner stops counting as serving (for claims, `/v1/models`, warm replicas, pool
/// turns) is the moment it may be marked dead and its jobs requeued: no gap where it is
/// neither, and no runner counted as serving while its jobs are taken back.
pub const LIVENESS_WINDOW: Duration = Duration::from_secs(30);

/// Marks runners silent for longer than `after` as `dead` and expires their jobs' leases;
/// returns the runners marked. Idempotent, safe to run from several schedulers at once.
pub async fn mark_dead(pool: &PgPool, after: Duration) -> Result<Vec<Uuid>, SchedulerError> {
    let dead: Vec<Uuid> = sqlx::query_scalar(include_str!("queries/mark_dead.sql"))
        .bind(after.as_secs_f64())
        .fetch_all(pool)
        .await?;
    Ok(dead)
}
