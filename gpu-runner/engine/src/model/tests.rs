//! Tests of model loading: configs from GGUF metadata and HF `config.json` agree, the
//! safetensors reader rejects malformed files by name, and the real SmolLM2 GGUF yields
//! its vocabulary and chat template.

use std::path::Path;

use serde_json::{json, Value};

use super::tiny::{write_tiny, GEMMA_WINDOW, VOCAB};
use super::{open, Activation, Arch, ModelError, RopeStyle, VocabSource};

const SMOLLM: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../models/SmolLM2-135M-Instruct.Q4_1.gguf"
);

fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"))
}

#[test]
fn gguf_and_hf_copies_of_a_model_resolve_to_the_same_config() {
    for arch in [Arch::Llama, Arch::Qwen2, Arch::Qwen3, Arch::Gemma3] {
        let dir = tempdir();
        let (hf, gguf) = write_tiny(dir.path(), arch, 7).unwrap_or_else(|e| panic!("write: {e}"));
        let a = open(&hf).unwrap_or_else(|e| panic!("{arch:?} hf: {e}"));
        let b = open(&gguf).unwrap_or_else(|e| panic!("{arch:?} gguf: {e}"));
        let (x, y) = (&a.config, &b.config);
        assert_eq!((x.arch, y.arch), (arch, arch));
        assert_eq!(
            (x.n_layers, x.hidden, x.n_heads, x.n_kv_heads),
            (y.n_layers, y.hidden, y.n_heads, y.n_kv_heads)
        );
        assert_eq!(
            (x.head_dim, x.ffn, x.vocab_size),
            (y.head_dim, y.ffn, y.vocab_size)
        );
        assert_eq!(
            (x.qkv_bias, x.qk_norm, x.tie_embeddings),
            (y.qkv_bias, y.qk_norm, y.tie_embeddings)
        );
        assert_eq!(
            (x.rope_theta, x.rope_theta_local),
            (y.rope_theta, y.rope_theta_local)
        );
        assert_eq!(x.local_layers, y.local_layers);
        assert_eq!(
            (x.sliding_window, x.attn_scale),
            (y.sliding_window, y.attn_scale)
        );
        assert_eq!(x.rope_style, RopeStyle::Neox);
        let gguf_style = if arch == Arch::Llama {
            RopeStyle::Interleaved
        } else {
            RopeStyle::Neox
        };
        assert_eq!(y.rope_style, gguf_style);
        assert_eq!(x.vocab_size, VOCAB);
    }
}

#[test]
fn gemma3_config_has_its_specifics() {
    let dir = tempdir();
    let (hf, _) = write_tiny(dir.path(), Arch::Gemma3, 1).unwrap_or_else(|e| panic!("write: {e}"));
    let a = open(&hf).unwrap_or_else(|e| panic!("open: {e}"));
    let c = &a.config;
    assert_eq!(c.activation, Activation::GeluTanh);
    assert_eq!(c.embedding_scale, Some((c.hidden as f32).sqrt()));
    assert!(c.post_norms && c.tie_embeddings && a.weights.output.is_none());
    assert_eq!(c.sliding_window, Some(GEMMA_WINDOW));
    assert_eq!(
        c.local_layers,
        vec![true, true, true, true, true, false, true]
    );
    assert!(c.uses_local_rope(0) && !c.uses_local_rope(5));
    assert_eq!(c.norm_weight_offset, 1.0);
}

#[test]
fn hf_directory_yields_tokenizer_paths_chat_template_and_eos_ids() {
    let dir = tempdir();
    let (hf, _) = write_tiny(dir.path(), Arch::Qwen2, 2).unwrap_or_else(|e| panic!("write: {e}"));
    let a = open(&hf).unwrap_or_else(|e| panic!("open: {e}"));
    assert!(matches!(
        a.vocab,
        VocabSource::TokenizerJson {
            tokenizer_config: Some(_),
            ..
        }
    ));
    assert_eq!(a.chat_template.as_deref(), Some("{{ messages }}"));
    assert_eq!(a.eos_ids, vec![2, 3]);
    assert!(a.weights.layers[0].bq.is_some());
}

#[test]
fn a_truncated_safetensors_file_is_rejected_naming_the_tensor() {
    let dir = tempdir();
    let (hf, _) = write_tiny(dir.path(), Arch::Llama, 3).unwrap_or_else(|e| panic!("write: {e}"));
    let st = hf.join("model.safetensors");
    let bytes = std::fs::read(&st).unwrap_or_else(|e| panic!("read: {e}"));
    std::fs::write(&st, &bytes[..bytes.len() - 4]).unwrap_or_else(|e| panic!("write: {e}"));
    let err = open(&hf).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(
        err.contains("outside the file") && err.contains("tensor `"),
        "{err}"
    );
}

