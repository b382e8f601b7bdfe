//! The engine runs on its own OS thread: a step is CPU-bound work that must never block the
//! async runtime that talks to Postgres and Redis. The host owns the engine and the model's
//! frontend; it takes commands over a channel and sends every step's outputs back as one
//! message, so the relay can append them to Redis in one round trip.
//!
//! The engine thread does only steps and their bookkeeping. Rendering and tokenizing a
//! prompt, compiling its grammar and stop matchers, and waiting for the grammar vocabulary
//! happen on the model's preparation threads ([`super::preparing`]), which hand the engine
//! thread finished requests: an 8 MB prompt or a fresh json_schema pauses no other sequence.
//!
//! A panic on the engine thread is caught: the engine it interrupted may be inconsistent, so
//! the thread reports `Failed` and ends, and the worker ends its jobs and unloads the model
//! (the next job loads it again). A panic while preparing one request refuses only that
//! request.

use super::adapters::Adapters;
use super::preparing::{self, Router};
use super::telemetry::EngineGauges;
use fallow_engine::llm::{LlmEngine, Prepared, SeqOutput};
use fallow_engine::runtime::ModelFrontend;
use fallow_protocol::job::{Completion, GenerateRequest};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc as std_mpsc;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// What the worker asks of the engine thread.
pub enum HostCommand {
    /// Render, tokenize and admit a request under the engine-local id.
    Add {
        id: u64,
        request: Box<GenerateRequest>,
    },
    /// Drop a request and free its KV blocks.
    Abort { id: u64 },
}

/// What the engine thread reports.
#[derive(Debug)]
pub enum HostEvent {
    /// A request was admitted, with its prompt's token ids. A token-id prompt comes back
    /// as text too (for `echo`).
    Admitted {
        id: u64,
        /// The prompt's token ids (a continuation's are its progress's).
        prompt_ids: Vec<u32>,
        prompt_text: Option<String>,
    },
    /// A request was answered without engine steps (tokenize, detokenize, embed): its
    /// whole result.
    Answered {
        id: u64,
        completion: Box<Completion>,
    },
    /// A request could not be admitted (bad template input, prompt too long, …).
    Rejected {
        id: u64,
        code: String,
        message: String,
    },
    /// The outputs of one engine step.
    Step(Vec<SeqOutput>),
    /// The engine failed in a way that ends every request in it.
    Failed { message: String },
}

pub struct EngineHost {
    route: Route,
}

/// Where a host's commands go.
enum Route {
    /// To one thread that takes them as they come (an embedding model's).
    Direct(std_mpsc::Sender<HostCommand>),
    /// Adds through the preparation threads; aborts to wherever the request is.
    Prepared(Router),
}

/// What reaches a generative model's engine thread.
pub(super) enum ToEngine {
    /// A prepared request to admit.
    Admit(Box<ReadyRequest>),
    /// Drop a request and free its KV blocks.
    Abort(u64),
}

/// A request its preparation thread finished.
pub(super) struct ReadyRequest {
    pub prepared: Prepared,
    /// A token-id prompt as text, for `echo`.
    pub prompt_text: Option<String>,
    /// The test hook fired for it: the first step after admitting it panics.
    pub arm_panic: bool,
}

/// A test hook: the engine thread panics at the first step after admitting a request whose
/// input contains this text. Set only by debug builds' hidden `--test-engine-panic-marker`,
/// so the suite can check that a panic is contained.
#[derive(Debug, Clone, Default)]
pub struct PanicHook {
    pub marker: Option<Arc<str>>,
}

/// How long preparing one request may take when nothing else is configured: far more than
/// an 8 MB prompt or a large json_schema needs, far less than a client waits.
pub const DEFAULT_PREPARE_TIMEOUT: Duration = Duration::from_secs(30);

/// How a model's threads behave.
#[derive(Debug, Clone)]
pub struct HostOptions {
    pub panic_hook: PanicHook,
    /// Preparing one request (rendering, tokenizing, compiling its grammar, waiting for the
    /// grammar vocabulary) takes at most this long; past it the request is refused.
    pub prepare_timeout: Duration,
    /// The runner's LoRA adapters, read by the preparation threads.
    pub adapters: Arc<Adapters>,
}

impl Default for HostOptions {
    fn default() -> Self {
        HostOptions {
            panic_hook: PanicHook::default(),
            prepare_timeout: DEFAULT_PREPARE_TIMEOUT,
            adapters: Arc::new(Adapters::none()),
        }
    }
}

impl PanicHook {
    pub(super) fn fires_for(&self, request: &GenerateRequest) -> bool {
        let Some(marker) = &self.marker else {
            return false;
        };
        serde_json::to_string(&(&request.messages, &request.input))
            .is_ok_and(|input| input.contains(&**marker))
    }
}

