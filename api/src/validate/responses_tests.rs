use super::*;
use crate::validate::ModelParsers;

fn limits() -> Limits {
    Limits {
        max_messages: 64,
        max_n: 4,
        context_length: 4096,
        parsers: ModelParsers::default(),
    }
}

fn wire(body: Value) -> CreateResponseRequest {
    serde_json::from_value(body).unwrap_or_default()
}

#[test]
fn settings_are_echoed_and_text_format_becomes_a_constraint() {
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
    let valid = validate_response(
        wire(
            json!({"model": "m", "input": "hi", "max_output_tokens": 20, "top_p": 0.5,
                    "text": {"format": {"type": "json_schema", "name": "x", "schema": schema}}}),
        ),
        Vec::new(),
        &limits(),
        42,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(valid.settings.created_at, 42);
    assert_eq!(valid.settings.max_output_tokens, Some(20));
    assert_eq!(valid.chat.request.sampling.max_tokens, Some(20));
    assert!(matches!(
        valid.chat.request.sampling.constraint,
        Some(fallow_protocol::job::Constraint::JsonSchema { .. })
    ));
    let echoed = valid.chat.request.output.responses.clone();
    assert_eq!(echoed, serde_json::to_value(&valid.settings).ok());
}

#[test]
fn chat_parameter_names_are_renamed_to_responses_fields() {
    let origins = vec!["instructions".to_owned(), "input[0]".to_owned()];
    for (chat, responses) in [
        ("messages[1].content", "input[0]"),
        ("messages[0]", "instructions"),
        ("messages", "input"),
        ("max_completion_tokens", "max_output_tokens"),
        ("response_format.json_schema.schema", "text.format.schema"),
        (
            "tools[2].function.parameters.type",
            "tools[2].parameters.type",
        ),
        ("temperature", "temperature"),
    ] {
        assert_eq!(responses_param(chat, &origins), responses);
    }
}

#[test]
fn consecutive_calls_join_the_assistant_turn_before_them() {
    let items = [
        json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "q"}]}),
        json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "let me see"}]}),
        json!({"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}),
        json!({"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"}),
        json!({"type": "function_call_output", "call_id": "c2", "output": "ok"}),
    ];
    let (mut messages, mut origins) = (Vec::new(), Vec::new());
    items_to_messages(
        items.iter().map(|i| (i, "input".to_owned())),
        &mut messages,
        &mut origins,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(messages.len(), 3);
    assert_eq!(messages[1].tool_calls.as_ref().map(Vec::len), Some(2));
    assert_eq!(messages[2].name.as_deref(), Some("g"));
}

#[test]
fn no_reasoning_effort_turns_thinking_off() {
    let valid = validate_response(
        wire(json!({"model": "m", "input": "hi", "reasoning": {"effort": "none"}})),
        Vec::new(),
        &limits(),
        0,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let kwargs = &valid.chat.request.chat_template_kwargs;
    assert_eq!(kwargs.get("enable_thinking"), Some(&Value::Bool(false)));
    assert_eq!(valid.settings.reasoning["effort"], "none");
}
