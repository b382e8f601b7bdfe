//! Turns the stream entries of a legacy completion's jobs (one per prompt) into
//! `text_completion` chunks: per choice an `echo` chunk first (when asked), then one chunk
//! per delta carrying its text, legacy logprobs and, on the last, the finish reason; after
//! every job ended, the usage chunk (with `include_usage`). Choice `index` is prompt-major
//! (`prompt * n + choice`), as OpenAI numbers them. Pure bookkeeping, unit-tested alone.

use crate::error::ApiError;
use crate::openai::completions::{LegacyLogprobs, TextChoice, TextCompletionChunk};
use crate::openai::response::{finish_reason_str, SglExt, SYSTEM_FINGERPRINT};
use crate::validate::ValidCompletion;
use fallow_protocol::job::{JobEvent, Usage};
use fallow_protocol::position::StreamPositions;

/// One event to send: a chunk, or the error that ends the stream.
#[derive(Debug)]
pub enum TextFrame {
    Chunk(TextCompletionChunk),
    Error(ApiError),
    /// `[DONE]`.
    Done,
}

#[derive(Debug, Default, Clone)]
struct ChoiceState {
    /// Bytes of generated text sent (to send only the rest from a `Final`).
    sent: usize,
    /// Characters sent, echo included (legacy `text_offset`).
    offset: usize,
    echoed: bool,
    finished: bool,
}

pub struct TextChunkBuilder {
    id: String,
    created: i64,
    model: String,
    n: u32,
    echo: bool,
    logprobs: bool,
    include_usage: bool,
    prompt_texts: Vec<Option<String>>,
    choices: Vec<ChoiceState>,
    /// Where each choice's deltas have got to (indexed like `choices`): after a hole in
    /// its job's stream, a choice's rest comes from `Final` in one piece.
    positions: StreamPositions,
    /// Each job's usage once it ended (`None`: still running).
    usage: Vec<Option<Usage>>,
    failed: bool,
}

impl TextChunkBuilder {
    pub fn new(id: String, created: i64, model: String, valid: &ValidCompletion) -> Self {
        let jobs = valid.prompts.len();
        TextChunkBuilder {
            id,
            created,
            model,
            n: valid.n,
            echo: valid.echo,
            logprobs: valid.logprobs.is_some(),
            include_usage: valid.delivery.include_usage,
            prompt_texts: valid.prompt_texts.clone(),
            choices: vec![ChoiceState::default(); jobs * valid.n as usize],
            positions: StreamPositions::new(jobs * valid.n as usize),
            usage: vec![None; jobs],
            failed: false,
        }
    }

    /// Whether every job ended (or one failed): the stream is over.
    pub fn is_done(&self) -> bool {
        self.failed || self.usage.iter().all(Option::is_some)
    }

