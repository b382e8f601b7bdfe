//! Quantizing a matrix's rows into block formats on the host: Q8_0 and the legacy formats
//! (ggml's reference rounding, `legacy_quantize`) and the K-quants (round to nearest,
//! `kquants_quantize`). The CUDA backend stores float matrices this way at load
//! (`--cuda-weights q8_0|q4_k`); tests build quantized models with it.

use rayon::prelude::*;

use super::kquants_quantize::{quantize_q45_k, quantize_q6_k};
use super::legacy::quantize_q8_0;
use super::legacy_quantize::{quantize_affine, quantize_symmetric};
use super::{GgmlType, QMatrix, QuantError, TensorBytes};

/// Appends the block that holds a block's worth of values.
pub(crate) type BlockQuantizer = fn(&[f32], &mut Vec<u8>);

/// The quantizer of every block format; none for the float types.
pub(crate) fn block_quantizer(dtype: GgmlType) -> Option<BlockQuantizer> {
    Some(match dtype {
        GgmlType::Q4_0 => |x, out| quantize_symmetric(x, 4, out),
        GgmlType::Q5_0 => |x, out| quantize_symmetric(x, 5, out),
        GgmlType::Q4_1 => |x, out| quantize_affine(x, 4, out),
        GgmlType::Q5_1 => |x, out| quantize_affine(x, 5, out),
        GgmlType::Q8_0 => quantize_q8_0,
        GgmlType::Q4K => |x, out| quantize_q45_k(x, false, out),
        GgmlType::Q5K => |x, out| quantize_q45_k(x, true, out),
        GgmlType::Q6K => quantize_q6_k,
        GgmlType::MXFP4 => super::mxfp4::quantize_mxfp4,
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => return None,
    })
}

impl QMatrix {
    /// This matrix's rows (of any type) quantized to the block format `dtype`.
    pub fn quantized(&self, dtype: GgmlType) -> Result<QMatrix, QuantError> {
        let encode = block_quantizer(dtype).ok_or(QuantError::NoQuantizer(dtype))?;
        let block = dtype.block_elems();
        let row_bytes = dtype.row_bytes(self.cols).ok_or(QuantError::PartialBlock {
            dtype,
            cols: self.cols,
            block,
        })?;
        let mut out = vec![0u8; self.rows * row_bytes];
        if row_bytes > 0 {
            out.par_chunks_mut(row_bytes).enumerate().for_each_init(
                || (vec![0f32; self.cols], Vec::with_capacity(row_bytes)),
                |(row, blocks), (r, dst)| {
                    self.dequantize_row(r, row);
                    blocks.clear();
                    for x in row.chunks_exact(block) {
                        encode(x, blocks);
                    }
                    dst.copy_from_slice(blocks);
                },
            );
        }
        QMatrix::new(dtype, self.rows, self.cols, TensorBytes::Owned(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::ggml_type::{QK, QK_K};

    /// Quantizes `values` (`rows` × `cols`) to `dtype`, dequantizes every row back and checks each element against `bound` of the block of `block` values it sits in.
    fn assert_quantized_within(
        dtype: GgmlType,
        (rows, cols): (usize, usize),
        values: &[f32],
        block: usize,
        bound: impl Fn(&[f32]) -> f32,
    ) {
        let m = QMatrix::from_f32(rows, cols, values).expect("f32 matrix");
        let q = m.quantized(dtype).expect("whole blocks");
        assert_eq!(
            q.bytes().len(),
            rows * cols / dtype.block_elems() * dtype.block_bytes()
        );
        let mut back = vec![0f32; cols];
        for r in 0..rows {
            q.dequantize_row(r, &mut back);
            let want_row = &values[r * cols..(r + 1) * cols];
            for (b, (got, want)) in back.chunks(block).zip(want_row.chunks(block)).enumerate() {
                let limit = bound(want);
                for (g, w) in got.iter().zip(want) {
                    assert!(
                        (g - w).abs() <= limit,
                        "{dtype:?} row {r} block {b}: {g} for {w} (limit {limit})"
                    );
                }
            }
        }
    }

    #[test]
    fn float_rows_quantized_to_q8_0_come_back_within_half_a_step() {
        let (rows, cols) = (3usize, 96usize);
        let values: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * (1 + i % 5) as f32)
            .collect();
        assert_quantized_within(GgmlType::Q8_0, (rows, cols), &values, QK, |want| {
            let step = want.iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0;
            // Half a step, plus the f16 rounding of the step itself.
            step * 0.6
        });
    }

    #[test]
    fn float_rows_quantized_to_q4_k_come_back_within_a_step_of_their_super_block() {
        let (rows, cols) = (2usize, 512usize);
        let values: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * (1 + i / 32 % 5) as f32)
            .collect();
        assert_quantized_within(GgmlType::Q4K, (rows, cols), &values, QK_K, |want| {
            // A step of the super-block's widest group, and its largest min's 6-bit step
            // (each group's scale and min are rounded to 6 bits of the super-block's).
            let (step, min_step) = want.chunks(QK).fold((0f32, 0f32), |(s, m), g| {
                let lo = g.iter().copied().fold(0f32, f32::min);
                let hi = g.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                (s.max((hi - lo) / 15.0), m.max(-lo / 63.0))
            });
            0.75 * step + min_step
        });
    }

    #[test]
    fn only_block_formats_are_quantized_to_and_only_whole_blocks() {
        let m = QMatrix::from_f32(1, 32, &[0.5; 32]).expect("f32 matrix");
        assert!(matches!(
            m.quantized(GgmlType::F16),
            Err(QuantError::NoQuantizer(GgmlType::F16))
        ));
        assert!(m.quantized(GgmlType::Q4_0).is_ok());
        assert!(matches!(
            m.quantized(GgmlType::Q4K),
            Err(QuantError::PartialBlock { .. })
        ));
    }
}
