//! Mistral: `[TOOL_CALLS]` then a JSON array of call objects
//! (`[{"name": "f", "arguments": {…}}, …]`), after optional text; tokenizers v11 and later
//! write each call as `[TOOL_CALLS]f[ARGS]{…}` instead. (`[TOOL_CALLS]` is a special token:
//! requests that parse it keep special tokens in the output.)

use super::json_call::{CallStep, JsonCall, ValueScan, ValueStep};
use super::{CallSink, Syntax};
use crate::parsers::markers::{MarkerWatch, Watch};

const OPEN: &str = "[TOOL_CALLS]";
const ARGS: &str = "[ARGS]";

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
    /// v11: the function's name, up to `[ARGS]`; `raw` is given back if no `[ARGS]` follows.
    Name {
        name: String,
        raw: String,
    },
    /// v11: the arguments object, reported as it arrives.
    Args(ValueScan),
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
                if out.content_until(&mut self.watch, c, OPEN) {
                    self.mode = Mode::ArrayStart { raw: OPEN.into() };
                }
            }
            Mode::ArrayStart { raw } => {
                raw.push(c);
                if c == '[' {
                    self.mode = Mode::Item;
                } else if c.is_alphanumeric() || c == '_' || c == '-' {
                    self.mode = Mode::Name {
                        name: c.to_string(),
                        raw: std::mem::take(raw),
                    };
                } else if !c.is_whitespace() {
                    out.content(raw);
                    self.mode = Mode::Content;
                }
            }
            Mode::Name { name, raw } => {
                raw.push(c);
                let mut released = String::new();
                match self.watch.push(c, &[ARGS], &mut released) {
                    Watch::Matched(_) => {
                        out.start(name);
                        self.mode = Mode::Args(ValueScan::default());
                    }
                    Watch::Text => {
                        name.push_str(&released);
                        if name.chars().any(|c| c.is_whitespace()) || name.len() > 64 {
                            out.content(raw);
                            self.watch.take();
                            self.mode = Mode::Content;
                        }
                    }
                }
            }
            Mode::Args(scan) => match scan.push(c) {
                ValueStep::Inside => out.args_char(c),
                ValueStep::Last => {
                    out.args_char(c);
                    self.mode = Mode::Content;
                }
                ValueStep::After => {
                    self.mode = Mode::Content;
                    self.push(c, out);
                }
            },
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
            Mode::Name { raw, .. } => {
                self.watch.take();
                out.content(raw);
            }
            Mode::Item | Mode::AfterItem | Mode::Args(_) => {}
        }
    }
}
