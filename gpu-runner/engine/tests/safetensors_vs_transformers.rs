//! Fallow's Hugging Face directory path (config.json + safetensors + tokenizer.json) against
//! Hugging Face transformers itself. The tiny random-weight checkpoints under
//! `tests/fixtures/tiny/` and their `reference.json` files come from
//! `scripts/make_tiny_models.py`, which saved them with transformers and recorded what
//! transformers computes on them (float32, eager attention): logits at every position of
//! three token sequences, 8 greedy tokens after each, tokenizer ids and a rendered chat
//! template.
//!
//! - `llama`: F32, untied LM head, Llama 3 RoPE scaling, transformers-5 style config.json
//!   (`rope_parameters`), BOS added by the tokenizer's post-processor.
//! - `qwen2`: BF16 weights, Q/K/V biases, tied head, transformers-4 style config.json
//!   (`rope_theta` / `rope_scaling` at the top level). Its reference is float32 transformers
//!   on the BF16 weights widened to f32, so the same 1e-3 bound applies.
//! - `qwen3`: F32 in two shards with `model.safetensors.index.json`, per-head Q/K RMSNorm.
//! - `gemma3`: F16, a sliding-window (5 tokens) layer and a global layer with their own RoPE
//!   bases (linear scaling on the global one only, nested `rope_parameters`), `(1 + w)` and
//!   sandwich norms, GELU, embedding scale, `query_pre_attn_scalar`, final logit softcap.
//!   Also widened to f32 in the reference. (No attention softcap: like the real Gemma 3
//!   configs; transformers 5's Gemma 3 attention would ignore one anyway.)
//! - `qwen3_moe`: F32, 8 experts, top-2 with renormalised weights, one matrix per expert.
//! - `mixtral`: BF16, 4 experts, top-2, Mixtral's `block_sparse_moe.experts.E.w1/w2/w3`.
//! - `qwen2_moe`: F32, 4 experts, top-2 not renormalised, a shared expert with its sigmoid
//!   gate, Q/K/V biases.
//! - `gpt_oss`: BF16, 8 biased experts stored transposed with gate and up interleaved, top-2
//!   of a biased router, the clamped SwiGLU (limit 1.5, so it bites), Q/K/V/O biases,
//!   attention sinks, a 5-token sliding window then a full layer, YaRN RoPE.
//! - `gpt_oss_mxfp4`: the same with experts of width 64 in MXFP4 blocks and scales, as the
//!   published checkpoints store them; the reference is transformers on its own
//!   dequantisation of them. Fallow repacks them into ggml's MXFP4 blocks and multiplies
//!   them by f32 activations (8-bit ones, as for a GGUF, would move these logits by 2).
//!   Their routers are scaled so that a wrong expert moves logits far past the tolerance.

use std::path::PathBuf;

use fallow_engine::backend::cpu::{CpuBackend, KvDtype};
use fallow_engine::backend::{Backend, LogitsMode, SeqSlice};
use fallow_engine::model::{
    self, Arch, ClampedSwiglu, ModelArtifacts, MoeConfig, RopeScaling, VocabSource, Yarn,
};
use fallow_engine::runtime::{load, LoadOptions};
use fallow_engine::tokenizer::Tokenizer;
use serde::Deserialize;

/// Largest |Δ logit| accepted. Both sides compute in f32 on the same weights; what is left
/// is summation order (~1e-5 here) and the 4-decimal rounding of the reference (5e-5).
const TOLERANCE: f32 = 1e-3;
/// Small blocks so every sequence spans several of them.
const BLOCK_SIZE: usize = 4;
const NUM_BLOCKS: usize = 64;

#[derive(Deserialize)]
struct Reference {
    vocab_size: usize,
    sequences: Vec<Vec<u32>>,
    /// Per sequence, per position, `vocab_size` logits.
    logits: Vec<Vec<Vec<f32>>>,
    greedy: Vec<Vec<u32>>,
    encode: Vec<Encoded>,
    chat: Chat,
}

#[derive(Deserialize)]
struct Encoded {
    text: String,
    ids: Vec<u32>,
}

