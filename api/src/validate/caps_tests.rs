//! One test per cap of [`crate::validate::caps`]: at the limit a request is accepted, one
//! past it is a 400 naming the field and the limit.

use super::*;
use crate::openai::completions::CompletionRequest;
use crate::openai::tokenize::{DetokenizeRequest, TokenizeRequest};
use crate::validate::caps::*;

fn refused(result: Result<impl std::fmt::Debug, ApiError>, param: &str, limit: usize) {
    match result {
        Err(ApiError::InvalidRequest {
            message,
            param: Some(p),
            ..
        }) => {
            assert_eq!(p, param, "wrong param: {message}");
            assert!(
                message.contains(&format!("at most {limit}")),
                "`{message}` does not name the limit {limit}"
            );
        }
        other => panic!("expected a 400 naming `{param}`, got {other:?}"),
    }
}

fn chat(extra: serde_json::Value) -> Result<ValidChat, ApiError> {
    validate(extra)
}

fn completion(body: serde_json::Value) -> Result<ValidCompletion, ApiError> {
    let mut full = json!({"model": "m"});
    if let (Some(obj), Some(extra)) = (full.as_object_mut(), body.as_object()) {
        obj.extend(extra.clone());
    }
    let wire: CompletionRequest = parse_json_body(full.to_string().as_bytes())?;
    validate_completion(wire, &LIMITS)
}

fn text(bytes: usize) -> String {
    "x".repeat(bytes)
}

#[test]
fn stop_strings_are_capped_in_number() {
    let at: Vec<String> = (0..MAX_STOP_SEQUENCES).map(|i| format!("s{i}")).collect();
    assert!(chat(json!({ "stop": at })).is_ok());
    let over: Vec<String> = (0..=MAX_STOP_SEQUENCES).map(|i| format!("s{i}")).collect();
    refused(chat(json!({ "stop": over })), "stop", MAX_STOP_SEQUENCES);
}

#[test]
fn a_stop_string_is_capped_in_bytes() {
    assert!(chat(json!({ "stop": text(MAX_STOP_BYTES) })).is_ok());
    refused(
        chat(json!({ "stop": ["end", text(MAX_STOP_BYTES + 1)] })),
        "stop",
        MAX_STOP_BYTES,
    );
}

#[test]
fn stop_strings_are_capped_in_bytes_together() {
    let each = MAX_STOP_TOTAL_BYTES / 8;
    let at: Vec<String> = (0..8).map(|_| text(each)).collect();
    assert!(chat(json!({ "stop": at })).is_ok());
    let mut over = at.clone();
    over.push("!".into());
    refused(chat(json!({ "stop": over })), "stop", MAX_STOP_TOTAL_BYTES);
}

#[test]
fn logit_bias_is_capped_at_300_entries() {
    let bias = |n: usize| -> serde_json::Map<String, serde_json::Value> {
        (0..n).map(|t| (t.to_string(), json!(1))).collect()
    };
    assert_eq!(MAX_LOGIT_BIAS, 300);
    assert!(chat(json!({ "logit_bias": bias(MAX_LOGIT_BIAS) })).is_ok());
    refused(
        chat(json!({ "logit_bias": bias(MAX_LOGIT_BIAS + 1) })),
        "logit_bias",
        MAX_LOGIT_BIAS,
    );
}

#[test]
fn stop_token_ids_are_capped_in_number() {
    let ids = |n: usize| (0..n as u32).collect::<Vec<_>>();
    assert!(chat(json!({ "stop_token_ids": ids(MAX_STOP_TOKEN_IDS) })).is_ok());
    refused(
        chat(json!({ "stop_token_ids": ids(MAX_STOP_TOKEN_IDS + 1) })),
        "stop_token_ids",
        MAX_STOP_TOKEN_IDS,
    );
}

#[test]
fn a_stop_regex_is_capped_in_bytes() {
    assert!(chat(json!({ "stop_regex": text(MAX_STOP_REGEX_BYTES) })).is_ok());
    refused(
        chat(json!({ "stop_regex": text(MAX_STOP_REGEX_BYTES + 1) })),
        "stop_regex",
        MAX_STOP_REGEX_BYTES,
    );
}

#[test]
fn chat_messages_are_capped_in_bytes_together() {
    let messages = |last: usize| {
        json!({"messages": [
            {"role": "system", "content": text(1000)},
            {"role": "user", "content": text(last)},
        ]})
    };
    assert!(chat(messages(MAX_PROMPT_BYTES - 1000)).is_ok());
    refused(
        chat(messages(MAX_PROMPT_BYTES - 999)),
        "messages",
        MAX_PROMPT_BYTES,
    );
}

/// A function tool whose compact JSON is exactly `bytes` long.
fn tool_of(name: &str, bytes: usize) -> serde_json::Value {
    let tool = |description: String| json!({"type": "function", "function": {"name": name, "description": description}});
    let bare = caps::json_len(&tool(String::new()));
    let sized = tool(text(bytes - bare));
    assert_eq!(caps::json_len(&sized), bytes);
    sized
}

