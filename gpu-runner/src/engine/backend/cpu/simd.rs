//! AVX2+FMA versions of the attention inner loops (dot product, `out += w·v`) and the
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

/// `out[i] += w · v[i]` over the shorter length.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn axpy_lanes<T: Lane>(out: &mut [f32], w: f32, v: &[T]) {
    let n = out.len().min(v.len());
    let (po, pv) = (out.as_mut_ptr(), v.as_ptr());
    let wv = _mm256_set1_ps(w);
    let mut i = 0;
    // SAFETY: `i + 8 <= n` before each access, so 8 elements lie inside both slices.
    while i + 8 <= n {
        unsafe {
            let acc = _mm256_fmadd_ps(wv, T::load8(pv.add(i)), _mm256_loadu_ps(po.add(i)));
            _mm256_storeu_ps(po.add(i), acc);
        }
        i += 8;
    }
    for j in i..n {
        out[j] += w * v[j].widen();
    }
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

/// `out[i] += w · v[i]` over the shorter length.
///
/// # Safety
/// The CPU must support AVX2 and FMA ([`available`]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn axpy(out: &mut [f32], w: f32, v: &[f32]) {
    // SAFETY: the caller checked the CPU features.
    unsafe { axpy_lanes(out, w, v) }
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
    fn avx2_kernels_match_the_portable_ones() {
        if !available() {
            return;
        }
        let a: Vec<f32> = (0..75).map(|i| (i as f32 * 0.3).sin()).collect();
        let b: Vec<f32> = (0..75).map(|i| (i as f32 * 0.7).cos()).collect();
        // SAFETY: `available()` returned true.
        let fast = unsafe { dot(&a, &b) };
        assert!((fast - super::super::ops::dot(&a, &b)).abs() < 1e-4);
        let (mut o1, mut o2) = (a.clone(), a.clone());
        // SAFETY: as above.
        unsafe { axpy(&mut o1, 0.5, &b) };
        super::super::ops::axpy(&mut o2, 0.5, &b);
        assert!(o1.iter().zip(&o2).all(|(x, y)| (x - y).abs() < 1e-6));
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
