//! Dense matrix products: bf16 weights and activations in, f32 accumulate and f32 out (the
//! residual stream and everything normalised after a GEMM stay f32). Decode-sized products
//! (a few token rows) run our own GEMV kernel, which streams each weight once at close to
//! the memory bandwidth (in the instantiation timed fastest for the shape at load,
//! [`super::gemv_tune`]); larger ones go through cuBLAS.

use std::sync::Arc;

use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
use cudarc::cublas::{result, CudaBlas};
use cudarc::driver::{CudaStream, LaunchConfig};

use super::buffer::DeviceBuf;
use super::gemv_tune::{GemvChoice, DEFAULT_VARIANT, GEMV_VARIANTS};
use super::launch::{KernelArgs, Launcher};
use super::weights::{DeviceMatrix, QuantPart, Storage};
use super::CudaError;

/// Rows up to which the GEMV kernels are used (GEMV_MAX_ROWS in kernels.cu).
pub const GEMV_MAX_ROWS: usize = 8;
/// Output columns per block of the quantized GEMV kernels (GEMV_WARPS in kernels.cu).
const QUANT_GEMV_WARPS: usize = 8;
/// Threads per block of the `dequant_*` kernels (one per group of 32 elements).
const EXPAND_THREADS: usize = 256;

/// cuBLAS's workspace, ours so that no GEMM allocates while a CUDA graph is captured (the
/// size PyTorch gives it on Hopper).
const CUBLAS_WORKSPACE_BYTES: usize = 32 << 20;

