//! A claim answered at most once: when a gateway runner's claim commits but its answer is
//! lost on the way (the network drops, the api process dies), the runner asks again with
//! the same claim id and gets the same jobs back, rather than leaving them leased to it,
//! unseen, until their leases run out. The answer is kept in Redis for the lease's length.

use crate::queue::ClaimedJob;
use crate::stream::TokenRelay;
use crate::SchedulerError;
use redis::AsyncCommands;
use std::time::Duration;
use uuid::Uuid;

fn key(runner: Uuid, claim: Uuid) -> String {
    format!("fallow:claim:{runner}:{claim}")
}

/// The jobs an earlier claim with this id gave `runner`, if it was answered.
pub async fn recall(
    relay: &TokenRelay,
    runner: Uuid,
    claim: Uuid,
) -> Result<Option<Vec<ClaimedJob>>, SchedulerError> {
    let mut conn = relay.manager().await?;
    let kept: Option<String> = conn.get(key(runner, claim)).await?;
    kept.map(|json| serde_json::from_str(&json).map_err(|e| SchedulerError::Corrupt(e.to_string())))
        .transpose()
}

/// Keeps a claim's answer for `lease`: after that its jobs are no longer the runner's.
pub async fn remember(
    relay: &TokenRelay,
    runner: Uuid,
    claim: Uuid,
    jobs: &[ClaimedJob],
    lease: Duration,
) -> Result<(), SchedulerError> {
    let json = serde_json::to_string(jobs).map_err(|e| SchedulerError::Corrupt(e.to_string()))?;
    let mut conn = relay.manager().await?;
    let millis = u64::try_from(lease.as_millis()).unwrap_or(u64::MAX).max(1);
    let () = conn.pset_ex(key(runner, claim), json, millis).await?;
    Ok(())
}
