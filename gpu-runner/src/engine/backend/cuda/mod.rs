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
pub mod device;
/// The kernels, and a whole CUDA driver, emulated on the CPU: for tests only (the
/// `emulator` feature, which the crate's own tests turn on).
#[cfg(any(test, feature = "emulator"))]
pub mod emulator;
mod forward;
mod gemm;
mod gemv_check;
mod gemv_tune;
mod graphs;
#[cfg(test)]
mod kernel_tests;
pub mod kernels;
mod l2_prefetch;
mod launch;
mod launch_timer;
mod mmq;
mod mmq_check;
mod mmq_tune;
mod prefill;
mod profile;
mod step;
mod step_clock;
mod weights;

use std::sync::Arc;

use cudarc::driver::sys::{CUdevice_attribute, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaContext, CudaStream, DriverError};

pub use device::DeviceInfo;
pub use mmq::{MmqShape, MmqTiming};
pub use weights::{device_block_format, CudaWeights, QuantX};

use self::buffer::DeviceBuf;
use self::gemm::Gemm;
use self::gemv_tune::GemvChoice;
use self::graphs::{DecodeGraphs, GraphKey, Replay};
use self::kernels::Kernels;
use self::l2_prefetch::L2Prefetch;
use self::launch::Launcher;
use self::mmq::MmqChoice;
pub use self::prefill::PrefillKernel;
use self::profile::Profiler;
use self::step::{Padding, Scratch, StepInputs};
use self::step_clock::{step_shape, StepClock};
use self::weights::DeviceWeights;
use super::batch::BatchLayout;
use super::cpu::kv_bytes_per_block;
use super::cpu::rope::inv_freqs;
use super::{Backend, BackendError, NoMasks, SeqSlice, StepMasks, StepOutput};
use crate::engine::footprint::KvPoolSize;
use crate::engine::model::{ModelArtifacts, ModelConfig, RopeScaling, RopeStyle};

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
    split_attention: bool,
    /// The fewest keys a split attention block gets (`FALLOW_CUDA_SPLIT_MIN_KEYS`).
    split_min_keys: usize,
    /// Whether a one-token decode step's output and down GEMVs end their sub-block in their
    /// last block (residual add and the next norm, [`gemm::NormAfter`]) instead of an
    /// `add_rms_norm` launch.
    fused_norm: bool,
    /// Whether a step of decode tokens only leaves qkv_prepare's work to its attention
    /// blocks (each prepares its own heads) instead of launching it.
    fused_rope: bool,
    /// Whether a decode step's gate/up GEMV writes the gated activation itself (its blocks
    /// pair gate and up rows) for a plain down GEMV, instead of the down GEMV activating the
    /// [gate | up] rows as it stages them.
    fused_glu: bool,
    /// Whether decode steps' output and down GEMVs split their sub-block's end with the
    /// next product where the model has no post-norms ([`gemm::NormAfter::inv`]): no
    /// `add_rms_norm` launch and no block walking whole rows, at bf16 rounding of the
    /// unsplit end (off by default until a GPU measures it; `FALLOW_CUDA_SPLIT_NORM=1`).
    split_norm: bool,
    prefill: PrefillKernel,
    layout: BatchLayout,
    inputs: StepInputs,
    scratch: Scratch,
    /// The step's grammar masks on their way to `scratch.masks`.
    host_masks: Vec<u32>,
    graphs: DecodeGraphs,
    profiler: Profiler,
    /// GPU vs host time per step shape, with graphs on (`FALLOW_CUDA_STEP_CLOCK=1`).
    step_clock: StepClock,
}

