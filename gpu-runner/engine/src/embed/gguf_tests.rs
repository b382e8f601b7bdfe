//! A GGUF decoder embedding model against sentence-transformers: the tiny Qwen3 embedder
//! fixture (`tests/fixtures/tiny/qwen3_embed`) rewritten as the GGUF file llama.cpp's
//! converter makes of it, then tokenized and embedded through the GGUF path and compared
//! with the fixture's reference ids and vectors.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::{EmbeddingModel, Pooling};
use crate::gguf::writer::GgufWriter;
use crate::gguf::MetaValue;
use crate::model::safetensors::SafetensorsFile;
use crate::quant::GgmlType;

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny/qwen3_embed")
}

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).expect("read fixture")).expect("fixture JSON")
}

/// An HF tensor name of the fixture (saved without the `model.` prefix) → llama.cpp's.
fn gguf_name(hf: &str) -> String {
    const LAYER: [(&str, &str); 11] = [
        ("input_layernorm.weight", "attn_norm.weight"),
        ("self_attn.q_proj.weight", "attn_q.weight"),
        ("self_attn.k_proj.weight", "attn_k.weight"),
        ("self_attn.v_proj.weight", "attn_v.weight"),
        ("self_attn.o_proj.weight", "attn_output.weight"),
        ("self_attn.q_norm.weight", "attn_q_norm.weight"),
        ("self_attn.k_norm.weight", "attn_k_norm.weight"),
        ("post_attention_layernorm.weight", "ffn_norm.weight"),
        ("mlp.gate_proj.weight", "ffn_gate.weight"),
        ("mlp.up_proj.weight", "ffn_up.weight"),
        ("mlp.down_proj.weight", "ffn_down.weight"),
    ];
    match hf {
        "embed_tokens.weight" => return "token_embd.weight".into(),
        "norm.weight" => return "output_norm.weight".into(),
        _ => {}
    }
    let rest = hf.strip_prefix("layers.").expect("a layer tensor");
    let (layer, name) = rest.split_once('.').expect("layers.N.name");
    let (_, gguf) = LAYER
        .iter()
        .find(|(h, _)| *h == name)
        .unwrap_or_else(|| panic!("no GGUF name for {hf}"));
    format!("blk.{layer}.{gguf}")
}

/// The tokenizer.json vocabulary as `tokenizer.ggml.*` metadata.
fn vocab_meta(w: GgufWriter, tokenizer: &Value, add_eos: bool) -> GgufWriter {
    let vocab = tokenizer["model"]["vocab"].as_object().expect("BPE vocab");
    let mut tokens = vec![String::new(); vocab.len()];
    for (text, id) in vocab {
        tokens[id.as_u64().expect("id") as usize] = text.clone();
    }
    let mut types = vec![1i32; tokens.len()];
    for added in tokenizer["added_tokens"].as_array().expect("added_tokens") {
        if added["special"].as_bool() == Some(true) {
            types[added["id"].as_u64().expect("id") as usize] = 3;
        }
    }
    let merges: Vec<MetaValue> = tokenizer["model"]["merges"]
        .as_array()
        .expect("merges")
        .iter()
        .map(|m| match m {
            Value::String(s) => MetaValue::String(s.clone()),
            pair => MetaValue::String(format!(
                "{} {}",
                pair[0].as_str().expect("merge"),
                pair[1].as_str().expect("merge")
            )),
        })
        .collect();
    w.meta("tokenizer.ggml.model", MetaValue::String("gpt2".into()))
        .meta("tokenizer.ggml.pre", MetaValue::String("gpt2".into()))
        .meta(
            "tokenizer.ggml.tokens",
            MetaValue::Array(tokens.into_iter().map(MetaValue::String).collect()),
        )
        .meta(
            "tokenizer.ggml.token_type",
            MetaValue::Array(types.into_iter().map(MetaValue::I32).collect()),
        )
        .meta("tokenizer.ggml.merges", MetaValue::Array(merges))
        .meta("tokenizer.ggml.eos_token_id", MetaValue::U32(0))
        .meta("tokenizer.ggml.add_bos_token", MetaValue::Bool(false))
        .meta("tokenizer.ggml.add_eos_token", MetaValue::Bool(add_eos))
}