#[derive(Deserialize)]
struct Chat {
    messages: Vec<serde_json::Value>,
    add_generation_prompt: bool,
    rendered: String,
}

const MODELS: [&str; 9] = [
    "llama",
    "qwen2",
    "qwen3",
    "gemma3",
    "qwen3_moe",
    "mixtral",
    "qwen2_moe",
    "gpt_oss",
    "gpt_oss_mxfp4",
];

fn model_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tiny")
        .join(name)
}

fn reference(name: &str) -> Reference {
    let path = model_dir(name).join("reference.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
}

fn open(name: &str) -> ModelArtifacts {
    model::open(&model_dir(name)).unwrap_or_else(|e| panic!("{name}: open failed: {e}"))
}

/// An f32 KV cache: transformers computes in f32 throughout, and the default f16 cache
/// (llama.cpp's numerics) alone moves these logits by ~1e-2, past `TOLERANCE`.
fn backend(name: &str, artifacts: &ModelArtifacts) -> CpuBackend {
    CpuBackend::with_kv_dtype(artifacts, NUM_BLOCKS, BLOCK_SIZE, KvDtype::F32)
        .unwrap_or_else(|e| panic!("{name}: backend failed: {e}"))
}

/// Block ids `first ..` enough for `len` tokens.
fn blocks(first: u32, len: usize) -> Vec<u32> {
    (first..first + len.div_ceil(BLOCK_SIZE) as u32).collect()
}

/// The largest |Δ| between Fallow's rows and the reference rows, with where it occurred.
fn max_diff(got: &[f32], want: &[Vec<f32>], vocab: usize) -> (f32, usize, usize) {
    assert_eq!(got.len(), want.len() * vocab, "logit row count");
    let mut worst = (0f32, 0, 0);
    for (pos, (g_row, w_row)) in got.chunks_exact(vocab).zip(want).enumerate() {
        for (tok, (g, w)) in g_row.iter().zip(w_row).enumerate() {
            let d = (g - w).abs();
            if d > worst.0 || d.is_nan() {
                worst = (d, pos, tok);
            }
        }
    }
    worst
}

fn assert_logits_match(name: &str) {
    let reference = reference(name);
    let artifacts = open(name);
    let vocab = artifacts.config.vocab_size;
    assert_eq!(vocab, reference.vocab_size, "{name}: vocab size");
    for (i, (tokens, want)) in reference
        .sequences
        .iter()
        .zip(&reference.logits)
        .enumerate()
    {
        // A fresh backend per sequence: nothing from an earlier run can leak in.
        let mut backend = backend(name, &artifacts);
        let table = blocks(0, tokens.len());
        let got = backend
            .forward(&[SeqSlice {
                adapter: None,
                tokens,
                start_pos: 0,
                block_table: &table,
                logits: LogitsMode::All,
            }])
            .unwrap_or_else(|e| panic!("{name}: forward failed: {e}"));
        let (diff, pos, tok) = max_diff(&got, want, vocab);
        eprintln!("{name} sequence {i}: max |Δ logit| {diff}");
        assert!(
            diff <= TOLERANCE,
            "{name} sequence {i}: max |Δ logit| {diff} at position {pos}, token {tok} \
             (fallow {}, transformers {})",
            got[pos * vocab + tok],
            want[pos][tok]
        );
    }
}

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in row.iter().enumerate() {
        if *v > row[best] {
            best = i;
        }
    }
    best as u32
}

/// Prefill, then one token per step through the paged KV cache, always taking the argmax.
fn greedy(backend: &mut CpuBackend, prompt: &[u32], n: usize) -> Vec<u32> {
    let table = blocks(0, prompt.len() + n);
    let mut out = Vec::with_capacity(n);
    let mut step: Vec<u32> = prompt.to_vec();
    let mut start_pos = 0;
    for _ in 0..n {
        let logits = backend
            .forward(&[SeqSlice {
                adapter: None,
                tokens: &step,
                start_pos,
                block_table: &table,
                logits: LogitsMode::Last,
            }])
            .unwrap_or_else(|e| panic!("forward failed: {e}"));
        let next = argmax(&logits);
        out.push(next);
        start_pos += step.len();
        step = vec![next];
    }
    out
}

