//! A BERT encoder run over a whole batch: every input's tokens form one activation matrix,
//! so each weight matrix is streamed once per layer for the batch ([`QMatrix::matmul_many`]
//! for Q, K and V together); attention, the only per-input part, runs per (input, head) on
//! the worker team, bidirectional and over that input's tokens alone.
//!
//! Post-LayerNorm blocks: `x = LN(x + O·attn(x))`, `x = LN(x + W₂·GELU(W₁·x))`, biases
//! everywhere; embeddings are word + absolute position + token type 0, then LayerNorm.

mod config;
mod math;
mod weights;

use std::path::Path;

use crate::backend::cpu::ops;
use crate::model::safetensors::SafetensorsSet;
use crate::quant::QMatrix;
use crate::team;

pub(crate) use config::BertConfig;
use weights::{BertWeights, Linear};

use super::EmbedError;

/// A loaded encoder.
pub(crate) struct Bert {
    pub config: BertConfig,
    weights: BertWeights,
}

/// Where each input's rows sit in the batch's activation matrix.
struct Spans {
    /// First row of each input, then the total.
    offsets: Vec<usize>,
}

impl Spans {
    fn of(&self, i: usize) -> std::ops::Range<usize> {
        self.offsets[i]..self.offsets[i + 1]
    }

    fn len(&self) -> usize {
        self.offsets.len() - 1
    }

    fn tokens(&self) -> usize {
        self.offsets.last().copied().unwrap_or(0)
    }
}

impl Bert {
    pub(crate) fn open(dir: &Path, config_json: &serde_json::Value) -> Result<Bert, EmbedError> {
        let config = BertConfig::from_json(config_json)?;
        let set = SafetensorsSet::open_dir(dir)?;
        let weights = BertWeights::load(&set, &config)?;
        Ok(Bert { config, weights })
    }

    /// The last layer's hidden states of every token of every input, concatenated in
    /// input order (`hidden` floats per token). Inputs must be non-empty, within
    /// `max_positions` and below `vocab_size` (checked by the caller).
    pub(crate) fn hidden_states(&self, inputs: &[&[u32]]) -> Vec<f32> {
        let mut offsets = Vec::with_capacity(inputs.len() + 1);
        offsets.push(0);
        for ids in inputs {
            offsets.push(offsets[offsets.len() - 1] + ids.len());
        }
        let spans = Spans { offsets };
        let mut x = self.embed(inputs, spans.tokens());
        let mut scratch = Scratch::new(&self.config, spans.tokens());
        for layer in &self.weights.layers {
            self.layer(layer, &mut x, &spans, &mut scratch);
        }
        x
    }

    /// Word + position + token type 0 embeddings, LayerNormed.
    fn embed(&self, inputs: &[&[u32]], n: usize) -> Vec<f32> {
        let (h, w) = (self.config.hidden, &self.weights);
        let mut x = vec![0f32; n * h];
        let mut rows = x.chunks_exact_mut(h);
        for ids in inputs {
            for (pos, (&id, row)) in ids.iter().zip(rows.by_ref()).enumerate() {
                w.word.dequantize_row(id as usize, row);
                ops::add_inplace(row, &w.position[pos * h..(pos + 1) * h]);
                ops::add_inplace(row, &w.token_type0);
            }
        }
        math::layer_norm_rows(&mut x, &w.embed_norm, self.config.layer_norm_eps);
        x
    }

    fn layer(&self, l: &weights::BertLayer, x: &mut [f32], spans: &Spans, s: &mut Scratch) {
        let n = spans.tokens();
        let eps = self.config.layer_norm_eps;
        QMatrix::matmul_many(
            &[&l.query.weight, &l.key.weight, &l.value.weight],
            x,
            n,
            &mut [&mut s.q, &mut s.k, &mut s.v],
        );
        ops::add_bias_rows(&mut s.q, &l.query.bias);
        ops::add_bias_rows(&mut s.k, &l.key.bias);
        ops::add_bias_rows(&mut s.v, &l.value.bias);
        self.attention(spans, s);
        linear(&l.attn_out, &s.attn, n, &mut s.proj);
        ops::add_inplace(x, &s.proj);
        math::layer_norm_rows(x, &l.attn_norm, eps);
        linear(&l.intermediate, x, n, &mut s.ffn);
        math::gelu_inplace(&mut s.ffn, self.config.gelu);
        linear(&l.output, &s.ffn, n, &mut s.proj);
        ops::add_inplace(x, &s.proj);
        math::layer_norm_rows(x, &l.output_norm, eps);
    }

    /// `softmax(Q·Kᵀ/√d)·V` per input and head, every token seeing every token of its own
    /// input (no mask: inputs are unpadded), into `s.attn`.
    fn attention(&self, spans: &Spans, s: &mut Scratch) {
        let (h, d, heads) = (
            self.config.hidden,
            self.config.head_dim,
            self.config.n_heads,
        );
        let scale = 1.0 / (d as f32).sqrt();
        let (q, k, v) = (&s.q, &s.k, &s.v);
        // One task per (input, head): many short inputs and one long one both spread out.
        let outs = team::map(spans.len() * heads, |task| {
            let (rows, head) = (spans.of(task / heads), task % heads);
            let col = head * d;
            let n = rows.len();
            let mut out = vec![0f32; n * d];
            let mut scores = vec![0f32; n];
            for (a, out_row) in rows.clone().zip(out.chunks_exact_mut(d)) {
                let qa = &q[a * h + col..][..d];
                for (b, score) in rows.clone().zip(scores.iter_mut()) {
                    *score = ops::dot(qa, &k[b * h + col..][..d]) * scale;
                }
                ops::softmax(&mut scores);
                for (b, &p) in rows.clone().zip(&scores) {
                    ops::axpy(out_row, p, &v[b * h + col..][..d]);
                }
            }
            out
        });
        for (task, out) in outs.iter().enumerate() {
            let (rows, col) = (spans.of(task / heads), task % heads * d);
            for (r, vals) in rows.zip(out.chunks_exact(d)) {
                s.attn[r * h + col..][..d].copy_from_slice(vals);
            }
        }
    }
}

/// `out = W·x + b` for `n` rows of `x`.
fn linear(l: &Linear, x: &[f32], n: usize, out: &mut [f32]) {
    l.weight.matmul(x, n, out);
    ops::add_bias_rows(out, &l.bias);
}

/// One call's activations, sized once for its batch.
struct Scratch {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
    proj: Vec<f32>,
    ffn: Vec<f32>,
}

impl Scratch {
    fn new(c: &BertConfig, n: usize) -> Scratch {
        let rows = |w: usize| vec![0f32; n * w];
        Scratch {
            q: rows(c.hidden),
            k: rows(c.hidden),
            v: rows(c.hidden),
            attn: rows(c.hidden),
            proj: rows(c.hidden),
            ffn: rows(c.ffn),
        }
    }
}
