//! A generative model's preparation threads: they take each new request off the engine
//! thread's path, render and tokenize its prompt, compile its grammar and stop matchers
//! (waiting, if need be, for the grammar vocabulary), and hand the engine thread a request
//! it only has to admit. Tokenize and detokenize jobs are answered here outright.
//!
//! The threads run at the lowest CPU priority, so preparing a request takes a core only
//! when the steps leave one. A request aborted while it is being prepared is dropped when
//! its preparation ends; an abort of a request already handed over follows it to the engine
//! thread, in order, since both are sent under one lock.
//!
//! Preparing one request has a time budget. A watchdog refuses a request whose preparation
//! outlasts it, drops its late result, and starts a spare thread in place of the busy one,
//! so the requests behind it are prepared meanwhile.

use super::adapters::Adapters;
use super::engine_host::{
    panic_text, HostCommand, HostEvent, HostOptions, PanicHook, ReadyRequest, ToEngine,
};
use fallow_engine::background::lower_this_threads_priority;
use fallow_engine::llm::{EngineRequest, Preparer, Resume, ResumeChoice};
use fallow_engine::lora::LoraAdapter;
use fallow_engine::runtime::ModelFrontend;
use fallow_protocol::adapter::AdapterRef;
use fallow_protocol::job::{Completion, GenerateRequest, Prompt, Task, Tokenized, Usage};
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Requests of one model prepared at once. Two: one huge prompt or slow grammar does not
/// hold up the next request, and the threads yield to the steps anyway.
const THREADS: usize = 2;

/// Threads at most, spares included: requests that outlast their budget keep a thread busy
/// until they end, and this bounds what a stream of them can take.
const MAX_THREADS: usize = 4 * THREADS;

/// The error code of a request refused for outlasting its preparation budget.
pub const PREPARE_TIMEOUT_CODE: &str = "preparation_timeout";

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

type JobQueue = Arc<Mutex<std_mpsc::Receiver<Job>>>;

/// What the preparation threads and the router share.
struct Shared {
    frontend: Arc<ModelFrontend>,
    preparer: Preparer,
    hook: PanicHook,
    timeout: Duration,
    engine: std_mpsc::Sender<ToEngine>,
    events: mpsc::UnboundedSender<HostEvent>,
    /// Requests queued or being prepared.
    preparing: Mutex<HashMap<u64, Preparing>>,
    /// Preparation threads alive, spares included.
    threads: AtomicUsize,
    name: String,
    adapters: Arc<Adapters>,
}

/// A request on its way to the engine thread.
#[derive(Default)]
struct Preparing {
    /// Aborted, or refused for its time: its outcome is dropped.
    dropped: bool,
    /// When a thread took it up.
    since: Option<Instant>,
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
    options: HostOptions,
    engine: std_mpsc::Sender<ToEngine>,
    events: mpsc::UnboundedSender<HostEvent>,
    name: &str,
) -> std::io::Result<Router> {
    let shared = Arc::new(Shared {
        frontend,
        preparer,
        hook: options.panic_hook,
        timeout: options.prepare_timeout,
        engine,
        events,
        preparing: Mutex::new(HashMap::new()),
        threads: AtomicUsize::new(0),
        name: name.to_string(),
        adapters: options.adapters.clone(),
    });
    let (jobs, queue) = std_mpsc::channel();
    let queue: JobQueue = Arc::new(Mutex::new(queue));
    for _ in 0..THREADS {
        start_thread(&shared, &queue)?;
    }
    let (watched, queue) = (Arc::downgrade(&shared), queue.clone());
    std::thread::Builder::new()
        .name(format!("prepare-watch-{name}"))
        .spawn(move || watch(&watched, &queue))?;
    Ok(Router { jobs, shared })
}

fn start_thread(shared: &Arc<Shared>, queue: &JobQueue) -> std::io::Result<()> {
    let n = shared.threads.fetch_add(1, Ordering::SeqCst);
    let (ours, queue) = (shared.clone(), queue.clone());
    let started = std::thread::Builder::new()
        .name(format!("prepare-{}-{n}", shared.name))
        .spawn(move || prepare_loop(&ours, &queue));
    if started.is_err() {
        shared.threads.fetch_sub(1, Ordering::SeqCst);
    }
    started.map(drop)
}

