//! The numerics a model needs beyond the common decoder that every backend runs (pre-norm
//! attention with optional Q/K/V biases and Q/K norms, SwiGLU/GeGLU, softmax-routed
//! experts, linear or Llama 3 RoPE scaling). A backend that lacks some of them names what
//! it lacks, and the model is refused at load with the reason instead of running wrong.
//!
//! **Architecture invariant:** a feature is listed here when it is added to the CPU backend
//! and not (yet) to every other one; a backend gains it by leaving it out of what it lacks.

use super::{ModelConfig, ModelError, RopeScaling};

/// One numeric feature beyond the common decoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feature {
    /// A learned per-head logit in the attention softmax's denominator (gpt-oss).
    AttentionSinks,
    /// A bias on the attention output projection (gpt-oss).
    AttentionOutputBias,
    /// Biases on the router and on every expert's products, and the clamped SwiGLU
    /// (gpt-oss).
    BiasedClampedExperts,
    /// YaRN RoPE scaling, whose attention factor multiplies cos and sin.
    YarnRope,
}

impl Feature {
    fn describe(self) -> &'static str {
        match self {
            Feature::AttentionSinks => "attention sinks",
            Feature::AttentionOutputBias => "an attention output bias",
            Feature::BiasedClampedExperts => "biased experts with a clamped SwiGLU",
            Feature::YarnRope => "YaRN RoPE scaling",
        }
    }
}

/// What the CUDA backend does not implement yet, which `CudaBackend::new` passes to
/// [`ModelConfig::require_features`]: nothing today (gpt-oss's four landed together). A
/// feature added to the CPU backend alone goes here until CUDA has it.
pub const CUDA_LACKS: &[Feature] = &[];

impl ModelConfig {
    /// Every feature beyond the common decoder this model needs.
    pub fn features(&self) -> Vec<Feature> {
        let mut out = Vec::new();
        if self.attn_sinks {
            out.push(Feature::AttentionSinks);
        }
        if self.o_bias {
            out.push(Feature::AttentionOutputBias);
        }
        if self
            .moe
            .as_ref()
            .is_some_and(|m| m.clamped_swiglu.is_some())
        {
            out.push(Feature::BiasedClampedExperts);
        }
        if matches!(self.rope_scaling, RopeScaling::Yarn(_)) {
            out.push(Feature::YarnRope);
        }
        out
    }

    /// Refuses the model when `backend` lacks any feature it needs, naming them all.
    pub fn require_features(&self, backend: &str, lacks: &[Feature]) -> Result<(), ModelError> {
        let missing: Vec<&str> = self
            .features()
            .into_iter()
            .filter(|f| lacks.contains(f))
            .map(Feature::describe)
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        Err(ModelError::Unsupported(format!(
            "this {:?} model needs {}, which the {backend} backend does not implement \
             (run it on the CPU: --device cpu)",
            self.arch,
            missing.join(", ")
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tiny gpt-oss fixture's config.
    fn gpt_oss_config() -> ModelConfig {
        let json = include_str!("../../tests/fixtures/tiny/gpt_oss/config.json");
        let root = serde_json::from_str(json).unwrap_or_else(|e| panic!("config.json: {e}"));
        super::super::config::from_hf_json(&root).unwrap_or_else(|e| panic!("config: {e}"))
    }

    #[test]
    fn a_backend_lacking_features_a_model_needs_refuses_it_naming_each() {
        let gpt_oss = gpt_oss_config();
        assert_eq!(
            gpt_oss.features(),
            [
                Feature::AttentionSinks,
                Feature::AttentionOutputBias,
                Feature::BiasedClampedExperts,
                Feature::YarnRope,
            ]
        );
        let lacks = [Feature::AttentionSinks, Feature::YarnRope];
        let err = match gpt_oss.require_features("Some", &lacks) {
            Ok(()) => panic!("a backend lacking sinks and YaRN accepted gpt-oss"),
            Err(e) => e.to_string(),
        };
        for what in ["attention sinks", "YaRN", "Some backend", "--device cpu"] {
            assert!(err.contains(what), "{err}");
        }
        assert!(!err.contains("clamped"), "only what it lacks: {err}");
        assert!(gpt_oss.require_features("Some", &[]).is_ok());
    }
}