fn assert_greedy_matches(name: &str) {
    let reference = reference(name);
    let artifacts = open(name);
    for (prompt, want) in reference.sequences.iter().zip(&reference.greedy) {
        let mut backend = backend(name, &artifacts);
        let got = greedy(&mut backend, prompt, want.len());
        assert_eq!(&got, want, "{name}: greedy continuation of {prompt:?}");
    }
}

#[test]
fn llama_with_llama3_rope_scaling_matches_transformers_logits_at_every_position() {
    assert_logits_match("llama");
}

#[test]
fn bf16_qwen2_with_qkv_bias_matches_transformers_logits_at_every_position() {
    assert_logits_match("qwen2");
}

#[test]
fn sharded_qwen3_with_qk_norm_matches_transformers_logits_at_every_position() {
    assert_logits_match("qwen3");
}

#[test]
fn f16_gemma3_with_sliding_window_and_logit_softcap_matches_transformers_logits_at_every_position()
{
    assert_logits_match("gemma3");
}

#[test]
fn qwen3_moe_matches_transformers_logits_at_every_position() {
    assert_logits_match("qwen3_moe");
}

#[test]
fn qwen2_moe_with_a_gated_shared_expert_matches_transformers_logits_at_every_position() {
    assert_logits_match("qwen2_moe");
}

#[test]
fn bf16_mixtral_matches_transformers_logits_at_every_position() {
    assert_logits_match("mixtral");
}

#[test]
fn bf16_gpt_oss_with_sinks_yarn_and_biased_clamped_experts_matches_transformers_logits_at_every_position(
) {
    assert_logits_match("gpt_oss");
}

#[test]
fn gpt_oss_with_mxfp4_experts_matches_transformers_logits_at_every_position() {
    assert_logits_match("gpt_oss_mxfp4");
}

#[test]
fn greedy_decoding_through_the_kv_cache_picks_the_tokens_transformers_picks() {
    for name in MODELS {
        assert_greedy_matches(name);
    }
}

#[test]
fn all_sequences_in_one_batch_match_transformers_as_when_run_alone() {
    for name in MODELS {
        let reference = reference(name);
        let artifacts = open(name);
        let vocab = artifacts.config.vocab_size;
        let mut backend = backend(name, &artifacts);
        let mut next_block = 0;
        let tables: Vec<Vec<u32>> = reference
            .sequences
            .iter()
            .map(|s| {
                let t = blocks(next_block, s.len());
                next_block += t.len() as u32;
                t
            })
            .collect();
        let batch: Vec<SeqSlice<'_>> = reference
            .sequences
            .iter()
            .zip(&tables)
            .map(|(tokens, table)| SeqSlice {
                adapter: None,
                tokens,
                start_pos: 0,
                block_table: table,
                logits: LogitsMode::All,
            })
            .collect();
        let got = backend
            .forward(&batch)
            .unwrap_or_else(|e| panic!("{name}: forward failed: {e}"));
        let want: Vec<Vec<f32>> = reference.logits.iter().flatten().cloned().collect();
        let (diff, row, tok) = max_diff(&got, &want, vocab);
        assert!(
            diff <= TOLERANCE,
            "{name}: batched max |Δ logit| {diff} at row {row}, token {tok}"
        );
    }
}

#[test]
fn prefill_in_chunks_across_block_boundaries_matches_transformers() {
    // 5-token chunks over 4-token blocks: chunks start mid-block and attend to cached K/V.
    const CHUNK: usize = 5;
    for name in MODELS {
        let reference = reference(name);
        let artifacts = open(name);
        let vocab = artifacts.config.vocab_size;
        for (tokens, want) in reference.sequences.iter().zip(&reference.logits) {
            let mut backend = backend(name, &artifacts);
            let table = blocks(0, tokens.len());
            let mut got = Vec::with_capacity(tokens.len() * vocab);
            for (c, chunk) in tokens.chunks(CHUNK).enumerate() {
                let rows = backend
                    .forward(&[SeqSlice {
                        adapter: None,
                        tokens: chunk,
                        start_pos: c * CHUNK,
                        block_table: &table,
                        logits: LogitsMode::All,
                    }])
                    .unwrap_or_else(|e| panic!("{name}: forward failed: {e}"));
                got.extend(rows);
            }
            let (diff, pos, tok) = max_diff(&got, want, vocab);
            assert!(
                diff <= TOLERANCE,
                "{name}: chunked max |Δ logit| {diff} at position {pos}, token {tok}"
            );
        }
    }
}

