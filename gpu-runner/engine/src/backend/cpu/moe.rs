//! The mixture-of-experts feed-forward on the CPU: route the step's tokens, then run each
//! chosen expert once over all the tokens that chose it (gather → gate/up → activation →
//! down → weighted scatter-add). Each expert's products go to the worker team like any
//! other matrix product, in the matrix's own (quantized, interleaved) layout; an expert no
//! token chose is never read.

use super::ops;
use crate::backend::moe_routing::Routing;
use crate::model::{Activation, MoeConfig, MoeFfn};
use crate::quant::QMatrix;

/// Buffers of the expert path, kept between steps.
#[derive(Default)]
pub(super) struct MoeScratch {
    router_logits: Vec<f32>,
    pub(super) routing: Routing,
    /// The rows of one expert's tokens, gathered.
    rows: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    out: Vec<f32>,
    /// The step's choices, `[token][routed layer][k]` (see `Backend::routed_experts`).
    pub(super) routes: Vec<u32>,
}

impl MoeScratch {
    /// Sizes the step's route record for `n` tokens.
    pub(super) fn start_step(&mut self, cfg: &MoeConfig, n: usize) {
        let routed = cfg.sparse_layers.iter().filter(|&&s| s).count();
        self.routes.clear();
        self.routes.resize(n * routed * cfg.top_k, 0);
    }

    /// Writes the choices just made in `layer` into the step's route record.
    fn record_routes(&mut self, cfg: &MoeConfig, layer: usize, n: usize) {
        let routed = cfg.sparse_layers.iter().filter(|&&s| s).count();
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
    s.routing
        .route(&s.router_logits, cfg.n_experts, cfg.top_k, cfg.norm_topk);
    s.record_routes(cfg, layer, n);
    out.fill(0.0);
    let MoeScratch {
        routing,
        rows,
        gate,
        up,
        out: y,
        ..
    } = s;
    for e in routing.active_experts() {
        let expert = &ffn.experts[e];
        let slots = routing.expert_slots(e);
        let m = slots.len();
        rows.clear();
        for &(t, _) in slots {
            let t = t as usize;
            rows.extend_from_slice(&xn[t * h..(t + 1) * h]);
        }
        gate.resize(m * f, 0.0);
        up.resize(m * f, 0.0);
        QMatrix::matmul_many(&[&expert.gate, &expert.up], rows, m, &mut [gate, up]);
        ops::gated_activation(activation, gate, up);
        y.resize(m * h, 0.0);
        expert.down.matmul(gate, m, y);
        for (&(t, w), row) in slots.iter().zip(y.chunks_exact(h)) {
            let t = t as usize;
            ops::axpy(&mut out[t * h..(t + 1) * h], w, row);
        }
    }
}
