//! Whether each block format's int8 tensor-core product (mmq.cu) computes the product on this
//! GPU, before reading x as int8 sends batches to it. The kernels' fragment layout is
//! checked against the emulator's twin of the mma; this is the check on the hardware itself,
//! once per backend when x is first read as int8: each format's product of random rows
//! through the smallest part of the model's matrices in that format, against the same rows
//! through its blocks expanded to bf16 for cuBLAS. A format whose product disagrees by more
//! than x's rounding to int8 keeps the expansion (and a warning says so).

use super::gemv_check::{agrees_within, random_rows};
use crate::backend::cuda::buffer::DeviceBuf;
use crate::backend::cuda::mmq::MMQ_MAX_ROWS;
use crate::backend::cuda::weights::{QuantPart, Storage};
use crate::backend::cuda::{CudaBackend, CudaError};
use crate::quant::GgmlType;

/// The largest |Δ| the tensor-core product may show against the expansion's, relative to the
/// product's largest |value|: x rounded to 8 bits per group of 32 moves random rows'
/// products by ~0.1% of it, where a wrong fragment layout moves them by the whole product.
const TOLERANCE: f32 = 0.05;

impl CudaBackend {
    /// The formats rejected by [`CudaBackend::check_mmq`] (their products expand the blocks
    /// for cuBLAS); empty where every kernel computes what it should (the GPU conformance
    /// suite asserts so).
    pub fn mmq_formats_rejected(&self) -> Vec<GgmlType> {
        self.gemm.mmq_choice.rejected()
    }

    /// Checks each block format's tensor-core product here (at 9 token rows and at the most
    /// it takes), once per backend.
    pub(in crate::backend::cuda) fn check_mmq(&mut self) -> Result<(), CudaError> {
        if self.gemm.mmq_choice.is_checked() {
            return Ok(());
        }
        let mut smallest: Vec<(&QuantPart, usize)> = Vec::new();
        for m in self.weights.matrices() {
            let Storage::Quantized(parts) = &m.storage else {
                continue;
            };
            for part in parts {
                let size = part.rows * m.cols;
                match smallest.iter_mut().find(|(p, _)| p.dtype == part.dtype) {
                    Some(kept) if kept.0.rows * kept.1 > size => *kept = (part, m.cols),
                    Some(_) => {}
                    None => smallest.push((part, m.cols)),
                }
            }
        }
        let mut rejected = Vec::new();
        for (part, cols) in smallest {
            let x = DeviceBuf::from_host(&self.stream, &random_rows(MMQ_MAX_ROWS, cols))?;
            let out = DeviceBuf::<f32>::zeros(&self.stream, MMQ_MAX_ROWS * part.rows)?;
            let reference = DeviceBuf::<f32>::zeros(&self.stream, MMQ_MAX_ROWS * part.rows)?;
            for n in [9, MMQ_MAX_ROWS] {
                let rows = (x.ptr(), n);
                self.gemm
                    .mmq_and_expanded(part, cols, rows, out.ptr(), reference.ptr())?;
                let got = out.read(&self.stream, n * part.rows)?;
                let want = reference.read(&self.stream, n * part.rows)?;
                if !agrees_within(&got, &want, TOLERANCE, 0.0) {
                    tracing::warn!(
                        format = ?part.dtype,
                        rows = n,
                        "the int8 tensor-core product disagrees with the expanded blocks' on \
                         this GPU; this format's products expand the blocks instead"
                    );
                    rejected.push(part.dtype);
                    break;
                }
            }
        }
        self.gemm.mmq_choice.set_rejected(rejected);
        Ok(())
    }
}
