//! Test helper: a tiny random model of each architecture, written both as an HF safetensors
//! directory and as the GGUF file llama.cpp's converter would make of it (Q/K rows permuted
//! for `llama`, Gemma norms stored as `1 + w`). Loading both must give the same logits,
//! which checks the two loaders and the RoPE conventions against each other.

use std::path::{Path, PathBuf};

use rand::{rngs::StdRng, Rng, SeedableRng};
use serde_json::{json, Value};

use super::Arch;
use crate::gguf::writer::GgufWriter;
use crate::gguf::MetaValue;
use crate::quant::GgmlType;

pub(crate) const VOCAB: usize = 96;
const HIDDEN: usize = 64;
const HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 16;
const FFN: usize = 96;
pub(crate) const GEMMA_WINDOW: usize = 4;

fn n_layers(arch: Arch) -> usize {
    if arch == Arch::Gemma3 {
        7 // layers 0-4 and 6 slide, layer 5 is global
    } else {
        2
    }
}

/// One tensor in HF naming and layout (row-major `[rows, cols]` or `[len]`).
struct Tensor {
    hf: String,
    gguf: String,
    shape: Vec<usize>,
    data: Vec<f32>,
}

struct Gen {
    rng: StdRng,
    arch: Arch,
    tensors: Vec<Tensor>,
}

impl Gen {
    fn matrix(&mut self, hf: &str, gguf: &str, rows: usize, cols: usize) {
        let a = 1.5 / (cols as f32).sqrt();
        let data = (0..rows * cols)
            .map(|_| self.rng.gen_range(-a..a))
            .collect();
        self.tensors.push(Tensor {
            hf: hf.into(),
            gguf: gguf.into(),
            shape: vec![rows, cols],
            data,
        });
    }

    fn vector(&mut self, hf: &str, gguf: &str, len: usize, around: f32, spread: f32) {
        let data = (0..len)
            .map(|_| around + self.rng.gen_range(-spread..spread))
            .collect();
        self.tensors.push(Tensor {
            hf: hf.into(),
            gguf: gguf.into(),
            shape: vec![len],
            data,
        });
    }

    /// A norm weight: HF Gemma stores the offset from 1.
    fn norm(&mut self, hf: &str, gguf: &str, len: usize) {
        let around = if self.arch == Arch::Gemma3 { 0.0 } else { 1.0 };
        self.vector(hf, gguf, len, around, 0.2);
    }

    fn layer(&mut self, i: usize) {
        let (p, b) = (format!("model.layers.{i}."), format!("blk.{i}."));
        let n = |hf: &str, gg: &str| (format!("{p}{hf}"), format!("{b}{gg}"));
        let (q, kv) = (HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM);
        let (h, g) = n("input_layernorm.weight", "attn_norm.weight");
        self.norm(&h, &g, HIDDEN);
        for (hf, gg, rows) in [
            ("q_proj", "attn_q", q),
            ("k_proj", "attn_k", kv),
            ("v_proj", "attn_v", kv),
        ] {
            let (h, g) = n(&format!("self_attn.{hf}.weight"), &format!("{gg}.weight"));
            self.matrix(&h, &g, rows, HIDDEN);
            if self.arch == Arch::Qwen2 {
                let (h, g) = n(&format!("self_attn.{hf}.bias"), &format!("{gg}.bias"));
                self.vector(&h, &g, rows, 0.0, 0.5);
            }
        }
        let (h, g) = n("self_attn.o_proj.weight", "attn_output.weight");
        self.matrix(&h, &g, HIDDEN, q);
        if matches!(self.arch, Arch::Qwen3 | Arch::Gemma3) {
            let (h, g) = n("self_attn.q_norm.weight", "attn_q_norm.weight");
            self.norm(&h, &g, HEAD_DIM);
            let (h, g) = n("self_attn.k_norm.weight", "attn_k_norm.weight");
            self.norm(&h, &g, HEAD_DIM);
        }
        if self.arch == Arch::Gemma3 {
            let (h, g) = n(
                "post_attention_layernorm.weight",
                "post_attention_norm.weight",
            );
            self.norm(&h, &g, HIDDEN);
            let (h, g) = n("pre_feedforward_layernorm.weight", "ffn_norm.weight");
            self.norm(&h, &g, HIDDEN);
            let (h, g) = n("post_feedforward_layernorm.weight", "post_ffw_norm.weight");
            self.norm(&h, &g, HIDDEN);
        } else {
            let (h, g) = n("post_attention_layernorm.weight", "ffn_norm.weight");
            self.norm(&h, &g, HIDDEN);
        }
        for (hf, gg) in [("gate_proj", "ffn_gate"), ("up_proj", "ffn_up")] {
            let (h, g) = n(&format!("mlp.{hf}.weight"), &format!("{gg}.weight"));
            self.matrix(&h, &g, FFN, HIDDEN);
        }
        let (h, g) = n("mlp.down_proj.weight", "ffn_down.weight");
        self.matrix(&h, &g, HIDDEN, FFN);
    }
}

