//! Which bf16 GEMV instantiation serves each decode-sized product. The kernel comes in
//! several shapes ([`GEMV_VARIANTS`]: output columns per block × 16-byte loads in flight per
//! lane, with or without the next tile's loads issued before the current tile is summed, x
//! staged tile by tile or all at once), and each can keep L2 asked for [`AHEAD_BYTES`] of its
//! weight row past the tile it loads (bulk prefetches: more bytes in flight than its
//! registers hold); all compute the same bits. The tensor-core GEMV (`m8s4`, …, gemv_mma.cu:
//! m16n8k16 tiles of 16 rows, a warp's or a block's, where the CUDA cores' FMAs per weight
//! would set a few-row product's pace) sums in the hardware's order instead: close, not the
//! same bits,
//! and only plain products (no gated form) of inputs in whole 32s. Which one streams a
//! matrix fastest depends on
//! the GPU and on the matrix (how many blocks fill the SMs, how long each walks K), so at
//! load the backend times every variant at every distance on the model's own matrices at 1,
//! 4 and 8 token rows, in each form a step runs them (plain, gated input, GLU output), and
//! keeps the fastest per shape and form ([`CudaBackend::tune_gemv`]); a product
//! of `n` rows uses the choice made for the smallest tuned row count ≥ `n`.
//! cuBLAS is timed on the same plain products, and takes those it multiplies clearly faster
//! than every GEMV ([`GemvChoice::prefers_cublas`]; they then run unfused).
//! `FALLOW_CUDA_DEBUG=gemv=w8u4` (a variant's name, optionally with a distance: `w8u4:2048`)
//! skips the timing and uses that everywhere; `no-tensor-gemv` times the CUDA-core variants
//! only, `no-gemv-cublas` leaves cuBLAS out.

use std::collections::{HashMap, HashSet};

use super::launch_timer::LaunchTimer;
use crate::backend::cuda::buffer::DeviceBuf;
use crate::backend::cuda::gemm::{GemvForm, GemvInput, GEMV_MAX_ROWS};
use crate::backend::cuda::weights::{DeviceMatrix, Storage};
use crate::backend::cuda::{CudaBackend, CudaError};

/// One instantiation of kernels.cu's `GEMV_BF16(W, U)`, or of gemv_mma.cu's `GEMV_MMA(W, S)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemvVariant {
    pub name: &'static str,
    /// Warps per block.
    pub warps: usize,
    /// On the tensor cores (gemv_mma.cu): a warp's tile is [`MMA_TILE_ROWS`] weight rows
    /// (on the CUDA cores a warp computes one row).
    pub tensor_cores: bool,
    /// On the tensor cores, whether the block's warps share one tile, each summing a share
    /// of K (else each warp has its own tile and walks all of K).
    pub ksplit: bool,
    /// 16-byte loads of W in flight per lane (on the tensor cores: 32-input steps, two
    /// loads each).
    pub unroll: usize,
    /// Whether the next tile's loads go out before the current tile is summed.
    pub prefetch: bool,
    /// Whether all of x is staged at once in dynamic shared memory (no barrier per tile);
    /// only for products whose x fits ([`GemvVariant::fits`]).
    pub resident: bool,
    pub plain: &'static str,
    /// The down projection activating [gate | up] rows as it stages them (none on the tensor
    /// cores).
    pub gated: Option<&'static str>,
}

/// Weight rows of a tensor-core GEMV's tile (MMA_ROWS in gemv_mma.cu): one m16n8k16 tile.
pub const MMA_TILE_ROWS: usize = 16;
/// Inputs per step of the tensor-core GEMV (MMA_STEP): K must be a multiple.
const MMA_STEP: usize = 32;

/// Shared memory a resident variant may take (GEMV_RESIDENT_BYTES in kernels.cu: of the 48 KiB
/// a block gets without opting in to more, what the kernel's static shared memory leaves).
pub const RESIDENT_BYTES: usize = 40 * 1024;

impl GemvVariant {
    /// Dynamic shared memory for `n` rows of `cols` inputs (bf16): all of x when resident.
    pub fn shared_bytes(&self, n: usize, cols: usize) -> usize {
        if self.resident {
            n * cols * 2
        } else {
            0
        }
    }

    /// Whether this variant can serve `n` rows of `cols` inputs: its shared memory holds
    /// them, and on the tensor cores `cols` is whole steps.
    pub fn fits(&self, n: usize, cols: usize) -> bool {
        self.shared_bytes(n, cols) <= RESIDENT_BYTES
            && (!self.on_tensor_cores() || cols.is_multiple_of(MMA_STEP))
    }

    /// Whether this is the tensor-core GEMV. Its sums are the hardware's, in its own order:
    /// close to the CUDA-core variants', not their bits (which all variants there share).
    pub fn on_tensor_cores(&self) -> bool {
        self.tensor_cores
    }

