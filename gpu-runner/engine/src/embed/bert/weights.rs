//! A BERT encoder's tensors, by Hugging Face's names (with or without the `bert.` prefix
//! that `BertForMaskedLM`/`BertForPreTraining` checkpoints add), shape-checked at load.
//! Matrices stay [`QMatrix`] views into the mapped safetensors; vectors are f32.

use crate::model::safetensors::SafetensorsSet;
use crate::quant::QMatrix;

use super::config::BertConfig;
use crate::embed::EmbedError;

/// LayerNorm's scale and shift.
pub(crate) struct Norm {
    pub weight: Vec<f32>,
    pub bias: Vec<f32>,
}

/// `y = W·x + b`.
pub(crate) struct Linear {
    pub weight: QMatrix,
    pub bias: Vec<f32>,
}

pub(crate) struct BertLayer {
    pub query: Linear,
    pub key: Linear,
    pub value: Linear,
    pub attn_out: Linear,
    pub attn_norm: Norm,
    pub intermediate: Linear,
    pub output: Linear,
    pub output_norm: Norm,
}

pub(crate) struct BertWeights {
    pub word: QMatrix,
    /// `max_positions × hidden`, row-major.
    pub position: Vec<f32>,
    /// Token type 0's row: every input is a single segment.
    pub token_type0: Vec<f32>,
    pub embed_norm: Norm,
    pub layers: Vec<BertLayer>,
}

struct Loader<'a> {
    set: &'a SafetensorsSet,
    prefix: &'static str,
}

impl Loader<'_> {
    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<QMatrix, EmbedError> {
        let full = format!("{}{name}", self.prefix);
        let m = self.set.matrix(&full)?;
        if (m.rows, m.cols) != (rows, cols) {
            return Err(EmbedError::Load(format!(
                "tensor `{full}` is {}×{}, expected {rows}×{cols}",
                m.rows, m.cols
            )));
        }
        Ok(m)
    }

    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>, EmbedError> {
        let full = format!("{}{name}", self.prefix);
        let v = self.set.vector(&full)?;
        if v.len() != len {
            return Err(EmbedError::Load(format!(
                "tensor `{full}` has {} elements, expected {len}",
                v.len()
            )));
        }
        Ok(v)
    }

    fn linear(&self, name: &str, rows: usize, cols: usize) -> Result<Linear, EmbedError> {
        Ok(Linear {
            weight: self.matrix(&format!("{name}.weight"), rows, cols)?,
            bias: self.vector(&format!("{name}.bias"), rows)?,
        })
    }

    fn norm(&self, name: &str, len: usize) -> Result<Norm, EmbedError> {
        Ok(Norm {
            weight: self.vector(&format!("{name}.weight"), len)?,
            bias: self.vector(&format!("{name}.bias"), len)?,
        })
    }

    fn layer(&self, c: &BertConfig, i: usize) -> Result<BertLayer, EmbedError> {
        let (h, f) = (c.hidden, c.ffn);
        let p = format!("encoder.layer.{i}.");
        Ok(BertLayer {
            query: self.linear(&format!("{p}attention.self.query"), h, h)?,
            key: self.linear(&format!("{p}attention.self.key"), h, h)?,
            value: self.linear(&format!("{p}attention.self.value"), h, h)?,
            attn_out: self.linear(&format!("{p}attention.output.dense"), h, h)?,
            attn_norm: self.norm(&format!("{p}attention.output.LayerNorm"), h)?,
            intermediate: self.linear(&format!("{p}intermediate.dense"), f, h)?,
            output: self.linear(&format!("{p}output.dense"), h, f)?,
            output_norm: self.norm(&format!("{p}output.LayerNorm"), h)?,
        })
    }
}

impl BertWeights {
    pub(crate) fn load(set: &SafetensorsSet, c: &BertConfig) -> Result<BertWeights, EmbedError> {
        let prefix = if set.has("bert.embeddings.word_embeddings.weight") {
            "bert."
        } else {
            ""
        };
        let l = Loader { set, prefix };
        let h = c.hidden;
        let token_types = l.vector(
            "embeddings.token_type_embeddings.weight",
            c.type_vocab_size * h,
        )?;
        // Rows are looked up one at a time, never multiplied: the row layout stays.
        let word = l.matrix("embeddings.word_embeddings.weight", c.vocab_size, h)?;
        let mut layers = (0..c.n_layers)
            .map(|i| l.layer(c, i))
            .collect::<Result<Vec<_>, _>>()?;
        for layer in &mut layers {
            for m in [
                &mut layer.query.weight,
                &mut layer.key.weight,
                &mut layer.value.weight,
                &mut layer.attn_out.weight,
                &mut layer.intermediate.weight,
                &mut layer.output.weight,
            ] {
                m.use_cpu_layout();
            }
        }
        Ok(BertWeights {
            word,
            position: l.vector("embeddings.position_embeddings.weight", c.max_positions * h)?,
            token_type0: token_types[..h].to_vec(),
            embed_norm: l.norm("embeddings.LayerNorm", h)?,
            layers,
        })
    }
}
