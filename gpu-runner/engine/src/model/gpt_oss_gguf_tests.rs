//! A gpt-oss GGUF laid out as llama.cpp's `convert_hf_to_gguf.py` writes one from an
//! unquantized checkpoint (experts split into `ffn_{gate,up,down}_exps`, transposed to
//! `[out, in]`, biases beside them, `attn_sinks.weight`, the pre-FFN norm named
//! `post_attention_norm`, YaRN in `rope.scaling.*`) runs the same model as the checkpoint.
//! The file is built here from the tiny transformers fixture, in F32.

use std::path::{Path, PathBuf};

use crate::backend::cpu::{CpuBackend, KvDtype};
use crate::backend::{Backend, LogitsMode, SeqSlice};
use crate::gguf::writer::GgufWriter;
use crate::gguf::MetaValue;
use crate::quant::GgmlType;

use super::safetensors::SafetensorsSet;
use super::{Arch, ModelArtifacts, RopeScaling};

const TOKENS: [u32; 12] = [5, 77, 200, 13, 9, 250, 41, 41, 3, 180, 66, 300];

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny/gpt_oss")
}

/// `[slabs, rows, cols]` values → each slab transposed, keeping output rows `keep(j)`.
fn transposed(
    v: &[f32],
    (slabs, rows, cols): (usize, usize, usize),
    keep: usize,
    step: usize,
    first: usize,
) -> Vec<f32> {
    let mut out = Vec::with_capacity(slabs * keep * rows);
    for s in 0..slabs {
        for j in 0..keep {
            let c = first + j * step;
            out.extend((0..rows).map(|r| v[(s * rows + r) * cols + c]));
        }
    }
    out
}

fn every_other(v: &[f32], first: usize) -> Vec<f32> {
    v.iter().skip(first).step_by(2).copied().collect()
}

/// Writes the fixture as llama.cpp's converter would, into `dir/model.gguf`.
fn write_gguf(dir: &Path) -> PathBuf {
    let st = SafetensorsSet::open_dir(&fixture()).expect("fixture");
    let get = |n: &str| st.vector(n).unwrap_or_else(|e| panic!("{n}: {e}"));
    let (h, f, e, vocab) = (64usize, 32usize, 8usize, 320usize);
    let u = |v: usize| MetaValue::U32(v as u32);
    let k = |s: &str| format!("gpt-oss.{s}");
    let mut w = GgufWriter::new()
        .meta("general.architecture", MetaValue::String("gpt-oss".into()))
        .meta(&k("block_count"), u(2))
        .meta(&k("context_length"), u(131_072))
        .meta(&k("embedding_length"), u(h))
        .meta(&k("feed_forward_length"), u(f))
        .meta(&k("attention.head_count"), u(4))
        .meta(&k("attention.head_count_kv"), u(2))
        .meta(&k("attention.key_length"), u(16))
        .meta(&k("attention.value_length"), u(16))
        .meta(&k("attention.layer_norm_rms_epsilon"), MetaValue::F32(1e-5))
        .meta(&k("attention.sliding_window"), u(5))
        .meta(&k("rope.freq_base"), MetaValue::F32(150_000.0))
        .meta(&k("rope.scaling.type"), MetaValue::String("yarn".into()))
        .meta(&k("rope.scaling.factor"), MetaValue::F32(32.0))
        .meta(&k("rope.scaling.original_context_length"), u(4096))
        .meta(&k("expert_count"), u(e))
        .meta(&k("expert_used_count"), u(2))
        .meta(&k("expert_feed_forward_length"), u(f))
        .meta("tokenizer.ggml.model", MetaValue::String("gpt2".into()))
        .meta(
            "tokenizer.ggml.tokens",
            MetaValue::Array(
                (0..vocab)
                    .map(|i| MetaValue::String(format!("t{i}")))
                    .collect(),
            ),
        )
        .meta(
            "tokenizer.ggml.merges",
            MetaValue::Array(vec![MetaValue::String("t 1".into())]),
        )
        .meta("tokenizer.ggml.eos_token_id", u(2));
    let mut tensors: Vec<(String, Vec<usize>, Vec<f32>)> = Vec::new();
    let mut put = |name: &str, shape: &[usize], v: Vec<f32>| {
        assert_eq!(shape.iter().product::<usize>(), v.len(), "{name}");
        tensors.push((name.into(), shape.to_vec(), v));
    };
    put(
        "token_embd.weight",
        &[vocab, h],
        get("model.embed_tokens.weight"),
    );
    put("output_norm.weight", &[h], get("model.norm.weight"));
    put("output.weight", &[vocab, h], get("lm_head.weight"));
    for l in 0..2 {
        let hf = |s: &str| get(&format!("model.layers.{l}.{s}"));
        let blk = |s: &str| format!("blk.{l}.{s}");
        put(&blk("attn_norm.weight"), &[h], hf("input_layernorm.weight"));
        put(
            &blk("post_attention_norm.weight"),
            &[h],
            hf("post_attention_layernorm.weight"),
        );
        for (p, g, rows) in [
            ("q", "q", 64),
            ("k", "k", 32),
            ("v", "v", 32),
            ("o", "output", 64),
        ] {
            let cols = if p == "o" { 64 } else { h };
            put(
                &blk(&format!("attn_{g}.weight")),
                &[rows, cols],
                hf(&format!("self_attn.{p}_proj.weight")),
            );
            put(
                &blk(&format!("attn_{g}.bias")),
                &[rows],
                hf(&format!("self_attn.{p}_proj.bias")),
            );
        }
        put(&blk("attn_sinks.weight"), &[4], hf("self_attn.sinks"));
        put(
            &blk("ffn_gate_inp.weight"),
            &[e, h],
            hf("mlp.router.weight"),
        );
        put(&blk("ffn_gate_inp.bias"), &[e], hf("mlp.router.bias"));
        let gate_up = hf("mlp.experts.gate_up_proj");
        put(
            &blk("ffn_gate_exps.weight"),
            &[e, f, h],
            transposed(&gate_up, (e, h, 2 * f), f, 2, 0),
        );
        put(
            &blk("ffn_up_exps.weight"),
            &[e, f, h],
            transposed(&gate_up, (e, h, 2 * f), f, 2, 1),
        );
        let down = hf("mlp.experts.down_proj");
        put(
            &blk("ffn_down_exps.weight"),
            &[e, h, f],
            transposed(&down, (e, f, h), h, 1, 0),
        );
        let bias = hf("mlp.experts.gate_up_proj_bias");
        put(&blk("ffn_gate_exps.bias"), &[e, f], every_other(&bias, 0));
        put(&blk("ffn_up_exps.bias"), &[e, f], every_other(&bias, 1));
        put(
            &blk("ffn_down_exps.bias"),
            &[e, h],
            hf("mlp.experts.down_proj_bias"),
        );
    }
    for (name, shape, v) in tensors {
        let dims: Vec<u64> = shape.iter().rev().map(|&d| d as u64).collect();
        let bytes = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        w = w.tensor(&name, &dims, GgmlType::F32, bytes);
    }
    let path = dir.join("model.gguf");
    std::fs::write(&path, w.to_bytes()).expect("write gguf");
    path
}