#[test]
fn a_bad_safetensors_header_length_is_an_error_not_a_panic() {
    let dir = tempdir();
    let (hf, _) = write_tiny(dir.path(), Arch::Llama, 3).unwrap_or_else(|e| panic!("write: {e}"));
    std::fs::write(hf.join("model.safetensors"), u64::MAX.to_le_bytes())
        .unwrap_or_else(|e| panic!("write: {e}"));
    assert!(matches!(open(&hf), Err(ModelError::Safetensors { .. })));
}

#[test]
fn an_unknown_architecture_is_named_in_the_error() {
    let dir = tempdir();
    let (hf, _) = write_tiny(dir.path(), Arch::Llama, 4).unwrap_or_else(|e| panic!("write: {e}"));
    let cfg = hf.join("config.json");
    let text = std::fs::read_to_string(&cfg).unwrap_or_else(|e| panic!("read: {e}"));
    std::fs::write(&cfg, text.replace("\"llama\"", "\"mamba\""))
        .unwrap_or_else(|e| panic!("write: {e}"));
    assert!(matches!(open(&hf), Err(ModelError::UnsupportedArch(a)) if a == "mamba"));
}

#[test]
fn a_missing_tensor_is_named_in_the_error() {
    let dir = tempdir();
    let (hf, _) = write_tiny(dir.path(), Arch::Qwen3, 5).unwrap_or_else(|e| panic!("write: {e}"));
    let cfg = hf.join("config.json");
    let text = std::fs::read_to_string(&cfg).unwrap_or_else(|e| panic!("read: {e}"));
    std::fs::write(
        &cfg,
        text.replace("\"num_hidden_layers\": 2", "\"num_hidden_layers\": 3"),
    )
    .unwrap_or_else(|e| panic!("write: {e}"));
    let err = open(&hf).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(err.contains("model.layers.2."), "{err}");
}

#[test]
fn smollm2_gguf_loads_with_its_vocabulary_and_chat_template() {
    if !Path::new(SMOLLM).is_file() {
        fallow_protocol::testing::skip_for_want_of(&format!("{SMOLLM} (scripts/fetch-models.sh)"));
        return;
    }
    let a = open(Path::new(SMOLLM)).unwrap_or_else(|e| panic!("open: {e}"));
    let c = &a.config;
    assert_eq!(
        (c.arch, c.n_layers, c.hidden, c.n_heads, c.n_kv_heads),
        (Arch::Llama, 30, 576, 9, 3)
    );
    assert_eq!((c.head_dim, c.ffn, c.vocab_size), (64, 1536, 49152));
    assert_eq!(c.rope_style, RopeStyle::Interleaved);
    assert!(c.tie_embeddings);
    let VocabSource::Gguf(v) = &a.vocab else {
        panic!("expected a GGUF vocabulary")
    };
    assert_eq!(v.tokens.len(), 49152);
    assert_eq!(v.model, "gpt2");
    assert_eq!(v.pre.as_deref(), Some("smollm"));
    assert!(!v.merges.is_empty());
    assert_eq!(v.tokens[1], "<|im_start|>");
    assert!(a
        .chat_template
        .as_deref()
        .is_some_and(|t| t.contains("<|im_start|>")));
    assert!(a.eos_ids.contains(&2));
}

#[test]
fn a_bias_the_forward_pass_does_not_apply_is_rejected_by_name() {
    let names = [
        "model.layers.0.self_attn.q_proj.bias",
        "model.layers.3.self_attn.o_proj.bias",
    ];
    let err = super::weights::reject_unused_tensors(names.into_iter(), &["o_proj.bias"])
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        err.contains("model.layers.3.self_attn.o_proj.bias"),
        "{err}"
    );
    assert!(
        super::weights::reject_unused_tensors(names[..1].iter().copied(), &["o_proj.bias"]).is_ok()
    );
}

#[test]
fn multimodal_gemma3_config_reads_text_config_with_transformers_defaults() {
    let root = serde_json::json!({
        "model_type": "gemma3",
        "text_config": {
            "model_type": "gemma3_text", "hidden_size": 2560, "intermediate_size": 10240,
            "num_hidden_layers": 34, "sliding_window": 1024,
            "rope_scaling": {"factor": 8.0, "rope_type": "linear"}
        }
    });
    let c = super::config::from_hf_json(&root).unwrap_or_else(|e| panic!("config: {e}"));
    assert_eq!(
        (c.arch, c.n_heads, c.n_kv_heads, c.head_dim),
        (Arch::Gemma3, 8, 4, 256)
    );
    assert_eq!((c.vocab_size, c.sliding_window), (262_208, Some(1024)));
    assert_eq!((c.rope_theta, c.rope_theta_local), (1_000_000.0, 10_000.0));
    assert_eq!(c.rope_scaling, super::RopeScaling::Linear { factor: 8.0 });
    assert!(c.tie_embeddings);
    assert_eq!(c.local_layers.iter().filter(|&&l| !l).count(), 5);
}

/// GGUF metadata from `(key, value)` pairs, numbers and strings as JSON values.
struct Meta(Vec<(String, Value)>);

