//! The 32-element block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0): byte layouts,
//! dequantisation, and integer dot products against quantized activations.
//!
//! Layouts (all little-endian, f16 scales):
//! - Q4_0 `[d][qs;16]`: element `j` is the low nibble of `qs[j]`, element `j+16` the high
//!   nibble; value `d·(q−8)`.
//! - Q4_1 `[d][m][qs;16]`: same nibbles, value `d·q + m`.
//! - Q5_0 `[d][qh:u32][qs;16]`: bit `j` of `qh` is the fifth bit of element `j`; value `d·(q−16)`.
//! - Q5_1 `[d][m][qh:u32][qs;16]`: value `d·q + m`.
//! - Q8_0 `[d][qs:i8;32]`: value `d·q`.

use super::act::BlockQ8_1;
use super::float::f16_at;
use super::ggml_type::QK;

/// Unpacks the 32 4-bit quants of a Q4 block (bytes `qs`) into `0..16` values.
#[inline(always)]
pub(crate) fn unpack_nibbles(qs: &[u8]) -> [u8; QK] {
    let mut q = [0u8; QK];
    for j in 0..QK / 2 {
        q[j] = qs[j] & 0x0F;
        q[j + QK / 2] = qs[j] >> 4;
    }
    q
}

/// Unpacks the 32 5-bit quants of a Q5 block (`qh` high bits, `qs` nibbles) into `0..32`.
#[inline(always)]
pub(crate) fn unpack_q5(qh: &[u8], qs: &[u8]) -> [u8; QK] {
    let high = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    let mut q = unpack_nibbles(qs);
    for (j, v) in q.iter_mut().enumerate() {
        *v |= (((high >> j) & 1) as u8) << 4;
    }
    q
}

pub(crate) fn dequantize_q4_0(block: &[u8], out: &mut [f32]) {
    let d = f16_at(block, 0);
    for (o, q) in out.iter_mut().zip(unpack_nibbles(&block[2..18])) {
        *o = d * (q as i32 - 8) as f32;
    }
}

pub(crate) fn dequantize_q4_1(block: &[u8], out: &mut [f32]) {
    let (d, m) = (f16_at(block, 0), f16_at(block, 2));
    for (o, q) in out.iter_mut().zip(unpack_nibbles(&block[4..20])) {
        *o = d * q as f32 + m;
    }
}

pub(crate) fn dequantize_q5_0(block: &[u8], out: &mut [f32]) {
    let d = f16_at(block, 0);
    for (o, q) in out.iter_mut().zip(unpack_q5(&block[2..6], &block[6..22])) {
        *o = d * (q as i32 - 16) as f32;
    }
}

pub(crate) fn dequantize_q5_1(block: &[u8], out: &mut [f32]) {
    let (d, m) = (f16_at(block, 0), f16_at(block, 2));
    for (o, q) in out.iter_mut().zip(unpack_q5(&block[4..8], &block[8..24])) {
        *o = d * q as f32 + m;
    }
}

pub(crate) fn dequantize_q8_0(block: &[u8], out: &mut [f32]) {
    let d = f16_at(block, 0);
    for (o, &q) in out.iter_mut().zip(&block[2..34]) {
        *o = d * (q as i8) as f32;
    }
}

/// Appends the Q8_0 block of 32 values `x` (ggml's reference quantizer: `d = max|x|/127`,
/// quants rounded to nearest).
pub(crate) fn quantize_q8_0(x: &[f32], out: &mut Vec<u8>) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    out.extend_from_slice(&half::f16::from_f32(d).to_le_bytes());
    out.extend(x.iter().map(|v| (v * id).round() as i8 as u8));
}

/// Σ over 32 lanes of `w[i]·a[i]` with `w` given as unsigned quants and an offset.
#[inline(always)]
fn idot(w: &[u8; QK], offset: i32, a: &[i8; QK]) -> i32 {
    w.iter()
        .zip(a)
        .map(|(&q, &x)| (q as i32 - offset) * x as i32)
        .sum()
}

pub(crate) fn dot_q4_0(block: &[u8], a: &BlockQ8_1) -> f32 {
    let sumi = idot(&unpack_nibbles(&block[2..18]), 8, &a.qs);
    f16_at(block, 0) * a.d * sumi as f32
}

/// Q4_1 against Q8_1: `Σ(d·q+m)(da·x) = d·da·Σq·x + m·(da·Σx)`, the last factor precomputed.
pub(crate) fn dot_q4_1(block: &[u8], a: &BlockQ8_1) -> f32 {
    let sumi = idot(&unpack_nibbles(&block[4..20]), 0, &a.qs);
    f16_at(block, 0) * a.d * sumi as f32 + f16_at(block, 2) * a.s
}

pub(crate) fn dot_q5_0(block: &[u8], a: &BlockQ8_1) -> f32 {
    let sumi = idot(&unpack_q5(&block[2..6], &block[6..22]), 16, &a.qs);
    f16_at(block, 0) * a.d * sumi as f32
}

pub(crate) fn dot_q5_1(block: &[u8], a: &BlockQ8_1) -> f32 {
    let sumi = idot(&unpack_q5(&block[4..8], &block[8..24]), 0, &a.qs);
    f16_at(block, 0) * a.d * sumi as f32 + f16_at(block, 2) * a.s
}

pub(crate) fn dot_q8_0(block: &[u8], a: &BlockQ8_1) -> f32 {
    let sumi: i32 = block[2..34]
        .iter()
        .zip(&a.qs)
        .map(|(&q, &x)| (q as i8) as i32 * x as i32)
        .sum();
    f16_at(block, 0) * a.d * sumi as f32
}
