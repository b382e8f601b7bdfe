//! LoRA adapters over a loaded base model: low-rank deltas `y += s·B(Ax)` on the attention
//! and feed-forward projections, applied per sequence so that one step serves the base and
//! many adapters together (S-LoRA / Punica style, see [`apply`]).
//!
//! - [`peft`]: reads a PEFT adapter directory and checks it against the base.
//! - [`gguf`]: reads a llama.cpp GGUF LoRA adapter; [`load`] picks the reader by path.
//! - [`apply`]: the step's adapters, grouped per adapter, applied after each projection.
//! - [`random`]: writes random PEFT adapters (benchmarks and tests).
//!
//! An adapter is built for one base shape ([`LoraAdapter::fits`]); the engine refuses it for
//! any other model. Each loaded adapter has a process-unique id that also namespaces the
//! prefix cache: a base prefix is never reused for an adapter's sequence.

pub mod apply;
pub mod gguf;
mod pairs;
pub mod peft;
pub mod random;
#[cfg(test)]
mod tests;

use std::sync::atomic::{AtomicU64, Ordering};

use half::f16;

use crate::backend::cpu::ops::{low_rank_update, low_rank_update_f16};
use crate::model::ModelConfig;

/// Reads the adapter at `path`, held in `precision`: a llama.cpp adapter if `path` is a
/// `.gguf` file, else a PEFT directory.
pub fn load(
    path: &std::path::Path,
    name: &str,
    config: &ModelConfig,
    precision: LoraPrecision,
) -> Result<LoraAdapter, LoraError> {
    if path.extension().is_some_and(|e| e == "gguf") {
        gguf::load(path, name, config, precision)
    } else {
        peft::load_as(path, name, config, precision)
    }
}

/// A projection an adapter may target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Target {
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
}

impl Target {
    pub const ALL: [Target; 7] = [
        Target::Q,
        Target::K,
        Target::V,
        Target::O,
        Target::Gate,
        Target::Up,
        Target::Down,
    ];

    /// The module name PEFT and Hugging Face use (`q_proj`, …, `down_proj`).
    pub fn hf_name(self) -> &'static str {
        match self {
            Target::Q => "q_proj",
            Target::K => "k_proj",
            Target::V => "v_proj",
            Target::O => "o_proj",
            Target::Gate => "gate_proj",
            Target::Up => "up_proj",
            Target::Down => "down_proj",
        }
    }

    /// The target named `name`: `q_proj` … `down_proj`, or the short `q` … `down`.
    pub fn parse(name: &str) -> Option<Target> {
        Target::ALL
            .into_iter()
            .find(|t| t.hf_name() == name || t.hf_name().strip_suffix("_proj") == Some(name))
    }

    fn index(self) -> usize {
        self as usize
    }

    /// `(in, out)` widths of this projection in `config`.
    pub fn dims(self, config: &ModelConfig) -> (usize, usize) {
        let (h, q, kv, f) = (config.hidden, config.q_dim(), config.kv_dim(), config.ffn);
        match self {
            Target::Q => (h, q),
            Target::K | Target::V => (h, kv),
            Target::O => (q, h),
            Target::Gate | Target::Up => (h, f),
            Target::Down => (f, h),
        }
    }
}

/// How an adapter's weights are held. Served adapters are f16, as vLLM and SGLang hold
/// them in the model's 16-bit type: a step of many adapters waits on reading them, and f16
/// halves that, at a rounding (2⁻¹¹ relative) far below a quantized base's own. f32 keeps
/// them exactly as read (the reference tests).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LoraPrecision {
    F32,
    #[default]
    F16,
}

/// A pair's matrices, in their precision.
#[derive(Debug, Clone, PartialEq)]
pub enum PairWeights {
    F32 { a: Vec<f32>, b_t: Vec<f32> },
    F16 { a: Vec<f16>, b_t: Vec<f16> },
}

/// One projection's low-rank pair, ready to apply: `a` is `rank × in` (PEFT's `lora_A`),
/// `b_t` is `rank × out`, the transpose of PEFT's `lora_B` already multiplied by the scaling,
/// so a row's delta is `Σ_r (a_r · x) b_t_r` over contiguous memory.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraPair {
    pub rank: usize,
    pub in_dim: usize,
    pub out_dim: usize,
    pub weights: PairWeights,
}

