//! From a model's raw text to the parts of an OpenAI message: reasoning
//! ([`reasoning::ReasoningSplitter`]), tool calls ([`tool_calls::ToolCallParser`], one state
//! machine per model family) and content. Pure and incremental: a stream feeds each delta as
//! it arrives, a finished job feeds its whole text, and both read the same because every
//! parser decides one character at a time and holds back only what the next characters may
//! still change.
//!
//! - [`ChoiceParser`]: one choice's pipeline (reasoning first, then tool calls in the rest;
//!   or [`harmony`]'s one machine for both, whose channels carry reasoning and calls).
//! - [`ParsedMessage`]: pieces folded into a whole message.
//! - [`OutputCollector`]: a job's choices for a non-streamed answer (deltas as they come,
//!   then the stored text), with reasoning token counts.
//! - [`grammar`]: the Lark grammar that forces a call (`tool_choice: required` or named).

pub mod grammar;
pub mod harmony;
pub mod markers;
pub mod reasoning;
pub mod tool_calls;

use fallow_protocol::job::{Completion, OutputFormat, Usage};
use harmony::{HarmonyParser, HARMONY};
use reasoning::ReasoningSplitter;
use tool_calls::ToolCallParser;

/// One piece of parsed output, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Content(String),
    Reasoning(String),
    /// A call begins: its index among the choice's calls, its id and the function's name.
    CallStart {
        index: u32,
        id: String,
        name: String,
    },
    /// More of the call's arguments text.
    CallArgs {
        index: u32,
        text: String,
    },
}

/// Appends `piece`, merging it into the last piece when both are text of the same kind, so
/// that a character-at-a-time parser yields one piece per run.
pub fn push_piece(pieces: &mut Vec<Piece>, piece: Piece) {
    match (pieces.last_mut(), piece) {
        (_, Piece::Content(t) | Piece::Reasoning(t) | Piece::CallArgs { text: t, .. })
            if t.is_empty() => {}
        (Some(Piece::Content(a)), Piece::Content(b)) => a.push_str(&b),
        (Some(Piece::Reasoning(a)), Piece::Reasoning(b)) => a.push_str(&b),
        (Some(Piece::CallArgs { index: i, text: a }), Piece::CallArgs { index: j, text: b })
            if *i == j =>
        {
            a.push_str(&b)
        }
        (_, piece) => pieces.push(piece),
    }
}

/// One choice's parsers, as the job's [`OutputFormat`] asks.
pub struct ChoiceParser {
    pipeline: Pipeline,
    reasoning_tokens: u32,
}

/// How a choice's text is read.
enum Pipeline {
    /// Reasoning split off first, then tool calls read in the rest (`<think>` families).
    Layered {
        reasoning: Option<ReasoningSplitter>,
        tools: Option<ToolCallParser>,
    },
    /// One machine for reasoning, calls and content: harmony's channels carry all three,
    /// so the names runners publish for both roles are `harmony`.
    Harmony(HarmonyParser),
}

impl ChoiceParser {
    /// `seed` (the job's id) and `choice` make stable call ids.
    pub fn new(format: &OutputFormat, seed: u128, choice: u32) -> Self {
        let harmony_reasoning = format.reasoning_parser.as_deref() == Some(HARMONY);
        let harmony_calls = format.tool_parser.as_deref() == Some(HARMONY);
        let pipeline = if harmony_reasoning || harmony_calls {
            Pipeline::Harmony(HarmonyParser::new(
                harmony_reasoning,
                harmony_calls,
                format.single_tool_call,
                seed,
                choice,
            ))
        } else {
            Pipeline::Layered {
                reasoning: format
                    .reasoning_parser
                    .as_deref()
                    .and_then(ReasoningSplitter::for_parser),
                tools: format
                    .tool_parser
                    .as_deref()
                    .map(|name| ToolCallParser::new(name, format.single_tool_call, seed, choice)),
            }
        };
        ChoiceParser {
            pipeline,
            reasoning_tokens: 0,
        }
    }

    /// Whether reasoning is split off at all.
    pub fn splits_reasoning(&self) -> bool {
        match &self.pipeline {
            Pipeline::Layered { reasoning, .. } => reasoning.is_some(),
            Pipeline::Harmony(harmony) => harmony.splits_reasoning(),
        }
    }

