//! A generative model's preparation threads: they take each new request off the engine
//! thread's path, render and tokenize its prompt, compile its grammar and stop matchers
//! (waiting, if need be, for the grammar vocabulary), and hand the engine thread a request
//! it only has to admit. Tokenize and detokenize jobs are answered here outright.
//!
//! The threads run at the lowest CPU priority, so preparing a request takes a core only
//! when the steps leave one. A request aborted while it is being prepared is dropped when
//! its preparation ends; an abort of a request already handed over follows it to the engine
//! thread, in order, since both are sent under one lock.

use super::engine_host::{panic_text, HostCommand, HostEvent, PanicHook, ReadyRequest, ToEngine};
use fallow_engine::background::lower_this_threads_priority;
use fallow_engine::llm::{EngineRequest, Preparer, Resume, ResumeChoice};
use fallow_engine::runtime::ModelFrontend;
use fallow_protocol::job::{Completion, GenerateRequest, Prompt, Task, Tokenized, Usage};
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use tokio::sync::mpsc;

/// Requests of one model prepared at once. Two: one huge prompt or slow grammar does not
/// hold up the next request, and the threads yield to the steps anyway.
const THREADS: usize = 2;

/// The worker's side: where a host's commands go.
pub(super) struct Router {
    jobs: std_mpsc::Sender<Job>,
    shared: Arc<Shared>,
}

/// A request to prepare.
struct Job {
    id: u64,
    request: Box<GenerateRequest>,
}

/// What the preparation threads and the router share.
struct Shared {
    frontend: Arc<ModelFrontend>,
    preparer: Preparer,
    hook: PanicHook,
    engine: std_mpsc::Sender<ToEngine>,
    events: mpsc::UnboundedSender<HostEvent>,
    /// Requests being prepared, and whether each was aborted meanwhile.
    preparing: Mutex<HashMap<u64, bool>>,
}

/// What preparing a request came to.
enum Outcome {
    Ready(Box<ReadyRequest>),
    Answered(Box<Completion>),
    Rejected { code: String, message: String },
}

/// Starts the preparation threads of model `name`, which hand prepared requests to
/// `engine` and send answers and refusals to `events`.
pub(super) fn spawn(
    frontend: Arc<ModelFrontend>,
    preparer: Preparer,
    hook: PanicHook,
    engine: std_mpsc::Sender<ToEngine>,
    events: mpsc::UnboundedSender<HostEvent>,
    name: &str,
) -> std::io::Result<Router> {
    let shared = Arc::new(Shared {
        frontend,
        preparer,
        hook,
        engine,
        events,
        preparing: Mutex::new(HashMap::new()),
    });
    let (jobs, queue) = std_mpsc::channel();
    let queue = Arc::new(Mutex::new(queue));
    for i in 0..THREADS {
        let (shared, queue) = (shared.clone(), queue.clone());
        std::thread::Builder::new()
            .name(format!("prepare-{name}-{i}"))
            .spawn(move || prepare_loop(&shared, &queue))?;
    }
    Ok(Router { jobs, shared })
}

impl Router {
    /// Sends a command on its way; false if the model's threads are gone.
    pub fn send(&self, command: HostCommand) -> bool {
        match command {
            HostCommand::Add { id, request } => {
                self.shared.preparing().insert(id, false);
                let sent = self.jobs.send(Job { id, request }).is_ok();
                if !sent {
                    self.shared.preparing().remove(&id);
                }
                sent
            }
            HostCommand::Abort { id } => {
                let mut preparing = self.shared.preparing();
                match preparing.get_mut(&id) {
                    Some(aborted) => {
                        *aborted = true;
                        true
                    }
                    None => self.shared.engine.send(ToEngine::Abort(id)).is_ok(),
                }
            }
        }
    }
}

