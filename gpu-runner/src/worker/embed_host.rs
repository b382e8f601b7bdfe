//! An embedding model's host thread: the counterpart of [`super::engine_host`] for a model
//! that only embeds. It takes the same commands and sends the same events, so the worker
//! holds, cancels and completes embedding jobs as it does any other. Jobs that arrive
//! together are embedded together: their inputs go through the model as one batch (bounded
//! by [`BATCH_TOKENS`]), since every weight matrix is then read once for all of them.

use super::engine_host::{panic_text, EngineHost, HostCommand, HostEvent};
use fallow_engine::embed::EmbeddingModel;
use fallow_protocol::job::{Completion, EmbedInput, GenerateRequest, Task, Usage};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc as std_mpsc;
use tokio::sync::mpsc;

/// Most tokens embedded in one call: bounds the activations of a batch.
const BATCH_TOKENS: usize = 32 * 1024;

/// Starts the host thread of `model`. Events arrive on the returned receiver.
pub fn spawn(
    model: EmbeddingModel,
    name: &str,
) -> std::io::Result<(EngineHost, mpsc::UnboundedReceiver<HostEvent>)> {
    let (cmd_tx, cmd_rx) = std_mpsc::channel();
    let (ev_tx, ev_rx) = mpsc::unbounded_channel();
    std::thread::Builder::new()
        .name(format!("embed-{name}"))
        .spawn(move || host_loop(&model, &cmd_rx, &ev_tx))?;
    Ok((EngineHost::from_sender(cmd_tx), ev_rx))
}

/// One job's inputs as token ids, checked against the model.
struct Prepared {
    id: u64,
    inputs: Vec<Vec<u32>>,
}

fn host_loop(
    model: &EmbeddingModel,
    commands: &std_mpsc::Receiver<HostCommand>,
    events: &mpsc::UnboundedSender<HostEvent>,
) {
    while let Ok(first) = commands.recv() {
        let mut jobs = Vec::new();
        let mut command = Some(first);
        while let Some(next) = command.take() {
            match next {
                HostCommand::Add { id, request } => match prepare(model, &request) {
                    Ok(inputs) => jobs.push(Prepared { id, inputs }),
                    Err(message) => {
                        let _ = events.send(HostEvent::Rejected {
                            id,
                            code: "invalid_request".into(),
                            message,
                        });
                    }
                },
                HostCommand::Abort { id } => jobs.retain(|job| job.id != id),
            }
            command = commands.try_recv().ok();
        }
        let answered = catch_unwind(AssertUnwindSafe(|| embed_jobs(model, jobs, events)));
        if let Err(payload) = answered {
            let message = format!("the embedding model panicked: {}", panic_text(&*payload));
            tracing::error!(%message, "embedding thread stopped");
            let _ = events.send(HostEvent::Failed { message });
            return;
        }
    }
}

/// A job's inputs as token ids, or why the job is refused.
fn prepare(model: &EmbeddingModel, request: &GenerateRequest) -> Result<Vec<Vec<u32>>, String> {
    let embed = match (&request.task, &request.embed) {
        (Task::Embed, Some(embed)) => embed,
        _ => {
            return Err(format!(
                "`{}` is an embedding model: it answers `/v1/embeddings` only.",
                request.model
            ))
        }
    };
    let most = model.max_input_tokens();
    let vocab = model.vocab_size();
    embed
        .inputs
        .iter()
        .enumerate()
        .map(|(i, input)| {
            let ids = match input {
                EmbedInput::Text { text } => model.tokenize(text).map_err(|e| e.to_string())?,
                EmbedInput::Tokens { ids } => ids.clone(),
            };
            if ids.is_empty() {
                return Err(format!("`input[{i}]` has no tokens."));
            }
            if ids.len() > most {
                return Err(format!(
                    "`input[{i}]` is {} tokens; this model embeds at most {most}.",
                    ids.len()
                ));
            }
            if let Some(bad) = ids.iter().find(|&&id| id as usize >= vocab) {
                return Err(format!(
                    "`input[{i}]` holds token id {bad}, outside this model's vocabulary of {vocab}."
                ));
            }
            Ok(ids)
        })
        .collect()
}

/// Embeds the jobs' inputs in batches of at most [`BATCH_TOKENS`] tokens and answers each.
fn embed_jobs(
    model: &EmbeddingModel,
    jobs: Vec<Prepared>,
    events: &mpsc::UnboundedSender<HostEvent>,
) {
    let mut batch: Vec<Prepared> = Vec::new();
    let mut tokens = 0;
    for job in jobs {
        let size: usize = job.inputs.iter().map(Vec::len).sum();
        if !batch.is_empty() && tokens + size > BATCH_TOKENS {
            answer(model, std::mem::take(&mut batch), events);
            tokens = 0;
        }
        tokens += size;
        batch.push(job);
    }
    if !batch.is_empty() {
        answer(model, batch, events);
    }
}

fn answer(model: &EmbeddingModel, batch: Vec<Prepared>, events: &mpsc::UnboundedSender<HostEvent>) {
    let inputs: Vec<Vec<u32>> = batch.iter().flat_map(|job| job.inputs.clone()).collect();
    match model.embed(&inputs) {
        Ok(vectors) => {
            let mut vectors = vectors.into_iter();
            for job in batch {
                let prompt_tokens: usize = job.inputs.iter().map(Vec::len).sum();
                let completion = Completion {
                    usage: Usage {
                        prompt_tokens: u32::try_from(prompt_tokens).unwrap_or(u32::MAX),
                        ..Usage::default()
                    },
                    embeddings: Some(vectors.by_ref().take(job.inputs.len()).collect()),
                    ..Completion::default()
                };
                let _ = events.send(HostEvent::Answered {
                    id: job.id,
                    completion: Box::new(completion),
                });
            }
        }
        Err(e) => {
            let code = if e.is_invalid_input() {
                "invalid_request"
            } else {
                "engine_error"
            };
            for job in batch {
                let _ = events.send(HostEvent::Rejected {
                    id: job.id,
                    code: code.into(),
                    message: e.to_string(),
                });
            }
        }
    }
}
