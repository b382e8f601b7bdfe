//! Generated hostile input for the api's tests: seeded random JSON values, random edits of a
//! valid body, and mangled bytes. Seeded, so a failing case can be replayed by its number.

use serde_json::{json, Map, Value};

/// xorshift64*: enough randomness for a fuzzer, and the same cases on every run.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// A valid chat body that uses most fields.
pub fn chat_seed() -> Value {
    json!({
        "model": "m",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"}
        ],
        "max_tokens": 16, "temperature": 0.7, "top_p": 0.9, "n": 2, "seed": 1,
        "stop": ["\n\n", "END"], "logit_bias": {"42": 5}, "logprobs": true, "top_logprobs": 3,
        "tools": [{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"]}}}],
        "tool_choice": "auto",
        "response_format": {"type": "json_schema", "json_schema": {"name": "x",
            "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}},
        "stream": true, "stream_options": {"include_usage": true},
        "max_length": 100, "stop_token_ids": [2], "min_tokens": 1, "repetition_penalty": 1.1
    })
}

/// A valid legacy completions body.
pub fn completion_seed() -> Value {
    json!({
        "model": "m", "prompt": ["Once upon", [1, 2, 3]], "max_tokens": 8, "echo": false,
        "logprobs": 2, "best_of": 1, "n": 1, "stop": "\n", "suffix": null, "temperature": 0
    })
}

/// A valid Responses body.
pub fn response_seed() -> Value {
    json!({
        "model": "m", "instructions": "Be brief.",
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "ok"}
        ],
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
        "reasoning": {"effort": "low"}, "max_output_tokens": 32, "top_logprobs": 2,
        "include": ["message.output_text.logprobs"], "metadata": {"k": "v"}, "store": true
    })
}

/// A value of any JSON type, some of them the kinds that break parsers: huge and negative
/// numbers, long and odd strings, deep nesting.
pub fn random_value(rng: &mut Rng, depth: u32) -> Value {
    let strings = [
        "",
        "m",
        "user",
        "auto",
        "none",
        "required",
        "function",
        "json_schema",
        "text",
        "\u{0}",
        "\u{feff}é🙂",
        "{",
        "}",
        "{\"a\":",
        "[[[[",
        "-1",
        "1e308",
        "NaN",
    ];
    match rng.below(if depth > 3 { 6 } else { 9 }) {
        0 => Value::Null,
        1 => Value::Bool(rng.below(2) == 0),
        2 => json!(*rng.pick(&[0_i64, 1, -1, 2, 64, 300, 4096, i64::MAX, i64::MIN, 1 << 40])),
        3 => json!(*rng.pick(&[0.5_f64, -0.0, 1e308, -1e308, 2.5, 1e-300, 100.0])),
        4 => Value::String(rng.pick(&strings).to_string()),
        5 => Value::String("x".repeat(rng.below(5000))),
        6 => Value::Array(
            (0..rng.below(4))
                .map(|_| random_value(rng, depth + 1))
                .collect(),
        ),
        7 => {
            let keys = ["type", "role", "content", "name", "text", "a", "function"];
            let mut map = Map::new();
            for _ in 0..rng.below(4) {
                map.insert(rng.pick(&keys).to_string(), random_value(rng, depth + 1));
            }
            Value::Object(map)
        }
        _ => (0..40).fold(Value::Null, |inner, _| json!([inner])),
    }
}

/// `seed` with one to four random edits: a value replaced, a key removed or added, an array
/// item duplicated, anywhere in the tree.
pub fn mutate(rng: &mut Rng, seed: &Value) -> Value {
    let mut value = seed.clone();
    for _ in 0..1 + rng.below(4) {
        edit(rng, &mut value, 0);
    }
    value
}

fn edit(rng: &mut Rng, value: &mut Value, depth: u32) {
    let descend = depth < 6 && rng.below(3) != 0;
    match value {
        Value::Object(map) if !map.is_empty() => {
            let keys: Vec<String> = map.keys().cloned().collect();
            let key = rng.pick(&keys).clone();
            match rng.below(6) {
                0 => {
                    map.remove(&key);
                }
                1 => {
                    let extra = [
                        "n",
                        "stop",
                        "tools",
                        "tool_choice",
                        "logit_bias",
                        "messages",
                        "prompt",
                        "input",
                        "max_tokens",
                        "stream",
                        "echo",
                        "suffix",
                    ];
                    map.insert(rng.pick(&extra).to_string(), random_value(rng, depth));
                }
                _ if descend => {
                    if let Some(child) = map.get_mut(&key) {
                        edit(rng, child, depth + 1);
                    }
                }
                _ => {
                    map.insert(key, random_value(rng, depth));
                }
            }
        }
        Value::Array(items) if !items.is_empty() => {
            let i = rng.below(items.len());
            match rng.below(4) {
                0 => {
                    let copy = items[i].clone();
                    items.push(copy);
                }
                1 => {
                    items.remove(i);
                }
                _ if descend => edit(rng, &mut items[i], depth + 1),
                _ => items[i] = random_value(rng, depth),
            }
        }
        other => *other = random_value(rng, depth),
    }
}

/// The body's bytes truncated, or with a few bytes flipped.
pub fn mangle_bytes(rng: &mut Rng, body: &[u8]) -> Vec<u8> {
    let mut bytes = body.to_vec();
    if rng.below(2) == 0 {
        bytes.truncate(rng.below(bytes.len() + 1));
    } else {
        for _ in 0..1 + rng.below(4) {
            if !bytes.is_empty() {
                let i = rng.below(bytes.len());
                bytes[i] = rng.next() as u8;
            }
        }
    }
    bytes
}
