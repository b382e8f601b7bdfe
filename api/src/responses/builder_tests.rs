use super::*;
use crate::openai::responses::ResponseSettings;
use fallow_protocol::job::ChoiceResult;

fn format() -> OutputFormat {
    OutputFormat {
        tool_parser: Some("hermes".into()),
        reasoning_parser: Some("qwen3".into()),
        ..OutputFormat::default()
    }
}

fn builder() -> ResponseBuilder {
    ResponseBuilder::new(
        Uuid::from_u128(7),
        "m".into(),
        &ResponseSettings::default(),
        &format(),
        false,
    )
}

const TEXT: &str =
    "<think>hm</think>Sure.<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}</tool_call>";

fn entries() -> Vec<StreamEntry> {
    let usage = |n| Usage {
        prompt_tokens: 5,
        completion_tokens: n,
        cached_tokens: 0,
    };
    let mut out = vec![StreamEntry {
        id: "1-0".into(),
        event: JobEvent::Started {
            attempt: 1,
            prompt_text: None,
            continues: false,
        },
    }];
    for (i, piece) in [&TEXT[..10], &TEXT[10..30], &TEXT[30..]].iter().enumerate() {
        out.push(StreamEntry {
            id: format!("1-{}", i + 1),
            event: JobEvent::Delta {
                index: 0,
                text: (*piece).to_owned(),
                token_ids: Vec::new(),
                logprobs: None,
                finish_reason: None,
                usage: usage(i as u32 + 1),
                at: None,
            },
        });
    }
    out.push(StreamEntry {
        id: "1-9".into(),
        event: JobEvent::Final {
            completion: completion(),
        },
    });
    out
}

fn completion() -> Completion {
    Completion {
        choices: vec![ChoiceResult {
            index: 0,
            text: TEXT.into(),
            finish_reason: FinishReason::Stop,
            matched_stop: None,
            logprobs: None,
            hidden_states: None,
            routed_experts: None,
        }],
        usage: Usage {
            prompt_tokens: 5,
            completion_tokens: 3,
            cached_tokens: 0,
        },
        ..Default::default()
    }
}

fn streamed() -> Vec<ResponseEvent> {
    let mut b = builder();
    entries().iter().flat_map(|e| b.on_entry(e)).collect()
}

#[test]
fn reasoning_text_and_a_call_stream_as_three_items_in_order() {
    let events = streamed();
    let kinds: Vec<&str> = events.iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.reasoning_text.delta",
            "response.reasoning_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e.sequence_number, i as u64);
        assert_eq!(e.data["sequence_number"], i as u64);
        assert_eq!(e.data["type"], e.kind);
    }
    let done = &events[events.len() - 1].data["response"];
    assert_eq!(done["output"][0]["type"], "reasoning");
    assert_eq!(done["output"][0]["content"][0]["text"], "hm");
    assert_eq!(done["output"][1]["content"][0]["text"], "Sure.");
    assert_eq!(done["output"][2]["name"], "f");
    assert_eq!(done["output"][2]["arguments"], "{\"a\": 1}");
    assert_eq!(
        done["usage"]["output_tokens_details"]["reasoning_tokens"],
        2
    );
}

#[test]
fn the_stream_is_a_function_of_the_entries_and_reads_like_the_record() {
    assert_eq!(streamed(), streamed());
    let events = streamed();
    let streamed_output = &events[events.len() - 1].data["response"]["output"];
    let whole = builder().from_completion(&completion());
    let whole = serde_json::to_value(&whole).unwrap_or_default();
    assert_eq!(&whole["output"], streamed_output);
    assert_eq!(whole["status"], "completed");
}

#[test]
fn a_length_stop_is_incomplete_and_an_error_fails() {
    let mut done = completion();
    done.choices[0].finish_reason = FinishReason::Length;
    let response = builder().from_completion(&done);
    assert_eq!(response.status, "incomplete");
    assert_eq!(
        response.incomplete_details.map(|d| d.reason),
        Some("max_output_tokens")
    );
    let failed = builder().failed("boom", "it broke");
    assert_eq!(failed.status, "failed");
    assert_eq!(failed.error.map(|e| e.code), Some("boom".to_owned()));
}

#[test]
fn an_empty_answer_still_has_a_message() {
    let mut done = completion();
    done.choices[0].text = String::new();
    let response = builder().from_completion(&done);
    assert_eq!(response.output.len(), 1);
    assert_eq!(response.output_text(), "");
}
