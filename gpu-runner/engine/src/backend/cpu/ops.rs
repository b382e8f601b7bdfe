//! Row-wise f32 kernels of the forward pass: RMSNorm, activations, soft-capping, dot
//! products. Written so the compiler vectorises them (independent accumulators) without
//! platform intrinsics; the heavy matrix products live in `quant`.

use half::f16;

use crate::model::Activation;

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

/// `out += Σ_i weights[i] · rows[i]`, `rows` holding `weights.len()` rows of `out.len()`.
pub fn weighted_sum(out: &mut [f32], weights: &[f32], rows: &[f32]) {
    for (&w, row) in weights.iter().zip(rows.chunks_exact(out.len().max(1))) {
        axpy(out, w, row);
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

pub use crate::fast_exp::exp_fast;

/// Elements per task of the parallel element-wise ops: below this a hand-off costs more
/// than it saves.
const ELEMENTWISE_CHUNK: usize = 16 * 1024;

/// Runs `f` over matching chunks of `a` and `b`, on the worker team when they are long
/// (prefill), compiled with AVX2+FMA where the CPU has them.
fn elementwise(a: &mut [f32], b: &[f32], f: fn(&mut [f32], &[f32])) {
    let n = a.len().min(b.len());
    let run = |a: &mut [f32], b: &[f32]| {
        #[cfg(target_arch = "x86_64")]
        if super::simd::available() {
            // SAFETY: the CPU supports AVX2 and FMA (checked just above).
            unsafe { with_avx2(a, b, f) };
            return;
        }
        f(a, b)
    };
    if n <= ELEMENTWISE_CHUNK {
        run(&mut a[..n], &b[..n]);
        return;
    }
    let mut pairs: Vec<(&mut [f32], &[f32])> = a[..n]
        .chunks_mut(ELEMENTWISE_CHUNK)
        .zip(b[..n].chunks(ELEMENTWISE_CHUNK))
        .collect();
    crate::team::for_each_mut(&mut pairs, |(a, b)| run(a, b));
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn with_avx2(a: &mut [f32], b: &[f32], f: fn(&mut [f32], &[f32])) {
    f(a, b)
}

/// The low-rank update of LoRA, row by row: `y += Bᵀ (A x)` for each row `x` of `x_rows`
/// and `y` of `out_rows`, `a` holding `rank` rows of the input width and `b_t` `rank` rows of
/// the output width. AVX2+FMA where the CPU has them.
pub fn low_rank_update(a: &[f32], b_t: &[f32], rank: usize, x_rows: &[f32], out_rows: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if super::simd::available() {
        // SAFETY: the CPU supports AVX2, FMA and F16C (checked just above).
        unsafe { low_rank_update_avx2(a, b_t, rank, x_rows, out_rows) };
        return;
    }
    low_rank_body(a, b_t, rank, x_rows, out_rows, dot, weighted_sum);
}

/// [`low_rank_update`] over f16 weights, widened as they are read: half the memory traffic,
/// which is what a step of many adapters waits on.
pub fn low_rank_update_f16(
    a: &[f16],
    b_t: &[f16],
    rank: usize,
    x_rows: &[f32],
    out_rows: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if super::simd::available() {
        // SAFETY: the CPU supports AVX2, FMA and F16C (checked just above).
        unsafe { low_rank_update_f16_avx2(a, b_t, rank, x_rows, out_rows) };
        return;
    }
    let dot = |a: &[f16], x: &[f32]| a.iter().zip(x).map(|(a, x)| a.to_f32() * x).sum();
    let weighted_sum = |y: &mut [f32], t: &[f32], rows: &[f16]| {
        for (&w, row) in t.iter().zip(rows.chunks_exact(y.len().max(1))) {
            for (o, v) in y.iter_mut().zip(row) {
                *o += w * v.to_f32();
            }
        }
    };
    low_rank_body(a, b_t, rank, x_rows, out_rows, dot, weighted_sum);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn low_rank_update_avx2(
    a: &[f32],
    b_t: &[f32],
    rank: usize,
    x_rows: &[f32],
    out_rows: &mut [f32],
) {
    // SAFETY: this function only runs where AVX2, FMA and F16C are available.
    let dot = |a: &[f32], x: &[f32]| unsafe { super::simd::dot(x, a) };
    // SAFETY: as above.
    let weighted_sum =
        |o: &mut [f32], w: &[f32], rows: &[f32]| unsafe { super::simd::weighted_sum(o, w, rows) };
    low_rank_body(a, b_t, rank, x_rows, out_rows, dot, weighted_sum);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn low_rank_update_f16_avx2(
    a: &[f16],
    b_t: &[f16],
    rank: usize,
    x_rows: &[f32],
    out_rows: &mut [f32],
) {
    // SAFETY: this function only runs where AVX2, FMA and F16C are available.
    let dot = |a: &[f16], x: &[f32]| unsafe { super::simd::dot_f16(x, a) };
    // SAFETY: as above.
    let weighted_sum = |o: &mut [f32], w: &[f32], rows: &[f16]| unsafe {
        super::simd::weighted_sum_f16(o, w, rows)
    };
    low_rank_body(a, b_t, rank, x_rows, out_rows, dot, weighted_sum);
}

#[inline(always)]
fn low_rank_body<T>(
    a: &[T],
    b_t: &[T],
    rank: usize,
    x_rows: &[f32],
    out_rows: &mut [f32],
    dot: impl Fn(&[T], &[f32]) -> f32,
    weighted_sum: impl Fn(&mut [f32], &[f32], &[T]),
) {
    if rank == 0 {
        return;
    }
    let (in_dim, out_dim) = (a.len() / rank, b_t.len() / rank);
    if in_dim == 0 || out_dim == 0 {
        return;
    }
    // A·x a slice of the rank at a time, on the stack (no allocation per call); a rank of
    // at most RANK_SLICE is one slice, the whole sum in one pass.
    const RANK_SLICE: usize = 64;
    let mut t = [0f32; RANK_SLICE];
    for (x, y) in x_rows
        .chunks_exact(in_dim)
        .zip(out_rows.chunks_exact_mut(out_dim))
    {
        for r0 in (0..rank).step_by(RANK_SLICE) {
            let r1 = (r0 + RANK_SLICE).min(rank);
            let a_rows = a[r0 * in_dim..r1 * in_dim].chunks_exact(in_dim);
            for (ti, a_r) in t.iter_mut().zip(a_rows) {
                *ti = dot(a_r, x);
            }
            weighted_sum(y, &t[..r1 - r0], &b_t[r0 * out_dim..r1 * out_dim]);
        }
    }
}

/// `gate = act(gate) ⊙ up` for the model's gate activation.
pub fn gated_activation(activation: Activation, gate: &mut [f32], up: &[f32]) {
    match activation {
        Activation::Silu => swiglu(gate, up),
        Activation::GeluTanh => geglu_tanh(gate, up),
    }
}

/// `gate = silu(gate) · up`.
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    elementwise(gate, up, swiglu_chunk);
}

#[inline(always)]
fn swiglu_chunk(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + exp_fast(-*g)) * u;
    }
}

/// `gate = gelu_tanh(gate) · up` (GeGLU with the tanh approximation, as Gemma uses).
pub fn geglu_tanh(gate: &mut [f32], up: &[f32]) {
    elementwise(gate, up, geglu_tanh_chunk);
}

#[inline(always)]
fn geglu_tanh_chunk(gate: &mut [f32], up: &[f32]) {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        let inner = SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x);
        // 0.5·(1 + tanh(y)) = 1 − 1/(1 + e^{2y}).
        *g = x * (1.0 - 1.0 / (1.0 + exp_fast(2.0 * inner))) * u;
    }
}

