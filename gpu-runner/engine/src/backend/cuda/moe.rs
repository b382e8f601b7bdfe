//! A mixture-of-experts layer on the device: its weights, its scratch, and its feed-forward
//! (kernels in `moe.cu`). The router is a plain product; each token's experts are chosen on
//! the device; the step's (token, choice) slots are grouped by expert into tiles of at most
//! [`GEMV_MAX_ROWS`] rows; then one launch runs every tile's `[gate | up]` product (the
//! activation written as it goes) and one every tile's down product, each tile through its
//! own expert. No host round trip: the launches are the same for every routing, so decode
//! steps replay from CUDA graphs as dense ones do. Experts no token chose have no tile and
//! are never read. gpt-oss's biased experts and clamped SwiGLU are [`super::moe_clamped`]'s.
//!
//! Each layer's experts live in one buffer per projection, expert `e` at `e · stride` bytes,
//! all in one format: the file's blocks where every expert's can stay so (or what
//! [`CudaWeights`] makes of float ones), else bf16. The grouped products read x as bf16
//! whatever [`super::QuantX`] says.

use std::sync::Arc;

use cudarc::driver::CudaStream;

use super::buffer::DeviceBuf;
use super::forward::{grid, ELEMENT_THREADS};
use super::gemm::{GemvInput, GEMV_MAX_ROWS, QUANT_GEMV_WARPS};
use super::moe_bank::ExpertBank;
use super::moe_clamped::ExpertBiases;
use super::params::{AddRmsNorm, GatedAct, MoeCombine, MoeGather, MoeGemv, MoeRoute, MoeSort};
use super::step::{addr, grow};
use super::weights::{upload_stacked, CudaWeights, DeviceFfn, DeviceMatrix, DeviceWeights};
use super::{CudaBackend, CudaError};
use crate::model::{Activation, ModelConfig, MoeConfig, MoeFfn};
use crate::quant::QMatrix;

/// Threads of `moe_sort`'s one block (MOE_SORT_THREADS in moe.cu).
pub(super) const SORT_THREADS: u32 = 256;
/// The most experts a layer may have (MOE_MAX_EXPERTS in moe.cu).
pub const MAX_EXPERTS: usize = 256;
/// Ints per tile of the grouped products (MOE_TILE_INTS in moe.cu).
const TILE_INTS: usize = 4;
/// Threads of `moe_route` (a token each) and `moe_gather` (16 bytes each).
pub(super) const ROUTE_THREADS: u32 = 128;

/// A shared expert (Qwen2-MoE): a dense feed-forward over every token.
pub struct SharedFfn {
    /// `[2·shared_ffn, hidden]`.
    pub gate_up: DeviceMatrix,
    pub down: DeviceMatrix,
}

/// One mixture-of-experts layer's weights on the device.
pub struct DeviceMoe {
    /// `[n_experts, hidden]` bf16, then a shared expert's gate row where there is one.
    pub router: DeviceMatrix,
    /// Each expert's `[gate | up]`, `[2·expert_ffn, hidden]`.
    pub gate_up: ExpertBank,
    /// Each expert's down projection, `[hidden, expert_ffn]`.
    pub down: ExpertBank,
    pub shared: Option<SharedFfn>,
    /// The router's and experts' biases (gpt-oss).
    pub biases: Option<ExpertBiases>,
}

impl DeviceMoe {
    pub fn upload(
        stream: &Arc<CudaStream>,
        ffn: &MoeFfn,
        mode: CudaWeights,
    ) -> Result<Self, CudaError> {
        if ffn.experts.len() > MAX_EXPERTS {
            return Err(CudaError::Failure(format!(
                "{} experts in a layer; the CUDA backend routes at most {MAX_EXPERTS}",
                ffn.experts.len()
            )));
        }
        let gate_up: Vec<Vec<&QMatrix>> =
            ffn.experts.iter().map(|x| vec![&x.gate, &x.up]).collect();
        let down: Vec<Vec<&QMatrix>> = ffn.experts.iter().map(|x| vec![&x.down]).collect();
        // The router stays bf16: its logits choose the experts, so it gets the precision.
        let mut router = vec![&ffn.router];
        router.extend(ffn.shared.as_ref().map(|s| &s.gate));
        let shared = match &ffn.shared {
            Some(s) => Some(SharedFfn {
                gate_up: upload_stacked(stream, &[&s.ffn.gate, &s.ffn.up], mode)?,
                down: upload_stacked(stream, &[&s.ffn.down], mode)?,
            }),
            None => None,
        };
        Ok(DeviceMoe {
            router: upload_stacked(stream, &router, CudaWeights::Bf16)?,
            gate_up: ExpertBank::upload(stream, &gate_up, mode)?,
            down: ExpertBank::upload(stream, &down, mode)?,
            shared,
            biases: ExpertBiases::upload(stream, ffn)?,
        })
    }