    /// Weight rows one block of a plain product serves.
    pub fn rows_per_block(&self) -> usize {
        match (self.tensor_cores, self.ksplit) {
            (false, _) => self.warps,
            (true, false) => self.warps * MMA_TILE_ROWS,
            (true, true) => MMA_TILE_ROWS,
        }
    }

    /// Gate rows (each with its up row) one block of a GLU-output product serves.
    pub fn pairs_per_block(&self) -> usize {
        match (self.tensor_cores, self.ksplit) {
            (true, true) => MMA_TILE_ROWS,
            _ => self.rows_per_block() / 2,
        }
    }

    /// Weight rows per warp, as resident warps hold rows: 1 on the CUDA cores.
    pub fn rows_per_warp(&self) -> usize {
        (self.rows_per_block() / self.warps).max(1)
    }

    /// The kernel: the plain product, or the down projection with the activation fused
    /// (`None` where the variant has none).
    pub fn kernel(&self, gated: bool) -> Option<&'static str> {
        if gated {
            self.gated
        } else {
            Some(self.plain)
        }
    }
}

const fn variant(
    name: &'static str,
    (warps, unroll, prefetch, resident): (usize, usize, bool, bool),
    plain: &'static str,
    gated: &'static str,
) -> GemvVariant {
    GemvVariant {
        name,
        warps,
        tensor_cores: false,
        ksplit: false,
        unroll,
        prefetch,
        resident,
        plain,
        gated: Some(gated),
    }
}

/// A tensor-core variant: `warps` per block, `steps` in flight per lane (and as many more
/// requested before they are summed), K split over the block's warps or not.
const fn mma_variant(
    name: &'static str,
    (warps, steps, ksplit): (usize, usize, bool),
    plain: &'static str,
) -> GemvVariant {
    GemvVariant {
        name,
        warps,
        tensor_cores: true,
        ksplit,
        unroll: steps,
        prefetch: true,
        resident: false,
        plain,
        gated: None,
    }
}

/// Every instantiation, as kernels.cu's `GEMV_BF16` lines make them: each shape plain, with
/// prefetching (suffix `p`), and with x resident (suffix `r`); then gemv_mma.cu's
/// (`m<warps>s<steps>`, `k` where the warps split K).
pub const GEMV_VARIANTS: [GemvVariant; 26] = [
    variant(
        "w4u4",
        (4, 4, false, false),
        "gemv_bf16_w4u4",
        "gemv_bf16_gated_w4u4",
    ),
    variant(
        "w4u8",
        (4, 8, false, false),
        "gemv_bf16_w4u8",
        "gemv_bf16_gated_w4u8",
    ),
    variant(
        "w8u4",
        (8, 4, false, false),
        "gemv_bf16_w8u4",
        "gemv_bf16_gated_w8u4",
    ),
    variant(
        "w8u8",
        (8, 8, false, false),
        "gemv_bf16_w8u8",
        "gemv_bf16_gated_w8u8",
    ),
    variant(
        "w16u4",
        (16, 4, false, false),
        "gemv_bf16_w16u4",
        "gemv_bf16_gated_w16u4",
    ),
    variant(
        "w16u8",
        (16, 8, false, false),
        "gemv_bf16_w16u8",
        "gemv_bf16_gated_w16u8",
    ),
    variant(
        "w4u4p",
        (4, 4, true, false),
        "gemv_bf16_w4u4p",
        "gemv_bf16_gated_w4u4p",
    ),
    variant(
        "w4u8p",
        (4, 8, true, false),
        "gemv_bf16_w4u8p",
        "gemv_bf16_gated_w4u8p",
    ),
    variant(
        "w8u4p",
        (8, 4, true, false),
        "gemv_bf16_w8u4p",
        "gemv_bf16_gated_w8u4p",
    ),
    variant(
        "w8u8p",
        (8, 8, true, false),
        "gemv_bf16_w8u8p",
        "gemv_bf16_gated_w8u8p",
    ),
    variant(
        "w16u4p",
        (16, 4, true, false),
        "gemv_bf16_w16u4p",
        "gemv_bf16_gated_w16u4p",
    ),
    variant(
        "w16u8p",
        (16, 8, true, false),
        "gemv_bf16_w16u8p",
        "gemv_bf16_gated_w16u8p",
    ),
    variant(
        "w4u4r",
        (4, 4, true, true),
        "gemv_bf16_w4u4r",
        "gemv_bf16_gated_w4u4r",
    ),
    variant(
        "w4u8r",
        (4, 8, true, true),
        "gemv_bf16_w4u8r",
        "gemv_bf16_gated_w4u8r",
    ),
    variant(
        "w8u4r",
        (8, 4, true, true),
        "gemv_bf16_w8u4r",
        "gemv_bf16_gated_w8u4r",
    ),
    variant(
        "w8u8r",
        (8, 8, true, true),
        "gemv_bf16_w8u8r",
        "gemv_bf16_gated_w8u8r",
    ),
    variant(
        "w16u4r",
        (16, 4, true, true),
        "gemv_bf16_w16u4r",
        "gemv_bf16_gated_w16u4r",
    ),
    variant(
        "w16u8r",
        (16, 8, true, true),
        "gemv_bf16_w16u8r",
        "gemv_bf16_gated_w16u8r",
    ),
    mma_variant("m4s2", (4, 2, false), "gemv_mma_w4s2"),
    mma_variant("m4s4", (4, 4, false), "gemv_mma_w4s4"),
    mma_variant("m8s2", (8, 2, false), "gemv_mma_w8s2"),
    mma_variant("m8s4", (8, 4, false), "gemv_mma_w8s4"),
    mma_variant("m4s2k", (4, 2, true), "gemv_mma_w4s2k"),
    mma_variant("m4s4k", (4, 4, true), "gemv_mma_w4s4k"),
    mma_variant("m8s2k", (8, 2, true), "gemv_mma_w8s2k"),
    mma_variant("m8s4k", (8, 4, true), "gemv_mma_w8s4k"),
];

