//! Quantized activations: each matrix product quantizes its f32 input once into the block
//! type its weight format's integer dot product expects.
//!
//! - [`BlockQ8_1`] (32 × i8, a scale and `s = d·Σq`) for every 32-element format: the SIMD
//!   kernels treat all of them as `d·u + m` with unsigned lanes `u` (Q4_0's `m` is `−8d`,
//!   and so on), and the offset `m` multiplies Σx.
//! - [`BlockQ8K`] (256 × i8, a scale, and sums per 16) for the K-quants, whose per-32 mins
//!   multiply partial sums.
//!
//! Scales are kept as f32 (ggml stores f16): these blocks live only in memory, and f32
//! saves a conversion per block in the inner loop. Quants are symmetric in −127..=127 so
//! SIMD kernels may take absolute values without overflow.

use super::ggml_type::{QK, QK_K};

#[derive(Clone, Copy, Debug, Default)]
#[repr(C)]
pub(crate) struct BlockQ8_1 {
    pub qs: [i8; QK],
    pub d: f32,
    /// `d · Σ qs`, i.e. the block's sum as the dot product sees it.
    pub s: f32,
    /// `Σ qs`: lets the interleaved kernels of the symmetric formats, whose quants they
    /// store with an offset, start each integer sum at the offset's share (`−offset·Σqs`)
    /// instead of correcting in floating point.
    pub sum: i32,
}

#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub(crate) struct BlockQ8K {
    pub qs: [i8; QK_K],
    pub d: f32,
    /// Σ of each group of 16 quants.
    pub bsums: [i16; QK_K / 16],
}

impl Default for BlockQ8K {
    fn default() -> Self {
        BlockQ8K {
            qs: [0; QK_K],
            d: 0.0,
            bsums: [0; QK_K / 16],
        }
    }
}

/// Symmetric 8-bit quantisation of `x` into `qs`; returns the scale `d` with `x ≈ d·q`.
/// Ties round to even so that the SIMD version (which rounds that way natively) gives
/// bit-identical blocks.
#[inline]
fn quantize_symmetric(x: &[f32], qs: &mut [i8]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if super::formats::has_avx2() {
        return super::avx2::quantize_symmetric(x, qs);
    }
    quantize_symmetric_scalar(x, qs)
}

pub(crate) fn quantize_symmetric_scalar(x: &[f32], qs: &mut [i8]) -> f32 {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    if amax == 0.0 || !amax.is_finite() {
        qs.fill(0);
        return 0.0;
    }
    let d = amax / 127.0;
    let id = 1.0 / d;
    for (q, &v) in qs.iter_mut().zip(x) {
        *q = (v * id).round_ties_even().clamp(-127.0, 127.0) as i8;
    }
    d
}

/// A type that activations can be quantized into, one block per `ELEMS` inputs.
pub(crate) trait ActBlock: Copy + Default + Send + Sync {
    const ELEMS: usize;
    fn quantize(x: &[f32]) -> Self;
}

impl ActBlock for BlockQ8_1 {
    const ELEMS: usize = QK;
    fn quantize(x: &[f32]) -> Self {
        let mut b = BlockQ8_1::default();
        b.d = quantize_symmetric(x, &mut b.qs);
        b.sum = b.qs.iter().map(|&q| q as i32).sum();
        b.s = b.d * b.sum as f32;
        b
    }
}

impl ActBlock for BlockQ8K {
    const ELEMS: usize = QK_K;
    fn quantize(x: &[f32]) -> Self {
        let mut b = BlockQ8K::default();
        b.d = quantize_symmetric(x, &mut b.qs);
        for (s, g) in b.bsums.iter_mut().zip(b.qs.chunks_exact(16)) {
            *s = g.iter().map(|&q| q as i16).sum();
        }
        b
    }
}
