//! The shape and numerics of a model, read either from GGUF metadata or from a Hugging Face
//! `config.json`. Everything the forward pass needs to know that is not a tensor lives here,
//! already resolved per layer (sliding window, RoPE base), so the backend has no
//! architecture-specific `if`s beyond the few switches below.

use serde_json::Value;

use super::ModelError;

/// The architectures Fallow runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// Llama 2/3.x, SmolLM2, Mistral (GGUF `llama`, HF `llama` / `mistral`).
    Llama,
    /// Qwen2 / Qwen2.5: biases on the Q, K and V projections.
    Qwen2,
    /// Qwen3: RMSNorm over each Q and K head before RoPE.
    Qwen3,
    /// Gemma 3 (text): GELU, sandwich norms, scaled embeddings, local/global attention.
    Gemma3,
    /// OpenAI's gpt-oss: biased attention with per-head sinks, alternating sliding and full
    /// layers, YaRN RoPE, and biased experts with a clamped SwiGLU.
    GptOss,
}

/// How RoPE pairs up the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Pairs `(x[2i], x[2i+1])`: llama.cpp's "normal" RoPE. llama.cpp's converter permutes
    /// the Q/K rows of `llama`-arch GGUF files so that this is right for them.
    Interleaved,
    /// Pairs `(x[i], x[i + d/2])` (HF `rotate_half`): HF checkpoints, and Qwen/Gemma GGUFs.
    Neox,
}

/// Stretching of RoPE frequencies for long contexts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeScaling {
    None,
    /// Positions divided by `factor`.
    Linear {
        factor: f32,
    },
    /// Llama 3.1's smooth per-frequency scaling.
    Llama3 {
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original_context: usize,
    },
    /// YaRN (as transformers' `_compute_yarn_parameters`): frequencies blended between
    /// kept and divided by `factor` over a ramp of rotation counts `beta_fast..beta_slow`,
    /// and cos/sin multiplied by an attention factor.
    Yarn(Yarn),
}

/// YaRN's settings, as `rope_scaling` / `rope_parameters` give them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Yarn {
    pub factor: f32,
    pub beta_fast: f32,
    pub beta_slow: f32,
    pub original_context: usize,
    /// Round the ramp's ends to whole dimensions (transformers' default; gpt-oss says false).
    pub truncate: bool,
    /// Multiplier on cos and sin (so on every attention score, squared): the config's
    /// `attention_factor`, else `0.1 ln(factor) + 1` (or the `mscale`/`mscale_all_dim` ratio).
    pub attention_factor: f32,
}

/// The feed-forward gate activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// SwiGLU: `silu(gate) * up`.
    Silu,
    /// GeGLU with the tanh approximation (Gemma).
    GeluTanh,
}

/// A mixture-of-experts feed-forward: each token goes through `top_k` of `n_experts`
/// SwiGLU experts, chosen and weighted by a softmax router.
#[derive(Debug, Clone, PartialEq)]
pub struct MoeConfig {
    pub n_experts: usize,
    /// Experts per token.
    pub top_k: usize,
    /// Inner width of one expert.
    pub expert_ffn: usize,
    /// Renormalise the chosen experts' weights to sum to one (Mixtral always; Qwen3-MoE
    /// `norm_topk_prob`).
    pub norm_topk: bool,
    /// Per layer: routed (true) or a dense feed-forward of [`ModelConfig::ffn`] (Qwen-MoE's
    /// `mlp_only_layers` and `decoder_sparse_step`).
    pub sparse_layers: Vec<bool>,
    /// Width of the shared expert every token also goes through, weighted by a sigmoid gate
    /// of its own (Qwen2-MoE).
    pub shared_ffn: Option<usize>,
    /// gpt-oss's experts: their activation is the clamped SwiGLU below instead of the
    /// model's [`Activation`] (router and experts also have biases, found by the loader).
    pub clamped_swiglu: Option<ClampedSwiglu>,
}

/// gpt-oss's expert activation: `(clamp(up, ±limit) + 1) · g · sigmoid(alpha · g)` with
/// `g = min(gate, limit)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClampedSwiglu {
    pub alpha: f32,
    pub limit: f32,
}

impl MoeConfig {
    /// How many layers route.
    pub fn routed_layers(&self) -> usize {
        self.sparse_layers.iter().filter(|&&s| s).count()
    }
}

