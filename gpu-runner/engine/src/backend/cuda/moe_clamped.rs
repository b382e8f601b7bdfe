//! gpt-oss's experts on the device: a bias on the router's logits and on each expert's gate,
//! up and down products, and the clamped SwiGLU (kernels in `moe.cu`), as the CPU backend's
//! `moe.rs` computes them. The router's bias goes to `moe_route`. The experts' `[gate | up]`
//! product writes f32 rows instead of the activation, which `moe_clamped_glu` computes after
//! adding each row's expert's biases; `moe_expert_bias` adds the down biases before the
//! weighted sum.

use std::sync::Arc;

use cudarc::driver::{CudaStream, LaunchConfig};

use super::buffer::DeviceBuf;
use super::forward::{grid, ELEMENT_THREADS};
use super::params::{MoeClampedGlu, MoeExpertBias};
use super::{CudaBackend, CudaError};
use crate::model::{ClampedSwiglu, MoeFfn};

/// One layer's biases on the device.
pub struct ExpertBiases {
    /// Added to the router's logits, `[n_experts]`.
    pub router: DeviceBuf<f32>,
    /// Each expert's gate biases then its up biases, `[n_experts, 2·expert_ffn]`.
    gate_up: DeviceBuf<f32>,
    /// Each expert's down biases, `[n_experts, hidden]`.
    down: DeviceBuf<f32>,
}

impl ExpertBiases {
    /// `ffn`'s biases, where it has them (`None`: a softmax-routed mixture without).
    pub fn upload(stream: &Arc<CudaStream>, ffn: &MoeFfn) -> Result<Option<Self>, CudaError> {
        let (Some(router), Some(experts)) = (&ffn.router_bias, &ffn.expert_biases) else {
            return Ok(None);
        };
        let n = ffn.experts.len().max(1);
        let f = experts.gate.len() / n;
        let gate_up: Vec<f32> = experts
            .gate
            .chunks_exact(f.max(1))
            .zip(experts.up.chunks_exact(f.max(1)))
            .flat_map(|(g, u)| g.iter().chain(u).copied())
            .collect();
        Ok(Some(ExpertBiases {
            router: DeviceBuf::from_host(stream, router)?,
            gate_up: DeviceBuf::from_host(stream, &gate_up)?,
            down: DeviceBuf::from_host(stream, &experts.down)?,
        }))
    }

    /// Bytes on the device.
    pub fn bytes(&self) -> usize {
        4 * (self.router.len() + self.gate_up.len() + self.down.len())
    }
}

/// Where a step's clamped experts read and write (device addresses): every tile's
/// `(expert, first slot, rows)`, and the layer's biases.
pub(super) struct ClampedLaunch {
    tiles: u64,
    n_tiles: usize,
    gate_up_bias: u64,
    down_bias: u64,
    swiglu: ClampedSwiglu,
}

impl ClampedLaunch {
    /// A thread per column of `width`, a block row per tile.
    fn grid(&self, width: usize) -> LaunchConfig {
        grid(
            width.div_ceil(ELEMENT_THREADS as usize),
            self.n_tiles,
            ELEMENT_THREADS,
        )
    }
}

impl ExpertBiases {
    /// The launches' view of these biases for a step of `n_tiles` tiles at `tiles`.
    pub(super) fn launch(
        &self,
        tiles: u64,
        n_tiles: usize,
        swiglu: ClampedSwiglu,
    ) -> ClampedLaunch {
        ClampedLaunch {
            tiles,
            n_tiles,
            gate_up_bias: self.gate_up.ptr(),
            down_bias: self.down.ptr(),
            swiglu,
        }
    }
}

impl CudaBackend {
    /// The clamped SwiGLU of every tile's `[gate | up]` rows (`gate_up`, f32, `2·ffn` wide)
    /// with their experts' biases, into `act` (bf16, `ffn` wide).
    pub(super) fn clamped_activation(
        &mut self,
        c: &ClampedLaunch,
        ffn: usize,
        (gate_up, act): (u64, u64),
    ) -> Result<(), CudaError> {
        launch!(
            self,
            "moe_clamped_glu",
            c.grid(ffn),
            MoeClampedGlu {
                gate_up,
                tiles: c.tiles,
                bias: c.gate_up_bias,
                act,
                ffn: ffn as i32,
                alpha: c.swiglu.alpha,
                limit: c.swiglu.limit,
            }
        )
    }

    /// Adds each tile's expert's down biases to the tile's rows of `rows` (f32, `hidden`
    /// wide).
    pub(super) fn expert_down_bias(
        &mut self,
        c: &ClampedLaunch,
        hidden: usize,
        rows: u64,
    ) -> Result<(), CudaError> {
        launch!(
            self,
            "moe_expert_bias",
            c.grid(hidden),
            MoeExpertBias {
                rows,
                tiles: c.tiles,
                bias: c.down_bias,
                width: hidden as i32,
            }
        )
    }
}
