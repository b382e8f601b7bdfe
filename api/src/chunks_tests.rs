use super::*;
use serde_json::{json, Value};

fn entry(id: &str, event: JobEvent) -> StreamEntry {
    StreamEntry {
        id: id.to_owned(),
        event,
    }
}

fn delta(index: u32, text: &str, finish: Option<FinishReason>, completion_tokens: u32) -> JobEvent {
    JobEvent::Delta {
        index,
        text: text.to_owned(),
        token_ids: Vec::new(),
        logprobs: None,
        finish_reason: finish,
        usage: Usage {
            prompt_tokens: 5,
            completion_tokens,
            cached_tokens: 0,
        },
        at: None,
    }
}

fn final_event(texts: &[&str]) -> JobEvent {
    let usage = Usage {
        prompt_tokens: 5,
        completion_tokens: 2,
        cached_tokens: 1,
    };
    JobEvent::Final {
        completion: crate::test_support::completion(texts, usage),
    }
}

/// Frames as (id, JSON or "[DONE]").
fn render(frames: Vec<Frame>) -> Vec<(Option<String>, Value)> {
    frames
        .into_iter()
        .map(|f| {
            let value = match f.payload {
                Payload::Chunk(c) => serde_json::to_value(&c).unwrap_or(Value::Null),
                Payload::Error(e) => {
                    serde_json::to_value(e.status_and_body().1).unwrap_or(Value::Null)
                }
                Payload::Done => json!("[DONE]"),
            };
            (f.id, value)
        })
        .collect()
}

fn builder(n: u32, delivery: Delivery) -> ChunkBuilder {
    ChunkBuilder::new("chatcmpl-x".into(), 7, "m".into(), n, delivery, false)
}

fn run(b: &mut ChunkBuilder, entries: Vec<StreamEntry>) -> Vec<(Option<String>, Value)> {
    render(entries.iter().flat_map(|e| b.on_entry(e)).collect())
}

#[test]
fn a_stream_starts_with_the_role_then_content_then_finish_then_done() {
    let mut b = builder(
        1,
        Delivery {
            stream: true,
            ..Default::default()
        },
    );
    let out = run(
        &mut b,
        vec![
            entry(
                "1-0",
                JobEvent::Started {
                    attempt: 1,
                    prompt_text: None,
                    continues: false,
                },
            ),
            entry("2-0", delta(0, "Hel", None, 1)),
            entry("3-0", delta(0, "lo", Some(FinishReason::Stop), 2)),
            entry("4-0", final_event(&["Hello"])),
        ],
    );
    let deltas: Vec<Value> = out
        .iter()
        .map(|(_, v)| v["choices"][0]["delta"].clone())
        .collect();
    assert_eq!(deltas[0], json!({"role": "assistant", "content": ""}));
    assert_eq!(deltas[1], json!({"content": "Hel"}));
    assert_eq!(deltas[2], json!({"content": "lo"}));
    assert_eq!(deltas[3], json!({}));
    assert_eq!(out[3].1["choices"][0]["finish_reason"], "stop");
    assert_eq!(out[1].1["choices"][0]["finish_reason"], Value::Null);
    assert_eq!(out.last().map(|(_, v)| v.clone()), Some(json!("[DONE]")));
    assert_eq!(out.len(), 5);
    // ids are the Redis entry ids; without include_usage there is no usage key at all.
    assert_eq!(out[1].0.as_deref(), Some("2-0"));
    assert!(out[1].1.get("usage").is_none());
    assert_eq!(out[1].1["object"], "chat.completion.chunk");
    assert!(b.is_done() && b.ended_normally());
}

#[test]
fn include_usage_adds_a_final_usage_chunk_and_null_usage_elsewhere() {
    let mut b = builder(
        1,
        Delivery {
            stream: true,
            include_usage: true,
            continuous_usage: false,
        },
    );
    let out = run(
        &mut b,
        vec![
            entry("1-0", delta(0, "Hi", Some(FinishReason::Length), 1)),
            entry("2-0", final_event(&["Hi"])),
        ],
    );
    assert!(out[0].1["usage"].is_null() && out[0].1.get("usage").is_some());
    let usage_chunk = &out[out.len() - 2].1;
    assert_eq!(usage_chunk["choices"], json!([]));
    assert_eq!(usage_chunk["usage"]["total_tokens"], 7);
    assert_eq!(
        usage_chunk["usage"]["prompt_tokens_details"]["cached_tokens"],
        1
    );
    assert_eq!(out[2].1["choices"][0]["finish_reason"], "length");
}

