//! The CUDA backend: weights (bf16) and the paged KV cache (bf16) on one NVIDIA GPU, one
//! batched step per `forward_step` on one stream. Large GEMMs go through cuBLAS, decode-sized
//! ones through our GEMV ([`gemm`]); everything else is a kernel of ours compiled at run time
//! with NVRTC ([`kernels`]). Greedy and sampled rows get their token picked on the device, and decode steps of
//! a few sequences replay CUDA graphs ([`graphs`]); from sm_90 each kernel launches while the
//! previous one finishes ([`launch`]). The batcher, block manager and sampler
//! are the CPU backend's: only [`Backend::forward_step`] differs.
//!
//! The crate links CUDA dynamically, so it builds and runs on machines without it; opening a
//! device there fails with [`CudaError::NoDevice`].

mod attention_split;
mod buffer;
mod configure;
pub mod device;
mod diag;
/// The kernels, and a whole CUDA driver, emulated on the CPU: for tests only (the
/// `emulator` feature, which the crate's own tests turn on).
#[cfg(any(test, feature = "emulator"))]
pub mod emu;
#[macro_use]
mod forward;
mod gemm;
mod graphs;
pub mod kernels;
mod l2_prefetch;
mod launch;
mod lora;
mod mmq;
mod moe;
mod moe_bank;
mod moe_clamped;
mod options;
mod params;
mod prefill;
mod step;
mod tune;
mod weights;

use std::sync::Arc;

use cudarc::driver::sys::{CUdevice_attribute, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaContext, CudaStream, DriverError};

pub use device::DeviceInfo;
pub use mmq::{MmqShape, MmqTiming};
pub use options::{CudaDebug, CudaOptions, MmqMode, PrefillChoice, DEBUG_NAMES};
pub use weights::{device_block_format, CudaWeights, QuantX};

use self::buffer::DeviceBuf;
use self::diag::profile::Profiler;
use self::diag::step_clock::{step_shape, StepClock};
use self::gemm::Gemm;
use self::graphs::{DecodeGraphs, GraphKey, Replay};
use self::kernels::Kernels;
use self::l2_prefetch::L2Prefetch;
use self::launch::Launcher;
use self::lora::DeviceAdapters;
pub use self::prefill::PrefillKernel;
use self::step::{Padding, Scratch, StepInputs};
use self::weights::DeviceWeights;
use super::batch::BatchLayout;
use super::cpu::kv_bytes_per_block;
use super::cpu::rope::inv_freqs;
use super::{Backend, BackendError, NoMasks, SeqSlice, StepMasks, StepOutput};
use crate::footprint::KvPoolSize;
use crate::model::{ModelArtifacts, ModelConfig, RopeScaling, RopeStyle, CUDA_LACKS};

#[cfg(test)]
mod tests {
    use super::auto_kv_blocks;

    #[test]
    fn an_automatic_kv_pool_takes_most_of_what_the_weights_leave() {
        let gib = 1usize << 30;
        // 100 GiB free, 2 GiB reserved, 90 % of the rest in 1 MiB blocks.
        assert_eq!(
            auto_kv_blocks(100 * gib, 1 << 20),
            (98.0 * 1024.0 * 0.9) as usize
        );
        assert_eq!(
            auto_kv_blocks(gib, 1 << 20),
            0,
            "less than the reserve leaves nothing"
        );
        assert_eq!(
            auto_kv_blocks(10 * gib, 0),
            (8.0 * gib as f64 * 0.9) as usize
        );
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error("no usable CUDA device: {0}")]
    NoDevice(String),
    #[error("CUDA driver: {0}")]
    Driver(String),
    #[error("CUDA backend: {0}")]
    Failure(String),
}

impl CudaError {
    fn driver(e: DriverError) -> Self {
        CudaError::Driver(e.to_string())
    }
}

impl From<CudaError> for BackendError {
    fn from(e: CudaError) -> Self {
        BackendError::Failure(e.to_string())
    }
}