/// The variant used for a shape no timing chose (8 columns per block, 4 loads per lane).
pub const DEFAULT_VARIANT: usize = 2;

/// The distances timed: bytes of each row, past the tile whose loads go out, that a GEMV
/// keeps L2 asked for (0: none). Up to a few tiles: the rows resident at once times the
/// distance must stay well within L2, or lines are evicted before they are read.
pub const AHEAD_BYTES: [u32; 3] = [0, 2048, 8192];

/// A variant and its prefetch distance: what serves one product.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemvPick {
    /// Index into [`GEMV_VARIANTS`].
    pub variant: usize,
    /// Bytes of the row past the tile being loaded kept asked of L2 (a multiple of 16).
    pub ahead: u32,
}

impl GemvPick {
    /// What serves a shape no timing chose: the default variant, no prefetching ahead.
    pub const DEFAULT: GemvPick = GemvPick {
        variant: DEFAULT_VARIANT,
        ahead: 0,
    };

    /// `w8u4`, or `w8u4:2048` with a distance.
    pub fn name(&self) -> String {
        let v = GEMV_VARIANTS[self.variant].name;
        if self.ahead == 0 {
            v.to_string()
        } else {
            format!("{v}:{}", self.ahead)
        }
    }
}

/// The token-row counts timed; a product of `n` rows uses the choice for [`bucket`]`(n)`.
pub const TUNED_ROWS: [usize; 3] = [1, 4, 8];

/// The tuned row count that stands for `n` rows.
pub fn bucket(n: usize) -> usize {
    TUNED_ROWS
        .iter()
        .copied()
        .find(|&rows| rows >= n)
        .unwrap_or(GEMV_MAX_ROWS)
}

/// The variant named `name` (`w8u4`, …).
pub fn variant_named(name: &str) -> Option<usize> {
    GEMV_VARIANTS.iter().position(|v| v.name == name)
}

/// A product's shape as the choice is keyed: `[rows, cols]` weights, the form (as
/// [`GemvForm::timed_as`] keys it) and the tuned row count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GemvShape {
    pub rows: usize,
    pub cols: usize,
    pub form: GemvForm,
    pub batch: usize,
}

/// The variant and distance per shape: timed, or one for all.
#[derive(Debug, Clone, Default)]
pub struct GemvChoice {
    forced: Option<GemvPick>,
    tuned: HashMap<GemvShape, GemvPick>,
    /// Whether timing leaves the tensor-core variants out (`no-tensor-gemv`: what
    /// they win, measured against the CUDA cores alone).
    cuda_cores_only: bool,
    /// Variants whose product disagreed with the default's on this GPU
    /// ([`super::gemv_check`]): never timed, never chosen.
    rejected: Vec<usize>,
    /// Whether timing leaves cuBLAS out (`no-gemv-cublas`: every decode-sized
    /// bf16 product a GEMV, as before cuBLAS was timed with them).
    gemv_only: bool,
    /// `[rows, cols]` matrices and tuned row counts that cuBLAS multiplies faster than any
    /// GEMV form timed ([`CUBLAS_MARGIN`]): those products go through cuBLAS, unfused.
    cublas: HashSet<(usize, usize, usize)>,
}

/// How much faster than the fastest GEMV cuBLAS must be to serve a decode-sized product: a
/// GEMV can end the sub-block or write the activation itself, and cuBLAS then needs the
/// launches it saves.
pub const CUBLAS_MARGIN: f32 = 0.9;

