//! The engine runs on its own OS thread: a step is CPU-bound work that must never block the
//! async runtime that talks to Postgres and Redis. The host owns the engine and the model's
//! frontend; it takes commands over a channel and sends every step's outputs back as one
//! message, so the relay can append them to Redis in one round trip.

use super::telemetry::EngineGauges;
use fallow_engine::llm::{EngineRequest, LlmEngine, SeqOutput};
use fallow_engine::runtime::ModelFrontend;
use fallow_protocol::job::{GenerateRequest, Prompt, Task, Tokenized};
use std::sync::mpsc as std_mpsc;
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
    /// A request was admitted; its prompt has this many tokens. A token-id prompt comes
    /// back as text too (for `echo`).
    Admitted {
        id: u64,
        prompt_tokens: u32,
        prompt_text: Option<String>,
    },
    /// A tokenize / detokenize request was answered without the engine.
    Answered { id: u64, tokenized: Tokenized },
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

impl EngineHost {
    /// Starts the engine thread. Events arrive on the returned receiver.
    pub fn spawn(
        engine: LlmEngine,
        frontend: ModelFrontend,
        name: &str,
    ) -> std::io::Result<(EngineHost, mpsc::UnboundedReceiver<HostEvent>)> {
        let (cmd_tx, cmd_rx) = std_mpsc::channel();
        let (ev_tx, ev_rx) = mpsc::unbounded_channel();
        let gauges = EngineGauges::new(name);
        std::thread::Builder::new()
            .name(format!("engine-{name}"))
            .spawn(move || host_loop(engine, frontend, cmd_rx, ev_tx, gauges))?;
        Ok((EngineHost { commands: cmd_tx }, ev_rx))
    }

    /// Sends a command; false if the engine thread is gone.
    pub fn send(&self, command: HostCommand) -> bool {
        self.commands.send(command).is_ok()
    }
}

fn host_loop(
    mut engine: LlmEngine,
    frontend: ModelFrontend,
    commands: std_mpsc::Receiver<HostCommand>,
    events: mpsc::UnboundedSender<HostEvent>,
    gauges: EngineGauges,
) {
    loop {
        gauges.publish(&engine.stats());
        // Idle: block for the next command. Busy: take whatever arrived, then step.
        if !engine.has_work() {
            match commands.recv() {
                Ok(cmd) => apply(&mut engine, &frontend, cmd, &events),
                Err(_) => return,
            }
        }
        loop {
            match commands.try_recv() {
                Ok(cmd) => apply(&mut engine, &frontend, cmd, &events),
                Err(std_mpsc::TryRecvError::Empty) => break,
                Err(std_mpsc::TryRecvError::Disconnected) => return,
            }
        }
        if engine.has_work() {
            match engine.step() {
                Ok(outputs) if outputs.is_empty() => {}
                Ok(outputs) => {
                    if events.send(HostEvent::Step(outputs)).is_err() {
                        return;
                    }
                }
                Err(e) => {
                    let _ = events.send(HostEvent::Failed {
                        message: e.to_string(),
                    });
                    return;
                }
            }
        }
    }
}

fn apply(
    engine: &mut LlmEngine,
    frontend: &ModelFrontend,
    command: HostCommand,
    events: &mpsc::UnboundedSender<HostEvent>,
) {
    match command {
        HostCommand::Abort { id } => engine.abort(id),
        HostCommand::Add { id, request } if request.task != Task::Generate => {
            // Answered from the tokenizer and template alone: no engine step.
            let event = match fallow_engine::prompt::tokenization(frontend, &request) {
                Ok(tokenized) => HostEvent::Answered { id, tokenized },
                Err((code, message)) => HostEvent::Rejected { id, code, message },
            };
            let _ = events.send(event);
        }
        HostCommand::Add { id, request } => {
            let echo_text = echo_text(frontend, &request);
            let event = match admit(engine, frontend, id, request) {
                Ok(prompt_tokens) => HostEvent::Admitted {
                    id,
                    prompt_tokens,
                    prompt_text: echo_text,
                },
                Err((code, message)) => HostEvent::Rejected { id, code, message },
            };
            let _ = events.send(event);
        }
    }
}

/// A token-id prompt as text (for `echo`); the api knows the text of other prompts. Ids
/// out of the vocabulary are refused by `admit`, so decoding them here is harmless.
fn echo_text(frontend: &ModelFrontend, request: &GenerateRequest) -> Option<String> {
    match &request.input {
        Prompt::Tokens { ids } => Some(frontend.tokenizer.decode(ids, false)),
        _ => None,
    }
}

fn admit(
    engine: &mut LlmEngine,
    frontend: &ModelFrontend,
    id: u64,
    request: Box<GenerateRequest>,
) -> Result<u32, (String, String)> {
    let prompt = fallow_engine::prompt::encode_prompt(frontend, &request)?;
    let prompt_tokens = prompt.len() as u32;
    engine
        .add_request(EngineRequest {
            id,
            prompt,
            sampling: request.sampling,
            n: request.n,
            priority: 0,
        })
        .map_err(|e| (e.code().to_string(), e.to_string()))?;
    Ok(prompt_tokens)
}
