use super::ToolCallParser;
use crate::parsers::{ParsedCall, ParsedMessage, Piece};

fn parse_in(parser: &str, parts: &[&str]) -> ParsedMessage {
    let mut p = ToolCallParser::new(parser, false, 7, 0);
    let mut message = ParsedMessage::default();
    for part in parts {
        message.absorb(&p.feed(part));
    }
    message.absorb(&p.finish());
    message
}

/// The message from the whole text at once, after asserting that every split into two
/// pieces, and a feed of one character at a time, read the same.
fn parse(parser: &str, text: &str) -> ParsedMessage {
    let whole = parse_in(parser, &[text]);
    for (at, _) in text.char_indices().skip(1) {
        assert_eq!(
            parse_in(parser, &[&text[..at], &text[at..]]),
            whole,
            "{parser}: split at byte {at} of {text:?}"
        );
    }
    let chars: Vec<String> = text.chars().map(String::from).collect();
    let chars: Vec<&str> = chars.iter().map(String::as_str).collect();
    assert_eq!(parse_in(parser, &chars), whole, "{parser}: char by char");
    whole
}

fn call(index: u32, name: &str, arguments: &str) -> ParsedCall {
    ParsedCall {
        id: super::call_id(7, 0, index),
        name: name.into(),
        arguments: arguments.into(),
    }
}

#[test]
fn a_hermes_call_after_text_splits_into_content_and_the_call_at_every_byte() {
    let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\"}}\n</tool_call>";
    let m = parse("hermes", text);
    assert_eq!(m.content, "Let me check.");
    assert_eq!(
        m.tool_calls,
        [call(0, "get_weather", "{\"city\": \"Zürich\"}")]
    );
}

#[test]
fn parallel_hermes_calls_are_numbered_and_empty_arguments_are_kept() {
    let text = "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"arguments\": {\"x\": [1, {\"y\": \"}\"}]}, \"name\": \"b\"}\n</tool_call>\n";
    let m = parse("hermes", text);
    assert_eq!(m.content, "");
    assert_eq!(
        m.tool_calls,
        [
            call(0, "a", "{}"),
            call(1, "b", "{\"x\": [1, {\"y\": \"}\"}]}")
        ]
    );
}

#[test]
fn a_hermes_block_that_is_no_call_stays_content() {
    let text = "Use <tool_call> tags like <tool_call>this</tool_call>.";
    let m = parse("hermes", text);
    assert_eq!(m.content, text);
    assert!(m.tool_calls.is_empty());
}

#[test]
fn plain_text_passes_through_unchanged_with_its_whitespace() {
    let text = "  Hello <tool world\n\n";
    for parser in ["hermes", "llama3_json", "mistral"] {
        let m = parse(parser, text);
        assert_eq!(m.content, text, "{parser}");
    }
}

#[test]
fn a_call_cut_off_by_the_length_limit_keeps_what_arrived() {
    let m = parse(
        "hermes",
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1",
    );
    assert_eq!(m.tool_calls, [call(0, "f", "{\"a\": 1")]);
    let m = parse("hermes", "<tool_call>\n{\"name\": \"f\"");
    assert_eq!(m.tool_calls, [call(0, "f", "{}")]);
}

#[test]
fn arguments_sent_as_a_json_string_are_unwrapped() {
    let m = parse(
        "hermes",
        "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call>",
    );
    assert_eq!(m.tool_calls, [call(0, "f", "{\"a\": 1}")]);
}

#[test]
fn llama3_json_calls_read_parameters_and_the_python_tag() {
    let m = parse(
        "llama3_json",
        "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}",
    );
    assert_eq!(
        m.tool_calls,
        [call(0, "get_weather", "{\"city\": \"Paris\"}")]
    );
    assert_eq!(m.content, "");
    let m = parse(
        "llama3_json",
        "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {\"n\": -1.5e3}}",
    );
    assert_eq!(
        m.tool_calls,
        [call(0, "a", "{}"), call(1, "b", "{\"n\": -1.5e3}")]
    );
}

#[test]
fn llama3_text_that_does_not_start_with_a_call_is_content() {
    let text = "The JSON is {\"name\": \"x\", \"parameters\": {}}";
    let m = parse("llama3_json", text);
    assert_eq!(m.content, text);
    assert!(m.tool_calls.is_empty());
    let text = "{\"not\": \"a call\"}";
    assert_eq!(parse("llama3_json", text).content, text);
}

#[test]
fn mistral_calls_are_an_array_after_the_marker() {
    let m = parse(
        "mistral",
        "Sure.[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {\"q\": \"[x]\"}}, {\"name\": \"b\", \"arguments\": {}}]",
    );
    assert_eq!(m.content, "Sure.");
    assert_eq!(
        m.tool_calls,
        [call(0, "a", "{\"q\": \"[x]\"}"), call(1, "b", "{}")]
    );
}

#[test]
fn with_parallel_calls_off_only_the_first_call_is_reported() {
    let mut p = ToolCallParser::new("hermes", true, 7, 0);
    let mut m = ParsedMessage::default();
    m.absorb(&p.feed(
        "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call><tool_call>{\"name\": \"b\", \"arguments\": {\"z\": 1}}</tool_call>",
    ));
    m.absorb(&p.finish());
    assert_eq!(m.tool_calls, [call(0, "a", "{}")]);
}

#[test]
fn the_name_comes_before_any_arguments_in_a_stream() {
    let mut p = ToolCallParser::new("hermes", false, 7, 0);
    let first = p.feed("<tool_call>{\"arguments\": {\"a\": ");
    assert!(first.is_empty(), "{first:?}");
    let second = p.feed("1}, \"name\": \"f\"}");
    assert!(matches!(&second[0], Piece::CallStart { name, .. } if name == "f"));
    assert!(matches!(&second[1], Piece::CallArgs { text, .. } if text == "{\"a\": 1}"));
}

#[test]
fn call_ids_are_stable_per_job_choice_and_index() {
    let id = super::call_id(1, 0, 0);
    assert!(id.starts_with("call_") && id.len() == 29, "{id}");
    assert_eq!(id, super::call_id(1, 0, 0));
    assert_ne!(id, super::call_id(1, 0, 1));
    assert_ne!(id, super::call_id(1, 1, 0));
    assert_ne!(id, super::call_id(2, 0, 0));
}

#[test]
fn mistral_v11_calls_are_name_then_args() {
    let m = parse(
        "mistral",
        "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]noop[ARGS]{}",
    );
    assert_eq!(m.content, "");
    assert_eq!(
        m.tool_calls,
        [
            call(0, "get_weather", "{\"city\": \"Paris\"}"),
            call(1, "noop", "{}")
        ]
    );
    let text = "[TOOL_CALLS]not a call";
    assert_eq!(parse("mistral", text).content, text);
}
