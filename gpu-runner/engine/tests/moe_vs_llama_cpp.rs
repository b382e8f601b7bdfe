//! The tiny MoE checkpoints converted to GGUF by llama.cpp's own converter
//! (`convert_hf_to_gguf.py`: qwen3moe, qwen2moe, llama-with-experts, gpt-oss), run by Fallow
//! and compared with llama.cpp's logits on the same files (`llama_cpp.json`, written by
//! `scripts/make_moe_gguf_fixtures.py`): stacked `ffn_*_exps` tensors, the router, Mixtral's
//! permuted Q/K rows, the Q8_0 and MXFP4 expert kernels, and gpt-oss's sinks, biases,
//! sliding window and YaRN as ggml computes them, at every position.

use std::collections::BTreeMap;
use std::path::PathBuf;

use fallow_engine::backend::cpu::{CpuBackend, KvDtype};
use fallow_engine::backend::{Backend, LogitsMode, SeqSlice};
use fallow_engine::model;
use serde::Deserialize;

const BLOCK_SIZE: usize = 16;

#[derive(Deserialize)]
struct LlamaCpp {
    sequences: Vec<Vec<u32>>,
    /// GGUF file name → per sequence, per position, the logits.
    logits: BTreeMap<String, Vec<Vec<Vec<f32>>>>,
}

fn dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tiny")
        .join(name)
}

fn load<T: serde::de::DeserializeOwned>(path: PathBuf) -> T {
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path:?}: {e}"))
}

/// Fallow's logits at every position of every sequence of `name`'s `llama_cpp.json`,
/// running `gguf` as llama.cpp did (f32 KV cache).
fn fallow_logits(name: &str, gguf: &str) -> Vec<Vec<Vec<f32>>> {
    let reference: LlamaCpp = load(dir(name).join("llama_cpp.json"));
    let mut artifacts =
        model::open(&dir(name).join(gguf)).unwrap_or_else(|e| panic!("{name}/{gguf}: {e}"));
    assert!(artifacts.config.moe.is_some(), "{name}/{gguf} loads as MoE");
    artifacts.use_cpu_layout();
    let vocab = artifacts.config.vocab_size;
    reference
        .sequences
        .iter()
        .map(|tokens| {
            let mut backend = CpuBackend::with_kv_dtype(&artifacts, 4, BLOCK_SIZE, KvDtype::F32)
                .unwrap_or_else(|e| panic!("backend: {e}"));
            let got = backend
                .forward(&[SeqSlice {
                    adapter: None,
                    tokens,
                    start_pos: 0,
                    block_table: &[0, 1],
                    logits: LogitsMode::All,
                }])
                .unwrap_or_else(|e| panic!("forward: {e}"));
            got.chunks_exact(vocab).map(<[f32]>::to_vec).collect()
        })
        .collect()
}

/// llama.cpp's logits on `gguf`.
fn llama_cpp_logits(name: &str, gguf: &str) -> Vec<Vec<Vec<f32>>> {
    let mut reference: LlamaCpp = load(dir(name).join("llama_cpp.json"));
    reference
        .logits
        .remove(gguf)
        .unwrap_or_else(|| panic!("no llama.cpp logits for {name}/{gguf}"))
}

/// The exact model's logits: transformers in f32 on the checkpoint the GGUFs came from.
fn exact_logits(name: &str) -> Vec<Vec<Vec<f32>>> {
    #[derive(Deserialize)]
    struct Transformers {
        logits: Vec<Vec<Vec<f32>>>,
    }
    load::<Transformers>(dir(name).join("reference.json")).logits
}

