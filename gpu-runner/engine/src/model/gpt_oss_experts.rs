//! gpt-oss's experts as transformers stores them, turned into Fallow's layout. transformers
//! keeps them for `x · W`: `gate_up_proj` `[n_experts, hidden, 2 × ffn]` with gate and up in
//! alternate columns (gate even, up odd), `down_proj` `[n_experts, ffn, hidden]`, and
//! `gate_up_proj_bias` `[n_experts, 2 × ffn]` alternating the same way. Fallow's matrices
//! are `[out, in]` rows, so each expert's slab is transposed (and gate and up pulled apart)
//! once at load, in its own float type: an owned copy, where the other layouts are views.
//!
//! The published checkpoints hold the experts in MXFP4 instead (`gate_up_proj_blocks`
//! `[n_experts, 2 × ffn, hidden / 32, 16]` and `_scales`, `down_proj_blocks`
//! `[n_experts, hidden, ffn / 32, 16]`): already `[out, in]`, gate and up in alternate rows.
//! Those are repacked into ggml's MXFP4 blocks, the same size ([`super::mxfp4`]).

use crate::quant::{QMatrix, TensorBytes};

use super::mxfp4;
use super::weights::{DenseFfn, TensorSource};
use super::ModelError;

/// Whether the experts are stored as MXFP4 blocks under `gate_up_name`.
pub(super) fn has_mxfp4(src: &dyn TensorSource, gate_up_name: &str) -> bool {
    src.has(&format!("{gate_up_name}_blocks"))
}

/// Every expert's gate, up and down matrices from the two transposed tensors (or their
/// MXFP4 blocks).
pub(super) fn experts(
    src: &dyn TensorSource,
    gate_up_name: &str,
    down_name: &str,
    (experts, ffn, hidden): (usize, usize, usize),
) -> Result<Vec<DenseFfn>, ModelError> {
    if has_mxfp4(src, gate_up_name) {
        return mxfp4_experts(src, gate_up_name, down_name, (experts, ffn, hidden));
    }
    let gate_up = Slabs::read(src, gate_up_name, experts, hidden, 2 * ffn)?;
    let down = Slabs::read(src, down_name, experts, ffn, hidden)?;
    (0..experts)
        .map(|e| {
            Ok(DenseFfn {
                gate: gate_up.transposed(e, |j| 2 * j, ffn)?,
                up: gate_up.transposed(e, |j| 2 * j + 1, ffn)?,
                down: down.transposed(e, |j| j, hidden)?,
            })
        })
        .collect()
}

fn mxfp4_experts(
    src: &dyn TensorSource,
    gate_up_name: &str,
    down_name: &str,
    (experts, ffn, hidden): (usize, usize, usize),
) -> Result<Vec<DenseFfn>, ModelError> {
    let gate_up = Mxfp4Tensor::read(src, gate_up_name, experts, 2 * ffn, hidden)?;
    let down = Mxfp4Tensor::read(src, down_name, experts, hidden, ffn)?;
    (0..experts)
        .map(|e| {
            let first = e * 2 * ffn;
            let gate: Vec<usize> = (0..ffn).map(|j| first + 2 * j).collect();
            let up: Vec<usize> = (0..ffn).map(|j| first + 2 * j + 1).collect();
            let down_rows: Vec<usize> = (e * hidden..(e + 1) * hidden).collect();
            Ok(DenseFfn {
                gate: gate_up.matrix(&gate)?,
                up: gate_up.matrix(&up)?,
                down: down.matrix(&down_rows)?,
            })
        })
        .collect()
}

/// A `[slabs, rows, cols]` weight as MXFP4 `{name}_blocks` and `{name}_scales`.
struct Mxfp4Tensor<'a> {
    name: String,
    blocks: &'a [u8],
    scales: &'a [u8],
    cols: usize,
}

impl<'a> Mxfp4Tensor<'a> {
    fn read(
        src: &'a dyn TensorSource,
        name: &str,
        slabs: usize,
        rows: usize,
        cols: usize,
    ) -> Result<Self, ModelError> {
        let (blocks_name, scales_name) = (format!("{name}_blocks"), format!("{name}_scales"));
        let (block_shape, blocks) = src.bytes_u8(&blocks_name)?;
        let (scale_shape, scales) = src.bytes_u8(&scales_name)?;
        let groups = cols / mxfp4::BLOCK;
        let want_blocks = [slabs, rows, groups, mxfp4::BLOCK_BYTES];
        if !cols.is_multiple_of(mxfp4::BLOCK) || block_shape != want_blocks {
            return Err(ModelError::Shape {
                name: blocks_name,
                found: block_shape.to_vec(),
                expected: want_blocks.to_vec(),
            });
        }
        if scale_shape != [slabs, rows, groups] {
            return Err(ModelError::Shape {
                name: scales_name,
                found: scale_shape.to_vec(),
                expected: vec![slabs, rows, groups],
            });
        }
        Ok(Mxfp4Tensor {
            name: blocks_name,
            blocks,
            scales,
            cols,
        })
    }