#[test]
fn tools_are_capped_in_number() {
    let tools = |n: usize| -> Vec<serde_json::Value> {
        (0..n).map(|i| tool_of(&format!("f{i}"), 100)).collect()
    };
    assert!(chat(json!({ "tools": tools(MAX_TOOLS) })).is_ok());
    refused(
        chat(json!({ "tools": tools(MAX_TOOLS + 1) })),
        "tools",
        MAX_TOOLS,
    );
    refused(
        chat(json!({ "functions": tools(MAX_TOOLS + 1)
            .into_iter()
            .map(|t| t["function"].clone())
            .collect::<Vec<_>>() })),
        "functions",
        MAX_TOOLS,
    );
}

#[test]
fn a_tool_definition_is_capped_in_bytes() {
    assert!(chat(json!({ "tools": [tool_of("f", MAX_TOOL_BYTES)] })).is_ok());
    refused(
        chat(json!({ "tools": [weather_tool(), tool_of("f", MAX_TOOL_BYTES + 1)] })),
        "tools[1]",
        MAX_TOOL_BYTES,
    );
}

#[test]
fn tool_definitions_are_capped_in_bytes_together() {
    let count = MAX_TOOLS_TOTAL_BYTES / MAX_TOOL_BYTES;
    let tools = |n: usize| -> Vec<serde_json::Value> {
        (0..n)
            .map(|i| tool_of(&format!("f{i}"), MAX_TOOL_BYTES))
            .collect()
    };
    assert!(chat(json!({ "tools": tools(count) })).is_ok());
    refused(
        chat(json!({ "tools": tools(count + 1) })),
        "tools",
        MAX_TOOLS_TOTAL_BYTES,
    );
}

#[test]
fn completion_prompts_are_capped_in_bytes_together() {
    let half = MAX_PROMPT_BYTES / 2;
    assert!(completion(json!({"prompt": [text(half), text(half)]})).is_ok());
    refused(
        completion(json!({"prompt": [text(half), text(half + 1)]})),
        "prompt",
        MAX_PROMPT_BYTES,
    );
}

#[test]
fn token_id_prompts_are_capped_in_length() {
    let ids = |n: usize| vec![7u32; n];
    assert!(completion(json!({ "prompt": ids(MAX_PROMPT_TOKEN_IDS) })).is_ok());
    refused(
        completion(json!({ "prompt": ids(MAX_PROMPT_TOKEN_IDS + 1) })),
        "prompt",
        MAX_PROMPT_TOKEN_IDS,
    );
}

#[test]
fn tokenize_input_is_capped_like_a_prompt() {
    let tokenize = |body: serde_json::Value| {
        let wire: TokenizeRequest = parse_json_body(body.to_string().as_bytes())?;
        validate_tokenize(wire, &LIMITS)
    };
    assert!(tokenize(json!({"model": "m", "prompt": text(MAX_PROMPT_BYTES)})).is_ok());
    refused(
        tokenize(json!({"model": "m", "prompt": text(MAX_PROMPT_BYTES + 1)})),
        "prompt",
        MAX_PROMPT_BYTES,
    );
    refused(
        tokenize(json!({"model": "m", "messages": [
            {"role": "user", "content": text(MAX_PROMPT_BYTES + 1)}
        ]})),
        "messages",
        MAX_PROMPT_BYTES,
    );
}

#[test]
fn detokenize_input_is_capped_in_token_ids() {
    let detokenize = |n: usize| {
        let body = json!({"model": "m", "tokens": vec![7u32; n]});
        let wire: DetokenizeRequest = parse_json_body(body.to_string().as_bytes())?;
        validate_detokenize(wire)
    };
    assert!(detokenize(MAX_PROMPT_TOKEN_IDS).is_ok());
    refused(
        detokenize(MAX_PROMPT_TOKEN_IDS + 1),
        "tokens",
        MAX_PROMPT_TOKEN_IDS,
    );
}

/// A `response_format` whose compact JSON is exactly `bytes` long.
fn response_format_of(bytes: usize) -> serde_json::Value {
    let format = |description: String| {
        json!({"type": "json_schema", "json_schema": {"name": "big",
            "schema": {"type": "object", "description": description}}})
    };
    let bare = caps::json_len(&format(String::new()));
    format(text(bytes - bare))
}

#[test]
fn a_constraint_is_capped_in_bytes() {
    let at = response_format_of(MAX_CONSTRAINT_BYTES);
    assert_eq!(caps::json_len(&at), MAX_CONSTRAINT_BYTES);
    assert!(chat(json!({ "response_format": at })).is_ok());
    refused(
        chat(json!({ "response_format": response_format_of(MAX_CONSTRAINT_BYTES + 1) })),
        "response_format",
        MAX_CONSTRAINT_BYTES,
    );
    refused(
        chat(json!({ "regex": text(MAX_CONSTRAINT_BYTES + 1) })),
        "regex",
        MAX_CONSTRAINT_BYTES,
    );
    refused(
        chat(json!({ "ebnf": text(MAX_CONSTRAINT_BYTES + 1) })),
        "ebnf",
        MAX_CONSTRAINT_BYTES,
    );
}
