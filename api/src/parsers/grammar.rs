//! The Lark grammar (llguidance syntax) that makes a model call a function: for
//! `tool_choice: "required"` (any offered function) and for a named choice (that one). It
//! spells calls exactly as the model family writes them, so the same tool-call parser reads
//! the constrained output; each call's JSON is held to the function's `parameters` schema
//! with llguidance's `%json { … }`.

use fallow_protocol::grammar::strict_compact;
use serde_json::{json, Value};

/// A function the grammar may call.
#[derive(Debug, Clone, Copy)]
pub struct FunctionSpec<'a> {
    pub name: &'a str,
    /// The JSON schema of the arguments; `None` = any object.
    pub parameters: Option<&'a Value>,
}

/// The grammar for `functions` in the syntax of `tool_parser` (as in
/// [`super::tool_calls::TOOL_PARSERS`]; unknown names get Hermes). `parallel` allows more
/// than one call (harmony has one per turn, and its grammar lets the model reason first).
/// `None` when there is nothing to call.
pub fn forced_call_grammar(
    tool_parser: &str,
    functions: &[FunctionSpec<'_>],
    parallel: bool,
) -> Option<String> {
    if functions.is_empty() {
        return None;
    }
    Some(match tool_parser {
        super::harmony::HARMONY => super::harmony::grammar::forced_call(functions),
        "llama3_json" | "llama3" | "llama" => {
            let call = call_schema(functions, "parameters");
            let repeat = if parallel { " (\"; \" call)*" } else { "" };
            format!("start: call{repeat}\ncall: %json {call}\n")
        }
        "mistral" => {
            let mut array = json!({
                "type": "array",
                "items": call_schema_value(functions, "arguments"),
                "minItems": 1,
            });
            if !parallel {
                array["maxItems"] = json!(1);
            }
            // `[TOOL_CALLS]` is a special token of Mistral's vocabulary; the constraint
            // matches it by its text.
            let array = strict_compact(array);
            format!("start: \"[TOOL_CALLS]\" calls\ncalls: %json {array}\n")
        }
        _ => {
            let call = call_schema(functions, "arguments");
            let repeat = if parallel {
                " (\"\\n\" tool_call)*"
            } else {
                ""
            };
            format!(
                "start: tool_call{repeat}\n\
                 tool_call: \"<tool_call>\\n\" call \"\\n</tool_call>\"\n\
                 call: %json {call}\n"
            )
        }
    })
}

/// Lets the model reason before its forced call, in its reasoning syntax: `deepseek_r1`
/// (the template opened `<think>`: the output starts inside the block) or `qwen3` (the model
/// may open a block itself). The reasoning is free text up to `</think>` (a lazy rule, so
/// the grammar takes over right after it); `None` or an unknown syntax leaves the grammar as
/// it is (harmony's grammar has its reasoning in it already).
pub fn after_reasoning(grammar: String, reasoning_parser: Option<&str>) -> String {
    let prefix = match reasoning_parser {
        Some("deepseek_r1") => {
            "start: think WS calls
"
        }
        Some("qwen3") => {
            "start: (\"<think>\" think WS)? calls
"
        }
        _ => return grammar,
    };
    let calls = grammar.replacen("start:", "calls:", 1);
    format!("{prefix}think[suffix=\"</think>\"]: /(?s:.*)/\nWS: /[ \\t\\r\\n]*/\n{calls}")
}

/// One call object's schema as JSON text, enforced as Fallow enforces every schema: objects
/// closed to the keys they name, compact separators.
fn call_schema(functions: &[FunctionSpec<'_>], arguments_key: &str) -> String {
    strict_compact(call_schema_value(functions, arguments_key)).to_string()
}

/// `{"name": <const>, "<arguments_key>": <parameters>}` per function; `anyOf` for several.
fn call_schema_value(functions: &[FunctionSpec<'_>], arguments_key: &str) -> Value {
    let mut variants: Vec<Value> = functions
        .iter()
        .map(|f| {
            let parameters = f
                .parameters
                .cloned()
                .unwrap_or_else(|| json!({"type": "object"}));
            json!({
                "type": "object",
                "properties": {
                    "name": {"const": f.name},
                    arguments_key: parameters,
                },
                "required": ["name", arguments_key],
                "additionalProperties": false,
            })
        })
        .collect();
    if variants.len() == 1 {
        variants.remove(0)
    } else {
        json!({ "anyOf": variants })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forced_call_may_follow_the_models_reasoning() {
        let plain = "start: tool_call\ntool_call: \"<tool_call>\"\n".to_string();
        assert_eq!(after_reasoning(plain.clone(), None), plain);
        let r1 = after_reasoning(plain.clone(), Some("deepseek_r1"));
        assert!(r1.starts_with("start: think WS calls\n"), "{r1}");
        assert!(r1.contains("think[suffix=\"</think>\"]"), "{r1}");
        assert!(r1.contains("calls: tool_call\n"), "{r1}");
        let qwen = after_reasoning(plain, Some("qwen3"));
        assert!(
            qwen.starts_with("start: (\"<think>\" think WS)? calls\n"),
            "{qwen}"
        );
    }

    fn weather() -> Value {
        json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
    }

    #[test]
    fn a_named_hermes_call_is_one_tool_call_block_holding_the_functions_schema() {
        let params = weather();
        let grammar = forced_call_grammar(
            "hermes",
            &[FunctionSpec {
                name: "get_weather",
                parameters: Some(&params),
            }],
            false,
        )
        .unwrap();
        assert_eq!(
            grammar,
            "start: tool_call\n\
             tool_call: \"<tool_call>\\n\" call \"\\n</tool_call>\"\n\
             call: %json {\"type\":\"object\",\"properties\":{\"name\":{\"const\":\"get_weather\"},\"arguments\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"],\"additionalProperties\":false}},\"required\":[\"name\",\"arguments\"],\"additionalProperties\":false,\"x-guidance\":{\"whitespace_flexible\":false,\"item_separator\":\", \",\"key_separator\":\": \"}}\n"
        );
    }

    #[test]
    fn required_with_parallel_calls_repeats_blocks_and_offers_every_function() {
        let params = weather();
        let functions = [
            FunctionSpec {
                name: "get_weather",
                parameters: Some(&params),
            },
            FunctionSpec {
                name: "get_time",
                parameters: None,
            },
        ];
        let grammar = forced_call_grammar("qwen", &functions, true).unwrap();
        assert!(grammar.starts_with("start: tool_call (\"\\n\" tool_call)*\n"));
        let schema: Value = serde_json::from_str(
            grammar
                .lines()
                .nth(2)
                .unwrap()
                .trim_start_matches("call: %json "),
        )
        .unwrap();
        let names: Vec<&str> = schema["anyOf"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["properties"]["name"]["const"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["get_weather", "get_time"]);
        assert_eq!(
            schema["anyOf"][1]["properties"]["arguments"],
            json!({"type": "object"})
        );
    }

    #[test]
    fn llama3_calls_use_parameters_and_mistral_calls_an_array_after_the_marker() {
        let functions = [FunctionSpec {
            name: "f",
            parameters: None,
        }];
        let llama = forced_call_grammar("llama3_json", &functions, false).unwrap();
        assert!(llama.starts_with("start: call\ncall: %json {"));
        assert!(llama.contains("\"required\":[\"name\",\"parameters\"]"));
        let mistral = forced_call_grammar("mistral", &functions, false).unwrap();
        assert!(mistral.starts_with("start: \"[TOOL_CALLS]\" calls\ncalls: %json {"));
        assert!(mistral.contains("\"maxItems\":1"));
        assert!(mistral.contains("\"minItems\":1"));
    }

    #[test]
    fn nothing_to_call_gives_no_grammar() {
        assert_eq!(forced_call_grammar("hermes", &[], true), None);
    }
}
