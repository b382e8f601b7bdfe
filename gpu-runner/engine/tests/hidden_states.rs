//! `return_hidden_states` on the real model: a choice's hidden state is the last layer's
//! state (after the final norm) at the position that produced its last token. Checked
//! against a second run whose prompt is the first run's prompt and generated tokens less the
//! last: its one-token prefill reaches the same position, so it must report the same state
//! and pick the same token.
//!
//! Needs `models/SmolLM2-135M-Instruct.Q4_1.gguf` (git-ignored); skips with a message when
//! it is absent, and fails under `CI=true`.

mod common;

use std::path::Path;

use fallow_engine::llm::{EngineRequest, LlmEngine, SeqOutput};
use fallow_engine::runtime::{load, LoadOptions};
use fallow_protocol::job::Sampling;

/// A fresh engine for the model, and the test's prompt in its tokens.
fn engine(path: &Path) -> (LlmEngine, Vec<u32>) {
    let options = LoadOptions {
        kv_cache_bytes: 32 << 20,
        block_size: 16,
        ..LoadOptions::default()
    };
    let loaded = load(path, &options).expect("model loads");
    let prompt = loaded
        .frontend
        .tokenizer
        .encode("The capital of France is", false)
        .expect("prompt encodes");
    (loaded.engine, prompt)
}

fn greedy(max_tokens: u32, hidden: bool) -> Sampling {
    Sampling {
        max_tokens: Some(max_tokens),
        temperature: 0.0,
        ignore_eos: true,
        return_hidden_states: hidden,
        ..Sampling::default()
    }
}

fn run(engine: &mut LlmEngine, requests: Vec<EngineRequest>) -> Vec<SeqOutput> {
    for request in requests {
        engine.add_request(request).expect("request accepted");
    }
    let mut outputs = Vec::new();
    while engine.has_work() {
        outputs.extend(engine.step().expect("step runs"));
    }
    outputs
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| f64::from(*x) * f64::from(*y))
        .sum();
    let norm = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b))
}

#[test]
fn a_choice_returns_the_hidden_state_that_produced_its_last_token() {
    let Some(path) = common::model_file("SmolLM2-135M-Instruct.Q4_1.gguf") else {
        return;
    };
    let (mut first, prompt) = engine(&path);
    let outputs = run(
        &mut first,
        vec![
            EngineRequest {
                adapter: None,
                id: 1,
                prompt: prompt.clone(),
                sampling: greedy(6, true),
                n: 2,
                priority: 0,
                resume: None,
            },
            EngineRequest {
                adapter: None,
                id: 2,
                prompt: prompt.clone(),
                sampling: greedy(6, false),
                n: 1,
                priority: 0,
                resume: None,
            },
        ],
    );
    let finals: Vec<&SeqOutput> = outputs.iter().filter(|o| o.finish.is_some()).collect();
    assert_eq!(finals.len(), 3, "two choices and one request end");
    let plain = finals
        .iter()
        .find(|o| o.request_id == 2)
        .expect("request 2 ends");
    assert!(
        plain.hidden_states.is_none(),
        "only a request that asks gets hidden states"
    );
    assert!(
        outputs
            .iter()
            .filter(|o| o.finish.is_none())
            .all(|o| o.hidden_states.is_none()),
        "hidden states come once, with the choice's last output"
    );
    let wanted: Vec<&&SeqOutput> = finals.iter().filter(|o| o.request_id == 1).collect();
    let hidden = wanted[0]
        .hidden_states
        .clone()
        .expect("hidden states returned");
    assert_eq!(hidden.len(), 576, "SmolLM2-135M's hidden size");
    assert_eq!(
        wanted[1].hidden_states.as_ref(),
        Some(&hidden),
        "two greedy choices of one prompt end in the same state"
    );

    let generated: Vec<u32> = outputs
        .iter()
        .filter(|o| o.request_id == 1 && o.index == 0)
        .flat_map(|o| o.token_ids.iter().copied())
        .collect();
    assert_eq!(generated.len(), 6);
    let mut replay = prompt.clone();
    replay.extend_from_slice(&generated[..5]);
    let (mut second, _) = engine(&path);
    let again = run(
        &mut second,
        vec![EngineRequest {
            adapter: None,
            id: 3,
            prompt: replay,
            sampling: greedy(1, true),
            n: 1,
            priority: 0,
            resume: None,
        }],
    );
    let last = again.last().expect("one output");
    assert_eq!(
        last.token_ids,
        vec![generated[5]],
        "the same position picks the same token"
    );
    let reference = last.hidden_states.as_ref().expect("hidden states returned");
    let similarity = cosine(&hidden, reference);
    assert!(
        similarity > 0.999,
        "decode and prefill disagree on the state: cosine {similarity}"
    );
}
