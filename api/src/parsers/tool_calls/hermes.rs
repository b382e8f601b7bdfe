//! Hermes / Qwen 2.5 / Qwen 3: `<tool_call>\n{"name": "f", "arguments": {…}}\n</tool_call>`,
//! one block per call, after optional text.

use super::json_call::{CallStep, JsonCall};
use super::{CallSink, Syntax};
use crate::parsers::markers::{MarkerWatch, Watch};

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

enum Mode {
    Content,
    /// Inside a block; `raw` is its text so far, given back as content if it is no call.
    Call {
        call: JsonCall,
        raw: String,
    },
    /// The object closed; whatever comes up to `</tool_call>` is ignored.
    AfterCall,
}

pub struct Hermes {
    mode: Mode,
    watch: MarkerWatch,
}

impl Default for Hermes {
    fn default() -> Self {
        Hermes {
            mode: Mode::Content,
            watch: MarkerWatch::default(),
        }
    }
}

impl Syntax for Hermes {
    fn push(&mut self, c: char, out: &mut CallSink) {
        match &mut self.mode {
            Mode::Content => {
                if out.content_until(&mut self.watch, c, OPEN) {
                    self.mode = Mode::Call {
                        call: JsonCall::default(),
                        raw: OPEN.to_owned(),
                    };
                }
            }
            Mode::Call { call, raw } => {
                raw.push(c);
                match call.push(c, out) {
                    CallStep::More => {}
                    CallStep::Done => self.mode = Mode::AfterCall,
                    CallStep::Failed if call.name_sent() => self.mode = Mode::AfterCall,
                    CallStep::Failed => {
                        out.content(raw);
                        self.mode = Mode::Content;
                    }
                }
            }
            Mode::AfterCall => {
                let mut ignored = String::new();
                match self.watch.push(c, &[CLOSE, OPEN], &mut ignored) {
                    Watch::Matched(0) => self.mode = Mode::Content,
                    // A block that was never closed before the next one opened.
                    Watch::Matched(_) => {
                        self.mode = Mode::Call {
                            call: JsonCall::default(),
                            raw: OPEN.to_owned(),
                        }
                    }
                    Watch::Text => {}
                }
            }
        }
    }

    fn finish(&mut self, out: &mut CallSink) {
        match &mut self.mode {
            Mode::Content => out.content(&self.watch.take()),
            Mode::Call { call, raw } => {
                if call.name_sent() {
                    call.finish(out);
                } else {
                    out.content(raw);
                }
            }
            Mode::AfterCall => {}
        }
    }
}
