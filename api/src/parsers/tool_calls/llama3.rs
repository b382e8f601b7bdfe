//! Llama 3.x JSON tool calls: the whole answer is `{"name": "f", "parameters": {…}}` (several
//! separated by `;`), optionally after `<|python_tag|>`. An answer that starts otherwise is
//! plain content, as in vLLM's `llama3_json` parser.

use super::json_call::{CallStep, JsonCall};
use super::{CallSink, Syntax};

const PYTHON_TAG: &str = "<|python_tag|>";

enum Mode {
    /// Before the first non-whitespace character; `raw` holds what was seen.
    Start {
        raw: String,
    },
    Content,
    Call {
        call: JsonCall,
        raw: String,
    },
    /// After a call: whitespace and `;` until the next `{`.
    Between,
}

pub struct Llama3Json {
    mode: Mode,
}

impl Default for Llama3Json {
    fn default() -> Self {
        Llama3Json {
            mode: Mode::Start { raw: String::new() },
        }
    }
}

impl Llama3Json {
    fn start_call(&mut self, c: char, out: &mut CallSink) {
        self.mode = Mode::Call {
            call: JsonCall::default(),
            raw: String::new(),
        };
        self.push(c, out);
    }
}

impl Syntax for Llama3Json {
    fn push(&mut self, c: char, out: &mut CallSink) {
        match &mut self.mode {
            Mode::Start { raw } => {
                let tag_so_far = raw.trim_start();
                if c.is_whitespace() && tag_so_far.is_empty() {
                    raw.push(c);
                } else if c == '{' && tag_so_far.is_empty() {
                    self.start_call(c, out);
                } else {
                    raw.push(c);
                    let tag = raw.trim_start();
                    if tag == PYTHON_TAG {
                        self.mode = Mode::Between;
                    } else if !PYTHON_TAG.starts_with(tag) {
                        let raw = std::mem::take(raw);
                        out.content(&raw);
                        self.mode = Mode::Content;
                    }
                }
            }
            Mode::Content => out.content_char(c),
            Mode::Call { call, raw } => {
                raw.push(c);
                match call.push(c, out) {
                    CallStep::More => {}
                    CallStep::Done => self.mode = Mode::Between,
                    CallStep::Failed if call.name_sent() => self.mode = Mode::Between,
                    CallStep::Failed => {
                        out.content(raw);
                        self.mode = Mode::Content;
                    }
                }
            }
            Mode::Between => match c {
                '{' => self.start_call(c, out),
                ';' => {}
                c if c.is_whitespace() => {}
                c => {
                    self.mode = Mode::Content;
                    out.content_char(c);
                }
            },
        }
    }

    fn finish(&mut self, out: &mut CallSink) {
        match &mut self.mode {
            Mode::Start { raw } => out.content(raw),
            Mode::Call { call, raw } => {
                if call.name_sent() {
                    call.finish(out);
                } else {
                    out.content(raw);
                }
            }
            Mode::Content | Mode::Between => {}
        }
    }
}