impl LoraPair {
    /// A pair from f32 `a` (`rank × in`) and scaled `b_t` (`rank × out`), held in `precision`.
    pub fn new(
        rank: usize,
        (in_dim, out_dim): (usize, usize),
        a: Vec<f32>,
        b_t: Vec<f32>,
        precision: LoraPrecision,
    ) -> Self {
        let weights = match precision {
            LoraPrecision::F32 => PairWeights::F32 { a, b_t },
            LoraPrecision::F16 => PairWeights::F16 {
                a: a.into_iter().map(f16::from_f32).collect(),
                b_t: b_t.into_iter().map(f16::from_f32).collect(),
            },
        };
        LoraPair {
            rank,
            in_dim,
            out_dim,
            weights,
        }
    }

    /// Adds this pair's delta of each row of `x_rows` (`in_dim` wide) to the matching row of
    /// `out_rows` (`out_dim` wide).
    pub fn apply(&self, x_rows: &[f32], out_rows: &mut [f32]) {
        match &self.weights {
            PairWeights::F32 { a, b_t } => low_rank_update(a, b_t, self.rank, x_rows, out_rows),
            PairWeights::F16 { a, b_t } => low_rank_update_f16(a, b_t, self.rank, x_rows, out_rows),
        }
    }

    fn bytes(&self) -> usize {
        match &self.weights {
            PairWeights::F32 { a, b_t } => (a.len() + b_t.len()) * 4,
            PairWeights::F16 { a, b_t } => (a.len() + b_t.len()) * 2,
        }
    }
}

/// One layer's pairs, indexed by [`Target`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LayerLora {
    pairs: [Option<LoraPair>; 7],
}

impl LayerLora {
    pub fn get(&self, target: Target) -> Option<&LoraPair> {
        self.pairs[target.index()].as_ref()
    }

    pub fn set(&mut self, target: Target, pair: LoraPair) {
        self.pairs[target.index()] = Some(pair);
    }
}

/// The base dimensions an adapter was built for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BaseShape {
    pub n_layers: usize,
    pub hidden: usize,
    pub q_dim: usize,
    pub kv_dim: usize,
    pub ffn: usize,
}

impl BaseShape {
    pub fn of(config: &ModelConfig) -> Self {
        BaseShape {
            n_layers: config.n_layers,
            hidden: config.hidden,
            q_dim: config.q_dim(),
            kv_dim: config.kv_dim(),
            ffn: config.ffn,
        }
    }
}

/// A loaded adapter, matched to one base shape.
#[derive(Debug)]
pub struct LoraAdapter {
    id: u64,
    /// What the operator or client called it (for errors and metrics).
    pub name: String,
    pub base: BaseShape,
    pub rank: usize,
    pub targets: Vec<Target>,
    pub layers: Vec<LayerLora>,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl LoraAdapter {
    /// An adapter of `layers` (one per base layer) for `config`'s shape. Refuses
    /// feed-forward targets on a mixture-of-experts base: its routed layers have no single
    /// gate/up/down projection to adapt.
    pub fn new(
        name: impl Into<String>,
        config: &ModelConfig,
        rank: usize,
        targets: Vec<Target>,
        layers: Vec<LayerLora>,
    ) -> Result<Self, LoraError> {
        let ffn_target = targets
            .iter()
            .find(|t| matches!(t, Target::Gate | Target::Up | Target::Down));
        if let (Some(t), Some(_)) = (ffn_target, &config.moe) {
            return Err(LoraError::Unsupported(format!(
                "the `{}` target on a mixture-of-experts model (only attention \
                 projections can be adapted there)",
                t.hf_name()
            )));
        }
        Ok(LoraAdapter {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            name: name.into(),
            base: BaseShape::of(config),
            rank,
            targets,
            layers,
        })
    }

    /// Unique among the adapters this process loaded: a reload of the same name is another.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Whether this adapter was built for a model of `config`'s shape.
    pub fn fits(&self, config: &ModelConfig) -> bool {
        self.base == BaseShape::of(config)
    }

    /// Host memory its weights take.
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .flat_map(|l| l.pairs.iter().flatten())
            .map(LoraPair::bytes)
            .sum()
    }
}

/// Why an adapter cannot be loaded or served.
#[derive(Debug, thiserror::Error)]
pub enum LoraError {
    #[error("cannot read {path}: {why}")]
    Read { path: String, why: String },
    #[error("the adapter uses {0}, which is not supported")]
    Unsupported(String),
    #[error("the adapter does not match the base model: {0}")]
    Mismatch(String),
    #[error("the adapter is malformed: {0}")]
    Malformed(String),
}
