//! Whether each bf16 GEMV variant computes the product on this GPU, before the tuner may
//! choose it by its speed alone. The CUDA-core variants share their bits and the tensor-core
//! ones differ only in summation order, all checked on the emulator; this is the check on
//! the hardware itself, at every load: each variant multiplies one of the model's own matrices
//! by random bf16 rows (one row and the most a GEMV takes), and one that disagrees with the
//! default variant (a kernel the driver compiles or runs wrongly) is never chosen.

use super::buffer::DeviceBuf;
use super::gemm::{GemvForm, GEMV_MAX_ROWS};
use super::gemv_tune::{GemvPick, GEMV_VARIANTS};
use super::weights::DeviceMatrix;
use super::{CudaBackend, CudaError};

/// The largest |Δ| a variant's product may show against the default's, relative to the
/// product's largest |value|: summation order in f32 (the tensor cores' ~1e-6).
const TOLERANCE: f32 = 1e-3;

/// Whether `got` is `want` to [`TOLERANCE`] (NaN never is).
pub fn agrees(got: &[f32], want: &[f32]) -> bool {
    let scale = want.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
    got.len() == want.len()
        && got
            .iter()
            .zip(want)
            .all(|(g, w)| (g - w).abs() <= TOLERANCE * scale)
}

/// `n` rows of `cols` deterministic bf16 values in [-1, 1) (xorshift).
fn random_rows(n: usize, cols: usize) -> Vec<u16> {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    (0..n * cols)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let v = (state >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
            half::bf16::from_f32(v).to_bits()
        })
        .collect()
}

impl CudaBackend {
    /// The variants (indices into [`GEMV_VARIANTS`]) whose plain product through `w` of one
    /// and of [`GEMV_MAX_ROWS`] random rows disagrees with the default variant's here.
    pub(super) fn gemv_variants_that_disagree(
        &self,
        w: &DeviceMatrix,
    ) -> Result<Vec<usize>, CudaError> {
        let Some(weights) = w.bf16_ptr() else {
            return Ok(Vec::new());
        };
        let (rows, cols) = (w.rows, w.cols);
        let x = DeviceBuf::from_host(&self.stream, &random_rows(GEMV_MAX_ROWS, cols))?;
        let out = DeviceBuf::<f32>::zeros(&self.stream, GEMV_MAX_ROWS * rows)?;
        let product = |pick: GemvPick, n: usize| -> Result<Vec<f32>, CudaError> {
            self.gemm.gemv_bf16(
                pick,
                weights,
                rows,
                cols,
                x.ptr(),
                n,
                out.ptr(),
                GemvForm::Plain,
                None,
            )?;
            out.read(&self.stream, n * rows)
        };
        let mut disagree = Vec::new();
        for n in [1, GEMV_MAX_ROWS] {
            let want = product(GemvPick::DEFAULT, n)?;
            for (variant, v) in GEMV_VARIANTS.iter().enumerate() {
                if disagree.contains(&variant) || !self.gemm.gemv_usable(v, n, cols, false) {
                    continue;
                }
                if !agrees(&product(GemvPick { variant, ahead: 0 }, n)?, &want) {
                    disagree.push(variant);
                }
            }
        }
        Ok(disagree)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_product_agrees_to_summation_order_and_never_with_nan_or_another_length() {
        let want = [100.0f32, -3.0, 0.5];
        assert!(agrees(&want, &want));
        assert!(
            agrees(&[100.05, -3.0, 0.5], &want),
            "5e-4 of the largest value"
        );
        assert!(!agrees(&[100.0, -3.2, 0.5], &want));
        assert!(!agrees(&[f32::NAN, -3.0, 0.5], &want));
        assert!(!agrees(&want[..2], &want));
        assert!(agrees(&[0.0; 3], &[0.0; 3]), "all zeros");
    }

    #[test]
    fn random_rows_are_bf16_values_in_the_unit_range_and_not_all_alike() {
        let rows = random_rows(2, 64);
        assert_eq!(rows.len(), 128);
        let values: Vec<f32> = rows
            .iter()
            .map(|&b| half::bf16::from_bits(b).to_f32())
            .collect();
        assert!(values.iter().all(|v| (-1.0..1.0).contains(v)));
        assert!(values.iter().any(|v| *v > 0.25) && values.iter().any(|v| *v < -0.25));
    }
}
