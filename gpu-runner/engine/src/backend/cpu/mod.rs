//! The CPU backend: runs the transformer over a whole batch per step. All sequences' new
//! tokens form one activation matrix, so every weight matrix is streamed from memory once
//! per step whatever the batch size — that is where batching pays on CPU. Attention is the
//! only per-sequence part ([`attention`]); the KV cache is paged ([`kv_pool`]).
//!
//! Scratch buffers live in the backend and are resized (not reallocated) per step.

mod attention;

#[cfg(test)]
mod format_tests;
mod kv_pool;
mod layer;
mod moe;
pub(crate) mod ops;
#[cfg(test)]
mod reference_tests;
pub(crate) mod rope;
#[cfg(target_arch = "x86_64")]
mod simd;
#[cfg(test)]
mod tests;

use std::sync::Arc;

pub use kv_pool::{kv_bytes_per_block, kv_bytes_per_block_as, num_blocks_for_budget, KvDtype};

use self::kv_pool::KvPool;
use self::rope::RopeTable;
use super::batch::BatchLayout;
use super::{Backend, BackendError, SeqSlice};
use crate::lora::apply::StepAdapters;
use crate::model::{ModelArtifacts, ModelConfig, Weights};

/// Activations of one step, kept between steps to avoid reallocating.
#[derive(Default)]
struct Scratch {
    x: Vec<f32>,
    xn: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn_groups: Vec<f32>,
    attn: Vec<f32>,
    proj: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    /// Boxed: only mixture-of-experts models use it.
    moe: Box<moe::MoeScratch>,
    /// Final hidden states of the rows that produce logits.
    head_in: Vec<f32>,
    /// How many rows of `xn` hold the last step's normed final hidden states.
    head_rows: usize,
    /// A logits buffer handed back by [`Backend::recycle_logits`], reused by the next step.
    spare_logits: Vec<f32>,
    rope_global: RopeTable,
    rope_local: RopeTable,
}

/// A model with its KV pool on the CPU.
pub struct CpuBackend {
    config: ModelConfig,
    weights: Arc<Weights>,
    kv: KvPool,
    /// RoPE inverse frequencies of global (or all) layers and of Gemma's local layers.
    inv_freq_global: Vec<f64>,
    inv_freq_local: Vec<f64>,
    /// What the global table's cos and sin are multiplied by (YaRN's attention factor).
    rope_scale_global: f32,
    layout: BatchLayout,
    scratch: Scratch,
}

impl CpuBackend {
    /// Builds the backend with an f16 KV pool of `num_blocks` blocks of `block_size` tokens.
    pub fn new(
        artifacts: &ModelArtifacts,
        num_blocks: usize,
        block_size: usize,
    ) -> Result<Self, BackendError> {
        Self::with_kv_dtype(artifacts, num_blocks, block_size, KvDtype::default())
    }

    /// Builds the backend with a KV pool of `num_blocks` blocks of `block_size` tokens
    /// stored as `kv_dtype`.
    pub fn with_kv_dtype(
        artifacts: &ModelArtifacts,
        num_blocks: usize,
        block_size: usize,
        kv_dtype: KvDtype,
    ) -> Result<Self, BackendError> {
        let config = artifacts.config.clone();
        if block_size == 0 || num_blocks == 0 {
            return Err(BackendError::Failure(format!(
                "KV pool needs positive sizes, got {num_blocks} blocks of {block_size} tokens"
            )));
        }
        let kv = KvPool::new(&config, num_blocks, block_size, kv_dtype).ok_or_else(|| {
            BackendError::Failure(format!(
                "KV pool of {num_blocks} blocks × {block_size} tokens overflows"
            ))
        })?;
        let weights = Arc::clone(&artifacts.weights);
        let inv_freq_global = rope::inv_freqs(
            config.head_dim,
            config.rope_theta,
            config.rope_scaling,
            weights.rope_freq_factors.as_deref(),
        );
        let inv_freq_local = rope::inv_freqs(
            config.head_dim,
            config.rope_theta_local,
            crate::model::RopeScaling::None,
            None,
        );
        let rope_scale_global = rope::attention_factor(config.rope_scaling);
        Ok(CpuBackend {
            rope_scale_global,
            config,
            weights,
            kv,
            inv_freq_global,
            inv_freq_local,
            layout: BatchLayout::default(),
            scratch: Scratch::default(),
        })
    }