/// The resolved shape and numerics of a decoder-only transformer.
#[derive(Debug, Clone)]
pub struct ModelConfig {
    pub arch: Arch,
    pub n_layers: usize,
    pub hidden: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Feed-forward inner width.
    pub ffn: usize,
    pub vocab_size: usize,
    pub context_length: usize,
    pub rms_eps: f32,
    /// RoPE base of global layers (all layers for non-Gemma models).
    pub rope_theta: f32,
    /// RoPE base of sliding-window layers (Gemma 3: 10 000).
    pub rope_theta_local: f32,
    /// Scaling applied to global layers only (Gemma 3 does not scale its local layers).
    pub rope_scaling: RopeScaling,
    pub rope_style: RopeStyle,
    pub qkv_bias: bool,
    pub qk_norm: bool,
    /// The output projection is the token embedding matrix.
    pub tie_embeddings: bool,
    pub activation: Activation,
    /// Multiplier on embeddings (Gemma: `sqrt(hidden)`).
    pub embedding_scale: Option<f32>,
    /// Gemma's extra norms after attention and after the feed-forward block.
    pub post_norms: bool,
    /// Added to every stored RMSNorm weight at load time: 1.0 for HF Gemma checkpoints
    /// (which compute `x * (1 + w)`), 0.0 for GGUF files (the converter already added it).
    pub norm_weight_offset: f32,
    /// Sliding attention window in tokens, for the layers marked local.
    pub sliding_window: Option<usize>,
    /// Per layer: does it use the sliding window (and the local RoPE base)?
    pub local_layers: Vec<bool>,
    /// Softmax scale of attention scores (`1/sqrt(head_dim)`, or Gemma's
    /// `query_pre_attn_scalar^-0.5`).
    pub attn_scale: f32,
    pub attn_logit_softcap: Option<f32>,
    pub final_logit_softcap: Option<f32>,
    /// Set for mixture-of-experts models.
    pub moe: Option<MoeConfig>,
    /// The attention output projection has a bias (gpt-oss).
    pub o_bias: bool,
    /// Each query head has a learned sink logit that joins its softmax's denominator and
    /// contributes no value (gpt-oss's `self_attn.sinks`).
    pub attn_sinks: bool,
}

impl ModelConfig {
    /// Width of all query heads together.
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    /// Width of all key (or value) heads together.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// Whether layer `layer` attends through the sliding window.
    pub fn is_local_layer(&self, layer: usize) -> bool {
        self.sliding_window.is_some() && self.local_layers.get(layer).copied().unwrap_or(false)
    }

    /// The attention window of `layer` (None: full causal attention).
    pub fn layer_window(&self, layer: usize) -> Option<usize> {
        if self.is_local_layer(layer) {
            self.sliding_window
        } else {
            None
        }
    }

    /// The routing of `layer`, when it is a mixture-of-experts layer.
    pub fn layer_moe(&self, layer: usize) -> Option<&MoeConfig> {
        self.moe
            .as_ref()
            .filter(|m| m.sparse_layers.get(layer).copied().unwrap_or(false))
    }

    /// Whether `layer` rotates with the local RoPE base: Gemma 3's sliding layers only
    /// (Mistral's window keeps the one global base).
    pub fn uses_local_rope(&self, layer: usize) -> bool {
        self.arch == Arch::Gemma3 && self.is_local_layer(layer)
    }

