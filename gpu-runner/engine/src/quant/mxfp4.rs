//! MXFP4 (ggml type 39), the OCP microscaling format gpt-oss ships its experts in: a block
//! of 32 weights is one E8M0 scale byte `e`, then 16 bytes of 4-bit E2M1 codes; element `j`
//! is the low nibble of byte `j` and element `j + 16` its high nibble (ggml's
//! `block_mxfp4`, the same nibble order as Q4_0). Weight = `KVALUES[code] · 2^(e − 128)`:
//! the table holds twice each E2M1 value, so it is integer, and the scale halves it back.
//!
//! Products round the activations to [`BlockQ8_1`] as ggml's (Q8_0) do, and sum
//! `KVALUES[code] · q` exactly in integers (the x86 row and tile kernels are the affine
//! formats', codes shuffled to `KVALUES + OFFSET`); a matrix can keep its activations in f32 instead
//! (`Activations::F32`), which the HF layout's loader asks for (see `model::mxfp4`).

use super::act::BlockQ8_1;
use super::ggml_type::QK;

/// Twice the E2M1 value of each 4-bit code (ggml's `kvalues_mxfp4`).
pub(crate) const KVALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// What the x86 kernels add to [`KVALUES`] so that their lanes are unsigned (0..=24); the
/// offset's share, `−OFFSET · Σx`, meets the activation block's sum.
pub(crate) const OFFSET: i8 = 12;

/// [`KVALUES`] + [`OFFSET`], the table the x86 kernels shuffle codes through.
pub(crate) const KVALUES_UNSIGNED: [u8; 16] = {
    let mut t = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = (KVALUES[i] + OFFSET) as u8;
        i += 1;
    }
    t
};

/// Bytes of one block: the scale, then the codes.
pub(crate) const BLOCK_BYTES: usize = 1 + QK / 2;

/// `2^(e − 128)`, the factor that turns a block's [`KVALUES`] into weights (ggml's
/// `GGML_E8M0_TO_FP32_HALF`): built from its bits, exact for every byte (`e` 0 and 1 are
/// subnormal; 255 is 2^127).
#[inline(always)]
pub(crate) fn half_scale(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        (e as u32 - 1) << 23
    };
    f32::from_bits(bits)
}

/// The 32 codes of a block's 16 bytes, in element order.
#[inline(always)]
fn codes(qs: &[u8]) -> impl Iterator<Item = u8> + '_ {
    let low = qs.iter().map(|b| b & 0x0F);
    low.chain(qs.iter().map(|b| b >> 4))
}

/// Dequantises whole blocks from `bytes` into `out`, stopping at whichever runs out first.
pub(crate) fn dequantize_mxfp4_blocks(bytes: &[u8], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if super::formats::has_avx2() {
        return super::avx2::mxfp4_to_f32(bytes, out);
    }
    for (block, o) in bytes
        .chunks_exact(BLOCK_BYTES)
        .zip(out.chunks_exact_mut(QK))
    {
        dequantize_mxfp4(block, o);
    }
}

pub(crate) fn dequantize_mxfp4(block: &[u8], out: &mut [f32]) {
    let d = half_scale(block[0]);
    for (o, c) in out.iter_mut().zip(codes(&block[1..BLOCK_BYTES])) {
        *o = KVALUES[c as usize] as f32 * d;
    }
}

/// One block against one activation block: `2^(e − 128) · d_x · Σ KVALUES[code] · q`.
pub(crate) fn dot_mxfp4(block: &[u8], a: &BlockQ8_1) -> f32 {
    let sumi: i32 = codes(&block[1..BLOCK_BYTES])
        .zip(&a.qs)
        .map(|(c, &q)| KVALUES[c as usize] as i32 * q as i32)
        .sum();
    half_scale(block[0]) * a.d * sumi as f32
}

/// Appends the MXFP4 block nearest `x` (32 values), as ggml's reference quantizer picks its
/// scale: `e = ⌊log2 max|x|⌋ − 2 + 127`, which puts the largest value near the table's
/// top (±6 in E2M1), then each code the nearest table entry.
pub(crate) fn quantize_mxfp4(x: &[f32], out: &mut Vec<u8>) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let e = if amax > 0.0 && amax.is_finite() {
        (amax.log2().floor() - 2.0 + 127.0).clamp(0.0, 255.0) as u8
    } else {
        0
    };
    let inv = 1.0 / half_scale(e);
    let nearest = |v: f32| {
        let target = v * inv;
        (0..16u8)
            .min_by(|&a, &b| {
                let da = (KVALUES[a as usize] as f32 - target).abs();
                let db = (KVALUES[b as usize] as f32 - target).abs();
                da.total_cmp(&db)
            })
            .unwrap_or(0)
    };
    out.push(e);
    out.extend((0..QK / 2).map(|j| nearest(x[j]) | (nearest(x[j + QK / 2]) << 4)));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// E2M1's values, by code, as the OCP spec lists them.
    const E2M1: [f32; 16] = [
        0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0,
    ];

    /// A block whose byte `j` holds code `j` low and `15 − j` high.
    fn block(e: u8) -> Vec<u8> {
        let mut b = vec![e];
        b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        b
    }

    #[test]
    fn a_block_dequantises_to_the_e2m1_table_times_its_power_of_two() {
        for e in [0u8, 1, 2, 60, 119, 127, 128, 143, 200, 254] {
            let mut got = [f32::NAN; 32];
            dequantize_mxfp4(&block(e), &mut got);
            let scale = 2f64.powi(e as i32 - 127);
            // (At e = 254, ±6 · 2^127 overflows f32 to ±∞, as in ggml.)
            let weight = |code: usize| (E2M1[code] as f64 * scale) as f32;
            for j in 0..16 {
                assert_eq!(got[j], weight(j), "e {e} element {j}");
                assert_eq!(got[j + 16], weight(15 - j), "e {e} element {}", j + 16);
            }
        }
    }

    #[test]
    fn the_half_scale_is_exact_for_every_byte() {
        for e in 0..=255u8 {
            assert_eq!(half_scale(e) as f64, 2f64.powi(e as i32 - 128), "e {e}");
        }
    }

    #[test]
    fn the_scalar_dot_is_the_exact_sum_over_dequantised_weights() {
        let x: Vec<f32> = (0..32).map(|i| (i as f32 - 15.5) / 7.0).collect();
        let a = <BlockQ8_1 as crate::quant::act::ActBlock>::quantize(&x);
        for e in [100u8, 127, 131] {
            let mut w = [0f32; 32];
            dequantize_mxfp4(&block(e), &mut w);
            let want: f64 = w
                .iter()
                .zip(&a.qs)
                .map(|(&w, &q)| w as f64 * q as f64 * a.d as f64)
                .sum();
            let got = dot_mxfp4(&block(e), &a) as f64;
            assert!((got - want).abs() <= 1e-6 * want.abs().max(1e-30), "e {e}");
        }
    }

    #[test]
    fn values_on_the_grid_quantise_to_themselves() {
        let x: Vec<f32> = (0..32).map(|j| E2M1[j % 16] * 0.25).collect();
        let mut bytes = Vec::new();
        quantize_mxfp4(&x, &mut bytes);
        assert_eq!(bytes.len(), BLOCK_BYTES);
        let mut back = [f32::NAN; 32];
        dequantize_mxfp4(&bytes, &mut back);
        assert_eq!(back.as_slice(), x.as_slice());
    }
}