    /// Token embeddings of the step (scaled for Gemma) into `scratch.x`.
    fn embed(&mut self) {
        let h = self.config.hidden;
        let s = &mut self.scratch;
        s.x.resize(self.layout.n_tokens() * h, 0.0);
        for (row, &id) in s.x.chunks_exact_mut(h).zip(&self.layout.token_ids) {
            self.weights.token_embd.dequantize_row(id as usize, row);
            if let Some(scale) = self.config.embedding_scale {
                row.iter_mut().for_each(|v| *v *= scale);
            }
        }
    }

    /// Final norm and LM head over the rows that want logits.
    fn logits(&mut self) -> Vec<f32> {
        let (h, vocab) = (self.config.hidden, self.config.vocab_size);
        let rows = &self.layout.logit_rows;
        self.scratch.head_rows = rows.len();
        if rows.is_empty() {
            return Vec::new();
        }
        let s = &mut self.scratch;
        s.head_in.clear();
        for &r in rows {
            s.head_in.extend_from_slice(&s.x[r * h..(r + 1) * h]);
        }
        s.xn.resize(rows.len() * h, 0.0);
        ops::rms_norm_rows(
            &s.head_in,
            &self.weights.output_norm,
            self.config.rms_eps,
            &mut s.xn,
        );
        // Every element is written by the matmul; zeroing only what the spare lacks.
        let mut out = std::mem::take(&mut s.spare_logits);
        out.resize(rows.len() * vocab, 0.0);
        self.weights.lm_head().matmul(&s.xn, rows.len(), &mut out);
        if let Some(cap) = self.config.final_logit_softcap {
            ops::softcap(&mut out, cap);
        }
        out
    }
}

impl Backend for CpuBackend {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn block_size(&self) -> usize {
        self.kv.block_size()
    }

    fn hidden_rows(&self) -> Option<&[f32]> {
        let n = self.scratch.head_rows * self.config.hidden;
        Some(self.scratch.xn.get(..n).unwrap_or_default())
    }

    fn routed_experts(&self) -> Option<&[u32]> {
        self.config
            .moe
            .as_ref()
            .map(|_| self.scratch.moe.routes.as_slice())
    }

    fn serves_adapters(&self) -> bool {
        true
    }

    fn recycle_logits(&mut self, logits: Vec<f32>) {
        self.scratch.spare_logits = logits;
    }

    fn num_blocks(&self) -> usize {
        self.kv.num_blocks()
    }

    fn forward(&mut self, batch: &[SeqSlice<'_>]) -> Result<Vec<f32>, BackendError> {
        self.layout.build(
            batch,
            &self.config,
            self.kv.block_size(),
            self.kv.num_blocks(),
        )?;
        if self.layout.n_tokens() == 0 {
            self.scratch.head_rows = 0;
            return Ok(Vec::new());
        }
        self.embed();
        self.scratch.rope_global.fill_scaled(
            &self.inv_freq_global,
            &self.layout.positions,
            self.rope_scale_global,
        );
        if (0..self.config.n_layers).any(|l| self.config.uses_local_rope(l)) {
            self.scratch
                .rope_local
                .fill(&self.inv_freq_local, &self.layout.positions);
        }
        let adapters = StepAdapters::new(
            batch
                .iter()
                .zip(self.layout.offsets.windows(2))
                .map(|(seq, rows)| (seq.adapter, rows[0]..rows[1])),
        );
        if let Some(moe) = &self.config.moe {
            self.scratch.moe.start_step(moe, self.layout.n_tokens());
        }
        for layer in 0..self.config.n_layers {
            self.run_layer(layer, batch, &adapters);
        }
        Ok(self.logits())
    }
}
