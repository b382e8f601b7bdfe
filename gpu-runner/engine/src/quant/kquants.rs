//! The 256-element "K-quant" super-block formats (Q4_K, Q5_K, Q6_K): byte layouts,
//! dequantisation, and integer dot products against [`BlockQ8K`] activations.
//!
//! Layouts (little-endian, f16 scales):
//! - Q4_K `[d][dmin][scales;12][qs;128]`: eight groups of 32, each with a 6-bit scale and
//!   6-bit min packed in `scales`; value `d·sc·q − dmin·m`. Group `2c` is the low nibbles of
//!   `qs[32c..32c+32]`, group `2c+1` the high nibbles.
//! - Q5_K `[d][dmin][scales;12][qh;32][qs;128]`: as Q4_K, plus bit `g` of `qh[l]` is the fifth
//!   bit of element `l` of group `g`.
//! - Q6_K `[ql;128][qh;64][scales:i8;16][d]`: sixteen groups of 16 with signed 8-bit scales;
//!   value `d·sc·(q−32)`, quants split into low nibbles (`ql`) and 2 high bits (`qh`).

use super::act::BlockQ8K;
use super::float::f16_at;
use super::ggml_type::QK_K;

/// The 6-bit scale and min of group `j` (0..8) from the 12 packed bytes: groups 0..4 keep
/// theirs in the low 6 bits of bytes `j` and `j+4`; groups 4..8 split theirs between a
/// nibble of byte `j+4` and the top 2 bits of bytes `j−4` and `j`.
#[inline(always)]
pub(crate) fn scale_min_k4(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// Quants (0..32) of a Q4_K (`qh = None`) or Q5_K block, in element order.
#[inline(always)]
pub(crate) fn unpack_q45k(qs: &[u8], qh: Option<&[u8]>) -> [u8; QK_K] {
    let mut q = [0u8; QK_K];
    for c in 0..4 {
        for l in 0..32 {
            let byte = qs[c * 32 + l];
            q[c * 64 + l] = byte & 0x0F;
            q[c * 64 + 32 + l] = byte >> 4;
        }
    }
    if let Some(qh) = qh {
        for g in 0..8 {
            for l in 0..32 {
                q[g * 32 + l] |= ((qh[l] >> g) & 1) << 4;
            }
        }
    }
    q
}

/// Quants (−32..32) of a Q6_K block, in element order.
#[inline(always)]
pub(crate) fn unpack_q6k(block: &[u8]) -> [i8; QK_K] {
    let (ql, qh) = (&block[0..128], &block[128..192]);
    let mut q = [0i8; QK_K];
    for half in 0..2 {
        let (ql, qh, out) = (&ql[half * 64..], &qh[half * 32..], &mut q[half * 128..]);
        for l in 0..32 {
            let h = qh[l];
            out[l] = ((ql[l] & 0x0F) | ((h & 3) << 4)) as i8 - 32;
            out[l + 32] = ((ql[l + 32] & 0x0F) | (((h >> 2) & 3) << 4)) as i8 - 32;
            out[l + 64] = ((ql[l] >> 4) | (((h >> 4) & 3) << 4)) as i8 - 32;
            out[l + 96] = ((ql[l + 32] >> 4) | (((h >> 6) & 3) << 4)) as i8 - 32;
        }
    }
    q
}

fn dequantize_q45k(block: &[u8], qh: Option<&[u8]>, qs: &[u8], out: &mut [f32]) {
    let (d, dmin) = (f16_at(block, 0), f16_at(block, 2));
    let scales = &block[4..16];
    let q = unpack_q45k(qs, qh);
    for g in 0..8 {
        let (sc, m) = scale_min_k4(g, scales);
        let (dg, mg) = (d * sc as f32, dmin * m as f32);
        for l in 0..32 {
            out[g * 32 + l] = dg * q[g * 32 + l] as f32 - mg;
        }
    }
}

pub(crate) fn dequantize_q4_k(block: &[u8], out: &mut [f32]) {
    dequantize_q45k(block, None, &block[16..144], out);
}

pub(crate) fn dequantize_q5_k(block: &[u8], out: &mut [f32]) {
    dequantize_q45k(block, Some(&block[16..48]), &block[48..176], out);
}

pub(crate) fn dequantize_q6_k(block: &[u8], out: &mut [f32]) {
    let d = f16_at(block, 208);
    let q = unpack_q6k(block);
    for (i, o) in out.iter_mut().enumerate().take(QK_K) {
        *o = d * (block[192 + i / 16] as i8) as f32 * q[i] as f32;
    }
}

fn dot_q45k(block: &[u8], qh: Option<&[u8]>, qs: &[u8], a: &BlockQ8K) -> f32 {
    let scales = &block[4..16];
    let q = unpack_q45k(qs, qh);
    let (mut sum, mut sum_min) = (0i32, 0i32);
    for g in 0..8 {
        let (sc, m) = scale_min_k4(g, scales);
        let lanes = g * 32..g * 32 + 32;
        let sumi: i32 = q[lanes.clone()]
            .iter()
            .zip(&a.qs[lanes])
            .map(|(&w, &x)| w as i32 * x as i32)
            .sum();
        sum += sc as i32 * sumi;
        sum_min += m as i32 * (a.bsums[2 * g] as i32 + a.bsums[2 * g + 1] as i32);
    }
    a.d * (f16_at(block, 0) * sum as f32 - f16_at(block, 2) * sum_min as f32)
}

pub(crate) fn dot_q4_k(block: &[u8], a: &BlockQ8K) -> f32 {
    dot_q45k(block, None, &block[16..144], a)
}

pub(crate) fn dot_q5_k(block: &[u8], a: &BlockQ8K) -> f32 {
    dot_q45k(block, Some(&block[16..48]), &block[48..176], a)
}

pub(crate) fn dot_q6_k(block: &[u8], a: &BlockQ8K) -> f32 {
    let q = unpack_q6k(block);
    let mut sum = 0i32;
    for g in 0..16 {
        let lanes = g * 16..g * 16 + 16;
        let sumi: i32 = q[lanes.clone()]
            .iter()
            .zip(&a.qs[lanes])
            .map(|(&w, &x)| w as i32 * x as i32)
            .sum();
        sum += (block[192 + g] as i8) as i32 * sumi;
    }
    a.d * f16_at(block, 208) * sum as f32
}