/// A model with its KV pool on one GPU.
pub struct CudaBackend {
    config: ModelConfig,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// Launches our kernels (with early starts where the device has them, [`launch`]);
    /// `gemm` holds a clone.
    launcher: Launcher,
    gemm: Gemm,
    weights: DeviceWeights,
    /// `[layer, block, slot, kv_dim]` bf16, `num_blocks + 1` blocks per layer (the last is
    /// the graph padding's).
    k_cache: DeviceBuf<u16>,
    v_cache: DeviceBuf<u16>,
    block_size: usize,
    /// Blocks the block manager hands out.
    num_blocks: usize,
    inv_freq_global: DeviceBuf<f64>,
    inv_freq_local: DeviceBuf<f64>,
    /// Multiprocessors of the device (how far attention is split over the keys).
    sm_count: usize,
    /// What the L2 prefetches ask for on this device when they are on.
    device_l2: L2Prefetch,
    /// Every setting ([`CudaOptions`]); [`CudaBackend::set_options`] changes them.
    options: CudaOptions,
    /// The prompt-run attention kernel the options give this model's heads.
    prefill: PrefillKernel,
    layout: BatchLayout,
    inputs: StepInputs,
    scratch: Scratch,
    /// The step's grammar masks on their way to `scratch.masks`.
    host_masks: Vec<u32>,
    graphs: DecodeGraphs,
    /// LoRA adapters on the device, and the step's.
    adapters: DeviceAdapters,
    profiler: Profiler,
    /// GPU vs host time per step shape, with graphs on (`step-clock`).
    step_clock: StepClock,
}

