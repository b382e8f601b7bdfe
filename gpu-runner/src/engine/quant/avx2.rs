//! x86_64 AVX2+FMA+F16C kernels: a row kernel (see [`super::formats::RowKernel`]) for every
//! quantized format, plus the f32 dot product and f16/bf16 conversion of the float path.
//! `formats` hands them out only after `formats::has_avx2` detected the features at runtime;
//! each is tested against its portable counterpart.
//!
//! Every kernel unpacks a weight block into 8-bit lanes once, then for each token of the
//! tile multiplies it with the token's activation block using `maddubs` (u8 × i8 → i16
//! pairs) and `madd` (→ i32), accumulating f32 per token in a vector register kept on the
//! stack; the horizontal sum happens once per row and token. Signed × signed products use
//! the usual trick |w| × (x·sign w), which is exact because activations lie in −127..=127.

use std::arch::x86_64::*;

use super::act::{BlockQ8K, BlockQ8_0, BlockQ8_1};
use super::kquants::scale_min_k4;
use super::matmul::TOKEN_TILE;

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// The little-endian f16 at `b[at..at + 2]`, converted by the F16C instruction (the
/// portable conversion costs as much as a Q4 block's whole dot product).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn f16_at(b: &[u8], at: usize) -> f32 {
    let bits = u16::from_le_bytes([b[at], b[at + 1]]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load32(bytes: &[u8]) -> __m256i {
    assert!(bytes.len() >= 32);
    // SAFETY: 32 bytes are readable (checked above); loadu has no alignment requirement.
    unsafe { _mm256_loadu_si256(bytes.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load_i8x32(q: &[i8; 32]) -> __m256i {
    // SAFETY: the array is exactly 32 bytes; loadu has no alignment requirement.
    unsafe { _mm256_loadu_si256(q.as_ptr().cast()) }
}

/// The 32 nibbles of a 16-byte Q4 block as u8 lanes in element order (low nibbles first).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn unpack_nibbles(qs: &[u8]) -> __m256i {
    assert!(qs.len() >= 16);
    // SAFETY: 16 bytes are readable (checked above).
    let packed = unsafe { _mm_loadu_si128(qs.as_ptr().cast()) };
    let mask = _mm_set1_epi8(0x0F);
    let lo = _mm_and_si128(packed, mask);
    let hi = _mm_and_si128(_mm_srli_epi16(packed, 4), mask);
    _mm256_set_m128i(hi, lo)
}

/// Σ of u8 × i8 lane products as eight i32 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn dot_u8_i8(u: __m256i, s: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
}

/// Writes `out[t] = hsum(acc[t]) + extra[t]` for the tile.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn finish<const N: usize>(acc: &[__m256; N], extra: &[f32; N], tn: usize, out: &mut [f32]) {
    for t in 0..tn {
        out[t] = hsum(acc[t]) + extra[t];
    }
}

/// Shared body of the 32-element formats whose weights unpack to signed i8 lanes
/// (Q4_0, Q8_0): `unpack` yields the lanes and the weight scale of a block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn row_signed<const N: usize, const BYTES: usize>(
    wrow: &[u8],
    acts: &[BlockQ8_0],
    tn: usize,
    out: &mut [f32],
    unpack: impl Fn(&[u8]) -> (__m256i, f32),
) {
    let mut acc = [_mm256_setzero_ps(); N];
    for (b, block) in wrow.chunks_exact(BYTES).enumerate() {
        let (w, dw) = unpack(block);
        let w_abs = _mm256_sign_epi8(w, w);
        for (t, a) in acts[b * tn..(b + 1) * tn].iter().enumerate() {
            let x = _mm256_sign_epi8(load_i8x32(&a.qs), w);
            let sum = _mm256_cvtepi32_ps(dot_u8_i8(w_abs, x));
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dw * a.d), sum, acc[t]);
        }
    }
    finish(&acc, &[0.0; N], tn, out);
}

#[target_feature(enable = "avx2,fma,f16c")]
fn row_q4_0_impl<const N: usize>(wrow: &[u8], acts: &[BlockQ8_0], tn: usize, out: &mut [f32]) {
    row_signed::<N, 18>(wrow, acts, tn, out, |block| {
        let w = _mm256_sub_epi8(unpack_nibbles(&block[2..18]), _mm256_set1_epi8(8));
        (w, f16_at(block, 0))
    });
}

#[target_feature(enable = "avx2,fma,f16c")]
fn row_q8_0_impl<const N: usize>(wrow: &[u8], acts: &[BlockQ8_0], tn: usize, out: &mut [f32]) {
    row_signed::<N, 34>(wrow, acts, tn, out, |block| {
        (load32(&block[2..34]), f16_at(block, 0))
    });
}

