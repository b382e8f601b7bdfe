//! The encoder's element-wise arithmetic: LayerNorm with bias, and GELU (exact, through
//! `erf`, or its tanh approximation).

use super::config::Gelu;
use super::weights::Norm;
use crate::team;

/// LayerNorm of every row of `x` in place: `(x − mean) / √(var + eps) · w + b`, with the
/// biased variance, as torch computes it (two passes: stabler than `E[x²] − E[x]²`).
pub(crate) fn layer_norm_rows(x: &mut [f32], norm: &Norm, eps: f32) {
    let d = norm.weight.len();
    for row in x.chunks_exact_mut(d) {
        let mean = row.iter().sum::<f32>() / d as f32;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / d as f32;
        let inv = 1.0 / (var + eps).sqrt();
        for ((v, &w), &b) in row.iter_mut().zip(&norm.weight).zip(&norm.bias) {
            *v = (*v - mean) * inv * w + b;
        }
    }
}

/// `erf(x)` by Abramowitz & Stegun 7.1.26 (absolute error below 1.5e-7, under f32's own
/// rounding at GELU's scale); std has no `erf`.
pub(crate) fn erf(x: f32) -> f32 {
    let a = x.abs();
    let t = 1.0 / (1.0 + 0.327_591_1 * a);
    let poly = ((((1.061_405_4 * t - 1.453_152_1) * t + 1.421_413_8) * t - 0.284_496_74) * t
        + 0.254_829_6)
        * t;
    (1.0 - poly * (-a * a).exp()).copysign(x)
}

fn gelu(x: f32, kind: Gelu) -> f32 {
    match kind {
        Gelu::Erf => 0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2)),
        Gelu::Tanh => {
            let inner = 0.797_884_6 * (x + 0.044_715 * x * x * x);
            0.5 * x * (1.0 + inner.tanh())
        }
    }
}

/// GELU over all of `x`, split over the worker team: a batch's feed-forward activations
/// (tokens × 4·hidden exps) are otherwise the largest serial part of a layer.
pub(crate) fn gelu_inplace(x: &mut [f32], kind: Gelu) {
    let mut chunks: Vec<&mut [f32]> = x.chunks_mut(16 << 10).collect();
    team::for_each_mut(&mut chunks, |chunk| {
        chunk.iter_mut().for_each(|v| *v = gelu(*v, kind));
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_matches_known_values_within_two_ten_millionths() {
        let known = [
            (0.0, 0.0),
            (0.1, 0.112_462_916),
            (0.5, 0.520_499_9),
            (1.0, 0.842_700_8),
            (-2.0, -0.995_322_3),
            (3.5, 0.999_999_3),
        ];
        for (x, want) in known {
            assert!(
                (erf(x) - want).abs() < 2e-7,
                "erf({x}) = {}, want {want}",
                erf(x)
            );
        }
    }

    #[test]
    fn layer_norm_centres_scales_and_shifts() {
        let norm = Norm {
            weight: vec![2.0, 2.0],
            bias: vec![1.0, 0.0],
        };
        let mut x = [3.0, 5.0];
        layer_norm_rows(&mut x, &norm, 0.0);
        assert_eq!(x, [-1.0, 2.0]);
    }
}
