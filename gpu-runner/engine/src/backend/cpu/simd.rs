//! AVX2+FMA versions of the attention inner loops (dot product, weighted sum of rows) and the
//! widening of an f16 KV-cache row to f32 (8 halves per F16C `vcvtph2ps`).
//! The compiler does not vectorise the portable versions in [`super::ops`] well enough for
//! the innermost attention loop; callers check the CPU features once per task.

use std::arch::x86_64::{
    __m256, _mm256_add_ps, _mm256_castps256_ps128, _mm256_cvtph_ps, _mm256_extractf128_ps,
    _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_set1_ps, _mm256_setzero_ps, _mm256_storeu_ps,
    _mm_add_ps, _mm_add_ss, _mm_cvtss_f32, _mm_loadu_si128, _mm_movehl_ps, _mm_shuffle_ps,
};

use half::f16;

/// True when the AVX2 kernels may be called (F16C for the f16 cache; every AVX2 CPU has it).
pub fn available() -> bool {
    std::is_x86_feature_detected!("avx2")
        && std::is_x86_feature_detected!("fma")
        && std::is_x86_feature_detected!("f16c")
}

/// A KV-cache element type the kernels read 8 at a time, widened to f32.
trait Lane: Copy {
    /// 8 elements from `p` as f32.
    ///
    /// # Safety
    /// 8 elements must be readable from `p`; the CPU must support AVX2 and F16C.
    unsafe fn load8(p: *const Self) -> __m256;
    fn widen(self) -> f32;
}

impl Lane for f32 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(p: *const f32) -> __m256 {
        // SAFETY: the caller guarantees 32 readable bytes; loadu needs no alignment.
        unsafe { _mm256_loadu_ps(p) }
    }
    fn widen(self) -> f32 {
        self
    }
}

impl Lane for f16 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(p: *const f16) -> __m256 {
        // SAFETY: the caller guarantees 16 readable bytes; loadu needs no alignment.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
    }
    fn widen(self) -> f32 {
        self.to_f32()
    }
}

/// `Σ a[i]·b[i]` over the shorter length, two accumulators wide.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_lanes<T: Lane>(a: &[f32], b: &[T]) -> f32 {
    let n = a.len().min(b.len());
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut i = 0;
    // SAFETY (all loads): `i + 16 <= n` (resp. `i + 8 <= n`) before each load, so every load
    // reads 8 elements inside both slices.
    while i + 16 <= n {
        unsafe {
            acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), T::load8(pb.add(i)), acc0);
            acc1 = _mm256_fmadd_ps(
                _mm256_loadu_ps(pa.add(i + 8)),
                T::load8(pb.add(i + 8)),
                acc1,
            );
        }
        i += 16;
    }
    while i + 8 <= n {
        unsafe { acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), T::load8(pb.add(i)), acc0) };
        i += 8;
    }
    let mut sum = hsum(_mm256_add_ps(acc0, acc1));
    for j in i..n {
        sum += a[j] * b[j].widen();
    }
    sum
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)))
}

/// `Σ a[i]·b[i]` over the shorter length.
///
/// # Safety
/// The CPU must support AVX2 and FMA ([`available`]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
    // SAFETY: the caller checked the CPU features.
    unsafe { dot_lanes(a, b) }
}

/// `out += Σ_i weights[i] · rows[i]`, `rows` holding `weights.len()` rows of `out.len()`:
/// attention's weighted sum of V rows. 64 outputs at a time stay in registers while every
/// row passes, instead of `out` being loaded and stored once per row (`ops::axpy` per row).
///
/// # Safety
/// The CPU must support AVX2 and FMA ([`available`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn weighted_sum(out: &mut [f32], weights: &[f32], rows: &[f32]) {
    // SAFETY: the caller checked the CPU features.
    unsafe { weighted_sum_lanes(out, weights, rows) }
}

/// [`dot`] over f16 `b` (a LoRA adapter's rows), widened as it is read.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C ([`available`]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_f16(a: &[f32], b: &[f16]) -> f32 {
    // SAFETY: the caller checked the CPU features.
    unsafe { dot_lanes(a, b) }
}

