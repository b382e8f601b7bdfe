//! The float element types (F32, F16, BF16): conversion to f32 and the f32 dot product
//! their matrix products use.

use half::{bf16, f16};

/// Little-endian f16 at the start of `b`.
#[inline(always)]
pub(crate) fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

pub(crate) fn dequantize_f32(bytes: &[u8], out: &mut [f32]) {
    for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
        *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}

pub(crate) fn dequantize_f16(bytes: &[u8], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if super::formats::has_avx2() {
        return super::avx2::f16_to_f32(bytes, out);
    }
    dequantize_f16_scalar(bytes, out);
}

pub(crate) fn dequantize_f16_scalar(bytes: &[u8], out: &mut [f32]) {
    for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
        *o = f16::from_le_bytes([b[0], b[1]]).to_f32();
    }
}

pub(crate) fn dequantize_bf16(bytes: &[u8], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if super::formats::has_avx2() {
        return super::avx2::bf16_to_f32(bytes, out);
    }
    dequantize_bf16_scalar(bytes, out);
}

pub(crate) fn dequantize_bf16_scalar(bytes: &[u8], out: &mut [f32]) {
    for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
        *o = bf16::from_le_bytes([b[0], b[1]]).to_f32();
    }
}

/// Σ a·b over the shorter of the two slices.
#[inline]
pub(crate) fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if super::formats::has_avx2() {
        return super::avx2::dot_f32(a, b);
    }
    dot_f32_scalar(a, b)
}

/// Σ a·b with eight independent accumulators, which lets the compiler vectorise it
/// without fast-math (a single running sum is a serial dependency chain).
pub(crate) fn dot_f32_scalar(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (a8, a_rest) = a.split_at(a.len() / 8 * 8);
    let (b8, b_rest) = b.split_at(a8.len().min(b.len()));
    for (x, y) in a8.chunks_exact(8).zip(b8.chunks_exact(8)) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let tail: f32 = a_rest.iter().zip(b_rest).map(|(x, y)| x * y).sum();
    acc.iter().sum::<f32>() + tail
}
