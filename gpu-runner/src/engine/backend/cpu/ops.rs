//! Row-wise f32 kernels of the forward pass: RMSNorm, activations, soft-capping, dot
//! products. Written so the compiler vectorises them (independent accumulators) without
//! platform intrinsics; the heavy matrix products live in `quant`.

use half::f16;

/// `Σ a[i]·b[i]` with 32 independent accumulators, so it vectorises (and, inlined into an
/// AVX2 caller, runs four 8-lane chains) without reassociation by the compiler.
#[inline(always)]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (ca, ta) = a[..n].as_chunks::<32>();
    let (cb, tb) = b[..n].as_chunks::<32>();
    let mut acc = [0f32; 32];
    for (x, y) in ca.iter().zip(cb) {
        for i in 0..32 {
            acc[i] += x[i] * y[i];
        }
    }
    let tail: f32 = ta.iter().zip(tb).map(|(x, y)| x * y).sum();
    let mut lanes = [0f32; 8];
    for (i, lane) in lanes.iter_mut().enumerate() {
        *lane = (acc[i] + acc[i + 8]) + (acc[i + 16] + acc[i + 24]);
    }
    lanes.iter().sum::<f32>() + tail
}

/// `out += w · v`.
#[inline(always)]
pub fn axpy(out: &mut [f32], w: f32, v: &[f32]) {
    for (o, x) in out.iter_mut().zip(v) {
        *o += w * x;
    }
}

/// [`dot`] against an f16 vector (the f16 KV cache), converting each element on read.
pub fn dot_f16(a: &[f32], b: &[f16]) -> f32 {
    let n = a.len().min(b.len());
    let mut lanes = [0f32; 8];
    let (ca, ta) = a[..n].as_chunks::<8>();
    let (cb, tb) = b[..n].as_chunks::<8>();
    for (x, y) in ca.iter().zip(cb) {
        for i in 0..8 {
            lanes[i] += x[i] * y[i].to_f32();
        }
    }
    let tail: f32 = ta.iter().zip(tb).map(|(x, y)| x * y.to_f32()).sum();
    lanes.iter().sum::<f32>() + tail
}

/// [`axpy`] with an f16 `v` (the f16 KV cache), converting each element on read.
pub fn axpy_f16(out: &mut [f32], w: f32, v: &[f16]) {
    for (o, x) in out.iter_mut().zip(v) {
        *o += w * x.to_f32();
    }
}

/// RMSNorm of every `weight.len()`-wide row of `x` into `out`: `x / rms(x) · weight`.
pub fn rms_norm_rows(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let d = weight.len();
    for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let ms = dot(xr, xr) / d as f32;
        let inv = 1.0 / (ms + eps).sqrt();
        for ((o, &v), &w) in or.iter_mut().zip(xr).zip(weight) {
            *o = v * inv * w;
        }
    }
}

/// RMSNorm of every `weight.len()`-wide row of `x`, in place (per-head Q/K norms).
pub fn rms_norm_rows_inplace(x: &mut [f32], weight: &[f32], eps: f32) {
    let d = weight.len();
    for xr in x.chunks_exact_mut(d) {
        let ms = dot(xr, xr) / d as f32;
        let inv = 1.0 / (ms + eps).sqrt();
        for (v, &w) in xr.iter_mut().zip(weight) {
            *v *= inv * w;
        }
    }
}

/// `a += b` element-wise.
pub fn add_inplace(a: &mut [f32], b: &[f32]) {
    for (x, y) in a.iter_mut().zip(b) {
        *x += y;
    }
}

/// `x += bias` for every `bias.len()`-wide row.
pub fn add_bias_rows(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_exact_mut(bias.len()) {
        add_inplace(row, bias);
    }
}

/// `gate = silu(gate) · up`.
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

/// `gate = gelu_tanh(gate) · up` (GeGLU with the tanh approximation, as Gemma uses).
pub fn geglu_tanh(gate: &mut [f32], up: &[f32]) {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        let inner = SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x);
        *g = 0.5 * x * (1.0 + inner.tanh()) * u;
    }
}

/// `x = cap · tanh(x / cap)`.
pub fn softcap(x: &mut [f32], cap: f32) {
    for v in x.iter_mut() {
        *v = cap * (*v / cap).tanh();
    }
}

/// Numerically stable in-place softmax.
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f32;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_matches_naive_sum_for_odd_lengths() {
        let a: Vec<f32> = (0..75).map(|i| i as f32 * 0.5).collect();
        let b: Vec<f32> = (0..75).map(|i| 1.0 - i as f32 * 0.1).collect();
        let naive: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert!((dot(&a, &b) - naive).abs() < 1e-5 * naive.abs().max(1.0));
    }

    #[test]
    fn rms_norm_gives_unit_rms_with_unit_weight() {
        let x = [3.0f32, -4.0, 0.0, 5.0];
        let mut out = [0f32; 4];
        rms_norm_rows(&x, &[1.0; 4], 0.0, &mut out);
        let rms = (out.iter().map(|v| v * v).sum::<f32>() / 4.0).sqrt();
        assert!((rms - 1.0).abs() < 1e-5);
    }

    #[test]
    fn softmax_sums_to_one_and_keeps_order() {
        let mut x = [1.0f32, 3.0, 2.0];
        softmax(&mut x);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(x[1] > x[2] && x[2] > x[0]);
    }
}
