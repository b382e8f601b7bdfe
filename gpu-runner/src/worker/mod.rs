//! The runner's worker: claim → engine → stream → complete.
//!
//! One async task owns the table of held jobs and reacts to: a newly claimed job (sent to its
//! model's engine thread), an engine's report (`outputs.rs`: a step's outputs appended to
//! Redis in one pipelined round trip, finished jobs completed in Postgres fenced by
//! `(id, attempt)`), a finished model load, a cancel signal (the engine drops the sequence
//! within one step), the heartbeat tick (renews leases of exactly the jobs held, learns of
//! cancellations and of the operator's cordon/drain/resume), an operator's state hint, and
//! the owner probe's verdict (when the GPU's owner returns, every held job is handed back
//! and the runner reports `yielded`).

mod adapters;
mod claimer;
mod completing;
mod devices;
mod embed_host;
mod engine_host;
mod in_flight;
mod lending;
mod lora_budget;
mod models;
mod neighbour_bench;
mod offer;
mod outputs;
mod owner;
mod preparing;
mod residency;
mod runner_state;
mod telemetry;
mod upkeep;
mod uplink;

pub use adapters::{LoraSettings, LoraSpec, DEFAULT_LORA_MEMORY_BYTES};
pub use engine_host::{HostOptions, PanicHook, DEFAULT_PREPARE_TIMEOUT};
pub use lending::{LendingError, LendingWindows};
pub use neighbour_bench::{noisy_neighbour, Latency, NeighbourRound};
pub use offer::{ModelOffer, WarmPolicy};
pub use owner::OwnerProbe;

use crate::control_plane::{ControlPlane, PlaneError};
use claimer::{ClaimLoop, Claimed};
use engine_host::{HostCommand, HostEvent};
use fallow_protocol::job::{GenerateRequest, JobEvent};
use fallow_scheduler::queue::{FailOutcome, JobKind};
use fallow_scheduler::runners::{self, RunnerInfo};
use in_flight::{InFlight, InFlightTable};
use models::{Admission, EngineKey, LoadDone, Loaded, Models};
use runner_state::RunnerState;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch, Semaphore};
use uuid::Uuid;

/// The longest heartbeat interval: the scheduler declares a runner dead after
/// `runners::LIVENESS_WINDOW` (three of these) of silence.
const MAX_HEARTBEAT_EVERY: Duration = Duration::from_secs(10);

/// How often idle models are checked against their keep-alive and background loads start.
const MODELS_TICK: Duration = Duration::from_secs(1);

/// How often the owner probe runs unless told: the owner gets the machine back within
/// about this long.
pub const DEFAULT_OWNER_EVERY: Duration = Duration::from_millis(500);

#[derive(Debug, Clone)]
pub struct RunnerConfig {
    /// Jobs held at once.
    pub slots: usize,
    pub lease: Duration,
    pub heartbeat_every: Duration,
    /// How long the claim loop waits for a NOTIFY before polling again.
    pub poll_every: Duration,
    pub host: String,
    /// Watches the GPU's owner; `None` = the machine is lent unconditionally.
    pub owner_probe: Option<OwnerProbe>,
    /// How often the owner probe looks.
    pub owner_every: Duration,
    /// How long the owner must have been idle before the runner returns.
    pub owner_grace: Duration,
    /// After a shutdown signal, how long in-flight jobs may finish before the rest are
    /// handed back (zero: at once).
    pub shutdown_deadline: Duration,
    /// When the machine is lent at all; `None` = always. Outside them the runner yields.
    pub lend_windows: Option<LendingWindows>,
    /// Memory the resident models may take (weights + KV pools); `None`: no limit, every
    /// model is loaded at start and stays loaded.
    pub memory_budget: Option<u64>,
    /// How long a job of a model warm on another runner waits for it before this runner,
    /// which would have to load the model, takes it.
    pub cold_claim_after: Duration,
    /// The operator's group this runner belongs to.
    pub pool: String,
    /// At most this share (0–1) of the pool's runners is lent at once; `None`: no limit.
    pub pool_max_share: Option<f64>,
    /// Preparing one request takes at most this long; past it the request is refused.
    pub prepare_timeout: Duration,
    /// A test hook that makes an engine thread panic (see [`PanicHook`]); off by default.
    pub panic_hook: PanicHook,
    /// The LoRA adapters served over the models.
    pub loras: LoraSettings,
    /// Notified once the runner is registered, its models listed, before any loads: `fallow
    /// dev` waits for it before it says it is serving.
    pub registered: Option<Arc<tokio::sync::Notify>>,
}

