//! gpt-oss beyond matching transformers' logits (that is `safetensors_vs_transformers.rs`):
//! the tiny fixture is sensitive to every feature gpt-oss adds, so leaving any one out
//! would fail that comparison, and what Fallow cannot run is refused at load with the
//! reason.

use fallow_engine::model::{self, FeedForward, ModelArtifacts, RopeScaling, Weights, CUDA_LACKS};
use fallow_engine::quant::{GgmlType, TensorBytes};
use serde_json::{json, Value};

mod tiny_fixture;

use tiny_fixture::{fixture, logits, max_diff, open, TOLERANCE};

/// The fixture with `edit` applied to its freshly opened weights.
fn with_weights(edit: impl FnOnce(&mut Weights)) -> ModelArtifacts {
    let mut artifacts = open(&fixture("gpt_oss"));
    let weights = std::sync::Arc::get_mut(&mut artifacts.weights)
        .unwrap_or_else(|| panic!("freshly opened weights have one owner"));
    edit(weights);
    artifacts
}

/// The fixture with `edit` applied to its config.
fn with_config(edit: impl FnOnce(&mut model::ModelConfig)) -> ModelArtifacts {
    let mut artifacts = open(&fixture("gpt_oss"));
    edit(&mut artifacts.config);
    artifacts
}

fn moe_mut(w: &mut Weights) -> impl Iterator<Item = &mut model::MoeFfn> {
    w.layers.iter_mut().filter_map(|l| match &mut l.ffn {
        FeedForward::Moe(m) => Some(m),
        FeedForward::Dense(_) => None,
    })
}

#[test]
fn leaving_out_any_gpt_oss_feature_moves_the_logits_past_ten_times_the_tolerance() {
    let right = logits(&open(&fixture("gpt_oss")));
    let variants: Vec<(&str, ModelArtifacts)> = vec![
        (
            "no sinks",
            with_weights(|w| w.layers.iter_mut().for_each(|l| l.sinks = None)),
        ),
        (
            "no output bias",
            with_weights(|w| w.layers.iter_mut().for_each(|l| l.bo = None)),
        ),
        (
            "no router bias",
            with_weights(|w| moe_mut(w).for_each(|m| m.router_bias = None)),
        ),
        (
            "no expert biases",
            with_weights(|w| moe_mut(w).for_each(|m| m.expert_biases = None)),
        ),
        (
            "no clamp",
            with_config(|c| {
                if let Some(s) = c.moe.as_mut().and_then(|m| m.clamped_swiglu.as_mut()) {
                    s.limit = f32::INFINITY;
                }
            }),
        ),
        (
            "no YaRN attention factor",
            with_config(|c| {
                if let RopeScaling::Yarn(y) = &mut c.rope_scaling {
                    y.attention_factor = 1.0;
                }
            }),
        ),
        (
            "YaRN's frequencies left unscaled",
            with_config(|c| {
                if let RopeScaling::Yarn(y) = &mut c.rope_scaling {
                    y.factor = 1.0;
                }
            }),
        ),
        (
            "no sliding window",
            with_config(|c| c.sliding_window = None),
        ),
    ];
    for (what, wrong) in variants {
        let diff = max_diff(&right, &logits(&wrong));
        eprintln!("{what}: logits moved {diff}");
        // YaRN's frequencies move least: over 12 positions the slow pairs it divides turn
        // little either way (measured 0.017; every other feature moves logits by > 1).
        assert!(diff > 10.0 * TOLERANCE, "{what}: logits moved only {diff}");
    }
}

#[test]
fn the_gguf_llama_cpps_converter_writes_runs_the_checkpoint_as_llama_cpp_would() {
    // `model.f32.gguf`: `convert_hf_to_gguf.py --outtype f32` of the fixture (llama.cpp as
    // vendored by llama-cpp-python 0.3.36). llama.cpp rounds YaRN's ramp to whole pairs
    // (`ggml_rope_yarn_corr_dims`) and clamps at a constant 7 (`LLM_FFN_SWIGLU_OAI_MOE`),
    // where the checkpoint says `truncate: false` and 1.5.
    let gguf = open(&fixture("gpt_oss").join("model.f32.gguf"));
    let yarn = match gguf.config.rope_scaling {
        RopeScaling::Yarn(y) => y,
        other => panic!("YaRN expected, got {other:?}"),
    };
    assert!(yarn.truncate && yarn.factor == 32.0 && yarn.original_context == 4096);
    assert!((yarn.attention_factor - (1.0 + 0.1 * 32f32.ln())).abs() < 1e-6);
    let c = &gguf.config;
    assert!(c.qkv_bias && c.o_bias && c.attn_sinks);
    assert_eq!(
        (c.sliding_window, c.local_layers.clone()),
        (Some(5), vec![true, false])
    );
    let clamp = c.moe.as_ref().and_then(|m| m.clamped_swiglu);
    assert_eq!(clamp.map(|s| (s.alpha, s.limit)), Some((1.702, 7.0)));
    let as_llama_cpp = with_config(|c| {
        if let RopeScaling::Yarn(y) = &mut c.rope_scaling {
            y.truncate = true;
        }
        if let Some(s) = c.moe.as_mut().and_then(|m| m.clamped_swiglu.as_mut()) {
            s.limit = 7.0;
        }
    });
    let diff = max_diff(&logits(&gguf), &logits(&as_llama_cpp));
    eprintln!("converted GGUF vs checkpoint as llama.cpp runs it: max |Δ logit| {diff}");
    assert!(diff <= TOLERANCE, "max |Δ logit| {diff}");
}

