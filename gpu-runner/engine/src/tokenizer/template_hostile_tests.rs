//! Hostile messages for real chat templates, generated: Gemma's and the ChatML template
//! rendered over thousands of mutated conversations (odd roles, content of every JSON type,
//! tool calls whose arguments are not objects, stray template kwargs). Each render must end
//! in a prompt or a `TemplateError`, never a panic.

use super::template::ChatTemplate;
use rand::{rngs::StdRng, Rng, SeedableRng};
use serde_json::{json, Map, Value};

const CASES: usize = 2000;
const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

fn random_value(rng: &mut StdRng, depth: u32) -> Value {
    match rng.gen_range(0..if depth > 2 { 5 } else { 7 }) {
        0 => Value::Null,
        1 => json!(rng.gen::<bool>()),
        2 => json!(rng.gen::<i64>()),
        3 => json!(
            [
                "",
                "user",
                "assistant",
                "system",
                "tool",
                "{{",
                "{%",
                "\u{0}é🙂"
            ][rng.gen_range(0..8)]
        ),
        4 => json!("x".repeat(rng.gen_range(0..300))),
        5 => Value::Array(
            (0..rng.gen_range(0..4))
                .map(|_| random_value(rng, depth + 1))
                .collect(),
        ),
        _ => {
            let keys = [
                "role",
                "content",
                "type",
                "text",
                "tool_calls",
                "function",
                "arguments",
                "name",
            ];
            let mut map = Map::new();
            for _ in 0..rng.gen_range(0..4) {
                map.insert(
                    keys[rng.gen_range(0..keys.len())].into(),
                    random_value(rng, depth + 1),
                );
            }
            Value::Object(map)
        }
    }
}

fn conversation(rng: &mut StdRng) -> Vec<Value> {
    let mut messages = vec![
        json!({"role": "system", "content": "Be brief."}),
        json!({"role": "user", "content": [{"type": "text", "text": "hi"}]}),
        json!({"role": "assistant", "content": "", "tool_calls": [{"type": "function",
            "function": {"name": "f", "arguments": {"a": 1}}}]}),
        json!({"role": "tool", "content": "ok"}),
        json!({"role": "user", "content": "and?"}),
    ];
    for _ in 0..rng.gen_range(1..4) {
        let i = rng.gen_range(0..messages.len());
        match rng.gen_range(0..4) {
            0 => messages[i] = random_value(rng, 0),
            1 => {
                if let Some(obj) = messages[i].as_object_mut() {
                    let key = ["role", "content", "tool_calls"][rng.gen_range(0..3)];
                    obj.insert(key.into(), random_value(rng, 1));
                }
            }
            2 => {
                messages.remove(i);
            }
            _ => messages.push(random_value(rng, 0)),
        }
    }
    messages
}

#[test]
fn thousands_of_mutated_conversations_render_or_fail_cleanly() {
    let gemma = include_str!("gemma_chat_template.jinja");
    let templates = [
        ChatTemplate::new(gemma, "<bos>", "<eos>").expect("gemma template"),
        ChatTemplate::new(CHATML, "", "<|im_end|>").expect("chatml template"),
    ];
    let mut rng = StdRng::seed_from_u64(0x7465_6d70);
    for case in 0..CASES {
        let messages = conversation(&mut rng);
        let tools = (rng.gen_range(0..3) == 0).then(|| random_value(&mut rng, 0));
        let mut extra = Map::new();
        if rng.gen_range(0..3) == 0 {
            extra.insert("enable_thinking".into(), random_value(&mut rng, 1));
        }
        let continue_final = rng.gen_range(0..4) == 0;
        for template in &templates {
            let rendered = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                template.render(&messages, true, tools.as_ref(), &extra, continue_final)
            }));
            assert!(rendered.is_ok(), "case {case} panicked on {messages:?}");
        }
    }
}
