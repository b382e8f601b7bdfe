//! Noticing runners that went silent. A runner that has not heartbeated for
//! [`DEAD_AFTER_SECS`] is marked `dead`, and the leases of the jobs it holds are expired at
//! once, so the lease reaper requeues them (fenced by `(id, attempt)`, with its usual rules
//! for streamed interactive jobs) on the same maintenance tick instead of waiting out each
//! lease. If the runner was only stalled, its next heartbeat makes it `active` again and its
//! lease renewal reports those jobs as lost, so it drops them.

use crate::SchedulerError;
use sqlx::PgPool;
use std::time::Duration;
use uuid::Uuid;

/// Silence after which a runner is dead: three missed heartbeats at the runner's longest
/// heartbeat interval (10 s).
pub const DEAD_AFTER_SECS: u64 = 30;

/// Marks runners silent for longer than `after` as `dead` and expires their jobs' leases;
/// returns the runners marked. Idempotent, safe to run from several schedulers at once.
pub async fn mark_dead(pool: &PgPool, after: Duration) -> Result<Vec<Uuid>, SchedulerError> {
    let dead: Vec<Uuid> = sqlx::query_scalar(
        "WITH dead AS ( \
             UPDATE runners SET state = 'dead', in_flight = 0 \
             WHERE state <> 'dead' AND last_heartbeat < now() - make_interval(secs => $1) \
             RETURNING id \
         ), expired AS ( \
             UPDATE jobs SET lease_expires_at = '-infinity' \
             WHERE state = 'running' AND runner_id IN (SELECT id FROM dead) \
             RETURNING id \
         ) \
         SELECT id FROM dead",
    )
    .bind(after.as_secs_f64())
    .fetch_all(pool)
    .await?;
    Ok(dead)
}
