//! Tool calls in a model's text, per model family: Hermes/Qwen (`<tool_call>{…}</tool_call>`),
//! Llama 3 JSON (`{"name": …, "parameters": …}`, optionally after `<|python_tag|>`) and
//! Mistral (`[TOOL_CALLS][{…}, …]`). Each family is a character-at-a-time state machine
//! behind one interface, so a stream (text fed as it comes) and a whole text (fed at once)
//! go through the same code and read the same.

mod hermes;
mod json_call;
mod llama3;
mod mistral;

use super::markers::{MarkerWatch, Watch};
use super::{push_piece, Piece};

/// The syntaxes this server parses, by the names runners publish (`harmony` is read by
/// [`super::harmony`], which also splits its reasoning).
pub const TOOL_PARSERS: [&str; 4] = ["hermes", "llama3_json", "mistral", "harmony"];

/// One family's state machine. It reports content and calls to the sink.
trait Syntax: Send {
    fn push(&mut self, c: char, out: &mut CallSink);
    fn finish(&mut self, out: &mut CallSink);
}

/// A choice's tool-call parser.
pub struct ToolCallParser {
    syntax: Box<dyn Syntax>,
    sink: CallSink,
}

impl ToolCallParser {
    /// The parser for `name` (unknown names read as Hermes, the most common format);
    /// `seed` and `choice` make the call ids (`call_…`) stable for one job's choice.
    pub fn new(name: &str, single_call: bool, seed: u128, choice: u32) -> Self {
        let syntax: Box<dyn Syntax> = match name {
            "llama3_json" | "llama3" | "llama" => Box::<llama3::Llama3Json>::default(),
            "mistral" => Box::<mistral::Mistral>::default(),
            _ => Box::<hermes::Hermes>::default(),
        };
        ToolCallParser {
            syntax,
            sink: CallSink::new(single_call, seed, choice),
        }
    }

    pub fn feed(&mut self, text: &str) -> Vec<Piece> {
        for c in text.chars() {
            self.syntax.push(c, &mut self.sink);
        }
        std::mem::take(&mut self.sink.pieces)
    }

    pub fn finish(&mut self) -> Vec<Piece> {
        self.syntax.finish(&mut self.sink);
        self.sink.end();
        self.sink.take()
    }
}

/// Where a syntax reports what it read: content (whitespace between calls is dropped),
/// call starts (numbered, with ids) and argument text.
#[derive(Default)]
pub struct CallSink {
    pieces: Vec<Piece>,
    /// Whitespace not yet known to be content rather than a separator around calls.
    held_ws: String,
    calls: u32,
    /// The current call is beyond the one allowed and is left out.
    dropping: bool,
    single_call: bool,
    seed: u128,
    choice: u32,
}

impl CallSink {
    /// `seed` and `choice` make the call ids; `single_call` leaves out calls after the first.
    pub fn new(single_call: bool, seed: u128, choice: u32) -> Self {
        CallSink {
            single_call,
            seed,
            choice,
            ..CallSink::default()
        }
    }

    /// The pieces reported since the last take.
    pub fn take(&mut self) -> Vec<Piece> {
        std::mem::take(&mut self.pieces)
    }

    /// The output ended: whitespace held after content is content after all, unless calls
    /// followed it (then it only separated them).
    pub fn end(&mut self) {
        if self.calls == 0 {
            let held = std::mem::take(&mut self.held_ws);
            push_piece(&mut self.pieces, Piece::Content(held));
        }
    }

    /// Reasoning text, passed through as it is (a syntax that has a reasoning channel).
    pub fn reasoning(&mut self, text: &str) {
        push_piece(&mut self.pieces, Piece::Reasoning(text.to_owned()));
    }

    /// Passes `c` through as content unless it completes `marker` (held back while it might);
    /// true when the marker was just read.
    pub fn content_until(&mut self, watch: &mut MarkerWatch, c: char, marker: &str) -> bool {
        let mut released = String::new();
        let seen = watch.push(c, &[marker], &mut released);
        self.content(&released);
        seen == Watch::Matched(0)
    }

    pub fn content(&mut self, text: &str) {
        for c in text.chars() {
            self.content_char(c);
        }
    }

    pub fn content_char(&mut self, c: char) {
        if c.is_whitespace() {
            self.held_ws.push(c);
            return;
        }
        let mut text = std::mem::take(&mut self.held_ws);
        text.push(c);
        push_piece(&mut self.pieces, Piece::Content(text));
    }

    pub fn start(&mut self, name: &str) {
        self.held_ws.clear();
        if self.single_call && self.calls >= 1 {
            self.dropping = true;
            return;
        }
        self.dropping = false;
        let index = self.calls;
        self.calls += 1;
        push_piece(
            &mut self.pieces,
            Piece::CallStart {
                index,
                id: call_id(self.seed, self.choice, index),
                name: name.to_owned(),
            },
        );
    }

    pub fn args(&mut self, text: &str) {
        if self.dropping || self.calls == 0 || text.is_empty() {
            return;
        }
        push_piece(
            &mut self.pieces,
            Piece::CallArgs {
                index: self.calls - 1,
                text: text.to_owned(),
            },
        );
    }

    pub fn args_char(&mut self, c: char) {
        let mut buf = [0u8; 4];
        self.args(c.encode_utf8(&mut buf));
    }

    /// Whether any call has been reported.
    pub fn has_calls(&self) -> bool {
        self.calls > 0
    }
}

/// `call_` and 24 hex digits, a stable function of the job, the choice and the call's
/// index, so a stored result rebuilt later (batch output, `GET …/{id}`) shows the ids the
/// stream showed.
pub fn call_id(seed: u128, choice: u32, index: u32) -> String {
    let fnv = |salt: u64| {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325 ^ salt;
        let bytes = seed
            .to_le_bytes()
            .into_iter()
            .chain(choice.to_le_bytes())
            .chain(index.to_le_bytes());
        for byte in bytes {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
        hash
    };
    let (a, b) = (fnv(0x9e37_79b9), fnv(0x7f4a_7c15));
    format!("call_{:016x}{:08x}", a, b >> 32)
}

#[cfg(test)]
mod tests;
