//! x86_64 AVX2+FMA+F16C kernels: the row kernels of every quantized format ([`rows`], from
//! the shared [`super::x86_rows`] source), plus the f32 dot product, f16/bf16 conversion
//! and activation quantisation of the float and quantized paths. `formats` hands them out
//! only after `formats::has_avx2` detected the features at runtime; each is tested against
//! its portable counterpart.

use std::arch::x86_64::*;

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

#[target_feature(enable = "avx2,fma,f16c")]
fn dot_f32_impl(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    // SAFETY (all loads): `i + 8 * (k + 1) <= n` holds for every load, so each reads
    // 8 floats inside both slices; loadu has no alignment requirement.
    while i + 32 <= n {
        for (k, acc_k) in acc.iter_mut().enumerate() {
            let (va, vb) = unsafe {
                (
                    _mm256_loadu_ps(pa.add(i + 8 * k)),
                    _mm256_loadu_ps(pb.add(i + 8 * k)),
                )
            };
            *acc_k = _mm256_fmadd_ps(va, vb, *acc_k);
        }
        i += 32;
    }
    while i + 8 <= n {
        let (va, vb) = unsafe { (_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i))) };
        acc[0] = _mm256_fmadd_ps(va, vb, acc[0]);
        i += 8;
    }
    let sum = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    hsum(sum)
        + a[i..n]
            .iter()
            .zip(&b[i..n])
            .map(|(x, y)| x * y)
            .sum::<f32>()
}

/// Converts 8 halves at a time: `F16 = true` via F16C, else bf16 (the top half of an f32).
#[target_feature(enable = "avx2,fma,f16c")]
fn half_to_f32_impl<const F16: bool>(bytes: &[u8], out: &mut [f32]) {
    let n = out.len().min(bytes.len() / 2);
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: 16 bytes from `2i` and 8 floats from `i` lie inside `bytes` and `out`
        // because `i + 8 <= n`.
        unsafe {
            let h = _mm_loadu_si128(bytes.as_ptr().add(2 * i).cast());
            let v = if F16 {
                _mm256_cvtph_ps(h)
            } else {
                _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
            };
            _mm256_storeu_ps(out.as_mut_ptr().add(i), v);
        }
        i += 8;
    }
    let (tail_in, tail_out) = (&bytes[2 * i..2 * n], &mut out[i..n]);
    if F16 {
        super::float::dequantize_f16_scalar(tail_in, tail_out);
    } else {
        super::float::dequantize_bf16_scalar(tail_in, tail_out);
    }
}

/// Σ a·b; only called after `formats::has_avx2`.
pub(crate) fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    // SAFETY: callers check `formats::has_avx2` first.
    unsafe { dot_f32_impl(a, b) }
}

/// f16 → f32; only called after `formats::has_avx2`.
pub(crate) fn f16_to_f32(bytes: &[u8], out: &mut [f32]) {
    // SAFETY: callers check `formats::has_avx2` first.
    unsafe { half_to_f32_impl::<true>(bytes, out) }
}

/// bf16 → f32; only called after `formats::has_avx2`.
pub(crate) fn bf16_to_f32(bytes: &[u8], out: &mut [f32]) {
    // SAFETY: callers check `formats::has_avx2` first.
    unsafe { half_to_f32_impl::<false>(bytes, out) }
}

/// Whole MXFP4 blocks to f32: the codes look up [`super::mxfp4::KVALUES`] with one shuffle
/// per 16, are widened 8 at a time and scaled.
#[target_feature(enable = "avx2,fma,f16c")]
fn mxfp4_to_f32_impl(blocks: &[u8], out: &mut [f32]) {
    use super::mxfp4::{half_scale, BLOCK_BYTES, KVALUES};
    // SAFETY: the table is exactly 16 bytes; loadu needs no alignment.
    let table = unsafe { _mm_loadu_si128(KVALUES.as_ptr().cast()) };
    let mask = _mm_set1_epi8(0x0F);
    for (block, o) in blocks
        .chunks_exact(BLOCK_BYTES)
        .zip(out.chunks_exact_mut(32))
    {
        let d = _mm256_set1_ps(half_scale(block[0]));
        // SAFETY: a block's bytes 1..17 are its 16 bytes of codes.
        let packed = unsafe { _mm_loadu_si128(block[1..].as_ptr().cast()) };
        let low = _mm_shuffle_epi8(table, _mm_and_si128(packed, mask));
        let high = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(packed, 4), mask));
        let eights = [low, _mm_srli_si128(low, 8), high, _mm_srli_si128(high, 8)];
        for (v, o8) in eights.into_iter().zip(o.chunks_exact_mut(8)) {
            let f = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)), d);
            // SAFETY: `o8` is exactly 8 floats; storeu needs no alignment.
            unsafe { _mm256_storeu_ps(o8.as_mut_ptr(), f) };
        }
    }
}

