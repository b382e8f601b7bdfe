//! One choice of a stream, parsed as it arrives: its text goes through the job's parsers
//! (reasoning, tool calls) and comes out as the deltas OpenAI streams — `content`,
//! `reasoning_content` + `reasoning`, `tool_calls` (the first delta of a call carries its id,
//! type and name, later ones more `arguments`), or `function_call` for legacy functions.

use crate::openai::response::{Delta, FunctionDelta, ToolCallDelta};
use crate::parsers::{ChoiceParser, Piece};
use fallow_protocol::job::OutputFormat;

pub struct StreamChoice {
    parser: ChoiceParser,
    legacy: bool,
    stream_reasoning: bool,
    /// Reasoning not sent yet (`stream_reasoning: false` sends it whole once it ends).
    held_reasoning: String,
    called: bool,
}

impl StreamChoice {
    pub fn new(format: &OutputFormat, seed: u128, choice: u32) -> Self {
        StreamChoice {
            parser: ChoiceParser::new(format, seed, choice),
            legacy: format.legacy_functions,
            stream_reasoning: format.stream_reasoning,
            held_reasoning: String::new(),
            called: false,
        }
    }

    /// Deltas for new text of `tokens` tokens.
    pub fn feed(&mut self, text: &str, tokens: u32) -> Vec<Delta> {
        let pieces = self.parser.feed(text, Some(tokens));
        self.deltas(pieces)
    }

    /// Deltas for what the parsers held back until the end.
    pub fn finish(&mut self) -> Vec<Delta> {
        let pieces = self.parser.finish();
        let mut deltas = self.deltas(pieces);
        deltas.extend(self.flush_reasoning());
        deltas
    }

    /// Whether the choice called a tool (its finish reason becomes `tool_calls`).
    pub fn called(&self) -> bool {
        self.called
    }

    pub fn legacy(&self) -> bool {
        self.legacy
    }

    /// Reasoning tokens so far, when reasoning is split off.
    pub fn reasoning_tokens(&self) -> Option<u32> {
        self.parser
            .splits_reasoning()
            .then(|| self.parser.reasoning_tokens())
    }

    fn deltas(&mut self, pieces: Vec<Piece>) -> Vec<Delta> {
        let mut out = Vec::new();
        for piece in pieces {
            if !matches!(piece, Piece::Reasoning(_)) {
                out.extend(self.flush_reasoning());
            }
            match piece {
                Piece::Content(text) => out.push(Delta {
                    content: Some(text),
                    ..Delta::default()
                }),
                Piece::Reasoning(text) if self.stream_reasoning => out.push(reasoning(text)),
                Piece::Reasoning(text) => self.held_reasoning.push_str(&text),
                Piece::CallStart { index, id, name } => {
                    self.called = true;
                    let function = FunctionDelta {
                        name: Some(name),
                        arguments: String::new(),
                    };
                    out.push(self.call_delta(index, Some(id), function));
                }
                Piece::CallArgs { index, text } => {
                    let function = FunctionDelta {
                        name: None,
                        arguments: text,
                    };
                    out.push(self.call_delta(index, None, function));
                }
            }
        }
        out
    }

    fn call_delta(&self, index: u32, id: Option<String>, function: FunctionDelta) -> Delta {
        if self.legacy {
            return Delta {
                function_call: Some(function),
                ..Delta::default()
            };
        }
        let kind = id.is_some().then_some("function");
        Delta {
            tool_calls: Some(vec![ToolCallDelta {
                index,
                id,
                kind,
                function,
            }]),
            ..Delta::default()
        }
    }

    fn flush_reasoning(&mut self) -> Option<Delta> {
        (!self.held_reasoning.is_empty())
            .then(|| reasoning(std::mem::take(&mut self.held_reasoning)))
    }
}

fn reasoning(text: String) -> Delta {
    Delta {
        reasoning_content: Some(text.clone()),
        reasoning: Some(text),
        ..Delta::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn format(legacy: bool, stream_reasoning: bool) -> OutputFormat {
        OutputFormat {
            tool_parser: Some("hermes".into()),
            legacy_functions: legacy,
            single_tool_call: legacy,
            reasoning_parser: Some("qwen3".into()),
            stream_reasoning,
            text_completion: None,
            cached_tokens_details: false,
            responses: None,
            embeddings: None,
        }
    }

    fn json_of(deltas: Vec<Delta>) -> Vec<Value> {
        deltas
            .into_iter()
            .map(|d| serde_json::to_value(d).unwrap_or_default())
            .collect()
    }

    const TEXT: &str =
        "<think>hm</think><tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}</tool_call>";

    #[test]
    fn a_call_streams_as_a_start_with_id_and_name_then_arguments() {
        let mut choice = StreamChoice::new(&format(false, true), 1, 0);
        let mut deltas = json_of(choice.feed(TEXT, 9));
        deltas.extend(json_of(choice.finish()));
        let id = crate::parsers::tool_calls::call_id(1, 0, 0);
        assert_eq!(
            deltas,
            [
                json!({"reasoning_content": "hm", "reasoning": "hm"}),
                json!({"tool_calls": [{"index": 0, "id": id, "type": "function",
                                       "function": {"name": "f", "arguments": ""}}]}),
                json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"a\": 1}"}}]}),
            ]
        );
        assert!(choice.called());
        assert_eq!(choice.reasoning_tokens(), Some(9));
    }

    #[test]
    fn legacy_calls_stream_as_function_call_and_held_reasoning_comes_whole() {
        let mut choice = StreamChoice::new(&format(true, false), 1, 0);
        let mut deltas = Vec::new();
        for piece in ["<think>h", "m</thi", "nk>", &TEXT[17..]] {
            deltas.extend(json_of(choice.feed(piece, 1)));
        }
        deltas.extend(json_of(choice.finish()));
        assert_eq!(
            deltas,
            [
                json!({"reasoning_content": "hm", "reasoning": "hm"}),
                json!({"function_call": {"name": "f", "arguments": ""}}),
                json!({"function_call": {"arguments": "{\"a\": 1}"}}),
            ]
        );
    }
}