fn prepare_loop(shared: &Shared, queue: &Mutex<std_mpsc::Receiver<Job>>) {
    lower_this_threads_priority();
    loop {
        // One thread waits on the queue at a time; the others wait for the lock.
        let next = queue.lock().unwrap_or_else(PoisonError::into_inner).recv();
        let Ok(Job { id, request }) = next else {
            return; // the host was dropped: the model was unloaded
        };
        let outcome = shared.prepare(id, request);
        shared.deliver(id, outcome);
    }
}

impl Shared {
    fn preparing(&self) -> MutexGuard<'_, HashMap<u64, bool>> {
        self.preparing
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Prepares one request; a panic refuses only it.
    fn prepare(&self, id: u64, request: Box<GenerateRequest>) -> Outcome {
        let outcome = catch_unwind(AssertUnwindSafe(|| match request.task {
            Task::Embed => Err((
                "invalid_request".to_string(),
                format!(
                    "`{}` is not an embedding model: it answers chat and completions.",
                    request.model
                ),
            )),
            // Answered from the tokenizer and template alone: no engine step.
            Task::Tokenize | Task::Detokenize => {
                fallow_engine::prompt::tokenization(&self.frontend, &request)
                    .map(|tokenized| Outcome::Answered(Box::new(tokenized_completion(tokenized))))
            }
            Task::Generate => self.generation(id, request),
        }))
        .unwrap_or_else(|payload| {
            let text = panic_text(&*payload);
            tracing::error!(panic = %text, "preparing a request panicked");
            Err((
                "invalid_request".to_string(),
                format!("The request could not be prepared for the model: {text}"),
            ))
        });
        outcome.unwrap_or_else(|(code, message)| Outcome::Rejected { code, message })
    }

    /// The prompt (a continuation's: the one its first attempt tokenized, and the tokens
    /// generated since, which the engine replays), then the engine's own preparation.
    fn generation(
        &self,
        id: u64,
        request: Box<GenerateRequest>,
    ) -> Result<Outcome, (String, String)> {
        let frontend = &*self.frontend;
        // A progress rebuilt from a stream has no prompt ids: tokenize it again.
        let prompt = match &request.progress {
            Some(progress) if !progress.prompt_ids.is_empty() => progress.prompt_ids.clone(),
            _ => fallow_engine::prompt::encode_prompt(frontend, &request)?,
        };
        let prompt_text = echo_text(frontend, &request);
        let arm_panic = self.hook.fires_for(&request);
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
        let request = *request;
        let prepared = self
            .preparer
            .prepare(EngineRequest {
                id,
                prompt,
                sampling: request.sampling,
                n: request.n,
                priority: 0,
                resume,
            })
            .map_err(|e| (e.code().to_string(), e.to_string()))?;
        Ok(Outcome::Ready(Box::new(ReadyRequest {
            prepared,
            prompt_text,
            arm_panic,
        })))
    }

    /// Hands the outcome on, unless the request was aborted meanwhile.
    fn deliver(&self, id: u64, outcome: Outcome) {
        let mut preparing = self.preparing();
        if preparing.remove(&id).unwrap_or(false) {
            return;
        }
        // Under the lock: an abort that finds the request gone is sent after this.
        match outcome {
            Outcome::Ready(ready) => {
                let _ = self.engine.send(ToEngine::Admit(ready));
            }
            Outcome::Answered(completion) => {
                let _ = self.events.send(HostEvent::Answered { id, completion });
            }
            Outcome::Rejected { code, message } => {
                let _ = self.events.send(HostEvent::Rejected { id, code, message });
            }
        }
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

/// A token-id prompt as text (for `echo`); the api knows the text of other prompts. Ids
/// out of the vocabulary are refused by the engine's preparation, so decoding them here is
/// harmless.
fn echo_text(frontend: &ModelFrontend, request: &GenerateRequest) -> Option<String> {
    match &request.input {
        Prompt::Tokens { ids } => Some(frontend.tokenizer.decode(ids, false)),
        _ => None,
    }
}
