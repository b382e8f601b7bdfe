//! A job's stream entries → a `response` object and the typed events OpenAI streams for it.
//!
//! The parsers' pieces become output items in the order they come: a reasoning item, a
//! message with one `output_text` part, a `function_call` per call; an item is closed (its
//! `.done` events) when a piece of another kind starts the next. Every event carries the next
//! `sequence_number`, so the sequence is a function of the job's stream alone: any api
//! process replaying the stream from its start numbers the events alike, which is what lets a
//! client resume with `starting_after` anywhere. The non-streamed answer is built by the same
//! code (its events thrown away), so both read the same. Pure bookkeeping, no I/O.

use crate::openai::responses::{
    response_id, IncompleteDetails, InputTokensDetails, OutputItem, OutputText,
    OutputTokensDetails, ReasoningText, ResponseError, ResponseObject, ResponseSettings,
    ResponseUsage,
};
use crate::parsers::{ChoiceParser, Piece};
use fallow_protocol::job::{Completion, FinishReason, JobEvent, OutputFormat, TokenLogprob, Usage};
use fallow_protocol::position::StreamPositions;
use fallow_scheduler::stream::StreamEntry;
use serde_json::{json, Value};
use uuid::Uuid;

/// One server-sent event: its `event:` name and its `data:` (which repeats the name as
/// `type`, with the `sequence_number`).
#[derive(Debug, Clone, PartialEq)]
pub struct ResponseEvent {
    pub kind: &'static str,
    pub sequence_number: u64,
    pub data: Value,
}

pub struct ResponseBuilder {
    job: Uuid,
    response: ResponseObject,
    parser: ChoiceParser,
    /// The output item being written, if one is open.
    open: Option<usize>,
    next_sequence: u64,
    started: bool,
    done: bool,
    /// The job ended the response (`Final` or its `Error`), as opposed to the api giving up.
    job_ended: bool,
    /// The finish reason of the job's `Final`.
    finish: Option<FinishReason>,
    /// The job's usage so far (from the deltas).
    usage: Usage,
    /// Bytes of choice 0's text seen in deltas, so a `Final` adds only the rest.
    seen_len: usize,
    /// Where the choice's deltas have got to: after a hole the rest comes from `Final`.
    position: StreamPositions,
    attempt: Option<i32>,
    text_seen: bool,
    /// Logprobs not yet attached to an `output_text` delta.
    pending_logprobs: Vec<TokenLogprob>,
    logprobs_seen: bool,
    /// Reasoning tokens estimated for text no delta carried.
    estimated_reasoning: u32,
}

impl ResponseBuilder {
    /// `queued`: the response starts out queued (background) rather than in progress.
    pub fn new(
        job: Uuid,
        model: String,
        settings: &ResponseSettings,
        format: &OutputFormat,
        queued: bool,
    ) -> Self {
        let status = if queued { "queued" } else { "in_progress" };
        ResponseBuilder {
            job,
            response: ResponseObject::new(response_id(job), model, settings, status),
            parser: ChoiceParser::new(format, job.as_u128(), 0),
            open: None,
            next_sequence: 0,
            started: false,
            done: false,
            job_ended: false,
            finish: None,
            usage: Usage::default(),
            seen_len: 0,
            position: StreamPositions::new(1),
            attempt: None,
            text_seen: false,
            pending_logprobs: Vec::new(),
            logprobs_seen: false,
            estimated_reasoning: 0,
        }
    }

    /// The finished response of a job read from its record (a poll, a batch line): the
    /// whole text through the same pieces as a stream.
    pub fn from_completion(mut self, completion: &Completion) -> ResponseObject {
        self.on_entry(&StreamEntry {
            id: String::new(),
            event: JobEvent::Final {
                completion: completion.clone(),
            },
        });
        self.response
    }

    /// The failed response of a job that ended with `code` / `message`.
    pub fn failed(mut self, code: &str, message: &str) -> ResponseObject {
        self.fail(code, message);
        self.response
    }

    /// The response as built so far.
    pub fn response(&self) -> &ResponseObject {
        &self.response
    }

    pub fn into_response(self) -> ResponseObject {
        self.response
    }

    /// Whether a terminal event has been produced.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Whether the job itself ended the response (so no cancellation is due).
    pub fn ended_by_job(&self) -> bool {
        self.job_ended
    }

    /// The job's finish reason and usage, once its `Final` has been read.
    pub fn final_outcome(&self) -> Option<(FinishReason, Usage)> {
        self.finish.map(|reason| (reason, self.usage))
    }

    /// Whether any output text has been seen (for time-to-first-token).
    pub fn text_seen(&self) -> bool {
        self.text_seen
    }

