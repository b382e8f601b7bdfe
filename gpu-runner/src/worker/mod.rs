//! The runner's worker: claim → engine → stream → complete.
//!
//! One async task owns the table of held jobs and reacts to four things: a newly claimed job
//! (sent to its model's engine thread), an engine step's outputs (appended to Redis in one
//! pipelined round trip, finished jobs completed in Postgres fenced by `(id, attempt)`), a
//! cancel signal (the engine drops the sequence within one step), the heartbeat tick
//! (renews leases of exactly the jobs held, learns of cancellations and of the operator's
//! cordon/drain/resume), an operator's state hint, and the owner probe's verdict (when the
//! GPU's owner returns, every held job is handed back and the runner reports `yielded`).

mod claimer;
mod devices;
mod engine_host;
mod in_flight;
mod lending;
mod owner;
mod prompt;
mod runner_state;
mod telemetry;
mod upkeep;

pub use lending::{LendingError, LendingWindows};
pub use owner::OwnerProbe;
pub use prompt::encode_chat;

use crate::engine::runtime::LoadedModel;
use claimer::{ClaimLoop, Claimed};
use engine_host::{EngineHost, HostCommand, HostEvent};
use fallow_scheduler::job::JobEvent;
use fallow_scheduler::queue::{JobKind, Queue};
use fallow_scheduler::runners::{self, ModelEntry, RunnerInfo};
use fallow_scheduler::stream::TokenRelay;
use in_flight::{InFlight, InFlightTable};
use runner_state::RunnerState;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch, Semaphore};
use uuid::Uuid;

/// The longest heartbeat interval: the scheduler declares a runner dead after
/// `runners::DEAD_AFTER_SECS` (three of these) of silence.
const MAX_HEARTBEAT_EVERY: Duration = Duration::from_secs(10);

/// A model this runner serves.
pub struct ServedModel {
    pub id: String,
    pub loaded: LoadedModel,
}

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
    /// When the machine is lent at all; `None` = always. Outside them the runner yields.
    pub lend_windows: Option<LendingWindows>,
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
            owner_every: Duration::from_millis(500),
            owner_grace: Duration::from_secs(60),
            lend_windows: None,
        }
    }
}

const YIELD_MESSAGE: &str = "The GPU's owner needed the machine back, so the runner stepped aside.";

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".to_string())
}

struct Engines {
    ids: Vec<String>,
    hosts: Vec<EngineHost>,
}

impl Engines {
    fn index_of(&self, model: &str) -> Option<usize> {
        self.ids.iter().position(|m| m == model)
    }
}

/// Runs the worker until `shutdown` resolves, then hands held jobs back to the queue.
pub async fn run(
    queue: Queue,
    relay: TokenRelay,
    models: Vec<ServedModel>,
    config: RunnerConfig,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let (engines, entries, mut host_rx) = start_engines(models)?;
    let info = RunnerInfo {
        host: config.host.clone(),
        devices: devices::describe(),
        slots: config.slots as i32,
        models: entries,
    };
    let runner_id = runners::register(queue.pool(), &info).await?;
    tracing::info!(%runner_id, models = ?engines.ids, slots = config.slots, "runner registered");
    let (mut state, gate) = RunnerState::new();
    let mut owner = owner_watch(&config);
    if let Some(rx) = &mut owner {
        // Closed until the probe's first look.
        state.set_owner_active(*rx.borrow_and_update());
    }
    let mut hints = runners::state_hints(queue.pool().clone(), runner_id);

    let slots = Arc::new(Semaphore::new(config.slots));
    let (claim_tx, mut claim_rx) = mpsc::channel::<Claimed>(config.slots.max(1));
    let claim_task = tokio::spawn(
        ClaimLoop {
            queue: queue.clone(),
            runner_id,
            models: engines.ids.clone(),
            slots: slots.clone(),
            lease: config.lease,
            poll_every: config.poll_every,
            gate,
        }
        .run(claim_tx),
    );
    let mut cancels = relay.cancel_signals();
    let mut heartbeat = tokio::time::interval(config.heartbeat_every.min(MAX_HEARTBEAT_EVERY));
    let mut worker = Worker {
        queue: queue.clone(),
        relay,
        engines,
        table: InFlightTable::default(),
        runner_id,
        info,
        state,
        lease: config.lease,
    };
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            Some(claimed) = claim_rx.recv() => worker.start(claimed).await,
            Some((engine, event)) = host_rx.recv() => worker.on_engine_event(engine, event).await,
            Some(job) = cancels.recv() => worker.cancel(job).await,
            Some(active) = owner_changed(&mut owner) => worker.on_owner(active).await,
            Some(()) = hints.recv() => worker.refresh_state().await,
            _ = heartbeat.tick() => worker.heartbeat().await,
        }
    }
    claim_task.abort();
    worker
        .hand_back_all("runner_shutdown", "The runner shut down.")
        .await;
    if let Err(e) = runners::deregister(queue.pool(), runner_id).await {
        tracing::warn!(error = %e, "deregistering the runner failed");
    }
    Ok(())
}

