//! From read `lora_A` / `lora_B` tensors to the pairs an adapter applies, whatever file
//! they came from: each shape checked against the base, both halves present, B transposed,
//! scaled, and its rows put in the order the base's projection rows are stored in.

use std::collections::BTreeMap;

use super::{LayerLora, LoraError, LoraPair, LoraPrecision, Target};
use crate::model::{ModelConfig, RopeStyle};

/// One `lora_A` (`rank × in`) or `lora_B` (`out × rank`) tensor, as read.
pub struct Half {
    /// Its name in the file, for errors.
    pub name: String,
    pub layer: usize,
    pub target: Target,
    pub is_a: bool,
    /// `[rows, columns]`.
    pub shape: [usize; 2],
    pub values: Vec<f32>,
}

/// A half found in the file, or not yet.
type Found = Option<Vec<f32>>;

/// The order an adapter's B rows of Q and K come in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowOrder {
    /// Hugging Face's (PEFT's, and llama.cpp's for every architecture but Llama).
    HuggingFace,
    /// llama.cpp's for Llama: within each head, HF rows `i` and `i + d/2` become rows `2i`
    /// and `2i + 1`, for interleaved RoPE.
    Interleaved,
}

/// How to assemble one adapter's pairs.
pub struct Assembly<'a> {
    pub rank: usize,
    /// Folded into B.
    pub scaling: f32,
    pub config: &'a ModelConfig,
    pub precision: LoraPrecision,
    pub order: RowOrder,
}

impl Assembly<'_> {
    /// The adapter's layers, from every half it holds.
    pub fn layers(&self, halves: Vec<Half>) -> Result<Vec<LayerLora>, LoraError> {
        let config = self.config;
        let mut pairs: BTreeMap<(usize, usize), (Target, Found, Found)> = BTreeMap::new();
        for half in halves {
            if half.layer >= config.n_layers {
                return Err(LoraError::Mismatch(format!(
                    "`{}` is for layer {}, the base has {} layers",
                    half.name, half.layer, config.n_layers
                )));
            }
            let (in_dim, out_dim) = half.target.dims(config);
            let expected = if half.is_a {
                [self.rank, in_dim]
            } else {
                [out_dim, self.rank]
            };
            if half.shape != expected {
                return Err(LoraError::Mismatch(format!(
                    "`{}` has shape {:?}, the base needs {expected:?} (rank {})",
                    half.name, half.shape, self.rank
                )));
            }
            if half.values.iter().any(|v| !v.is_finite()) {
                return Err(LoraError::Malformed(format!(
                    "`{}` holds NaN or infinity",
                    half.name
                )));
            }
            let slot = pairs.entry((half.layer, half.target as usize)).or_insert((
                half.target,
                None,
                None,
            ));
            if half.is_a {
                slot.1 = Some(half.values);
            } else {
                slot.2 = Some(half.values);
            }
        }
        if pairs.is_empty() {
            return Err(LoraError::Malformed("no LoRA weights in the file".into()));
        }
        let mut layers = vec![LayerLora::default(); config.n_layers];
        for ((layer, _), (target, a, b)) in pairs {
            let (Some(a), Some(b)) = (a, b) else {
                return Err(LoraError::Malformed(format!(
                    "layer {layer} {} has only one of lora_A and lora_B",
                    target.hf_name()
                )));
            };
            let (in_dim, out_dim) = target.dims(config);
            let b_t = self.scaled_transpose(&b, target, out_dim);
            layers[layer].set(
                target,
                LoraPair::new(self.rank, (in_dim, out_dim), a, b_t, self.precision),
            );
        }
        Ok(layers)
    }

    /// `b` (`out × rank`) transposed to `rank × out`, scaled, its rows in the base's order.
    fn scaled_transpose(&self, b: &[f32], target: Target, out: usize) -> Vec<f32> {
        let heads = match target {
            Target::Q => Some(self.config.n_heads),
            Target::K => Some(self.config.n_kv_heads),
            _ => None,
        };
        let base = match self.config.rope_style {
            RopeStyle::Interleaved => RowOrder::Interleaved,
            _ => RowOrder::HuggingFace,
        };
        let source_row = |row: usize| match (heads, self.order, base) {
            (Some(n), RowOrder::HuggingFace, RowOrder::Interleaved) => {
                let d = out / n;
                let (head, within) = (row / d, row % d);
                head * d + (within % 2) * (d / 2) + within / 2
            }
            (Some(n), RowOrder::Interleaved, RowOrder::HuggingFace) => {
                let d = out / n;
                let (head, within) = (row / d, row % d);
                let half = d / 2;
                head * d
                    + if within < half {
                        2 * within
                    } else {
                        2 * (within - half) + 1
                    }
            }
            _ => row,
        };
        let rank = self.rank;
        let mut b_t = vec![0f32; rank * out];
        for row in 0..out {
            let src = &b[source_row(row) * rank..][..rank];
            for (r, &v) in src.iter().enumerate() {
                b_t[r * out + row] = v * self.scaling;
            }
        }
        b_t
    }
}
