//! The mixture-of-experts feed-forward on the CPU: route the step's tokens, gather each
//! chosen expert's tokens, then run every chosen expert's gate and up products as one
//! operation on the worker team, and their down products as another (each in the matrix's
//! own quantized, interleaved layout), and add the weighted results back per token. A
//! shared expert (Qwen2-MoE) runs over every token in the same two operations. An expert
//! no token chose is never read. gpt-oss adds biases to the router and to each expert's
//! three products, and activates with its clamped SwiGLU.

use super::ops;
use crate::backend::moe_routing::Routing;
use crate::model::{Activation, MoeConfig, MoeFfn};
use crate::quant::{MatJob, QMatrix};

/// Buffers of the expert path, kept between steps.
#[derive(Default)]
pub(super) struct MoeScratch {
    router_logits: Vec<f32>,
    pub(super) routing: Routing,
    /// Every chosen expert's tokens' rows, gathered expert after expert.
    rows: Vec<f32>,
    /// `(expert, first row in rows, rows)` of each chosen expert.
    groups: Vec<(usize, usize, usize)>,
    gate: Vec<f32>,
    up: Vec<f32>,
    down: Vec<f32>,
    /// The shared expert's gate, up and down outputs over all the step's tokens.
    shared_gate: Vec<f32>,
    shared_up: Vec<f32>,
    shared_out: Vec<f32>,
    /// The shared expert's gate logit per token.
    shared_logits: Vec<f32>,
    /// The step's choices, `[token][routed layer][k]` (see `Backend::routed_experts`).
    pub(super) routes: Vec<u32>,
}

impl MoeScratch {
    /// Sizes the step's route record for `n` tokens.
    pub(super) fn start_step(&mut self, cfg: &MoeConfig, n: usize) {
        self.routes.clear();
        self.routes.resize(n * cfg.routed_layers() * cfg.top_k, 0);
    }

    /// Writes the choices just made in `layer` into the step's route record.
    fn record_routes(&mut self, cfg: &MoeConfig, layer: usize, n: usize) {
        let routed = cfg.routed_layers();
        let ordinal = cfg.sparse_layers[..layer].iter().filter(|&&s| s).count();
        let k = cfg.top_k;
        for t in 0..n {
            let at = (t * routed + ordinal) * k;
            for (slot, &(e, _)) in self.routes[at..at + k]
                .iter_mut()
                .zip(self.routing.token_choices(t))
            {
                *slot = e;
            }
        }
    }
}

/// One routed layer's weights and settings.
pub(super) struct MoeLayer<'a> {
    pub ffn: &'a MoeFfn,
    pub cfg: &'a MoeConfig,
    /// Its index among all layers (for the route record).
    pub layer: usize,
    pub activation: Activation,
}