/// MXFP4 blocks → f32; only called after `formats::has_avx2`.
pub(crate) fn mxfp4_to_f32(blocks: &[u8], out: &mut [f32]) {
    // SAFETY: callers check `formats::has_avx2` first.
    unsafe { mxfp4_to_f32_impl(blocks, out) }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn quantize_symmetric_impl(x: &[f32], qs: &mut [i8]) -> f32 {
    assert!(x.len() == qs.len() && x.len().is_multiple_of(32));
    let sign = _mm256_set1_ps(-0.0);
    let mut max = _mm256_setzero_ps();
    for c in x.chunks_exact(8) {
        // SAFETY: `c` holds exactly 8 floats.
        let v = unsafe { _mm256_loadu_ps(c.as_ptr()) };
        max = _mm256_max_ps(max, _mm256_andnot_ps(sign, v));
    }
    let half = _mm_max_ps(_mm256_castps256_ps128(max), _mm256_extractf128_ps(max, 1));
    let half = _mm_max_ps(half, _mm_movehl_ps(half, half));
    let amax = _mm_cvtss_f32(_mm_max_ss(half, _mm_movehdup_ps(half)));
    if amax == 0.0 || !amax.is_finite() {
        qs.fill(0);
        return 0.0;
    }
    let d = amax / 127.0;
    let id = _mm256_set1_ps(1.0 / d);
    // packs works within 128-bit lanes; this permutation restores element order.
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (c, q) in x.chunks_exact(32).zip(qs.chunks_exact_mut(32)) {
        let ints: [__m256i; 4] = std::array::from_fn(|k| {
            // SAFETY: `c` holds 32 floats, so 8 from `8k` (k < 4) are inside it.
            let v = unsafe { _mm256_loadu_ps(c.as_ptr().add(8 * k)) };
            let r = _mm256_round_ps(
                _mm256_mul_ps(v, id),
                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
            );
            _mm256_cvtps_epi32(r)
        });
        let i16s = (
            _mm256_packs_epi32(ints[0], ints[1]),
            _mm256_packs_epi32(ints[2], ints[3]),
        );
        let i8s = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(i16s.0, i16s.1), order);
        // SAFETY: `q` holds exactly 32 bytes; storeu has no alignment requirement.
        unsafe { _mm256_storeu_si256(q.as_mut_ptr().cast(), i8s) };
    }
    d
}

/// Symmetric i8 quantisation of a whole number of 32-element groups (see `act`); only
/// called after `formats::has_avx2`.
pub(crate) fn quantize_symmetric(x: &[f32], qs: &mut [i8]) -> f32 {
    // SAFETY: callers check `formats::has_avx2` first.
    unsafe { quantize_symmetric_impl(x, qs) }
}

/// The row kernels with AVX2's integer dot products: `maddubs` (u8 × i8 → i16 pairs), then
/// `madd` (→ i32).
pub(crate) mod rows {
    use super::super::x86_rows::x86_row_kernels;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn dot_u8_i8(u: __m256i, s: __m256i) -> __m256i {
        _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn scaled_dot_acc(acc: __m256i, u: __m256i, s: __m256i, scales: __m256i) -> __m256i {
        _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), scales))
    }

    /// `maddubs` saturates its i16 pair sums, exact only for u8 lanes up to ~128.
    const FULL_RANGE_U8: bool = false;

    x86_row_kernels!("avx2,fma,f16c");
}

/// The tile kernels (from the shared [`super::x86_tiles`] source) for AVX2 without VNNI.
pub(crate) mod tiles {
    use super::super::x86_ktiles::x86_ktile_kernels;
    use super::super::x86_tiles::x86_tile_kernels;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn dot_u8_i8_acc(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        _mm256_add_epi32(
            acc,
            _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)),
        )
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn dot_i16_acc(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        _mm256_add_epi32(acc, _mm256_madd_epi16(a, b))
    }

    /// `maddubs` saturates its i16 pair sums, exact only for u8 lanes up to ~128.
    const FULL_RANGE_U8: bool = false;

    /// AVX2 has 16 vector registers.
    const WIDE_REGISTERS: bool = false;

    x86_tile_kernels!("avx2,fma,f16c");
    x86_ktile_kernels!("avx2,fma,f16c");
}