    /// Feeds a delta of `tokens` tokens (when known). A delta counts as reasoning when the
    /// reasoning was open at its start or is open at its end (so the tokens of `<think>`
    /// and `</think>` count too) or it carried reasoning text.
    pub fn feed(&mut self, text: &str, tokens: Option<u32>) -> Vec<Piece> {
        let entry = self.in_reasoning();
        let pieces = match &mut self.pipeline {
            Pipeline::Layered { reasoning, tools } => {
                let pieces = match reasoning.as_mut() {
                    Some(splitter) => splitter.feed(text),
                    None => vec![Piece::Content(text.to_owned())],
                };
                through_tools(tools.as_mut(), pieces)
            }
            Pipeline::Harmony(harmony) => harmony.feed(text),
        };
        let exit = self.in_reasoning();
        let carried = pieces.iter().any(|p| matches!(p, Piece::Reasoning(_)));
        if entry || exit || carried {
            self.reasoning_tokens += tokens.unwrap_or(0);
        }
        pieces
    }

    pub fn finish(&mut self) -> Vec<Piece> {
        match &mut self.pipeline {
            Pipeline::Layered { reasoning, tools } => {
                let pieces = reasoning
                    .as_mut()
                    .map(ReasoningSplitter::finish)
                    .unwrap_or_default();
                let mut out = through_tools(tools.as_mut(), pieces);
                if let Some(tools) = tools.as_mut() {
                    for piece in tools.finish() {
                        push_piece(&mut out, piece);
                    }
                }
                out
            }
            Pipeline::Harmony(harmony) => harmony.finish(),
        }
    }

    /// Reasoning tokens counted from the deltas fed with token counts.
    pub fn reasoning_tokens(&self) -> u32 {
        self.reasoning_tokens
    }

    /// Whether the text fed so far ends inside the reasoning (only where it is split off).
    fn in_reasoning(&self) -> bool {
        match &self.pipeline {
            Pipeline::Layered { reasoning, .. } => reasoning
                .as_ref()
                .is_some_and(ReasoningSplitter::in_reasoning),
            Pipeline::Harmony(harmony) => harmony.in_reasoning(),
        }
    }
}

/// The content pieces through the tool-call parser (when calls are parsed), the others as
/// they are.
fn through_tools(tools: Option<&mut ToolCallParser>, pieces: Vec<Piece>) -> Vec<Piece> {
    let mut out = Vec::new();
    let Some(tools) = tools else {
        for piece in pieces {
            push_piece(&mut out, piece);
        }
        return out;
    };
    for piece in pieces {
        match piece {
            Piece::Content(text) => {
                for parsed in tools.feed(&text) {
                    push_piece(&mut out, parsed);
                }
            }
            other => push_piece(&mut out, other),
        }
    }
    out
}

/// A call as it ends up in the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// Pieces folded into one message.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParsedMessage {
    pub content: String,
    pub reasoning: Option<String>,
    pub tool_calls: Vec<ParsedCall>,
}

impl ParsedMessage {
    pub fn absorb(&mut self, pieces: &[Piece]) {
        for piece in pieces {
            match piece {
                Piece::Content(text) => self.content.push_str(text),
                Piece::Reasoning(text) => self
                    .reasoning
                    .get_or_insert_with(String::new)
                    .push_str(text),
                Piece::CallStart { id, name, .. } => self.tool_calls.push(ParsedCall {
                    id: id.clone(),
                    name: name.clone(),
                    arguments: String::new(),
                }),
                Piece::CallArgs { index, text } => {
                    if let Some(call) = self.tool_calls.get_mut(*index as usize) {
                        call.arguments.push_str(text);
                    }
                }
            }
        }
    }
}

/// One choice's parsed message and its reasoning token count (`None` when reasoning is not
/// split off).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedChoice {
    pub message: ParsedMessage,
    pub reasoning_tokens: Option<u32>,
}