impl Default for RunnerConfig {
    fn default() -> Self {
        RunnerConfig {
            slots: 16,
            lease: Duration::from_secs(30),
            heartbeat_every: Duration::from_secs(5),
            poll_every: Duration::from_secs(1),
            host: hostname(),
            owner_probe: None,
            owner_every: DEFAULT_OWNER_EVERY,
            owner_grace: Duration::from_secs(60),
            shutdown_deadline: Duration::ZERO,
            lend_windows: None,
            memory_budget: None,
            cold_claim_after: Duration::from_secs(2),
            pool: runners::DEFAULT_POOL.to_string(),
            pool_max_share: None,
            prepare_timeout: engine_host::DEFAULT_PREPARE_TIMEOUT,
            panic_hook: PanicHook::default(),
            loras: LoraSettings::default(),
            registered: None,
        }
    }
}

const YIELD_MESSAGE: &str = "The GPU's owner needed the machine back, so the runner stepped aside.";
const POOL_MESSAGE: &str =
    "The runner's pool already lends its share of machines, so the runner stepped aside.";

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".to_string())
}

/// Loads the models that fit at start, heartbeating meanwhile so that a long load does not
/// make the registered runner look dead.
async fn preload_alive(
    models: &mut Models,
    plane: &dyn ControlPlane,
    runner_id: Uuid,
    config: &RunnerConfig,
) -> anyhow::Result<()> {
    let preload = models.preload_now();
    tokio::pin!(preload);
    let mut beat = tokio::time::interval(config.heartbeat_every.min(MAX_HEARTBEAT_EVERY));
    beat.tick().await; // the first tick is immediate; registering just counted as one
    loop {
        tokio::select! {
            done = &mut preload => return done,
            _ = beat.tick() => {
                if let Err(e) = plane.heartbeat(runner_id, 0).await {
                    tracing::warn!(error = %e, "runner heartbeat during a load failed");
                }
            }
        }
    }
}

