//! `docs/api.md` lists every request field of the seed documents with its status: served,
//! ignored, or a 400. These tests read that list and hold the validation to it, so the page
//! and the code cannot drift apart: a documented 400 must be refused naming its field, and
//! a served or ignored field must pass.

use super::*;
use crate::extract::parse_json_body;
use serde_json::json;

const API_PAGE: &str = include_str!("../../../docs/api.md");

const LIMITS: Limits = Limits {
    max_messages: 8,
    max_n: 4,
    context_length: 2048,
    parsers: ModelParsers {
        tool: None,
        reasoning: None,
    },
};

/// A documented row: the field as the first cell reads, and its status.
#[derive(Debug)]
struct Row {
    field: String,
    status: String,
}

/// The rows of the tables in the section "Request fields of `POST /v1/chat/completions`",
/// up to the next section. A row's status is its first cell after the field that is a
/// status.
fn documented_rows() -> Vec<Row> {
    let heading = "## Request fields of `POST /v1/chat/completions`";
    let start = API_PAGE
        .find(heading)
        .expect("docs/api.md has the request fields section");
    let end = API_PAGE[start + heading.len()..]
        .find("\n## ")
        .map_or(API_PAGE.len(), |i| start + heading.len() + i);
    API_PAGE[start..end]
        .lines()
        .filter(|line| line.starts_with("| `"))
        .map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let status = cells[2..]
                .iter()
                .find(|c| ["served", "ignored", "400", "404"].contains(c))
                .unwrap_or_else(|| panic!("no status in the row {line}"));
            Row {
                field: cells[1].to_owned(),
                status: (*status).to_owned(),
            }
        })
        .collect()
}

fn tool() -> Value {
    json!({"type": "function", "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}
    }})
}

fn user_parts(part: Value) -> Value {
    json!({"messages": [{"role": "user", "content": [part]}]})
}

