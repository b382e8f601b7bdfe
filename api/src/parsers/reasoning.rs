//! Splits a reasoning model's thinking from its answer: `<think>…</think>` then the answer.
//! Two families differ only in how the output starts:
//! - `qwen3`: the model opens `<think>` itself; output that does not start with it has no
//!   reasoning (Qwen3 with `enable_thinking: false` gets an empty block in its prompt).
//! - `deepseek_r1`: the chat template already opened `<think>` in the prompt, so the output
//!   is reasoning until `</think>` (a leading `<think>` is tolerated); without `</think>` it is
//!   all reasoning, as in vLLM.
//!
//! Whitespace around the reasoning and at the start of the answer is dropped; it is held back
//! while it may still be such whitespace, so that a stream and a whole text split the same.

use super::markers::{MarkerWatch, Watch};
use super::{push_piece, Piece};

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

/// The reasoning syntaxes this server splits, by the names runners publish (`harmony` is
/// split by [`super::harmony`], which also reads its tool calls).
pub const REASONING_PARSERS: [&str; 3] = ["qwen3", "deepseek_r1", "harmony"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Nothing but whitespace (and perhaps the start of `<think>`) so far.
    Start,
    Reasoning,
    Answer,
}

pub struct ReasoningSplitter {
    phase: Phase,
    /// The template opened the reasoning block (`deepseek_r1`).
    forced: bool,
    /// Text of the start phase, replayed once it is known what it is.
    start: String,
    watch: MarkerWatch,
    /// Whitespace inside the reasoning not yet known to be followed by more of it.
    held_ws: String,
    reasoning_began: bool,
    answer_began: bool,
}

impl ReasoningSplitter {
    /// The splitter for a runner-published parser name; `None` for names it does not know.
    pub fn for_parser(name: &str) -> Option<Self> {
        let forced = match name {
            "deepseek_r1" | "deepseek-r1" => true,
            "qwen3" | "think" => false,
            _ => return None,
        };
        Some(ReasoningSplitter {
            phase: Phase::Start,
            forced,
            start: String::new(),
            watch: MarkerWatch::default(),
            held_ws: String::new(),
            reasoning_began: false,
            answer_began: false,
        })
    }

    /// Whether the text fed so far ends inside the reasoning.
    pub fn in_reasoning(&self) -> bool {
        match self.phase {
            Phase::Start => self.forced || !self.start.trim_start().is_empty(),
            Phase::Reasoning => true,
            Phase::Answer => false,
        }
    }

    pub fn feed(&mut self, text: &str) -> Vec<Piece> {
        let mut out = Vec::new();
        for c in text.chars() {
            self.push(c, &mut out);
        }
        out
    }

    pub fn finish(&mut self) -> Vec<Piece> {
        let mut out = Vec::new();
        match self.phase {
            Phase::Start if self.forced => {
                let text = std::mem::take(&mut self.start);
                self.reasoning_text(text.trim_start(), &mut out);
            }
            Phase::Start => push_piece(&mut out, Piece::Content(std::mem::take(&mut self.start))),
            Phase::Reasoning => {
                let tail = self.watch.take();
                self.reasoning_text(&tail, &mut out);
            }
            Phase::Answer => {}
        }
        out
    }

    fn push(&mut self, c: char, out: &mut Vec<Piece>) {
        match self.phase {
            Phase::Start => {
                self.start.push(c);
                let seen = self.start.trim_start();
                if seen == OPEN {
                    self.start.clear();
                    self.phase = Phase::Reasoning;
                } else if !OPEN.starts_with(seen) {
                    let replay = std::mem::take(&mut self.start);
                    if self.forced {
                        self.phase = Phase::Reasoning;
                        for c in replay.chars() {
                            self.push(c, out);
                        }
                    } else {
                        self.phase = Phase::Answer;
                        self.answer_began = true;
                        push_piece(out, Piece::Content(replay));
                    }
                }
            }
            Phase::Reasoning => {
                let mut released = String::new();
                let watch = self.watch.push(c, &[CLOSE], &mut released);
                self.reasoning_text(&released, out);
                if watch == Watch::Matched(0) {
                    // Whitespace before `</think>` ends the reasoning; it is dropped.
                    self.held_ws.clear();
                    self.phase = Phase::Answer;
                }
            }
            Phase::Answer => {
                if self.answer_began || !c.is_whitespace() {
                    self.answer_began = true;
                    push_piece(out, Piece::Content(c.to_string()));
                }
            }
        }
    }

    fn reasoning_text(&mut self, text: &str, out: &mut Vec<Piece>) {
        for c in text.chars() {
            if c.is_whitespace() {
                if self.reasoning_began {
                    self.held_ws.push(c);
                }
                continue;
            }
            self.reasoning_began = true;
            let mut piece = std::mem::take(&mut self.held_ws);
            piece.push(c);
            push_piece(out, Piece::Reasoning(piece));
        }
    }
}