/// Runs the worker until `shutdown` resolves, then hands held jobs back to the queue.
/// Every call to the control plane goes through `plane`, whatever carries it.
pub async fn run(
    plane: Arc<dyn ControlPlane>,
    offers: Vec<ModelOffer>,
    config: RunnerConfig,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let (events_tx, mut host_rx) = mpsc::unbounded_channel::<(EngineKey, HostEvent)>();
    let (loads_tx, mut loads_rx) = mpsc::unbounded_channel::<LoadDone>();
    for offer in &offers {
        telemetry::register_model(&offer.id);
    }
    let adapters = Arc::new(adapters::Adapters::new(config.loras.clone())?);
    let (models, scope) = Models::new(offers, config.memory_budget, events_tx, loads_tx);
    let mut models = models.with_host_options(HostOptions {
        panic_hook: config.panic_hook.clone(),
        prepare_timeout: config.prepare_timeout,
        adapters,
    });
    let mut owner = owner_watch(&config);
    // Closed until the probe's first look.
    let owner_active = owner.as_mut().is_some_and(|rx| *rx.borrow_and_update());
    let info = RunnerInfo {
        host: config.host.clone(),
        devices: devices::describe(),
        slots: config.slots as i32,
        models: models.entries(chrono::Utc::now().timestamp()),
        warm: models.warm(),
        pool: config.pool.clone(),
    };
    // Registered before any model loads: the api lists the runner's models at once, so a
    // request sent during a load waits in the queue instead of getting a 404.
    let runner_id = plane.register(&info).await?;
    tracing::info!(%runner_id, slots = config.slots, "runner registered");
    if let Some(registered) = &config.registered {
        registered.notify_one();
    }
    if owner_active {
        models.preload_later(); // the owner has the machine: load when it is lent
    } else if let Err(e) = preload_alive(&mut models, &*plane, runner_id, &config).await {
        if let Err(e) = plane.deregister(runner_id).await {
            tracing::warn!(error = %e, "deregistering after a failed load failed");
        }
        return Err(e);
    }
    let (mut state, gate) = RunnerState::new();
    state.set_owner_active(owner_active);
    let mut hints = plane.state_hints(runner_id);

    let slots = Arc::new(Semaphore::new(config.slots));
    let (claim_tx, mut claim_rx) = mpsc::channel::<Claimed>(config.slots.max(1));
    let claim_task = tokio::spawn(
        ClaimLoop {
            plane: plane.clone(),
            runner_id,
            models: scope,
            cold_after: config.cold_claim_after,
            slots: slots.clone(),
            lease: config.lease,
            poll_every: config.poll_every,
            gate,
        }
        .run(claim_tx),
    );
    let mut cancels = plane.cancel_signals();
    let (uplink, mut uplink_news) = uplink::Uplink::start(plane.clone());
    let mut heartbeat = tokio::time::interval(config.heartbeat_every.min(MAX_HEARTBEAT_EVERY));
    let mut models_tick = tokio::time::interval(MODELS_TICK);
    let mut worker = Worker {
        plane: plane.clone(),
        models,
        table: InFlightTable::default(),
        runner_id,
        info,
        state,
        lease: config.lease,
        pool_max_share: config.pool_max_share,
        completing: completing::Completing::default(),
        drain_deadline: None,
        revoked: false,
        uplink,
    };
    worker.models_changed().await;
    worker.check_pool_turn().await;
    tokio::pin!(shutdown);
    while !worker.revoked {
        tokio::select! {
            _ = &mut shutdown => break,
            Some(claimed) = claim_rx.recv() => worker.start(claimed).await,
            Some((engine, event)) = host_rx.recv() => worker.on_engine_event(engine, event).await,
            Some(done) = loads_rx.recv() => worker.on_load(done).await,
            Some(job) = cancels.recv() => worker.cancel(job).await,
            Some(news) = uplink_news.recv() => worker.on_uplink(news),
            Some(active) = owner_changed(&mut owner) => worker.on_owner(active).await,
            Some(()) = hints.recv() => worker.refresh_state().await,
            _ = heartbeat.tick() => worker.heartbeat().await,
            _ = models_tick.tick() => worker.tend_models().await,
            _ = until(worker.drain_deadline) => worker.on_drain_deadline().await,
        }
    }
    claim_task.abort();
    if worker.revoked {
        // Nothing this runner reports counts any more: the control plane already handed its
        // jobs to other runners. Stop computing them, and stop.
        for job in worker.leave_engines() {
            tracing::warn!(job_id = %job.job_id, "revoked: dropped a job");
        }
        return Err(PlaneError::Revoked(
            "its token was revoked, or another runner registered with it".into(),
        )
        .into());
    }
    // Claimed but not started: back at once, without waiting for their leases to expire.
    while let Ok(Claimed { job, .. }) = claim_rx.try_recv() {
        let message = "The runner shut down.";
        worker
            .release(job.id, job.attempt, false, None, "runner_shutdown", message)
            .await;
    }
    if !config.shutdown_deadline.is_zero() && !worker.table.is_empty() {
        tracing::info!(deadline = ?config.shutdown_deadline, jobs = worker.table.len(), "shutting down: letting in-flight jobs finish");
        let deadline = tokio::time::sleep(config.shutdown_deadline);
        tokio::pin!(deadline);
        while !worker.table.is_empty() {
            tokio::select! {
                _ = &mut deadline => break,
                Some((engine, event)) = host_rx.recv() => worker.on_engine_event(engine, event).await,
                Some(job) = cancels.recv() => worker.cancel(job).await,
                _ = heartbeat.tick() => worker.heartbeat().await,
            }
        }
    }
    worker
        .hand_back_all("runner_shutdown", "The runner shut down.")
        .await;
    worker.uplink.flush().await;
    if let Err(e) = plane.deregister(runner_id).await {
        tracing::warn!(error = %e, "deregistering the runner failed");
    }
    Ok(())
}

