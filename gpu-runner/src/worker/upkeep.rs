//! The worker's upkeep with the control plane: the heartbeat (liveness, lease renewal with
//! each job's checkpoint, cancellations, the registry state), an operator's state hint, the
//! runner's own state reports (`yielded`, `active`, `drained`), operators' eviction
//! requests, the owner probe's verdict (a yield also unloads every model, freeing the
//! device's memory), handing jobs back to the queue when the runner steps aside or shuts
//! down, and noting when the control plane no longer admits the runner.

use super::engine_host::HostCommand;
use super::in_flight::InFlight;
use super::uplink::News;
use super::{telemetry, Worker, POOL_MESSAGE, YIELD_MESSAGE};
use crate::control_plane::PlaneError;
use fallow_protocol::job::{JobEvent, Progress};
use fallow_scheduler::queue::{Checkpoint, FailOutcome};
use fallow_scheduler::runners;
use std::time::Duration;
use uuid::Uuid;

/// How long a heartbeat may wait for the control plane before the upkeep gives up this
/// round (the next comes a few seconds later).
const HEARTBEAT_BUDGET: Duration = Duration::from_secs(5);

impl Worker {
    pub(super) async fn heartbeat(&mut self) {
        // Jobs being completed need their leases renewed, but have no progress to record.
        let mut leases = self.table.checkpoints();
        leases.extend(
            self.completing
                .leases()
                .into_iter()
                .map(|(id, attempt)| Checkpoint {
                    id,
                    attempt,
                    progress: None,
                    generated: 0,
                }),
        );
        let plane = self.plane.clone();
        let beat = plane.heartbeat(self.runner_id, leases.len() as i32);
        // A control plane out of reach is given up on quickly: the loop has an owner to
        // watch and steps to send meanwhile.
        let beat = tokio::time::timeout(HEARTBEAT_BUDGET, beat)
            .await
            .unwrap_or_else(|_| Err(PlaneError::Unavailable("the heartbeat timed out".into())));
        match beat {
            Ok(state) => self.set_registry(state).await,
            Err(PlaneError::UnknownRunner(_)) => {
                tracing::warn!(runner_id = %self.runner_id, "the registry forgot this runner; registering again");
                if let Err(e) = plane.register_as(self.runner_id, &self.info).await {
                    tracing::warn!(error = %e, "registering again failed");
                }
            }
            Err(e) => {
                self.notice(&e);
                tracing::warn!(error = %e, "runner heartbeat failed");
                // The rest of the upkeep would wait on the same unreachable control plane.
                if matches!(e, PlaneError::Unavailable(_)) || self.revoked {
                    return;
                }
            }
        }
        self.take_evictions().await;
        self.count_replicas().await;
        self.check_pool_turn().await;
        self.reconcile().await;
        if leases.is_empty() {
            return;
        }
        let renewal = self.plane.renew(self.runner_id, &leases, self.lease).await;
        match renewal {
            Ok(renewal) => {
                for job in renewal.cancel_requested {
                    self.cancel(job).await;
                }
                for job in renewal.lost {
                    self.drop_lost(job);
                }
            }
            Err(e) => {
                self.notice(&e);
                tracing::warn!(error = %e, "renewing leases failed");
            }
        }
    }

    /// Takes note of a failed call: a revoked (or replaced) runner must stop.
    fn notice(&mut self, error: &PlaneError) {
        self.revoked |= matches!(error, PlaneError::Revoked(_));
    }

    /// What the uplink found: jobs the control plane no longer gives this runner, or whose
    /// events could not be delivered, are dropped; a revoked runner stops.
    pub(super) fn on_uplink(&mut self, news: News) {
        match news {
            News::Refused(jobs) | News::Undelivered(jobs) => {
                for job in jobs {
                    self.drop_lost(job);
                }
            }
            News::Revoked => self.revoked = true,
        }
    }

    /// A job this runner no longer holds (its lease was reaped, e.g. while it was stalled
    /// and declared dead): stop computing it; any report would be stale.
    fn drop_lost(&mut self, job_id: Uuid) {
        let Some(request) = self.table.request_for(job_id) else {
            return;
        };
        if let Some(job) = self.table.remove(request) {
            self.abort_in_engine(&job.model, request);
            tracing::warn!(%job_id, "lost the lease of a job; dropped it");
        }
    }

