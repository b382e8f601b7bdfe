//! The grammar of a forced call in harmony: the model may first reason on the `analysis`
//! channel, then it writes one call message, spelled as gpt-oss writes them:
//!
//! ```text
//! <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{…arguments…}
//! ```
//!
//! Harmony's markers are special tokens of the model's vocabulary, so the grammar names them
//! as tokens (`<|channel|>`), never as text. The call ends where the arguments do: `<|call|>`
//! ends generation, and the engine allows its end-of-generation tokens exactly when the
//! grammar accepts. One call per grammar, whatever `parallel_tool_calls` says: `<|call|>`
//! ends the turn, so harmony has one call per turn.

use super::super::grammar::FunctionSpec;
use fallow_protocol::grammar::strict_compact;
use serde_json::json;

/// The Lark grammar that makes a harmony model call one of `functions` (not empty).
pub fn forced_call(functions: &[FunctionSpec<'_>]) -> String {
    let names: Vec<String> = (0..functions.len()).map(|i| format!("call_{i}")).collect();
    let mut grammar = format!(
        "start: analysis? call\n\
         analysis: <|channel|> \"analysis\" <|message|> REASONING <|end|> <|start|> \"assistant\"\n\
         REASONING: /(?s:.*)/\n\
         call: {}\n",
        names.join(" | ")
    );
    for (i, function) in functions.iter().enumerate() {
        let header = format!("commentary to=functions.{} ", function.name);
        // A JSON string is a Lark string literal, escapes included.
        let header = serde_json::Value::String(header).to_string();
        let parameters = function
            .parameters
            .cloned()
            .unwrap_or_else(|| json!({"type": "object"}));
        grammar.push_str(&format!(
            "call_{i}: <|channel|> {header} <|constrain|> \"json\" <|message|> args_{i}\n\
             args_{i}: %json {}\n",
            strict_compact(parameters)
        ));
    }
    grammar
}

#[cfg(test)]
mod tests {
    use super::*;
    use fallow_protocol::grammar::admits;
    use fallow_protocol::job::Constraint;
    use serde_json::Value;

    fn weather() -> Value {
        json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
    }

    fn constraint(functions: &[FunctionSpec<'_>]) -> Constraint {
        Constraint::Lark {
            grammar: forced_call(functions),
        }
    }

    const CALL: &str =
        "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}";

    #[test]
    fn a_forced_call_is_one_call_message_with_the_functions_schema() {
        let params = weather();
        let named = constraint(&[FunctionSpec {
            name: "get_weather",
            parameters: Some(&params),
        }]);
        assert_eq!(admits(&named, CALL), Ok(true));
        // Arguments outside the schema, another function, or text instead of a call.
        let extra = CALL.replace("}", ", \"unit\": \"C\"}");
        assert_eq!(admits(&named, &extra), Ok(false));
        let other = CALL.replace("get_weather", "get_time");
        assert_eq!(admits(&named, &other), Ok(false));
        assert_eq!(
            admits(&named, "<|channel|>final<|message|>Sunny."),
            Ok(false)
        );
    }

    #[test]
    fn the_model_may_reason_on_the_analysis_channel_before_its_call() {
        let params = weather();
        let named = constraint(&[FunctionSpec {
            name: "get_weather",
            parameters: Some(&params),
        }]);
        let reasoned = format!(
            "<|channel|>analysis<|message|>Need the weather; <|call it.\n<|end|><|start|>assistant{CALL}"
        );
        assert_eq!(admits(&named, &reasoned), Ok(true));
    }

    #[test]
    fn required_offers_every_function_and_a_second_call_is_refused() {
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
        let required = constraint(&functions);
        assert_eq!(admits(&required, CALL), Ok(true));
        let time = "<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{}";
        assert_eq!(admits(&required, time), Ok(true));
        let twice = format!("{CALL}<|call|><|start|>assistant{time}");
        assert_eq!(admits(&required, &twice), Ok(false));
    }
}