#[test]
fn config_json_is_read_into_the_architecture_transformers_built() {
    let llama = open("llama").config;
    assert_eq!(llama.arch, Arch::Llama);
    assert!(!llama.tie_embeddings, "llama has its own lm_head.weight");
    assert_eq!(llama.rope_theta, 500_000.0, "llama rope_theta");
    assert!(
        matches!(
            llama.rope_scaling,
            RopeScaling::Llama3 { factor, original_context: 32, .. } if factor == 8.0
        ),
        "llama rope scaling: {:?}",
        llama.rope_scaling
    );

    let qwen2 = open("qwen2").config;
    assert_eq!(qwen2.arch, Arch::Qwen2);
    assert!(qwen2.qkv_bias && !qwen2.qk_norm && qwen2.tie_embeddings);
    assert_eq!(qwen2.rope_theta, 1_000_000.0, "qwen2 rope_theta");

    let qwen3 = open("qwen3").config;
    assert_eq!(qwen3.arch, Arch::Qwen3);
    assert!(qwen3.qk_norm && !qwen3.qkv_bias && qwen3.tie_embeddings);
    assert_eq!(qwen3.rope_theta, 1_000_000.0, "qwen3 rope_theta");

    let gemma3 = open("gemma3").config;
    assert_eq!(gemma3.arch, Arch::Gemma3);
    assert_eq!(gemma3.sliding_window, Some(5));
    assert_eq!(gemma3.local_layers, vec![true, false]);
    assert_eq!(gemma3.rope_theta, 1_000_000.0, "gemma3 global rope_theta");
    assert_eq!(gemma3.rope_theta_local, 10_000.0, "gemma3 local rope_theta");
    assert_eq!(gemma3.rope_scaling, RopeScaling::Linear { factor: 8.0 });
    assert!((gemma3.attn_scale - 32f32.powf(-0.5)).abs() < 1e-7);
    assert_eq!(gemma3.attn_logit_softcap, None);
    assert_eq!(gemma3.final_logit_softcap, Some(30.0));

    let qwen3_moe = open("qwen3_moe").config;
    assert_eq!(qwen3_moe.arch, Arch::Qwen3);
    assert_eq!(
        qwen3_moe.moe,
        Some(MoeConfig {
            n_experts: 8,
            top_k: 2,
            expert_ffn: 32,
            norm_topk: true,
            sparse_layers: vec![true; 2],
            shared_ffn: None,
            clamped_swiglu: None,
        })
    );
    let mixtral = open("mixtral").config;
    assert_eq!(mixtral.arch, Arch::Llama);
    assert_eq!(mixtral.sliding_window, None);
    assert_eq!(
        mixtral.moe,
        Some(MoeConfig {
            n_experts: 4,
            top_k: 2,
            expert_ffn: 128,
            norm_topk: true,
            sparse_layers: vec![true; 2],
            shared_ffn: None,
            clamped_swiglu: None,
        })
    );

    let qwen2_moe = open("qwen2_moe").config;
    assert_eq!(qwen2_moe.arch, Arch::Qwen2);
    assert!(qwen2_moe.qkv_bias);
    assert_eq!(
        qwen2_moe.moe,
        Some(MoeConfig {
            n_experts: 4,
            top_k: 2,
            expert_ffn: 32,
            norm_topk: false,
            sparse_layers: vec![true; 2],
            shared_ffn: Some(64),
            clamped_swiglu: None,
        })
    );

    let gpt_oss = open("gpt_oss").config;
    assert_eq!(gpt_oss.arch, Arch::GptOss);
    assert!(gpt_oss.qkv_bias && gpt_oss.o_bias && gpt_oss.attn_sinks);
    assert_eq!(gpt_oss.sliding_window, Some(5));
    assert_eq!(gpt_oss.local_layers, vec![true, false]);
    assert_eq!(gpt_oss.rope_theta, 150_000.0, "gpt_oss rope_theta");
    assert_eq!(
        gpt_oss.rope_scaling,
        RopeScaling::Yarn(Yarn {
            factor: 32.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            original_context: 4096,
            truncate: false,
            attention_factor: 1.0 + 0.1 * 32f64.ln() as f32,
        })
    );
    assert_eq!(
        gpt_oss.moe,
        Some(MoeConfig {
            n_experts: 8,
            top_k: 2,
            expert_ffn: 32,
            norm_topk: true,
            sparse_layers: vec![true; 2],
            shared_ffn: None,
            clamped_swiglu: Some(ClampedSwiglu {
                alpha: 1.702,
                limit: 1.5
            }),
        })
    );

    for name in MODELS {
        let c = open(name).config;
        let shape = (
            c.n_layers,
            c.hidden,
            c.n_heads,
            c.n_kv_heads,
            c.head_dim,
            c.ffn,
        );
        // gpt-oss's `intermediate_size` is its experts' width.
        let ffn = match name {
            "gpt_oss" => 32,
            "gpt_oss_mxfp4" => 64,
            _ => 128,
        };
        assert_eq!(shape, (2, 64, 4, 2, 16, ffn), "{name}: shape");
        assert!((c.rms_eps - 1e-5).abs() < 1e-9, "{name}: rms_norm_eps");
    }
}