    /// Drops a request from its model's engine (a no-op while the model is still loading:
    /// the job simply is no longer in the table when the load finishes).
    pub(super) fn abort_in_engine(&self, model: &str, request: u64) {
        if let Some(host) = self.models.host(model) {
            host.send(HostCommand::Abort { id: request });
        }
    }

    /// An operator changed this runner's state or asked it to unload a model: read both now
    /// rather than at the heartbeat.
    pub(super) async fn refresh_state(&mut self) {
        match self.plane.state(self.runner_id).await {
            Ok(Some(state)) => self.set_registry(state).await,
            Ok(None) => {}
            Err(e) => tracing::warn!(error = %e, "reading the runner state failed"),
        }
        self.take_evictions().await;
        self.reconcile().await;
    }

    /// Takes the registry's state, and while draining, the drain's deadline: reading it on
    /// every heartbeat keeps the timer right if the operator drains again with another.
    async fn set_registry(&mut self, state: runners::RunnerState) {
        self.state.set_registry(state);
        if state != runners::RunnerState::Draining {
            self.drain_deadline = None;
            return;
        }
        match self.plane.drain_left(self.runner_id).await {
            Ok(left) => self.drain_deadline = left.map(|left| tokio::time::Instant::now() + left),
            Err(e) => tracing::warn!(error = %e, "reading the drain's deadline failed"),
        }
    }

    /// A drain's deadline passed: what is still held goes back to the queue with its
    /// progress, for other runners to continue; the runner then reports `drained`.
    pub(super) async fn on_drain_deadline(&mut self) {
        self.drain_deadline = None;
        if !self.table.is_empty() {
            tracing::info!(
                jobs = self.table.len(),
                "the drain's deadline passed: handing jobs back"
            );
            self.hand_back_all("runner_drained", "The runner was drained.")
                .await;
        }
        self.reconcile().await;
    }

    /// Carries out the operator's eviction requests.
    async fn take_evictions(&mut self) {
        match self.plane.take_evictions(self.runner_id).await {
            Ok(models) if models.is_empty() => {}
            Ok(models) => {
                let busy = self.table.busy_models();
                for model in models {
                    tracing::info!(%model, "the operator asked to unload a model");
                    self.models.request_evict(&model, &busy);
                }
                self.models_changed().await;
            }
            Err(e) => tracing::warn!(error = %e, "reading eviction requests failed"),
        }
    }

    /// Refreshes the warm replica counts the `min_warm` policy needs.
    async fn count_replicas(&mut self) {
        if !self.models.wants_replica_counts() {
            return;
        }
        match self.plane.warm_replicas().await {
            Ok(counts) => self.models.set_replicas(counts),
            Err(e) => tracing::warn!(error = %e, "counting warm replicas failed"),
        }
    }

    /// Reports the state this runner owns (`yielded`, back to `active`, `drained`).
    pub(super) async fn reconcile(&mut self) {
        let held = self.table.leases().len();
        let Some(change) = self.state.reconcile(held) else {
            return;
        };
        match self
            .plane
            .report_state(self.runner_id, change.from, change.to)
            .await
        {
            Ok(state) => self.state.set_registry(state),
            Err(e) => {
                tracing::warn!(error = %e, to = %change.to, "reporting the runner state failed")
            }
        }
    }

    /// The owner probe's verdict changed: the machine may no longer (or again) be lent.
    /// The pool hears of it at once, so another member can take this runner's place.
    pub(super) async fn on_owner(&mut self, active: bool) {
        let noticed = std::time::Instant::now();
        let was_lent = self.state.lent();
        self.state.set_owner_active(active);
        self.after_lending_change(was_lent).await;
        self.check_pool_turn().await;
        let took = noticed.elapsed();
        if was_lent && !self.state.lent() {
            telemetry::record_handover(took.as_secs_f64());
        }
        tracing::info!(
            owner_active = active,
            state = %self.state.registry(),
            took_ms = took.as_millis() as u64,
            "owner activity handled"
        );
    }