    /// The frames for one event of the job of prompt `prompt`.
    pub fn on_event(&mut self, prompt: usize, event: &JobEvent) -> Vec<TextFrame> {
        let mut frames = Vec::new();
        if self.failed || prompt >= self.usage.len() {
            return frames;
        }
        match event {
            JobEvent::Started { prompt_text, .. } => {
                if let (Some(text), Some(slot)) = (prompt_text, self.prompt_texts.get_mut(prompt)) {
                    slot.get_or_insert_with(|| text.clone());
                }
            }
            JobEvent::Delta {
                index,
                text,
                token_ids,
                logprobs,
                finish_reason,
                at,
                ..
            } => {
                let global = prompt * self.n as usize + *index as usize;
                self.echo_once(prompt, global, &mut frames);
                let follows = u32::try_from(global)
                    .is_ok_and(|g| self.positions.admit(g, *at, token_ids.len(), text.len()));
                if !follows {
                    return frames; // a hole before it: the rest comes from `Final`
                }
                let Some(state) = self.choices.get_mut(global) else {
                    return frames;
                };
                if state.finished {
                    return frames;
                }
                state.sent += text.len();
                let mut legacy = None;
                if self.logprobs {
                    let mut lp = LegacyLogprobs::default();
                    lp.extend(logprobs.as_deref().unwrap_or_default(), state.offset);
                    legacy = Some(lp);
                }
                state.offset += text.chars().count();
                state.finished = finish_reason.is_some();
                frames.push(self.chunk(TextChoice {
                    index: global as u32,
                    text: text.clone(),
                    logprobs: legacy,
                    finish_reason: finish_reason.map(finish_reason_str),
                    matched_stop: None,
                    hidden_states: None,
                }));
            }
            JobEvent::Final { completion } => {
                if let (Some(text), Some(slot)) = (
                    completion.prompt_text.as_ref(),
                    self.prompt_texts.get_mut(prompt),
                ) {
                    slot.get_or_insert_with(|| text.clone());
                }
                for choice in &completion.choices {
                    let global = prompt * self.n as usize + choice.index as usize;
                    self.echo_once(prompt, global, &mut frames);
                    let Some(state) = self.choices.get_mut(global) else {
                        continue;
                    };
                    if state.finished {
                        continue;
                    }
                    // Deltas missed (the stream expired and the row answered): the rest now.
                    let rest = choice.text.get(state.sent..).unwrap_or_default().to_owned();
                    state.finished = true;
                    frames.push(self.chunk(TextChoice {
                        index: global as u32,
                        text: rest,
                        logprobs: None,
                        finish_reason: Some(finish_reason_str(choice.finish_reason)),
                        matched_stop: choice.matched_stop.clone(),
                        hidden_states: None,
                    }));
                }
                for choice in &completion.choices {
                    if let Some(hidden) = &choice.hidden_states {
                        let global = prompt * self.n as usize + choice.index as usize;
                        frames.push(self.chunk(TextChoice {
                            index: global as u32,
                            text: String::new(),
                            logprobs: None,
                            finish_reason: None,
                            matched_stop: None,
                            hidden_states: Some(hidden.clone()),
                        }));
                    }
                }
                // One prompt, one choice (validated): its routes in a chunk of their own.
                if let Some(ext) = SglExt::of(completion, false) {
                    let mut chunk = self.chunk_of(Vec::new());
                    chunk.sglext = Some(ext);
                    frames.push(TextFrame::Chunk(chunk));
                }
                self.usage[prompt] = Some(completion.usage);
                if self.is_done() && self.include_usage {
                    let usage = self.total_usage();
                    let mut chunk = self.chunk_of(Vec::new());
                    chunk.usage = Some(usage.into());
                    frames.push(TextFrame::Chunk(chunk));
                }
            }
            JobEvent::Error { code, message } => {
                self.failed = true;
                frames.push(TextFrame::Error(ApiError::JobFailed {
                    code: code.clone(),
                    message: message.clone(),
                }));
            }
        }
        frames
    }

    /// The usage of all jobs together.
    pub fn total_usage(&self) -> Usage {
        self.usage
            .iter()
            .flatten()
            .fold(Usage::default(), |a, u| Usage {
                prompt_tokens: a.prompt_tokens + u.prompt_tokens,
                completion_tokens: a.completion_tokens + u.completion_tokens,
                cached_tokens: a.cached_tokens + u.cached_tokens,
            })
    }

    fn echo_once(&mut self, prompt: usize, global: usize, frames: &mut Vec<TextFrame>) {
        if !self.echo {
            return;
        }
        let text = self.prompt_texts.get(prompt).cloned().flatten();
        let Some(state) = self.choices.get_mut(global) else {
            return;
        };
        if state.echoed {
            return;
        }
        state.echoed = true;
        let text = text.unwrap_or_default();
        state.offset += text.chars().count();
        frames.push(self.chunk(TextChoice {
            index: global as u32,
            text,
            logprobs: None,
            finish_reason: None,
            matched_stop: None,
            hidden_states: None,
        }));
    }

    fn chunk(&self, choice: TextChoice) -> TextFrame {
        TextFrame::Chunk(self.chunk_of(vec![choice]))
    }

    fn chunk_of(&self, choices: Vec<TextChoice>) -> TextCompletionChunk {
        TextCompletionChunk {
            id: self.id.clone(),
            object: "text_completion",
            created: self.created,
            model: self.model.clone(),
            choices,
            usage: None,
            system_fingerprint: SYSTEM_FINGERPRINT,
            sglext: None,
        }
    }
}

#[cfg(test)]
#[path = "text_chunks_tests.rs"]
mod tests;
