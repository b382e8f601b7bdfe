//! LoRA adapters against Hugging Face PEFT itself. The adapters under
//! `tests/fixtures/tiny/lora/` are random PEFT adapters over the tiny Llama, Qwen3 and Gemma 3
//! checkpoints, with the logits transformers + peft compute through them
//! (`scripts/make_lora_fixtures.py`): ranks 4 and 8, attention and MLP targets, plain and
//! rank-stabilised scaling. Each moves the logits by 4 to 12, far past the tolerance.
//!
//! Each adapter alone, and one step mixing the base with three Llama adapters, must match
//! within the safetensors tolerance.

use std::path::{Path, PathBuf};

use fallow_engine::backend::cpu::{CpuBackend, KvDtype};
use fallow_engine::backend::{Backend, LogitsMode, SeqSlice};
use fallow_engine::lora::{self, peft, LoraAdapter, LoraPrecision};
use fallow_engine::model::{self, ModelArtifacts};
use serde::Deserialize;

/// As in `safetensors_vs_transformers`: f32 on both sides, 4-decimal references.
const TOLERANCE: f32 = 1e-3;
/// Served adapters are held in f16 (2⁻¹¹ relative rounding of A and B): measured at most
/// 2.9e-3 here, on adapters that move the logits by 3.8 to 12.4.
const F16_TOLERANCE: f32 = 1e-2;
const BLOCK_SIZE: usize = 4;
const ADAPTERS: [&str; 6] = [
    "llama_qv_r4",
    "llama_all_r8",
    "llama_mlp_r8_rslora",
    "qwen3_attn_r8_rslora",
    "qwen3_mlp_r4",
    "gemma3_qo_r4",
];

#[derive(Deserialize)]
struct Reference {
    base: String,
    sequences: Vec<Vec<u32>>,
    logits: Vec<Rows>,
}

/// Reference logits at some positions of one sequence.
#[derive(Deserialize)]
struct Rows {
    positions: Vec<usize>,
    rows: Vec<Vec<f32>>,
}

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny")
}

fn reference(name: &str) -> Reference {
    let path = fixtures().join("lora").join(name).join("reference.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path:?}: {e}"))
}

fn base(name: &str) -> ModelArtifacts {
    model::open(&fixtures().join(name)).unwrap_or_else(|e| panic!("open {name}: {e}"))
}

/// The adapter in f32, exactly as peft holds it.
fn adapter(name: &str, base: &ModelArtifacts) -> LoraAdapter {
    adapter_as(name, base, LoraPrecision::F32)
}

fn adapter_as(name: &str, base: &ModelArtifacts, precision: LoraPrecision) -> LoraAdapter {
    peft::load_as(
        &fixtures().join("lora").join(name),
        name,
        &base.config,
        precision,
    )
    .unwrap_or_else(|e| panic!("load {name}: {e}"))
}

/// Every position's logits of each `(tokens, adapter)`, all run in one step.
fn step(base: &ModelArtifacts, seqs: &[(&[u32], Option<&LoraAdapter>)]) -> Vec<Vec<f32>> {
    // An f32 KV pool, as the reference keeps K/V in f32.
    let mut backend = CpuBackend::with_kv_dtype(base, 64, BLOCK_SIZE, KvDtype::F32)
        .unwrap_or_else(|e| panic!("{e}"));
    let mut next = 0u32;
    let tables: Vec<Vec<u32>> = seqs
        .iter()
        .map(|(tokens, _)| {
            let n = tokens.len().div_ceil(BLOCK_SIZE) as u32;
            next += n;
            (next - n..next).collect()
        })
        .collect();
    let batch: Vec<SeqSlice<'_>> = seqs
        .iter()
        .zip(&tables)
        .map(|((tokens, adapter), table)| SeqSlice {
            tokens,
            start_pos: 0,
            block_table: table,
            logits: LogitsMode::All,
            adapter: *adapter,
        })
        .collect();
    let logits = backend
        .forward(&batch)
        .unwrap_or_else(|e| panic!("forward: {e}"));
    let vocab = base.config.vocab_size;
    let mut rows = logits.chunks_exact(vocab);
    seqs.iter()
        .map(|(tokens, _)| {
            rows.by_ref()
                .take(tokens.len())
                .flatten()
                .copied()
                .collect()
        })
        .collect()
}

/// The largest |Δ logit| between `got` (every position) and the reference rows.
fn worst(got: &[f32], want: &Rows, vocab: usize) -> f32 {
    want.positions
        .iter()
        .zip(&want.rows)
        .flat_map(|(&p, row)| {
            got[p * vocab..(p + 1) * vocab]
                .iter()
                .zip(row)
                .map(|(a, b)| (a - b).abs())
        })
        .fold(0.0, f32::max)
}

