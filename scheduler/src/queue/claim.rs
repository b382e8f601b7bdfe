//! Claiming jobs and keeping their leases alive.
//!
//! A runner claims at most its free slots in one statement, then renews the leases of what
//! it holds on every heartbeat, with each job's checkpoint (its progress so far), from which
//! the job continues if its runner dies and Redis lost its stream. Claims share the fleet between tenants by weight (see
//! `queries/claim.sql`). A claimed row that cannot be decoded fails alone, fenced, and the
//! rest of the claim goes ahead. Claims prefer models the runner holds warm: a job of a model
//! it would have to load goes to it only when no other runner holds that model warm, or
//! after the job has waited a while. A lease that is not renewed expires and the reaper takes the
//! job back (see `housekeeping.rs`).

use super::rows::ClaimedRow;
use super::{ClaimedJob, Queue};
use crate::runners::LIVENESS_WINDOW;
use crate::SchedulerError;
use chrono::{DateTime, Duration as ChronoDuration, Utc};
use fallow_protocol::job::Progress;
use std::collections::HashSet;
use std::time::Duration;
use uuid::Uuid;

/// Which models a claim may take jobs for: those the runner holds in memory (warm) and
/// those it could load (cold).
#[derive(Debug, Clone, Copy)]
pub struct ClaimScope<'a> {
    pub warm: &'a [String],
    pub cold: &'a [String],
    /// How long a job of a model warm on another runner waits for that runner before a cold
    /// runner takes it (and loads the model).
    pub cold_after: Duration,
}

/// What a heartbeat learned about the jobs a runner holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LeaseRenewal {
    /// Held jobs whose cancellation was requested: stop them and `mark_cancelled`.
    pub cancel_requested: Vec<Uuid>,
    /// Listed jobs this runner no longer holds (reaped, finished, re-claimed elsewhere):
    /// stop working on them; any completion would be stale anyway.
    pub lost: Vec<Uuid>,
}

/// A held job at a heartbeat: its lease, and where its attempt has got to.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Checkpoint {
    pub id: Uuid,
    pub attempt: i32,
    /// The progress to continue from should the runner die, or `None` to keep the last one
    /// (nothing new, or the job cannot be continued from a checkpoint).
    pub progress: Option<Progress>,
    /// Tokens generated so far over all choices, earlier attempts' included.
    pub generated: u32,
}

impl Queue {
    /// Claims up to `limit` runnable jobs for one of `models` in one statement (`FOR UPDATE
    /// SKIP LOCKED`), setting the lease: interactive before batch, fair between tenants, each
    /// tenant's jobs in its own priority then age order. Every model counts as warm (see
    /// [`claim_in`](Self::claim_in)).
    pub async fn claim(
        &self,
        runner_id: Uuid,
        models: &[String],
        limit: i64,
        lease: Duration,
    ) -> Result<Vec<ClaimedJob>, SchedulerError> {
        let scope = ClaimScope {
            warm: models,
            cold: &[],
            cold_after: Duration::ZERO,
        };
        self.claim_in(runner_id, &scope, limit, lease).await
    }

    /// Claims up to `limit` runnable jobs within `scope`: any job of a warm model, and a job of
    /// a cold model only when no other live, active runner holds that model warm or once it
    /// has waited `cold_after`.
    pub async fn claim_in(
        &self,
        runner_id: Uuid,
        scope: &ClaimScope<'_>,
        limit: i64,
        lease: Duration,
    ) -> Result<Vec<ClaimedJob>, SchedulerError> {
        // The query scans once per model, so a repeated model would only waste the limit;
        // a model both warm and cold is warm.
        let mut models: Vec<(&str, bool)> = scope
            .warm
            .iter()
            .map(|m| (m.as_str(), true))
            .chain(scope.cold.iter().map(|m| (m.as_str(), false)))
            .collect();
        models.sort_unstable_by(|a, b| a.0.cmp(b.0).then(b.1.cmp(&a.1)));
        models.dedup_by(|later, first| later.0 == first.0);
        if limit <= 0 || models.is_empty() {
            return Ok(Vec::new());
        }
        let (names, warm): (Vec<&str>, Vec<bool>) = models.into_iter().unzip();
        let now = self.clock.now();
        let cold_before =
            now - ChronoDuration::from_std(scope.cold_after).unwrap_or(ChronoDuration::days(365));
        let mut rows: Vec<ClaimedRow> = sqlx::query_as(include_str!("queries/claim.sql"))
            .bind(&names)
            .bind(now)
            .bind(limit)
            .bind(runner_id)
            .bind(lease_end(now, lease))
            .bind(&warm)
            .bind(cold_before)
            .bind(LIVENESS_WINDOW.as_secs_f64())
            .fetch_all(&self.pool)
            .await?;
        rows.sort_by_key(|row| row.rank);
        let mut claimed = Vec::with_capacity(rows.len());
        for row in rows {
            let (id, attempt) = (row.id, row.attempt);
            match ClaimedJob::try_from(row) {
                Ok(job) => claimed.push(job),
                Err(err) => self.fail_undecodable(id, attempt, &err).await,
            }
        }
        Ok(claimed)
    }

