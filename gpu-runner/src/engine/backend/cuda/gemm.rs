//! Dense matrix products: bf16 weights and activations in, f32 accumulate and f32 out (the
//! residual stream and everything normalised after a GEMM stay f32). Decode-sized products
//! (a few token rows) run our own GEMV kernel, which streams each weight once at close to
//! the memory bandwidth; larger ones go through cuBLAS.

use std::sync::Arc;

use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
use cudarc::cublas::{result, CudaBlas};
use cudarc::driver::{CudaStream, LaunchConfig, PushKernelArg};

use super::buffer::DeviceBuf;
use super::kernels::Kernels;
use super::weights::DeviceMatrix;
use super::CudaError;

/// Rows up to which `gemv_bf16` is used (GEMV_MAX_ROWS in kernels.cu).
pub const GEMV_MAX_ROWS: usize = 8;
/// Output columns per block of `gemv_bf16` (GEMV_WARPS in kernels.cu).
const GEMV_WARPS: usize = 8;

/// cuBLAS's workspace, ours so that no GEMM allocates while a CUDA graph is captured (the
/// size PyTorch gives it on Hopper).
const CUBLAS_WORKSPACE_BYTES: usize = 32 << 20;

pub struct Gemm {
    blas: CudaBlas,
    _workspace: DeviceBuf<u8>,
    stream: Arc<CudaStream>,
    kernels: Arc<Kernels>,
    gemv_max_rows: usize,
}

impl Gemm {
    pub fn new(stream: &Arc<CudaStream>, kernels: Arc<Kernels>) -> Result<Self, CudaError> {
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
            stream: Arc::clone(stream),
            kernels,
            gemv_max_rows: GEMV_MAX_ROWS,
        })
    }

    pub fn set_gemv_max_rows(&mut self, rows: usize) {
        self.gemv_max_rows = rows.min(GEMV_MAX_ROWS);
    }

    /// `out[n, w.rows] = x[n, w.cols] · wᵀ` with `x` bf16 (row-major) and `out` f32.
    pub fn matmul(&self, x: u64, w: &DeviceMatrix, n: usize, out: u64) -> Result<(), CudaError> {
        if n == 0 {
            return Ok(());
        }
        if n <= self.gemv_max_rows && w.cols.is_multiple_of(8) {
            self.gemv(x, w, n, out)
        } else {
            self.cublas(x, w, n, out)
        }
    }

    fn gemv(&self, x: u64, w: &DeviceMatrix, n: usize, out: u64) -> Result<(), CudaError> {
        let (m, k, rows) = (w.rows as i32, w.cols as i32, n as i32);
        let weights = w.buf.ptr();
        let cfg = LaunchConfig {
            grid_dim: (w.rows.div_ceil(GEMV_WARPS) as u32, 1, 1),
            block_dim: ((GEMV_WARPS * 32) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut b = self.stream.launch_builder(self.kernels.get("gemv_bf16"));
        b.arg(&weights).arg(&x).arg(&out).arg(&m).arg(&k).arg(&rows);
        // SAFETY: `w` holds rows·cols bf16 with cols % 8 == 0 (16-byte rows); the caller
        // sized `x` (n·cols bf16) and `out` (n·rows f32).
        unsafe { b.launch(cfg) }
            .map(|_| ())
            .map_err(|e| CudaError::Failure(format!("kernel gemv_bf16: {e}")))
    }

    /// Row-major `W[out, in]` is column-major `Wᵀ`, so cuBLAS computes the column-major
    /// `outᵀ = op(W) · xᵀ` with `op = T`: m = out, n = tokens, k = in.
    fn cublas(&self, x: u64, w: &DeviceMatrix, n: usize, out: u64) -> Result<(), CudaError> {
        let (m, k) = (w.rows as i32, w.cols as i32);
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: as for `gemv`; cuBLAS runs on the backend's stream.
        unsafe {
            result::gemm_ex(
                *self.blas.handle(),
                cublasOperation_t::CUBLAS_OP_T,
                cublasOperation_t::CUBLAS_OP_N,
                m,
                n as i32,
                k,
                (&alpha as *const f32).cast(),
                w.buf.ptr() as *const _,
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
