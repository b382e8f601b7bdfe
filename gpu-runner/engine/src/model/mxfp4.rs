//! gpt-oss's MXFP4 experts as the HF checkpoints store them, repacked at load into ggml's
//! MXFP4 blocks (type 39, [`crate::quant::mxfp4`]): the same 4.25 bits a weight, so the
//! experts stay the size the file holds them at. The HF layout keeps a block's 16 bytes of
//! E2M1 codes (two a byte, element `2k` in the low nibble of byte `k`) apart from its E8M0
//! scale byte `s`, weight = `E2M1[code] · 2^(s − 127)`; ggml's block is the scale byte then
//! the codes with element `j` low and `j + 16` high in byte `j`, weight =
//! `2·E2M1[code] · 2^(s − 128)`. The scale byte is the same; only the nibbles move.
//!
//! Why the repacked matrices keep their products' activations in f32
//! ([`Activations::F32`](crate::quant::Activations::F32)): transformers multiplies its own dequantisation of these weights by
//! unrounded activations, and the 8-bit activation blocks of the quantized product (ggml's,
//! which a GGUF of the same experts uses) move the tiny gpt-oss fixture's logits by up to
//! 3.8 from transformers (llama.cpp's on the GGUF: 3.75), where the exact product stays
//! within 1e-3. The f32 route dequantises 16 rows at a time: the weights still stream at
//! 4.25 bits, and one 2880 × 2880 expert product at one token took 3.8 ms against 10.6 ms
//! for the BF16 they used to be widened to (0.9 ms with int8 activations).

use crate::quant::mxfp4::BLOCK_BYTES as GGML_BLOCK_BYTES;
use crate::quant::{GgmlType, QMatrix, QuantError, TensorBytes};

/// Weights per MXFP4 block.
pub(super) const BLOCK: usize = 32;
/// Bytes of codes per block.
pub(super) const BLOCK_BYTES: usize = BLOCK / 2;

/// One HF block (`codes`, its scale `s`) as ggml's block bytes, appended to `out`.
fn repack_block(s: u8, codes: &[u8], out: &mut Vec<u8>) {
    // Element i's code: byte i / 2, low nibble for even i.
    let code = |i: usize| (codes[i / 2] >> (4 * (i % 2))) & 0x0F;
    out.push(s);
    out.extend((0..BLOCK_BYTES).map(|j| code(j) | (code(j + BLOCK_BYTES) << 4)));
}

/// A `[rows.len(), cols]` ggml MXFP4 matrix of the HF MXFP4 rows `rows` (indices into
/// `blocks` `[.., cols / 32, 16]` and `scales` `[.., cols / 32]`), its products in f32.
pub(super) fn matrix(
    blocks: &[u8],
    scales: &[u8],
    rows: &[usize],
    cols: usize,
) -> Result<QMatrix, QuantError> {
    let per_row = cols / BLOCK;
    let mut out = Vec::with_capacity(rows.len() * per_row * GGML_BLOCK_BYTES);
    for &r in rows {
        let row_scales = &scales[r * per_row..(r + 1) * per_row];
        let row_codes = &blocks[r * per_row * BLOCK_BYTES..(r + 1) * per_row * BLOCK_BYTES];
        for (&s, codes) in row_scales.iter().zip(row_codes.chunks_exact(BLOCK_BYTES)) {
            repack_block(s, codes, &mut out);
        }
    }
    let m = QMatrix::new(GgmlType::MXFP4, rows.len(), cols, TensorBytes::Owned(out))?;
    Ok(m.with_f32_activations())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::Activations;

    /// One row of one block: codes 0..15 then 15..0, low nibble first.
    fn one_block() -> Vec<u8> {
        (0..16u8).map(|i| (i % 16) | ((15 - i % 16) << 4)).collect()
    }

    /// What transformers makes of [`one_block`]: elements `2i`, `2i + 1` are codes `i`,
    /// `15 − i`.
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
    fn hf_blocks_become_ggml_mxfp4_blocks_holding_exactly_the_same_weights() {
        for scale in [1u8, 60, 104, 123, 127, 143, 200, 253] {
            let m = matrix(&one_block(), &[scale], &[0], 32).expect("matrix");
            assert_eq!(m.dtype, GgmlType::MXFP4);
            assert_eq!(m.bytes().len(), 17, "4.25 bits a weight");
            assert_eq!(m.bytes()[0], scale);
            assert_eq!(m.dequantize_all(), decoded(scale), "scale {scale}");
            assert_eq!(m.activations(), Activations::F32);
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
