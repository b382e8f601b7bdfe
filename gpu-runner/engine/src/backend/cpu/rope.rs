//! Rotary position embeddings: per-pair inverse frequencies (with linear, Llama 3 or YaRN
//! scaling, or GGUF `rope_freqs` divisors), per-step cos/sin tables for the batch's
//! positions (times YaRN's attention factor), and rotation in either pairing convention.

use crate::model::{RopeScaling, RopeStyle, Yarn};

/// Inverse frequency of each rotated pair `i < head_dim/2`:
/// `base^(-2i/d) / divisor_i`, where the divisor comes from the scaling scheme.
pub fn inv_freqs(
    head_dim: usize,
    base: f32,
    scaling: RopeScaling,
    freq_factors: Option<&[f32]>,
) -> Vec<f64> {
    let half = head_dim / 2;
    (0..half)
        .map(|i| {
            let freq = (base as f64).powf(-2.0 * i as f64 / head_dim as f64);
            let divisor = match scaling {
                RopeScaling::None => 1.0,
                RopeScaling::Linear { factor } => factor as f64,
                RopeScaling::Llama3 {
                    factor,
                    low_freq_factor,
                    high_freq_factor,
                    original_context,
                } => llama3_divisor(
                    freq,
                    factor,
                    low_freq_factor,
                    high_freq_factor,
                    original_context,
                ),
                RopeScaling::Yarn(yarn) => yarn_divisor(i, head_dim, base, &yarn),
            };
            let file_factor = freq_factors
                .and_then(|f| f.get(i))
                .map_or(1.0, |&f| f as f64);
            freq / (divisor * file_factor)
        })
        .collect()
}

/// Llama 3.1's smooth interpolation: high frequencies kept, low ones divided by `factor`,
/// a linear blend in between (as in HF `_compute_llama3_parameters`).
fn llama3_divisor(freq: f64, factor: f32, low: f32, high: f32, original_context: usize) -> f64 {
    let (factor, low, high, ctx) = (
        factor as f64,
        low as f64,
        high as f64,
        original_context as f64,
    );
    let wavelen = 2.0 * std::f64::consts::PI / freq;
    let low_freq_wavelen = ctx / low;
    let high_freq_wavelen = ctx / high;
    if wavelen < high_freq_wavelen {
        1.0
    } else if wavelen > low_freq_wavelen {
        factor
    } else {
        let smooth = (ctx / wavelen - low) / (high - low);
        1.0 / ((1.0 - smooth) / factor + smooth)
    }
}

/// What cos and sin are multiplied by: YaRN's attention factor, else 1.
pub fn attention_factor(scaling: RopeScaling) -> f32 {
    match scaling {
        RopeScaling::Yarn(yarn) => yarn.attention_factor,
        _ => 1.0,
    }
}

/// YaRN's blend for pair `i` (transformers' `_compute_yarn_parameters`): pairs that turn
/// more than `beta_fast` times over the original context keep their frequency, those under
/// `beta_slow` are divided by `factor`, a linear ramp over pair indices in between.
fn yarn_divisor(i: usize, head_dim: usize, base: f32, y: &Yarn) -> f64 {
    let (dim, base, ctx) = (head_dim as f64, base as f64, y.original_context as f64);
    // The pair index at which a frequency turns `rotations` times over the context.
    let correction_dim = |rotations: f64| {
        dim * (ctx / (rotations * 2.0 * std::f64::consts::PI)).ln() / (2.0 * base.ln())
    };
    let (mut low, mut high) = (
        correction_dim(y.beta_fast as f64),
        correction_dim(y.beta_slow as f64),
    );
    if y.truncate {
        (low, high) = (low.floor(), high.ceil());
    }
    let (low, mut high) = (low.max(0.0), high.min(dim - 1.0));
    if low == high {
        high += 0.001;
    }
    let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
    let extrapolation = 1.0 - ramp;
    let factor = y.factor as f64;
    1.0 / ((1.0 - extrapolation) / factor + extrapolation)
}

/// cos/sin of every (token, pair) of one step, reused across layers and steps.
#[derive(Default)]
pub struct RopeTable {
    cos: Vec<f32>,
    sin: Vec<f32>,
    half: usize,
}

impl RopeTable {
    /// Fills the table for `positions` (one per token of the step).
    pub fn fill(&mut self, inv_freq: &[f64], positions: &[usize]) {
        self.fill_scaled(inv_freq, positions, 1.0);
    }

    /// [`RopeTable::fill`] with cos and sin multiplied by `scale` (YaRN's attention factor,
    /// see [`attention_factor`]).
    pub fn fill_scaled(&mut self, inv_freq: &[f64], positions: &[usize], scale: f32) {
        self.half = inv_freq.len();
        self.cos.clear();
        self.sin.clear();
        for &p in positions {
            for &f in inv_freq {
                let angle = p as f64 * f;
                self.cos.push(angle.cos() as f32 * scale);
                self.sin.push(angle.sin() as f32 * scale);
            }
        }
    }

    /// Rotates every head of every token row of `x` (`n_heads · head_dim` wide).
    pub fn apply(&self, x: &mut [f32], n_heads: usize, style: RopeStyle) {
        let half = self.half;
        let hd = half * 2;
        for (t, row) in x.chunks_exact_mut(n_heads * hd).enumerate() {
            let cos = &self.cos[t * half..(t + 1) * half];
            let sin = &self.sin[t * half..(t + 1) * half];
            for head in row.chunks_exact_mut(hd) {
                rotate(head, cos, sin, style);
            }
        }
    }
}