    /// The plain matrices (router, shared expert), which the GEMV tuning may time.
    pub fn matrices(&self) -> Vec<&DeviceMatrix> {
        let mut m = vec![&self.router];
        if let Some(s) = &self.shared {
            m.extend([&s.gate_up, &s.down]);
        }
        m
    }

    /// Bytes on the device.
    pub fn bytes(&self) -> usize {
        self.matrices().iter().map(|m| m.bytes()).sum::<usize>()
            + self.gate_up.bytes()
            + self.down.bytes()
            + self.biases.as_ref().map_or(0, ExpertBiases::bytes)
    }
}

/// The most tiles `slots` choices of `n_experts` experts make: each expert's slots in tiles
/// of [`GEMV_MAX_ROWS`], at most one part-filled tile per expert that has slots.
pub fn max_tiles(slots: usize, n_experts: usize) -> usize {
    slots.div_ceil(GEMV_MAX_ROWS) + n_experts.min(slots)
}

/// The buffers of a step's mixture-of-experts layers (shared by all of them).
#[derive(Default)]
pub struct MoeScratch {
    /// Router logits `[n, n_experts (+1)]` f32.
    logits: Option<DeviceBuf<f32>>,
    /// Each token's experts and weights, `[n, top_k]`.
    ids: Option<DeviceBuf<i32>>,
    weights: Option<DeviceBuf<f32>>,
    /// Each token's share of the shared expert.
    shared_scale: Option<DeviceBuf<f32>>,
    /// Sorted slot → token, and choice → sorted slot.
    slot_token: Option<DeviceBuf<i32>>,
    slot_of: Option<DeviceBuf<i32>>,
    tiles: Option<DeviceBuf<i32>>,
    /// The sorted slots' input rows `[slots, hidden]` bf16, activations `[slots,
    /// expert_ffn]` bf16 and outputs `[slots, hidden]` f32.
    x: Option<DeviceBuf<u16>>,
    act: Option<DeviceBuf<u16>>,
    out: Option<DeviceBuf<f32>>,
    /// Clamped experts' `[gate | up]` rows `[slots, 2·expert_ffn]` f32, before their
    /// activation.
    gate_up: Option<DeviceBuf<f32>>,
    /// The shared expert's `[n, 2·shared_ffn]` f32, `[n, shared_ffn]` bf16, `[n, hidden]` f32.
    shared_gate_up: Option<DeviceBuf<f32>>,
    shared_act: Option<DeviceBuf<u16>>,
    shared_out: Option<DeviceBuf<f32>>,
}

impl MoeScratch {
    /// Makes room for `n` tokens; returns whether any buffer moved.
    pub fn ensure(
        &mut self,
        stream: &Arc<CudaStream>,
        c: &ModelConfig,
        n: usize,
    ) -> Result<bool, CudaError> {
        let Some(moe) = &c.moe else {
            return Ok(false);
        };
        let slots = n * moe.top_k;
        let shared = moe.shared_ffn.unwrap_or(0);
        let clamped = moe.clamped_swiglu.map_or(0, |_| slots * 2 * moe.expert_ffn);
        let moved = [
            grow(&mut self.logits, stream, n * (moe.n_experts + 1))?,
            grow(&mut self.ids, stream, slots)?,
            grow(&mut self.weights, stream, slots)?,
            grow(&mut self.shared_scale, stream, n)?,
            grow(&mut self.slot_token, stream, slots)?,
            grow(&mut self.slot_of, stream, slots)?,
            grow(
                &mut self.tiles,
                stream,
                max_tiles(slots, moe.n_experts) * TILE_INTS,
            )?,
            grow(&mut self.x, stream, slots * c.hidden)?,
            grow(&mut self.act, stream, slots * moe.expert_ffn)?,
            grow(&mut self.out, stream, slots * c.hidden)?,
            grow(&mut self.gate_up, stream, clamped.max(1))?,
            grow(&mut self.shared_gate_up, stream, (n * 2 * shared).max(1))?,
            grow(&mut self.shared_act, stream, (n * shared).max(1))?,
            grow(&mut self.shared_out, stream, (n * c.hidden).max(1))?,
        ];
        Ok(moved.contains(&true))
    }
}

