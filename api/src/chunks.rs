//! Turns a job's stream entries into OpenAI `chat.completion.chunk`s, exactly in OpenAI's
//! order: per choice a first chunk with `delta: {"role":"assistant","content":""}`, then
//! content deltas, then a chunk with an empty delta and the `finish_reason`; with
//! `include_usage` a last chunk with `choices: []` and the usage; then `[DONE]`. Each
//! choice's text goes through the job's parsers ([`StreamChoice`]): reasoning and tool-call
//! deltas take the place of content where the model wrote them. Pure bookkeeping, no I/O,
//! so the sequence is unit-tested directly.

use crate::error::ApiError;
use crate::openai::response::{
    choice_finish_reason, ChatCompletionChunk, ChoiceLogprobs, ChunkChoice, Delta, SglExt,
    UsageOut, SYSTEM_FINGERPRINT,
};
use crate::stream_choice::StreamChoice;
use crate::validate::Delivery;
use fallow_protocol::job::{Completion, FinishReason, JobEvent, OutputFormat, TokenLogprob, Usage};
use fallow_protocol::position::StreamPositions;
use fallow_scheduler::stream::StreamEntry;

/// One SSE event to send. `id` is the Redis entry id it came from (for `Last-Event-ID`).
#[derive(Debug)]
pub struct Frame {
    pub id: Option<String>,
    pub payload: Payload,
}

#[derive(Debug)]
pub enum Payload {
    Chunk(ChatCompletionChunk),
    Error(ApiError),
    Done,
}

pub struct ChunkBuilder {
    id: String,
    created: i64,
    model: String,
    delivery: Delivery,
    roles_sent: bool,
    /// Bytes of text already sent per choice, to send only the rest from `Final`.
    sent_len: Vec<usize>,
    /// Where each choice's deltas have got to: a delta after a hole is not sent, and its
    /// choice's rest comes from `Final` in one piece. `None` for a client that resumed
    /// with an unknown prefix.
    positions: Option<StreamPositions>,
    finished: Vec<bool>,
    /// Each choice's parsers (plain content unless [`ChunkBuilder::with_output`] says
    /// otherwise).
    parsed: Vec<StreamChoice>,
    usage: Usage,
    attempt: Option<i32>,
    content_sent: bool,
    done: bool,
    /// Entries up to this id were sent before (a resumed stream being replayed).
    replay_through: Option<(u64, u64)>,
    replayed: bool,
    /// Set when the job itself ended the stream (`Final`: the finish reason of the first
    /// choice and the usage; `Error`: `None` inside).
    job_outcome: Option<Option<(FinishReason, Usage)>>,
}

impl ChunkBuilder {
    /// `resumed`: the client saw the stream's first entry already (it resumes after an id),
    /// so it has the role chunks.
    pub fn new(
        id: String,
        created: i64,
        model: String,
        n: u32,
        delivery: Delivery,
        resumed: bool,
    ) -> Self {
        let n = n.max(1) as usize;
        ChunkBuilder {
            id,
            created,
            model,
            delivery,
            roles_sent: resumed,
            // A resumed client has an unknown prefix of the text; never resend a `Final`'s
            // text to it (it would duplicate), only its finish chunks.
            sent_len: vec![if resumed { usize::MAX } else { 0 }; n],
            positions: (!resumed).then(|| StreamPositions::new(n)),
            finished: vec![false; n],
            parsed: (0..n as u32)
                .map(|i| StreamChoice::new(&OutputFormat::default(), 0, i))
                .collect(),
            usage: Usage::default(),
            attempt: None,
            content_sent: resumed,
            done: false,
            replay_through: None,
            replayed: false,
            job_outcome: None,
        }
    }

    /// Reads the job's text as its output format says (`job` seeds the call ids).
    pub fn with_output(mut self, format: &OutputFormat, job: uuid::Uuid) -> Self {
        self.parsed = (0..self.finished.len() as u32)
            .map(|i| StreamChoice::new(format, job.as_u128(), i))
            .collect();
        self
    }

    /// Resumes a stream after the entry `after` by replaying it from the start: the entries
    /// up to `after` only rebuild the parsers' state (a tool call or reasoning block may
    /// span the resume point), later ones are sent. Build with `resumed: false` and follow
    /// the stream from `"0"`.
    pub fn replaying_through(mut self, after: &str) -> Self {
        self.replay_through = parse_entry_id(after).filter(|&at| at != (0, 0));
        self
    }

