//! OpenAI's harmony format (gpt-oss), where reasoning, answer and tool calls are messages on
//! channels, so one machine reads all three:
//!
//! ```text
//! <|channel|>analysis<|message|>…thinking…<|end|>
//! <|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json<|message|>{…}<|call|>
//! <|start|>assistant<|channel|>final<|message|>…answer…<|return|>
//! ```
//!
//! The generation prompt ends with `<|start|>assistant`, so the output opens on a header.
//! The `analysis` channel is reasoning; `final` is content; a message addressed `to=` a
//! function (on any channel, `commentary` in practice) is a call whose body is its JSON
//! arguments; `commentary` without a recipient is a preamble, shown as content.
//! `<|return|>` and `<|call|>` end generation, so the engine does not write them into the
//! text; the end of the output closes the last message as well.
//!
//! A forced call is held to [`grammar::forced_call`].
//!
//! Text outside any message is content, and so is a header that never reaches
//! `<|message|>` within [`header::MAX_HEADER`] bytes or a line: malformed output degrades to
//! content, never to an error. A header cut off by the end of the output carries no text
//! and is dropped.

pub mod grammar;
mod header;

use super::markers::{MarkerWatch, Watch};
use super::tool_calls::CallSink;
use super::Piece;
use header::Header;

/// The name runners publish for harmony, as their tool parser and their reasoning parser.
pub const HARMONY: &str = "harmony";

const START: &str = "<|start|>";
const CHANNEL: &str = "<|channel|>";
const MESSAGE: &str = "<|message|>";
const CONSTRAIN: &str = "<|constrain|>";
const END: &str = "<|end|>";
const CALL: &str = "<|call|>";
const RETURN: &str = "<|return|>";

/// The markers that open a header.
const OPENERS: [&str; 2] = [START, CHANNEL];
/// The markers that end a message body: its own ends, or a new header when the model left
/// out `<|end|>`.
const BODY_ENDS: [&str; 5] = [END, CALL, RETURN, START, CHANNEL];

/// Where a message's body goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    Reasoning,
    Content,
    /// The arguments of the call that was just started; `sent` once any text went out.
    Call {
        sent: bool,
    },
}

enum State {
    /// Outside any message.
    Between {
        /// Whitespace not yet known to be content (dropped when a header follows).
        held_ws: String,
    },
    /// A header being read; all of its text so far, its opener included.
    Header {
        raw: String,
    },
    Body(Route),
}

/// One choice's harmony reader.
pub struct HarmonyParser {
    state: State,
    watch: MarkerWatch,
    sink: CallSink,
    /// Analysis is reported as reasoning (else as content, for a client that keeps the
    /// reasoning in the answer).
    split_reasoning: bool,
    /// Messages to a function are calls (else their bodies are content: no tools offered).
    calls: bool,
}

impl HarmonyParser {
    /// `seed` and `choice` make the call ids, as in [`super::tool_calls::ToolCallParser`].
    pub fn new(
        split_reasoning: bool,
        calls: bool,
        single_call: bool,
        seed: u128,
        choice: u32,
    ) -> Self {
        HarmonyParser {
            state: State::Between {
                held_ws: String::new(),
            },
            watch: MarkerWatch::default(),
            sink: CallSink::new(single_call, seed, choice),
            split_reasoning,
            calls,
        }
    }

    /// Whether analysis is split off as reasoning.
    pub fn splits_reasoning(&self) -> bool {
        self.split_reasoning
    }

    /// Whether the text fed so far ends inside reasoning.
    pub fn in_reasoning(&self) -> bool {
        matches!(self.state, State::Body(Route::Reasoning))
    }

    pub fn feed(&mut self, text: &str) -> Vec<Piece> {
        for c in text.chars() {
            self.push(c);
        }
        self.sink.take()
    }

    pub fn finish(&mut self) -> Vec<Piece> {
        let held = self.watch.take();
        match &mut self.state {
            State::Between { held_ws } => {
                let text = std::mem::take(held_ws) + &held;
                self.sink.content(&text);
            }
            // A header cut off by the end of the output: no message text was lost.
            State::Header { .. } => {}
            State::Body(route) => {
                let mut route = *route;
                send(&mut self.sink, &mut route, &held);
                close(&mut self.sink, route);
            }
        }
        self.sink.end();
        self.sink.take()
    }

    fn push(&mut self, c: char) {
        match &mut self.state {
            State::Between { held_ws } => {
                let mut released = String::new();
                if let Watch::Matched(i) = self.watch.push(c, &OPENERS, &mut released) {
                    self.state = State::Header {
                        raw: OPENERS[i].to_owned(),
                    };
                    return;
                }
                for c in released.chars() {
                    if c.is_whitespace() {
                        held_ws.push(c);
                    } else {
                        let text = std::mem::take(held_ws);
                        self.sink.content(&text);
                        self.sink.content_char(c);
                    }
                }
            }
            State::Header { raw } => {
                raw.push(c);
                if let Some(text) = raw.strip_suffix(MESSAGE) {
                    let header = Header::parse(text);
                    self.begin_body(&header);
                } else if !header::may_continue(raw) {
                    // Not a header after all: its text is content.
                    let text = std::mem::take(raw);
                    self.sink.content(&text);
                    self.state = State::Between {
                        held_ws: String::new(),
                    };
                }
            }
            State::Body(route) => {
                let mut released = String::new();
                let watch = self.watch.push(c, &BODY_ENDS, &mut released);
                send(&mut self.sink, route, &released);
                if let Watch::Matched(i) = watch {
                    close(&mut self.sink, *route);
                    self.state = match BODY_ENDS[i] {
                        opener @ (START | CHANNEL) => State::Header {
                            raw: opener.to_owned(),
                        },
                        _ => State::Between {
                            held_ws: String::new(),
                        },
                    };
                }
            }
        }
    }

    fn begin_body(&mut self, header: &Header) {
        let route = match (header.function(), header.channel.as_deref()) {
            (Some(name), _) if self.calls => {
                self.sink.start(name);
                Route::Call { sent: false }
            }
            (None, Some("analysis")) if self.split_reasoning => Route::Reasoning,
            _ => Route::Content,
        };
        self.state = State::Body(route);
    }
}

/// Body text to where its message goes.
fn send(sink: &mut CallSink, route: &mut Route, text: &str) {
    if text.is_empty() {
        return;
    }
    match route {
        Route::Reasoning => sink.reasoning(text),
        Route::Content => sink.content(text),
        Route::Call { sent } => {
            *sent = true;
            sink.args(text);
        }
    }
}

/// A message ended: a call without arguments still gets an (empty) object.
fn close(sink: &mut CallSink, route: Route) {
    if route == (Route::Call { sent: false }) {
        sink.args("{}");
    }
}

#[cfg(test)]
mod tests;
