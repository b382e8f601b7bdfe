//! Encoding floats as the legacy 32-element blocks Q4_0, Q4_1, Q5_0 and Q5_1 (layouts in
//! `legacy.rs`), as ggml's reference quantizers do: the symmetric formats scale the block's
//! signed extreme to the most negative quant, the affine ones map its min..max range onto
//! the quants; each value rounded to the nearest. `QMatrix::quantized` (quantize.rs) encodes
//! rows with them; the tests build legacy matrices with them.

use super::kquants_quantize::put_f16;

/// Packs 32 quants (< 2^bits): low nibbles as Q4 `qs`, fifth bits (if any) as `qh` first.
fn pack_legacy(q: &[u8; 32], bits: u32, out: &mut Vec<u8>) {
    if bits == 5 {
        let qh: u32 = (0..32).map(|j| (((q[j] >> 4) & 1) as u32) << j).sum();
        out.extend(qh.to_le_bytes());
    }
    out.extend((0..16).map(|j| (q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4)));
}

/// Q4_0 / Q5_0: `x ≈ d·(q − 2^(bits−1))`, with `d` chosen so the signed extreme maps to the
/// most negative quant (as ggml does).
pub(crate) fn quantize_symmetric(x: &[f32], bits: u32, out: &mut Vec<u8>) {
    let half = (1 << (bits - 1)) as f32;
    let max = x
        .iter()
        .copied()
        .fold(0f32, |m, v| if v.abs() > m.abs() { v } else { m });
    let d = max / -half;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let top = (1u32 << bits) - 1;
    let q: [u8; 32] = std::array::from_fn(|j| ((x[j] * id + half + 0.5) as u32).min(top) as u8);
    put_f16(out, d);
    pack_legacy(&q, bits, out);
}

/// Q4_1 / Q5_1: `x ≈ d·q + m` over the block's range.
pub(crate) fn quantize_affine(x: &[f32], bits: u32, out: &mut Vec<u8>) {
    let min = x.iter().copied().fold(f32::INFINITY, f32::min);
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let top = (1u32 << bits) - 1;
    let d = (max - min) / top as f32;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let q: [u8; 32] = std::array::from_fn(|j| (((x[j] - min) * id + 0.5) as u32).min(top) as u8);
    put_f16(out, d);
    put_f16(out, min);
    pack_legacy(&q, bits, out);
}