pub struct Gemm {
    blas: CudaBlas,
    _workspace: DeviceBuf<u8>,
    /// Where a quantized matrix is expanded to bf16 for cuBLAS (sized at load for the
    /// largest one: nothing is allocated while a CUDA graph is captured).
    expanded: Option<DeviceBuf<u16>>,
    launcher: Launcher,
    gemv_max_rows: usize,
    /// Which bf16 GEMV variant each product uses ([`super::gemv_tune`]).
    pub(super) gemv_choice: GemvChoice,
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
        match &w.storage {
            Storage::Bf16(buf) if decode => {
                let variant = self.gemv_choice.variant(w.rows, w.cols, false, n);
                self.gemv_bf16(variant, buf.ptr(), w.rows, w.cols, x, n, out, None)
            }
            Storage::Bf16(buf) => self.cublas(buf.ptr(), w.rows, w.cols, x, n, out),
            Storage::Quantized(parts) if decode => {
                let mut first_row = 0;
                for part in parts {
                    let out = out + (first_row * std::mem::size_of::<f32>()) as u64;
                    let weights = part.buf.ptr();
                    let kernel = GemvKernel {
                        name: part.kernels.gemv,
                        warps: QUANT_GEMV_WARPS,
                        shared_bytes: 0,
                    };
                    kernel.launch(self, weights, part.rows, w.cols, w.rows, x, n, out, None)?;
                    first_row += part.rows;
                }
                Ok(())
            }
            Storage::Quantized(parts) => {
                let expanded = self
                    .expanded
                    .as_ref()
                    .filter(|b| b.len() >= w.rows * w.cols)
                    .ok_or_else(|| {
                        CudaError::Failure(format!(
                            "no room to expand a {}×{} matrix",
                            w.rows, w.cols
                        ))
                    })?;
                let mut first_row = 0;
                for part in parts {
                    self.expand(part, w.cols, expanded.at(first_row * w.cols))?;
                    first_row += part.rows;
                }
                self.cublas(expanded.ptr(), w.rows, w.cols, x, n, out)
            }
        }
    }

    /// Whether the down projection of `n` rows through `w` can take the feed-forward's
    /// [gate | up] rows directly ([`Gemm::matmul_gated`]): a decode-sized product of bf16
    /// weights.
    pub fn can_fuse_activation(&self, w: &DeviceMatrix, n: usize) -> bool {
        n > 0
            && n <= self.gemv_max_rows
            && w.cols.is_multiple_of(8)
            && matches!(w.storage, Storage::Bf16(_))
    }

    /// `out[n, w.rows] = bf16(act(gate)·up) · wᵀ` from `gate_up` (`[n, 2·w.cols]` f32), the
    /// gated activation computed as the GEMV stages its input (act 0 = SiLU, 1 = GELU). Only
    /// where [`Gemm::can_fuse_activation`].
    pub fn matmul_gated(
        &self,
        gate_up: u64,
        act: i32,
        w: &DeviceMatrix,
        n: usize,
        out: u64,
    ) -> Result<(), CudaError> {
        let Some(weights) = w.bf16_ptr() else {
            return Err(CudaError::Failure(
                "a fused down projection needs bf16 weights".into(),
            ));
        };
        let variant = self.gemv_choice.variant(w.rows, w.cols, true, n);
        self.gemv_bf16(variant, weights, w.rows, w.cols, gate_up, n, out, Some(act))
    }

    /// `out[n, rows] = x · wᵀ` through bf16 GEMV variant `variant` ([`GEMV_VARIANTS`]): plain
    /// with `act = None`, else the gated down projection of [gate | up] rows `x`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn gemv_bf16(
        &self,
        variant: usize,
        weights: u64,
        rows: usize,
        cols: usize,
        x: u64,
        n: usize,
        out: u64,
        act: Option<i32>,
    ) -> Result<(), CudaError> {
        let mut v = &GEMV_VARIANTS[variant];
        if !v.fits(n, cols) {
            // A resident variant forced on a product whose x does not fit: the same shape
            // staging x tile by tile (same bits).
            v = GEMV_VARIANTS
                .iter()
                .find(|o| o.warps == v.warps && o.unroll == v.unroll && o.fits(n, cols))
                .unwrap_or(&GEMV_VARIANTS[DEFAULT_VARIANT]);
        }
        let kernel = GemvKernel {
            name: if act.is_some() { v.gated } else { v.plain },
            warps: v.warps,
            shared_bytes: v.shared_bytes(n, cols) as u32,
        };
        kernel.launch(self, weights, rows, cols, rows, x, n, out, act)
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
        let mut b = KernelArgs::new();
        b.arg(&weights).arg(&dst).arg(&rows).arg(&k);
        // SAFETY: the part holds `rows` whole-block rows of `cols`; `dst` has room for
        // rows·cols bf16 (`reserve_expansion`).
        unsafe { self.launcher.launch(name, cfg, &mut b) }
    }

    /// Row-major `W[out, in]` is column-major `Wᵀ`, so cuBLAS computes the column-major
    /// `outᵀ = op(W) · xᵀ` with `op = T`: m = out, n = tokens, k = in.
    fn cublas(
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

/// One GEMV kernel, its output columns per block and the dynamic shared memory it takes.
struct GemvKernel {
    name: &'static str,
    warps: usize,
    shared_bytes: u32,
}

impl GemvKernel {
    /// `out[j·ldo + m] = x[j] · w[m]` for the `rows` rows of `weights` (a bf16 GEMV variant
    /// or a block format's `gemv_*`: the same arguments; the gated bf16 kernels take
    /// [gate | up] rows as `x` and the activation as `act`).
    #[allow(clippy::too_many_arguments)]
    fn launch(
        &self,
        gemm: &Gemm,
        weights: u64,
        rows: usize,
        cols: usize,
        ldo: usize,
        x: u64,
        n: usize,
        out: u64,
        act: Option<i32>,
    ) -> Result<(), CudaError> {
        let (m, k, n_rows, ldo) = (rows as i32, cols as i32, n as i32, ldo as i32);
        let cfg = LaunchConfig {
            grid_dim: (rows.div_ceil(self.warps) as u32, 1, 1),
            block_dim: ((self.warps * 32) as u32, 1, 1),
            shared_mem_bytes: self.shared_bytes,
        };
        let mut b = KernelArgs::new();
        b.arg(&weights)
            .arg(&x)
            .arg(&out)
            .arg(&m)
            .arg(&k)
            .arg(&n_rows)
            .arg(&ldo);
        if let Some(act) = &act {
            b.arg(act);
        }
        // SAFETY: `weights` holds `rows` rows of `cols` in the kernel's format (bf16 with
        // cols % 8 == 0, or whole blocks, checked when the file was opened); the caller sized
        // `x` (n·cols bf16, or n·2·cols f32 for the gated kernel) and `out` (n rows `ldo`
        // floats apart, `rows` of them from here).
        unsafe { gemm.launcher.launch(self.name, cfg, &mut b) }
    }
}