#[test]
fn end_of_generation_ids_come_from_config_and_generation_config() {
    for name in MODELS {
        let eos = open(name).eos_ids;
        assert!(
            eos.contains(&2) && eos.contains(&0),
            "{name}: eos ids {eos:?}"
        );
    }
}

#[test]
fn tokenizer_json_encodes_every_text_as_transformers_does() {
    for name in MODELS {
        let reference = reference(name);
        let dir = model_dir(name);
        let config = dir.join("tokenizer_config.json");
        let tokenizer = Tokenizer::from_files(&dir.join("tokenizer.json"), Some(&config))
            .unwrap_or_else(|e| panic!("{name}: tokenizer failed: {e}"));
        assert_eq!(
            tokenizer.vocab_size(),
            reference.vocab_size,
            "{name}: vocab"
        );
        for case in &reference.encode {
            let ids = tokenizer
                .encode(&case.text, tokenizer.add_bos_by_default())
                .unwrap_or_else(|e| panic!("{name}: encode failed: {e}"));
            assert_eq!(ids, case.ids, "{name}: ids of {:?}", case.text);
            let bos = usize::from(tokenizer.add_bos_by_default());
            assert_eq!(
                tokenizer.decode(&ids[bos..], false),
                case.text,
                "{name}: round trip"
            );
        }
    }
}

#[test]
fn model_directory_loads_end_to_end_and_renders_the_chat_template_like_transformers() {
    for name in MODELS {
        let reference = reference(name);
        let artifacts = open(name);
        assert!(
            matches!(artifacts.vocab, VocabSource::TokenizerJson { .. }),
            "{name}: vocabulary should come from tokenizer.json"
        );
        assert!(artifacts.chat_template.is_some(), "{name}: chat template");

        let loaded = load(&model_dir(name), &LoadOptions::default())
            .unwrap_or_else(|e| panic!("{name}: load failed: {e}"));
        let frontend = &loaded.frontend;
        let rendered = frontend
            .template
            .render(
                &reference.chat.messages,
                reference.chat.add_generation_prompt,
                None,
                &serde_json::Map::new(),
                false,
            )
            .unwrap_or_else(|e| panic!("{name}: render failed: {e}"));
        assert_eq!(rendered, reference.chat.rendered, "{name}: rendered chat");
        // The template writes BOS itself when the model has one; it must not be doubled.
        let ids = frontend
            .tokenizer
            .encode_prompt(&rendered)
            .unwrap_or_else(|e| panic!("{name}: encode failed: {e}"));
        let bos = frontend.tokenizer.bos_id();
        let n_bos = ids.iter().filter(|&&id| Some(id) == bos).count();
        assert_eq!(
            n_bos,
            usize::from(bos.is_some()),
            "{name}: BOS count in {ids:?}"
        );
    }
}