impl Router {
    /// Sends a command on its way; false if the model's threads are gone.
    pub fn send(&self, command: HostCommand) -> bool {
        match command {
            HostCommand::Add { id, request } => {
                self.shared.preparing().insert(id, Preparing::default());
                let sent = self.jobs.send(Job { id, request }).is_ok();
                if !sent {
                    self.shared.preparing().remove(&id);
                }
                sent
            }
            HostCommand::Abort { id } => {
                let mut preparing = self.shared.preparing();
                match preparing.get_mut(&id) {
                    Some(entry) => {
                        entry.dropped = true;
                        true
                    }
                    None => self.shared.engine.send(ToEngine::Abort(id)).is_ok(),
                }
            }
        }
    }

    /// Requests queued or being prepared, a late one refused for its time included.
    #[cfg(test)]
    pub fn preparing(&self) -> usize {
        self.shared.preparing().len()
    }
}

/// Refuses the requests that outlast their budget, and starts a spare thread for each, until
/// the model's threads are gone. It runs at normal priority, so it is on time even when the
/// steps take every core.
fn watch(shared: &Weak<Shared>, queue: &JobQueue) {
    loop {
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let tick =
            (shared.timeout / 10).clamp(Duration::from_millis(5), Duration::from_millis(500));
        for id in shared.overdue() {
            tracing::warn!(model = %shared.name, timeout = ?shared.timeout, "preparing a request outlasted its budget");
            let message = format!(
                "Preparing the request (rendering and tokenizing its prompt, compiling its grammar) took longer than the runner's budget of {} s; shorten the prompt or simplify the schema.",
                shared.timeout.as_secs_f64()
            );
            let _ = shared.events.send(HostEvent::Rejected {
                id,
                code: PREPARE_TIMEOUT_CODE.to_string(),
                message,
            });
            if shared.threads.load(Ordering::SeqCst) < MAX_THREADS {
                if let Err(e) = start_thread(&shared, queue) {
                    tracing::warn!(error = %e, "starting a spare preparation thread failed");
                }
            }
        }
        drop(shared);
        std::thread::sleep(tick);
    }
}

fn prepare_loop(shared: &Shared, queue: &Mutex<std_mpsc::Receiver<Job>>) {
    lower_this_threads_priority();
    loop {
        // One thread waits on the queue at a time; the others wait for the lock.
        let next = queue.lock().unwrap_or_else(PoisonError::into_inner).recv();
        let Ok(Job { id, request }) = next else {
            shared.threads.fetch_sub(1, Ordering::SeqCst);
            return; // the host was dropped: the model was unloaded
        };
        if let Some(entry) = shared.preparing().get_mut(&id) {
            entry.since = Some(Instant::now());
        }
        let outcome = shared.prepare(id, request);
        shared.deliver(id, outcome);
        // A spare that outlived the request it stood in for goes.
        let spare = shared
            .threads
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                if n > THREADS {
                    Some(n - 1)
                } else {
                    None
                }
            });
        if spare.is_ok() {
            return;
        }
    }
}

impl Shared {
    fn preparing(&self) -> MutexGuard<'_, HashMap<u64, Preparing>> {
        self.preparing
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The requests in preparation past their budget, not refused yet; they are marked
    /// dropped, so the caller refuses each once.
    fn overdue(&self) -> Vec<u64> {
        let now = Instant::now();
        let mut preparing = self.preparing();
        let mut overdue = Vec::new();
        for (&id, entry) in preparing.iter_mut() {
            let late = entry
                .since
                .is_some_and(|since| now.duration_since(since) > self.timeout);
            if late && !entry.dropped {
                entry.dropped = true;
                overdue.push(id);
            }
        }
        overdue
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
        let adapter = request
            .adapter
            .as_ref()
            .map(|wanted| self.adapter(wanted))
            .transpose()?;
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
                adapter,
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

    /// The LoRA adapter a request runs with, read now if it is not in memory (on this
    /// preparation thread, so the engine's steps go on meanwhile).
    fn adapter(&self, wanted: &AdapterRef) -> Result<Arc<LoraAdapter>, (String, String)> {
        let Some(base) = self.preparer.adapter_base() else {
            return Err((
                "invalid_request".to_string(),
                format!(
                    "`{}` runs on a backend that serves no LoRA adapters",
                    self.name
                ),
            ));
        };
        self.adapters
            .get(&self.name, wanted, base)
            .map_err(|e| (e.code().to_string(), e.to_string()))
    }

    /// Hands the outcome on, unless the request was aborted meanwhile.
    fn deliver(&self, id: u64, outcome: Outcome) {
        let mut preparing = self.preparing();
        if preparing.remove(&id).is_some_and(|entry| entry.dropped) {
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