/// Which of an expert's two products.
#[derive(Clone, Copy)]
enum Projection {
    GateUp,
    Down,
}

/// Layer `layer`'s experts.
fn moe_layer(weights: &DeviceWeights, layer: usize) -> Result<&DeviceMoe, CudaError> {
    match &weights.layers[layer].ffn {
        DeviceFfn::Moe(moe) => Ok(moe),
        DeviceFfn::Dense { .. } => Err(CudaError::Failure(format!(
            "layer {layer} is not a mixture of experts"
        ))),
    }
}

fn activation_code(a: Activation) -> i32 {
    match a {
        Activation::Silu => 0,
        Activation::GeluTanh => 1,
    }
}

impl CudaBackend {
    /// The mixture-of-experts feed-forward of `layer` over the step's `n` tokens (its input
    /// normalised in `xn`), ending the sub-block as a dense one does: its output added to
    /// the residual stream and normalised by the next layer's norm (none after the last:
    /// the head normalises).
    pub(super) fn moe_feed_forward(&mut self, layer: usize, n: usize) -> Result<(), CudaError> {
        let moe = moe_layer(&self.weights, layer)?;
        let cfg: &MoeConfig =
            self.config.moe.as_ref().ok_or_else(|| {
                CudaError::Failure("experts in a model without an MoE config".into())
            })?;
        let (e, k, hidden) = (cfg.n_experts, cfg.top_k, self.config.hidden);
        let slots = n * k;
        let tiles = max_tiles(slots, e);
        let m = &self.scratch.moe;
        let s = &self.scratch;
        let (logits, ids, weights) = (addr(&m.logits), addr(&m.ids), addr(&m.weights));
        let (slot_token, slot_of, tile_buf) =
            (addr(&m.slot_token), addr(&m.slot_of), addr(&m.tiles));
        let (xs, act, out) = (addr(&m.x), addr(&m.act), addr(&m.out));
        let shared_scale = if moe.shared.is_some() {
            addr(&m.shared_scale)
        } else {
            0
        };
        let (xn, x, proj) = (addr(&s.xn), addr(&s.x), addr(&s.proj));
        let glu = activation_code(self.config.activation);
        let clamped = match (&moe.biases, cfg.clamped_swiglu) {
            (Some(b), Some(swiglu)) => Some(b.launch(tile_buf, tiles, swiglu)),
            (None, None) => None,
            _ => {
                return Err(CudaError::Failure(format!(
                    "layer {layer}: expert biases and the clamped SwiGLU come together"
                )))
            }
        };
        let router_bias = moe.biases.as_ref().map_or(0, |b| b.router.ptr());
        let gate_up = addr(&m.gate_up);

        gemm!(self, "router", GemvInput::plain(xn), &moe.router, n, logits)?;
        launch!(
            self,
            "moe_route",
            grid(n.div_ceil(ROUTE_THREADS as usize), 1, ROUTE_THREADS),
            MoeRoute {
                logits,
                bias: router_bias,
                ld: moe.router.rows as i32,
                ids,
                weights,
                shared_scale,
                n: n as i32,
                n_experts: e as i32,
                top_k: k as i32,
                norm_topk: cfg.norm_topk as i32,
            }
        )?;
        launch!(
            self,
            "moe_sort",
            grid(1, 1, SORT_THREADS),
            MoeSort {
                ids,
                slots: slots as i32,
                top_k: k as i32,
                n_experts: e as i32,
                max_tiles: tiles as i32,
                slot_token,
                slot_of,
                tiles: tile_buf,
            }
        )?;
        launch!(
            self,
            "moe_gather",
            grid(
                (hidden / 8).div_ceil(ROUTE_THREADS as usize),
                slots,
                ROUTE_THREADS
            ),
            MoeGather {
                x: xn,
                slot_token,
                out: xs,
                hidden: hidden as i32,
            }
        )?;
        // Every tile's [gate | up] rows, the activation written as bf16: a block per
        // QUANT_GEMV_WARPS / 2 gate/up row pairs.
        let f = moe.gate_up.rows / 2;
        let has_shared = moe.shared.is_some();
        match &clamped {
            // f32 [gate | up] rows, then their biases and activation.
            Some(c) => {
                self.grouped_product(layer, Projection::GateUp, tiles, (xs, gate_up), 2 * f, -1)?;
                self.clamped_activation(c, f, (gate_up, act))?;
            }
            None => self.grouped_product(layer, Projection::GateUp, tiles, (xs, act), f, glu)?,
        }
        self.grouped_product(layer, Projection::Down, tiles, (act, out), hidden, -1)?;
        if let Some(c) = &clamped {
            self.expert_down_bias(c, hidden, out)?;
        }
        let shared_out = if has_shared {
            self.shared_expert(layer, n)?;
            addr(&self.scratch.moe.shared_out)
        } else {
            0
        };
        launch!(
            self,
            "moe_combine",
            grid(
                hidden.div_ceil(ELEMENT_THREADS as usize),
                n,
                ELEMENT_THREADS
            ),
            MoeCombine {
                down: out,
                slot_of,
                weights,
                shared: shared_out,
                shared_scale,
                out: proj,
                hidden: hidden as i32,
                top_k: k as i32,
            }
        )?;
        let l = &self.weights.layers[layer];
        let post = addr(&l.post_ffn_norm);
        let next = self
            .weights
            .layers
            .get(layer + 1)
            .map_or(0, |next| next.attn_norm.ptr());
        let eps = self.config.rms_eps;
        launch!(
            self,
            "add_rms_norm",
            grid(n, 1, super::forward::ROW_THREADS),
            AddRmsNorm {
                x,
                delta: proj,
                post_w: post,
                next_w: next,
                out: xn,
                hidden: hidden as i32,
                eps
            }
        )
    }