fn generate(arch: Arch, seed: u64) -> Vec<Tensor> {
    let mut g = Gen {
        rng: StdRng::seed_from_u64(seed),
        arch,
        tensors: Vec::new(),
    };
    g.vector(
        "model.embed_tokens.weight",
        "token_embd.weight",
        VOCAB * HIDDEN,
        0.0,
        1.0,
    );
    if let Some(t) = g.tensors.last_mut() {
        t.shape = vec![VOCAB, HIDDEN];
    }
    for i in 0..n_layers(arch) {
        g.layer(i);
    }
    g.norm("model.norm.weight", "output_norm.weight", HIDDEN);
    if arch != Arch::Gemma3 {
        g.matrix("lm_head.weight", "output.weight", VOCAB, HIDDEN);
    }
    g.tensors
}

fn arch_names(arch: Arch) -> (&'static str, &'static str) {
    match arch {
        Arch::Llama => ("llama", "llama"),
        Arch::Qwen2 => ("qwen2", "qwen2"),
        Arch::Qwen3 => ("qwen3", "qwen3"),
        Arch::Gemma3 => ("gemma3_text", "gemma3"),
        Arch::GptOss => ("gpt_oss", "gpt-oss"),
    }
}

fn hf_config(arch: Arch) -> Value {
    let (model_type, _) = arch_names(arch);
    let mut c = json!({
        "model_type": model_type,
        "hidden_size": HIDDEN, "intermediate_size": FFN, "num_hidden_layers": n_layers(arch),
        "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM,
        "vocab_size": VOCAB, "max_position_embeddings": 128, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "tie_word_embeddings": arch == Arch::Gemma3,
        "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2,
    });
    if arch == Arch::Gemma3 {
        let types: Vec<&str> = (0..n_layers(arch))
            .map(|l| {
                if (l + 1) % 6 == 0 {
                    "full_attention"
                } else {
                    "sliding_attention"
                }
            })
            .collect();
        c["rope_theta"] = json!(1_000_000.0);
        c["rope_local_base_freq"] = json!(10_000.0);
        c["sliding_window"] = json!(GEMMA_WINDOW);
        c["sliding_window_pattern"] = json!(6);
        c["layer_types"] = json!(types);
        c["query_pre_attn_scalar"] = json!(HEAD_DIM);
        c["hidden_activation"] = json!("gelu_pytorch_tanh");
    }
    c
}

fn write_safetensors(path: &Path, tensors: &[Tensor]) -> std::io::Result<()> {
    let refs: Vec<(&str, &[usize], &[f32])> = tensors
        .iter()
        .map(|t| (t.hf.as_str(), t.shape.as_slice(), t.data.as_slice()))
        .collect();
    crate::lora::random::write_safetensors(path, &refs)
}

/// llama.cpp's `LlamaModel.permute`: within each head, rows `(i, i + d/2)` become
/// `(2i, 2i + 1)`, so interleaved RoPE on the result equals NEOX RoPE on the original.
fn permute_rows(data: &[f32], n_head: usize, rows: usize, cols: usize) -> Vec<f32> {
    let hd = rows / n_head;
    let mut out = vec![0f32; data.len()];
    for h in 0..n_head {
        for i in 0..hd / 2 {
            for (half, dst) in [(0, 2 * i), (1, 2 * i + 1)] {
                let src_row = h * hd + half * hd / 2 + i;
                let dst_row = h * hd + dst;
                out[dst_row * cols..][..cols].copy_from_slice(&data[src_row * cols..][..cols]);
            }
        }
    }
    out
}

