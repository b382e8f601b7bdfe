//! MXFP4 (the OCP microscaling format gpt-oss ships its experts in) widened to BF16 at
//! load, exactly. A block of 32 weights is 16 bytes of E2M1 codes, two a byte (low nibble
//! first), and one E8M0 scale byte `s`: weight = `E2M1[code] · 2^(s − 127)`, which has at
//! most two significant bits, so BF16 holds it exactly.
//!
//! Why BF16 and not Q8_0, which could hold the same weights (twice each E2M1 value is an
//! integer, and `d = 2^(s − 128)`) in half the bytes: the CPU's Q8_0 product rounds the
//! activations to 8 bits as well, and on the tiny gpt-oss fixture that moved logits by up
//! to 2.0 from transformers (BF16: 5e-5). BF16 costs four times MXFP4's memory; a product
//! over MXFP4 itself is the way to serve the large checkpoints.

use half::bf16;

use crate::quant::{GgmlType, QMatrix, QuantError, TensorBytes};

/// Twice the E2M1 value of each 4-bit code (integers, so the table is exact).
const TWICE_E2M1: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// Weights per MXFP4 block.
pub(super) const BLOCK: usize = 32;
/// Bytes of codes per block.
pub(super) const BLOCK_BYTES: usize = BLOCK / 2;

/// A `[rows.len(), cols]` BF16 matrix of the MXFP4 rows `rows` (indices into `blocks`
/// `[.., cols / 32, 16]` and `scales` `[.., cols / 32]`).
pub(super) fn matrix(
    blocks: &[u8],
    scales: &[u8],
    rows: &[usize],
    cols: usize,
) -> Result<QMatrix, QuantError> {
    let per_row = cols / BLOCK;
    let mut out = Vec::with_capacity(rows.len() * cols * 2);
    for &r in rows {
        let row_scales = &scales[r * per_row..(r + 1) * per_row];
        let row_codes = &blocks[r * per_row * BLOCK_BYTES..(r + 1) * per_row * BLOCK_BYTES];
        for (&s, codes) in row_scales.iter().zip(row_codes.chunks_exact(BLOCK_BYTES)) {
            let half_scale = (s as f32 - 128.0).exp2();
            for &byte in codes {
                for code in [byte & 0x0F, byte >> 4] {
                    let v = TWICE_E2M1[code as usize] as f32 * half_scale;
                    out.extend_from_slice(&bf16::from_f32(v).to_le_bytes());
                }
            }
        }
    }
    QMatrix::new(GgmlType::BF16, rows.len(), cols, TensorBytes::Owned(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One row of one block: codes 0..15 then 15..0, low nibble first.
    fn one_block() -> Vec<u8> {
        (0..16u8).map(|i| (i % 16) | ((15 - i % 16) << 4)).collect()
    }

    fn decoded(scale: u8) -> Vec<f32> {
        let e2m1 = [
            0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
        ];
        let s = (scale as f32 - 127.0).exp2();
        (0..16)
            .flat_map(|i| [e2m1[i] * s, e2m1[15 - i] * s])
            .collect()
    }

    #[test]
    fn mxfp4_becomes_bf16_holding_exactly_the_same_weights() {
        for scale in [1u8, 60, 104, 123, 127, 143, 200, 254] {
            let m = matrix(&one_block(), &[scale], &[0], 32).expect("matrix");
            assert_eq!(m.dtype, GgmlType::BF16);
            assert_eq!(m.dequantize_all(), decoded(scale), "scale {scale}");
        }
    }

    #[test]
    fn only_the_chosen_rows_are_taken_in_their_order() {
        let blocks: Vec<u8> = [one_block(), vec![0x22; 16]].concat();
        let m = matrix(&blocks, &[127, 128], &[1, 0], 32).expect("matrix");
        let all = m.dequantize_all();
        assert!(all[..32].iter().all(|&v| v == 2.0), "{:?}", &all[..32]);
        assert_eq!(&all[32..], decoded(127).as_slice());
    }
}