/// Writes the fixture as `dir/model.gguf`, with `pooling_type` when given.
fn write_gguf(dir: &Path, pooling_type: Option<u32>) -> PathBuf {
    let root = fixture();
    let config = read_json(&root.join("config.json"));
    let tokenizer = read_json(&root.join("tokenizer.json"));
    let n = |key: &str| MetaValue::U32(config[key].as_u64().expect(key) as u32);
    let mut w = GgufWriter::new()
        .meta("general.architecture", MetaValue::String("qwen3".into()))
        .meta("qwen3.block_count", n("num_hidden_layers"))
        .meta("qwen3.context_length", n("max_position_embeddings"))
        .meta("qwen3.embedding_length", n("hidden_size"))
        .meta("qwen3.feed_forward_length", n("intermediate_size"))
        .meta("qwen3.attention.head_count", n("num_attention_heads"))
        .meta("qwen3.attention.head_count_kv", n("num_key_value_heads"))
        .meta("qwen3.attention.key_length", n("head_dim"))
        .meta("qwen3.attention.value_length", n("head_dim"))
        .meta(
            "qwen3.attention.layer_norm_rms_epsilon",
            MetaValue::F32(config["rms_norm_eps"].as_f64().expect("eps") as f32),
        )
        .meta(
            "qwen3.rope.freq_base",
            MetaValue::F32(
                config["rope_parameters"]["rope_theta"]
                    .as_f64()
                    .expect("theta") as f32,
            ),
        );
    if let Some(p) = pooling_type {
        w = w.meta("qwen3.pooling_type", MetaValue::U32(p));
    }
    w = vocab_meta(w, &tokenizer, true);
    let weights = SafetensorsFile::open(&root.join("model.safetensors")).expect("weights");
    let mut names: Vec<&String> = weights.tensors.keys().collect();
    names.sort();
    for name in names {
        let shape = &weights.tensors[name].shape;
        let data = weights.vector(name).expect("f32 tensor");
        let dims: Vec<u64> = shape.iter().rev().map(|&d| d as u64).collect();
        w = w.tensor(
            &gguf_name(name),
            &dims,
            GgmlType::F32,
            data.iter().flat_map(|v| v.to_le_bytes()).collect(),
        );
    }
    let path = dir.join("model.gguf");
    std::fs::write(&path, w.to_bytes()).expect("write GGUF");
    path
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
fn a_gguf_decoder_with_a_pooling_type_embeds_like_sentence_transformers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write_gguf(dir.path(), Some(3));
    assert!(EmbeddingModel::detect(&path));
    let model = EmbeddingModel::open(&path).expect("open the GGUF embedder");
    assert_eq!(model.pooling(), Pooling::LastToken);
    assert!(model.normalizes());
    assert_eq!(model.dimensions(), 64);
    assert_eq!(model.max_input_tokens(), 256);
    assert!(model.matryoshka_dimensions().is_empty());

    let reference = read_json(&fixture().join("reference.json"));
    for case in reference["cases"].as_array().expect("cases") {
        let text = case["text"].as_str().expect("text");
        let want_ids: Vec<u32> = case["ids"]
            .as_array()
            .expect("ids")
            .iter()
            .map(|v| v.as_u64().expect("id") as u32)
            .collect();
        let ids = model.tokenize(text).expect("tokenize");
        assert_eq!(ids, want_ids, "ids of {text:?}: the EOS is appended");
        let want: Vec<f32> = case["embedding"]
            .as_array()
            .expect("embedding")
            .iter()
            .map(|v| v.as_f64().expect("float") as f32)
            .collect();
        let got = model.embed(&[ids]).expect("embed").remove(0);
        let c = cosine(&got, &want);
        assert!(c >= 0.999, "cosine {c} for {text:?}");
    }
}

#[test]
fn a_gguf_without_a_pooling_type_is_a_chat_model_and_rank_pooling_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let chat = write_gguf(dir.path(), None);
    assert!(!EmbeddingModel::detect(&chat));
    let err = EmbeddingModel::open(&chat).expect_err("no pooling type");
    assert!(err.to_string().contains("pooling_type"), "{err}");

    let none = tempfile::tempdir().expect("tempdir");
    assert!(!EmbeddingModel::detect(&write_gguf(none.path(), Some(0))));

    let rank = tempfile::tempdir().expect("tempdir");
    let reranker = write_gguf(rank.path(), Some(4));
    assert!(EmbeddingModel::detect(&reranker));
    let err = EmbeddingModel::open(&reranker).expect_err("rank pooling");
    assert!(err.to_string().contains("rank"), "{err}");
}

#[test]
fn a_bert_gguf_is_detected_and_refused_with_the_reason() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bert.gguf");
    let bytes = GgufWriter::new()
        .meta("general.architecture", MetaValue::String("bert".into()))
        .to_bytes();
    std::fs::write(&path, bytes).expect("write");
    assert!(EmbeddingModel::detect(&path));
    let err = EmbeddingModel::open(&path).expect_err("bert GGUF");
    assert!(err.to_string().contains("safetensors directory"), "{err}");
}