    /// `response.created` and `response.in_progress`, once.
    pub fn start(&mut self) -> Vec<ResponseEvent> {
        let mut out = Vec::new();
        if self.started {
            return out;
        }
        self.started = true;
        let snapshot = self.snapshot();
        self.emit(
            &mut out,
            "response.created",
            json!({ "response": snapshot }),
        );
        self.response.status = "in_progress";
        let snapshot = self.snapshot();
        self.emit(
            &mut out,
            "response.in_progress",
            json!({ "response": snapshot }),
        );
        out
    }

    pub fn on_entry(&mut self, entry: &StreamEntry) -> Vec<ResponseEvent> {
        let mut out = self.start();
        if self.done {
            return out;
        }
        match &entry.event {
            JobEvent::Started {
                attempt, continues, ..
            } => {
                // A continuing attempt extends what was sent; one that starts over would
                // repeat it, and two attempts' tokens are never spliced into one answer.
                if self.attempt.is_some_and(|a| a != *attempt) && self.text_seen && !continues {
                    out.extend(self.fail(
                        "runner_lost",
                        "The runner serving this response was lost after it had sent tokens; retry the request.",
                    ));
                }
                // The same attempt's start again is a retried append: nothing starts over.
                if !continues && self.attempt != Some(*attempt) {
                    self.position.restart();
                }
                self.attempt = Some(*attempt);
            }
            JobEvent::Delta {
                index: 0,
                text,
                token_ids,
                logprobs,
                usage,
                at,
                ..
            } if self.position.admit(0, *at, token_ids.len(), text.len()) => {
                let tokens = usage
                    .completion_tokens
                    .saturating_sub(self.usage.completion_tokens);
                self.usage = *usage;
                if let Some(logprobs) = logprobs {
                    self.logprobs_seen = true;
                    self.pending_logprobs.extend(logprobs.iter().cloned());
                }
                self.seen_len = self.seen_len.saturating_add(text.len());
                let pieces = self.parser.feed(text, Some(tokens));
                self.pieces(&mut out, pieces);
            }
            // One choice only: the Responses API has no `n`. A delta after a hole in the
            // stream is left out too: the rest comes from `Final`.
            JobEvent::Delta { .. } => {}
            JobEvent::Final { completion } => self.on_final(&mut out, completion),
            JobEvent::Error { code, message } => out.extend(self.fail(code, message)),
        }
        out
    }

    /// An error of the api itself (a timeout, Redis lost): OpenAI's `error` event.
    pub fn on_error(&mut self, err: &crate::error::ApiError) -> Vec<ResponseEvent> {
        let mut out = Vec::new();
        if self.done {
            return out;
        }
        self.done = true;
        let body = err.status_and_body().1.error;
        self.emit(
            &mut out,
            "error",
            json!({"code": body.code, "message": body.message, "param": body.param}),
        );
        out
    }

    fn on_final(&mut self, out: &mut Vec<ResponseEvent>, completion: &Completion) {
        let unattributed = completion
            .usage
            .completion_tokens
            .saturating_sub(self.usage.completion_tokens);
        self.usage = completion.usage;
        let choice = completion.choices.iter().find(|c| c.index == 0);
        if let Some(choice) = choice {
            if !self.logprobs_seen {
                if let Some(logprobs) = &choice.logprobs {
                    self.pending_logprobs.extend(logprobs.iter().cloned());
                }
            }
            let seen = self.seen_len;
            if choice.text.len() > seen && choice.text.is_char_boundary(seen) {
                let rest = &choice.text[seen..];
                self.seen_len = choice.text.len();
                let pieces = self.parser.feed(rest, Some(0));
                self.estimate_reasoning(&pieces, unattributed);
                self.pieces(out, pieces);
            }
        }
        let pieces = self.parser.finish();
        self.pieces(out, pieces);
        if self.response.output.is_empty() {
            // An answer always has a message, if an empty one.
            self.open_message(out);
        }
        let reason = choice.map_or(FinishReason::Stop, |c| c.finish_reason);
        self.finish = Some(reason);
        let (status, kind) = match reason {
            FinishReason::Stop => ("completed", "response.completed"),
            FinishReason::Length => ("incomplete", "response.incomplete"),
            FinishReason::Abort => ("cancelled", "response.incomplete"),
        };
        let item_status = if status == "completed" {
            "completed"
        } else {
            "incomplete"
        };
        self.close_open(out, item_status);
        self.response.status = status;
        if reason == FinishReason::Length {
            self.response.incomplete_details = Some(IncompleteDetails {
                reason: "max_output_tokens",
            });
        }
        self.response.usage = Some(self.usage_out());
        self.done = true;
        self.job_ended = true;
        let snapshot = self.snapshot();
        self.emit(out, kind, json!({ "response": snapshot }));
    }