#[test]
fn the_cuda_backend_lacks_no_feature_gpt_oss_needs() {
    // Sinks, the output bias, biased clamped experts and YaRN: each is CUDA's too (the
    // conformance suite compares its logits), so the model is not refused.
    let gpt_oss = open(&fixture("gpt_oss")).config;
    assert_eq!(gpt_oss.features().len(), 4, "{:?}", gpt_oss.features());
    if let Err(e) = gpt_oss.require_features("CUDA", CUDA_LACKS) {
        panic!("CUDA refuses gpt-oss: {e}");
    }
}

/// A copy of fixture `name` with `edit` applied to its config.json.
fn edited_copy(name: &str, edit: impl FnOnce(&mut Value)) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    for entry in std::fs::read_dir(fixture(name)).unwrap_or_else(|e| panic!("{e}")) {
        let path = entry.unwrap_or_else(|e| panic!("entry: {e}")).path();
        let to = dir.path().join(path.file_name().unwrap_or_default());
        std::fs::copy(&path, &to).unwrap_or_else(|e| panic!("copy {}: {e}", path.display()));
    }
    let path = dir.path().join("config.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("config: {e}"));
    let mut config: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("json: {e}"));
    edit(&mut config);
    std::fs::write(&path, config.to_string()).unwrap_or_else(|e| panic!("write: {e}"));
    dir
}

#[test]
fn a_quantized_checkpoint_other_than_gpt_oss_mxfp4_is_refused_naming_its_method() {
    let refused = [
        ("gpt_oss", "fp8"),
        ("gpt_oss", "bitsandbytes"),
        ("qwen3_moe", "mxfp4"),
    ];
    for (name, method) in refused {
        let dir = edited_copy(name, |c| {
            c["quantization_config"] = json!({ "quant_method": method })
        });
        let err = match model::open(dir.path()) {
            Ok(_) => panic!("a {method} {name} opened"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains(method), "{err}");
    }
}

/// Every expert matrix of `artifacts`, and the bytes they hold.
fn expert_matrices(artifacts: &ModelArtifacts) -> Vec<&fallow_engine::quant::QMatrix> {
    let mut all = Vec::new();
    for layer in &artifacts.weights.layers {
        let FeedForward::Moe(moe) = &layer.ffn else {
            panic!("gpt-oss layers route");
        };
        for expert in &moe.experts {
            all.extend([&expert.gate, &expert.up, &expert.down]);
        }
    }
    all
}

#[test]
fn hf_mxfp4_experts_are_held_at_four_and_a_quarter_bits_a_weight() {
    let artifacts = open(&fixture("gpt_oss_mxfp4"));
    let (mut weights, mut bytes) = (0, 0);
    for m in expert_matrices(&artifacts) {
        assert_eq!(m.dtype, GgmlType::MXFP4);
        weights += m.rows * m.cols;
        bytes += m.bytes().len();
    }
    // 2 layers × 8 experts × 3 matrices of 64 × 64.
    assert_eq!(weights, 2 * 8 * 3 * 64 * 64);
    let bits = 8.0 * bytes as f64 / weights as f64;
    assert_eq!(bits, 4.25, "not widened (BF16 would be 16)");
}

#[test]
fn a_gguf_with_mxfp4_experts_loads_them_unexpanded_from_the_mapped_file() {
    let path = fixture("gpt_oss_mxfp4").join("model.mxfp4.gguf");
    let artifacts = model::open(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
    let experts = expert_matrices(&artifacts);
    assert!(!experts.is_empty());
    for m in experts {
        assert_eq!(m.dtype, GgmlType::MXFP4);
        assert!(
            matches!(m.data, TensorBytes::Mapped { .. }),
            "{m:?} was copied out of the file"
        );
    }
    // And it runs: the same experts as the HF directory, so the same logits up to
    // llama.cpp's rounding of activations (`moe_vs_llama_cpp.rs` bounds that).
    assert!(logits(&artifacts).iter().all(|v| v.is_finite()));
}

#[test]
fn without_layer_types_or_rope_theta_transformers_defaults_apply() {
    let dir = edited_copy("gpt_oss", |c| {
        if let Some(obj) = c.as_object_mut() {
            obj.remove("layer_types");
            obj.remove("rope_theta");
        }
    });
    let config = open(dir.path()).config;
    // Even layers slide; the RoPE base is 150 000.
    assert_eq!(config.local_layers, vec![true, false]);
    assert_eq!(config.rope_theta, 150_000.0);
    assert_eq!(
        logits(&open(dir.path())),
        logits(&open(&fixture("gpt_oss")))
    );
}