    /// The rows `rows` (counted over all slabs) as one matrix.
    fn matrix(&self, rows: &[usize]) -> Result<QMatrix, ModelError> {
        mxfp4::matrix(self.blocks, self.scales, rows, self.cols).map_err(|e| ModelError::Tensor {
            name: self.name.clone(),
            why: e.to_string(),
        })
    }
}

/// Gate and up biases (`n_experts × ffn` each) from their alternating columns.
pub(super) fn split_gate_up_bias(interleaved: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let gate = interleaved.iter().step_by(2).copied().collect();
    let up = interleaved.iter().skip(1).step_by(2).copied().collect();
    (gate, up)
}

/// A 3-D float tensor `[slabs, rows, cols]` as one `[slabs × rows, cols]` matrix.
struct Slabs {
    name: String,
    m: QMatrix,
    rows: usize,
    /// Bytes per element (F32 4, F16 and BF16 2).
    elem: usize,
}

impl Slabs {
    fn read(
        src: &dyn TensorSource,
        name: &str,
        slabs: usize,
        rows: usize,
        cols: usize,
    ) -> Result<Self, ModelError> {
        let (m, found) = src.stacked(name)?;
        if found != slabs || m.rows != slabs * rows || m.cols != cols {
            return Err(ModelError::Shape {
                name: name.into(),
                found: vec![found, m.rows / found.max(1), m.cols],
                expected: vec![slabs, rows, cols],
            });
        }
        let elem = match (m.dtype.block_elems(), m.dtype.row_bytes(1)) {
            (1, Some(bytes)) => bytes,
            _ => {
                return Err(ModelError::Tensor {
                    name: name.into(),
                    why: format!("{} experts cannot be transposed", m.dtype.name()),
                })
            }
        };
        Ok(Slabs {
            name: name.into(),
            m,
            rows,
            elem,
        })
    }

    /// Slab `slab` transposed: output row `j` is the slab's column `column(j)`, for
    /// `j < out_rows`; every output row has the slab's `rows` elements.
    fn transposed(
        &self,
        slab: usize,
        column: impl Fn(usize) -> usize,
        out_rows: usize,
    ) -> Result<QMatrix, ModelError> {
        let (rows, cols, elem) = (self.rows, self.m.cols, self.elem);
        let bytes = self.m.bytes();
        let base = slab * rows * cols * elem;
        let mut out = Vec::with_capacity(out_rows * rows * elem);
        for j in 0..out_rows {
            let c = column(j);
            for r in 0..rows {
                let at = base + (r * cols + c) * elem;
                out.extend_from_slice(&bytes[at..at + elem]);
            }
        }
        QMatrix::new(self.m.dtype, out_rows, rows, TensorBytes::Owned(out)).map_err(|e| {
            ModelError::Tensor {
                name: self.name.clone(),
                why: e.to_string(),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alternating_bias_columns_split_into_gate_and_up() {
        let (gate, up) = split_gate_up_bias(&[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
        assert_eq!(gate, [0.0, 2.0, 4.0]);
        assert_eq!(up, [1.0, 3.0, 5.0]);
    }

    #[test]
    fn a_slab_is_transposed_taking_the_chosen_columns_as_rows() {
        // One slab of 2 rows × 4 columns: [[0, 1, 2, 3], [4, 5, 6, 7]].
        let values: Vec<f32> = (0..8).map(|v| v as f32).collect();
        let slabs = Slabs {
            name: "t".into(),
            m: QMatrix::from_f32(2, 4, &values).expect("matrix"),
            rows: 2,
            elem: 4,
        };
        let odd = slabs.transposed(0, |j| 2 * j + 1, 2).expect("transposed");
        assert_eq!((odd.rows, odd.cols), (2, 2));
        assert_eq!(odd.dequantize_all(), [1.0, 5.0, 3.0, 7.0]);
    }
}
