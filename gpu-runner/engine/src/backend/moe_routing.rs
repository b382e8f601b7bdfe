//! Mixture-of-experts routing, the bookkeeping half: router logits → each token's experts
//! and weights (softmax, top-k, optional renormalisation, as transformers and llama.cpp
//! compute them), then the step's tokens grouped by expert, so that each active expert runs
//! once per step over all its tokens and experts no token chose are never touched.

/// One step's routing. Buffers are kept between steps.
#[derive(Debug, Default, Clone)]
pub struct Routing {
    top_k: usize,
    /// `top_k` `(expert, weight)` per token, best first.
    choices: Vec<(u32, f32)>,
    /// Expert `e`'s slots are `slots[offsets[e]..offsets[e + 1]]`.
    offsets: Vec<usize>,
    /// `(token, weight)` grouped by expert, tokens ascending within an expert.
    slots: Vec<(u32, f32)>,
    probs: Vec<f32>,
}

impl Routing {
    /// Routes `n_tokens` tokens from their router `logits` (`n_tokens × n_experts`).
    ///
    /// # Panics
    /// If `logits` is not `n_tokens × n_experts` or `top_k` is 0 or above `n_experts` (the
    /// config is validated at load, so a caller bug).
    pub fn route(&mut self, logits: &[f32], n_experts: usize, top_k: usize, norm_topk: bool) {
        assert!(0 < top_k && top_k <= n_experts, "route: bad top_k {top_k}");
        assert!(
            logits.len().is_multiple_of(n_experts),
            "route: ragged logits"
        );
        let n_tokens = logits.len() / n_experts;
        self.top_k = top_k;
        self.choices.clear();
        for row in logits.chunks_exact(n_experts) {
            softmax_into(row, &mut self.probs);
            let start = self.choices.len();
            for _ in 0..top_k {
                let (best, p) = self.probs.iter().enumerate().fold(
                    (0, f32::NEG_INFINITY),
                    |(bi, bp), (i, &p)| {
                        if p > bp {
                            (i, p)
                        } else {
                            (bi, bp)
                        }
                    },
                );
                self.choices.push((best as u32, p));
                // Taken: never chosen again (probabilities are >= 0).
                self.probs[best] = f32::NEG_INFINITY;
            }
            if norm_topk {
                let picked = &mut self.choices[start..];
                let sum: f32 = picked.iter().map(|&(_, p)| p).sum();
                if sum > 0.0 {
                    picked.iter_mut().for_each(|(_, p)| *p /= sum);
                }
            }
        }
        self.group(n_tokens, n_experts);
    }

    /// Counting sort of the choices by expert.
    fn group(&mut self, n_tokens: usize, n_experts: usize) {
        self.offsets.clear();
        self.offsets.resize(n_experts + 1, 0);
        for &(e, _) in &self.choices {
            self.offsets[e as usize + 1] += 1;
        }
        for e in 0..n_experts {
            self.offsets[e + 1] += self.offsets[e];
        }
        self.slots.clear();
        self.slots.resize(self.choices.len(), (0, 0.0));
        let mut next = self.offsets.clone();
        for t in 0..n_tokens {
            for &(e, w) in &self.choices[t * self.top_k..(t + 1) * self.top_k] {
                self.slots[next[e as usize]] = (t as u32, w);
                next[e as usize] += 1;
            }
        }
    }

    /// The experts at least one token chose, ascending.
    pub fn active_experts(&self) -> impl Iterator<Item = usize> + '_ {
        self.offsets
            .windows(2)
            .enumerate()
            .filter(|(_, w)| w[1] > w[0])
            .map(|(e, _)| e)
    }

    /// Expert `e`'s tokens and their weights.
    pub fn expert_slots(&self, e: usize) -> &[(u32, f32)] {
        &self.slots[self.offsets[e]..self.offsets[e + 1]]
    }

    /// Token `t`'s experts and weights, best first.
    pub fn token_choices(&self, t: usize) -> &[(u32, f32)] {
        &self.choices[t * self.top_k..(t + 1) * self.top_k]
    }
}

/// A numerically stable softmax of `row` into `out`.
fn softmax_into(row: &[f32], out: &mut Vec<f32>) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    out.clear();
    out.extend(row.iter().map(|&x| (x - max).exp()));
    let sum: f32 = out.iter().sum();
    out.iter_mut().for_each(|p| *p /= sum);
}

#[cfg(test)]
mod tests {
    use super::Routing;

    #[test]
    fn each_token_gets_its_top_k_experts_best_first() {
        let mut r = Routing::default();
        // 2 tokens × 4 experts.
        r.route(&[0.0, 3.0, 1.0, 2.0, 5.0, 0.0, 0.0, 4.0], 4, 2, false);
        let experts = |t| r.token_choices(t).iter().map(|c| c.0).collect::<Vec<_>>();
        assert_eq!(experts(0), [1, 3]);
        assert_eq!(experts(1), [0, 3]);
        // Without renormalisation the weights are the softmax over all experts.
        let z: f32 = [0.0f32, 3.0, 1.0, 2.0].iter().map(|x| x.exp()).sum();
        assert!((r.token_choices(0)[0].1 - 3f32.exp() / z).abs() < 1e-6);
    }

    #[test]
    fn renormalised_weights_sum_to_one_in_the_softmax_ratio() {
        let mut r = Routing::default();
        r.route(&[0.0, 3.0, 1.0, 2.0], 4, 2, true);
        let c = r.token_choices(0);
        assert!((c[0].1 + c[1].1 - 1.0).abs() < 1e-6);
        assert!((c[0].1 / c[1].1 - 1f32.exp()).abs() < 1e-5);
    }

    #[test]
    fn tokens_are_grouped_by_expert_and_unchosen_experts_are_inactive() {
        let mut r = Routing::default();
        // 3 tokens × 4 experts, top-1: tokens 0 and 2 pick expert 2, token 1 expert 0.
        r.route(
            &[0.0, 0.0, 9.0, 0.0, 9.0, 0.0, 0.0, 0.0, 0.0, 0.0, 9.0, 0.0],
            4,
            1,
            true,
        );
        assert_eq!(r.active_experts().collect::<Vec<_>>(), [0, 2]);
        let tokens = |e| r.expert_slots(e).iter().map(|s| s.0).collect::<Vec<_>>();
        assert_eq!(tokens(2), [0, 2]);
        assert_eq!(tokens(0), [1]);
        assert!(r.expert_slots(1).is_empty());
        assert!(r.expert_slots(2).iter().all(|s| s.1 == 1.0));
    }

    #[test]
    fn a_step_with_no_tokens_routes_nothing() {
        let mut r = Routing::default();
        r.route(&[], 4, 2, true);
        assert_eq!(r.active_experts().count(), 0);
    }
}
