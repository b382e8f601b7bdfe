//! One sampled token's draw as a value that can travel: the sampling knobs plus the uniform
//! number from the sequence's RNG. A backend that keeps the logits where they were computed
//! (the CUDA backend's `pick_rows` kernel) draws it there and copies back one id instead of
//! a vocabulary of floats; [`TokenDraw::pick`] is the definition it follows, on the host.
//!
//! It samples the same distribution as the host sampler's own draw (`select::draw`):
//! `softmax(logits / temperature)` restricted to a prefix of the tokens ordered by falling
//! probability (ties by id): those of at least `min_p` of the best one's probability, the
//! first `top_k` of them, then the fewest whose mass reaches `top_p` of theirs. Then `u`
//! picks among the prefix in token order, by weight (inverse CDF). With `logprobs` the
//! backend also returns the token's logprob and the best alternatives, as the host sampler
//! reports them (log-softmax of the raw logits, before temperature and truncation).

use super::{argmax, logprobs, Sampled, GREEDY_TEMPERATURE, MAX_TOP_LOGPROBS};

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenDraw {
    pub temperature: f32,
    /// 0: off.
    pub top_k: u32,
    pub top_p: f32,
    pub min_p: f32,
    /// Uniform in [0, 1).
    pub u: f32,
    /// `Some(n)`: the token's logprob and the `n` (at most [`MAX_TOP_LOGPROBS`]) most
    /// likely tokens' are wanted too.
    pub logprobs: Option<u8>,
}

impl TokenDraw {
    /// The argmax, as a draw (temperature 0).
    pub const GREEDY: TokenDraw = TokenDraw {
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        u: 0.0,
        logprobs: None,
    };

    /// The token this draw picks from a row of raw logits, with its logprobs when asked.
    pub fn draw(&self, logits: &[f32]) -> Sampled {
        let token = self.pick(logits);
        let Some(n) = self.logprobs else {
            return Sampled {
                token,
                logprob: None,
                top: Vec::new(),
            };
        };
        let clean: Vec<f32> = logits
            .iter()
            .map(|&l| if l.is_nan() { f32::NEG_INFINITY } else { l })
            .collect();
        let norm = logprobs::log_normaliser(&clean);
        let n = usize::from(n).min(MAX_TOP_LOGPROBS);
        Sampled {
            token,
            logprob: Some(logprobs::logprob_of(&clean, norm, token)),
            top: logprobs::top_n(&clean, norm, n, &mut Vec::new()),
        }
    }

    /// The token this draw picks from a row of raw logits (NaN never picked).
    pub fn pick(&self, logits: &[f32]) -> u32 {
        let max = logits
            .iter()
            .copied()
            .filter(|l| !l.is_nan())
            .fold(f32::NEG_INFINITY, f32::max);
        if self.temperature < GREEDY_TEMPERATURE || !max.is_finite() {
            return argmax(logits);
        }
        let inv_t = 1.0 / self.temperature;
        let weights: Vec<f32> = logits
            .iter()
            .map(|&l| {
                let x = (l - max) * inv_t;
                if l.is_nan() || x < -87.0 {
                    0.0
                } else {
                    x.exp()
                }
            })
            .collect();
        let weight = |t: u32| f64::from(weights[t as usize]);
        let min_weight = self.min_p.clamp(0.0, 1.0);
        let mut kept: Vec<u32> = (0..logits.len() as u32)
            .filter(|&t| weights[t as usize] > 0.0 && weights[t as usize] >= min_weight)
            .collect();
        kept.sort_unstable_by(|&a, &b| {
            weights[b as usize]
                .total_cmp(&weights[a as usize])
                .then(a.cmp(&b))
        });
        if self.top_k > 0 {
            kept.truncate(self.top_k as usize);
        }
        if self.top_p < 1.0 {
            let total: f64 = kept.iter().map(|&t| weight(t)).sum();
            let need = f64::from(self.top_p * total as f32);
            let mut acc = 0.0;
            let mut prefix = 0;
            for &t in &kept {
                prefix += 1;
                acc += weight(t);
                if acc >= need {
                    break;
                }
            }
            kept.truncate(prefix.max(1));
        }
        kept.sort_unstable();
        let total: f64 = kept.iter().map(|&t| weight(t)).sum();
        if total <= 0.0 {
            return argmax(logits);
        }
        let target = f64::from(self.u) * total;
        let mut acc = 0.0;
        for &t in &kept {
            acc += weight(t);
            if target < acc {
                return t;
            }
        }
        kept.last().copied().unwrap_or_else(|| argmax(logits))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draw(u: f32) -> TokenDraw {
        TokenDraw {
            temperature: 1.0,
            u,
            ..TokenDraw::GREEDY
        }
    }

    #[test]
    fn u_walks_the_tokens_in_id_order_by_their_probability() {
        // Probabilities 0.5, 0.25, 0.25 (logits ln 2, 0, 0).
        let logits = [std::f32::consts::LN_2, 0.0, 0.0];
        assert_eq!(draw(0.0).pick(&logits), 0);
        assert_eq!(draw(0.49).pick(&logits), 0);
        assert_eq!(draw(0.51).pick(&logits), 1);
        assert_eq!(draw(0.76).pick(&logits), 2);
        assert_eq!(draw(0.999).pick(&logits), 2);
    }

    #[test]
    fn min_p_top_k_and_top_p_keep_a_prefix_of_the_most_likely_tokens() {
        // Token 3 is best, then 0, then 1 and 4 tied, then 2.
        let logits = [2.0, 1.0, -3.0, 3.0, 1.0];
        let last = |d: TokenDraw| d.pick(&logits);
        let with = |f: &dyn Fn(&mut TokenDraw)| {
            let mut d = draw(0.999);
            f(&mut d);
            d
        };
        assert_eq!(last(with(&|d| d.top_k = 1)), 3);
        assert_eq!(
            last(with(&|d| d.top_k = 2)),
            3,
            "{{0, 3}}: the last in id order is 3"
        );
        // Of the tie between 1 and 4 top-k 3 keeps the lower id.
        assert_eq!(last(with(&|d| d.top_k = 3)), 3);
        assert_eq!(with(&|d| d.top_k = 3).pick(&logits), 3);
        let mut low = with(&|d| d.top_k = 3);
        low.u = 0.0;
        assert_eq!(low.pick(&logits), 0);
        // min-p 0.3: e^(2-3) = 0.37 stays, e^(1-3) = 0.14 goes.
        let mut mp = with(&|d| d.min_p = 0.3);
        mp.u = 0.0;
        assert_eq!(mp.pick(&logits), 0);
        // top-p 0.5: token 3 alone holds 0.64 of the mass.
        let mut tp = with(&|d| d.top_p = 0.5);
        tp.u = 0.0;
        assert_eq!(tp.pick(&logits), 3);
    }

    #[test]
    fn greedy_and_degenerate_rows_fall_back_to_the_argmax() {
        assert_eq!(TokenDraw::GREEDY.pick(&[0.0, 5.0, f32::NAN, 5.0]), 1);
        // As `argmax` defines it: the first −∞ when no token has a number.
        assert_eq!(draw(0.5).pick(&[f32::NAN, f32::NEG_INFINITY]), 1);
        assert_eq!(draw(0.9).pick(&[f32::NAN, 1.0, f32::NAN]), 1);
    }
}