/// `out = Σ_k w_k · expert_k(xn)` for each of the `n` rows of `xn` (`n × hidden`), the
/// choices recorded as `moe.layer`'s.
pub(super) fn moe_ffn(
    moe: &MoeLayer<'_>,
    xn: &[f32],
    n: usize,
    s: &mut MoeScratch,
    out: &mut [f32],
) {
    let MoeLayer {
        ffn,
        cfg,
        layer,
        activation,
    } = *moe;
    let h = ffn.router.cols;
    let f = cfg.expert_ffn;
    s.router_logits.resize(n * cfg.n_experts, 0.0);
    ffn.router.matmul(xn, n, &mut s.router_logits);
    if let Some(b) = &ffn.router_bias {
        ops::add_bias_rows(&mut s.router_logits, b);
    }
    s.routing
        .route(&s.router_logits, cfg.n_experts, cfg.top_k, cfg.norm_topk);
    s.record_routes(cfg, layer, n);
    let MoeScratch {
        routing,
        rows,
        groups,
        gate,
        up,
        down: y,
        shared_gate,
        shared_up,
        shared_out,
        shared_logits,
        ..
    } = s;
    groups.clear();
    rows.clear();
    for e in routing.active_experts() {
        let slots = routing.expert_slots(e);
        groups.push((e, rows.len() / h, slots.len()));
        for &(t, _) in slots {
            let t = t as usize;
            rows.extend_from_slice(&xn[t * h..(t + 1) * h]);
        }
    }
    let total = rows.len() / h;
    gate.resize(total * f, 0.0);
    up.resize(total * f, 0.0);
    y.resize(total * h, 0.0);
    // All experts' gate and up products as one operation on the team, then all downs.
    let mut jobs = Vec::with_capacity(2 * groups.len());
    let (mut gates, mut ups) = (&mut gate[..], &mut up[..]);
    for &(e, r0, m) in groups.iter() {
        let expert = &ffn.experts[e];
        let x = &rows[r0 * h..(r0 + m) * h];
        let (g, rest) = std::mem::take(&mut gates).split_at_mut(m * f);
        gates = rest;
        let (u, rest) = std::mem::take(&mut ups).split_at_mut(m * f);
        ups = rest;
        jobs.push(job(&expert.gate, x, m, g));
        jobs.push(job(&expert.up, x, m, u));
    }
    if let Some(shared) = &ffn.shared {
        let sf = shared.ffn.gate.rows;
        shared_gate.resize(n * sf, 0.0);
        shared_up.resize(n * sf, 0.0);
        shared_out.resize(n * h, 0.0);
        jobs.push(job(&shared.ffn.gate, xn, n, shared_gate));
        jobs.push(job(&shared.ffn.up, xn, n, shared_up));
    }
    QMatrix::matmul_grouped(&mut jobs);
    drop(jobs);
    if let Some(b) = &ffn.expert_biases {
        for &(e, r0, m) in groups.iter() {
            let rows = r0 * f..(r0 + m) * f;
            ops::add_bias_rows(&mut gate[rows.clone()], &b.gate[e * f..(e + 1) * f]);
            ops::add_bias_rows(&mut up[rows], &b.up[e * f..(e + 1) * f]);
        }
    }
    // Each expert's rows are contiguous, so one pass activates them all.
    match cfg.clamped_swiglu {
        Some(c) => ops::clamped_swiglu(gate, up, c.alpha, c.limit),
        None => ops::gated_activation(activation, gate, up),
    }
    if ffn.shared.is_some() {
        ops::gated_activation(activation, shared_gate, shared_up);
    }
    let mut jobs = Vec::with_capacity(groups.len());
    let mut ys = &mut y[..];
    for &(e, r0, m) in groups.iter() {
        let (o, rest) = std::mem::take(&mut ys).split_at_mut(m * h);
        ys = rest;
        jobs.push(job(&ffn.experts[e].down, &gate[r0 * f..(r0 + m) * f], m, o));
    }
    if let Some(shared) = &ffn.shared {
        jobs.push(job(&shared.ffn.down, shared_gate, n, shared_out));
    }
    QMatrix::matmul_grouped(&mut jobs);
    drop(jobs);
    if let Some(b) = &ffn.expert_biases {
        for &(e, r0, m) in groups.iter() {
            ops::add_bias_rows(&mut y[r0 * h..(r0 + m) * h], &b.down[e * h..(e + 1) * h]);
        }
    }
    out.fill(0.0);
    for &(e, r0, m) in groups.iter() {
        let slots = routing.expert_slots(e);
        for (&(t, w), row) in slots.iter().zip(y[r0 * h..(r0 + m) * h].chunks_exact(h)) {
            let t = t as usize;
            ops::axpy(&mut out[t * h..(t + 1) * h], w, row);
        }
    }
    if let Some(shared) = &ffn.shared {
        // Each token's share of the shared expert: sigmoid(gate · x).
        shared_logits.resize(n, 0.0);
        shared.gate.matmul(xn, n, shared_logits);
        for ((o, row), &z) in out
            .chunks_exact_mut(h)
            .zip(shared_out.chunks_exact(h))
            .zip(shared_logits.iter())
        {
            ops::axpy(o, 1.0 / (1.0 + (-z).exp()), row);
        }
    }
}

fn job<'a>(mat: &'a QMatrix, x: &'a [f32], n_tokens: usize, out: &'a mut [f32]) -> MatJob<'a> {
    MatJob {
        mat,
        x,
        n_tokens,
        out,
    }
}
