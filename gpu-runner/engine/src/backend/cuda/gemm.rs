//! Dense matrix products: bf16 weights and activations in, f32 accumulate and f32 out (the
//! residual stream and everything normalised after a GEMM stay f32). Decode-sized products
//! (a few token rows) run our own GEMV kernel, which streams each weight once at close to
//! the memory bandwidth (in the instantiation timed fastest for the shape at load,
//! [`super::gemv_tune`]); larger ones go through cuBLAS, and so do decode-sized ones that
//! timing found cuBLAS clearly faster at. Quantized matrices: the block formats' GEMVs for
//! decode-sized products, the int8 tensor-core products for up to 64 rows where x is read as
//! int8 ([`super::mmq`]), else the blocks expanded to bf16 for cuBLAS.

use std::sync::Arc;

use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
use cudarc::cublas::{result, CudaBlas};
use cudarc::driver::{CudaStream, LaunchConfig};

use super::buffer::DeviceBuf;
use super::l2_prefetch::L2Prefetch;
use super::launch::Launcher;
use super::mmq::{
    MmqChoice, MmqShape, MmqSplit, MMQ_BLOCK_ROWS, MMQ_MAX_ROWS, MMQ_SUM_THREADS, MMQ_WARPS,
};
use super::params::{Dequant, GemvBf16, GemvBf16Gated, GemvQuantized, Mmq, MmqSum};
use super::tune::gemv_tune::{GemvChoice, GemvPick, GemvVariant, DEFAULT_VARIANT, GEMV_VARIANTS};
use super::weights::{DeviceMatrix, QuantPart, QuantX, Storage};
use super::CudaError;

/// Rows up to which the GEMV kernels are used (GEMV_MAX_ROWS in kernels.cu).
pub const GEMV_MAX_ROWS: usize = 8;
/// Output columns per block of the quantized GEMV kernels (GEMV_WARPS in kernels.cu).
pub(super) const QUANT_GEMV_WARPS: usize = 8;
/// Threads per block of the `dequant_*` kernels (one per group of 32 elements).
pub(super) const EXPAND_THREADS: usize = 256;

/// cuBLAS's workspace, ours so that no GEMM allocates while a CUDA graph is captured (the
/// size PyTorch gives it on Hopper).
const CUBLAS_WORKSPACE_BYTES: usize = 32 << 20;

pub struct Gemm {
    blas: CudaBlas,
    _workspace: DeviceBuf<u8>,
    /// Where a quantized matrix is expanded to bf16 for cuBLAS (sized at load for the
    /// largest one: nothing is allocated while a CUDA graph is captured), and where the int8
    /// tensor-core products, which expand nothing, keep their slices' partial sums.
    expanded: Option<DeviceBuf<u16>>,
    launcher: Launcher,
    gemv_max_rows: usize,
    /// Which bf16 GEMV variant each product uses ([`super::gemv_tune`]).
    pub(super) gemv_choice: GemvChoice,
    /// How much of its rows a bf16 GEMV asks L2 for before its early start waits.
    pub(super) l2_prefetch: L2Prefetch,
    /// How the quantized matrices' products of up to 64 token rows read x.
    pub(super) quant_x: QuantX,
    /// Blocks an int8 tensor-core product aims for ([`MmqSplit`]): a few per SM.
    pub(super) mmq_blocks: usize,
    /// Which products of up to 64 token rows with x as int8 the int8 tensor-core products
    /// serve ([`MmqChoice`]: the formats checked on this GPU, the shapes timed); the others
    /// expand the blocks for cuBLAS.
    pub(super) mmq_choice: MmqChoice,
}