/// Request bodies (merged into a minimal chat request) that exercise each documented row,
/// with the `param` a 400 must name. Keyed by the row's first cell, exactly.
fn samples(field: &str) -> Option<Vec<(Value, &'static str)>> {
    let image = json!({"type": "image_url", "image_url": {"url": "http://x/y.png"}});
    let one = |body: Value| Some(vec![(body, "")]);
    let refused = |body: Value, param: &'static str| Some(vec![(body, param)]);
    let history = json!({"messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}
    ]});
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
    match field {
        "`model`" | "`messages`" | "`messages[].content` as a string" => one(json!({})),
        // Resolved against the runners' adapters by the route (see `adapter_tests.rs`).
        "`model` as `base-model:adapter-name`" => one(json!({"model": "m:adapter"})),
        "`messages[].role`" => one(json!({"messages": [
            {"role": "developer", "content": "be brief"}, {"role": "user", "content": "hi"}]})),
        "`messages[].content` `text` parts" => {
            one(user_parts(json!({"type": "text", "text": "hi"})))
        }
        "`messages[].content` `image_url` parts"
        | "`image_url`, `video_url`, `audio_url` content parts" => {
            refused(user_parts(image), "messages[0].content[0]")
        }
        "`messages[].content` `video_url` parts" => refused(
            user_parts(json!({"type": "video_url", "video_url": {"url": "http://x/y.mp4"}})),
            "messages[0].content[0]",
        ),
        "`messages[].content` `audio_url` parts" => refused(
            user_parts(json!({"type": "audio_url", "audio_url": {"url": "http://x/y.wav"}})),
            "messages[0].content[0]",
        ),
        "`image_url.detail`" => refused(
            user_parts(
                json!({"type": "image_url", "image_url": {"url": "http://x", "detail": "low"}}),
            ),
            "messages[0].content[0]",
        ),
        "`messages[].name`" => {
            one(json!({"messages": [{"role": "user", "content": "hi", "name": "ann"}]}))
        }
        "`messages[].tool_calls`" | "`messages[].tool_call_id`" => one(history),
        "`messages[].function_call`" => one(json!({"messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "function_call": {"name": "get_weather", "arguments": "{}"}}]})),
        "`max_completion_tokens`" => one(json!({"max_completion_tokens": 16})),
        "`max_tokens`" => one(json!({"max_tokens": 16})),
        "`temperature`" => one(json!({"temperature": 0.5})),
        "`top_p`" => one(json!({"top_p": 0.9})),
        "`top_k`" => one(json!({"top_k": 40})),
        "`min_p`" => one(json!({"min_p": 0.1})),
        "`n`" => one(json!({"n": 2})),
        "`seed`" => one(json!({"seed": 7})),
        "`frequency_penalty`" => one(json!({"frequency_penalty": 0.5})),
        "`presence_penalty`" => one(json!({"presence_penalty": 0.5})),
        "`repetition_penalty`" => one(json!({"repetition_penalty": 1.1})),
        "`logit_bias`" => one(json!({"logit_bias": {"1": 5}})),
        "`stop`" => one(json!({"stop": ["\n\n"]})),
        "`stop_token_ids`" => one(json!({"stop_token_ids": [1]})),
        "`stop_regex`" => one(json!({"stop_regex": "a+b"})),
        "`no_stop_trim`" => one(json!({"stop": ["x"], "no_stop_trim": true})),
        "`min_tokens`" => one(json!({"max_tokens": 8, "min_tokens": 2})),
        "`ignore_eos`" => one(json!({"ignore_eos": true})),
        "`response_format: {\"type\": \"text\"}`" => {
            one(json!({"response_format": {"type": "text"}}))
        }
        "`response_format: {\"type\": \"json_object\"}`" => {
            one(json!({"response_format": {"type": "json_object"}}))
        }
        "`response_format: {\"type\": \"json_schema\", \"json_schema\": {...}}`"
        | "`response_format.json_schema.name`"
        | "`response_format.json_schema.strict`" => one(json!({"response_format": {
            "type": "json_schema", "json_schema": {"name": "a", "strict": true, "schema": schema}}})),
        "`regex`" => one(json!({"regex": "[a-z]+"})),
        "`ebnf`" => one(json!({"ebnf": "root ::= \"yes\" | \"no\""})),
        "`tools`"
        | "`tools[].type`"
        | "`tools[].function.name`"
        | "`tools[].function.description`"
        | "`tools[].function.parameters`" => one(json!({"tools": [tool()]})),
        "`tools[].function.strict`" => {
            let mut strict = tool();
            strict["function"]["strict"] = json!(true);
            one(json!({"tools": [strict]}))
        }
        "`tool_choice`" => one(json!({"tools": [tool()], "tool_choice": "required"})),
        "`parallel_tool_calls`" => one(json!({"tools": [tool()], "parallel_tool_calls": false})),
        "`functions`" | "`function_call`" => one(json!({
            "functions": [{"name": "get_weather", "parameters": {"type": "object"}}],
            "function_call": {"name": "get_weather"}})),
        "`logprobs`" => one(json!({"logprobs": true})),
        "`top_logprobs`" => one(json!({"logprobs": true, "top_logprobs": 3})),
        "`stream`" => one(json!({"stream": true})),
        "`stream_options.include_usage`" => {
            one(json!({"stream": true, "stream_options": {"include_usage": true}}))
        }
        "`stream_options.continuous_usage_stats`" => {
            one(json!({"stream": true, "stream_options": {"continuous_usage_stats": true}}))
        }
        "`reasoning_effort`" => one(json!({"reasoning_effort": "low"})),
        "`separate_reasoning`" => one(json!({"separate_reasoning": false})),
        "`stream_reasoning`" => one(json!({"stream": true, "stream_reasoning": false})),
        "`chat_template_kwargs`" => one(json!({"chat_template_kwargs": {"custom": 1}})),
        "`chat_template_kwargs.thinking`" => {
            one(json!({"chat_template_kwargs": {"thinking": false}}))
        }
        "`chat_template_kwargs.enable_thinking`" => {
            one(json!({"chat_template_kwargs": {"enable_thinking": false}}))
        }
        "`chat_template_kwargs.reasoning_effort`" => {
            one(json!({"chat_template_kwargs": {"reasoning_effort": "high"}}))
        }
        "`chat_template_kwargs.thinking_mode`" => {
            one(json!({"chat_template_kwargs": {"thinking_mode": "chat"}}))
        }
        "`skip_special_tokens`" => one(json!({"skip_special_tokens": false})),
        "`continue_final_message`" => one(json!({"continue_final_message": true, "messages": [
            {"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hel"}]})),
        "`add_generation_prompt`" => one(json!({"add_generation_prompt": false})),
        "`return_cached_tokens_details`" => one(json!({"return_cached_tokens_details": true})),
        // Resolved against the runners' adapters by the route (see `adapter_tests.rs`).
        "`lora_path`" => one(json!({"lora_path": "adapters/a"})),
        "`custom_logit_processor`" => refused(
            json!({"custom_logit_processor": "{\"callable\": \"gASV\"}"}),
            "custom_logit_processor",
        ),
        "`return_hidden_states`" => one(json!({"return_hidden_states": true})),
        "`return_routed_experts`" => one(json!({"return_routed_experts": true})),
        "`max_dynamic_patch`" => one(json!({"max_dynamic_patch": 12})),
        "`min_dynamic_patch`" => one(json!({"min_dynamic_patch": 1})),
        "`max_length`" => one(json!({"max_length": 30})),
        "`priority`" => one(json!({"priority": -5})),
        "`user`" => one(json!({"user": "u-1"})),
        "`guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`, `structural_tag`" => {
            Some(vec![
                (json!({"guided_json": {"type": "object"}}), "guided_json"),
                (json!({"guided_regex": "a+"}), "guided_regex"),
                (json!({"guided_choice": ["a", "b"]}), "guided_choice"),
                (
                    json!({"guided_grammar": "root ::= \"a\""}),
                    "guided_grammar",
                ),
                (
                    json!({"structural_tag": {"structures": []}}),
                    "structural_tag",
                ),
            ])
        }
        _ => None,
    }
}

fn validate(body: &Value) -> Result<ValidChat, ApiError> {
    let mut full = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    if let (Some(obj), Some(extra)) = (full.as_object_mut(), body.as_object()) {
        obj.extend(extra.clone());
    }
    let wire = parse_json_body(full.to_string().as_bytes())
        .unwrap_or_else(|err| panic!("the sample {body} did not parse: {err}"));
    validate_chat(wire, &LIMITS)
}

#[test]
fn every_documented_request_field_has_a_sample_here() {
    let missing: Vec<String> = documented_rows()
        .into_iter()
        .filter(|row| row.status != "404" && samples(&row.field).is_none())
        .map(|row| row.field)
        .collect();
    assert!(
        missing.is_empty(),
        "rows of docs/api.md without a sample: {missing:?}"
    );
}

#[test]
fn a_field_documented_as_a_400_is_refused_naming_it() {
    for row in documented_rows().iter().filter(|row| row.status == "400") {
        for (body, param) in samples(&row.field).unwrap_or_default() {
            match validate(&body) {
                Err(ApiError::InvalidRequest { param: Some(p), .. }) => {
                    assert_eq!(p, param, "{}: {body}", row.field)
                }
                other => panic!(
                    "{} is documented as a 400, got {other:?} for {body}",
                    row.field
                ),
            }
        }
    }
}

#[test]
fn a_field_documented_as_served_or_ignored_is_accepted() {
    for row in documented_rows()
        .iter()
        .filter(|row| row.status == "served" || row.status == "ignored")
    {
        for (body, _) in samples(&row.field).unwrap_or_default() {
            if let Err(err) = validate(&body) {
                panic!(
                    "{} is documented as {}, but {body} got {err:?}",
                    row.field, row.status
                );
            }
        }
    }
}

#[test]
fn max_length_reaches_the_engine_and_a_bad_one_is_refused() {
    let valid = validate(&json!({"max_length": 30})).map(|v| v.request.sampling.max_length);
    assert_eq!(valid.ok(), Some(Some(30)));
    match validate(&json!({"max_length": 0})) {
        Err(ApiError::InvalidRequest { param, .. }) => {
            assert_eq!(param.as_deref(), Some("max_length"))
        }
        other => panic!("expected a 400 naming max_length, got {other:?}"),
    }
}

#[test]
fn an_unsupported_field_sent_as_null_or_false_asks_for_nothing() {
    for (field, _) in UNSUPPORTED_FIELDS {
        for value in [Value::Null, Value::Bool(false)] {
            assert!(
                validate(&json!({ field: value })).is_ok(),
                "{field}: {value}"
            );
        }
        match validate(&json!({ field: true })) {
            Err(ApiError::InvalidRequest { code, .. }) => {
                assert_eq!(code, Some("unsupported_parameter"), "{field}")
            }
            other => panic!("{field}: true should be refused, got {other:?}"),
        }
    }
}

#[test]
fn a_named_tool_choice_allows_one_call_and_required_follows_parallel_tool_calls() {
    let named = json!({"tools": [tool()],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}}});
    let single = |body: &Value| {
        validate(body)
            .map(|v| v.request.output.single_tool_call)
            .unwrap_or_else(|err| panic!("{body}: {err:?}"))
    };
    assert!(single(&named));
    assert!(!single(
        &json!({"tools": [tool()], "tool_choice": "required"})
    ));
    assert!(single(
        &json!({"tools": [tool()], "tool_choice": "required",
        "parallel_tool_calls": false})
    ));
}

#[test]
fn return_routed_experts_reaches_the_engine_for_one_choice_only() {
    let asked = validate(&json!({"return_routed_experts": true}))
        .map(|v| v.request.sampling.return_routed_experts);
    assert_eq!(asked.ok(), Some(true));
    let err = validate(&json!({"return_routed_experts": true, "n": 2}))
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("n = 1"), "{err}");
}

#[test]
fn return_hidden_states_reaches_the_engine() {
    let asked = validate(&json!({"return_hidden_states": true}))
        .map(|v| v.request.sampling.return_hidden_states);
    assert_eq!(asked.ok(), Some(true));
    let default = validate(&json!({})).map(|v| v.request.sampling.return_hidden_states);
    assert_eq!(default.ok(), Some(false));
}