impl super::config::MetadataSource for Meta {
    fn get_u64(&self, key: &str) -> Option<u64> {
        self.0.iter().find(|(k, _)| *k == key)?.1.as_u64()
    }
    fn get_f64(&self, key: &str) -> Option<f64> {
        self.0.iter().find(|(k, _)| *k == key)?.1.as_f64()
    }
    fn get_str(&self, key: &str) -> Option<String> {
        Some(
            self.0
                .iter()
                .find(|(k, _)| *k == key)?
                .1
                .as_str()?
                .to_string(),
        )
    }
}

fn qwen3moe_meta(extra: &[(&'static str, Value)]) -> Meta {
    let mut meta = vec![
        ("general.architecture", json!("qwen3moe")),
        ("qwen3moe.block_count", json!(2)),
        ("qwen3moe.embedding_length", json!(64)),
        ("qwen3moe.attention.head_count", json!(4)),
        ("qwen3moe.attention.head_count_kv", json!(2)),
        ("qwen3moe.attention.key_length", json!(16)),
        ("qwen3moe.expert_count", json!(8)),
        ("qwen3moe.expert_used_count", json!(2)),
        ("qwen3moe.expert_feed_forward_length", json!(32)),
    ];
    meta.extend(extra.iter().cloned());
    Meta(meta.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
}

#[test]
fn a_qwen3moe_gguf_routes_every_layer_through_renormalised_top_k_experts() {
    let c = super::config::from_gguf(&qwen3moe_meta(&[]), 320)
        .unwrap_or_else(|e| panic!("config: {e}"));
    assert_eq!(c.arch, Arch::Qwen3);
    assert!(c.qk_norm);
    let moe = c.moe.unwrap_or_else(|| panic!("qwen3moe routes"));
    assert_eq!((moe.n_experts, moe.top_k, moe.expert_ffn), (8, 2, 32));
    assert!(moe.norm_topk && moe.sparse_layers == [true, true]);
}

#[test]
fn a_qwen2moe_gguf_adds_its_shared_expert_and_does_not_renormalise_as_llama_cpp() {
    let meta = |extra: &[(&'static str, Value)]| {
        let renamed = qwen3moe_meta(extra)
            .0
            .into_iter()
            .map(|(k, v)| match k.as_str() {
                "general.architecture" => (k, json!("qwen2moe")),
                _ => (k.replacen("qwen3moe.", "qwen2moe.", 1), v),
            });
        Meta(renamed.collect())
    };
    let c = super::config::from_gguf(
        &meta(&[("qwen3moe.expert_shared_feed_forward_length", json!(64))]),
        320,
    )
    .unwrap_or_else(|e| panic!("config: {e}"));
    assert_eq!(c.arch, Arch::Qwen2);
    let moe = c.moe.unwrap_or_else(|| panic!("qwen2moe routes"));
    assert!(!moe.norm_topk);
    assert_eq!(moe.shared_ffn, Some(64));
    let err = super::config::from_gguf(&meta(&[]), 320)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        err.contains("qwen2moe.expert_shared_feed_forward_length"),
        "{err}"
    );
}

#[test]
fn gguf_experts_llama_cpp_would_run_differently_are_refused_naming_the_key() {
    for (key, value, why) in [
        ("qwen3moe.expert_shared_count", json!(1), "shared experts"),
        ("qwen3moe.expert_gating_func", json!(2), "gating function 2"),
    ] {
        let err = super::config::from_gguf(&qwen3moe_meta(&[(key, value)]), 320)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains(key) && err.contains(why), "{key}: {err}");
    }
    let no_count = Meta(
        qwen3moe_meta(&[])
            .0
            .into_iter()
            .filter(|(k, _)| *k != "qwen3moe.expert_count")
            .collect(),
    );
    let err = super::config::from_gguf(&no_count, 320)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("qwen3moe.expert_count"), "{err}");
}

#[test]
fn qwen3_moe_dense_layers_follow_mlp_only_layers_and_decoder_sparse_step() {
    let config = |extra: Value| {
        let mut root = json!({
            "model_type": "qwen3_moe", "num_hidden_layers": 6, "hidden_size": 64,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "intermediate_size": 128, "vocab_size": 320, "num_experts": 4,
            "num_experts_per_tok": 2, "moe_intermediate_size": 32,
        });
        if let (Some(root), Some(extra)) = (root.as_object_mut(), extra.as_object()) {
            root.extend(extra.clone());
        }
        super::config::from_hf_json(&root).unwrap_or_else(|e| panic!("config: {e}"))
    };
    let layers = |c: super::ModelConfig| c.moe.map(|m| m.sparse_layers).unwrap_or_default();
    assert_eq!(layers(config(json!({}))), [true; 6]);
    assert!(!config(json!({})).moe.is_some_and(|m| m.norm_topk));
    assert_eq!(
        layers(config(
            json!({"decoder_sparse_step": 2, "mlp_only_layers": [3]})
        )),
        [false, true, false, false, false, true]
    );
}