/// Parses a job's choices for a non-streamed answer: deltas as they arrive (which carry
/// token counts), then whatever of the stored text they did not carry.
pub struct OutputCollector {
    format: OutputFormat,
    job: uuid::Uuid,
    parsers: Vec<ChoiceParser>,
    messages: Vec<ParsedMessage>,
    /// Each choice's text fed so far. The final record must extend it: if it does not, a
    /// delta went missing (a Redis blip, a trimmed stream) and the answer is built from the
    /// final record alone, never stitched.
    fed: Vec<String>,
    /// Completion tokens of the job already attributed to a delta.
    tokens_seen: u32,
}

impl OutputCollector {
    pub fn new(format: &OutputFormat, job: uuid::Uuid, n: u32) -> Self {
        let n = n.max(1);
        OutputCollector {
            format: format.clone(),
            job,
            parsers: (0..n)
                .map(|i| ChoiceParser::new(format, job.as_u128(), i))
                .collect(),
            messages: vec![ParsedMessage::default(); n as usize],
            fed: vec![String::new(); n as usize],
            tokens_seen: 0,
        }
    }

    /// A `Delta` event: `usage` is the job's so far, so the difference to the last one is
    /// this delta's tokens.
    pub fn on_delta(&mut self, index: u32, text: &str, usage: &Usage) {
        let tokens = usage.completion_tokens.saturating_sub(self.tokens_seen);
        self.tokens_seen = self.tokens_seen.max(usage.completion_tokens);
        let i = index as usize;
        let (Some(parser), Some(message)) = (self.parsers.get_mut(i), self.messages.get_mut(i))
        else {
            return;
        };
        message.absorb(&parser.feed(text, Some(tokens)));
        self.fed[i].push_str(text);
    }

    /// The parsed choices of the finished job.
    pub fn finish(mut self, completion: &Completion) -> Vec<ParsedChoice> {
        let gap = completion.choices.iter().any(|c| {
            let fed = self.fed.get(c.index as usize).map_or("", String::as_str);
            !c.text.starts_with(fed)
        });
        if gap {
            tracing::warn!(job = %self.job, "the stream missed text the final record holds; answering from the record");
            self = OutputCollector::new(&self.format, self.job, self.parsers.len() as u32);
        }
        let mut unattributed = completion
            .usage
            .completion_tokens
            .saturating_sub(self.tokens_seen);
        let total_rest: usize = completion
            .choices
            .iter()
            .map(|c| {
                c.text
                    .len()
                    .saturating_sub(self.fed.get(c.index as usize).map_or(0, String::len))
            })
            .sum();
        let mut out = Vec::with_capacity(self.parsers.len());
        for (i, (parser, message)) in self.parsers.iter_mut().zip(&mut self.messages).enumerate() {
            let mut share = 0;
            let mut pieces = Vec::new();
            if let Some(choice) = completion.choices.iter().find(|c| c.index as usize == i) {
                let fed = self.fed[i].len();
                if choice.text.len() > fed && choice.text.is_char_boundary(fed) {
                    let rest = &choice.text[fed..];
                    share = (u64::from(unattributed) * rest.len() as u64)
                        .checked_div(total_rest as u64)
                        .map_or(0, |s| u32::try_from(s).unwrap_or(u32::MAX))
                        .min(unattributed);
                    unattributed -= share;
                    pieces = parser.feed(rest, Some(0));
                }
            }
            pieces.extend(parser.finish());
            message.absorb(&pieces);
            let reasoning_tokens = parser.splits_reasoning().then(|| {
                // Tokens of text no delta carried (a stored result read back, a batch
                // line) are estimated by the reasoning's share of that text.
                let (reasoning, all) = pieces.iter().fold((0u64, 0u64), |(r, a), p| match p {
                    Piece::Reasoning(t) => (r + t.len() as u64, a + t.len() as u64),
                    Piece::Content(t) | Piece::CallArgs { text: t, .. } => (r, a + t.len() as u64),
                    Piece::CallStart { name, .. } => (r, a + name.len() as u64),
                });
                let estimate = (u64::from(share) * reasoning).checked_div(all).unwrap_or(0);
                parser.reasoning_tokens() + u32::try_from(estimate).unwrap_or(u32::MAX)
            });
            out.push(ParsedChoice {
                message: std::mem::take(message),
                reasoning_tokens,
            });
        }
        out
    }
}

#[cfg(test)]
mod tests;
