//! gpt-oss's harmony format on the tokenizer side: its real chat template (committed under
//! `testdata/`, see its README for the source and license) renders the reasoning effort and
//! the tools, reveals the `harmony` parsers, and a harmony vocabulary ends generation at
//! `<|return|>` and `<|call|>` but not at `<|end|>`.

use serde_json::{json, Map, Value};

use super::vocab::GgufVocab;
use super::{ChatTemplate, IncrementalDecoder, OutputSyntax, Tokenizer};

const GPT_OSS_TEMPLATE: &str = include_str!("testdata/gpt_oss_chat_template.jinja");

fn render(messages: &[Value], tools: Option<&Value>, kwargs: &[(&str, Value)]) -> String {
    let template = ChatTemplate::new(GPT_OSS_TEMPLATE, "<|startoftext|>", "<|return|>")
        .expect("gpt-oss's template compiles");
    let extra: Map<String, Value> = kwargs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect();
    match template.render(messages, true, tools, &extra, false) {
        Ok(prompt) => prompt,
        Err(e) => panic!("gpt-oss's template failed: {e}"),
    }
}

fn weather_tool() -> Value {
    json!([{"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "The city."}}, "required": ["city"]}}}])
}

#[test]
fn gpt_oss_template_reveals_harmony_for_calls_and_reasoning() {
    let syntax = OutputSyntax::detect(GPT_OSS_TEMPLATE);
    assert_eq!(syntax.tool_parser.as_deref(), Some("harmony"));
    assert_eq!(syntax.reasoning_parser.as_deref(), Some("harmony"));
}

#[test]
fn the_reasoning_effort_reaches_the_system_message_and_defaults_to_medium() {
    let messages = [json!({"role": "user", "content": "Hi"})];
    let high = render(&messages, None, &[("reasoning_effort", json!("high"))]);
    assert!(high.starts_with("<|start|>system<|message|>You are ChatGPT"));
    assert!(high.contains("\n\nReasoning: high\n\n"), "{high}");
    assert!(high.ends_with("<|start|>user<|message|>Hi<|end|><|start|>assistant"));
    let default = render(&messages, None, &[]);
    assert!(default.contains("Reasoning: medium"), "{default}");
    assert!(!default.contains("<|start|>developer"), "{default}");
}

#[test]
fn tools_and_the_system_prompt_go_to_the_developer_message() {
    let messages = [
        json!({"role": "system", "content": "Be brief."}),
        json!({"role": "user", "content": "Weather in Paris?"}),
    ];
    let tools = weather_tool();
    let prompt = render(
        &messages,
        Some(&tools),
        &[("reasoning_effort", json!("low"))],
    );
    assert!(prompt.contains("Reasoning: low"), "{prompt}");
    assert!(
        prompt.contains("Calls to these tools must go to the commentary channel: 'functions'."),
        "{prompt}"
    );
    let developer = "<|start|>developer<|message|># Instructions\n\nBe brief.\n\n# Tools\n\n\
                     ## functions\n\nnamespace functions {\n\n// The weather in a city.\n\
                     type get_weather = (_: {\n// The city.\ncity: string,\n}) => any;\n\n\
                     } // namespace functions<|end|>";
    assert!(prompt.contains(developer), "{prompt}");
}

#[test]
fn a_function_without_a_description_renders_with_an_empty_one() {
    // OpenAI makes `description` optional; the template writes `"// " + tool.description`.
    let messages = [json!({"role": "user", "content": "Time?"})];
    let tools = json!([{"type": "function", "function": {
        "name": "get_time", "parameters": {"type": "object", "properties": {}}}}]);
    let prompt = render(&messages, Some(&tools), &[]);
    assert!(
        prompt.contains("namespace functions {\n\n// \ntype get_time = () => any;"),
        "{prompt}"
    );
}

#[test]
fn an_earlier_call_and_its_result_render_as_harmony_messages_with_the_reasoning() {
    // The shape `prompt::message_value` gives templates: parsed arguments, reasoning as
    // `thinking` too, and `null` content, which gpt-oss's template cannot test with `in`.
    let messages = [
        json!({"role": "user", "content": "Weather in Paris?"}),
        json!({"role": "assistant", "content": null,
               "reasoning_content": "Need the weather.", "thinking": "Need the weather.",
               "tool_calls": [{"id": "call_1", "type": "function",
                               "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}),
        json!({"role": "tool", "tool_call_id": "call_1", "content": "sunny"}),
    ];
    let prompt = render(&messages, Some(&weather_tool()), &[]);
    let turn = "<|start|>assistant<|channel|>analysis<|message|>Need the weather.<|end|>\
                <|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>\
                {\"city\": \"Paris\"}<|call|>\
                <|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>\
                \"sunny\"<|end|><|start|>assistant";
    assert!(prompt.ends_with(turn), "{prompt}");
}

/// A SentencePiece vocabulary with harmony's special tokens (and Phi-3's `<|end|>` alone
/// when `harmony` is false).
fn vocab(harmony: bool) -> GgufVocab {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut types = vec![2, 3, 3];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
    }
    let specials: &[&str] = if harmony {
        &[
            "<|start|>",
            "<|channel|>",
            "<|message|>",
            "<|constrain|>",
            "<|end|>",
            "<|return|>",
            "<|call|>",
        ]
    } else {
        &["<|end|>"]
    };
    for special in specials {
        tokens.push((*special).into());
        types.push(3);
    }
    for text in ["▁", "a", "b"] {
        tokens.push(text.into());
        types.push(1);
    }
    let scores = vec![0.0; tokens.len()];
    GgufVocab {
        model: "llama".into(),
        tokens,
        scores: Some(scores),
        token_types: Some(types),
        bos_id: Some(1),
        eos_id: Some(2),
        ..GgufVocab::default()
    }
}

fn id(tok: &Tokenizer, text: &str) -> u32 {
    (0..tok.vocab_size() as u32)
        .find(|&id| tok.vocab_entry(id) == Some(text))
        .unwrap_or_else(|| panic!("{text} is in the vocabulary"))
}

#[test]
fn a_harmony_vocabulary_ends_generation_at_return_and_call_but_not_at_end() {
    let tok = Tokenizer::from_gguf_vocab(&vocab(true)).expect("vocabulary builds");
    let eos = tok.eos_ids();
    assert!(eos.contains(&id(&tok, "<|return|>")), "{eos:?}");
    assert!(eos.contains(&id(&tok, "<|call|>")), "{eos:?}");
    assert!(!eos.contains(&id(&tok, "<|end|>")), "{eos:?}");
    assert!(tok.ends_only_a_message(id(&tok, "<|end|>")));
    // Phi-3 ends its turns with `<|end|>`.
    let phi = Tokenizer::from_gguf_vocab(&vocab(false)).expect("vocabulary builds");
    assert!(phi.eos_ids().contains(&id(&phi, "<|end|>")));
    assert!(!phi.ends_only_a_message(id(&phi, "<|end|>")));
}

#[test]
fn harmony_markers_are_kept_in_the_text_unless_special_tokens_are_skipped() {
    let tok = Tokenizer::from_gguf_vocab(&vocab(true)).expect("vocabulary builds");
    let text = "<|channel|>a<|message|>b<|end|>";
    let ids = tok.encode(text, false).expect("encodes");
    assert_eq!(ids.first(), Some(&id(&tok, "<|channel|>")));
    let mut decoder = IncrementalDecoder::new(false);
    let mut shown: String = ids.iter().map(|&i| decoder.push(&tok, i)).collect();
    shown.push_str(&decoder.finish());
    assert_eq!(shown.replace(' ', ""), text);
    assert_eq!(tok.decode(&ids, true).replace(' ', ""), "ab");
}
