//! One sampled token's draw as a value that can travel: the sampling knobs plus the uniform
//! number from the sequence's RNG. It is the one definition of a sampled token: the host
//! sampler draws with [`TokenDraw::pick_with`], and a backend that keeps the logits where
//! they were computed (the CUDA backend's `pick_rows` kernel) draws the same token there and
//! copies back one id instead of a vocabulary of floats.
//!
//! The draw samples `softmax(logits / temperature)` restricted to a prefix of the tokens ordered by falling
//! probability (ties by id): those of at least `min_p` of the best one's probability, the
//! first `top_k` of them, then the fewest whose mass reaches `top_p` of theirs. Then `u`
//! picks among the prefix in token order, by weight (inverse CDF). With `logprobs` the
//! backend also returns the token's logprob and the best alternatives, as the host sampler
//! reports them (log-softmax of the raw logits, before temperature and truncation).

use super::select::{self, Kept};
use super::{argmax, logprobs, Sampled, GREEDY_TEMPERATURE};
use crate::fast_exp::exp_fast;

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
        let (logprob, top) = logprobs::report(&clean, token, usize::from(n), &mut Vec::new());
        Sampled {
            token,
            logprob: Some(logprob),
            top,
        }
    }

    /// The token this draw picks from a row of raw logits (NaN never picked).
    pub fn pick(&self, logits: &[f32]) -> u32 {
        self.pick_with(logits, &mut DrawScratch::default())
    }

    /// [`TokenDraw::pick`] with buffers reused from draw to draw (the host sampler draws for
    /// every sampled sequence of every step).
    ///
    /// Every pass over the vocabulary is linear and vectorisable (a 262k-token draw took
    /// 13.7 ms with a full sort for top-p): only the bucket of similar weights that top-k's
    /// or top-p's boundary falls in is ordered ([`select::keep_top_k`],
    /// [`select::keep_nucleus`]).
    pub(super) fn pick_with(&self, logits: &[f32], scratch: &mut DrawScratch) -> u32 {
        if self.temperature < GREEDY_TEMPERATURE {
            return argmax(logits);
        }
        let max = select::max_logit(logits);
        if !max.is_finite() {
            return argmax(logits);
        }
        // Unnormalised probabilities relative to the best token (whose weight is 1), so
        // min-p compares against its threshold directly. NaN and masked (−∞) tokens weigh 0.
        let inv_t = 1.0 / self.temperature;
        let DrawScratch {
            candidates,
            weights,
        } = scratch;
        weights.clear();
        weights.extend(logits.iter().map(|&l| {
            let x = (l - max) * inv_t;
            // One comparison, false for NaN too.
            if x >= -87.0 {
                exp_fast(x)
            } else {
                0.0
            }
        }));
        let top_k = self.top_k as usize;
        let filtered = self.min_p > 0.0 || (top_k > 0 && top_k < logits.len()) || self.top_p < 1.0;
        if !filtered {
            return select::pick_in_id_order(weights, Kept::Every, self.u)
                .unwrap_or_else(|| argmax(logits));
        }
        let min_weight = self.min_p.clamp(0.0, 1.0);
        let by_weight_desc = |a: &u32, b: &u32| {
            weights[*b as usize]
                .total_cmp(&weights[*a as usize])
                .then(a.cmp(b))
        };
        // min-p alone keeps a threshold; top-k and top-p a prefix of the order, marked by
        // its worst token, which both leave last.
        let mut kept = Kept::AtLeast(min_weight);
        if top_k > 0 && top_k < logits.len() || self.top_p < 1.0 {
            candidates.clear();
            candidates.extend((0..logits.len() as u32).filter(|&t| {
                let w = weights[t as usize];
                w > 0.0 && w >= min_weight
            }));
            let mut cut = false;
            if top_k > 0 && top_k < candidates.len() {
                select::keep_top_k(candidates, weights, top_k, by_weight_desc);
                cut = true;
            }
            if self.top_p < 1.0 {
                let mass: f64 = candidates
                    .iter()
                    .map(|&t| f64::from(weights[t as usize]))
                    .sum();
                let nucleus = self.top_p * mass as f32;
                select::keep_nucleus(candidates, weights, nucleus, by_weight_desc);
                cut = true;
            }
            if cut && candidates.len() <= logits.len() / SHORT_PREFIX_FRACTION {
                // A typical top-k or top-p prefix: a few tokens, quicker walked as a list.
                candidates.sort_unstable();
                return select::pick_listed(candidates, weights, self.u)
                    .unwrap_or_else(|| argmax(logits));
            }
            if let (true, Some(&id)) = (cut, candidates.last()) {
                kept = Kept::UpTo {
                    weight: weights[id as usize],
                    id,
                };
            }
        }
        select::pick_in_id_order(weights, kept, self.u).unwrap_or_else(|| argmax(logits))
    }
}

/// A kept prefix of at most this fraction of the vocabulary is sorted by id and walked as a
/// list; a longer one is picked by a pass over every token ([`Kept::UpTo`]).
const SHORT_PREFIX_FRACTION: usize = 32;

/// Buffers a draw reuses: weights indexed by token id, and the kept tokens.
#[derive(Debug, Default)]
pub(super) struct DrawScratch {
    candidates: Vec<u32>,
    weights: Vec<f32>,
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
    fn a_short_prefix_walked_as_a_list_picks_what_a_pass_over_every_token_picks() {
        // Ties among the best tokens, so that top-k cuts inside a tie; dyadic weights keep
        // both walks' sums exact.
        let logits = [
            0.0,
            -std::f32::consts::LN_2,
            0.0,
            -1.386_294_4,
            -std::f32::consts::LN_2,
        ];
        // The same row in a vocabulary 300 times larger (weight 0 elsewhere): the prefixes
        // become short enough for the list.
        let mut wide = vec![f32::NEG_INFINITY; logits.len() * 300];
        wide[..logits.len()].copy_from_slice(&logits);
        for top_k in [0, 1, 2, 3, 4] {
            for top_p in [1.0, 0.3, 0.6, 0.9] {
                for step in 0..20 {
                    let d = TokenDraw {
                        top_k,
                        top_p,
                        ..draw(step as f32 / 20.0)
                    };
                    assert_eq!(
                        d.pick(&logits),
                        d.pick(&wide),
                        "top_k {top_k} top_p {top_p} u {}",
                        d.u
                    );
                }
            }
        }
    }

    #[test]
    fn greedy_and_degenerate_rows_fall_back_to_the_argmax() {
        assert_eq!(TokenDraw::GREEDY.pick(&[0.0, 5.0, f32::NAN, 5.0]), 1);
        // As `argmax` defines it: the first −∞ when no token has a number.
        assert_eq!(draw(0.5).pick(&[f32::NAN, f32::NEG_INFINITY]), 1);
        assert_eq!(draw(0.9).pick(&[f32::NAN, 1.0, f32::NAN]), 1);
    }
}