    /// Reports whether the owner is idle and learns whether it is this runner's turn to be
    /// lent (only with a maximum pool share).
    pub(super) async fn check_pool_turn(&mut self) {
        let Some(share) = self.pool_max_share else {
            return;
        };
        let owner_idle = !self.state.owner_active();
        match self
            .plane
            .pool_turn(self.runner_id, owner_idle, share)
            .await
        {
            Ok(turn) => {
                let was_lent = self.state.lent();
                self.state.set_pool_turn(turn);
                self.after_lending_change(was_lent).await;
            }
            Err(e) => tracing::warn!(error = %e, "asking for the pool's turn failed"),
        }
    }

    /// Not lent any more: stop claiming (the gate closed already), hand every held job back,
    /// unload the models, report `yielded`. Lent again: report `active`, which reopens the
    /// gate, and load the models again in the background.
    async fn after_lending_change(&mut self, was_lent: bool) {
        let lent = self.state.lent();
        if was_lent && !lent {
            let message = if self.state.owner_active() {
                YIELD_MESSAGE
            } else {
                POOL_MESSAGE
            };
            // The device first: the owner gets its time and memory at once, whatever the
            // network to the control plane does meanwhile.
            let leaving = self.leave_engines();
            self.models.unload_all("yield");
            // `yielded` before the jobs go back: a claim already on its way (a gateway's
            // long poll) then cannot take them back.
            self.reconcile().await;
            self.release_all(leaving, "runner_yielded", message).await;
            self.models_changed().await;
        } else if !was_lent && lent {
            self.models.preload_later();
        }
        self.reconcile().await;
    }

    /// Hands every held job back to the queue (fenced, no attempt used up) with its
    /// progress, so another runner continues it where it stopped: the owner returned, or
    /// the runner is shutting down. The job leaves the table before its engine request is
    /// aborted, so the progress is exactly what reached its stream.
    pub(super) async fn hand_back_all(&mut self, code: &str, message: &str) {
        let leaving = self.leave_engines();
        self.release_all(leaving, code, message).await;
    }

    /// Takes every held job out of the table and its engine, without a word to the control
    /// plane yet.
    pub(super) fn leave_engines(&mut self) -> Vec<InFlight> {
        let mut leaving = Vec::new();
        for id in self.table.requests() {
            if let Some(job) = self.table.remove(id) {
                self.abort_in_engine(&job.model, id);
                leaving.push(job);
            }
        }
        leaving
    }

    /// Hands jobs that left their engines back to the queue, each with its progress.
    async fn release_all(&mut self, jobs: Vec<InFlight>, code: &str, message: &str) {
        for job in jobs {
            let streamed = job.streamed && job.client_streams;
            let progress = job.progress();
            if progress.is_some() {
                telemetry::record_continuation(&job.model, code);
            }
            self.release(
                job.job_id,
                job.attempt,
                streamed,
                progress.as_ref(),
                code,
                message,
            )
            .await;
        }
    }

    /// `ControlPlane::release`, ending the job's stream with an error event when the job cannot go
    /// back: an interactive stream that already sent tokens and has no progress to continue
    /// from fails (attempts that start over are never spliced).
    pub(super) async fn release(
        &self,
        job_id: Uuid,
        attempt: i32,
        streamed: bool,
        progress: Option<&Progress>,
        code: &str,
        message: &str,
    ) {
        self.uplink.flush().await; // the job's events first: its progress is what they hold
        match self.plane.release(job_id, attempt, progress).await {
            Ok(FailOutcome::Requeued) => {
                tracing::info!(%job_id, continues = progress.is_some(), "job handed back to the queue");
            }
            Ok(FailOutcome::Failed) => {
                let message = if streamed {
                    format!("{message} The response had already started streaming and cannot be resumed elsewhere; retry the request.")
                } else {
                    message.to_string()
                };
                self.append(&[(
                    job_id,
                    JobEvent::Error {
                        code: code.to_string(),
                        message,
                    },
                )])
                .await;
            }
            Ok(FailOutcome::Stale) => {}
            Err(e) => tracing::warn!(%job_id, error = %e, "handing a job back failed"),
        }
    }
}