/// Shared body of the formats with an offset (Q4_1, Q5_1): `unpack` yields the unsigned
/// lanes, the scale `d` and the offset `m` of a block; the offset meets the activation sum.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn row_affine<const N: usize, const BYTES: usize>(
    wrow: &[u8],
    acts: &[BlockQ8_1],
    tn: usize,
    out: &mut [f32],
    unpack: impl Fn(&[u8]) -> (__m256i, f32, f32),
) {
    let mut acc = [_mm256_setzero_ps(); N];
    let mut offsets = [0f32; N];
    for (b, block) in wrow.chunks_exact(BYTES).enumerate() {
        let (w, dw, mw) = unpack(block);
        for (t, a) in acts[b * tn..(b + 1) * tn].iter().enumerate() {
            let sum = _mm256_cvtepi32_ps(dot_u8_i8(w, load_i8x32(&a.qs)));
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(dw * a.d), sum, acc[t]);
            offsets[t] += mw * a.s;
        }
    }
    finish(&acc, &offsets, tn, out);
}

#[target_feature(enable = "avx2,fma,f16c")]
fn row_q4_1_impl<const N: usize>(wrow: &[u8], acts: &[BlockQ8_1], tn: usize, out: &mut [f32]) {
    row_affine::<N, 20>(wrow, acts, tn, out, |block| {
        (
            unpack_nibbles(&block[4..20]),
            f16_at(block, 0),
            f16_at(block, 2),
        )
    });
}

/// The 32 quants of a Q5 block (`qh` 4 bytes of fifth bits, `qs` 16 bytes of nibbles) as
/// u8 lanes in 0..32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn unpack_q5(qh: &[u8], qs: &[u8]) -> __m256i {
    let bits = i32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    // Byte j gets byte j/8 of the bit field, then keeps only bit j%8.
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(bits),
        _mm256_set_epi64x(
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
            0x0101_0101_0101_0101,
            0,
        ),
    );
    let select = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, select), select);
    _mm256_or_si256(
        unpack_nibbles(qs),
        _mm256_and_si256(set, _mm256_set1_epi8(0x10)),
    )
}

#[target_feature(enable = "avx2,fma,f16c")]
fn row_q5_0_impl<const N: usize>(wrow: &[u8], acts: &[BlockQ8_0], tn: usize, out: &mut [f32]) {
    row_signed::<N, 22>(wrow, acts, tn, out, |block| {
        let w = _mm256_sub_epi8(unpack_q5(&block[2..6], &block[6..22]), _mm256_set1_epi8(16));
        (w, f16_at(block, 0))
    });
}

#[target_feature(enable = "avx2,fma,f16c")]
fn row_q5_1_impl<const N: usize>(wrow: &[u8], acts: &[BlockQ8_1], tn: usize, out: &mut [f32]) {
    row_affine::<N, 24>(wrow, acts, tn, out, |block| {
        (
            unpack_q5(&block[4..8], &block[8..24]),
            f16_at(block, 0),
            f16_at(block, 2),
        )
    });
}

/// Shared body of Q4_K (`FIVE = false`, 144-byte blocks) and Q5_K (176-byte blocks, with
/// 32 bytes of fifth bits before the nibbles).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn row_q45_k<const N: usize, const FIVE: bool>(
    wrow: &[u8],
    acts: &[BlockQ8K],
    tn: usize,
    out: &mut [f32],
) {
    let mut acc = [_mm256_setzero_ps(); N];
    let mut offsets = [0f32; N];
    let mask = _mm256_set1_epi8(0x0F);
    let (block_bytes, qs_at) = if FIVE { (176, 48) } else { (144, 16) };
    for (b, block) in wrow.chunks_exact(block_bytes).enumerate() {
        let (d, dmin) = (f16_at(block, 0), f16_at(block, 2));
        let mut scales = [_mm256_setzero_si256(); 8];
        let mut mins = [0i32; 8];
        for (g, (s, m)) in scales.iter_mut().zip(mins.iter_mut()).enumerate() {
            let (sc, mn) = scale_min_k4(g, &block[4..16]);
            *s = _mm256_set1_epi16(sc as i16);
            *m = mn as i32;
        }
        let mut w = [_mm256_setzero_si256(); 8];
        for c in 0..4 {
            let q = load32(&block[qs_at + 32 * c..qs_at + 32 * c + 32]);
            w[2 * c] = _mm256_and_si256(q, mask);
            w[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 4), mask);
        }
        if FIVE {
            let qh = load32(&block[16..48]);
            for (g, wg) in w.iter_mut().enumerate() {
                let bit = _mm256_set1_epi8(1 << g);
                let set = _mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit);
                *wg = _mm256_or_si256(*wg, _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
            }
        }
        for (t, a) in acts[b * tn..(b + 1) * tn].iter().enumerate() {
            let mut sumi = _mm256_setzero_si256();
            let mut sum_min = 0i32;
            for g in 0..8 {
                let x = load32(bytes_of_i8(&a.qs[32 * g..32 * g + 32]));
                let p = _mm256_madd_epi16(_mm256_maddubs_epi16(w[g], x), scales[g]);
                sumi = _mm256_add_epi32(sumi, p);
                sum_min += mins[g] * (a.bsums[2 * g] as i32 + a.bsums[2 * g + 1] as i32);
            }
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * a.d), _mm256_cvtepi32_ps(sumi), acc[t]);
            offsets[t] -= dmin * a.d * sum_min as f32;
        }
    }
    finish(&acc, &offsets, tn, out);
}

