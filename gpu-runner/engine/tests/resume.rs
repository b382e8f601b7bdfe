//! Resuming on the real model: a request continued from the first `k` tokens an earlier
//! attempt generated (a job handed back by a preempted runner) gives the client exactly
//! what an uninterrupted run gives: the same tokens and, joined to the text it had already
//! streamed, the same text. Each case runs once uninterrupted, then in a fresh engine with
//! the first `k` tokens of each choice as its `resume`.
//!
//! Needs `models/SmolLM2-135M-Instruct.Q4_1.gguf` (git-ignored); skips with a message when
//! it is absent. `FALLOW_TEST_MODEL` points elsewhere.

mod common;

use std::path::{Path, PathBuf};

use fallow_engine::llm::{EngineRequest, LlmEngine, Resume, ResumeChoice, SeqOutput};
use fallow_engine::runtime::{load, LoadOptions};
use fallow_protocol::job::{Constraint, FinishReason, Sampling};

fn model_path() -> Option<PathBuf> {
    match std::env::var_os("FALLOW_TEST_MODEL") {
        Some(path) => Some(PathBuf::from(path)),
        None => common::model_file("SmolLM2-135M-Instruct.Q4_1.gguf"),
    }
}

/// A fresh engine for the model.
fn engine(path: &Path) -> LlmEngine {
    let options = LoadOptions {
        kv_cache_bytes: 32 << 20,
        block_size: 16,
        enable_prefix_cache: true,
        ..LoadOptions::default()
    };
    load(path, &options).expect("model loads").engine
}

fn prompt(engine: &LlmEngine, text: &str) -> Vec<u32> {
    engine
        .tokenizer()
        .encode(text, false)
        .expect("prompt encodes")
}

fn run(engine: &mut LlmEngine, request: EngineRequest) -> Vec<SeqOutput> {
    engine.add_request(request).expect("request accepted");
    let mut outputs = Vec::new();
    while engine.has_work() {
        outputs.extend(engine.step().expect("step runs"));
    }
    outputs
}

/// Every output of choice `index`, in order.
fn outputs_of(outputs: &[SeqOutput], index: u32) -> Vec<&SeqOutput> {
    outputs.iter().filter(|o| o.index == index).collect()
}

fn tokens_of(outputs: &[&SeqOutput]) -> Vec<u32> {
    outputs.iter().flat_map(|o| o.token_ids.clone()).collect()
}

fn text_of(outputs: &[&SeqOutput]) -> String {
    outputs.iter().map(|o| o.text.as_str()).collect()
}

/// What the client had of each choice after `k` of its outputs.
fn progress_after(outputs: &[SeqOutput], n: u32, k: usize) -> Resume {
    let choices = (0..n)
        .map(|index| {
            let seen: Vec<&SeqOutput> = outputs_of(outputs, index).into_iter().take(k).collect();
            ResumeChoice {
                tokens: tokens_of(&seen),
                finished: seen.last().is_some_and(|o| o.finish.is_some()),
            }
        })
        .collect();
    Resume { choices }
}

/// Runs `request` uninterrupted and then resumed after each of `ks`, checking that the
/// client sees the same either way; returns the uninterrupted outputs.
fn assert_resumes_identically(
    path: &Path,
    request: &EngineRequest,
    ks: &[usize],
) -> Vec<SeqOutput> {
    let whole = run(&mut engine(path), request.clone());
    for &k in ks {
        let resume = progress_after(&whole, request.n, k);
        let resumed = run(
            &mut engine(path),
            EngineRequest {
                resume: Some(resume.clone()),
                ..request.clone()
            },
        );
        for index in 0..request.n {
            let before = outputs_of(&whole, index);
            let after = outputs_of(&resumed, index);
            if resume.choices[index as usize].finished {
                assert!(after.is_empty(), "finished choice {index} ran again");
                continue;
            }
            let seen = &before[..k];
            let tokens: Vec<u32> = tokens_of(seen)
                .into_iter()
                .chain(tokens_of(&after))
                .collect();
            assert_eq!(
                tokens,
                tokens_of(&before),
                "choice {index} resumed after {k}"
            );
            let text = text_of(seen) + &text_of(&after);
            assert_eq!(text, text_of(&before), "choice {index} resumed after {k}");
            assert_eq!(
                after.last().map(|o| o.finish),
                before.last().map(|o| o.finish)
            );
        }
        let completion = |o: &[SeqOutput]| o.last().map(|o| o.usage.completion_tokens);
        assert_eq!(
            completion(&resumed),
            completion(&whole),
            "resumed after {k}"
        );
    }
    whole
}

fn request(id: u64, prompt: Vec<u32>, sampling: Sampling, n: u32) -> EngineRequest {
    EngineRequest {
        adapter: None,
        id,
        prompt,
        sampling,
        n,
        priority: 0,
        resume: None,
    }
}

#[test]
fn a_greedy_request_resumed_after_k_tokens_gives_the_uninterrupted_tokens_and_text() {
    let Some(path) = model_path() else { return };
    let sampling = Sampling {
        temperature: 0.0,
        max_tokens: Some(24),
        ignore_eos: true,
        ..Sampling::default()
    };
    let prompt = prompt(&engine(&path), "Once upon a time, in a small village,");
    let r = request(1, prompt, sampling, 1);
    assert_resumes_identically(&path, &r, &[1, 5, 17]);
}