/// Resolves at `deadline`; never without one.
async fn until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Starts watching the owner (its probe, if one is configured and can run here) and the
/// lending windows; `None` when neither applies and the machine is lent unconditionally.
fn owner_watch(config: &RunnerConfig) -> Option<watch::Receiver<bool>> {
    let probe = config.owner_probe.clone().filter(|probe| {
        let available = probe.available();
        if !available {
            tracing::warn!(
                ?probe,
                "owner probe unavailable on this machine; lending unconditionally"
            );
        }
        available
    });
    if probe.is_none() && config.lend_windows.is_none() {
        return None;
    }
    tracing::info!(?probe, windows = ?config.lend_windows, grace = ?config.owner_grace, "watching the GPU's owner");
    Some(owner::watch(
        probe,
        config.lend_windows.clone(),
        config.owner_every,
        config.owner_grace,
    ))
}

/// The owner's next verdict; never resolves without a probe (or once the probe is gone).
async fn owner_changed(owner: &mut Option<watch::Receiver<bool>>) -> Option<bool> {
    if let Some(rx) = owner {
        if rx.changed().await.is_ok() {
            return Some(*rx.borrow_and_update());
        }
    }
    std::future::pending().await
}

struct Worker {
    plane: Arc<dyn ControlPlane>,
    models: Models,
    table: InFlightTable,
    runner_id: Uuid,
    /// Kept to register again if the registry forgot this runner.
    info: RunnerInfo,
    state: RunnerState,
    lease: Duration,
    pool_max_share: Option<f64>,
    /// Finished jobs whose completion has not committed yet: their leases stay renewed.
    completing: completing::Completing,
    /// When an operator's drain with a deadline hands back what is still held.
    drain_deadline: Option<tokio::time::Instant>,
    /// Set once the control plane says this runner's token no longer admits it.
    revoked: bool,
    /// Where every step's events leave, in order.
    uplink: uplink::Uplink,
}

impl Worker {
    async fn start(&mut self, claimed: Claimed) {
        let Claimed { job, slot } = claimed;
        if self.state.owner_active() {
            // Claimed in the instant the owner came back: straight back to the queue.
            // Its request keeps any progress it came with.
            self.release(
                job.id,
                job.attempt,
                false,
                None,
                "runner_yielded",
                YIELD_MESSAGE,
            )
            .await;
            return;
        }
        tracing::debug!(job_id = %job.id, attempt = job.attempt, "job claimed");
        if job.attempt == 1 {
            let waited = (chrono::Utc::now() - job.created_at).num_milliseconds() as f64 / 1e3;
            telemetry::record_queue_time(&job.request.model, waited);
        }
        let id = self.table.insert(InFlight::new(&job, Some(slot)));
        let busy = self.table.busy_models();
        match self.models.admit(id, &job.request, &busy) {
            Admission::Ready => self.send_to_engine(id, Box::new(job.request)).await,
            Admission::Waiting => self.models_changed().await,
            Admission::NoRoom => {
                // Memory was taken between the claim and now: another runner, or this one
                // later, will serve it.
                self.table.remove(id);
                self.release(
                    job.id,
                    job.attempt,
                    false,
                    None,
                    "no_room",
                    "No memory to load the model.",
                )
                .await;
                self.models_changed().await;
            }
        }
    }

    /// Hands a held job to its model's engine.
    async fn send_to_engine(&mut self, id: u64, request: Box<GenerateRequest>) {
        let sent = self
            .models
            .host(&request.model)
            .is_some_and(|host| host.send(HostCommand::Add { id, request }));
        if !sent {
            if let Some(job) = self.table.remove(id) {
                self.fail_job(job.job_id, job.attempt, "engine stopped", true)
                    .await;
            }
        }
    }

    /// A model's load finished: its waiting jobs go to the new engine, or back to the queue.
    async fn on_load(&mut self, done: LoadDone) {
        match self.models.finish_load(done) {
            Loaded::Ready(waiting) => {
                for (id, request) in waiting {
                    if self.table.contains(id) {
                        self.send_to_engine(id, request).await;
                    }
                }
            }
            Loaded::Failed { waiting, error } => {
                let message = format!("The model could not be loaded: {error}");
                for (id, _) in waiting {
                    if let Some(job) = self.table.remove(id) {
                        self.end_with_error(job, "model_load_failed", &message, true)
                            .await;
                    }
                }
            }
            Loaded::Stale => {}
        }
        self.models_changed().await;
    }