/// Every engine's events, tagged with the engine's index.
type HostEvents = mpsc::UnboundedReceiver<(usize, HostEvent)>;

/// Starts one engine thread per model; their events arrive on one channel, tagged with the
/// engine's index.
fn start_engines(
    models: Vec<ServedModel>,
) -> anyhow::Result<(Engines, Vec<ModelEntry>, HostEvents)> {
    let (host_tx, host_rx) = mpsc::unbounded_channel::<(usize, HostEvent)>();
    let mut engines = Engines {
        ids: Vec::new(),
        hosts: Vec::new(),
    };
    let mut entries = Vec::new();
    let created = chrono::Utc::now().timestamp();
    for (index, model) in models.into_iter().enumerate() {
        entries.push(ModelEntry {
            id: model.id.clone(),
            context_length: model.loaded.frontend.context_length as u32,
            owned_by: "fallow".to_string(),
            created,
            tool_parser: model.loaded.frontend.output_syntax.tool_parser.clone(),
            reasoning_parser: model.loaded.frontend.output_syntax.reasoning_parser.clone(),
        });
        let (host, mut events) =
            EngineHost::spawn(model.loaded.engine, model.loaded.frontend, &model.id)?;
        let tx = host_tx.clone();
        tokio::spawn(async move {
            while let Some(ev) = events.recv().await {
                if tx.send((index, ev)).is_err() {
                    return;
                }
            }
        });
        engines.ids.push(model.id);
        engines.hosts.push(host);
    }
    Ok((engines, entries, host_rx))
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
    queue: Queue,
    relay: TokenRelay,
    engines: Engines,
    table: InFlightTable,
    runner_id: Uuid,
    /// Kept to register again if the registry forgot this runner.
    info: RunnerInfo,
    state: RunnerState,
    lease: Duration,
}

impl Worker {
    async fn start(&mut self, claimed: Claimed) {
        let Claimed { job, slot } = claimed;
        if self.state.owner_active() {
            // Claimed in the instant the owner came back: straight back to the queue.
            self.release(job.id, job.attempt, false, "runner_yielded", YIELD_MESSAGE)
                .await;
            return;
        }
        let Some(engine) = self.engines.index_of(&job.request.model) else {
            // Claims are filtered to our models, so this is a bug, not a user error.
            self.fail_job(job.id, job.attempt, "model not served by this runner", true)
                .await;
            return;
        };
        tracing::debug!(job_id = %job.id, attempt = job.attempt, "job claimed");
        if job.attempt == 1 {
            let waited = (chrono::Utc::now() - job.created_at).num_milliseconds() as f64 / 1e3;
            telemetry::record_queue_time(&job.request.model, waited);
        }
        let request = Box::new(job.request.clone());
        let id = self.table.insert(InFlight::new(&job, engine, Some(slot)));
        if !self.engines.hosts[engine].send(HostCommand::Add { id, request }) {
            if let Some(job) = self.table.remove(id) {
                self.fail_job(job.job_id, job.attempt, "engine stopped", true)
                    .await;
            }
        }
    }

    async fn on_engine_event(&mut self, engine: usize, event: HostEvent) {
        match event {
            HostEvent::Admitted { id, prompt_tokens } => {
                if let Some(job) = self.table.get_mut(id) {
                    tracing::debug!(job_id = %job.job_id, prompt_tokens, "job admitted to the engine");
                    let started = JobEvent::Started {
                        attempt: job.attempt,
                    };
                    let job_id = job.job_id;
                    self.append(&[(job_id, started)]).await;
                }
            }
            HostEvent::Rejected { id, code, message } => {
                if let Some(job) = self.table.remove(id) {
                    self.append(&[(
                        job.job_id,
                        JobEvent::Error {
                            code,
                            message: message.clone(),
                        },
                    )])
                    .await;
                    self.fail_job(job.job_id, job.attempt, &message, false)
                        .await;
                }
            }
            HostEvent::Step(outputs) => self.on_step(outputs).await,
            HostEvent::Failed { message } => {
                tracing::error!(%message, engine, "engine failed");
                for id in self.table.requests() {
                    if self.table.get_mut(id).map(|j| j.engine) == Some(engine) {
                        if let Some(job) = self.table.remove(id) {
                            self.end_with_error(job, "engine_error", &message, true)
                                .await;
                        }
                    }
                }
            }
        }
    }