/// Runs each sequence of adapter `name`'s reference alone with the adapter read from `file`
/// (in its directory) in `precision`, and checks every position within `tolerance`.
fn check_alone(name: &str, file: &str, precision: LoraPrecision, tolerance: f32) {
    check_alone_over(name, file, "", precision, tolerance);
}

/// As [`check_alone`], over the base read from `base_file` in the base's directory (`""`:
/// the directory, its safetensors).
fn check_alone_over(
    name: &str,
    file: &str,
    base_file: &str,
    precision: LoraPrecision,
    tolerance: f32,
) {
    let reference = reference(name);
    let base = base(&Path::new(&reference.base).join(base_file).to_string_lossy());
    let path = fixtures().join("lora").join(name).join(file);
    let lora = lora::load(&path, name, &base.config, precision)
        .unwrap_or_else(|e| panic!("load {name}/{file}: {e}"));
    for (i, (tokens, want)) in reference
        .sequences
        .iter()
        .zip(&reference.logits)
        .enumerate()
    {
        let got = step(&base, &[(tokens, Some(&lora))]);
        let diff = worst(&got[0], want, base.config.vocab_size);
        eprintln!(
            "{name}/{file} over {base_file:?} {precision:?} sequence {i}: max |Δ logit| {diff}"
        );
        assert!(
            diff <= tolerance,
            "{name}/{file} over {base_file:?} {precision:?} sequence {i}: max |Δ logit| {diff}"
        );
    }
}

#[test]
fn every_adapter_alone_matches_peft() {
    for name in ADAPTERS {
        check_alone(name, "", LoraPrecision::F32, TOLERANCE);
    }
}

#[test]
fn every_adapter_held_in_f16_as_served_stays_close_to_peft() {
    for name in ADAPTERS {
        check_alone(name, "", LoraPrecision::F16, F16_TOLERANCE);
    }
}

/// llama.cpp's converter (`scripts/make_gguf_lora_fixtures.sh`) stores Llama's Q/K rows of B
/// in interleaved order; these bases are Hugging Face's, so the reader must undo it.
#[test]
fn a_llama_cpp_gguf_adapter_matches_peft() {
    for name in ["llama_qv_r4", "llama_all_r8", "qwen3_mlp_r4"] {
        check_alone(name, "adapter.gguf", LoraPrecision::F32, TOLERANCE);
    }
}

/// The same Llama base as llama.cpp's converter writes it (`llama/model.f32.gguf`, Q/K rows
/// interleaved for its RoPE): llama.cpp's adapters then apply as stored, and PEFT's
/// Hugging Face rows are interleaved to match.
#[test]
fn adapters_of_either_format_over_a_llama_cpp_gguf_base_match_peft() {
    for name in ["llama_qv_r4", "llama_all_r8"] {
        check_alone_over(
            name,
            "adapter.gguf",
            "model.f32.gguf",
            LoraPrecision::F32,
            TOLERANCE,
        );
        check_alone_over(name, "", "model.f32.gguf", LoraPrecision::F32, TOLERANCE);
    }
    check_alone_over(
        "llama_mlp_r8_rslora",
        "",
        "model.f32.gguf",
        LoraPrecision::F32,
        TOLERANCE,
    );
}

#[test]
fn one_step_of_the_base_and_three_adapters_matches_peft_for_each() {
    let names = ["llama_qv_r4", "llama_all_r8", "llama_mlp_r8_rslora"];
    let base = base("llama");
    let adapters: Vec<LoraAdapter> = names.iter().map(|n| adapter(n, &base)).collect();
    let references: Vec<Reference> = names.iter().map(|n| reference(n)).collect();
    // Sequence i of the step runs adapter i's first sequence; a base row sits between.
    let plain = &references[0].sequences[2];
    let mut seqs: Vec<(&[u32], Option<&LoraAdapter>)> = vec![(plain, None)];
    for (lora, reference) in adapters.iter().zip(&references) {
        seqs.push((&reference.sequences[0], Some(lora)));
    }
    let got = step(&base, &seqs);
    let vocab = base.config.vocab_size;
    for (i, name) in names.iter().enumerate() {
        let diff = worst(&got[i + 1], &references[i].logits[0], vocab);
        assert!(
            diff <= TOLERANCE,
            "{name} in the mixed step: max |Δ logit| {diff}"
        );
    }
    let alone = step(&base, &[(plain, None)]);
    let base_diff = got[0]
        .iter()
        .zip(&alone[0])
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    assert!(base_diff <= 1e-4, "the base row moved by {base_diff}");
}