    fn fail(&mut self, code: &str, message: &str) -> Vec<ResponseEvent> {
        let mut out = self.start();
        if self.done {
            return out;
        }
        self.close_open(&mut out, "incomplete");
        self.done = true;
        self.job_ended = true;
        self.response.status = "failed";
        self.response.error = Some(ResponseError {
            code: code.to_owned(),
            message: message.to_owned(),
        });
        self.response.usage = Some(self.usage_out());
        let snapshot = self.snapshot();
        self.emit(&mut out, "response.failed", json!({ "response": snapshot }));
        out
    }

    /// Text no delta carried is attributed the tokens no delta counted, and its reasoning
    /// the share of those tokens its bytes have.
    fn estimate_reasoning(&mut self, pieces: &[Piece], tokens: u32) {
        let (reasoning, all) = pieces.iter().fold((0u64, 0u64), |(r, a), p| match p {
            Piece::Reasoning(t) => (r + t.len() as u64, a + t.len() as u64),
            Piece::Content(t) | Piece::CallArgs { text: t, .. } => (r, a + t.len() as u64),
            Piece::CallStart { name, .. } => (r, a + name.len() as u64),
        });
        let estimate = (u64::from(tokens) * reasoning)
            .checked_div(all)
            .unwrap_or(0);
        self.estimated_reasoning += u32::try_from(estimate).unwrap_or(u32::MAX);
    }

    fn usage_out(&self) -> ResponseUsage {
        let reasoning = if self.parser.splits_reasoning() {
            self.parser.reasoning_tokens() + self.estimated_reasoning
        } else {
            0
        };
        ResponseUsage {
            input_tokens: self.usage.prompt_tokens,
            input_tokens_details: InputTokensDetails {
                cached_tokens: self.usage.cached_tokens,
            },
            output_tokens: self.usage.completion_tokens,
            output_tokens_details: OutputTokensDetails {
                reasoning_tokens: reasoning.min(self.usage.completion_tokens),
            },
            total_tokens: self.usage.total_tokens(),
        }
    }

    fn pieces(&mut self, out: &mut Vec<ResponseEvent>, pieces: Vec<Piece>) {
        for piece in pieces {
            match piece {
                Piece::Content(text) => {
                    if !matches!(self.open_item(), Some(OutputItem::Message { .. })) {
                        self.close_open(out, "completed");
                        self.open_message(out);
                    }
                    self.text_seen = true;
                    let logprobs = std::mem::take(&mut self.pending_logprobs);
                    let (index, item_id) = self.open_ids();
                    if let Some(OutputItem::Message { content, .. }) = self.open_item_mut() {
                        if let Some(part) = content.first_mut() {
                            part.text.push_str(&text);
                            part.logprobs.extend(logprobs.iter().cloned());
                        }
                    }
                    self.emit(
                        out,
                        "response.output_text.delta",
                        json!({"item_id": item_id, "output_index": index, "content_index": 0,
                               "delta": text, "logprobs": logprobs}),
                    );
                }
                Piece::Reasoning(text) => {
                    if !matches!(self.open_item(), Some(OutputItem::Reasoning { .. })) {
                        self.close_open(out, "completed");
                        self.open_reasoning(out);
                    }
                    self.text_seen = true;
                    let (index, item_id) = self.open_ids();
                    if let Some(OutputItem::Reasoning { content, .. }) = self.open_item_mut() {
                        if let Some(part) = content.first_mut() {
                            part.text.push_str(&text);
                        }
                    }
                    self.emit(
                        out,
                        "response.reasoning_text.delta",
                        json!({"item_id": item_id, "output_index": index, "content_index": 0,
                               "delta": text}),
                    );
                }
                Piece::CallStart { id, name, .. } => {
                    self.close_open(out, "completed");
                    self.text_seen = true;
                    let index = self.response.output.len();
                    let item = OutputItem::FunctionCall {
                        id: self.item_id("fc", index),
                        call_id: id,
                        name,
                        arguments: String::new(),
                        status: "in_progress",
                    };
                    self.add_item(out, item);
                }
                Piece::CallArgs { text, .. } => {
                    let (index, item_id) = self.open_ids();
                    if let Some(OutputItem::FunctionCall { arguments, .. }) = self.open_item_mut() {
                        arguments.push_str(&text);
                        self.emit(
                            out,
                            "response.function_call_arguments.delta",
                            json!({"item_id": item_id, "output_index": index, "delta": text}),
                        );
                    }
                }
            }
        }
    }

