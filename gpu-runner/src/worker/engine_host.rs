//! The engine runs on its own OS thread: a step is CPU-bound work that must never block the
//! async runtime that talks to Postgres and Redis. The host owns the engine and the model's
//! frontend; it takes commands over a channel and sends every step's outputs back as one
//! message, so the relay can append them to Redis in one round trip.
//!
//! A panic on the engine thread is caught: the engine it interrupted may be inconsistent, so
//! the thread reports `Failed` and ends, and the worker ends its jobs and unloads the model
//! (the next job loads it again). A panic while preparing one request's prompt refuses only
//! that request.

use super::telemetry::EngineGauges;
use fallow_engine::llm::{EngineRequest, LlmEngine, Resume, ResumeChoice, SeqOutput};
use fallow_engine::runtime::ModelFrontend;
use fallow_protocol::job::{Completion, GenerateRequest, Prompt, Task, Tokenized, Usage};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc as std_mpsc;
use std::sync::Arc;
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
    commands: std_mpsc::Sender<HostCommand>,
}

/// A test hook: the engine thread panics at the first step after admitting a request whose
/// input contains this text. Set only by debug builds' hidden `--test-engine-panic-marker`,
/// so the suite can check that a panic is contained.
#[derive(Debug, Clone, Default)]
pub struct PanicHook {
    pub marker: Option<Arc<str>>,
}

impl PanicHook {
    fn fires_for(&self, request: &GenerateRequest) -> bool {
        let Some(marker) = &self.marker else {
            return false;
        };
        serde_json::to_string(&(&request.messages, &request.input))
            .is_ok_and(|input| input.contains(&**marker))
    }
}

impl EngineHost {
    /// Starts the engine thread. Events arrive on the returned receiver.
    pub fn spawn(
        engine: LlmEngine,
        frontend: ModelFrontend,
        name: &str,
        hook: PanicHook,
    ) -> std::io::Result<(EngineHost, mpsc::UnboundedReceiver<HostEvent>)> {
        let (cmd_tx, cmd_rx) = std_mpsc::channel();
        let (ev_tx, ev_rx) = mpsc::unbounded_channel();
        let gauges = EngineGauges::new(name);
        std::thread::Builder::new()
            .name(format!("engine-{name}"))
            .spawn(move || {
                let host = Host {
                    engine,
                    frontend,
                    events: ev_tx,
                    hook,
                    panic_armed: false,
                };
                host_loop(host, cmd_rx, gauges)
            })?;
        Ok((EngineHost { commands: cmd_tx }, ev_rx))
    }

    /// The host of a thread that reads `commands` (an embedding model's, say).
    pub(super) fn from_sender(commands: std_mpsc::Sender<HostCommand>) -> Self {
        EngineHost { commands }
    }

    /// Sends a command; false if the engine thread is gone.
    pub fn send(&self, command: HostCommand) -> bool {
        self.commands.send(command).is_ok()
    }
}

/// The engine thread's state.
struct Host {
    engine: LlmEngine,
    frontend: ModelFrontend,
    events: mpsc::UnboundedSender<HostEvent>,
    hook: PanicHook,
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

fn host_loop(mut host: Host, commands: std_mpsc::Receiver<HostCommand>, gauges: EngineGauges) {
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

    fn apply(&mut self, command: HostCommand) {
        match command {
            HostCommand::Abort { id } => self.engine.abort(id),
            HostCommand::Add { id, request } if request.task == Task::Embed => {
                let _ = self.events.send(HostEvent::Rejected {
                    id,
                    code: "invalid_request".into(),
                    message: format!(
                        "`{}` is not an embedding model: it answers chat and completions.",
                        request.model
                    ),
                });
            }
            HostCommand::Add { id, request } if request.task != Task::Generate => {
                // Answered from the tokenizer and template alone: no engine step.
                let event =
                    match prepare(|| fallow_engine::prompt::tokenization(&self.frontend, &request))
                    {
                        Ok(tokenized) => HostEvent::Answered {
                            id,
                            completion: Box::new(tokenized_completion(tokenized)),
                        },
                        Err((code, message)) => HostEvent::Rejected { id, code, message },
                    };
                let _ = self.events.send(event);
            }
            HostCommand::Add { id, request } => {
                let event = match self.admit(id, request) {
                    Ok((prompt_ids, prompt_text)) => HostEvent::Admitted {
                        id,
                        prompt_ids,
                        prompt_text,
                    },
                    Err((code, message)) => HostEvent::Rejected { id, code, message },
                };
                let _ = self.events.send(event);
            }
        }
    }

    /// Prepares the prompt (a panic there refuses this request only), then adds it to the
    /// engine (a panic there is the engine's). A continuation takes the prompt its first
    /// attempt tokenized and the tokens generated since, which the engine replays.
    fn admit(
        &mut self,
        id: u64,
        request: Box<GenerateRequest>,
    ) -> Result<(Vec<u32>, Option<String>), (String, String)> {
        let frontend = &self.frontend;
        let (prompt, echo) = prepare(|| {
            // A progress rebuilt from a stream has no prompt ids: tokenize it again.
            let prompt = match &request.progress {
                Some(progress) if !progress.prompt_ids.is_empty() => progress.prompt_ids.clone(),
                _ => fallow_engine::prompt::encode_prompt(frontend, &request)?,
            };
            Ok((prompt, echo_text(frontend, &request)))
        })?;
        if self.hook.fires_for(&request) {
            self.panic_armed = true;
        }
        let resume = request.progress.as_ref().map(|progress| Resume {
            choices: progress
                .choices
                .iter()
                .map(|c| ResumeChoice {
                    tokens: c.token_ids.clone(),
                    finished: c.finish.is_some(),
                })
                .collect(),
        });
        self.engine
            .add_request(EngineRequest {
                id,
                prompt: prompt.clone(),
                sampling: request.sampling,
                n: request.n,
                priority: 0,
                resume,
            })
            .map_err(|e| (e.code().to_string(), e.to_string()))?;
        Ok((prompt, echo))
    }
}

/// The result of a tokenize / detokenize job; its usage counts the tokens.
fn tokenized_completion(tokenized: Tokenized) -> Completion {
    Completion {
        usage: Usage {
            prompt_tokens: u32::try_from(tokenized.tokens.len()).unwrap_or(u32::MAX),
            ..Usage::default()
        },
        tokenized: Some(tokenized),
        ..Completion::default()
    }
}

/// Runs one request's preparation (template, tokenizer), refusing the request if it panics.
fn prepare<T>(work: impl FnOnce() -> Result<T, (String, String)>) -> Result<T, (String, String)> {
    catch_unwind(AssertUnwindSafe(work)).unwrap_or_else(|payload| {
        let text = panic_text(&*payload);
        tracing::error!(panic = %text, "preparing a request panicked");
        Err((
            "invalid_request".to_string(),
            format!("The request could not be prepared for the model: {text}"),
        ))
    })
}

/// The message of a panic's payload (`panic!` with a literal or a formatted string).
pub(super) fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".to_string())
}

/// A token-id prompt as text (for `echo`); the api knows the text of other prompts. Ids
/// out of the vocabulary are refused by `admit`, so decoding them here is harmless.
fn echo_text(frontend: &ModelFrontend, request: &GenerateRequest) -> Option<String> {
    match &request.input {
        Prompt::Tokens { ids } => Some(frontend.tokenizer.decode(ids, false)),
        _ => None,
    }
}
