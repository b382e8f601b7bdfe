//! Pools: runners grouped by the operator (`--pool`, e.g. one office's workstations), of which
//! at most a share may be lent at once (`--pool-max-share`), so some machines of the group
//! always stay with their owners.
//!
//! Each runner reports whether its owner is idle and asks for its turn: the pool's live
//! members in service are counted, and the first `floor(share × members)` of those whose owner
//! is idle, in order of registration, are lent. The order is the same for every member, so
//! they agree without talking to each other; a runner whose owner returns gives its place to
//! the next one at that runner's next heartbeat.

use super::LIVENESS_WINDOW;
use crate::SchedulerError;
use sqlx::PgPool;
use uuid::Uuid;

/// Records whether the runner's owner is idle and says whether the runner may be lent now,
/// under a maximum share `max_share` (0–1) of its pool. An unknown runner may not.
pub async fn pool_turn(
    pool: &PgPool,
    runner: Uuid,
    owner_idle: bool,
    max_share: f64,
) -> Result<bool, SchedulerError> {
    let row: Option<(i64, i64)> = sqlx::query_as(include_str!("queries/pool_turn.sql"))
        .bind(runner)
        .bind(owner_idle)
        .bind(LIVENESS_WINDOW.as_secs_f64())
        .fetch_optional(pool)
        .await?;
    let Some((members, ahead)) = row else {
        return Ok(false);
    };
    let lendable = (max_share.clamp(0.0, 1.0) * members as f64 + 1e-9).floor() as i64;
    Ok(owner_idle && ahead < lendable)
}