/// `x = cap · tanh(x / cap)`.
pub fn softcap(x: &mut [f32], cap: f32) {
    for v in x.iter_mut() {
        *v = cap * (*v / cap).tanh();
    }
}

/// Numerically stable in-place softmax. Uses libm's `exp`, not [`exp_fast`]: attention
/// weights feed greedy decoding's near-ties, and the few ulp of `exp_fast` were enough to
/// move SmolLM2 off llama.cpp's path in a multi-turn chat (`test_chat.py`); the exps here
/// are a small part of a step.
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

/// [`softmax`] with one more logit, `sink`, in the denominator only: the weights sum to
/// less than one, the rest going to a position that does not exist (gpt-oss's sinks).
pub fn softmax_with_sink(x: &mut [f32], sink: f32) {
    let max = x.iter().copied().fold(sink, f32::max);
    let mut sum = (sink - max).exp();
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// gpt-oss's expert activation: `gate = (clamp(up, ±limit) + 1) · g · sigmoid(alpha · g)`
/// with `g = min(gate, limit)`. libm's `exp`: the clamp keeps the argument small, and the
/// experts' outputs are few per token.
pub fn clamped_swiglu(gate: &mut [f32], up: &[f32], alpha: f32, limit: f32) {
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = g.min(limit);
        let u = u.clamp(-limit, limit);
        *g = (u + 1.0) * x / (1.0 + (-alpha * x).exp());
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
    fn activations_match_their_definitions_on_long_and_short_rows() {
        for n in [5, 3 * ELEMENTWISE_CHUNK + 7] {
            let x: Vec<f32> = (0..n).map(|i| (i % 2001) as f32 * 0.01 - 10.0).collect();
            let up: Vec<f32> = (0..n).map(|i| 1.0 + (i % 7) as f32).collect();
            let (mut s, mut g) = (x.clone(), x.clone());
            swiglu(&mut s, &up);
            geglu_tanh(&mut g, &up);
            for i in 0..n {
                let (v, u) = (x[i] as f64, up[i] as f64);
                let silu = v / (1.0 + (-v).exp()) * u;
                let gelu = 0.5 * v * (1.0 + (0.797_884_6 * (v + 0.044_715 * v * v * v)).tanh()) * u;
                assert!(
                    (s[i] as f64 - silu).abs() <= 1e-5 * silu.abs().max(1.0),
                    "silu {v}"
                );
                assert!(
                    (g[i] as f64 - gelu).abs() <= 1e-5 * gelu.abs().max(1.0),
                    "gelu {v}"
                );
            }
        }
    }

    #[test]
    fn a_sink_takes_its_share_of_the_softmax_without_a_value() {
        let mut x = vec![1.0, 2.0, 3.0];
        softmax_with_sink(&mut x, 2.0);
        let z = 1f32.exp() + 2f32.exp() * 2.0 + 3f32.exp();
        for (got, want) in x
            .iter()
            .zip([1f32.exp() / z, 2f32.exp() / z, 3f32.exp() / z])
        {
            assert!((got - want).abs() < 1e-6, "{got} vs {want}");
        }
        // A very negative sink is no sink; a huge one takes everything.
        let mut y = vec![0.5, -0.5];
        softmax_with_sink(&mut y, -1e4);
        assert!((y[0] + y[1] - 1.0).abs() < 1e-6);
        softmax_with_sink(&mut y, 1e4);
        assert!(y.iter().all(|&w| w == 0.0));
    }

    #[test]
    fn clamped_swiglu_clamps_the_gate_above_and_up_on_both_sides() {
        let (alpha, limit) = (1.702, 7.0);
        let sig = |x: f32| 1.0 / (1.0 + (-x).exp());
        let mut gate = vec![1.0, 20.0, -3.0];
        clamped_swiglu(&mut gate, &[0.5, -20.0, 9.0], alpha, limit);
        let want = [
            1.5 * sig(alpha),
            (-7.0 + 1.0) * 7.0 * sig(alpha * 7.0),
            8.0 * -3.0 * sig(alpha * -3.0),
        ];
        for (got, want) in gate.iter().zip(want) {
            assert!((got - want).abs() < 1e-5, "{got} vs {want}");
        }
    }

    #[test]
    fn softmax_sums_to_one_and_keeps_order() {
        let mut x = [1.0f32, 3.0, 2.0];
        softmax(&mut x);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(x[1] > x[2] && x[2] > x[0]);
    }
}