fn max_diff(a: &[Vec<Vec<f32>>], b: &[Vec<Vec<f32>>]) -> f32 {
    assert_eq!(a.len(), b.len(), "sequence count");
    let rows = |x: &[Vec<Vec<f32>>]| x.iter().flatten().flatten().copied().collect::<Vec<_>>();
    let (a, b) = (rows(a), rows(b));
    assert_eq!(a.len(), b.len(), "logit count");
    a.iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Largest |Δ logit| accepted between Fallow and llama.cpp on a Q8_0 or MXFP4 file: each
/// rounds activations to 8 bits its own way (Fallow keeps the block scale in f32, llama.cpp
/// in f16), measured 0.06–0.16 (Q8_0) and 0.045 (MXFP4) here, against logits up to ~5; a
/// wrong expert moves them by whole units.
const QUANTIZED_TOLERANCE: f32 = 0.25;

/// A quantized GGUF: Fallow must agree with llama.cpp on it, and be no further from the
/// exact model than llama.cpp is (weight quantization alone can flip a route: Mixtral's
/// Q8_0 file moves both engines 1.5 logits from transformers, the same way).
fn assert_quantized_agrees(name: &str, gguf: &str) {
    let (fallow, llama, exact) = (
        fallow_logits(name, gguf),
        llama_cpp_logits(name, gguf),
        exact_logits(name),
    );
    let noise = max_diff(&llama, &exact);
    let (to_exact, to_llama) = (max_diff(&fallow, &exact), max_diff(&fallow, &llama));
    eprintln!(
        "{name}/{gguf}: |llama.cpp − exact| {noise}, |fallow − exact| {to_exact}, \
         |fallow − llama.cpp| {to_llama}"
    );
    assert!(
        to_exact <= 1.25 * noise,
        "fallow {to_exact} from exact, llama.cpp {noise}"
    );
    assert!(
        to_llama <= QUANTIZED_TOLERANCE,
        "fallow {to_llama} from llama.cpp"
    );
}

#[test]
fn qwen3moe_f32_gguf_matches_llama_cpp_at_every_position() {
    // Both compute in f32 from the same weights: only summation order differs.
    let got = fallow_logits("qwen3_moe", "model.f32.gguf");
    let diff = max_diff(&got, &llama_cpp_logits("qwen3_moe", "model.f32.gguf"));
    assert!(diff <= 1e-3, "max |Δ logit| {diff}");
}

#[test]
fn qwen2moe_f32_gguf_with_its_shared_expert_matches_llama_cpp_at_every_position() {
    let got = fallow_logits("qwen2_moe", "model.f32.gguf");
    let diff = max_diff(&got, &llama_cpp_logits("qwen2_moe", "model.f32.gguf"));
    assert!(diff <= 1e-3, "max |Δ logit| {diff}");
}

#[test]
fn gpt_oss_f32_gguf_with_sinks_yarn_and_biased_experts_matches_llama_cpp_at_every_position() {
    let got = fallow_logits("gpt_oss", "model.f32.gguf");
    let diff = max_diff(&got, &llama_cpp_logits("gpt_oss", "model.f32.gguf"));
    eprintln!("gpt_oss/model.f32.gguf: |fallow − llama.cpp| {diff}");
    assert!(diff <= 1e-3, "max |Δ logit| {diff}");
}

#[test]
fn qwen3moe_q8_0_gguf_agrees_with_llama_cpp_within_quantization_noise() {
    assert_quantized_agrees("qwen3_moe", "model.q8_0.gguf");
}

#[test]
fn mixtral_q8_0_gguf_agrees_with_llama_cpp_within_quantization_noise() {
    assert_quantized_agrees("mixtral", "model.q8_0.gguf");
}

/// The experts are the checkpoint's own MXFP4 weights, repacked losslessly; what moves
/// both engines from transformers (3.75 for llama.cpp) is rounding activations to 8 bits,
/// which this fixture amplifies, so the check is that Fallow rounds as llama.cpp does.
#[test]
fn gpt_oss_mxfp4_gguf_agrees_with_llama_cpp_within_activation_rounding() {
    assert_quantized_agrees("gpt_oss_mxfp4", "model.mxfp4.gguf");
}