impl CudaBackend {
    /// Uploads `artifacts` to device `ordinal` with a bf16 KV pool of `pool` blocks of
    /// `block_size` tokens; [`KvPoolSize::UpTo`] takes fewer if the memory left free after the
    /// weights holds fewer ([`auto_kv_blocks`]).
    pub fn new(
        artifacts: &ModelArtifacts,
        ordinal: usize,
        pool: KvPoolSize,
        block_size: usize,
        weight_storage: CudaWeights,
    ) -> Result<Self, CudaError> {
        let config = artifacts.config.clone();
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
        let kernels = Kernels::for_device(&ctx).map_err(CudaError::Failure)?;
        let (cc_major, _) = ctx.compute_capability().map_err(CudaError::driver)?;
        let profiler = Profiler::from_env();
        let launcher = Launcher::new(kernels, Arc::clone(&stream), cc_major);
        if profiler.enabled() {
            // A profile times each launch on its own: overlapping ones would blur it.
            launcher.set_early_start(false);
        }
        let attribute = |a| ctx.attribute(a).map_err(CudaError::driver);
        let sm_count = attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?
            .max(1) as usize;
        let mut gemm = Gemm::new(&stream, launcher.clone())?;
        gemm.l2_prefetch = L2Prefetch::new(
            attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?.max(0) as usize,
            sm_count,
            attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)?
                .max(0) as usize,
            std::env::var("FALLOW_CUDA_L2_PREFETCH").ok().as_deref(),
        );
        gemm.mmq_blocks = mmq::MMQ_BLOCKS_PER_SM * sm_count;
        gemm.gemv_choice = gemv_choice(std::env::var("FALLOW_CUDA_GEMV").ok().as_deref())?;
        gemm.quant_x = QuantX::from_setting(std::env::var("FALLOW_CUDA_QUANT_X").ok().as_deref())
            .map_err(CudaError::Failure)?;
        gemm.mmq_choice = MmqChoice::from_setting(std::env::var("FALLOW_CUDA_MMQ").ok().as_deref())
            .map_err(CudaError::Failure)?;
        let split_min_keys = attention_split::min_partition_from_setting(
            std::env::var("FALLOW_CUDA_SPLIT_MIN_KEYS").ok().as_deref(),
        )
        .map_err(CudaError::Failure)?;
        let prefill = PrefillKernel::choose(
            config.head_dim,
            std::env::var("FALLOW_CUDA_PREFILL").ok().as_deref(),
        )
        .map_err(CudaError::Failure)?;
        let weights = DeviceWeights::upload(&stream, &config, &artifacts.weights, weight_storage)?;
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
            split_attention: true,
            split_min_keys,
            fused_norm: std::env::var("FALLOW_CUDA_FUSED_NORM").as_deref() != Ok("0"),
            fused_rope: std::env::var("FALLOW_CUDA_FUSED_ROPE").as_deref() != Ok("0"),
            fused_glu: std::env::var("FALLOW_CUDA_FUSED_GLU").as_deref() != Ok("0"),
            split_norm: std::env::var("FALLOW_CUDA_SPLIT_NORM").as_deref() == Ok("1"),
            prefill,
            layout: BatchLayout::default(),
            inputs: StepInputs::default(),
            scratch: Scratch::default(),
            host_masks: Vec::new(),
            // A profile times each launch: graphs would hide them.
            graphs: DecodeGraphs::new(
                std::env::var("FALLOW_CUDA_GRAPHS").as_deref() != Ok("0") && !profiler.enabled(),
            ),
            profiler,
            step_clock: StepClock::from_env(),
            stream,
        };
        backend.tune_gemv()?;
        backend.set_quant_x(backend.gemm.quant_x)?;
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

    /// Caps the token count up to which matrix products use our GEMV kernel instead of
    /// cuBLAS (0 = always cuBLAS; tests compare the two).
    pub fn set_gemv_max_rows(&mut self, rows: usize) {
        self.gemm.set_gemv_max_rows(rows);
        self.graphs.clear();
    }

    /// How the quantized matrices' products of up to 64 token rows read x ([`QuantX`];
    /// `FALLOW_CUDA_QUANT_X` sets it for a process): int8 x first checks the formats' tensor-core
    /// products on this GPU ([`mmq_check`]), then times them against the expansion for
    /// cuBLAS ([`mmq_tune`]), once per backend.
    pub fn set_quant_x(&mut self, x: QuantX) -> Result<(), CudaError> {
        self.gemm.quant_x = x;
        self.graphs.clear();
        if x == QuantX::Int8 {
            self.check_mmq()?;
            self.tune_mmq()?;
        }
        Ok(())
    }

    /// Which products with x as int8 the int8 tensor-core products serve: `setting` as
    /// `FALLOW_CUDA_MMQ` (`1` every one their format's check allows, `0` none, `auto` those
    /// timed faster than the expansion: timed again now where x is read as int8).
    pub fn set_mmq(&mut self, setting: &str) -> Result<(), CudaError> {
        self.gemm
            .mmq_choice
            .set_setting(Some(setting))
            .map_err(CudaError::Failure)?;
        self.set_quant_x(self.gemm.quant_x)
    }

    /// Turns CUDA graphs for decode steps on or off (on by default; `FALLOW_CUDA_GRAPHS=0`
    /// turns them off for a process).
    pub fn set_cuda_graphs(&mut self, enabled: bool) {
        self.graphs.set_enabled(enabled);
    }

    /// How many decode-step graphs this backend has captured (a capture that fails leaves
    /// its steps eager, silently but for a warning: tests check that graphs were replayed).
    pub fn graphs_captured(&self) -> usize {
        self.graphs.captured()
    }

    /// Uses bf16 GEMV variant `name` (`w8u4`, …; see [`gemv_tune`]) for every decode-sized
    /// product instead of the ones timed at load (tests compare them); `auto` times them
    /// again now, as at load.
    pub fn set_gemv_variant(&mut self, name: &str) -> Result<(), CudaError> {
        self.gemm.gemv_choice = gemv_choice(Some(name))?;
        self.graphs.clear();
        self.tune_gemv()
    }

    /// Has cuBLAS serve every decode-sized product through `product`'s matrices (`qkv`, `o`,
    /// `gate_up`, `down`, `lm_head`; where bf16), as timing does for products cuBLAS
    /// multiplies faster than a GEMV ([`gemv_tune`]): the step then runs them unfused. Tests
    /// compare the two.
    pub fn decode_through_cublas(&mut self, product: &str) -> Result<(), CudaError> {
        let layer = self.weights.layers.first();
        let w = match product {
            "qkv" => layer.map(|l| &l.wqkv),
            "o" => layer.map(|l| &l.wo),
            "gate_up" => layer.map(|l| &l.w_gate_up),
            "down" => layer.map(|l| &l.w_down),
            "lm_head" => Some(self.weights.lm_head()),
            _ => None,
        }
        .ok_or_else(|| CudaError::Failure(format!("no product {product:?}")))?;
        for batch in gemv_tune::TUNED_ROWS {
            self.gemm.gemv_choice.record_cublas(w.rows, w.cols, batch);
        }
        self.graphs.clear();
        Ok(())
    }

    /// The bf16 GEMV variants left out at load because their product disagreed with the
    /// default variant's on this GPU ([`gemv_check`]); empty where every kernel computes
    /// what it should (the GPU conformance suite asserts so).
    pub fn gemv_variants_rejected(&self) -> Vec<&'static str> {
        self.gemm.gemv_choice.rejected()
    }

    /// Turns early starts (programmatic dependent launch, [`launch`]) on or off: on by
    /// default from sm_90, where `FALLOW_CUDA_EARLY_START=0` turns them off for a process;
    /// never on before sm_90. Tests compare the two.
    pub fn set_early_start(&mut self, enabled: bool) {
        self.launcher.set_early_start(enabled);
        self.graphs.clear();
    }

    /// Whether launches start early ([`CudaBackend::set_early_start`]).
    pub fn early_start(&self) -> bool {
        self.launcher.early_start()
    }

    /// Turns split-K attention on or off (on by default; tests compare the two).
    pub fn set_split_attention(&mut self, enabled: bool) {
        self.split_attention = enabled;
        self.graphs.clear();
    }

    /// Ends one-token decode steps' sub-blocks in their GEMVs' last blocks where such a
    /// block ends a row as fast as the launch it saves (`FUSED_NORM_ROW_BATCH` in
    /// forward.rs), or (off) with `add_rms_norm` launches: the same bits either way (on by default;
    /// `FALLOW_CUDA_FUSED_NORM=0` for a process; tests compare the two).
    pub fn set_fused_norm(&mut self, enabled: bool) {
        self.fused_norm = enabled;
        self.graphs.clear();
    }

    /// Prepares decode-only steps' heads (bias, q/k norm, RoPE, the KV store) in their
    /// attention blocks, or (off) with `qkv_prepare` launches: the same bits either way (on
    /// by default; `FALLOW_CUDA_FUSED_ROPE=0` for a process; tests compare the two).
    pub fn set_fused_rope(&mut self, enabled: bool) {
        self.fused_rope = enabled;
        self.graphs.clear();
    }

    /// Has decode steps' gate/up GEMV write the gated activation from paired gate and up
    /// rows, or (off) the down GEMV activate the [gate | up] rows as it stages them: the
    /// same bits either way (on by default; `FALLOW_CUDA_FUSED_GLU=0` for a process; tests
    /// compare the two).
    pub fn set_fused_glu(&mut self, enabled: bool) {
        self.fused_glu = enabled;
        self.graphs.clear();
    }

    /// Splits decode steps' sub-block ends between the product that ends a sub-block and
    /// the next one, where the model has no post-norms: the first adds its rows to the
    /// residual stream and writes them times the next norm's weight, its last block each
    /// row's 1/rms, and the next product scales its sums by it; or (off, the default) ends
    /// them as [`CudaBackend::set_fused_norm`] says. Within bf16 rounding of each other,
    /// not the same bits (`FALLOW_CUDA_SPLIT_NORM=1` for a process; tests compare the two).
    pub fn set_split_norm(&mut self, enabled: bool) {
        self.split_norm = enabled;
        self.graphs.clear();
    }

    /// Serves prompt-run attention with `kernel` (by default the tensor cores where the
    /// head size fits them; `FALLOW_CUDA_PREFILL=auto|mma|f32` for a process). Tests compare
    /// the two.
    pub fn set_prefill_kernel(&mut self, kernel: PrefillKernel) -> Result<(), CudaError> {
        self.prefill = kernel
            .check(self.config.head_dim)
            .map_err(CudaError::Failure)?;
        Ok(())
    }

    /// The kernel prompt-run attention uses ([`CudaBackend::set_prefill_kernel`]).
    pub fn prefill_kernel(&self) -> PrefillKernel {
        self.prefill
    }

    fn run(
        &mut self,
        batch: &[SeqSlice<'_>],
        masks: &mut dyn StepMasks,
    ) -> Result<StepOutput, CudaError> {
        self.ctx.bind_to_thread().map_err(CudaError::driver)?;
        let key = self.graphs.key_for(batch, self.block_size);
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

/// The GEMV choice `setting` asks for (`FALLOW_CUDA_GEMV`: a variant, or timing), with what
/// timing may choose among as this process's settings say (`FALLOW_CUDA_TENSOR_GEMV`,
/// `FALLOW_CUDA_GEMV_CUBLAS`).
fn gemv_choice(setting: Option<&str>) -> Result<GemvChoice, CudaError> {
    let setting_of = |name| std::env::var(name).ok();
    Ok(GemvChoice::from_setting(setting)
        .map_err(CudaError::Failure)?
        .with_tensor_cores(setting_of("FALLOW_CUDA_TENSOR_GEMV").as_deref())
        .with_cublas(setting_of("FALLOW_CUDA_GEMV_CUBLAS").as_deref()))
}