impl Gemm {
    pub fn new(stream: &Arc<CudaStream>, launcher: Launcher) -> Result<Self, CudaError> {
        let blas = CudaBlas::new(Arc::clone(stream))
            .map_err(|e| CudaError::Failure(format!("cuBLAS: {e}")))?;
        let workspace = DeviceBuf::<u8>::zeros(stream, CUBLAS_WORKSPACE_BYTES)?;
        // SAFETY: the workspace outlives the handle (both are fields of this struct, the
        // buffer dropped after `blas`) and is only used on the handle's stream.
        let status = unsafe {
            cudarc::cublas::sys::cublasSetWorkspace_v2(
                *blas.handle(),
                workspace.ptr() as *mut std::ffi::c_void,
                CUBLAS_WORKSPACE_BYTES,
            )
        };
        if status != cudarc::cublas::sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return Err(CudaError::Failure(format!("cuBLAS workspace: {status:?}")));
        }
        Ok(Gemm {
            blas,
            _workspace: workspace,
            expanded: None,
            launcher,
            gemv_max_rows: GEMV_MAX_ROWS,
            gemv_choice: GemvChoice::default(),
            l2_prefetch: L2Prefetch::default(),
            quant_x: QuantX::default(),
            mmq_blocks: 264,
            mmq_choice: MmqChoice::default(),
        })
    }

    pub fn set_gemv_max_rows(&mut self, rows: usize) {
        self.gemv_max_rows = rows.min(GEMV_MAX_ROWS);
    }

    /// Makes room to expand a quantized matrix of `elements` to bf16.
    pub fn reserve_expansion(
        &mut self,
        stream: &Arc<CudaStream>,
        elements: usize,
    ) -> Result<(), CudaError> {
        if elements > 0 && self.expanded.as_ref().is_none_or(|b| b.len() < elements) {
            self.expanded = Some(DeviceBuf::zeros(stream, elements)?);
        }
        Ok(())
    }

    /// `out[n, w.rows] = x[n, w.cols] · wᵀ` with `x` bf16 (row-major) and `out` f32.
    pub fn matmul(&self, x: u64, w: &DeviceMatrix, n: usize, out: u64) -> Result<(), CudaError> {
        if n == 0 {
            return Ok(());
        }
        let decode = n <= self.gemv_max_rows && w.cols.is_multiple_of(8);
        let cublas = self.gemv_choice.prefers_cublas(w.rows, w.cols, n);
        match &w.storage {
            Storage::Bf16(buf) if decode && !cublas => {
                let form = GemvForm::Plain;
                let pick = self.gemv_choice.pick(w.rows, w.cols, form, n);
                let x = GemvInput::plain(x);
                self.gemv_bf16(pick, buf.ptr(), w.rows, w.cols, x, n, out, form, None)
            }
            Storage::Bf16(buf) => self.cublas(buf.ptr(), w.rows, w.cols, x, n, out),
            Storage::Quantized(parts) if decode => {
                let mut first_row = 0;
                for part in parts {
                    let out = out + (first_row * std::mem::size_of::<f32>()) as u64;
                    let weights = part.buf.ptr();
                    let kernel = GemvKernel {
                        name: part.kernels.gemv_reading(self.quant_x),
                        warps: QUANT_GEMV_WARPS,
                        rows_per_block: QUANT_GEMV_WARPS,
                        pairs_per_block: QUANT_GEMV_WARPS / 2,
                        shared_bytes: 0,
                        l2: None,
                        glu: None,
                    };
                    let (rows, cols) = (part.rows, w.cols);
                    let x = GemvInput::plain(x);
                    kernel.launch(self, weights, (rows, cols, w.rows), x, n, out, None, None)?;
                    first_row += part.rows;
                }
                Ok(())
            }
            Storage::Quantized(parts) if self.mmq_serves(parts, w, n) => {
                self.mmq(parts, w, x, n, out)
            }
            Storage::Quantized(parts) => self.expanded_product(parts, w.rows, w.cols, x, n, out),
        }
    }

    /// `out[n, rows] = x · wᵀ` for the matrix of these parts (`rows` in all, `cols` inputs):
    /// the parts expanded to bf16 one after another, then one cuBLAS GEMM.
    pub(super) fn expanded_product(
        &self,
        parts: &[QuantPart],
        rows: usize,
        cols: usize,
        x: u64,
        n: usize,
        out: u64,
    ) -> Result<(), CudaError> {
        let expanded = self
            .expanded
            .as_ref()
            .filter(|b| b.len() >= rows * cols)
            .ok_or_else(|| {
                CudaError::Failure(format!("no room to expand a {rows}×{cols} matrix"))
            })?;
        let mut first_row = 0;
        for part in parts {
            self.expand(part, cols, expanded.at(first_row * cols))?;
            first_row += part.rows;
        }
        self.cublas(expanded.ptr(), rows, cols, x, n, out)
    }

    /// Whether the int8 tensor-core products (mmq.cu) may serve products through these
    /// parts of `w`: x read as int8, inputs in whole groups of 32, every part's format
    /// checked on this GPU and not rejected. Which batches they then serve is timed
    /// ([`Gemm::mmq_serves`]).
    pub(super) fn mmq_takes(&self, parts: &[QuantPart], w: &DeviceMatrix) -> bool {
        self.quant_x == QuantX::Int8
            && w.cols.is_multiple_of(32)
            && self.mmq_choice.takes(parts.iter().map(|p| p.dtype))
    }

    /// Whether the int8 tensor-core products serve `n` token rows through these parts of
    /// `w`: a batch the GEMVs do not take and the tensor-core tile does, through a matrix
    /// they take, of a shape timed faster that way (or forced so).
    fn mmq_serves(&self, parts: &[QuantPart], w: &DeviceMatrix, n: usize) -> bool {
        n <= MMQ_MAX_ROWS
            && self.mmq_takes(parts, w)
            && parts.first().is_some_and(|first| {
                let shape = MmqShape::of(w.rows, w.cols, first.dtype, n);
                self.mmq_choice.prefers(shape)
            })
    }

    /// `out[n, w.rows] = x · wᵀ` through the int8 tensor-core product of each part (where
    /// [`Gemm::mmq_serves`], or timed against the expansion: [`super::mmq_tune`]).
    pub(super) fn mmq(
        &self,
        parts: &[QuantPart],
        w: &DeviceMatrix,
        x: u64,
        n: usize,
        out: u64,
    ) -> Result<(), CudaError> {
        let mut first_row = 0;
        for part in parts {
            let part_out = out + (first_row * std::mem::size_of::<f32>()) as u64;
            self.mmq_part(part, w.cols, x, n, part_out, w.rows)?;
            first_row += part.rows;
        }
        Ok(())
    }

    /// `out[j·ldo + m]` = token row j of `x` times row m of one part of `cols` inputs on
    /// the int8 tensor cores, split over K as [`MmqSplit`] plans with the expansion buffer
    /// holding the slices' partial sums.
    fn mmq_part(
        &self,
        part: &QuantPart,
        cols: usize,
        x: u64,
        n: usize,
        out: u64,
        ldo: usize,
    ) -> Result<(), CudaError> {
        let name = part.kernels.mmq;
        let scratch = self.expanded.as_ref();
        let room = scratch.map_or(0, |b| b.len() / 2);
        let split = MmqSplit::plan(part.rows, cols, n, self.mmq_blocks, room);
        // One slice writes the output; several write their partial sums to the scratch.
        let (dst, dst_ldo, stride) = match scratch {
            Some(buf) if split.scratch(part.rows, n) > 0 => (buf.ptr(), part.rows, n * part.rows),
            _ => (out, ldo, 0),
        };
        let (m, k, rows) = (part.rows as i32, cols as i32, n as i32);
        let (dst_ldo, slice_groups, stride) =
            (dst_ldo as i32, split.slice_groups as i32, stride as i64);
        let weights = part.buf.ptr();
        let cfg = LaunchConfig {
            grid_dim: (
                part.rows.div_ceil(MMQ_BLOCK_ROWS) as u32,
                split.slices as u32,
                1,
            ),
            block_dim: ((MMQ_WARPS * 32) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let params = Mmq {
            w: weights,
            x,
            out: dst,
            m,
            k,
            n: rows,
            ldo: dst_ldo,
            slice_groups,
            slice_stride: stride,
        };
        // SAFETY: the part holds `rows` whole-block rows of `cols` (cols % 32 == 0, checked
        // by `mmq_serves`); `x` has n·cols bf16; `dst` has room for the slices' n rows
        // (`out`'s, `ldo` apart, or the scratch's, which `plan` fitted in `room`).
        unsafe { self.launcher.launch_params(name, cfg, &params) }?;
        if split.slices > 1 {
            self.mmq_sum(dst, out, part.rows, n, ldo, split.slices)?;
        }
        Ok(())
    }

    /// One part's product of `n` token rows at `x` (`cols` inputs) on the int8 tensor cores
    /// into `out` and, into `reference`, through its blocks expanded to bf16 for cuBLAS (both
    /// n rows `part.rows` apart): what [`super::mmq_check`] compares.
    pub(super) fn mmq_and_expanded(
        &self,
        part: &QuantPart,
        cols: usize,
        (x, n): (u64, usize),
        out: u64,
        reference: u64,
    ) -> Result<(), CudaError> {
        self.mmq_part(part, cols, x, n, out, part.rows)?;
        self.expanded_product(std::slice::from_ref(part), part.rows, cols, x, n, reference)
    }

    /// `out[j·ldo + m]` = the sum of the `slices` partial products at `parts` (slice, token
    /// row, weight row), in slice order.
    fn mmq_sum(
        &self,
        parts: u64,
        out: u64,
        rows: usize,
        n: usize,
        ldo: usize,
        slices: usize,
    ) -> Result<(), CudaError> {
        let cfg = LaunchConfig {
            grid_dim: ((rows * n).div_ceil(MMQ_SUM_THREADS) as u32, 1, 1),
            block_dim: (MMQ_SUM_THREADS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let (m, n, ldo, slices) = (rows as i32, n as i32, ldo as i32, slices as i32);
        let params = MmqSum {
            parts,
            out,
            m,
            n,
            ldo,
            slices,
        };
        // SAFETY: `parts` holds slices·n·rows floats (written by the product just before);
        // `out` has n rows `ldo` floats apart, `rows` of them from here.
        unsafe { self.launcher.launch_params("mmq_sum", cfg, &params) }
    }

    /// Whether the product of `n` rows through `w` is one of our bf16 GEMVs (a decode-sized
    /// product of bf16 weights that timing did not give to cuBLAS), which can take the feed-forward's [gate | up] rows directly
    /// ([`Gemm::matmul_fused`]) and end the sub-block ([`NormAfter`]).
    pub fn fuses_into_gemv(&self, w: &DeviceMatrix, n: usize) -> bool {
        n > 0
            && n <= self.gemv_max_rows
            && w.cols.is_multiple_of(8)
            && matches!(w.storage, Storage::Bf16(_))
            && !self.gemv_choice.prefers_cublas(w.rows, w.cols, n)
    }

    /// `out[n, w.rows] = x · wᵀ` through a bf16 GEMV, with `act` `x` being [gate | up] rows
    /// (`[n, 2·w.cols]` f32) whose gated activation is computed as the GEMV stages them (0 =
    /// SiLU, 1 = GELU), with `x`'s scale where it has one ([`GemvInput`]), and with `norm`
    /// the GEMV's last block ending the sub-block. Only where [`Gemm::fuses_into_gemv`].
    pub fn matmul_fused(
        &self,
        x: GemvInput,
        act: Option<i32>,
        w: &DeviceMatrix,
        n: usize,
        out: u64,
        norm: Option<&NormAfter>,
    ) -> Result<(), CudaError> {
        let weights = self.fused_weights(w, n)?;
        let form = act.map_or(GemvForm::Plain, GemvForm::GatedInput);
        let pick = self.gemv_choice.pick(w.rows, w.cols, form, n);
        self.gemv_bf16(pick, weights, w.rows, w.cols, x, n, out, form, norm)
    }

    /// [`Gemm::matmul`] of `x`'s rows, and with its scale ([`GemvInput`]: the bf16 rows a
    /// split sub-block end wrote, not yet normalised) through a bf16 GEMV that multiplies
    /// each token row's sums by it; that only where [`Gemm::fuses_into_gemv`].
    pub fn matmul_scaled(
        &self,
        x: GemvInput,
        w: &DeviceMatrix,
        n: usize,
        out: u64,
    ) -> Result<(), CudaError> {
        if x.scale == 0 {
            return self.matmul(x.x, w, n, out);
        }
        self.matmul_fused(x, None, w, n, out, None)
    }

    /// `out[n, w.rows / 2] = bf16(act(gate) · up)` for `[gate | up] = x · wᵀ`, `w` the
    /// feed-forward's fused gate/up matrix, through a bf16 GEMV whose blocks pair the gate
    /// and up rows (0 = SiLU, 1 = GELU): `gated_act`'s values with no f32 rows in between
    /// (gate and up times `x`'s scale first, where it has one). Only where
    /// [`Gemm::fuses_into_gemv`].
    pub fn matmul_glu(
        &self,
        x: GemvInput,
        w: &DeviceMatrix,
        n: usize,
        out: u64,
        act: i32,
    ) -> Result<(), CudaError> {
        let weights = self.fused_weights(w, n)?;
        let form = GemvForm::GluOutput(act);
        let pick = self.gemv_choice.pick(w.rows, w.cols, form, n);
        self.gemv_bf16(pick, weights, w.rows, w.cols, x, n, out, form, None)
    }

    /// `w`'s bf16 weights, where the product of `n` rows through it is a bf16 GEMV that can
    /// fuse work ([`Gemm::fuses_into_gemv`]).
    fn fused_weights(&self, w: &DeviceMatrix, n: usize) -> Result<u64, CudaError> {
        w.bf16_ptr()
            .filter(|_| self.fuses_into_gemv(w, n))
            .ok_or_else(|| {
                CudaError::Failure(format!(
                    "a fused product needs a decode-sized bf16 GEMV, not {} rows of {}×{}",
                    n, w.rows, w.cols
                ))
            })
    }

    /// Threads per block of the bf16 GEMV that serves `n` rows through `w` in `form`.
    pub fn gemv_threads(&self, w: &DeviceMatrix, n: usize, form: GemvForm) -> usize {
        let chosen = self.gemv_choice.pick(w.rows, w.cols, form, n).variant;
        self.gemv_variant_run(chosen, n, w.cols, form.gated_input())
            .warps
            * 32
    }

    /// The variant that serves `n` rows of `cols` inputs when `variant` is asked for: itself
    /// where usable; else (a resident variant forced on a product whose x does not fit, or a
    /// variant this GPU's compile cannot launch) the same shape in another form (same bits),
    /// or the default.
    fn gemv_variant_run(&self, variant: usize, n: usize, cols: usize, gated: bool) -> &GemvVariant {
        let v = &GEMV_VARIANTS[variant];
        if self.gemv_usable(v, n, cols, gated) {
            return v;
        }
        GEMV_VARIANTS
            .iter()
            .find(|o| {
                o.warps == v.warps
                    && o.unroll == v.unroll
                    && (o.tensor_cores, o.ksplit) == (v.tensor_cores, v.ksplit)
                    && self.gemv_usable(o, n, cols, gated)
            })
            .unwrap_or(&GEMV_VARIANTS[DEFAULT_VARIANT])
    }

    /// Whether variant `v` can serve `n` rows of `cols` inputs here: its x fits, it has the
    /// kernel (plain or `gated`), and the driver's compile of it launches blocks of its size.
    pub(super) fn gemv_usable(&self, v: &GemvVariant, n: usize, cols: usize, gated: bool) -> bool {
        v.fits(n, cols)
            && v.kernel(gated)
                .is_some_and(|k| self.launcher.fits(k, (v.warps * 32) as u32))
    }

    /// `out[n, rows] = x · wᵀ` through bf16 GEMV `pick` (a variant of [`GEMV_VARIANTS`] and
    /// its prefetch distance), in `form`, ending with `norm`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn gemv_bf16(
        &self,
        pick: GemvPick,
        weights: u64,
        rows: usize,
        cols: usize,
        x: GemvInput,
        n: usize,
        out: u64,
        form: GemvForm,
        norm: Option<&NormAfter>,
    ) -> Result<(), CudaError> {
        let (act, glu, ldo) = match form {
            GemvForm::Plain => (None, Some(-1), rows),
            GemvForm::GatedInput(act) => (Some(act), None, rows),
            GemvForm::GluOutput(act) => (None, Some(act), rows / 2),
        };
        let gated = act.is_some();
        let v = self.gemv_variant_run(pick.variant, n, cols, gated);
        // Nothing overlaps a plain launch: nothing to prefetch for before the wait.
        let before_wait = if self.launcher.early_start() {
            self.l2_prefetch
                .row_bytes(rows, cols * 2, v.rows_per_warp())
        } else {
            0
        };
        let name = v
            .kernel(gated)
            .ok_or_else(|| CudaError::Failure(format!("GEMV {} has no gated form", v.name)))?;
        let kernel = GemvKernel {
            name,
            warps: v.warps,
            rows_per_block: v.rows_per_block(),
            pairs_per_block: v.pairs_per_block(),
            shared_bytes: v.shared_bytes(n, cols) as u32,
            l2: Some([before_wait, pick.ahead]),
            glu,
        };
        kernel.launch(self, weights, (rows, cols, ldo), x, n, out, act, norm)
    }

    /// Expands one part to bf16 rows at `dst`.
    fn expand(&self, part: &QuantPart, cols: usize, dst: u64) -> Result<(), CudaError> {
        let groups = part.rows * cols / 32;
        let (rows, k) = (part.rows as i32, cols as i32);
        let weights = part.buf.ptr();
        let cfg = LaunchConfig {
            grid_dim: (groups.div_ceil(EXPAND_THREADS) as u32, 1, 1),
            block_dim: (EXPAND_THREADS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let name = part.kernels.dequant;
        let params = Dequant {
            w: weights,
            out: dst,
            rows,
            k,
        };
        // SAFETY: the part holds `rows` whole-block rows of `cols`; `dst` has room for
        // rows·cols bf16 (`reserve_expansion`).
        unsafe { self.launcher.launch_params(name, cfg, &params) }
    }

    /// Row-major `W[out, in]` is column-major `Wᵀ`, so cuBLAS computes the column-major
    /// `outᵀ = op(W) · xᵀ` with `op = T`: m = out, n = tokens, k = in.
    pub(super) fn cublas(
        &self,
        weights: u64,
        rows: usize,
        cols: usize,
        x: u64,
        n: usize,
        out: u64,
    ) -> Result<(), CudaError> {
        let (m, k) = (rows as i32, cols as i32);
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: as for `GemvKernel::launch`; cuBLAS runs on the backend's stream.
        unsafe {
            result::gemm_ex(
                *self.blas.handle(),
                cublasOperation_t::CUBLAS_OP_T,
                cublasOperation_t::CUBLAS_OP_N,
                m,
                n as i32,
                k,
                (&alpha as *const f32).cast(),
                weights as *const _,
                cudaDataType::CUDA_R_16BF,
                k,
                x as *const _,
                cudaDataType::CUDA_R_16BF,
                k,
                (&beta as *const f32).cast(),
                out as *mut _,
                cudaDataType::CUDA_R_32F,
                m,
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| CudaError::Failure(format!("cuBLAS GEMM {m}×{k}, {n} rows: {e}")))
    }
}

/// What a bf16 GEMV computes besides its product.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GemvForm {
    /// `out` = f32 rows of `x · wᵀ`, `x` bf16 rows.
    Plain,
    /// `x` is the feed-forward's [gate | up] f32 rows, activated as they are staged (0 =
    /// SiLU, 1 = GELU): the down projection with `gated_act` inside.
    GatedInput(i32),
    /// `w` is the fused [gate | up] matrix and `out` bf16 rows of act(gate)·up, half as wide
    /// ([`Gemm::matmul_glu`]).
    GluOutput(i32),
}

impl GemvForm {
    /// Whether the input is [gate | up] rows activated as they are staged: the gated
    /// kernels (CUDA cores only).
    pub fn gated_input(self) -> bool {
        matches!(self, GemvForm::GatedInput(_))
    }

    /// The form as the tuner keys its choices: the activation does not change which variant
    /// is fastest, the form does (a GLU-output block pairs gate and up rows).
    pub fn timed_as(self) -> GemvForm {
        match self {
            GemvForm::Plain => GemvForm::Plain,
            GemvForm::GatedInput(_) => GemvForm::GatedInput(0),
            GemvForm::GluOutput(_) => GemvForm::GluOutput(0),
        }
    }
}

/// The end of a sub-block that a bf16 GEMV's last block performs after the product (kernels.cu's
/// `GemvNorm`): the output rows added to the residual stream `x` (through the `post_w` norm
/// where the model has one), then normalised by `next_w` into `out`, the next sub-block's
/// input (no norm without `next_w`: the model's last block) — what `add_rms_norm` does, to
/// the same bits. `done` is a counter at 0, which the last block sets back. Addresses are
/// device addresses, 0 for none.
///
/// With `inv` the end is split with the next product instead (no `post_w`): every block adds
/// its own rows to `x` (the same bits) and writes them times `next_w` to `out` as bf16, not
/// yet normalised, and the last block only writes each row's 1/rms (the same bits as
/// `add_rms_norm`'s) to `inv`, which the next product takes as its input's scale
/// ([`GemvInput`]): no block walks whole rows, where an 8B's 4096-wide rows make the last
/// block's whole end slower than the launch it saves. (Without `next_w` only the adds.)
#[derive(Debug, Clone, Copy, Default)]
pub struct NormAfter {
    pub x: u64,
    pub post_w: u64,
    pub next_w: u64,
    pub out: u64,
    pub done: u64,
    pub eps: f32,
    pub inv: u64,
}

/// A bf16 GEMV's input: bf16 rows `x`, and with `scale` (a device address, 0 for none) each
/// token row's factor for its sums, the 1/rms a split sub-block end wrote ([`NormAfter`]):
/// the norm folded into the product's output.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GemvInput {
    pub x: u64,
    pub scale: u64,
}

impl GemvInput {
    /// Rows used as they are.
    pub fn plain(x: u64) -> Self {
        GemvInput { x, scale: 0 }
    }
}

/// One GEMV kernel, its warps and rows per block and the dynamic shared memory it takes;
/// `l2` for the bf16 variants, which take a [`NormAfter`] (its fields), their input's scale
/// ([`GemvInput`]) and then what they
/// ask L2 for (kernels.cu's GemvL2): the bytes of each row before the wait ([`L2Prefetch`])
/// and the distance kept ahead of the loads ([`GemvPick::ahead`]); `glu` for the plain bf16
/// ones, last: the activation written from paired gate and up rows, or -1.
struct GemvKernel {
    name: &'static str,
    warps: usize,
    /// Weight rows a block serves in a plain product, and gate rows in a GLU-output one.
    rows_per_block: usize,
    pairs_per_block: usize,
    shared_bytes: u32,
    l2: Option<[u32; 2]>,
    glu: Option<i32>,
}

impl GemvKernel {
    /// `out[j·ldo + m] = x[j] · w[m]` for the `rows` rows of `weights` (a bf16 GEMV variant
    /// or a block format's `gemv_*`: the same arguments; the gated bf16 kernels take
    /// [gate | up] rows as `x` and the activation as `act`; the bf16 ones end with `norm`).
    #[allow(clippy::too_many_arguments)]
    fn launch(
        &self,
        gemm: &Gemm,
        weights: u64,
        (rows, cols, ldo): (usize, usize, usize),
        x: GemvInput,
        n: usize,
        out: u64,
        act: Option<i32>,
        norm: Option<&NormAfter>,
    ) -> Result<(), CudaError> {
        let (m, k, n_rows, ldo) = (rows as i32, cols as i32, n as i32, ldo as i32);
        if x.scale != 0 && self.l2.is_none() {
            return Err(CudaError::Failure(format!(
                "{} takes no input scale (a split norm needs a bf16 GEMV)",
                self.name
            )));
        }
        let blocks = match self.glu {
            Some(act) if act >= 0 => (rows / 2).div_ceil(self.pairs_per_block),
            _ => rows.div_ceil(self.rows_per_block),
        };
        let cfg = LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: ((self.warps * 32) as u32, 1, 1),
            shared_mem_bytes: self.shared_bytes,
        };
        let none = NormAfter::default();
        let norm = norm.unwrap_or(&none);
        let launcher = &gemm.launcher;
        // Each kernel family has its list ([`super::params`]): a block format's takes the
        // product alone; a bf16 variant the sub-block end, x's scale, the L2 asks, and
        // either the activation it writes (`glu`) or the one it reads (`act`, gated x).
        //
        // SAFETY (every arm): `weights` holds `rows` rows of `cols` in the kernel's format
        // (bf16 with cols % 8 == 0, or whole blocks, checked when the file was opened); the
        // caller sized `x` (n·cols bf16, or n·2·cols f32 for the gated kernel) and `out` (n
        // rows `ldo` floats apart, `rows` of them from here).
        match (act, self.l2, self.glu) {
            (None, None, None) => {
                let params = GemvQuantized {
                    w: weights,
                    x: x.x,
                    out,
                    m,
                    k,
                    n: n_rows,
                    ldo,
                };
                unsafe { launcher.launch_params(self.name, cfg, &params) }
            }
            (None, Some([l2_before_wait, l2_ahead]), Some(glu)) => {
                let params = GemvBf16 {
                    w: weights,
                    x: x.x,
                    out,
                    m,
                    k,
                    n: n_rows,
                    ldo,
                    norm_x: norm.x,
                    norm_post_w: norm.post_w,
                    norm_next_w: norm.next_w,
                    norm_out: norm.out,
                    norm_done: norm.done,
                    norm_eps: norm.eps,
                    norm_inv: norm.inv,
                    x_scale: x.scale,
                    l2_before_wait,
                    l2_ahead,
                    glu,
                };
                unsafe { launcher.launch_params(self.name, cfg, &params) }
            }
            (Some(act), Some([l2_before_wait, l2_ahead]), None) => {
                let params = GemvBf16Gated {
                    w: weights,
                    gate_up: x.x,
                    out,
                    m,
                    k,
                    n: n_rows,
                    ldo,
                    act,
                    norm_x: norm.x,
                    norm_post_w: norm.post_w,
                    norm_next_w: norm.next_w,
                    norm_out: norm.out,
                    norm_done: norm.done,
                    norm_eps: norm.eps,
                    norm_inv: norm.inv,
                    x_scale: x.scale,
                    l2_before_wait,
                    l2_ahead,
                };
                unsafe { launcher.launch_params(self.name, cfg, &params) }
            }
            _ => Err(CudaError::Failure(format!(
                "{} takes no {} input",
                self.name,
                if act.is_some() { "gated" } else { "plain" }
            ))),
        }
    }
}