fn gguf_bytes(arch: Arch, tensors: &[Tensor]) -> Vec<u8> {
    let (_, a) = arch_names(arch);
    let u = |v: usize| MetaValue::U32(v as u32);
    let k = |s: &str| format!("{a}.{s}");
    let mut w = GgufWriter::new()
        .meta("general.architecture", MetaValue::String(a.into()))
        .meta(&k("block_count"), u(n_layers(arch)))
        .meta(&k("context_length"), u(128))
        .meta(&k("embedding_length"), u(HIDDEN))
        .meta(&k("feed_forward_length"), u(FFN))
        .meta(&k("attention.head_count"), u(HEADS))
        .meta(&k("attention.head_count_kv"), u(KV_HEADS))
        .meta(&k("attention.key_length"), u(HEAD_DIM))
        .meta(&k("attention.value_length"), u(HEAD_DIM))
        .meta(&k("attention.layer_norm_rms_epsilon"), MetaValue::F32(1e-5))
        .meta(
            &k("rope.freq_base"),
            MetaValue::F32(if arch == Arch::Gemma3 { 1e6 } else { 1e4 }),
        )
        .meta("tokenizer.ggml.model", MetaValue::String("gpt2".into()))
        .meta(
            "tokenizer.ggml.tokens",
            MetaValue::Array(
                (0..VOCAB)
                    .map(|i| MetaValue::String(format!("t{i}")))
                    .collect(),
            ),
        )
        .meta(
            "tokenizer.ggml.merges",
            MetaValue::Array(vec![MetaValue::String("t 1".into())]),
        )
        .meta("tokenizer.ggml.bos_token_id", u(1))
        .meta("tokenizer.ggml.eos_token_id", u(2));
    if arch == Arch::Gemma3 {
        w = w.meta(&k("attention.sliding_window"), u(GEMMA_WINDOW));
    }
    for t in tensors {
        let mut data = t.data.clone();
        if arch == Arch::Llama
            && (t.gguf.ends_with("attn_q.weight") || t.gguf.ends_with("attn_k.weight"))
        {
            let heads = if t.gguf.ends_with("attn_q.weight") {
                HEADS
            } else {
                KV_HEADS
            };
            data = permute_rows(&data, heads, t.shape[0], t.shape[1]);
        }
        if arch == Arch::Gemma3 && t.gguf.ends_with("norm.weight") {
            data.iter_mut().for_each(|v| *v += 1.0);
        }
        let dims: Vec<u64> = t.shape.iter().rev().map(|&d| d as u64).collect();
        w = w.tensor(
            &t.gguf,
            &dims,
            GgmlType::F32,
            data.iter().flat_map(|v| v.to_le_bytes()).collect(),
        );
    }
    w.to_bytes()
}

/// Writes the tiny model under `dir` as `hf/` (config.json, model.safetensors, tokenizer
/// stubs) and `model.gguf`; returns both paths.
pub(crate) fn write_tiny(dir: &Path, arch: Arch, seed: u64) -> std::io::Result<(PathBuf, PathBuf)> {
    let tensors = generate(arch, seed);
    let hf = dir.join("hf");
    std::fs::create_dir_all(&hf)?;
    std::fs::write(
        hf.join("config.json"),
        serde_json::to_vec_pretty(&hf_config(arch))?,
    )?;
    std::fs::write(hf.join("tokenizer.json"), b"{}")?;
    std::fs::write(
        hf.join("tokenizer_config.json"),
        br#"{"chat_template": "{{ messages }}"}"#,
    )?;
    std::fs::write(
        hf.join("generation_config.json"),
        br#"{"eos_token_id": [2, 3]}"#,
    )?;
    write_safetensors(&hf.join("model.safetensors"), &tensors)?;
    let gguf = dir.join("model.gguf");
    std::fs::write(&gguf, gguf_bytes(arch, &tensors))?;
    Ok((hf, gguf))
}