    /// Fails a just-claimed job whose stored row cannot be decoded, so that it alone ends
    /// (retrying would only fail again) and the rest of the claim goes ahead.
    async fn fail_undecodable(&self, id: Uuid, attempt: i32, err: &SchedulerError) {
        tracing::error!(job = %id, attempt, error = %err, "claimed job is undecodable; failing it");
        let reason = format!("the stored job could not be read: {err}");
        if let Err(fail_err) = self.fail(id, attempt, &reason, false).await {
            // The lease runs out and the reaper takes the job back; the next claim tries again.
            tracing::warn!(job = %id, error = %fail_err, "could not fail the undecodable job");
        }
    }

    /// Renews the leases of the listed `(id, attempt)` jobs held by this runner; returns the
    /// ids among them whose cancellation was requested.
    pub async fn renew_leases(
        &self,
        runner_id: Uuid,
        jobs: &[(Uuid, i32)],
        lease: Duration,
    ) -> Result<Vec<Uuid>, SchedulerError> {
        Ok(self
            .renew_leases_detailed(runner_id, jobs, lease)
            .await?
            .cancel_requested)
    }

    /// [`renew_leases`](Self::renew_leases), also reporting the listed jobs this runner no
    /// longer holds.
    pub async fn renew_leases_detailed(
        &self,
        runner_id: Uuid,
        jobs: &[(Uuid, i32)],
        lease: Duration,
    ) -> Result<LeaseRenewal, SchedulerError> {
        let held: Vec<Checkpoint> = jobs
            .iter()
            .map(|&(id, attempt)| Checkpoint {
                id,
                attempt,
                progress: None,
                generated: 0,
            })
            .collect();
        self.renew_with_checkpoints(runner_id, &held, lease).await
    }

    /// Renews the leases of the held jobs and stores their checkpoints, in one statement per
    /// heartbeat (never a write per token).
    pub async fn renew_with_checkpoints(
        &self,
        runner_id: Uuid,
        jobs: &[Checkpoint],
        lease: Duration,
    ) -> Result<LeaseRenewal, SchedulerError> {
        if jobs.is_empty() {
            return Ok(LeaseRenewal::default());
        }
        let ids: Vec<Uuid> = jobs.iter().map(|j| j.id).collect();
        let attempts: Vec<i32> = jobs.iter().map(|j| j.attempt).collect();
        let progress = jobs
            .iter()
            .map(|j| j.progress.as_ref().map(serde_json::to_string).transpose())
            .collect::<Result<Vec<Option<String>>, _>>()
            .map_err(|e| SchedulerError::Corrupt(format!("progress not serialisable: {e}")))?;
        let generated: Vec<i32> = jobs
            .iter()
            .map(|j| i32::try_from(j.generated).unwrap_or(i32::MAX))
            .collect();
        let renewed: Vec<(Uuid, bool)> = sqlx::query_as(include_str!("queries/renew_leases.sql"))
            .bind(runner_id)
            .bind(&ids)
            .bind(&attempts)
            .bind(lease_end(self.clock.now(), lease))
            .bind(&progress)
            .bind(&generated)
            .fetch_all(&self.pool)
            .await?;
        let held: HashSet<Uuid> = renewed.iter().map(|(id, _)| *id).collect();
        Ok(LeaseRenewal {
            cancel_requested: renewed
                .iter()
                .filter(|(_, cancel)| *cancel)
                .map(|(id, _)| *id)
                .collect(),
            lost: ids.into_iter().filter(|id| !held.contains(id)).collect(),
        })
    }
}

/// `now + lease`, saturating: an absurd lease must not overflow into an error.
fn lease_end(now: DateTime<Utc>, lease: Duration) -> DateTime<Utc> {
    let lease = ChronoDuration::from_std(lease).unwrap_or(ChronoDuration::days(365));
    now.checked_add_signed(lease).unwrap_or(now)
}
