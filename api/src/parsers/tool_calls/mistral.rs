//! Mistral: `[TOOL_CALLS]` then a JSON array of call objects
//! (`[{"name": "f", "arguments": {…}}, …]`), after optional text. (`[TOOL_CALLS]` is a
//! special token: requests that parse it keep special tokens in the output.)

use super::json_call::{CallStep, JsonCall};
use super::{CallSink, Syntax};
use crate::parsers::markers::{MarkerWatch, Watch};

const OPEN: &str = "[TOOL_CALLS]";

enum Mode {
    Content,
    /// After `[TOOL_CALLS]`, before `[`; `raw` is given back as content if no array follows.
    ArrayStart {
        raw: String,
    },
    /// Before an element (`{`) or the array's end (`]`).
    Item,
    Call {
        call: JsonCall,
        raw: String,
    },
    /// After an element: `,` or `]`.
    AfterItem,
}

pub struct Mistral {
    mode: Mode,
    watch: MarkerWatch,
}

impl Default for Mistral {
    fn default() -> Self {
        Mistral {
            mode: Mode::Content,
            watch: MarkerWatch::default(),
        }
    }
}

impl Syntax for Mistral {
    fn push(&mut self, c: char, out: &mut CallSink) {
        match &mut self.mode {
            Mode::Content => {
                let mut released = String::new();
                let watch = self.watch.push(c, &[OPEN], &mut released);
                out.content(&released);
                if watch == Watch::Matched(0) {
                    self.mode = Mode::ArrayStart { raw: OPEN.into() };
                }
            }
            Mode::ArrayStart { raw } => {
                raw.push(c);
                if c == '[' {
                    self.mode = Mode::Item;
                } else if !c.is_whitespace() {
                    out.content(raw);
                    self.mode = Mode::Content;
                }
            }
            Mode::Item => match c {
                '{' => {
                    let mut call = JsonCall::default();
                    call.push(c, out);
                    self.mode = Mode::Call {
                        call,
                        raw: c.to_string(),
                    };
                }
                ']' => self.mode = Mode::Content,
                _ => {}
            },
            Mode::Call { call, raw } => {
                raw.push(c);
                match call.push(c, out) {
                    CallStep::More => {}
                    CallStep::Done => self.mode = Mode::AfterItem,
                    CallStep::Failed if call.name_sent() => self.mode = Mode::AfterItem,
                    CallStep::Failed => {
                        out.content(raw);
                        self.mode = Mode::Content;
                    }
                }
            }
            Mode::AfterItem => match c {
                ',' => self.mode = Mode::Item,
                ']' => self.mode = Mode::Content,
                _ => {}
            },
        }
    }

    fn finish(&mut self, out: &mut CallSink) {
        match &mut self.mode {
            Mode::Content => out.content(&self.watch.take()),
            Mode::ArrayStart { raw } => out.content(raw),
            Mode::Call { call, raw } => {
                if call.name_sent() {
                    call.finish(out);
                } else {
                    out.content(raw);
                }
            }
            Mode::Item | Mode::AfterItem => {}
        }
    }
}