impl GemvChoice {
    /// One variant for every product (`<name>[:<bytes ahead>]`, [`CudaDebug::gemv`]), or,
    /// with `None` or `auto`, the timed choice.
    ///
    /// [`CudaDebug::gemv`]: crate::backend::cuda::CudaDebug::gemv
    pub fn from_setting(setting: Option<&str>) -> Result<Self, String> {
        let forced = match setting {
            None | Some("auto") | Some("") => None,
            Some(setting) => Some(parse_pick(setting)?),
        };
        Ok(GemvChoice {
            forced,
            ..GemvChoice::default()
        })
    }

    /// Has the timing choose among the tensor-core variants too, or (false) among the
    /// CUDA-core ones only (`no-tensor-gemv`).
    pub fn with_tensor_cores(mut self, timed: bool) -> Self {
        self.cuda_cores_only = !timed;
        self
    }

    /// Times cuBLAS against the GEMVs, or (false) leaves it out (`no-gemv-cublas`).
    pub fn with_cublas(mut self, timed: bool) -> Self {
        self.gemv_only = !timed;
        self
    }

    /// Whether cuBLAS is timed against the GEMVs.
    pub fn times_cublas(&self) -> bool {
        !self.gemv_only && self.is_timed()
    }

    /// Whether `n` rows through `[rows, cols]` weights go through cuBLAS rather than a
    /// GEMV: where timing found it faster for [`bucket`]`(n)` rows (or a test said so).
    pub fn prefers_cublas(&self, rows: usize, cols: usize, n: usize) -> bool {
        self.cublas.contains(&(rows, cols, bucket(n)))
    }

    /// Records that cuBLAS serves `[rows, cols]` at `batch` tuned rows ([`TUNED_ROWS`]).
    pub fn record_cublas(&mut self, rows: usize, cols: usize, batch: usize) {
        self.cublas.insert((rows, cols, batch));
    }

    /// The variants at every distance timing chooses among, in the order they are timed.
    pub fn candidates(&self) -> Vec<GemvPick> {
        candidates()
            .into_iter()
            .filter(|p| !(self.cuda_cores_only && GEMV_VARIANTS[p.variant].on_tensor_cores()))
            .filter(|p| !self.rejected.contains(&p.variant))
            .collect()
    }

    /// Leaves `variants` out of the timing (they computed the product wrongly here).
    pub fn reject(&mut self, variants: &[usize]) {
        self.rejected.extend_from_slice(variants);
    }

    /// The names of the variants left out because they computed the product wrongly here.
    pub fn rejected(&self) -> Vec<&'static str> {
        self.rejected
            .iter()
            .map(|&v| GEMV_VARIANTS[v].name)
            .collect()
    }

    /// Whether the choice is left to timing.
    pub fn is_timed(&self) -> bool {
        self.forced.is_none()
    }

    /// The variant and distance for `n` rows through `[rows, cols]` weights in `form`.
    pub fn pick(&self, rows: usize, cols: usize, form: GemvForm, n: usize) -> GemvPick {
        if let Some(p) = self.forced {
            return p;
        }
        let shape = GemvShape {
            rows,
            cols,
            form: form.timed_as(),
            batch: bucket(n),
        };
        self.tuned.get(&shape).copied().unwrap_or(GemvPick::DEFAULT)
    }

    pub fn record(&mut self, shape: GemvShape, pick: GemvPick) {
        let shape = GemvShape {
            form: shape.form.timed_as(),
            ..shape
        };
        self.tuned.insert(shape, pick);
    }
}

/// `w8u4` or `w8u4:2048` (bytes ahead, a multiple of 16).
pub fn parse_pick(setting: &str) -> Result<GemvPick, String> {
    let (name, ahead) = match setting.split_once(':') {
        Some((name, ahead)) => (name, Some(ahead)),
        None => (setting, None),
    };
    let variant = variant_named(name).ok_or_else(|| {
        let names: Vec<&str> = GEMV_VARIANTS.iter().map(|v| v.name).collect();
        format!(
            "gemv={setting}: not a GEMV variant (auto or one of {}, optionally \
             followed by :<bytes ahead>)",
            names.join(", ")
        )
    })?;
    let ahead = match ahead {
        None => 0,
        Some(a) => a
            .parse::<u32>()
            .ok()
            .filter(|b| b % 16 == 0)
            .ok_or_else(|| format!("gemv={setting}: bytes ahead must be a multiple of 16"))?,
    };
    Ok(GemvPick { variant, ahead })
}

/// Every variant at every distance, in the order they are timed.
pub fn candidates() -> Vec<GemvPick> {
    (0..GEMV_VARIANTS.len())
        .flat_map(|variant| AHEAD_BYTES.map(|ahead| GemvPick { variant, ahead }))
        .collect()
}