fn rotate(head: &mut [f32], cos: &[f32], sin: &[f32], style: RopeStyle) {
    let half = cos.len();
    match style {
        RopeStyle::Interleaved => {
            for i in 0..half {
                let (a, b) = (head[2 * i], head[2 * i + 1]);
                head[2 * i] = a * cos[i] - b * sin[i];
                head[2 * i + 1] = a * sin[i] + b * cos[i];
            }
        }
        RopeStyle::Neox => {
            let (lo, hi) = head.split_at_mut(half);
            for i in 0..half {
                let (a, b) = (lo[i], hi[i]);
                lo[i] = a * cos[i] - b * sin[i];
                hi[i] = a * sin[i] + b * cos[i];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotation_preserves_norm_and_position_zero_is_identity() {
        let inv = inv_freqs(8, 10_000.0, RopeScaling::None, None);
        let mut table = RopeTable::default();
        table.fill(&inv, &[0, 7]);
        let orig: Vec<f32> = (0..16).map(|i| i as f32 - 3.0).collect();
        for style in [RopeStyle::Interleaved, RopeStyle::Neox] {
            let mut x = orig.clone();
            table.apply(&mut x, 1, style);
            assert_eq!(&x[..8], &orig[..8]);
            let n0: f32 = orig[8..].iter().map(|v| v * v).sum();
            let n1: f32 = x[8..].iter().map(|v| v * v).sum();
            assert!((n0 - n1).abs() < 1e-3);
        }
    }

    #[test]
    fn llama3_scaling_keeps_high_and_divides_low_frequencies() {
        let scaling = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_context: 8192,
        };
        let plain = inv_freqs(128, 500_000.0, RopeScaling::None, None);
        let scaled = inv_freqs(128, 500_000.0, scaling, None);
        assert_eq!(plain[0], scaled[0]);
        assert!((plain[63] / scaled[63] - 8.0).abs() < 1e-9);
    }

    #[test]
    fn yarn_keeps_fast_pairs_divides_slow_ones_and_ramps_between() {
        // gpt-oss's settings: head_dim 64, base 150 000, ×32 over a 4096-token original.
        let yarn = Yarn {
            factor: 32.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            original_context: 4096,
            truncate: false,
            attention_factor: 1.0 + 0.1 * 32f32.ln(),
        };
        let plain = inv_freqs(64, 150_000.0, RopeScaling::None, None);
        let scaled = inv_freqs(64, 150_000.0, RopeScaling::Yarn(yarn), None);
        assert_eq!(plain[0], scaled[0]);
        assert!((plain[31] / scaled[31] - 32.0).abs() < 1e-9);
        let ratios: Vec<f64> = plain.iter().zip(&scaled).map(|(p, s)| p / s).collect();
        assert!(ratios.windows(2).all(|w| w[0] <= w[1]), "{ratios:?}");
        assert!(ratios.iter().any(|&r| r > 1.0 && r < 32.0), "{ratios:?}");
        assert!((attention_factor(RopeScaling::Yarn(yarn)) - 1.3466).abs() < 1e-4);
    }

    #[test]
    fn truncating_rounds_yarns_ramp_to_whole_pairs() {
        // head_dim 64, base 150 000, 4096 tokens: the ramp runs over pairs 8.09..17.39,
        // or 8..18 truncated.
        let yarn = |truncate| {
            RopeScaling::Yarn(Yarn {
                factor: 32.0,
                beta_fast: 32.0,
                beta_slow: 1.0,
                original_context: 4096,
                truncate,
                attention_factor: 1.0,
            })
        };
        let plain = inv_freqs(64, 150_000.0, RopeScaling::None, None);
        let exact = inv_freqs(64, 150_000.0, yarn(false), None);
        let rounded = inv_freqs(64, 150_000.0, yarn(true), None);
        let ratio = |v: &[f64], i: usize| plain[i] / v[i];
        // Ramp 0.1 at pair 9: the divisor is 1 / (0.1 / 32 + 0.9).
        assert!((ratio(&rounded, 9) - 1.0 / (0.1 / 32.0 + 0.9)).abs() < 1e-9);
        assert!((ratio(&exact, 9) - ratio(&rounded, 9)).abs() > 1e-4);
        assert!((ratio(&rounded, 17) - 1.0 / (0.9 / 32.0 + 0.1)).abs() < 1e-9);
        assert_eq!(ratio(&rounded, 8), 1.0);
        assert!((ratio(&exact, 18) - 32.0).abs() < 1e-9);
    }

    #[test]
    fn the_attention_factor_scales_the_rotation() {
        let inv = inv_freqs(4, 10_000.0, RopeScaling::None, None);
        let mut table = RopeTable::default();
        table.fill_scaled(&inv, &[3], 2.0);
        let mut x = vec![1.0, 0.0, 0.0, 0.0];
        table.apply(&mut x, 1, RopeStyle::Neox);
        let norm: f32 = x.iter().map(|v| v * v).sum::<f32>().sqrt();
        assert!((norm - 2.0).abs() < 1e-6);
    }
}