#[test]
fn continuous_usage_puts_usage_on_every_chunk() {
    let mut b = builder(
        1,
        Delivery {
            stream: true,
            include_usage: false,
            continuous_usage: true,
        },
    );
    let out = run(&mut b, vec![entry("1-0", delta(0, "Hi", None, 1))]);
    assert_eq!(out[1].1["usage"]["completion_tokens"], 1);
}

#[test]
fn every_choice_gets_its_own_role_chunk_and_final_fills_unstreamed_text() {
    let mut b = builder(
        2,
        Delivery {
            stream: true,
            ..Default::default()
        },
    );
    let out = run(
        &mut b,
        vec![
            entry("1-0", delta(0, "a", None, 1)),
            entry("2-0", final_event(&["ab", "xy"])),
        ],
    );
    let role_indices: Vec<Value> = out[..2]
        .iter()
        .map(|(_, v)| v["choices"][0]["index"].clone())
        .collect();
    assert_eq!(role_indices, [json!(0), json!(1)]);
    let contents: Vec<(Value, Value)> = out
        .iter()
        .filter(|(_, v)| v["choices"][0]["delta"].get("content").is_some())
        .map(|(_, v)| {
            (
                v["choices"][0]["index"].clone(),
                v["choices"][0]["delta"]["content"].clone(),
            )
        })
        .collect();
    assert!(contents.contains(&(json!(0), json!("b"))));
    assert!(contents.contains(&(json!(1), json!("xy"))));
}

#[test]
fn an_error_event_ends_the_stream_with_an_error_then_done() {
    let mut b = builder(
        1,
        Delivery {
            stream: true,
            ..Default::default()
        },
    );
    let out = run(
        &mut b,
        vec![
            entry("1-0", delta(0, "a", None, 1)),
            entry(
                "2-0",
                JobEvent::Error {
                    code: "context_length_exceeded".into(),
                    message: "too long".into(),
                },
            ),
            entry("3-0", delta(0, "late", None, 2)),
        ],
    );
    let n = out.len();
    assert_eq!(out[n - 2].1["error"]["code"], "context_length_exceeded");
    assert_eq!(out[n - 2].1["error"]["message"], "too long");
    assert_eq!(out[n - 1].1, json!("[DONE]"));
    assert!(b.ended_normally());
}

#[test]
fn a_new_attempt_after_tokens_were_sent_is_an_error_not_a_splice() {
    let mut b = builder(
        1,
        Delivery {
            stream: true,
            ..Default::default()
        },
    );
    let out = run(
        &mut b,
        vec![
            entry(
                "1-0",
                JobEvent::Started {
                    attempt: 1,
                    prompt_text: None,
                    continues: false,
                },
            ),
            entry("2-0", delta(0, "a", None, 1)),
            entry(
                "3-0",
                JobEvent::Started {
                    attempt: 2,
                    prompt_text: None,
                    continues: false,
                },
            ),
            entry("4-0", delta(0, "b", None, 1)),
        ],
    );
    assert!(out.iter().any(|(_, v)| v["error"]["code"] == "runner_lost"));
    assert!(!out
        .iter()
        .any(|(_, v)| v["choices"][0]["delta"]["content"] == "b"));
    assert!(!b.ended_normally());
}