#[test]
fn a_seeded_request_with_penalties_resumed_after_k_tokens_gives_the_same_tokens() {
    let Some(path) = model_path() else { return };
    let sampling = Sampling {
        temperature: 1.0,
        top_p: 0.9,
        seed: Some(2024),
        repetition_penalty: 1.2,
        frequency_penalty: 0.4,
        max_tokens: Some(20),
        ignore_eos: true,
        ..Sampling::default()
    };
    let prompt = prompt(&engine(&path), "List some fruits:");
    let r = request(1, prompt, sampling, 1);
    assert_resumes_identically(&path, &r, &[1, 7, 13]);
}

#[test]
fn two_seeded_choices_resume_with_one_finished_and_one_going_on() {
    let Some(path) = model_path() else { return };
    let e = engine(&path);
    // Choice 0 gets at most 3 tokens by a stop on a common token; both are seeded, and the
    // test asks for k where exactly one has finished.
    let newline = prompt(&e, "\n");
    let sampling = Sampling {
        temperature: 1.0,
        seed: Some(7),
        max_tokens: Some(16),
        stop_token_ids: newline.clone(),
        ..Sampling::default()
    };
    let r = request(1, prompt(&e, "Name a colour."), sampling, 2);
    let whole = run(&mut engine(&path), r.clone());
    let lengths = [outputs_of(&whole, 0).len(), outputs_of(&whole, 1).len()];
    let k = lengths[0].min(lengths[1]);
    assert_ne!(lengths[0], lengths[1], "the seed ends one choice first");
    let resume = progress_after(&whole, 2, k);
    assert_eq!(
        resume.choices.iter().filter(|c| c.finished).count(),
        1,
        "{resume:?}"
    );
    assert_resumes_identically(&path, &r, &[k]);
}

#[test]
fn a_json_schema_request_resumed_mid_object_stays_valid_and_identical() {
    let Some(path) = model_path() else { return };
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer"},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 2}
        },
        "required": ["name", "age", "tags"],
        "additionalProperties": false
    });
    let sampling = Sampling {
        temperature: 0.7,
        seed: Some(3),
        max_tokens: Some(60),
        constraint: Some(Constraint::JsonSchema {
            schema,
            strict: true,
        }),
        ..Sampling::default()
    };
    let prompt = prompt(&engine(&path), "A person as JSON:");
    let r = request(1, prompt, sampling, 1);
    let whole = assert_resumes_identically(&path, &r, &[2, 9]);
    let all = outputs_of(&whole, 0);
    assert_eq!(all.last().and_then(|o| o.finish), Some(FinishReason::Stop));
    let value: serde_json::Value =
        serde_json::from_str(&text_of(&all)).expect("the output is JSON");
    assert!(value["age"].is_i64(), "{value}");
}

#[test]
fn a_resume_just_before_a_stop_string_stops_where_the_uninterrupted_run_did() {
    let Some(path) = model_path() else { return };
    let e = engine(&path);
    let greedy = Sampling {
        temperature: 0.0,
        max_tokens: Some(30),
        ignore_eos: true,
        ..Sampling::default()
    };
    let prompt = prompt(&e, "The capital of France is");
    // The uninterrupted greedy text, then a stop string taken from its middle.
    let free = run(
        &mut engine(&path),
        request(1, prompt.clone(), greedy.clone(), 1),
    );
    let text = text_of(&outputs_of(&free, 0));
    let stop: String = text
        .chars()
        .skip(text.chars().count() / 2)
        .take(4)
        .collect();
    let stopped = Sampling {
        stop: vec![stop.clone()],
        ..greedy
    };
    let r = request(2, prompt, stopped, 1);
    let whole = run(&mut engine(&path), r.clone());
    let outputs = outputs_of(&whole, 0);
    let last = outputs.last().expect("outputs");
    assert_eq!(last.matched_stop, Some(serde_json::json!(stop)));
    let k = outputs.len() - 1;
    assert_resumes_identically(&path, &r, &[k]);
    let too_far = EngineRequest {
        resume: Some(Resume {
            choices: vec![ResumeChoice {
                tokens: tokens_of(&outputs),
                finished: false,
            }],
        }),
        ..r
    };
    let err = engine(&path).add_request(too_far).expect_err("refused");
    assert!(err.to_string().contains("does not match"), "{err}");
}

#[test]
fn a_resume_between_the_bytes_of_one_character_releases_it_whole() {
    let Some(path) = model_path() else { return };
    let sampling = Sampling {
        temperature: 0.0,
        max_tokens: Some(12),
        ignore_eos: true,
        ..Sampling::default()
    };
    // SmolLM2 spells these katakana in two byte-level tokens each: the first shows nothing.
    let prompt = prompt(&engine(&path), "日本の首都は");
    let r = request(1, prompt, sampling, 1);
    let whole = run(&mut engine(&path), r.clone());
    let split: Vec<usize> = (1..whole.len())
        .filter(|&k| whole[k - 1].text.is_empty())
        .collect();
    assert!(!split.is_empty(), "some token ends mid-character");
    assert_resumes_identically(&path, &r, &split);
}