/// [`weighted_sum`] of f16 rows (a LoRA adapter's), widened as they are read.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C ([`available`]).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn weighted_sum_f16(out: &mut [f32], weights: &[f32], rows: &[f16]) {
    // SAFETY: the caller checked the CPU features.
    unsafe { weighted_sum_lanes(out, weights, rows) }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn weighted_sum_lanes<T: Lane>(out: &mut [f32], weights: &[f32], rows: &[T]) {
    let hd = out.len();
    if hd == 0 {
        return;
    }
    let n = weights.len().min(rows.len() / hd);
    let (po, pr) = (out.as_mut_ptr(), rows.as_ptr());
    let mut c = 0;
    // SAFETY (all accesses below): `c + 64 <= hd` (resp. `c + 8 <= hd`) and `i < n`, so
    // every 8-float access lies inside `out[..hd]` or inside row `i` of `rows[..n * hd]`.
    while c + 64 <= hd {
        let mut acc: [__m256; 8] =
            std::array::from_fn(|k| unsafe { _mm256_loadu_ps(po.add(c + 8 * k)) });
        for (i, &w) in weights[..n].iter().enumerate() {
            let w = _mm256_set1_ps(w);
            for (k, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(w, unsafe { T::load8(pr.add(i * hd + c + 8 * k)) }, *a);
            }
        }
        for (k, a) in acc.iter().enumerate() {
            unsafe { _mm256_storeu_ps(po.add(c + 8 * k), *a) };
        }
        c += 64;
    }
    while c + 8 <= hd {
        let mut acc = unsafe { _mm256_loadu_ps(po.add(c)) };
        for (i, &w) in weights[..n].iter().enumerate() {
            acc = _mm256_fmadd_ps(
                _mm256_set1_ps(w),
                unsafe { T::load8(pr.add(i * hd + c)) },
                acc,
            );
        }
        unsafe { _mm256_storeu_ps(po.add(c), acc) };
        c += 8;
    }
    for d in c..hd {
        out[d] += weights[..n]
            .iter()
            .enumerate()
            .map(|(i, &w)| w * rows[i * hd + d].widen())
            .sum::<f32>();
    }
}

/// `dst[i] = src[i]` widened to f32, over the shorter length.
///
/// # Safety
/// The CPU must support AVX2 and F16C ([`available`]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn widen_f16(src: &[f16], dst: &mut [f32]) {
    let n = src.len().min(dst.len());
    let (ps, pd) = (src.as_ptr(), dst.as_mut_ptr());
    let mut i = 0;
    // SAFETY: `i + 8 <= n` before each access, so 8 elements lie inside both slices.
    while i + 8 <= n {
        unsafe { _mm256_storeu_ps(pd.add(i), f16::load8(ps.add(i))) };
        i += 8;
    }
    for j in i..n {
        dst[j] = src[j].to_f32();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn avx2_dot_matches_the_portable_one() {
        if !available() {
            return;
        }
        let a: Vec<f32> = (0..75).map(|i| (i as f32 * 0.3).sin()).collect();
        let b: Vec<f32> = (0..75).map(|i| (i as f32 * 0.7).cos()).collect();
        // SAFETY: `available()` returned true.
        let fast = unsafe { dot(&a, &b) };
        assert!((fast - super::super::ops::dot(&a, &b)).abs() < 1e-4);
    }

    #[test]
    fn weighted_row_sums_match_the_portable_ones_at_every_width() {
        if !available() {
            return;
        }
        for hd in [1, 7, 8, 9, 64, 72, 130, 256] {
            let n = 5;
            let rows: Vec<f32> = (0..n * hd).map(|i| (i as f32 * 0.37).sin()).collect();
            let weights: Vec<f32> = (0..n).map(|i| 0.1 + i as f32 * 0.2).collect();
            let (mut fast, mut slow): (Vec<f32>, Vec<f32>) = (
                (0..hd).map(|i| i as f32).collect(),
                (0..hd).map(|i| i as f32).collect(),
            );
            // SAFETY: `available()` returned true.
            unsafe { weighted_sum(&mut fast, &weights, &rows) };
            super::super::ops::weighted_sum(&mut slow, &weights, &rows);
            assert!(
                fast.iter()
                    .zip(&slow)
                    .all(|(x, y)| (x - y).abs() <= 1e-5 * y.abs().max(1.0)),
                "hd={hd}"
            );
        }
    }

    #[test]
    fn f16_widening_is_exact_at_every_tail_length() {
        if !available() {
            return;
        }
        for n in [0, 1, 7, 8, 9, 16, 17, 64, 75] {
            let b: Vec<f16> = (0..n)
                .map(|i| f16::from_f32((i as f32 * 0.7).cos() * 3.0))
                .collect();
            let mut wide = vec![0f32; n];
            // SAFETY: `available()` returned true.
            unsafe { widen_f16(&b, &mut wide) };
            assert!(wide.iter().zip(&b).all(|(w, h)| *w == h.to_f32()), "n={n}");
        }
    }
}
