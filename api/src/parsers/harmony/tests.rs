use super::HarmonyParser;
use crate::parsers::tool_calls::call_id;
use crate::parsers::{ParsedCall, ParsedMessage};

fn parse_in(parts: &[&str], split_reasoning: bool, calls: bool) -> ParsedMessage {
    let mut parser = HarmonyParser::new(split_reasoning, calls, false, 7, 0);
    let mut message = ParsedMessage::default();
    for part in parts {
        message.absorb(&parser.feed(part));
    }
    message.absorb(&parser.finish());
    message
}

/// The message of the whole text, after asserting that every split into two pieces, and a
/// feed of one character at a time, read the same.
fn parse_with(text: &str, split_reasoning: bool, calls: bool) -> ParsedMessage {
    let whole = parse_in(&[text], split_reasoning, calls);
    for (at, _) in text.char_indices().skip(1) {
        assert_eq!(
            parse_in(&[&text[..at], &text[at..]], split_reasoning, calls),
            whole,
            "split at byte {at} of {text:?}"
        );
    }
    let chars: Vec<String> = text.chars().map(String::from).collect();
    let chars: Vec<&str> = chars.iter().map(String::as_str).collect();
    assert_eq!(
        parse_in(&chars, split_reasoning, calls),
        whole,
        "char by char"
    );
    whole
}

fn parse(text: &str) -> ParsedMessage {
    parse_with(text, true, true)
}

fn call(index: u32, name: &str, arguments: &str) -> ParsedCall {
    ParsedCall {
        id: call_id(7, 0, index),
        name: name.into(),
        arguments: arguments.into(),
    }
}

#[test]
fn analysis_is_reasoning_and_final_is_the_answer() {
    let m = parse(
        "<|channel|>analysis<|message|>The user greets. Ünïcode.<|end|>\
         <|start|>assistant<|channel|>final<|message|>Hello! How can I help?",
    );
    assert_eq!(m.reasoning.as_deref(), Some("The user greets. Ünïcode."));
    assert_eq!(m.content, "Hello! How can I help?");
    assert!(m.tool_calls.is_empty());
}

#[test]
fn a_closing_return_token_in_the_text_ends_the_answer() {
    let m = parse("<|channel|>final<|message|>Hi<|return|>");
    assert_eq!(m.content, "Hi");
    assert_eq!(m.reasoning, None);
}

#[test]
fn a_call_with_constrain_after_reasoning_is_a_tool_call_with_its_json_arguments() {
    let m = parse(
        "<|channel|>analysis<|message|>Need the weather.<|end|>\
         <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json\
         <|message|>{\"city\":\"Zürich\"}<|call|>",
    );
    assert_eq!(m.reasoning.as_deref(), Some("Need the weather."));
    assert_eq!(m.content, "");
    assert_eq!(
        m.tool_calls,
        [call(0, "get_weather", "{\"city\":\"Zürich\"}")]
    );
}

#[test]
fn a_recipient_before_the_channel_and_a_call_cut_before_call_token_are_read() {
    let m = parse(
        "<|channel|>commentary<|message|>Let me check both.<|end|>\
         <|start|>assistant to=functions.a<|channel|>commentary json<|message|>{}<|call|>\
         <|start|>assistant<|channel|>commentary to=functions.b <|constrain|>json<|message|>{\"x\": [1, \"<|\"]}",
    );
    assert_eq!(m.content, "Let me check both.");
    assert_eq!(
        m.tool_calls,
        [call(0, "a", "{}"), call(1, "b", "{\"x\": [1, \"<|\"]}")]
    );
}

#[test]
fn a_call_without_arguments_gets_an_empty_object() {
    let m = parse("<|channel|>commentary to=functions.now <|constrain|>json<|message|><|call|>");
    assert_eq!(m.tool_calls, [call(0, "now", "{}")]);
}

#[test]
fn only_the_first_call_is_kept_when_one_is_allowed() {
    let text = "<|channel|>commentary to=functions.a<|message|>{\"n\":1}<|call|>\
                <|start|>assistant<|channel|>commentary to=functions.b<|message|>{\"n\":2}<|call|>";
    let mut parser = HarmonyParser::new(true, true, true, 7, 0);
    let mut m = ParsedMessage::default();
    m.absorb(&parser.feed(text));
    m.absorb(&parser.finish());
    assert_eq!(m.tool_calls, [call(0, "a", "{\"n\":1}")]);
}

#[test]
fn without_tools_a_call_is_content_and_without_splitting_analysis_is_too() {
    let text = "<|channel|>analysis<|message|>hm<|end|>\
                <|start|>assistant<|channel|>commentary to=functions.f<|message|>{}<|call|>";
    let kept = parse_with(text, false, false);
    assert_eq!(kept.reasoning, None);
    assert_eq!(kept.content, "hm{}");
    assert!(kept.tool_calls.is_empty());
}

#[test]
fn text_outside_any_message_is_content_with_its_whitespace() {
    let text = "  plain <| answer\n";
    assert_eq!(parse(text).content, text);
}

#[test]
fn malformed_and_truncated_output_degrades_to_content_without_panicking() {
    // A header that never reaches `<|message|>` within a line is text after all.
    let m = parse("<|channel|>final but no message\nmore");
    assert_eq!(m.content, "<|channel|>final but no message\nmore");
    // Cut off inside a header: the finished messages stand, the header is dropped.
    let m = parse("<|channel|>analysis<|message|>a<|end|><|start|>assistant<|chan");
    assert_eq!(m.reasoning.as_deref(), Some("a"));
    assert_eq!(m.content, "");
    // A body left open by a new header, and stray markers in the answer's text.
    let m = parse("<|channel|>analysis<|message|>a<|channel|>final<|message|>b <|end b");
    assert_eq!(m.reasoning.as_deref(), Some("a"));
    assert_eq!(m.content, "b <|end b");
    for text in [
        "<|",
        "<|start|>",
        "<|message|>",
        "<|end|>x",
        "<|call|><|call|>",
    ] {
        parse(text);
    }
}

#[test]
fn any_mix_of_markers_and_text_reads_the_same_streamed_and_never_panics() {
    const PARTS: [&str; 14] = [
        "<|start|>",
        "assistant",
        "<|channel|>",
        "analysis",
        "final",
        "commentary to=functions.f ",
        "<|constrain|>json",
        "<|message|>",
        "<|end|>",
        "<|call|>",
        "<|return|>",
        "{\"a\": \"<|\"}",
        " \n",
        "é<",
    ];
    // A small linear congruential generator: the same texts on every run.
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = |n: usize| {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (state >> 33) as usize % n
    };
    for _ in 0..200 {
        let text: String = (0..1 + next(12))
            .map(|_| PARTS[next(PARTS.len())])
            .collect();
        for (split, calls) in [(true, true), (false, false)] {
            let whole = parse_in(&[&text], split, calls);
            let chars: Vec<String> = text.chars().map(String::from).collect();
            let chars: Vec<&str> = chars.iter().map(String::as_str).collect();
            assert_eq!(parse_in(&chars, split, calls), whole, "{text:?}");
        }
    }
}

#[test]
fn a_tools_answer_the_model_goes_on_to_imagine_is_no_call() {
    let m = parse(
        "<|channel|>commentary to=functions.f<|message|>{}<|call|>\
         <|start|>functions.f to=assistant<|channel|>commentary<|message|>\"sunny\"<|end|>",
    );
    assert_eq!(m.tool_calls, [call(0, "f", "{}")]);
    assert_eq!(m.content, "\"sunny\"");
}