    /// One launch over every tile of the step: `(x, out)` the sorted rows in and out, `out`
    /// `ldo` wide (with `glu` >= 0 the bf16 activation of `[gate | up]` rows).
    fn grouped_product(
        &mut self,
        layer: usize,
        projection: Projection,
        n_tiles: usize,
        (x, out): (u64, u64),
        ldo: usize,
        glu: i32,
    ) -> Result<(), CudaError> {
        let moe = moe_layer(&self.weights, layer)?;
        let bank = match projection {
            Projection::GateUp => &moe.gate_up,
            Projection::Down => &moe.down,
        };
        let tiles = addr(&self.scratch.moe.tiles);
        let rows_per_block = if glu >= 0 {
            QUANT_GEMV_WARPS / 2
        } else {
            QUANT_GEMV_WARPS
        };
        let blocks = if glu >= 0 { bank.rows / 2 } else { bank.rows }.div_ceil(rows_per_block);
        launch!(
            self,
            bank.kernel,
            grid(blocks, n_tiles, 32 * QUANT_GEMV_WARPS as u32),
            MoeGemv {
                w: bank.buf.ptr(),
                stride: bank.stride as i64,
                tiles,
                x,
                out,
                m: bank.rows as i32,
                k: bank.cols as i32,
                ldo: ldo as i32,
                glu,
            }
        )
    }

    /// The shared expert over every token of the step, into `scratch.moe.shared_out`.
    fn shared_expert(&mut self, layer: usize, n: usize) -> Result<(), CudaError> {
        let shared = moe_layer(&self.weights, layer)?
            .shared
            .as_ref()
            .ok_or_else(|| CudaError::Failure(format!("layer {layer} has no shared expert")))?;
        let m = &self.scratch.moe;
        let (gate_up, act, out) = (
            addr(&m.shared_gate_up),
            addr(&m.shared_act),
            addr(&m.shared_out),
        );
        let xn = addr(&self.scratch.xn);
        let f = shared.gate_up.rows / 2;
        gemm!(
            self,
            "shared gate_up",
            GemvInput::plain(xn),
            &shared.gate_up,
            n,
            gate_up
        )?;
        launch!(
            self,
            "gated_act",
            grid(n, f.div_ceil(ELEMENT_THREADS as usize), ELEMENT_THREADS),
            GatedAct {
                gate_up,
                out: act,
                ffn: f as i32,
                act: activation_code(self.config.activation),
            }
        )?;
        gemm!(
            self,
            "shared down",
            GemvInput::plain(act),
            &shared.down,
            n,
            out
        )
    }
}