#[test]
fn a_continuing_attempt_extends_the_stream_without_an_error() {
    let mut b = builder(
        1,
        Delivery {
            stream: true,
            ..Default::default()
        },
    );
    let started = |attempt, continues| JobEvent::Started {
        attempt,
        prompt_text: None,
        continues,
    };
    let out = run(
        &mut b,
        vec![
            entry("1-0", started(1, false)),
            entry("2-0", delta(0, "a", None, 1)),
            entry("3-0", started(2, true)),
            entry("4-0", delta(0, "b", None, 2)),
        ],
    );
    assert!(!out.iter().any(|(_, v)| !v["error"].is_null()));
    let text: String = out
        .iter()
        .filter_map(|(_, v)| v["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, "ab");
}

#[test]
fn a_resumed_stream_sends_no_role_chunk_and_no_duplicate_text() {
    let mut b = ChunkBuilder::new(
        "c".into(),
        1,
        "m".into(),
        1,
        Delivery {
            stream: true,
            ..Default::default()
        },
        true,
    );
    let out = run(&mut b, vec![entry("5-0", final_event(&["whole text"]))]);
    assert_eq!(out.len(), 2);
    assert_eq!(out[0].1["choices"][0]["delta"], json!({}));
    assert_eq!(out[0].1["choices"][0]["finish_reason"], "stop");
}

#[test]
fn an_api_side_failure_ends_the_stream_but_not_normally() {
    let mut b = builder(
        1,
        Delivery {
            stream: true,
            ..Default::default()
        },
    );
    let out = render(b.on_error(ApiError::Timeout(std::time::Duration::from_secs(1))));
    assert_eq!(out[0].1["error"]["code"], "timeout");
    assert!(b.is_done() && !b.ended_normally());
}

/// A delta of `ids` tokens that says where its choice stood: `tokens` and `bytes` before it.
fn delta_at(index: u32, text: &str, ids: &[u32], tokens: u32, bytes: u64) -> JobEvent {
    let mut event = delta(index, text, None, tokens + ids.len() as u32);
    if let JobEvent::Delta { token_ids, at, .. } = &mut event {
        *token_ids = ids.to_vec();
        *at = Some(fallow_protocol::position::ChoicePosition { tokens, bytes });
    }
    event
}

#[test]
fn a_hole_in_the_stream_is_filled_from_the_final_record_with_nothing_repeated() {
    let mut b = builder(
        2,
        Delivery {
            stream: true,
            ..Default::default()
        },
    );
    let out = run(
        &mut b,
        vec![
            entry("2-0", delta_at(0, "Hel", &[1], 0, 0)),
            entry("2-1", delta_at(1, "Hey", &[7], 0, 0)),
            // Lost: choice 0's "lo " at (1, 3).
            entry("4-0", delta_at(0, "wor", &[3], 2, 6)),
            entry("4-1", delta_at(1, " you", &[8], 1, 3)),
            entry("5-0", delta_at(0, "ld", &[4], 3, 9)),
            entry("6-0", final_event(&["Hello world", "Hey you"])),
        ],
    );
    let text = |index: u64| -> String {
        out.iter()
            .filter(|(_, v)| v["choices"][0]["index"] == index)
            .filter_map(|(_, v)| v["choices"][0]["delta"]["content"].as_str())
            .collect()
    };
    assert_eq!(text(0), "Hello world", "one piece from the final record");
    assert_eq!(text(1), "Hey you", "the other choice streamed on");
    assert!(b.ended_normally());
}

#[test]
fn an_append_its_runner_retried_shows_its_text_once() {
    let mut b = builder(
        1,
        Delivery {
            stream: true,
            ..Default::default()
        },
    );
    let started = JobEvent::Started {
        attempt: 1,
        prompt_text: None,
        continues: false,
    };
    let out = run(
        &mut b,
        vec![
            entry("1-0", started.clone()),
            entry("2-0", delta_at(0, "He", &[1], 0, 0)),
            // The append timed out after it landed; the runner sent it again.
            entry("3-0", started),
            entry("4-0", delta_at(0, "He", &[1], 0, 0)),
            entry("5-0", delta_at(0, "llo", &[2], 1, 2)),
            entry("6-0", delta_at(0, "llo", &[2], 1, 2)),
        ],
    );
    assert!(!out.iter().any(|(_, v)| !v["error"].is_null()));
    let text: String = out
        .iter()
        .filter_map(|(_, v)| v["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, "Hello");
}