/// The index of the smallest time (NaN never), `None` when none is a number.
pub fn fastest(times: &[f32]) -> Option<usize> {
    times
        .iter()
        .enumerate()
        .filter(|(_, t)| t.is_finite())
        .min_by(|a, b| a.1.total_cmp(b.1))
        .map(|(i, _)| i)
}

/// Whether cuBLAS, taking `cublas` ms, serves a product whose fastest GEMV takes `gemv`
/// ([`CUBLAS_MARGIN`]; NaN never wins).
pub fn cublas_wins(cublas: f32, gemv: f32) -> bool {
    cublas < CUBLAS_MARGIN * gemv
}

impl CudaBackend {
    /// Checks every GEMV variant's product here ([`super::gemv_check`]), then times those
    /// that agree at every distance on this model's bf16 matrices, in each form a decode
    /// step runs them (QKV, output, gate/up plain and writing the activation, the down
    /// projection gated and plain, the LM head) at each of [`TUNED_ROWS`] and keeps the
    /// fastest per shape and form. Inputs are zeros: the time depends on
    /// shapes, not values. cuBLAS is timed on each plain shape too, and serves those it
    /// multiplies clearly faster than every GEMV ([`cublas_wins`]). By estimate a second or
    /// so at load for an 8B model (some 1600 timings); nothing when a variant is forced.
    pub(in crate::backend::cuda) fn tune_gemv(&mut self) -> Result<(), CudaError> {
        if !self.gemm.gemv_choice.is_timed() {
            return Ok(());
        }
        let layers = &self.weights.layers;
        let gate_up: Vec<&DeviceMatrix> = layers.iter().filter_map(|l| l.ffn.gate_up()).collect();
        let down: Vec<&DeviceMatrix> = layers.iter().filter_map(|l| l.ffn.down()).collect();
        let mut products: Vec<(&str, GemvForm, Vec<&DeviceMatrix>)> = vec![
            (
                "qkv",
                GemvForm::Plain,
                layers.iter().map(|l| &l.wqkv).collect(),
            ),
            ("o", GemvForm::Plain, layers.iter().map(|l| &l.wo).collect()),
            ("gate_up", GemvForm::Plain, gate_up.clone()),
            // Writing act(gate)·up (forward.rs's fused GLU): blocks of paired gate and up
            // rows, half as many of them (a tensor-core `k` block takes 16 pairs), so timed
            // as such.
            ("gate_up+act", GemvForm::GluOutput(0), gate_up),
            ("down+act", GemvForm::GatedInput(0), down.clone()),
            // Of the activation the gate/up GEMV wrote.
            ("down", GemvForm::Plain, down),
        ];
        products.push(("lm_head", GemvForm::Plain, vec![self.weights.lm_head()]));
        products.retain(|(_, _, ms)| {
            ms.first()
                .is_some_and(|m| matches!(m.storage, Storage::Bf16(_)) && m.cols.is_multiple_of(8))
        });
        // Only variants that compute the product here are timed: checked on the smallest
        // plain product's matrix, and writing the activation through the gate/up matrix.
        let first = |wanted: GemvForm| {
            products
                .iter()
                .filter(|(_, form, _)| *form == wanted)
                .filter_map(|(_, _, ms)| ms.first().copied())
                .min_by_key(|m| m.rows * m.cols)
        };
        if let Some(m) = first(GemvForm::Plain) {
            let wrong = self.gemv_variants_that_disagree(m, first(GemvForm::GluOutput(0)))?;
            for &v in &wrong {
                tracing::warn!(
                    variant = GEMV_VARIANTS[v].name,
                    "a GEMV variant's product disagrees with the default variant's on this GPU; \
                     it is never chosen"
                );
            }
            self.gemm.gemv_choice.reject(&wrong);
        }
        let widest = products
            .iter()
            .filter_map(|(_, _, ms)| ms.first())
            .fold((0, 0), |(r, c), m| (r.max(m.rows), c.max(m.cols)));
        let n_max = GEMV_MAX_ROWS;
        let x = DeviceBuf::<u16>::zeros(&self.stream, n_max * widest.1)?;
        let gate_up_rows = DeviceBuf::<f32>::zeros(&self.stream, n_max * 2 * widest.1)?;
        let out = DeviceBuf::<f32>::zeros(&self.stream, n_max * widest.0)?;
        let timer = LaunchTimer::new(&self.ctx, &self.stream, self.timing_policy())?;
        let time = |launch: &dyn Fn(usize) -> Result<(), CudaError>| timer.mean_ms(launch);
        let mut choices = Vec::new();
        // Per [rows, cols] and row count: the fastest GEMV that could stand in for cuBLAS
        // (plain or writing the activation), and cuBLAS's time.
        let mut fastest_gemv: HashMap<(usize, usize, usize), f32> = HashMap::new();
        let mut cublas: HashMap<(usize, usize, usize), f32> = HashMap::new();
        for (what, form, matrices) in &products {
            let (rows, cols, form) = (matrices[0].rows, matrices[0].cols, *form);
            let gated = form.gated_input();
            let input = if gated { gate_up_rows.ptr() } else { x.ptr() };
            let weights = |i: usize| matrices[i % matrices.len()].bf16_ptr().unwrap_or(0);
            for batch in TUNED_ROWS {
                let key = (rows, cols, batch);
                if form == GemvForm::Plain
                    && self.gemm.gemv_choice.times_cublas()
                    && !cublas.contains_key(&key)
                {
                    let launch = |i: usize| {
                        self.gemm
                            .cublas(weights(i), rows, cols, input, batch, out.ptr())
                    };
                    cublas.insert(key, time(&launch)?);
                }
                let picks = self.gemm.gemv_choice.candidates();
                let mut times = Vec::with_capacity(picks.len());
                for pick in &picks {
                    let variant = &GEMV_VARIANTS[pick.variant];
                    if !self.gemm.gemv_usable(variant, batch, cols, gated) {
                        times.push(f32::NAN); // never chosen
                        continue;
                    }
                    let launch = |i: usize| {
                        let (pick, out) = (*pick, out.ptr());
                        self.gemm.gemv_bf16(
                            pick,
                            weights(i),
                            rows,
                            cols,
                            GemvInput::plain(input),
                            batch,
                            out,
                            form,
                            None,
                        )
                    };
                    times.push(time(&launch)?);
                }
                let Some(best) = fastest(&times) else {
                    continue;
                };
                let shape = GemvShape {
                    rows,
                    cols,
                    form,
                    batch,
                };
                self.gemm.gemv_choice.record(shape, picks[best]);
                if !gated {
                    let t = fastest_gemv.entry(key).or_insert(f32::INFINITY);
                    *t = t.min(times[best]);
                }
                let micros = times[best] * 1e3;
                let bytes = (rows * cols * 2) as f64;
                let default = picks.iter().position(|p| *p == GemvPick::DEFAULT);
                let cublas = cublas
                    .get(&key)
                    .map_or(String::new(), |t| format!("; cuBLAS {:.1} µs", t * 1e3));
                choices.push(format!(
                    "{what} {rows}x{cols} n={batch}: {} {micros:.1} µs ({:.0} GB/s; default {:.1} µs{cublas})",
                    picks[best].name(),
                    bytes / f64::from(times[best]) / 1e6,
                    default.map_or(f32::NAN, |d| times[d] * 1e3),
                ));
            }
        }
        // cuBLAS serves the products it multiplies clearly faster than every GEMV.
        let mut to_cublas: Vec<_> = cublas
            .iter()
            .filter(|(key, &t)| fastest_gemv.get(*key).is_some_and(|&g| cublas_wins(t, g)))
            .map(|(&key, _)| key)
            .collect();
        to_cublas.sort_unstable();
        for &(rows, cols, batch) in &to_cublas {
            self.gemm.gemv_choice.record_cublas(rows, cols, batch);
        }
        if !to_cublas.is_empty() {
            tracing::info!(
                products = ?to_cublas,
                "decode-sized bf16 products ([rows, cols, tuned rows]) that cuBLAS multiplies faster than a GEMV"
            );
        }
        tracing::info!(choices = ?choices, "bf16 GEMV variants timed on this GPU");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::kernels::NAMES;

    #[test]
    fn every_variant_is_a_compiled_kernel_pair_with_a_unique_name() {
        for v in GEMV_VARIANTS {
            assert!(NAMES.contains(&v.plain), "{} missing from NAMES", v.plain);
            if let Some(gated) = v.gated {
                assert!(NAMES.contains(&gated), "{gated} missing from NAMES");
            }
            if v.on_tensor_cores() {
                let k = if v.ksplit { "k" } else { "" };
                assert_eq!(v.name, format!("m{}s{}{k}", v.warps, v.unroll));
                assert_eq!(v.plain, format!("gemv_mma_w{}s{}{k}", v.warps, v.unroll));
                assert_eq!(v.gated, None, "no gated form on the tensor cores");
            } else {
                let suffix = match (v.prefetch, v.resident) {
                    (_, true) => "r",
                    (true, false) => "p",
                    (false, false) => "",
                };
                let name = format!("w{}u{}{suffix}", v.warps, v.unroll);
                assert_eq!(v.name, name);
                assert_eq!(v.plain, format!("gemv_bf16_{name}"));
                assert_eq!(v.gated, Some(format!("gemv_bf16_gated_{name}").as_str()));
            }
            assert_eq!(variant_named(v.name).map(|i| GEMV_VARIANTS[i]), Some(v));
        }
        // A GLU pair's block splits its warps in two halves.
        assert!(GEMV_VARIANTS.iter().all(|v| v.warps % 2 == 0));
        assert_eq!(GEMV_VARIANTS[DEFAULT_VARIANT].name, "w8u4");
    }

    #[test]
    fn a_resident_variant_serves_only_products_whose_x_fits_in_shared_memory() {
        let resident = GEMV_VARIANTS[variant_named("w8u4r").expect("listed")];
        let tiled = GEMV_VARIANTS[variant_named("w8u4p").expect("listed")];
        // One row of Llama-3 8B's down projection (14336 inputs): 28 KiB.
        assert!(resident.fits(1, 14336));
        assert_eq!(resident.shared_bytes(1, 14336), 28_672);
        // Four rows of it (112 KiB) do not; eight of a 4096-wide input (64 KiB) neither.
        assert!(!resident.fits(4, 14336));
        assert!(!resident.fits(8, 4096));
        assert!(resident.fits(4, 4096));
        assert!(tiled.fits(8, 14336) && tiled.shared_bytes(8, 14336) == 0);
    }

    #[test]
    fn a_tensor_core_variant_serves_plain_products_of_inputs_in_whole_steps() {
        let mma = GEMV_VARIANTS[variant_named("m8s4").expect("listed")];
        assert!(mma.on_tensor_cores());
        assert!(mma.fits(8, 14336) && mma.fits(1, 576) && mma.fits(8, 4096));
        assert!(!mma.fits(1, 264), "264 inputs are not whole 32-input steps");
        assert_eq!(mma.kernel(false), Some("gemv_mma_w8s4"));
        assert_eq!(mma.kernel(true), None);
        let cuda_cores = GEMV_VARIANTS[DEFAULT_VARIANT];
        assert!(!cuda_cores.on_tensor_cores() && cuda_cores.fits(1, 264));
    }

    #[test]
    fn the_tensor_core_kernel_is_built_for_the_tile_and_step_planned_here() {
        use crate::backend::cuda::kernels::source_defines;
        for (name, value) in [("MMA_ROWS", MMA_TILE_ROWS), ("MMA_STEP", MMA_STEP)] {
            assert_eq!(
                source_defines(name),
                [value.to_string()],
                "{name} in gemv_mma.cu"
            );
        }
    }

    #[test]
    fn blocks_serve_a_warp_per_row_a_tile_per_warp_or_one_tile_split_over_k() {
        let rows = |name| {
            let v = GEMV_VARIANTS[variant_named(name).expect("listed")];
            (v.rows_per_block(), v.pairs_per_block(), v.rows_per_warp())
        };
        assert_eq!(rows("w8u4"), (8, 4, 1));
        assert_eq!(rows("m8s4"), (128, 64, 16));
        // Llama-3 8B's output projection: 256 blocks of 8 warps instead of 32.
        assert_eq!(rows("m8s4k"), (16, 16, 2));
        assert_eq!(rows("m4s2k"), (16, 16, 4));
    }

    #[test]
    fn a_product_uses_the_choice_timed_for_the_smallest_row_count_that_covers_it() {
        assert_eq!(
            (1..=8).map(bucket).collect::<Vec<_>>(),
            [1, 4, 4, 4, 8, 8, 8, 8]
        );
        let mut choice = GemvChoice::default();
        let shape = |batch| GemvShape {
            rows: 6144,
            cols: 4096,
            form: GemvForm::Plain,
            batch,
        };
        let pick = |variant, ahead| GemvPick { variant, ahead };
        choice.record(shape(1), pick(5, 2048));
        choice.record(shape(4), pick(1, 0));
        assert_eq!(choice.pick(6144, 4096, GemvForm::Plain, 1), pick(5, 2048));
        assert_eq!(choice.pick(6144, 4096, GemvForm::Plain, 3), pick(1, 0));
        assert_eq!(
            choice.pick(6144, 4096, GemvForm::Plain, 8),
            GemvPick::DEFAULT,
            "untimed"
        );
        assert_eq!(
            choice.pick(6144, 4096, GemvForm::GatedInput(0), 1),
            GemvPick::DEFAULT,
            "the gated kernel is timed apart"
        );
        // A GLU-output block pairs rows: timed apart from the plain product, for either
        // activation.
        choice.record(
            GemvShape {
                form: GemvForm::GluOutput(1),
                ..shape(1)
            },
            pick(20, 0),
        );
        assert_eq!(
            choice.pick(6144, 4096, GemvForm::GluOutput(0), 1),
            pick(20, 0)
        );
        assert_eq!(
            choice.pick(6144, 4096, GemvForm::GluOutput(1), 1),
            pick(20, 0)
        );
        assert_eq!(choice.pick(6144, 4096, GemvForm::Plain, 1), pick(5, 2048));
        let forced = GemvChoice::from_setting(Some(GEMV_VARIANTS[3].name)).expect("a variant");
        assert_eq!(forced.pick(6144, 4096, GemvForm::Plain, 1), pick(3, 0));
        assert!(!forced.is_timed());
    }

    #[test]
    fn the_setting_names_a_variant_or_leaves_it_to_timing() {
        assert!(GemvChoice::from_setting(None).is_ok_and(|c| c.is_timed()));
        assert!(GemvChoice::from_setting(Some("auto")).is_ok_and(|c| c.is_timed()));
        let c = GemvChoice::from_setting(Some("w16u8")).expect("a variant");
        assert_eq!(c.pick(1, 8, GemvForm::Plain, 1).variant, 5);
        let c = GemvChoice::from_setting(Some("w16u8:2048")).expect("a variant and distance");
        assert_eq!(
            c.pick(1, 8, GemvForm::Plain, 1),
            GemvPick {
                variant: 5,
                ahead: 2048
            }
        );
        assert_eq!(c.pick(1, 8, GemvForm::Plain, 1).name(), "w16u8:2048");
        let err = GemvChoice::from_setting(Some("w3u3")).expect_err("no such variant");
        assert!(err.contains("w8u4"), "{err}");
        let err = GemvChoice::from_setting(Some("w8u4:100")).expect_err("not whole pieces");
        assert!(err.contains("multiple of 16"), "{err}");
    }

    #[test]
    fn every_variant_is_timed_at_every_distance_and_the_default_among_them() {
        let picks = candidates();
        assert_eq!(picks.len(), GEMV_VARIANTS.len() * AHEAD_BYTES.len());
        assert!(picks.contains(&GemvPick::DEFAULT));
        assert!(AHEAD_BYTES.iter().all(|a| a % 16 == 0));
        let timed = GemvChoice::from_setting(None).expect("auto");
        assert_eq!(timed.candidates(), picks);
        let cuda_cores = timed.with_tensor_cores(false).candidates();
        assert!(cuda_cores.contains(&GemvPick::DEFAULT));
        assert!(cuda_cores
            .iter()
            .all(|p| !GEMV_VARIANTS[p.variant].on_tensor_cores()));
        assert!(cuda_cores.len() < picks.len());
        let with = GemvChoice::from_setting(None).expect("auto");
        assert_eq!(with.with_tensor_cores(true).candidates(), picks);
        // A variant whose product was wrong here is never timed.
        let mut checked = GemvChoice::from_setting(None).expect("auto");
        let wrong = variant_named("m8s4").expect("listed");
        checked.reject(&[wrong]);
        assert!(checked.candidates().iter().all(|p| p.variant != wrong));
        assert_eq!(checked.candidates().len(), picks.len() - AHEAD_BYTES.len());
        assert_eq!(checked.rejected(), ["m8s4"]);
    }

    #[test]
    fn cublas_serves_a_product_only_where_it_is_clearly_faster_than_every_gemv() {
        assert!(cublas_wins(8.0, 10.0));
        assert!(
            !cublas_wins(9.5, 10.0),
            "within the margin: the GEMV and its fusions"
        );
        assert!(!cublas_wins(12.0, 10.0));
        assert!(!cublas_wins(f32::NAN, 10.0) && !cublas_wins(8.0, f32::NAN));
        let mut choice = GemvChoice::from_setting(None).expect("auto");
        assert!(choice.times_cublas());
        choice.record_cublas(4096, 4096, 8);
        // Recorded for 8 tuned rows: 5 to 8 rows go through cuBLAS, 1 to 4 not.
        assert!((5..=8).all(|n| choice.prefers_cublas(4096, 4096, n)));
        assert!((1..=4).all(|n| !choice.prefers_cublas(4096, 4096, n)));
        assert!(!choice.prefers_cublas(4096, 14336, 8), "another shape");
        let gemv_only = GemvChoice::from_setting(None)
            .expect("auto")
            .with_cublas(false);
        assert!(!gemv_only.times_cublas());
        let forced = GemvChoice::from_setting(Some("w8u4")).expect("a variant");
        assert!(!forced.times_cublas(), "a forced variant times nothing");
    }

    #[test]
    fn the_fastest_time_wins_and_nan_never_does() {
        assert_eq!(fastest(&[3.0, 1.5, 2.0]), Some(1));
        assert_eq!(fastest(&[f32::NAN, 2.0, 4.0]), Some(1));
        assert_eq!(fastest(&[f32::NAN]), None);
        assert_eq!(fastest(&[]), None);
    }
}