    /// Whether the stream has ended (a `Final` or an error was turned into frames).
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Whether the job ended the stream itself (a `Final` or a runner's `Error`), as
    /// opposed to the api giving up (timeout, Redis lost) while the job may still run.
    pub fn ended_normally(&self) -> bool {
        self.job_outcome.is_some()
    }

    /// The first choice's finish reason and the usage, once a `Final` arrived.
    pub fn final_outcome(&self) -> Option<(FinishReason, Usage)> {
        self.job_outcome.flatten()
    }

    /// Whether any content has been sent yet (for time-to-first-token).
    pub fn content_sent(&self) -> bool {
        self.content_sent
    }

    pub fn on_entry(&mut self, entry: &StreamEntry) -> Vec<Frame> {
        if self.done {
            return Vec::new();
        }
        if let Some(through) = self.replay_through {
            match parse_entry_id(&entry.id) {
                Some(at) if at <= through => {
                    let ends =
                        matches!(entry.event, JobEvent::Final { .. } | JobEvent::Error { .. });
                    if !ends || self.replayed {
                        // The client has these frames; they only rebuild the parsers' state.
                        self.replayed = true;
                        let mut frames = self.process(entry);
                        frames.retain(|f| matches!(f.payload, Payload::Done));
                        return frames;
                    }
                    // The stream is gone and the job's row answered: the client has an
                    // unknown prefix of the text, so only the finish chunks are sent.
                    self.replay_through = None;
                    self.roles_sent = true;
                    self.content_sent = true;
                    self.sent_len.iter_mut().for_each(|s| *s = usize::MAX);
                }
                _ => self.replay_through = None,
            }
        }
        self.process(entry)
    }

    fn process(&mut self, entry: &StreamEntry) -> Vec<Frame> {
        let mut out = Vec::new();
        let id = Some(entry.id.clone());
        if !self.roles_sent && !matches!(entry.event, JobEvent::Error { .. }) {
            self.roles_sent = true;
            for index in 0..self.finished.len() as u32 {
                let delta = Delta {
                    role: Some("assistant"),
                    content: Some(String::new()),
                    ..Delta::default()
                };
                out.push(self.frame(id.clone(), index, delta, None, None));
            }
        }
        match &entry.event {
            JobEvent::Started {
                attempt, continues, ..
            } => {
                // A continuing attempt extends what was sent; one that starts over would
                // repeat it, and two attempts' tokens are never spliced into one answer.
                if self.attempt.is_some_and(|a| a != *attempt) && self.content_sent && !continues {
                    out.extend(self.on_error(ApiError::JobFailed {
                        code: "runner_lost".into(),
                        message: "The runner serving this request was lost after it had sent tokens; retry the request.".into(),
                    }));
                }
                // The same attempt's start again is an append its runner retried: nothing
                // starts over.
                if !continues && self.attempt != Some(*attempt) {
                    if let Some(positions) = &mut self.positions {
                        positions.restart();
                    }
                }
                self.attempt = Some(*attempt);
            }
            JobEvent::Delta {
                index,
                text,
                token_ids,
                logprobs,
                finish_reason,
                usage,
                at,
            } => {
                let follows = self
                    .positions
                    .as_mut()
                    .is_none_or(|p| p.admit(*index, *at, token_ids.len(), text.len()));
                if !follows {
                    // Entries are missing before it: the choice waits for `Final`.
                    tracing::debug!(index, "a hole in the job's stream");
                    return out;
                }
                let tokens = usage
                    .completion_tokens
                    .saturating_sub(self.usage.completion_tokens);
                self.usage = *usage;
                self.on_delta(
                    &mut out,
                    &id,
                    *index,
                    text,
                    tokens,
                    logprobs.as_ref(),
                    *finish_reason,
                );
            }
            JobEvent::Final { completion } => self.on_final(&mut out, &id, completion),
            JobEvent::Error { code, message } => {
                self.job_outcome = Some(None);
                out.extend(self.on_error(ApiError::JobFailed {
                    code: code.clone(),
                    message: message.clone(),
                }))
            }
        }
        out
    }

    /// Ends the stream with an error event and `[DONE]`.
    pub fn on_error(&mut self, err: ApiError) -> Vec<Frame> {
        if self.done {
            return Vec::new();
        }
        self.done = true;
        vec![
            Frame {
                id: None,
                payload: Payload::Error(err),
            },
            Frame {
                id: None,
                payload: Payload::Done,
            },
        ]
    }

    #[allow(clippy::too_many_arguments)]
    fn on_delta(
        &mut self,
        out: &mut Vec<Frame>,
        id: &Option<String>,
        index: u32,
        text: &str,
        tokens: u32,
        logprobs: Option<&Vec<TokenLogprob>>,
        finish: Option<FinishReason>,
    ) {
        let i = index as usize;
        if i >= self.finished.len() || self.finished[i] {
            tracing::debug!(index, "ignoring a delta for an unknown or finished choice");
            return;
        }
        self.sent_len[i] = self.sent_len[i].saturating_add(text.len());
        let mut deltas = self.parsed[i].feed(text, tokens);
        if deltas.is_empty() && logprobs.is_some() {
            // Text held back by a parser still has its logprobs to deliver.
            deltas.push(Delta {
                content: Some(String::new()),
                ..Delta::default()
            });
        }
        let mut logprobs = logprobs.map(|l| ChoiceLogprobs { content: l.clone() });
        for delta in deltas {
            self.content_sent = true;
            out.push(self.frame(id.clone(), index, delta, logprobs.take(), None));
        }
        if let Some(reason) = finish {
            self.finish_choice(out, id, index, reason);
        }
    }

    /// The choice's held-back deltas, then its finish chunk.
    fn finish_choice(
        &mut self,
        out: &mut Vec<Frame>,
        id: &Option<String>,
        index: u32,
        reason: FinishReason,
    ) {
        let i = index as usize;
        for delta in self.parsed[i].finish() {
            self.content_sent = true;
            out.push(self.frame(id.clone(), index, delta, None, None));
        }
        self.finished[i] = true;
        let choice = &self.parsed[i];
        let reason = choice_finish_reason(reason, choice.called(), choice.legacy());
        out.push(self.frame(id.clone(), index, Delta::default(), None, Some(reason)));
    }

    fn on_final(&mut self, out: &mut Vec<Frame>, id: &Option<String>, completion: &Completion) {
        let mut unattributed = completion
            .usage
            .completion_tokens
            .saturating_sub(self.usage.completion_tokens);
        self.usage = completion.usage;
        for choice in &completion.choices {
            let i = choice.index as usize;
            if i >= self.finished.len() || self.finished[i] {
                continue;
            }
            // Text the deltas did not carry (a runner that does not stream, or a stream
            // that expired) is sent in one piece before the finish chunk.
            let sent = self.sent_len[i];
            if choice.text.len() > sent && choice.text.is_char_boundary(sent) {
                let rest = &choice.text[sent..];
                self.sent_len[i] = choice.text.len();
                for delta in self.parsed[i].feed(rest, std::mem::take(&mut unattributed)) {
                    self.content_sent = true;
                    out.push(self.frame(id.clone(), choice.index, delta, None, None));
                }
            }
            self.finish_choice(out, id, choice.index, choice.finish_reason);
        }
        for choice in &completion.choices {
            if let Some(hidden) = &choice.hidden_states {
                let delta = Delta {
                    hidden_states: Some(hidden.clone()),
                    ..Delta::default()
                };
                out.push(self.frame(id.clone(), choice.index, delta, None, None));
            }
        }
        if let Some(ext) = SglExt::of(completion, false) {
            let mut chunk = self.chunk(Vec::new(), None);
            chunk.sglext = Some(ext);
            out.push(Frame {
                id: id.clone(),
                payload: Payload::Chunk(chunk),
            });
        }
        if self.delivery.include_usage {
            out.push(Frame {
                id: id.clone(),
                payload: Payload::Chunk(self.chunk(Vec::new(), Some(Some(self.usage_out())))),
            });
        }
        out.push(Frame {
            id: None,
            payload: Payload::Done,
        });
        self.done = true;
        let first = completion
            .choices
            .first()
            .map_or(FinishReason::Stop, |c| c.finish_reason);
        self.job_outcome = Some(Some((first, completion.usage)));
    }

    /// The usage so far, with the reasoning tokens when reasoning is split off.
    fn usage_out(&self) -> UsageOut {
        let reasoning = self
            .parsed
            .iter()
            .filter_map(StreamChoice::reasoning_tokens)
            .reduce(|a, b| a + b);
        UsageOut::with_reasoning(self.usage, reasoning)
    }

    fn frame(
        &self,
        id: Option<String>,
        index: u32,
        delta: Delta,
        logprobs: Option<ChoiceLogprobs>,
        finish: Option<&'static str>,
    ) -> Frame {
        let choice = ChunkChoice {
            index,
            delta,
            logprobs,
            finish_reason: finish,
        };
        Frame {
            id,
            payload: Payload::Chunk(self.chunk(vec![choice], self.usage_field())),
        }
    }

    fn usage_field(&self) -> Option<Option<UsageOut>> {
        if self.delivery.continuous_usage {
            Some(Some(self.usage_out()))
        } else if self.delivery.include_usage {
            Some(None)
        } else {
            None
        }
    }

    fn chunk(
        &self,
        choices: Vec<ChunkChoice>,
        usage: Option<Option<UsageOut>>,
    ) -> ChatCompletionChunk {
        ChatCompletionChunk {
            id: self.id.clone(),
            object: "chat.completion.chunk",
            created: self.created,
            model: self.model.clone(),
            system_fingerprint: SYSTEM_FINGERPRINT,
            choices,
            usage,
            sglext: None,
        }
    }
}

/// A Redis stream entry id, `<ms>-<seq>` (or `<ms>`), as a comparable pair.
fn parse_entry_id(id: &str) -> Option<(u64, u64)> {
    let (ms, seq) = id.split_once('-').unwrap_or((id, "0"));
    Some((ms.parse().ok()?, seq.parse().ok()?))
}

#[cfg(test)]
#[path = "chunks_tests.rs"]
mod tests;