impl CudaBackend {
    /// Uploads `artifacts` to device `ordinal` with a bf16 KV pool of `pool` blocks of
    /// `block_size` tokens; [`KvPoolSize::UpTo`] takes fewer if the memory left free after the
    /// weights holds fewer ([`auto_kv_blocks`]). `options` say how the matrices are stored
    /// and everything else ([`CudaOptions`]). A model needing a feature this backend lacks
    /// ([`CUDA_LACKS`]) is refused first, with the reason.
    pub fn new(
        artifacts: &ModelArtifacts,
        ordinal: usize,
        pool: KvPoolSize,
        block_size: usize,
        options: &CudaOptions,
    ) -> Result<Self, CudaError> {
        let config = artifacts.config.clone();
        config
            .require_features("CUDA", CUDA_LACKS)
            .map_err(|e| CudaError::Failure(e.to_string()))?;
        if block_size == 0 || pool.most() == 0 {
            return Err(CudaError::Failure(format!(
                "KV pool needs positive sizes, got {pool:?} of {block_size} tokens"
            )));
        }
        if config.head_dim > 256 {
            return Err(CudaError::Failure(format!(
                "head_dim {} is not supported on CUDA (at most 256)",
                config.head_dim
            )));
        }
        let ctx = device::open(ordinal)?;
        // Its own stream: the legacy default stream cannot be captured into a graph.
        let stream = ctx.new_stream().map_err(CudaError::driver)?;
        let kernels = Kernels::for_device(&ctx, options.kernel_cache.as_deref())
            .map_err(CudaError::Failure)?;
        let (cc_major, _) = ctx.compute_capability().map_err(CudaError::driver)?;
        let launcher = Launcher::new(kernels, Arc::clone(&stream), cc_major);
        let attribute = |a| ctx.attribute(a).map_err(CudaError::driver);
        let sm_count = attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?
            .max(1) as usize;
        let device_l2 = L2Prefetch::new(
            attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?.max(0) as usize,
            sm_count,
            attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)?
                .max(0) as usize,
        );
        let mut gemm = Gemm::new(&stream, launcher.clone())?;
        gemm.mmq_blocks = mmq::MMQ_BLOCKS_PER_SM * sm_count;
        let weights = DeviceWeights::upload(&stream, &config, &artifacts.weights, options.weights)?;
        gemm.reserve_expansion(&stream, weights.largest_quantized())?;
        let num_blocks = match pool {
            KvPoolSize::Blocks(n) => n,
            KvPoolSize::UpTo(most) => {
                let (free, _) = ctx.mem_get_info().map_err(CudaError::driver)?;
                // bf16 here, the same two bytes as the CPU pool's default f16.
                let per_block = kv_bytes_per_block(&config, block_size);
                let blocks = auto_kv_blocks(free, per_block).min(most);
                tracing::info!(
                    blocks,
                    wanted = most,
                    free_bytes = free,
                    "KV pool sized within free device memory"
                );
                if blocks == 0 {
                    return Err(CudaError::Failure(format!(
                        "no device memory left for a KV cache ({free} bytes free after the weights)"
                    )));
                }
                blocks
            }
        };
        // One block more than the block manager hands out: where graph padding writes.
        let kv_len = config
            .n_layers
            .checked_mul(num_blocks + 1)
            .and_then(|v| v.checked_mul(block_size))
            .and_then(|v| v.checked_mul(config.kv_dim()))
            .ok_or_else(|| CudaError::Failure("KV pool size overflows".into()))?;
        let k_cache = DeviceBuf::zeros(&stream, kv_len)?;
        let v_cache = DeviceBuf::zeros(&stream, kv_len)?;
        let global = inv_freqs(
            config.head_dim,
            config.rope_theta,
            config.rope_scaling,
            artifacts.weights.rope_freq_factors.as_deref(),
        );
        let local = inv_freqs(
            config.head_dim,
            config.rope_theta_local,
            RopeScaling::None,
            None,
        );
        let mut backend = CudaBackend {
            inv_freq_global: DeviceBuf::from_host(&stream, &global)?,
            inv_freq_local: DeviceBuf::from_host(&stream, &local)?,
            config,
            ctx,
            launcher,
            gemm,
            weights,
            k_cache,
            v_cache,
            block_size,
            num_blocks,
            sm_count,
            device_l2,
            options: options.clone(),
            prefill: PrefillKernel::F32,
            layout: BatchLayout::default(),
            inputs: StepInputs::default(),
            scratch: Scratch::default(),
            host_masks: Vec::new(),
            graphs: DecodeGraphs::new(true),
            adapters: DeviceAdapters::default(),
            profiler: Profiler::default(),
            step_clock: StepClock::default(),
            stream,
        };
        backend.apply_options(None)?;
        Ok(backend)
    }

    /// The device this backend runs on.
    pub fn device(&self) -> Result<DeviceInfo, CudaError> {
        device::describe(&self.ctx)
    }

    /// Bytes of weight matrices on the device.
    pub fn weight_bytes(&self) -> usize {
        self.weights.matrix_bytes()
    }

    fn run(
        &mut self,
        batch: &[SeqSlice<'_>],
        masks: &mut dyn StepMasks,
    ) -> Result<StepOutput, CudaError> {
        self.ctx.bind_to_thread().map_err(CudaError::driver)?;
        // A step with adapters runs eagerly (its deltas are launched per step's adapters).
        let key = if self.adapters.active() {
            None
        } else {
            self.graphs.key_for(batch, self.block_size)
        };
        let padding = key.map(|k| Padding {
            tokens: k.tokens,
            table_width: k.table_width,
            pad_block: self.num_blocks,
        });
        self.inputs.pack(
            &self.layout,
            batch,
            self.block_size,
            padding,
            self.prefill.tile_tokens(),
        );
        self.step_clock.start(&self.ctx, &self.stream)?;
        let moved_inputs = self.inputs.upload(&self.stream)?;
        let n = self.inputs.tokens;
        let head_rows = self.inputs.full_rows + self.inputs.picked_rows;
        // Sliding-window layers split at most as far as the others; only decode rows split.
        let decode = self.inputs.n_decode;
        let splits = self.attention_split(None, decode).splits;
        let moved_scratch =
            self.scratch
                .ensure(&self.stream, &self.config, n, head_rows, (decode, splits))?;
        if moved_inputs || moved_scratch {
            // Captured graphs hold the old addresses.
            self.graphs.clear();
        }
        // Masked draws pick after the masks have come (they are computed while this runs).
        let masked = self.layout.n_masked > 0;
        match key.map(|k| (k, self.graphs.plan(&k))) {
            Some((key, Replay::Launch)) => self.graphs.launch(&key)?,
            Some((key, Replay::Capture)) => {
                if let Err(e) = self.capture(key) {
                    // Nothing ran while capturing: run the step eagerly, and such steps
                    // from now on.
                    tracing::warn!(?key, error = %e, "CUDA graph capture failed; running eagerly");
                    self.graphs.refuse(key);
                    self.launch_step(n, !masked)?;
                }
            }
            Some((_, Replay::Eager)) | None => self.launch_step(n, !masked)?,
        }
        if masked {
            self.mask_and_pick(batch, masks)?;
        }
        self.step_clock.launched(&self.stream)?;
        let out = self.read_outputs()?;
        self.profiler.end_step()?;
        let (tokens, decode) = (self.inputs.tokens, self.inputs.n_decode);
        self.step_clock.end_step(|| step_shape(tokens, decode))?;
        Ok(out)
    }

    /// Captures the step's launches as `key`'s graph and replays it.
    fn capture(&mut self, key: GraphKey) -> Result<(), CudaError> {
        self.stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(CudaError::driver)?;
        let launched = self.launch_step(key.tokens, !key.masked);
        // End the capture whatever happened, or the stream stays unusable.
        let graph = self.stream.end_capture(CUgraphInstantiate_flags(0));
        launched?;
        let graph = graph
            .map_err(CudaError::driver)?
            .ok_or_else(|| CudaError::Failure("empty CUDA graph".into()))?;
        self.graphs.insert(key, graph);
        self.graphs.launch(&key)
    }
}