    /// Checks the invariants the backend relies on (divisibility, non-zero sizes).
    pub fn validate(&self) -> Result<(), ModelError> {
        let bad = |why: String| Err(ModelError::Config(why));
        if self.n_layers == 0 || self.hidden == 0 || self.head_dim == 0 || self.ffn == 0 {
            return bad(format!(
                "zero size: n_layers={} hidden={} head_dim={} ffn={}",
                self.n_layers, self.hidden, self.head_dim, self.ffn
            ));
        }
        if self.n_heads == 0
            || self.n_kv_heads == 0
            || !self.n_heads.is_multiple_of(self.n_kv_heads)
        {
            return bad(format!(
                "attention.head_count {} must be a positive multiple of head_count_kv {}",
                self.n_heads, self.n_kv_heads
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return bad(format!("head_dim {} must be even for RoPE", self.head_dim));
        }
        if self.vocab_size == 0 || self.context_length == 0 {
            return bad(format!(
                "vocab_size {} and context_length {} must be positive",
                self.vocab_size, self.context_length
            ));
        }
        if self.local_layers.len() != self.n_layers {
            return bad(format!(
                "{} local-layer flags for {} layers",
                self.local_layers.len(),
                self.n_layers
            ));
        }
        if let Some(m) = &self.moe {
            if m.n_experts == 0
                || m.top_k == 0
                || m.top_k > m.n_experts
                || m.expert_ffn == 0
                || m.shared_ffn == Some(0)
            {
                return bad(format!(
                    "mixture of experts needs 0 < experts per token ({}) <= experts ({}) \
                     and a positive expert width ({})",
                    m.top_k, m.n_experts, m.expert_ffn
                ));
            }
            if m.sparse_layers.len() != self.n_layers {
                return bad(format!(
                    "{} sparse-layer flags for {} layers",
                    m.sparse_layers.len(),
                    self.n_layers
                ));
            }
        }
        Ok(())
    }
}

/// Typed access to GGUF metadata, so parsing the config does not depend on the reader's
/// value representation.
pub trait MetadataSource {
    fn get_u64(&self, key: &str) -> Option<u64>;
    fn get_f64(&self, key: &str) -> Option<f64>;
    fn get_str(&self, key: &str) -> Option<String>;
}

/// Gemma 3 makes every sixth layer global (1-based: layers 6, 12, …).
const GEMMA3_GLOBAL_EVERY: usize = 6;

fn gemma_local_layers(n_layers: usize, every: usize) -> Vec<bool> {
    (0..n_layers)
        .map(|l| every == 0 || (l + 1) % every != 0)
        .collect()
}

/// Reads the config from GGUF metadata (`general.architecture` and `{arch}.*` keys).
/// `vocab_fallback` is used when `{arch}.vocab_size` is absent (the token list length).
pub fn from_gguf(
    meta: &dyn MetadataSource,
    vocab_fallback: usize,
) -> Result<ModelConfig, ModelError> {
    let arch_name = meta
        .get_str("general.architecture")
        .ok_or_else(|| ModelError::MissingKey("general.architecture".into()))?;
    let arch = match arch_name.as_str() {
        "llama" | "mistral" => Arch::Llama,
        "qwen2" | "qwen2moe" => Arch::Qwen2,
        "qwen3" | "qwen3moe" => Arch::Qwen3,
        "gemma3" => Arch::Gemma3,
        "gpt-oss" => Arch::GptOss,
        other => return Err(ModelError::UnsupportedArch(other.to_string())),
    };
    let key = |k: &str| format!("{arch_name}.{k}");
    let req_u = |k: &str| -> Result<usize, ModelError> {
        let full = key(k);
        meta.get_u64(&full)
            .map(|v| v as usize)
            .ok_or(ModelError::MissingKey(full))
    };
    let opt_u = |k: &str| meta.get_u64(&key(k)).map(|v| v as usize);
    let opt_f = |k: &str| meta.get_f64(&key(k)).map(|v| v as f32);

    let n_layers = req_u("block_count")?;
    let hidden = req_u("embedding_length")?;
    let n_heads = req_u("attention.head_count")?;
    let n_kv_heads = opt_u("attention.head_count_kv").unwrap_or(n_heads);
    let head_dim = opt_u("attention.key_length").unwrap_or(hidden / n_heads.max(1));
    let rope_scaling = gguf_rope_scaling(meta, &arch_name)?;
    if let Some(rope_dims) = opt_u("rope.dimension_count").filter(|&d| d != head_dim) {
        return Err(ModelError::Unsupported(format!(
            "{}: partial rotary ({rope_dims} of {head_dim} dims)",
            key("rope.dimension_count")
        )));
    }
    let is_gemma = arch == Arch::Gemma3;
    let is_gpt_oss = arch == Arch::GptOss;
    let sliding_window = if is_gemma || is_gpt_oss {
        opt_u("attention.sliding_window")
    } else {
        None
    };
    // llama.cpp scales Gemma 3 27B queries by hidden/heads, every other size by head_dim;
    // GGUF files carry no query_pre_attn_scalar key.
    let query_pre_attn_scalar = if is_gemma && n_layers == 62 {
        (hidden / n_heads.max(1)) as f32
    } else {
        head_dim as f32
    };
    let moe = gguf_moe(meta, &arch_name, n_layers)?;
    let ffn = match (opt_u("feed_forward_length"), &moe) {
        (Some(ffn), _) => ffn,
        // MoE files may carry only the expert width (every layer routes).
        (None, Some(m)) => m.expert_ffn,
        (None, None) => req_u("feed_forward_length")?,
    };
    let config = ModelConfig {
        arch,
        n_layers,
        hidden,
        n_heads,
        n_kv_heads,
        head_dim,
        ffn,
        vocab_size: opt_u("vocab_size").unwrap_or(vocab_fallback),
        context_length: opt_u("context_length").unwrap_or(2048),
        rms_eps: opt_f("attention.layer_norm_rms_epsilon").unwrap_or(1e-5),
        rope_theta: opt_f("rope.freq_base").unwrap_or(10_000.0),
        rope_theta_local: 10_000.0,
        rope_scaling,
        rope_style: if arch == Arch::Llama {
            RopeStyle::Interleaved
        } else {
            RopeStyle::Neox
        },
        qkv_bias: matches!(arch, Arch::Qwen2 | Arch::GptOss),
        qk_norm: matches!(arch, Arch::Qwen3 | Arch::Gemma3),
        tie_embeddings: false, // decided by the loader from the presence of `output.weight`
        activation: if is_gemma {
            Activation::GeluTanh
        } else {
            Activation::Silu
        },
        embedding_scale: is_gemma.then(|| (hidden as f32).sqrt()),
        post_norms: is_gemma,
        norm_weight_offset: 0.0,
        sliding_window,
        local_layers: match (sliding_window, arch) {
            // llama.cpp's `set_swa_pattern(2)`: even layers slide.
            (Some(_), Arch::GptOss) => (0..n_layers).map(|l| l % 2 == 0).collect(),
            (Some(_), _) => gemma_local_layers(n_layers, GEMMA3_GLOBAL_EVERY),
            (None, _) => vec![false; n_layers],
        },
        attn_scale: 1.0 / query_pre_attn_scalar.sqrt(),
        attn_logit_softcap: opt_f("attn_logit_softcapping").filter(|v| *v > 0.0),
        final_logit_softcap: opt_f("final_logit_softcapping").filter(|v| *v > 0.0),
        moe,
        o_bias: is_gpt_oss,
        attn_sinks: is_gpt_oss,
    };
    config.validate()?;
    Ok(config)
}

/// llama.cpp's expert keys: `qwen3moe` and `qwen2moe` always route; `llama` does when it
/// has experts (Mixtral). llama.cpp renormalises the top-k softmax weights of the first and
/// the last, not of `qwen2moe`, which adds a gated shared expert. Anything llama.cpp would
/// run differently (other shared experts, another gating function) is refused.
fn gguf_moe(
    meta: &dyn MetadataSource,
    arch: &str,
    n_layers: usize,
) -> Result<Option<MoeConfig>, ModelError> {
    let key = |k: &str| format!("{arch}.{k}");
    let get = |k: &str| meta.get_u64(&key(k)).map(|v| v as usize);
    let n_experts = get("expert_count").unwrap_or(0);
    if n_experts == 0 {
        return match arch {
            "qwen3moe" | "qwen2moe" => Err(ModelError::MissingKey(key("expert_count"))),
            _ => Ok(None),
        };
    }
    if !matches!(
        arch,
        "qwen3moe" | "qwen2moe" | "llama" | "mistral" | "gpt-oss"
    ) {
        return Err(ModelError::Unsupported(format!(
            "{}: experts in a `{arch}` model",
            key("expert_count")
        )));
    }
    let qwen2 = arch == "qwen2moe";
    if let Some(n) = get("expert_shared_count").filter(|&n| n > usize::from(qwen2)) {
        return Err(ModelError::Unsupported(format!(
            "{}: {n} shared experts",
            key("expert_shared_count")
        )));
    }
    let gpt_oss = arch == "gpt-oss";
    // llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX (gpt-oss's graph fixes its own:
    // softmax over the chosen experts' logits, the same weights renormalised).
    if let Some(g) = get("expert_gating_func").filter(|&g| g != 1 && !gpt_oss) {
        return Err(ModelError::Unsupported(format!(
            "{}: gating function {g} (only softmax routing is supported)",
            key("expert_gating_func")
        )));
    }
    let top_k =
        get("expert_used_count").ok_or_else(|| ModelError::MissingKey(key("expert_used_count")))?;
    let expert_ffn = get("expert_feed_forward_length")
        .or_else(|| get("feed_forward_length"))
        .ok_or_else(|| ModelError::MissingKey(key("expert_feed_forward_length")))?;
    let shared_ffn = match qwen2 {
        true => Some(
            get("expert_shared_feed_forward_length")
                .ok_or_else(|| ModelError::MissingKey(key("expert_shared_feed_forward_length")))?,
        ),
        false => None,
    };
    Ok(Some(MoeConfig {
        n_experts,
        top_k,
        expert_ffn,
        norm_topk: !qwen2,
        sparse_layers: vec![true; n_layers],
        shared_ffn,
        // llama.cpp's LLM_FFN_SWIGLU_OAI_MOE takes transformers' defaults as constants.
        clamped_swiglu: gpt_oss.then_some(ClampedSwiglu {
            alpha: GPT_OSS_SWIGLU_ALPHA,
            limit: GPT_OSS_SWIGLU_LIMIT,
        }),
    }))
}

/// `{arch}.rope.scaling.*`: none, linear or YaRN. (Llama 3 scaling arrives as the
/// `rope_freqs.weight` tensor instead, see `Weights::rope_freq_factors`.)
fn gguf_rope_scaling(meta: &dyn MetadataSource, arch: &str) -> Result<RopeScaling, ModelError> {
    let type_key = format!("{arch}.rope.scaling.type");
    let get = |k: &str| meta.get_f64(&format!("{arch}.rope.scaling.{k}"));
    let factor = get("factor").map(|f| f as f32);
    match meta.get_str(&type_key).as_deref() {
        None | Some("none") => Ok(RopeScaling::None),
        Some("linear") => Ok(match factor {
            Some(f) if f > 0.0 && f != 1.0 => RopeScaling::Linear { factor: f },
            _ => RopeScaling::None,
        }),
        Some("yarn") => {
            let factor = factor.unwrap_or(1.0);
            let original_key = format!("{arch}.rope.scaling.original_context_length");
            let original_context =
                meta.get_u64(&original_key)
                    .ok_or(ModelError::MissingKey(original_key))? as usize;
            // ggml's rope: `attn_factor · (1 + 0.1 ln factor)` on cos and sin, and the
            // ramp's ends rounded to whole dimensions (`ggml_rope_yarn_corr_dims`).
            let mscale = if factor > 1.0 {
                1.0 + 0.1 * (factor as f64).ln()
            } else {
                1.0
            };
            Ok(RopeScaling::Yarn(Yarn {
                factor,
                beta_fast: get("yarn_beta_fast").unwrap_or(32.0) as f32,
                beta_slow: get("yarn_beta_slow").unwrap_or(1.0) as f32,
                original_context,
                truncate: true,
                attention_factor: (get("attn_factor").unwrap_or(1.0) * mscale) as f32,
            }))
        }
        Some(other) => Err(ModelError::Unsupported(format!("{type_key}: {other:?}"))),
    }
}

/// Reads the config from an HF `config.json` value. Multimodal Gemma 3 checkpoints nest the
/// language model's settings under `text_config`.
pub fn from_hf_json(root: &Value) -> Result<ModelConfig, ModelError> {
    let nested = root.get("text_config").filter(|v| v.is_object());
    let model_type = nested
        .and_then(|c| c.get("model_type"))
        .or_else(|| root.get("model_type"))
        .and_then(Value::as_str)
        .ok_or_else(|| ModelError::MissingKey("config.json: model_type".into()))?;
    let arch = match model_type {
        "llama" | "mistral" | "mixtral" => Arch::Llama,
        "qwen2" | "qwen2_moe" => Arch::Qwen2,
        "qwen3" | "qwen3_moe" => Arch::Qwen3,
        "gemma3" | "gemma3_text" => Arch::Gemma3,
        "gpt_oss" => Arch::GptOss,
        other => return Err(ModelError::UnsupportedArch(other.to_string())),
    };
    refuse_quantization(root, arch)?;
    let merged = with_defaults(arch, nested.unwrap_or(root));
    let cfg = &merged;
    let req_u = |k: &str| -> Result<usize, ModelError> {
        cfg.get(k)
            .and_then(Value::as_u64)
            .map(|v| v as usize)
            .ok_or_else(|| ModelError::MissingKey(format!("config.json: {k}")))
    };
    let opt_u = |k: &str| cfg.get(k).and_then(Value::as_u64).map(|v| v as usize);
    let opt_f = |k: &str| cfg.get(k).and_then(Value::as_f64).map(|v| v as f32);
    let opt_b = |k: &str| cfg.get(k).and_then(Value::as_bool);

    let is_gemma = arch == Arch::Gemma3;
    let n_layers = req_u("num_hidden_layers")?;
    let hidden = req_u("hidden_size")?;
    let n_heads = req_u("num_attention_heads")?;
    let head_dim = opt_u("head_dim").unwrap_or(hidden / n_heads.max(1));
    let sliding_window = match arch {
        Arch::Gemma3 | Arch::GptOss => opt_u("sliding_window"),
        Arch::Llama if model_type != "llama" => opt_u("sliding_window"),
        _ => None,
    };
    let local_layers = hf_local_layers(cfg, arch, n_layers, sliding_window.is_some());
    let query_pre_attn_scalar = opt_f("query_pre_attn_scalar").unwrap_or(head_dim as f32);
    let (rope_global, rope_local) = hf_rope_parameters(cfg);
    let theta_of = |p: Option<&Value>| {
        p.and_then(|p| p.get("rope_theta"))
            .and_then(Value::as_f64)
            .map(|v| v as f32)
    };
    let config = ModelConfig {
        arch,
        n_layers,
        hidden,
        n_heads,
        n_kv_heads: opt_u("num_key_value_heads").unwrap_or(n_heads),
        head_dim,
        ffn: req_u("intermediate_size")?,
        vocab_size: req_u("vocab_size")?,
        context_length: opt_u("max_position_embeddings").unwrap_or(2048),
        rms_eps: opt_f("rms_norm_eps").unwrap_or(1e-6),
        rope_theta: theta_of(rope_global)
            .or_else(|| opt_f("rope_theta"))
            // transformers' `GptOssConfig.default_theta`.
            .unwrap_or(if arch == Arch::GptOss {
                150_000.0
            } else {
                10_000.0
            }),
        rope_theta_local: theta_of(rope_local)
            .or_else(|| opt_f("rope_local_base_freq"))
            .unwrap_or(10_000.0),
        rope_scaling: hf_rope_scaling(
            rope_global.or_else(|| cfg.get("rope_scaling")),
            opt_u("max_position_embeddings"),
        )?,
        rope_style: RopeStyle::Neox,
        qkv_bias: arch == Arch::Qwen2 || opt_b("attention_bias").unwrap_or(false),
        o_bias: arch == Arch::GptOss && opt_b("attention_bias").unwrap_or(true),
        attn_sinks: arch == Arch::GptOss,
        qk_norm: matches!(arch, Arch::Qwen3 | Arch::Gemma3),
        tie_embeddings: opt_b("tie_word_embeddings")
            .or_else(|| root.get("tie_word_embeddings").and_then(Value::as_bool))
            .unwrap_or(is_gemma),
        activation: if is_gemma {
            Activation::GeluTanh
        } else {
            Activation::Silu
        },
        embedding_scale: is_gemma.then(|| (hidden as f32).sqrt()),
        post_norms: is_gemma,
        norm_weight_offset: if is_gemma { 1.0 } else { 0.0 },
        sliding_window,
        local_layers,
        attn_scale: 1.0 / query_pre_attn_scalar.sqrt(),
        attn_logit_softcap: opt_f("attn_logit_softcapping").filter(|v| *v > 0.0),
        final_logit_softcap: opt_f("final_logit_softcapping").filter(|v| *v > 0.0),
        moe: hf_moe(cfg, model_type, n_layers)?,
    };
    config.validate()?;
    Ok(config)
}

/// The experts of `mixtral`, `qwen2_moe` and `qwen3_moe` configs. Mixtral's experts are
/// `intermediate_size` wide and always renormalised; Qwen-MoE's are `moe_intermediate_size`
/// wide, renormalised when `norm_topk_prob`, and a layer routes unless it is in
/// `mlp_only_layers` or skipped by `decoder_sparse_step` (as transformers decides it).
/// Qwen2-MoE adds a shared expert of `shared_expert_intermediate_size`.
fn hf_moe(cfg: &Value, model_type: &str, n_layers: usize) -> Result<Option<MoeConfig>, ModelError> {
    let req_u = |k: &str| -> Result<usize, ModelError> {
        cfg.get(k)
            .and_then(Value::as_u64)
            .map(|v| v as usize)
            .ok_or_else(|| ModelError::MissingKey(format!("config.json: {k}")))
    };
    let opt_f = |k: &str| cfg.get(k).and_then(Value::as_f64).map(|v| v as f32);
    // Mixtral and gpt-oss: every layer routed, the top k renormalised (gpt-oss's softmax
    // over the top-k logits gives the same weights), no shared expert.
    let every_layer = |clamped_swiglu| -> Result<Option<MoeConfig>, ModelError> {
        Ok(Some(MoeConfig {
            n_experts: req_u("num_local_experts")?,
            top_k: req_u("num_experts_per_tok")?,
            expert_ffn: req_u("intermediate_size")?,
            norm_topk: true,
            sparse_layers: vec![true; n_layers],
            shared_ffn: None,
            clamped_swiglu,
        }))
    };
    match model_type {
        "mixtral" => every_layer(None),
        "gpt_oss" => every_layer(Some(ClampedSwiglu {
            alpha: opt_f("swiglu_alpha").unwrap_or(GPT_OSS_SWIGLU_ALPHA),
            limit: opt_f("swiglu_limit").unwrap_or(GPT_OSS_SWIGLU_LIMIT),
        })),
        "qwen2_moe" | "qwen3_moe" => {
            // transformers 5 writes Qwen3-MoE's `num_experts` as `num_local_experts`.
            let n_experts = req_u("num_experts").or_else(|_| req_u("num_local_experts"))?;
            let step = cfg
                .get("decoder_sparse_step")
                .and_then(Value::as_u64)
                .unwrap_or(1) as usize;
            let dense: Vec<u64> = cfg
                .get("mlp_only_layers")
                .and_then(Value::as_array)
                .map(|a| a.iter().filter_map(Value::as_u64).collect())
                .unwrap_or_default();
            let sparse_layers = (0..n_layers)
                .map(|l| !dense.contains(&(l as u64)) && step > 0 && (l + 1).is_multiple_of(step))
                .collect();
            Ok(Some(MoeConfig {
                n_experts,
                top_k: req_u("num_experts_per_tok")?,
                expert_ffn: req_u("moe_intermediate_size")?,
                norm_topk: cfg
                    .get("norm_topk_prob")
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
                sparse_layers,
                shared_ffn: match model_type {
                    "qwen2_moe" => {
                        Some(req_u("shared_expert_intermediate_size")?).filter(|&w| w > 0)
                    }
                    _ => None,
                },
                clamped_swiglu: None,
            }))
        }
        _ => Ok(None),
    }
}

/// gpt-oss's default `swiglu_alpha` and `swiglu_limit` (transformers' `GptOssConfig`).
const GPT_OSS_SWIGLU_ALPHA: f32 = 1.702;
const GPT_OSS_SWIGLU_LIMIT: f32 = 7.0;

/// A `quantization_config` names weights stored in a way the loader would misread: only
/// gpt-oss's MXFP4 experts are read (see `gpt_oss_experts`), any other is refused with its
/// method.
fn refuse_quantization(root: &Value, arch: Arch) -> Result<(), ModelError> {
    let Some(q) = root.get("quantization_config").filter(|v| !v.is_null()) else {
        return Ok(());
    };
    let method = q
        .get("quant_method")
        .and_then(Value::as_str)
        .unwrap_or("unnamed");
    if arch == Arch::GptOss && method == "mxfp4" {
        return Ok(());
    }
    Err(ModelError::Unsupported(format!(
        "config.json: quantization_config.quant_method {method:?} (only unquantized \
         safetensors, and gpt-oss's MXFP4 experts, are read; use a bf16/f32 checkpoint or \
         a GGUF file)"
    )))
}

/// Multimodal Gemma 3 checkpoints leave out `text_config` keys that equal transformers'
/// `Gemma3TextConfig` defaults; fill those in so only genuinely missing keys are errors.
fn with_defaults(arch: Arch, cfg: &Value) -> Value {
    let mut merged = cfg.clone();
    if arch != Arch::Gemma3 {
        return merged;
    }
    let defaults = serde_json::json!({
        "vocab_size": 262_208, "num_attention_heads": 8, "num_key_value_heads": 4,
        "head_dim": 256, "rms_norm_eps": 1e-6, "rope_theta": 1_000_000.0,
        "rope_local_base_freq": 10_000.0, "query_pre_attn_scalar": 256,
        "sliding_window": 4096, "max_position_embeddings": 131_072,
    });
    if let (Some(obj), Some(defaults)) = (merged.as_object_mut(), defaults.as_object()) {
        for (k, v) in defaults {
            obj.entry(k.clone()).or_insert_with(|| v.clone());
        }
    }
    merged
}

/// Which layers slide: `layer_types` when given (newer transformers), else Gemma's
/// `sliding_window_pattern` (default 6), else every layer when a window is set (Mistral).
fn hf_local_layers(cfg: &Value, arch: Arch, n_layers: usize, has_window: bool) -> Vec<bool> {
    if !has_window {
        return vec![false; n_layers];
    }
    if let Some(types) = cfg.get("layer_types").and_then(Value::as_array) {
        if types.len() == n_layers {
            return types
                .iter()
                .map(|t| t.as_str() == Some("sliding_attention"))
                .collect();
        }
    }
    if arch == Arch::GptOss {
        // transformers' default: even layers (0, 2, …) slide, odd layers attend fully.
        return (0..n_layers).map(|l| l % 2 == 0).collect();
    }
    if arch == Arch::Gemma3 {
        let every = cfg
            .get("sliding_window_pattern")
            .and_then(Value::as_u64)
            .map(|v| v as usize)
            .unwrap_or(GEMMA3_GLOBAL_EVERY);
        return gemma_local_layers(n_layers, every);
    }
    vec![true; n_layers]
}

/// transformers >= 5 writes `rope_parameters` (`rope_theta` inside, next to the scaling keys)
/// instead of top-level `rope_theta` / `rope_scaling`; Gemma 3 nests one such object per
/// attention type. Returns the global layers' and the sliding layers' objects.
fn hf_rope_parameters(cfg: &Value) -> (Option<&Value>, Option<&Value>) {
    let Some(params) = cfg.get("rope_parameters").filter(|v| v.is_object()) else {
        return (None, None);
    };
    match params.get("full_attention").filter(|v| v.is_object()) {
        Some(full) => (
            Some(full),
            params.get("sliding_attention").filter(|v| v.is_object()),
        ),
        None => (Some(params), None),
    }
}

/// `rope_scaling` (or the scaling keys of `rope_parameters`); `max_positions` is YaRN's
/// fallback for `original_max_position_embeddings`, as in transformers.
fn hf_rope_scaling(
    v: Option<&Value>,
    max_positions: Option<usize>,
) -> Result<RopeScaling, ModelError> {
    let Some(obj) = v.filter(|v| v.is_object()) else {
        return Ok(RopeScaling::None);
    };
    let f = |k: &str| obj.get(k).and_then(Value::as_f64).map(|x| x as f32);
    let kind = obj
        .get("rope_type")
        .or_else(|| obj.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let factor = f("factor").unwrap_or(1.0);
    match kind {
        "default" => Ok(RopeScaling::None),
        "linear" => Ok(RopeScaling::Linear { factor }),
        "llama3" => Ok(RopeScaling::Llama3 {
            factor,
            low_freq_factor: f("low_freq_factor").unwrap_or(1.0),
            high_freq_factor: f("high_freq_factor").unwrap_or(4.0),
            original_context: obj
                .get("original_max_position_embeddings")
                .and_then(Value::as_u64)
                .unwrap_or(8192) as usize,
        }),
        "yarn" => Ok(RopeScaling::Yarn(hf_yarn(obj, max_positions))),
        other => Err(ModelError::Unsupported(format!(
            "config.json: rope_scaling.rope_type {other:?}"
        ))),
    }
}

/// YaRN's settings with transformers' defaults (`beta_fast` 32, `beta_slow` 1, `truncate`
/// true, the original context `max_positions`, `factor` the ratio of the two) and its
/// attention factor: the config's `attention_factor`, else `mscale(factor)`, or
/// `mscale(factor, mscale) / mscale(factor, mscale_all_dim)` when both are given
/// (`mscale(s, m) = 0.1 m ln(s) + 1` for `s > 1`, else 1).
fn hf_yarn(obj: &Value, max_positions: Option<usize>) -> Yarn {
    let f = |k: &str| obj.get(k).and_then(Value::as_f64);
    let original_context = obj
        .get("original_max_position_embeddings")
        .and_then(Value::as_u64)
        .map(|v| v as usize)
        .or(max_positions)
        .unwrap_or(4096);
    let factor = f("factor").unwrap_or_else(|| {
        max_positions.unwrap_or(original_context) as f64 / original_context.max(1) as f64
    }) as f32;
    let mscale = |scale: f64, m: f64| {
        if scale <= 1.0 {
            1.0
        } else {
            0.1 * m * scale.ln() + 1.0
        }
    };
    let factor64 = factor as f64;
    let attention_factor = match (f("attention_factor"), f("mscale"), f("mscale_all_dim")) {
        (Some(a), _, _) => a,
        (None, Some(m), Some(all)) if m != 0.0 && all != 0.0 => {
            mscale(factor64, m) / mscale(factor64, all)
        }
        _ => mscale(factor64, 1.0),
    };
    Yarn {
        factor,
        beta_fast: f("beta_fast").unwrap_or(32.0) as f32,
        beta_slow: f("beta_slow").unwrap_or(1.0) as f32,
        original_context,
        truncate: obj.get("truncate").and_then(Value::as_bool).unwrap_or(true),
        attention_factor: attention_factor as f32,
    }
}