    fn open_message(&mut self, out: &mut Vec<ResponseEvent>) {
        let index = self.response.output.len();
        let item = OutputItem::Message {
            id: self.item_id("msg", index),
            status: "in_progress",
            role: "assistant",
            content: Vec::new(),
        };
        self.add_item(out, item);
        let part = OutputText::new(String::new());
        self.emit(
            out,
            "response.content_part.added",
            json!({"item_id": self.item_id("msg", index), "output_index": index,
                   "content_index": 0, "part": part}),
        );
        if let Some(OutputItem::Message { content, .. }) = self.open_item_mut() {
            content.push(part);
        }
    }

    fn open_reasoning(&mut self, out: &mut Vec<ResponseEvent>) {
        let index = self.response.output.len();
        let item = OutputItem::Reasoning {
            id: self.item_id("rs", index),
            summary: Vec::new(),
            content: Vec::new(),
            status: "in_progress",
        };
        self.add_item(out, item);
        let part = ReasoningText::new(String::new());
        self.emit(
            out,
            "response.content_part.added",
            json!({"item_id": self.item_id("rs", index), "output_index": index,
                   "content_index": 0, "part": part}),
        );
        if let Some(OutputItem::Reasoning { content, .. }) = self.open_item_mut() {
            content.push(part);
        }
    }

    fn add_item(&mut self, out: &mut Vec<ResponseEvent>, item: OutputItem) {
        let index = self.response.output.len();
        self.emit(
            out,
            "response.output_item.added",
            json!({"output_index": index, "item": item}),
        );
        self.response.output.push(item);
        self.open = Some(index);
    }

    /// Ends the open item: its `.done` events with the whole text, then
    /// `response.output_item.done`.
    fn close_open(&mut self, out: &mut Vec<ResponseEvent>, status: &'static str) {
        let Some(index) = self.open.take() else {
            return;
        };
        if !self.pending_logprobs.is_empty() {
            let logprobs = std::mem::take(&mut self.pending_logprobs);
            if let Some(OutputItem::Message { content, .. }) = self.response.output.get_mut(index) {
                if let Some(part) = content.first_mut() {
                    part.logprobs.extend(logprobs);
                }
            }
        }
        let Some(item) = self.response.output.get_mut(index) else {
            return;
        };
        item.set_status(status);
        let item = item.clone();
        let item_id = item.id().to_owned();
        match &item {
            OutputItem::Message { content, .. } => {
                if let Some(part) = content.first() {
                    self.emit(
                        out,
                        "response.output_text.done",
                        json!({"item_id": item_id, "output_index": index, "content_index": 0,
                               "text": part.text, "logprobs": part.logprobs}),
                    );
                    self.emit(
                        out,
                        "response.content_part.done",
                        json!({"item_id": item_id, "output_index": index, "content_index": 0,
                               "part": part}),
                    );
                }
            }
            OutputItem::Reasoning { content, .. } => {
                if let Some(part) = content.first() {
                    self.emit(
                        out,
                        "response.reasoning_text.done",
                        json!({"item_id": item_id, "output_index": index, "content_index": 0,
                               "text": part.text}),
                    );
                    self.emit(
                        out,
                        "response.content_part.done",
                        json!({"item_id": item_id, "output_index": index, "content_index": 0,
                               "part": part}),
                    );
                }
            }
            OutputItem::FunctionCall {
                name, arguments, ..
            } => {
                self.emit(
                    out,
                    "response.function_call_arguments.done",
                    json!({"item_id": item_id, "output_index": index, "name": name,
                           "arguments": arguments}),
                );
            }
        }
        self.emit(
            out,
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        );
    }

    fn open_item(&self) -> Option<&OutputItem> {
        self.response.output.get(self.open?)
    }

    fn open_item_mut(&mut self) -> Option<&mut OutputItem> {
        self.response.output.get_mut(self.open?)
    }

    /// The open item's index and id.
    fn open_ids(&self) -> (usize, String) {
        let index = self.open.unwrap_or(0);
        let id = self
            .open_item()
            .map(|item| item.id().to_owned())
            .unwrap_or_default();
        (index, id)
    }

    /// Stable item ids: the job and the item's place in the output.
    fn item_id(&self, prefix: &str, index: usize) -> String {
        format!("{prefix}_{}{index:04x}", self.job.simple())
    }

    fn snapshot(&self) -> Value {
        serde_json::to_value(&self.response).unwrap_or(Value::Null)
    }

    fn emit(&mut self, out: &mut Vec<ResponseEvent>, kind: &'static str, mut data: Value) {
        let sequence_number = self.next_sequence;
        self.next_sequence += 1;
        if let Some(obj) = data.as_object_mut() {
            obj.insert("type".into(), Value::String(kind.to_owned()));
            obj.insert("sequence_number".into(), json!(sequence_number));
        }
        out.push(ResponseEvent {
            kind,
            sequence_number,
            data,
        });
    }
}

#[cfg(test)]
#[path = "builder_tests.rs"]
mod tests;