impl Backend for CudaBackend {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn block_size(&self) -> usize {
        self.block_size
    }

    fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    fn forward(&mut self, batch: &[SeqSlice<'_>]) -> Result<Vec<f32>, BackendError> {
        Ok(self.forward_step(batch, &mut NoMasks)?.logits)
    }

    fn draws_on_device(&self) -> bool {
        true
    }

    fn serves_adapters(&self) -> bool {
        true
    }

    /// Rows that pick a token (greedy or drawn, masked by a grammar or not) go through the
    /// LM head with the others, but only their token comes back.
    fn forward_step(
        &mut self,
        batch: &[SeqSlice<'_>],
        masks: &mut dyn StepMasks,
    ) -> Result<StepOutput, BackendError> {
        self.layout
            .build(batch, &self.config, self.block_size, self.num_blocks)?;
        if self.layout.n_tokens() == 0 {
            return Ok(StepOutput::default());
        }
        self.ctx.bind_to_thread().map_err(CudaError::driver)?;
        self.adapters
            .prepare(&self.stream, batch, &self.layout.offsets)?;
        Ok(self.run(batch, masks)?)
    }
}

/// Device memory kept out of an automatically sized KV pool: activations of a full step,
/// cuBLAS workspaces, CUDA graphs and other models' growth.
const AUTO_KV_RESERVE_BYTES: usize = 2 << 30;
/// Share of the rest given to the KV pool.
const AUTO_KV_FRACTION: f64 = 0.9;

/// KV blocks of `per_block_bytes` that fit in `free_bytes` after the reserve.
pub fn auto_kv_blocks(free_bytes: usize, per_block_bytes: usize) -> usize {
    let usable = free_bytes.saturating_sub(AUTO_KV_RESERVE_BYTES) as f64 * AUTO_KV_FRACTION;
    (usable / per_block_bytes.max(1) as f64) as usize
}

/// RoPE pairing as the kernels number it.
fn rope_style_code(style: RopeStyle) -> i32 {
    match style {
        RopeStyle::Interleaved => 0,
        RopeStyle::Neox => 1,
    }
}
