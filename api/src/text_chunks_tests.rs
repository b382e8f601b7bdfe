use super::*;
use crate::validate::Delivery;
use fallow_protocol::job::{FinishReason, GenerateRequest};

fn valid(prompts: usize, n: u32, echo: bool, include_usage: bool) -> ValidCompletion {
    let job: GenerateRequest =
        serde_json::from_value(serde_json::json!({"model": "m", "messages": [],
            "sampling": serde_json::to_value(fallow_protocol::job::Sampling::default()).unwrap_or_default(),
            "n": n, "add_generation_prompt": false, "continue_final_message": false}))
        .unwrap_or_else(|e| panic!("{e}"));
    ValidCompletion {
        shared: job,
        prompts: vec![fallow_protocol::job::Prompt::Messages; prompts],
        prompt_texts: (0..prompts).map(|p| Some(format!("P{p}"))).collect(),
        n,
        echo,
        logprobs: None,
        delivery: Delivery {
            stream: true,
            include_usage,
            continuous_usage: false,
        },
        priority: 0,
    }
}

fn delta(index: u32, text: &str, finish: Option<FinishReason>) -> JobEvent {
    JobEvent::Delta {
        index,
        text: text.into(),
        token_ids: Vec::new(),
        logprobs: None,
        finish_reason: finish,
        usage: Usage::default(),
        at: None,
    }
}

fn final_event(texts: &[&str]) -> JobEvent {
    let usage = Usage {
        prompt_tokens: 2,
        completion_tokens: 1,
        cached_tokens: 0,
    };
    JobEvent::Final {
        completion: crate::test_support::completion(texts, usage),
    }
}

/// `(index, text, finish_reason)` of each chunk choice.
fn choices(frames: &[TextFrame]) -> Vec<(u32, String, Option<&'static str>)> {
    frames
        .iter()
        .filter_map(|f| match f {
            TextFrame::Chunk(c) => Some(&c.choices),
            _ => None,
        })
        .flatten()
        .map(|c| (c.index, c.text.clone(), c.finish_reason))
        .collect()
}

#[test]
fn choices_are_numbered_prompt_major_then_n() {
    let mut b = TextChunkBuilder::new("cmpl-x".into(), 0, "m".into(), &valid(2, 2, false, false));
    let mut frames = b.on_event(1, &delta(1, "d", None));
    frames.extend(b.on_event(0, &delta(1, "b", None)));
    assert_eq!(
        choices(&frames),
        vec![(3, "d".into(), None), (1, "b".into(), None)]
    );
}

#[test]
fn echo_comes_first_once_per_choice() {
    let mut b = TextChunkBuilder::new("cmpl-x".into(), 0, "m".into(), &valid(1, 2, true, false));
    let mut frames = b.on_event(0, &delta(0, "a", None));
    frames.extend(b.on_event(0, &delta(0, "b", Some(FinishReason::Stop))));
    frames.extend(b.on_event(0, &delta(1, "c", Some(FinishReason::Stop))));
    assert_eq!(
        choices(&frames),
        vec![
            (0, "P0".into(), None),
            (0, "a".into(), None),
            (0, "b".into(), Some("stop")),
            (1, "P0".into(), None),
            (1, "c".into(), Some("stop")),
        ]
    );
}

#[test]
fn a_final_sends_only_missed_text_and_the_usage_comes_after_every_job() {
    let mut b = TextChunkBuilder::new("cmpl-x".into(), 0, "m".into(), &valid(2, 1, false, true));
    let mut frames = b.on_event(0, &delta(0, "ab", None));
    frames.extend(b.on_event(0, &final_event(&["abc"])));
    assert!(!b.is_done());
    frames.extend(b.on_event(1, &final_event(&["xy"])));
    assert!(b.is_done());
    assert_eq!(
        choices(&frames),
        vec![
            (0, "ab".into(), None),
            (0, "c".into(), Some("stop")),
            (1, "xy".into(), Some("stop")),
        ]
    );
    let Some(TextFrame::Chunk(last)) = frames.last() else {
        panic!("no usage chunk");
    };
    assert!(last.choices.is_empty());
    assert_eq!(last.usage.as_ref().map(|u| u.prompt_tokens), Some(4));
}

#[test]
fn an_error_ends_the_stream() {
    let mut b = TextChunkBuilder::new("cmpl-x".into(), 0, "m".into(), &valid(2, 1, false, false));
    let frames = b.on_event(
        1,
        &JobEvent::Error {
            code: "invalid_request".into(),
            message: "bad".into(),
        },
    );
    assert!(matches!(frames.as_slice(), [TextFrame::Error(_)]));
    assert!(b.is_done());
    assert!(b.on_event(0, &delta(0, "late", None)).is_empty());
}

#[test]
fn legacy_logprobs_carry_offsets_and_the_sampled_token() {
    use fallow_protocol::job::{TokenLogprob, TopLogprob};
    let entry = |token: &str, alt: &str| TokenLogprob {
        token: token.into(),
        logprob: -0.5,
        bytes: token.as_bytes().to_vec(),
        top_logprobs: vec![TopLogprob {
            token: alt.into(),
            logprob: -0.1,
            bytes: Vec::new(),
        }],
    };
    let mut lp = LegacyLogprobs::default();
    let end = lp.extend(&[entry("é", "x"), entry("ab", "ab")], 3);
    assert_eq!(end, 6);
    assert_eq!(lp.text_offset, vec![3, 4]);
    assert_eq!(lp.top_logprobs[0].len(), 2);
    assert_eq!(lp.top_logprobs[1].len(), 1);
}

#[test]
fn a_hole_in_a_jobs_stream_is_filled_from_its_final_record_with_nothing_repeated() {
    let at = |tokens, bytes| Some(fallow_protocol::position::ChoicePosition { tokens, bytes });
    let placed = |text: &str, tokens, bytes| {
        let mut event = delta(0, text, None);
        if let JobEvent::Delta {
            token_ids, at: a, ..
        } = &mut event
        {
            *token_ids = vec![1];
            *a = at(tokens, bytes);
        }
        event
    };
    let mut b = TextChunkBuilder::new("cmpl-x".into(), 0, "m".into(), &valid(2, 1, false, false));
    let mut frames = b.on_event(0, &placed("ab", 0, 0));
    // Lost: job 0's "cd" at (1, 2).
    frames.extend(b.on_event(0, &placed("ef", 2, 4)));
    frames.extend(b.on_event(1, &placed("xy", 0, 0)));
    frames.extend(b.on_event(0, &final_event(&["abcdef"])));
    frames.extend(b.on_event(1, &final_event(&["xy"])));
    assert_eq!(
        choices(&frames),
        vec![
            (0, "ab".into(), None),
            (1, "xy".into(), None),
            (0, "cdef".into(), Some("stop")),
            (1, "".into(), Some("stop")),
        ]
    );
}
