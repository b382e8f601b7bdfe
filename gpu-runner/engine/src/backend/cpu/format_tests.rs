//! Tiny random models of every architecture, loaded from an HF directory and from the GGUF
//! llama.cpp's converter would make of them, must give the same logits: this pins the
//! Q/K permutation vs RoPE pairing, Gemma's norm offset, biases, Q/K norms and tied heads.
//! Chunked prefill must also agree with one-shot prefill across Gemma's sliding window, and
//! the logits must match llama.cpp's for the same GGUF files (`testdata/`, made by
//! `testdata/gen_tiny_llamacpp_logits.py` from the files the ignored test below writes).

use super::CpuBackend;
use crate::backend::{Backend, LogitsMode, SeqSlice};
use crate::model::tiny::{write_tiny, VOCAB};
use crate::model::{self, Arch, ModelArtifacts};

const LLAMACPP_LOGITS: &str = include_str!("testdata/tiny_llamacpp_logits.json");
const ARCHS: [(&str, Arch); 4] = [
    ("llama", Arch::Llama),
    ("qwen2", Arch::Qwen2),
    ("qwen3", Arch::Qwen3),
    ("gemma3", Arch::Gemma3),
];

const TOKENS: [u32; 11] = [1, 17, 42, 5, 88, 63, 9, 31, 70, 2, 54];
const BLOCK: usize = 4;

fn backend(a: &ModelArtifacts) -> CpuBackend {
    CpuBackend::new(a, 16, BLOCK).unwrap_or_else(|e| panic!("backend: {e}"))
}

fn all_logits(b: &mut CpuBackend, chunks: &[usize]) -> Vec<f32> {
    let table: Vec<u32> = (0..4).collect();
    let mut pos = 0;
    let mut out = Vec::new();
    for &n in chunks {
        let slice = SeqSlice {
            adapter: None,
            tokens: &TOKENS[pos..pos + n],
            start_pos: pos,
            block_table: &table,
            logits: LogitsMode::All,
        };
        out.extend(
            b.forward(&[slice])
                .unwrap_or_else(|e| panic!("forward: {e}")),
        );
        pos += n;
    }
    out
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn hf_and_gguf_copies_of_a_tiny_model_give_the_same_logits() {
    for arch in [Arch::Llama, Arch::Qwen2, Arch::Qwen3, Arch::Gemma3] {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let (hf, gguf) = write_tiny(dir.path(), arch, 11).unwrap_or_else(|e| panic!("write: {e}"));
        let a = model::open(&hf).unwrap_or_else(|e| panic!("{arch:?} hf: {e}"));
        let mut g = model::open(&gguf).unwrap_or_else(|e| panic!("{arch:?} gguf: {e}"));
        g.use_cpu_layout();
        let la = all_logits(&mut backend(&a), &[TOKENS.len()]);
        let lg = all_logits(&mut backend(&g), &[TOKENS.len()]);
        assert_eq!(la.len(), TOKENS.len() * VOCAB);
        assert!(la.iter().all(|v| v.is_finite()));
        let spread = la.iter().map(|v| v.abs()).fold(0.0, f32::max);
        assert!(spread > 0.1, "{arch:?}: degenerate logits");
        assert!(
            max_diff(&la, &lg) < 1e-3,
            "{arch:?}: hf vs gguf differ by {}",
            max_diff(&la, &lg)
        );
    }
}

#[test]
fn chunked_prefill_matches_one_shot_across_the_sliding_window() {
    for arch in [Arch::Gemma3, Arch::Qwen2] {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let (hf, _) = write_tiny(dir.path(), arch, 12).unwrap_or_else(|e| panic!("write: {e}"));
        let a = model::open(&hf).unwrap_or_else(|e| panic!("open: {e}"));
        let whole = all_logits(&mut backend(&a), &[TOKENS.len()]);
        let chunked = all_logits(&mut backend(&a), &[3, 5, 1, 2]);
        assert!(
            max_diff(&whole, &chunked) < 1e-4,
            "{arch:?}: chunked differs by {}",
            max_diff(&whole, &chunked)
        );
    }
}

#[test]
fn tiny_models_match_llama_cpp_logits() {
    let fixture: serde_json::Value =
        serde_json::from_str(LLAMACPP_LOGITS).unwrap_or_else(|e| panic!("fixture: {e}"));
    let seed = fixture["seed"].as_u64().unwrap_or(11);
    for (name, arch) in ARCHS {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let (_, gguf) = write_tiny(dir.path(), arch, seed).unwrap_or_else(|e| panic!("write: {e}"));
        let mut g = model::open(&gguf).unwrap_or_else(|e| panic!("{name}: {e}"));
        g.use_cpu_layout();
        let ours = all_logits(&mut backend(&g), &[TOKENS.len()]);
        let reference: Vec<f32> = fixture["logits"][name]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|row| {
                row.as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|v| v.as_f64())
                    .map(|v| v as f32)
            })
            .collect();
        // llama.cpp keeps its KV cache in f16, hence the tolerance.
        let diff = max_diff(&ours, &reference);
        assert!(diff < 1e-2, "{name}: differs from llama.cpp by {diff}");
    }
}

/// Writes the tiny GGUF files for `gen_tiny_llamacpp_logits.py`:
/// `FALLOW_TINY_DIR=/tmp/tiny cargo test -p fallow-runner --lib write_tiny_models -- --ignored`.
#[test]
#[ignore]
fn write_tiny_models_for_reference_tools() {
    let Ok(root) = std::env::var("FALLOW_TINY_DIR") else {
        return;
    };
    for (name, arch) in ARCHS {
        let dir = std::path::Path::new(&root).join(name);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("mkdir: {e}"));
        write_tiny(&dir, arch, 11).unwrap_or_else(|e| panic!("write: {e}"));
    }
}