impl EngineHost {
    /// Starts the engine thread and the model's preparation threads. Events arrive on the
    /// returned receiver.
    pub fn spawn(
        engine: LlmEngine,
        frontend: ModelFrontend,
        name: &str,
        options: HostOptions,
    ) -> std::io::Result<(EngineHost, mpsc::UnboundedReceiver<HostEvent>)> {
        let (to_engine, engine_rx) = std_mpsc::channel();
        let (ev_tx, ev_rx) = mpsc::unbounded_channel();
        let gauges = EngineGauges::new(name);
        let router = preparing::spawn(
            Arc::new(frontend),
            engine.preparer(),
            options,
            to_engine,
            ev_tx.clone(),
            name,
        )?;
        std::thread::Builder::new()
            .name(format!("engine-{name}"))
            .spawn(move || {
                let host = Host {
                    engine,
                    events: ev_tx,
                    panic_armed: false,
                };
                host_loop(host, engine_rx, gauges)
            })?;
        Ok((
            EngineHost {
                route: Route::Prepared(router),
            },
            ev_rx,
        ))
    }

    /// The host of a thread that reads `commands` (an embedding model's, say).
    pub(super) fn from_sender(commands: std_mpsc::Sender<HostCommand>) -> Self {
        EngineHost {
            route: Route::Direct(commands),
        }
    }

    /// Sends a command; false if the model's threads are gone.
    pub fn send(&self, command: HostCommand) -> bool {
        match &self.route {
            Route::Direct(commands) => commands.send(command).is_ok(),
            Route::Prepared(router) => router.send(command),
        }
    }

    /// Requests not yet handed to the engine thread.
    #[cfg(test)]
    fn preparing(&self) -> usize {
        match &self.route {
            Route::Direct(_) => 0,
            Route::Prepared(router) => router.preparing(),
        }
    }
}

/// The engine thread's state.
struct Host {
    engine: LlmEngine,
    events: mpsc::UnboundedSender<HostEvent>,
    /// The test hook fired: the next step panics.
    panic_armed: bool,
}

/// Why the engine thread stops.
enum Stop {
    /// The worker dropped its end: the model was unloaded.
    Closed,
    /// The engine failed or panicked; `Failed` was sent.
    Failed,
}

fn host_loop(mut host: Host, commands: std_mpsc::Receiver<ToEngine>, gauges: EngineGauges) {
    loop {
        gauges.publish(&host.engine.stats());
        // Idle: block for the next command. Busy: take whatever arrived, then step.
        if !host.engine.has_work() {
            match commands.recv() {
                Ok(cmd) => {
                    if host.guarded(|host| host.apply(cmd)).is_err() {
                        return;
                    }
                }
                Err(_) => return,
            }
        }
        loop {
            match commands.try_recv() {
                Ok(cmd) => {
                    if host.guarded(|host| host.apply(cmd)).is_err() {
                        return;
                    }
                }
                Err(std_mpsc::TryRecvError::Empty) => break,
                Err(std_mpsc::TryRecvError::Disconnected) => return,
            }
        }
        if host.engine.has_work() {
            match host.guarded(Host::step) {
                Ok(Ok(())) => {}
                Ok(Err(Stop::Closed | Stop::Failed)) | Err(()) => return,
            }
        }
    }
}

impl Host {
    /// Runs `work`, turning a panic into `Failed` (and `Err`: the thread must end, since the
    /// engine may be half way through a change).
    fn guarded<T>(&mut self, work: impl FnOnce(&mut Host) -> T) -> Result<T, ()> {
        catch_unwind(AssertUnwindSafe(|| work(self))).map_err(|payload| {
            let message = format!("the engine panicked: {}", panic_text(&*payload));
            tracing::error!(%message, "engine thread stopped");
            let _ = self.events.send(HostEvent::Failed { message });
        })
    }

    fn step(&mut self) -> Result<(), Stop> {
        if std::mem::take(&mut self.panic_armed) {
            panic!("test hook: a prompt carried the panic marker");
        }
        match self.engine.step() {
            Ok(outputs) if outputs.is_empty() => Ok(()),
            Ok(outputs) => self
                .events
                .send(HostEvent::Step(outputs))
                .map_err(|_| Stop::Closed),
            Err(e) => {
                let _ = self.events.send(HostEvent::Failed {
                    message: e.to_string(),
                });
                Err(Stop::Failed)
            }
        }
    }

    fn apply(&mut self, command: ToEngine) {
        match command {
            ToEngine::Abort(id) => self.engine.abort(id),
            ToEngine::Admit(ready) => {
                let ReadyRequest {
                    prepared,
                    prompt_text,
                    arm_panic,
                } = *ready;
                let id = prepared.id();
                let prompt_ids = prepared.prompt().to_vec();
                self.panic_armed |= arm_panic;
                let event = match self.engine.add_prepared(prepared) {
                    Ok(()) => HostEvent::Admitted {
                        id,
                        prompt_ids,
                        prompt_text,
                    },
                    Err(e) => HostEvent::Rejected {
                        id,
                        code: e.code().to_string(),
                        message: e.to_string(),
                    },
                };
                let _ = self.events.send(event);
            }
        }
    }
}

/// The message of a panic's payload (`panic!` with a literal or a formatted string).
pub(super) fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".to_string())
}

#[cfg(test)]
#[path = "engine_host_tests.rs"]
mod tests;