    /// The set of resident models may have changed: publish the claim scope and the
    /// registry's warm list.
    async fn models_changed(&mut self) {
        let busy = self.table.busy_models();
        self.models.publish_scope(&busy);
        let warm = self.models.warm();
        if warm != self.info.warm {
            if let Err(e) = self.plane.set_warm(self.runner_id, &warm).await {
                tracing::warn!(error = %e, "publishing the warm models failed");
            }
            self.info.warm = warm;
        }
    }

    /// Every second: keep-alive expiry, deferred evictions, background loads.
    async fn tend_models(&mut self) {
        if !self.state.may_claim() {
            return; // yielded, cordoned or draining: no loads meanwhile
        }
        let busy = self.table.busy_models();
        self.models.tick(&busy);
        self.models_changed().await;
    }

    async fn cancel(&mut self, job_id: Uuid) {
        let Some(request) = self.table.request_for(job_id) else {
            return;
        };
        let Some(job) = self.table.remove(request) else {
            return;
        };
        if let Some(host) = self.models.host(&job.model) {
            host.send(HostCommand::Abort { id: request });
        }
        let partial = job.completion();
        self.append(&[(
            job_id,
            JobEvent::Error {
                code: "cancelled".to_string(),
                message: "The request was cancelled.".to_string(),
            },
        )])
        .await;
        self.uplink.flush().await;
        if let Err(e) = self
            .plane
            .mark_cancelled(job_id, job.attempt, &partial)
            .await
        {
            tracing::warn!(%job_id, error = %e, "marking a job cancelled failed");
        }
        tracing::info!(%job_id, "job cancelled; sequence dropped");
    }

    async fn end_with_error(&mut self, job: InFlight, code: &str, message: &str, retryable: bool) {
        // A retryable failure with progress continues on the next attempt, even a stream
        // that already carried tokens: its client sees the rest follow, or an error once no
        // attempt is left.
        if let Some(progress) = job.progress().filter(|_| retryable) {
            self.uplink.flush().await; // what reached the stream is what continues
            match self
                .plane
                .fail_and_continue(job.job_id, job.attempt, message, &progress)
                .await
            {
                Ok(FailOutcome::Failed) => {
                    let error = JobEvent::Error {
                        code: code.to_string(),
                        message: message.to_string(),
                    };
                    self.append(&[(job.job_id, error)]).await;
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(job_id = %job.job_id, error = %e, "failing a job failed"),
            }
            return;
        }
        // Without progress, a stream that already carried tokens cannot be resumed by
        // another attempt.
        let retry =
            retryable && !(job.streamed && job.client_streams && job.kind == JobKind::Interactive);
        if !retry || job.streamed {
            self.append(&[(
                job.job_id,
                JobEvent::Error {
                    code: code.to_string(),
                    message: message.to_string(),
                },
            )])
            .await;
        }
        self.fail_job(job.job_id, job.attempt, message, retry).await;
    }

    async fn fail_job(&self, job_id: Uuid, attempt: i32, message: &str, retryable: bool) {
        self.uplink.flush().await; // the job's events first
        if let Err(e) = self.plane.fail(job_id, attempt, message, retryable).await {
            tracing::warn!(%job_id, error = %e, "failing a job failed");
        }
    }

    /// Queues events for their streams, in order (see [`uplink`]).
    async fn append(&self, events: &[(Uuid, JobEvent)]) -> uplink::Sent {
        self.send_step(Vec::new(), events.to_vec()).await
    }

    /// Queues a step: its first tokens' `streamed` marks, then its events.
    async fn send_step(
        &self,
        marks: Vec<(Uuid, i32)>,
        events: Vec<(Uuid, JobEvent)>,
    ) -> uplink::Sent {
        let caps = events
            .iter()
            .filter_map(|(job, _)| Some((*job, self.table.stream_entries(*job)?)))
            .collect();
        self.uplink.send(marks, events, caps).await
    }
}
