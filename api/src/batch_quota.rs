//! The per-tenant quota of queued batch lines at `POST /v1/batches`: a batch whose lines
//! would take the tenant's unfinished lines past `max_batch_queued_lines` is refused with a
//! 429. Its input file is read once to count its lines, only for a tenant with a quota.
//!
//! The check and the insert are two statements, so concurrent creations of one tenant can
//! overshoot the quota by the batches created in between; the quota bounds volume, and a
//! tenant gains at most a few batches by racing itself.

use crate::auth::Caller;
use crate::error::ApiError;
use crate::state::AppState;
use fallow_scheduler::batch::files::FileRecord;
use fallow_scheduler::rate::batch_quota;
use std::time::Duration;
use uuid::Uuid;

/// How long a refused client is told to wait: batches take minutes, not seconds.
const RETRY_AFTER: Duration = Duration::from_secs(60);

/// Refuses the batch if its lines do not fit the caller's quota; otherwise returns its line
/// count, to [`record`] once the batch exists. `None`: the caller has no quota.
pub async fn check(
    state: &AppState,
    caller: &Caller,
    file: &FileRecord,
) -> Result<Option<u64>, ApiError> {
    let Some(tenant) = &caller.tenant else {
        return Ok(None);
    };
    let quota = tenant.rate.max_batch_queued_lines;
    if quota <= 0 {
        return Ok(None);
    }
    // Without a store the Batches endpoints are off, and the route has said so already.
    let Some(store) = state.store() else {
        return Ok(None);
    };
    let reader = store
        .get(&file.object_key)
        .await
        .map_err(fallow_scheduler::SchedulerError::from)?;
    let lines = batch_quota::count_lines(reader).await?;
    let queued = batch_quota::queued_lines(state.queue().pool(), tenant.id).await?;
    let wanted = i64::try_from(lines).unwrap_or(i64::MAX);
    if queued.saturating_add(wanted) > quota {
        return Err(ApiError::RateLimitReached {
            limit: "batch_queued_lines",
            message: format!(
                "Batch quota reached: this batch has {lines} lines and {queued} lines of your batches are still queued; max_batch_queued_lines is {quota}. Wait for a batch to finish, or split this one."
            ),
            retry_after: RETRY_AFTER,
        });
    }
    Ok(Some(lines))
}

/// Records a new batch's line count, so the quota counts it before the batch is expanded.
pub async fn record(state: &AppState, batch: Uuid, lines: Option<u64>) -> Result<(), ApiError> {
    if let Some(lines) = lines {
        batch_quota::record_input_lines(state.queue().pool(), batch, lines).await?;
    }
    Ok(())
}
