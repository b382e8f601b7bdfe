//! Whether each bf16 GEMV variant computes the product on this GPU, before the tuner may
//! choose it by its speed alone. The CUDA-core variants share their bits and the tensor-core
//! ones differ only in summation order, all checked on the emulator; this is the check on
//! the hardware itself, at every load: each variant multiplies one of the model's own matrices
//! by random bf16 rows (one row and the most a GEMV takes), as a plain product and, through
//! the feed-forward's gate/up matrix, writing act(gate)·up (the paired-row blocks the decode
//! steps run), and one that disagrees with the default variant in either (a kernel the
//! driver compiles or runs wrongly) is never chosen.

use super::gemv_tune::{GemvPick, GEMV_VARIANTS};
use crate::backend::cuda::buffer::DeviceBuf;
use crate::backend::cuda::gemm::{GemvForm, GemvInput, GEMV_MAX_ROWS};
use crate::backend::cuda::weights::DeviceMatrix;
use crate::backend::cuda::{CudaBackend, CudaError};

/// The largest |Δ| a variant's product may show against the default's, relative to the
/// product's largest |value|: summation order in f32 (the tensor cores' ~1e-6).
const TOLERANCE: f32 = 1e-3;

/// A bf16 value's rounding step relative to the value (at most): 8 significant bits.
const BF16_STEP: f32 = 1.0 / 128.0;

/// Whether `got` is `want` to [`TOLERANCE`] (NaN never is), each value also allowed
/// `rounding` of itself: where sums a hair apart were rounded to bf16, one step apart.
pub fn agrees(got: &[f32], want: &[f32], rounding: f32) -> bool {
    agrees_within(got, want, TOLERANCE, rounding)
}

/// As [`agrees`], to `tolerance` of the largest |value| of `want`.
pub fn agrees_within(got: &[f32], want: &[f32], tolerance: f32, rounding: f32) -> bool {
    let scale = want.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
    got.len() == want.len()
        && got
            .iter()
            .zip(want)
            .all(|(g, w)| (g - w).abs() <= tolerance * scale + rounding * w.abs())
}

/// `n` rows of `cols` deterministic bf16 values in [-1, 1) (xorshift).
pub(in crate::backend::cuda) fn random_rows(n: usize, cols: usize) -> Vec<u16> {
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
    /// The variants (indices into [`GEMV_VARIANTS`]) whose product of one and of
    /// [`GEMV_MAX_ROWS`] random rows disagrees with the default variant's here: through
    /// `plain` as a plain product, and through `gate_up` (a fused [gate | up] matrix, where
    /// the model's feed-forward has one as a bf16 GEMV) writing act(gate)·up.
    pub(in crate::backend::cuda) fn gemv_variants_that_disagree(
        &self,
        plain: &DeviceMatrix,
        gate_up: Option<&DeviceMatrix>,
    ) -> Result<Vec<usize>, CudaError> {
        let mut disagree = Vec::new();
        self.gemv_check(plain, GemvForm::Plain, &mut disagree)?;
        if let Some(w) = gate_up {
            self.gemv_check(w, GemvForm::GluOutput(0), &mut disagree)?;
        }
        Ok(disagree)
    }

    /// Adds to `disagree` the variants whose product through `w` in `form` (plain or GLU
    /// output) disagrees with the default variant's.
    fn gemv_check(
        &self,
        w: &DeviceMatrix,
        form: GemvForm,
        disagree: &mut Vec<usize>,
    ) -> Result<(), CudaError> {
        let Some(weights) = w.bf16_ptr() else {
            return Ok(());
        };
        let (rows, cols) = (w.rows, w.cols);
        let glu = matches!(form, GemvForm::GluOutput(_));
        let x = DeviceBuf::from_host(&self.stream, &random_rows(GEMV_MAX_ROWS, cols))?;
        let out = DeviceBuf::<f32>::zeros(&self.stream, GEMV_MAX_ROWS * rows)?;
        // A GLU output is n rows of rows / 2 bf16 values.
        let out_bf16 = DeviceBuf::<u16>::zeros(&self.stream, GEMV_MAX_ROWS * rows / 2)?;
        let product = |pick: GemvPick, n: usize| -> Result<Vec<f32>, CudaError> {
            let dst = if glu { out_bf16.ptr() } else { out.ptr() };
            self.gemm.gemv_bf16(
                pick,
                weights,
                rows,
                cols,
                GemvInput::plain(x.ptr()),
                n,
                dst,
                form,
                None,
            )?;
            if glu {
                let values = out_bf16.read(&self.stream, n * rows / 2)?;
                Ok(values
                    .into_iter()
                    .map(|b| half::bf16::from_bits(b).to_f32())
                    .collect())
            } else {
                out.read(&self.stream, n * rows)
            }
        };
        let rounding = if glu { BF16_STEP } else { 0.0 };
        for n in [1, GEMV_MAX_ROWS] {
            let want = product(GemvPick::DEFAULT, n)?;
            for (variant, v) in GEMV_VARIANTS.iter().enumerate() {
                if disagree.contains(&variant) || !self.gemm.gemv_usable(v, n, cols, false) {
                    continue;
                }
                if !agrees(
                    &product(GemvPick { variant, ahead: 0 }, n)?,
                    &want,
                    rounding,
                ) {
                    disagree.push(variant);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_product_agrees_to_summation_order_and_never_with_nan_or_another_length() {
        let want = [100.0f32, -3.0, 0.5];
        assert!(agrees(&want, &want, 0.0));
        assert!(
            agrees(&[100.05, -3.0, 0.5], &want, 0.0),
            "5e-4 of the largest value"
        );
        assert!(!agrees(&[100.0, -3.2, 0.5], &want, 0.0));
        assert!(
            agrees_within(&[100.0, -3.2, 0.5], &want, 0.05, 0.0),
            "within 5% of the largest value"
        );
        assert!(!agrees_within(&[100.0, -9.0, 0.5], &want, 0.05, 0.0));
        assert!(!agrees(&[f32::NAN, -3.0, 0.5], &want, 0.0));
        assert!(!agrees(&want[..2], &want, 0.0));
        assert!(agrees(&[0.0; 3], &[0.0; 3], 0.0), "all zeros");
    }

    #[test]
    fn a_bf16_output_may_also_be_one_rounding_step_off_in_each_value() {
        // 0.5 and its bf16 neighbour above: sums a hair apart rounded to either side.
        let want = [100.0f32, 0.5];
        let next_up = half::bf16::from_bits(half::bf16::from_f32(0.5).to_bits() + 1).to_f32();
        assert!(!agrees(&[100.0, 0.5 - 0.2], &want, BF16_STEP));
        assert!(agrees(&[100.0, next_up], &want, BF16_STEP));
        assert!(agrees(&[100.0 + 100.0 / 128.0, 0.5], &want, BF16_STEP));
        assert!(!agrees(&[101.0 + 100.0 / 128.0, 0.5], &want, BF16_STEP));
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
