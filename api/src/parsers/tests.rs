use super::*;

fn format(tools: Option<&str>, reasoning: Option<&str>) -> OutputFormat {
    OutputFormat {
        tool_parser: tools.map(str::to_owned),
        reasoning_parser: reasoning.map(str::to_owned),
        ..OutputFormat::default()
    }
}

fn parse_in(format: &OutputFormat, parts: &[&str]) -> ParsedMessage {
    let mut parser = ChoiceParser::new(format, 3, 0);
    let mut message = ParsedMessage::default();
    for part in parts {
        message.absorb(&parser.feed(part, None));
    }
    message.absorb(&parser.finish());
    message
}

/// The message of the whole text, after checking every two-piece split reads the same.
fn parse(format: &OutputFormat, text: &str) -> ParsedMessage {
    let whole = parse_in(format, &[text]);
    for (at, _) in text.char_indices().skip(1) {
        assert_eq!(
            parse_in(format, &[&text[..at], &text[at..]]),
            whole,
            "split at byte {at} of {text:?}"
        );
    }
    whole
}

#[test]
fn qwen3_reasoning_is_split_from_the_answer_at_every_byte() {
    let m = parse(
        &format(None, Some("qwen3")),
        "<think>\nThe user greets. Ünïcode.\n\n</think>\n\nHello!",
    );
    assert_eq!(m.reasoning.as_deref(), Some("The user greets. Ünïcode."));
    assert_eq!(m.content, "Hello!");
}

#[test]
fn qwen3_output_without_think_is_all_content() {
    let m = parse(&format(None, Some("qwen3")), "  <thinking> is a tag");
    assert_eq!(m.reasoning, None);
    assert_eq!(m.content, "  <thinking> is a tag");
}

#[test]
fn deepseek_r1_output_is_reasoning_until_the_close_tag() {
    let f = format(None, Some("deepseek_r1"));
    let m = parse(&f, "Let me think.\n</think>\n\nAnswer");
    assert_eq!(m.reasoning.as_deref(), Some("Let me think."));
    assert_eq!(m.content, "Answer");
    // A model that repeats the opening tag, and one that never closes it.
    assert_eq!(
        parse(&f, "<think>a</think>b").reasoning.as_deref(),
        Some("a")
    );
    let open = parse(&f, "still thinking");
    assert_eq!(open.reasoning.as_deref(), Some("still thinking"));
    assert_eq!(open.content, "");
}

#[test]
fn a_tool_call_after_reasoning_is_parsed_from_the_answer_only() {
    let m = parse(
        &format(Some("hermes"), Some("qwen3")),
        "<think>I should call <tool_call> now.</think>\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
    );
    assert_eq!(
        m.reasoning.as_deref(),
        Some("I should call <tool_call> now.")
    );
    assert_eq!(m.content, "");
    assert_eq!(m.tool_calls.len(), 1);
    assert_eq!(m.tool_calls[0].arguments, "{}");
}

#[test]
fn without_parsers_the_text_is_content_unchanged() {
    let m = parse(&format(None, None), "<think>x</think> <tool_call>");
    assert_eq!(m.content, "<think>x</think> <tool_call>");
    assert_eq!(m.reasoning, None);
}

#[test]
fn tokens_of_deltas_inside_the_reasoning_are_counted() {
    let mut parser = ChoiceParser::new(&format(None, Some("qwen3")), 3, 0);
    for (text, tokens) in [
        ("<think>", 1),
        ("a b", 2),
        ("</think>", 1),
        ("\n\nHi", 2),
        (" there", 1),
    ] {
        parser.feed(text, Some(tokens));
    }
    parser.finish();
    assert_eq!(parser.reasoning_tokens(), 4);
}

fn completion(texts: &[&str], tokens: u32) -> Completion {
    let usage = Usage {
        prompt_tokens: 5,
        completion_tokens: tokens,
        cached_tokens: 0,
    };
    crate::test_support::completion(texts, usage)
}

#[test]
fn the_collector_counts_reasoning_from_deltas_and_parses_the_stored_rest() {
    let f = format(None, Some("deepseek_r1"));
    let mut collector = OutputCollector::new(&f, uuid::Uuid::nil(), 1);
    let usage = |n| Usage {
        completion_tokens: n,
        ..Usage::default()
    };
    collector.on_delta(0, "abc", &usage(3));
    collector.on_delta(0, "</think>", &usage(4));
    let done = completion(&["abc</think>xyz"], 6);
    let parsed = collector.finish(&done);
    assert_eq!(parsed[0].message.reasoning.as_deref(), Some("abc"));
    assert_eq!(parsed[0].message.content, "xyz");
    assert_eq!(parsed[0].reasoning_tokens, Some(4));
}

#[test]
fn a_delta_lost_on_the_way_leaves_no_hole_and_no_repeated_tail_in_the_answer() {
    let f = format(None, Some("deepseek_r1"));
    let mut collector = OutputCollector::new(&f, uuid::Uuid::nil(), 1);
    let usage = |n| Usage {
        completion_tokens: n,
        ..Usage::default()
    };
    collector.on_delta(0, "think", &usage(1));
    // "ing</think>Hello " never arrived (a Redis blip, a trimmed stream).
    collector.on_delta(0, "world", &usage(5));
    let done = completion(&["thinking</think>Hello world"], 5);
    let parsed = collector.finish(&done);
    assert_eq!(parsed[0].message.reasoning.as_deref(), Some("thinking"));
    assert_eq!(parsed[0].message.content, "Hello world");
}

#[test]
fn a_stored_result_without_deltas_estimates_reasoning_tokens_by_length() {
    let f = format(None, Some("deepseek_r1"));
    let collector = OutputCollector::new(&f, uuid::Uuid::nil(), 1);
    let parsed = collector.finish(&completion(&["aaaaaa</think>bb"], 8));
    assert_eq!(parsed[0].reasoning_tokens, Some(6));
    let plain = OutputCollector::new(&format(None, None), uuid::Uuid::nil(), 1);
    assert_eq!(
        plain.finish(&completion(&["x"], 1))[0].reasoning_tokens,
        None
    );
}