fn logits(artifacts: &ModelArtifacts) -> Vec<f32> {
    let mut backend = CpuBackend::with_kv_dtype(artifacts, 4, 16, KvDtype::F32).expect("backend");
    backend
        .forward(&[SeqSlice {
            adapter: None,
            tokens: &TOKENS,
            start_pos: 0,
            block_table: &[0],
            logits: LogitsMode::All,
        }])
        .expect("forward")
}

#[test]
fn a_gpt_oss_gguf_as_llama_cpp_converts_it_runs_the_checkpoints_model() {
    let dir = tempfile::tempdir().expect("tempdir");
    let gguf = super::open(&write_gguf(dir.path())).expect("open gguf");
    let c = &gguf.config;
    assert_eq!(c.arch, Arch::GptOss);
    assert!(c.qkv_bias && c.o_bias && c.attn_sinks);
    assert_eq!(
        (c.sliding_window, c.local_layers.clone()),
        (Some(5), vec![true, false])
    );
    let RopeScaling::Yarn(yarn) = c.rope_scaling else {
        panic!("YaRN expected, got {:?}", c.rope_scaling);
    };
    // ggml rounds the ramp's ends (transformers' `truncate: true`).
    assert!(yarn.truncate);
    assert!((yarn.attention_factor - (1.0 + 0.1 * 32f32.ln())).abs() < 1e-6);

    // llama.cpp's clamp is a constant: transformers' default, 7.
    let clamp = c.moe.as_ref().and_then(|m| m.clamped_swiglu);
    assert_eq!(clamp.map(|s| (s.alpha, s.limit)), Some((1.702, 7.0)));

    // The checkpoint's model with ggml's rounded ramp and llama.cpp's limit (the fixture
    // has 1.5): the same numbers.
    let mut hf = super::open(&fixture()).expect("open checkpoint");
    if let RopeScaling::Yarn(y) = &mut hf.config.rope_scaling {
        y.truncate = true;
    }
    if let Some(s) = hf
        .config
        .moe
        .as_mut()
        .and_then(|m| m.clamped_swiglu.as_mut())
    {
        s.limit = 7.0;
    }
    let (a, b) = (logits(&gguf), logits(&hf));
    let diff = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max);
    eprintln!("GGUF vs checkpoint: max |Δ logit| {diff}");
    assert!(diff < 1e-4, "GGUF vs checkpoint: max |Δ logit| {diff}");
}
