//! One transformer block over the step's activation matrix: pre-norm attention and
//! feed-forward sub-blocks with residual adds, plus the per-architecture extras (QKV bias,
//! per-head Q/K norms, Gemma's post-norms and GeGLU).

use super::attention::{groups_to_rows, paged_attention, AttnParams};
use super::moe::{moe_ffn, MoeLayer};
use super::ops;
use super::CpuBackend;
use crate::backend::SeqSlice;
use crate::lora::apply::StepAdapters;
use crate::lora::Target;
use crate::model::FeedForward;
use crate::quant::QMatrix;

impl CpuBackend {
    /// Runs block `layer` in place on `scratch.x`.
    pub(super) fn run_layer(
        &mut self,
        layer: usize,
        batch: &[SeqSlice<'_>],
        adapters: &StepAdapters<'_>,
    ) {
        self.attention_block(layer, batch, adapters);
        self.ffn_block(layer, adapters);
    }

    /// Norm, Q/K/V projections (+ bias, + per-head norms) and RoPE into `scratch.q/k/v`.
    fn project_qkv(&mut self, layer: usize, adapters: &StepAdapters<'_>) {
        let c = &self.config;
        let w = &self.weights.layers[layer];
        let s = &mut self.scratch;
        let n = self.layout.n_tokens();
        let (qd, kvd) = (c.q_dim(), c.kv_dim());

        s.xn.resize(n * c.hidden, 0.0);
        ops::rms_norm_rows(&s.x, &w.attn_norm, c.rms_eps, &mut s.xn);
        s.q.resize(n * qd, 0.0);
        s.k.resize(n * kvd, 0.0);
        s.v.resize(n * kvd, 0.0);
        QMatrix::matmul_many(
            &[&w.wq, &w.wk, &w.wv],
            &s.xn,
            n,
            &mut [&mut s.q, &mut s.k, &mut s.v],
        );
        if !adapters.is_empty() {
            adapters.apply(layer, Target::Q, &s.xn, &mut s.q);
            adapters.apply(layer, Target::K, &s.xn, &mut s.k);
            adapters.apply(layer, Target::V, &s.xn, &mut s.v);
        }
        for (x, b) in [(&mut s.q, &w.bq), (&mut s.k, &w.bk), (&mut s.v, &w.bv)] {
            if let Some(b) = b {
                ops::add_bias_rows(x, b);
            }
        }
        if let Some(norm) = &w.q_norm {
            ops::rms_norm_rows_inplace(&mut s.q, norm, c.rms_eps);
        }
        if let Some(norm) = &w.k_norm {
            ops::rms_norm_rows_inplace(&mut s.k, norm, c.rms_eps);
        }
        let rope = if c.uses_local_rope(layer) {
            &s.rope_local
        } else {
            &s.rope_global
        };
        rope.apply(&mut s.q, c.n_heads, c.rope_style);
        rope.apply(&mut s.k, c.n_kv_heads, c.rope_style);
    }

    /// Writes the step's K/V rows into each sequence's blocks (before attention reads them).
    fn store_kv(&mut self, layer: usize, batch: &[SeqSlice<'_>]) {
        let kvd = self.config.kv_dim();
        let s = &self.scratch;
        for (seq, win) in batch.iter().zip(self.layout.offsets.windows(2)) {
            for t in win[0]..win[1] {
                let (k, v) = (&s.k[t * kvd..][..kvd], &s.v[t * kvd..][..kvd]);
                self.kv
                    .write(layer, seq.block_table, self.layout.positions[t], k, v);
            }
        }
    }

    fn attention_block(
        &mut self,
        layer: usize,
        batch: &[SeqSlice<'_>],
        adapters: &StepAdapters<'_>,
    ) {
        self.project_qkv(layer, adapters);
        self.store_kv(layer, batch);
        let c = &self.config;
        let w = &self.weights.layers[layer];
        let s = &mut self.scratch;
        let n = self.layout.n_tokens();
        let qd = c.q_dim();
        let params = AttnParams {
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
            scale: c.attn_scale,
            logit_softcap: c.attn_logit_softcap,
            window: c.layer_window(layer),
            sinks: w.sinks.as_deref(),
        };
        s.attn_groups.resize(n * qd, 0.0);
        paged_attention(
            &s.q,
            &self.kv,
            layer,
            batch,
            &self.layout,
            &params,
            &mut s.attn_groups,
        );
        s.attn.resize(n * qd, 0.0);
        groups_to_rows(
            &s.attn_groups,
            c.n_kv_heads,
            n,
            qd / c.n_kv_heads,
            &mut s.attn,
        );

        s.proj.resize(n * c.hidden, 0.0);
        w.wo.matmul(&s.attn, n, &mut s.proj);
        if let Some(b) = &w.bo {
            ops::add_bias_rows(&mut s.proj, b);
        }
        adapters.apply(layer, Target::O, &s.attn, &mut s.proj);
        if let Some(norm) = &w.post_attn_norm {
            ops::rms_norm_rows_inplace(&mut s.proj, norm, c.rms_eps);
        }
        ops::add_inplace(&mut s.x, &s.proj);
    }

    fn ffn_block(&mut self, layer: usize, adapters: &StepAdapters<'_>) {
        let c = &self.config;
        let w = &self.weights.layers[layer];
        let s = &mut self.scratch;
        let n = self.layout.n_tokens();
        let h = c.hidden;

        ops::rms_norm_rows(&s.x, &w.ffn_norm, c.rms_eps, &mut s.xn);
        s.proj.resize(n * h, 0.0);
        match &w.ffn {
            FeedForward::Dense(ffn) => {
                s.gate.resize(n * c.ffn, 0.0);
                s.up.resize(n * c.ffn, 0.0);
                QMatrix::matmul_many(
                    &[&ffn.gate, &ffn.up],
                    &s.xn,
                    n,
                    &mut [&mut s.gate, &mut s.up],
                );
                if !adapters.is_empty() {
                    adapters.apply(layer, Target::Gate, &s.xn, &mut s.gate);
                    adapters.apply(layer, Target::Up, &s.xn, &mut s.up);
                }
                ops::gated_activation(c.activation, &mut s.gate, &s.up);
                ffn.down.matmul(&s.gate, n, &mut s.proj);
                adapters.apply(layer, Target::Down, &s.gate, &mut s.proj);
            }
            FeedForward::Moe(ffn) => {
                // A routed layer is built only from a routing config.
                if let Some(cfg) = &c.moe {
                    let moe = MoeLayer {
                        ffn,
                        cfg,
                        layer,
                        activation: c.activation,
                    };
                    moe_ffn(&moe, &s.xn, n, &mut s.moe, &mut s.proj);
                }
            }
        }
        if let Some(norm) = &w.post_ffn_norm {
            ops::rms_norm_rows_inplace(&mut s.proj, norm, c.rms_eps);
        }
        ops::add_inplace(&mut s.x, &s.proj);
    }
}
