//! The claim loop: takes jobs from the queue only for free slots. A slot is a semaphore
//! permit that travels with the claimed job and is returned when the job is dropped, so the
//! runner can never hold more jobs than it has slots. It claims only while the gate is open
//! (see `runner_state.rs`: the runner is `active` and its owner idle), checked right before
//! every claim, so a cordon, drain or yield stops new claims at once. What it claims for is
//! the scope `models.rs` publishes: the models warm here, and cold models this runner could
//! load, whose jobs the queue hands over only when no other runner has them warm or they
//! have waited `cold_after`.

use super::models::ClaimModels;
use crate::control_plane::{ControlPlane, PlaneError};
use fallow_scheduler::queue::{ClaimScope, ClaimedJob};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use uuid::Uuid;

pub struct Claimed {
    pub job: ClaimedJob,
    pub slot: OwnedSemaphorePermit,
}

pub struct ClaimLoop {
    pub plane: Arc<dyn ControlPlane>,
    pub runner_id: Uuid,
    pub models: watch::Receiver<ClaimModels>,
    /// How long a job of a model warm elsewhere waits before this runner loads it.
    pub cold_after: Duration,
    pub slots: Arc<Semaphore>,
    pub lease: Duration,
    pub poll_every: Duration,
    /// Open while claiming is allowed.
    pub gate: watch::Receiver<bool>,
}

impl ClaimLoop {
    /// Runs until the receiver of `claimed` is dropped.
    pub async fn run(mut self, claimed: mpsc::Sender<Claimed>) {
        loop {
            if self.gate.wait_for(|open| *open).await.is_err() {
                return; // the worker is gone
            }
            let Ok(first) = self.slots.clone().acquire_owned().await else {
                return;
            };
            // Waiting for a slot may have taken long: look at the gate again.
            if !*self.gate.borrow() {
                continue;
            }
            let limit = 1 + self.slots.available_permits() as i64;
            let models = self.models.borrow().clone();
            let scope = ClaimScope {
                warm: &models.warm,
                cold: &models.cold,
                cold_after: self.cold_after,
            };
            let jobs = match self
                .plane
                .claim(self.runner_id, &scope, limit, self.lease)
                .await
            {
                Ok(jobs) => jobs,
                // The worker stops at its next heartbeat; claiming again cannot succeed.
                Err(e @ PlaneError::Revoked(_)) => {
                    tracing::warn!(error = %e, "claiming stopped");
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "claiming jobs failed; retrying");
                    drop(first);
                    tokio::time::sleep(self.poll_every).await;
                    continue;
                }
            };
            if jobs.is_empty() {
                drop(first);
                self.plane.wait_for_work(self.poll_every).await;
                continue;
            }
            let mut first = Some(first);
            for job in jobs {
                // The claim was bounded by free permits, so one is always there.
                let slot = match first.take() {
                    Some(p) => p,
                    None => match self.slots.clone().acquire_owned().await {
                        Ok(p) => p,
                        Err(_) => return,
                    },
                };
                if claimed.send(Claimed { job, slot }).await.is_err() {
                    return;
                }
            }
        }
    }
}
