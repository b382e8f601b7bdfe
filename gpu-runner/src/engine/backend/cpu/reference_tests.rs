//! SmolLM2-135M (Q4_1) against llama.cpp's logits in `tests/fixtures/smollm2_logits.json`:
//! along each case's greedy continuation (teacher-forced), our top-1 must match llama.cpp's
//! wherever llama.cpp's own top-2 gap is clear, and the log-probs of its top tokens must
//! agree closely. Skips with a message when the model or fixture is absent.

use std::path::Path;

use serde_json::Value;

use super::CpuBackend;
use crate::engine::backend::{Backend, LogitsMode, SeqSlice};
use crate::engine::model;

const MODEL: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../models/SmolLM2-135M-Instruct.Q4_1.gguf"
);
const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/smollm2_logits.json"
);
/// Below this top-1/top-2 logit gap, quantisation noise may legitimately flip the argmax.
const CLEAR_GAP: f64 = 0.5;
/// Per-token bound, and the bound on the mean over all compared tokens (we measure about
/// 0.08 mean, 0.48 worst: the rest is Q8 activation rounding on both sides and llama.cpp's
/// f16 KV cache).
const MAX_LOGPROB_DIFF: f64 = 0.6;
const MAX_MEAN_LOGPROB_DIFF: f64 = 0.15;
/// Tail tokens are noisier (llama.cpp's own batched vs incremental logits differ by ~0.5);
/// compare log-probs of tokens at least this likely.
const LIKELY: f64 = -4.0;

fn log_softmax(row: &[f32]) -> Vec<f64> {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = row.iter().map(|&v| (v as f64 - max).exp()).sum();
    row.iter().map(|&v| v as f64 - max - sum.ln()).collect()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_u64)
        .map(|x| x as u32)
        .collect()
}

/// Logits after the prompt and after each greedy token but the last (one row per step).
fn teacher_forced(
    b: &mut CpuBackend,
    prompt: &[u32],
    greedy: &[u32],
    vocab: usize,
) -> Vec<Vec<f32>> {
    let table: Vec<u32> = (0..b.num_blocks() as u32).collect();
    let first = SeqSlice {
        tokens: prompt,
        start_pos: 0,
        block_table: &table,
        logits: LogitsMode::Last,
    };
    let mut rows = vec![b
        .forward(&[first])
        .unwrap_or_else(|e| panic!("prompt: {e}"))];
    let rest = &greedy[..greedy.len().saturating_sub(1)];
    if !rest.is_empty() {
        let tail = SeqSlice {
            tokens: rest,
            start_pos: prompt.len(),
            block_table: &table,
            logits: LogitsMode::All,
        };
        let out = b
            .forward(&[tail])
            .unwrap_or_else(|e| panic!("continuation: {e}"));
        rows.extend(out.chunks_exact(vocab).map(<[f32]>::to_vec));
    }
    rows
}

#[test]
fn smollm2_matches_llama_cpp_along_greedy_continuations() {
    if !Path::new(MODEL).is_file() || !Path::new(FIXTURE).is_file() {
        eprintln!("skipping: {MODEL} or {FIXTURE} not present");
        return;
    }
    let text = std::fs::read_to_string(FIXTURE).unwrap_or_else(|e| panic!("fixture: {e}"));
    let fixture: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("fixture: {e}"));
    let a = model::open(Path::new(MODEL)).unwrap_or_else(|e| panic!("model: {e}"));
    let vocab = a.config.vocab_size;
    let mut b = CpuBackend::new(&a, 16, 16).unwrap_or_else(|e| panic!("backend: {e}"));
    let (mut checked, mut worst, mut sum, mut n) = (0, 0f64, 0f64, 0usize);
    for (c, case) in fixture["cases"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let rows = teacher_forced(
            &mut b,
            &ids(&case["prompt_ids"]),
            &ids(&case["greedy_ids"]),
            vocab,
        );
        for (s, (step, row)) in case["steps"]
            .as_array()
            .into_iter()
            .flatten()
            .zip(&rows)
            .enumerate()
        {
            let logp = log_softmax(row);
            for top in step["top"].as_array().into_iter().flatten() {
                let (Some(id), Some(want)) = (top[0].as_u64(), top[1].as_f64()) else {
                    continue;
                };
                if want < LIKELY {
                    continue;
                }
                let diff = (logp[id as usize] - want).abs();
                worst = worst.max(diff);
                sum += diff;
                n += 1;
                assert!(
                    diff < MAX_LOGPROB_DIFF,
                    "case {c} step {s}: token {id} logprob {} vs {want}",
                    logp[id as usize]
                );
            }
            if step["gap"].as_f64().unwrap_or(0.0) > CLEAR_GAP {
                let ours = row
                    .iter()
                    .enumerate()
                    .fold(0, |m, (i, &v)| if v > row[m] { i } else { m });
                assert_eq!(
                    ours as u64,
                    step["token"].as_u64().unwrap_or(u64::MAX),
                    "case {c} step {s}: top-1"
                );
                checked += 1;
            }
        }
    }
    eprintln!(
        "top-1 agreed on {checked} clear steps; top-token logprob diff mean {:.3}, worst {worst:.3}",
        sum / n.max(1) as f64
    );
    assert!(checked > 0);
    assert!(sum / (n.max(1) as f64) < MAX_MEAN_LOGPROB_DIFF);
}