    async fn on_step(&mut self, outputs: Vec<crate::engine::llm::SeqOutput>) {
        let mut events = Vec::with_capacity(outputs.len() + 1);
        let mut finished = Vec::new();
        let mut first_tokens = Vec::new();
        for out in outputs {
            let request = out.request_id;
            let Some(job) = self.table.get_mut(request) else {
                continue; // aborted a step ago
            };
            let was_streamed = job.streamed;
            events.push((job.job_id, job.absorb(out)));
            if !was_streamed
                && job.streamed
                && job.client_streams
                && job.kind == JobKind::Interactive
            {
                first_tokens.push((job.job_id, job.attempt));
            }
            if job.is_finished() && !finished.contains(&request) {
                finished.push(request);
            }
        }
        let mut done = Vec::new();
        for request in finished {
            if let Some(job) = self.table.remove(request) {
                let completion = job.completion();
                telemetry::record_prefix_cache(&self.engines.ids[job.engine], &completion.usage);
                events.push((
                    job.job_id,
                    JobEvent::Final {
                        completion: completion.clone(),
                    },
                ));
                done.push((job, completion));
            }
        }
        // Recorded before the tokens leave: once a client has seen tokens, the reaper must not
        // hand the job to another runner (the client would see two attempts spliced).
        if !first_tokens.is_empty() {
            let marks = first_tokens
                .iter()
                .map(|&(job_id, attempt)| self.queue.mark_streamed(job_id, attempt));
            for (result, (job_id, _)) in futures::future::join_all(marks)
                .await
                .into_iter()
                .zip(&first_tokens)
            {
                if let Err(e) = result {
                    tracing::warn!(%job_id, error = %e, "marking a job streamed failed");
                }
            }
        }
        self.append(&events).await;
        for (job, completion) in done {
            let queue = self.queue.clone();
            // Completing off the loop keeps the next step's tokens flowing.
            tokio::spawn(async move {
                match queue.complete(job.job_id, job.attempt, &completion).await {
                    Ok(true) => tracing::debug!(job_id = %job.job_id, "job completed"),
                    Ok(false) => tracing::info!(job_id = %job.job_id, "stale completion ignored"),
                    Err(e) => tracing::warn!(job_id = %job.job_id, error = %e, "completing failed"),
                }
                drop(job);
            });
        }
        if self.state.registry() == "draining" && self.table.leases().is_empty() {
            self.reconcile().await; // drained: tell the operator now, not at the heartbeat
        }
    }

    async fn cancel(&mut self, job_id: Uuid) {
        let Some(request) = self.table.request_for(job_id) else {
            return;
        };
        let Some(job) = self.table.remove(request) else {
            return;
        };
        self.engines.hosts[job.engine].send(HostCommand::Abort { id: request });
        let partial = job.completion();
        self.append(&[(
            job_id,
            JobEvent::Error {
                code: "cancelled".to_string(),
                message: "The request was cancelled.".to_string(),
            },
        )])
        .await;
        if let Err(e) = self
            .queue
            .mark_cancelled(job_id, job.attempt, Some(&partial))
            .await
        {
            tracing::warn!(%job_id, error = %e, "marking a job cancelled failed");
        }
        tracing::info!(%job_id, "job cancelled; sequence dropped");
    }

    async fn end_with_error(&mut self, job: InFlight, code: &str, message: &str, retryable: bool) {
        // A stream that already carried tokens cannot be resumed by another attempt.
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
        if let Err(e) = self.queue.fail(job_id, attempt, message, retryable).await {
            tracing::warn!(%job_id, error = %e, "failing a job failed");
        }
    }

    async fn append(&self, events: &[(Uuid, JobEvent)]) {
        if events.is_empty() {
            return;
        }
        if let Err(e) = self.relay.append(events).await {
            tracing::warn!(error = %e, "appending to the token relay failed");
        }
    }
}
