//! One function call written as a JSON object (`{"name": "f", "arguments": {...}}`; Llama
//! writes `parameters`), read one character at a time. The name is reported as soon as its
//! string closes and the arguments as their text arrives, so a stream shows a call while the
//! model is still writing it. The arguments are the model's own text, unchanged: streaming
//! and non-streaming report the same string, `{}` included.

use super::CallSink;

/// Where a character left the object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallStep {
    /// Still inside the object.
    More,
    /// The object closed with this character.
    Done,
    /// Not a call object. Nothing was reported unless `name_sent()`.
    Failed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Key {
    Name,
    Arguments,
    Other,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Open,
    KeyOrClose,
    Key,
    Colon,
    ValueStart,
    Value,
    AfterValue,
}

/// The extent of one JSON value, found without parsing it.
#[derive(Debug, Default)]
pub(super) struct ValueScan {
    depth: u32,
    in_string: bool,
    escaped: bool,
    scalar: bool,
    started: bool,
}

#[derive(Debug, PartialEq, Eq)]
pub(super) enum ValueStep {
    /// The character belongs to the value, which goes on.
    Inside,
    /// The character was the value's last.
    Last,
    /// The value ended before this character (a number, `true`, …).
    After,
}

impl ValueScan {
    pub(super) fn push(&mut self, c: char) -> ValueStep {
        if !self.started {
            self.started = true;
            match c {
                '{' | '[' => self.depth = 1,
                '"' => self.in_string = true,
                _ => self.scalar = true,
            }
            return ValueStep::Inside;
        }
        if self.scalar {
            return if matches!(c, ',' | '}' | ']') || c.is_whitespace() {
                ValueStep::After
            } else {
                ValueStep::Inside
            };
        }
        if self.in_string {
            if self.escaped {
                self.escaped = false;
            } else if c == '\\' {
                self.escaped = true;
            } else if c == '"' {
                self.in_string = false;
                if self.depth == 0 {
                    return ValueStep::Last;
                }
            }
            return ValueStep::Inside;
        }
        match c {
            '"' => self.in_string = true,
            '{' | '[' => self.depth += 1,
            '}' | ']' => {
                self.depth = self.depth.saturating_sub(1);
                if self.depth == 0 {
                    return ValueStep::Last;
                }
            }
            _ => {}
        }
        ValueStep::Inside
    }
}

/// One call object being read.
#[derive(Debug)]
pub struct JsonCall {
    state: State,
    key: Key,
    /// The raw JSON text of the key or name string being read, quotes included.
    string: String,
    string_escaped: bool,
    value: ValueScan,
    name_sent: bool,
    /// Arguments text not reported yet (it came before the name, or it is a JSON string
    /// whose decoded text is the arguments).
    args_held: String,
    args_seen: bool,
    args_is_string: bool,
}

impl Default for JsonCall {
    fn default() -> Self {
        JsonCall {
            state: State::Open,
            key: Key::Other,
            string: String::new(),
            string_escaped: false,
            value: ValueScan::default(),
            name_sent: false,
            args_held: String::new(),
            args_seen: false,
            args_is_string: false,
        }
    }
}

impl JsonCall {
    /// Whether the call's name has been reported (a failure after that cannot be undone).
    pub fn name_sent(&self) -> bool {
        self.name_sent
    }

    pub fn push(&mut self, c: char, out: &mut CallSink) -> CallStep {
        match self.state {
            State::Open => match c {
                '{' => self.state = State::KeyOrClose,
                c if c.is_whitespace() => {}
                _ => return CallStep::Failed,
            },
            State::KeyOrClose => match c {
                '"' => {
                    self.string = "\"".into();
                    self.string_escaped = false;
                    self.state = State::Key;
                }
                '}' => return self.close(out),
                c if c.is_whitespace() => {}
                _ => return CallStep::Failed,
            },
            State::Key => {
                if self.push_string_char(c) {
                    self.key = match serde_json::from_str::<String>(&self.string).as_deref() {
                        Ok("name") => Key::Name,
                        Ok("arguments") | Ok("parameters") => Key::Arguments,
                        _ => Key::Other,
                    };
                    self.state = State::Colon;
                }
            }
            State::Colon => match c {
                ':' => self.state = State::ValueStart,
                c if c.is_whitespace() => {}
                _ => return CallStep::Failed,
            },
            State::ValueStart if c.is_whitespace() => {}
            State::ValueStart => {
                self.value = ValueScan::default();
                self.state = State::Value;
                match self.key {
                    Key::Name if c != '"' => return CallStep::Failed,
                    Key::Name => {
                        // The opening quote is the string's first character.
                        self.string = "\"".into();
                        self.string_escaped = false;
                        return CallStep::More;
                    }
                    Key::Arguments => {
                        self.args_seen = true;
                        self.args_is_string = c == '"';
                        self.args_held.clear();
                    }
                    Key::Other => {}
                }
                return self.push_value(c, out);
            }
            State::Value => return self.push_value(c, out),
            State::AfterValue => match c {
                ',' => self.state = State::KeyOrClose,
                '}' => return self.close(out),
                c if c.is_whitespace() => {}
                _ => return CallStep::Failed,
            },
        }
        CallStep::More
    }

    /// The output ended inside the object: a call whose name was reported is closed with
    /// whatever arguments arrived.
    pub fn finish(&mut self, out: &mut CallSink) {
        if self.name_sent {
            self.flush_args(out);
            if !self.args_seen {
                out.args("{}");
            }
        }
    }

    fn push_value(&mut self, c: char, out: &mut CallSink) -> CallStep {
        if self.key == Key::Name {
            if self.push_string_char(c) {
                match serde_json::from_str::<String>(&self.string) {
                    Ok(name) if !self.name_sent => {
                        out.start(&name);
                        self.name_sent = true;
                        self.flush_args(out);
                    }
                    Ok(_) => {}
                    Err(_) => return CallStep::Failed,
                }
                self.state = State::AfterValue;
            }
            return CallStep::More;
        }
        let step = self.value.push(c);
        if step == ValueStep::After {
            self.end_value(out);
            self.state = State::AfterValue;
            return self.push(c, out);
        }
        if self.key == Key::Arguments {
            if self.name_sent && !self.args_is_string {
                out.args_char(c);
            } else {
                self.args_held.push(c);
            }
        }
        if step == ValueStep::Last {
            self.end_value(out);
            self.state = State::AfterValue;
        }
        CallStep::More
    }

    fn end_value(&mut self, out: &mut CallSink) {
        if self.key == Key::Arguments && self.args_is_string {
            // `"arguments": "{\"a\": 1}"`: the string's text is the arguments.
            if let Ok(text) = serde_json::from_str::<String>(&self.args_held) {
                self.args_held = text;
            }
            self.args_is_string = false;
            if self.name_sent {
                self.flush_args(out);
            }
        }
    }

    fn flush_args(&mut self, out: &mut CallSink) {
        if !self.args_is_string && !self.args_held.is_empty() {
            out.args(&std::mem::take(&mut self.args_held));
        }
    }

    fn close(&mut self, out: &mut CallSink) -> CallStep {
        if !self.name_sent {
            return CallStep::Failed;
        }
        self.finish(out);
        CallStep::Done
    }

    /// Adds a character of a JSON string; `true` when it closed the string.
    fn push_string_char(&mut self, c: char) -> bool {
        self.string.push(c);
        if self.string_escaped {
            self.string_escaped = false;
        } else if c == '\\' {
            self.string_escaped = true;
        } else if c == '"' {
            return true;
        }
        false
    }
}
