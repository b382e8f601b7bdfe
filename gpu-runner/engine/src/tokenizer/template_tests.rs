//! Tests of [`super::ChatTemplate`] features that Hugging Face templates rely on.

use serde_json::{json, Map, Value};

use super::{ChatTemplate, TemplateError, GEMMA_CHAT_TEMPLATE};

fn render(source: &str, messages: &[Value]) -> Result<String, TemplateError> {
    ChatTemplate::new(source, "<bos>", "<eos>")?.render(messages, true, None, &Map::new(), false)
}

#[test]
fn tojson_writes_python_json_without_html_escaping() {
    let tools = json!([{"name": "f", "description": "a < b & c", "parameters": {"z": 1, "a": 2}}]);
    let t = ChatTemplate::new(
        "{{ tools | tojson }}|{{ tools[0] | tojson(indent=2) }}",
        "",
        "",
    )
    .unwrap();
    let out = t
        .render(&[], false, Some(&tools), &Map::new(), false)
        .unwrap();
    assert_eq!(
        out,
        "[{\"name\": \"f\", \"description\": \"a < b & c\", \"parameters\": {\"z\": 1, \"a\": 2}}]|{\n  \"name\": \"f\",\n  \"description\": \"a < b & c\",\n  \"parameters\": {\n    \"z\": 1,\n    \"a\": 2\n  }\n}"
    );
}

#[test]
fn python_string_and_dict_methods_work() {
    let source = "{{ messages[0].content.strip().upper() }}|{{ messages[0].content.startswith('  hi') }}|{% for k, v in messages[0].items() %}{{ k }}={{ v | trim }};{% endfor %}";
    let out = render(source, &[json!({"role": "user", "content": "  hi "})]).unwrap();
    assert_eq!(out, "HI|True|role=user;content=hi;");
}

#[test]
fn blocks_are_trimmed_and_loop_controls_work() {
    let source = "{% for m in messages %}\n  {% if loop.index > 2 %}{% break %}{% endif %}\n{{ m.content }}\n{% endfor %}";
    let messages: Vec<Value> = (1..=4)
        .map(|i| json!({"role": "user", "content": i}))
        .collect();
    assert_eq!(render(source, &messages).unwrap(), "1\n2\n");
}

#[test]
fn special_tokens_and_extra_kwargs_are_visible_to_the_template() {
    let mut extra = Map::new();
    extra.insert("enable_thinking".into(), json!(false));
    let t = ChatTemplate::new(
        "{{ bos_token }}{% if not enable_thinking %}no-think{% endif %}{{ eos_token }}{{ tools is none }}",
        "<s>",
        "</s>",
    )
    .unwrap();
    let out = t.render(&[], false, None, &extra, false).unwrap();
    assert_eq!(out, "<s>no-think</s>True");
}

#[test]
fn strftime_now_formats_the_current_date() {
    let out = render("{{ strftime_now('%Y-%m-%d') }}", &[]).unwrap();
    assert_eq!(out.len(), 10);
    assert!(render("{{ strftime_now('%Q') }}", &[]).is_err());
}

#[test]
fn invalid_templates_and_failing_renders_are_errors_not_panics() {
    assert!(matches!(
        ChatTemplate::new("{% for %}", "", ""),
        Err(TemplateError::Syntax(_))
    ));
    assert!(matches!(
        render(
            "{{ messages[0].content.nope.deeper }}",
            &[json!({"content": "x"})]
        ),
        Err(TemplateError::Render(_))
    ));
}

#[test]
fn the_gemma_template_folds_the_system_prompt_into_the_first_user_turn() {
    let messages = [
        json!({"role": "system", "content": "Be brief."}),
        json!({"role": "user", "content": "Hi"}),
        json!({"role": "assistant", "content": "Hello!"}),
        json!({"role": "user", "content": [{"type": "text", "text": "Bye"}]}),
    ];
    assert_eq!(
        render(GEMMA_CHAT_TEMPLATE, &messages).unwrap(),
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
    );
}

#[test]
fn the_gemma_template_rejects_roles_it_cannot_express() {
    let err = render(
        GEMMA_CHAT_TEMPLATE,
        &[json!({"role": "tool", "content": "42"})],
    )
    .unwrap_err();
    assert!(matches!(err, TemplateError::Raised(m) if m.contains("tool")));
}

#[test]
fn qwen_style_constructs_render() {
    // Reverse slicing, namespaces, string splitting and `is defined` checks, as Qwen 3 uses.
    let source = "{%- set ns = namespace(last_user=-1) -%}\
{%- for m in messages[::-1] -%}{%- if ns.last_user < 0 and m.role == 'user' -%}{%- set ns.last_user = messages|length - 1 - loop.index0 -%}{%- endif -%}{%- endfor -%}\
{{ ns.last_user }}|{{ messages[1].content.split('</think>')[-1].lstrip('\\n') }}|{{ messages[0].tool_calls is defined }}";
    let messages = [
        json!({"role": "user", "content": "q"}),
        json!({"role": "assistant", "content": "<think>hmm</think>\n\nanswer"}),
    ];
    assert_eq!(render(source, &messages).unwrap(), "0|answer|False");
}

#[test]
fn tokenizers_and_templates_can_be_shared_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<super::Tokenizer>();
    assert_send_sync::<ChatTemplate>();
}

/// The ChatML template SmolLM2 and Qwen ship (without their default system prompt).
const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

#[test]
fn chatml_renders_the_canonical_prompt() {
    let messages = [
        json!({"role": "system", "content": "You are helpful."}),
        json!({"role": "user", "content": "Hi"}),
    ];
    assert_eq!(
        render(CHATML, &messages).unwrap(),
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn continue_final_message_cuts_after_the_last_content_and_needs_it_present() {
    let t = ChatTemplate::new(CHATML, "", "").unwrap();
    let messages = [
        json!({"role": "user", "content": "Hi"}),
        json!({"role": "assistant", "content": "Hello, I "}),
    ];
    let out = t.render(&messages, true, None, &Map::new(), true).unwrap();
    assert_eq!(
        out,
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello, I "
    );
    let hidden = ChatTemplate::new("{{ 'nothing' }}", "", "").unwrap();
    assert!(matches!(
        hidden.render(&messages, false, None, &Map::new(), true),
        Err(TemplateError::ContinueFinalMessage(_))
    ));
}

#[test]
fn none_prints_like_python_and_raise_exception_works_inside_macros() {
    let source = "{% macro check(m) %}{% if m.content is none %}{{ raise_exception('no content') }}{% endif %}{% endmacro %}{{ messages[0].content }}|{{ check(messages[1]) }}";
    let messages = [json!({"content": null}), json!({"content": null})];
    let err = render(source, &messages).unwrap_err();
    assert!(matches!(err, TemplateError::Raised(m) if m == "no content"));
    let printed = render("{{ messages[0].content }}", &messages).unwrap();
    assert_eq!(printed, "None");
}

#[test]
fn a_template_that_cannot_test_null_content_gets_an_empty_text_instead() {
    let source = "{% for m in messages %}{% if '<x>' in m.content %}bad{% endif %}[{{ m.content }}]{% endfor %}";
    let messages = [
        json!({"role": "user", "content": "hi"}),
        json!({"role": "assistant", "content": null}),
    ];
    assert_eq!(render(source, &messages).unwrap(), "[hi][]");
    // A failure that is not about the content stays the first error.
    let broken = "{{ messages[0].content }}{{ 1 + none }}";
    assert!(matches!(
        render(broken, &messages),
        Err(TemplateError::Render(_))
    ));
}