#[target_feature(enable = "avx2,fma,f16c")]
fn row_q4_k_impl<const N: usize>(wrow: &[u8], acts: &[BlockQ8K], tn: usize, out: &mut [f32]) {
    row_q45_k::<N, false>(wrow, acts, tn, out);
}

#[target_feature(enable = "avx2,fma,f16c")]
fn row_q5_k_impl<const N: usize>(wrow: &[u8], acts: &[BlockQ8K], tn: usize, out: &mut [f32]) {
    row_q45_k::<N, true>(wrow, acts, tn, out);
}

#[target_feature(enable = "avx2,fma,f16c")]
fn row_q6_k_impl<const N: usize>(wrow: &[u8], acts: &[BlockQ8K], tn: usize, out: &mut [f32]) {
    let mut acc = [_mm256_setzero_ps(); N];
    let (m4, m3) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(3));
    for (b, block) in wrow.chunks_exact(210).enumerate() {
        let d = f16_at(block, 208);
        let sc: [i16; 16] = std::array::from_fn(|g| (block[192 + g] as i8) as i16);
        // Quants as u8 `q + 32` in element order, 32 per vector.
        let mut w = [_mm256_setzero_si256(); 8];
        for half in 0..2 {
            let ql0 = load32(&block[64 * half..64 * half + 32]);
            let ql1 = load32(&block[64 * half + 32..64 * half + 64]);
            let qh = load32(&block[128 + 32 * half..160 + 32 * half]);
            let high = |shift: i32| {
                let bits = match shift {
                    0 => qh,
                    2 => _mm256_srli_epi16(qh, 2),
                    4 => _mm256_srli_epi16(qh, 4),
                    _ => _mm256_srli_epi16(qh, 6),
                };
                _mm256_slli_epi16(_mm256_and_si256(bits, m3), 4)
            };
            w[4 * half] = _mm256_or_si256(_mm256_and_si256(ql0, m4), high(0));
            w[4 * half + 1] = _mm256_or_si256(_mm256_and_si256(ql1, m4), high(2));
            w[4 * half + 2] =
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), high(4));
            w[4 * half + 3] =
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4), high(6));
        }
        let scales: [__m256i; 8] = std::array::from_fn(|k| {
            _mm256_set_m128i(_mm_set1_epi16(sc[2 * k + 1]), _mm_set1_epi16(sc[2 * k]))
        });
        for (t, a) in acts[b * tn..(b + 1) * tn].iter().enumerate() {
            let mut sumi = _mm256_setzero_si256();
            for k in 0..8 {
                let x = load32(bytes_of_i8(&a.qs[32 * k..32 * k + 32]));
                let p = _mm256_madd_epi16(_mm256_maddubs_epi16(w[k], x), scales[k]);
                sumi = _mm256_add_epi32(sumi, p);
            }
            // Undo the +32 offset: Σ_g sc_g · 32 · Σ_{i∈g} x_i.
            let offset: i32 = (0..16)
                .map(|g| sc[g] as i32 * a.bsums[g] as i32)
                .sum::<i32>()
                * 32;
            let total = _mm256_sub_epi32(sumi, _mm256_setr_epi32(offset, 0, 0, 0, 0, 0, 0, 0));
            acc[t] = _mm256_fmadd_ps(_mm256_set1_ps(d * a.d), _mm256_cvtepi32_ps(total), acc[t]);
        }
    }
    finish(&acc, &[0.0; N], tn, out);
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

fn bytes_of_i8(v: &[i8]) -> &[u8] {
    // SAFETY: i8 and u8 have the same size and alignment, and every bit pattern is valid.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast(), v.len()) }
}

macro_rules! safe_entry {
    ($name:ident, $impl_fn:ident, $act:ty) => {
        /// Safe entry point; only handed out by `formats` after AVX2 and FMA were detected.
        pub(crate) fn $name(wrow: &[u8], acts: &[$act], tn: usize, out: &mut [f32]) {
            assert!(tn <= TOKEN_TILE && out.len() >= tn);
            debug_assert!(super::formats::has_avx2());
            // SAFETY: this function is only selected when the CPU supports AVX2, FMA and F16C.
            // One token (decode) gets a single accumulator instead of a tile's worth.
            unsafe {
                if tn == 1 {
                    $impl_fn::<1>(wrow, acts, tn, out)
                } else {
                    $impl_fn::<TOKEN_TILE>(wrow, acts, tn, out)
                }
            }
        }
    };
}

safe_entry!(row_q4_0, row_q4_0_impl, BlockQ8_0);
safe_entry!(row_q4_1, row_q4_1_impl, BlockQ8_1);
safe_entry!(row_q5_0, row_q5_0_impl, BlockQ8_0);
safe_entry!(row_q5_1, row_q5_1_impl, BlockQ8_1);
safe_entry!(row_q8_0, row_q8_0_impl, BlockQ8_0);
safe_entry!(row_q4_k, row_q4_k_impl, BlockQ8K);
safe_entry!(row_q5_k, row_q5_k_impl, BlockQ8K);
safe_entry!(row_q6_k, row_q6_k_impl, BlockQ8K);
