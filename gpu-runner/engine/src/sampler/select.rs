//! The linear passes a token choice is made of: the greedy argmax, top-p's nucleus and the
//! inverse-CDF pick of a uniform number (a whole draw is [`super::TokenDraw`]).

/// Index of the largest logit, ties to the lowest index, NaN never chosen; 0 for an empty
/// row or one without a number. Device backends' argmax kernels match this definition.
///
/// Two passes: a maximum over 16 independent lanes (compiled to vector max instructions:
/// a comparison with NaN is false, so NaN never wins), then the first index holding it.
/// One serial compare-and-branch per logit took 4 % of a 16-stream Gemma 3 decode step
/// (262k logits per row).
pub fn argmax(logits: &[f32]) -> u32 {
    let max = max_logit(logits);
    // All −∞ finds the first −∞ (the first number), as the one-pass definition does; no
    // number at all finds nothing.
    logits
        .iter()
        .position(|&l| l == max)
        .map_or(0, |i| i as u32)
}

/// The largest logit, NaN ignored (−∞ for a row without a number).
pub(super) fn max_logit(logits: &[f32]) -> f32 {
    const LANES: usize = 16;
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = logits.chunks_exact(LANES);
    let rest = chunks.remainder();
    for chunk in chunks {
        for (m, &l) in lanes.iter_mut().zip(chunk) {
            *m = if l > *m { l } else { *m };
        }
    }
    lanes
        .iter()
        .chain(rest)
        .fold(f32::NEG_INFINITY, |m, &l| if l > m { l } else { m })
}

/// Keeps the fewest best candidates (by `by`, which must order them by falling weight)
/// whose weights reach `nucleus`. Linear: one pass sums the weights into buckets by their
/// f32 bits (16 per power of two, so a bucket's weights are all above the next one's), the
/// buckets from the top decide which are wholly in, and only the boundary bucket's few
/// candidates are sorted. Sorting all candidates (most of a flat 262k-token
/// distribution) took 13.7 ms per draw, halving selections 2.9 ms. The worst kept candidate
/// is left last.
pub(super) fn keep_nucleus(
    candidates: &mut Vec<u32>,
    weights: &[f32],
    nucleus: f32,
    by: impl Fn(&u32, &u32) -> std::cmp::Ordering,
) {
    let mut mass = [0f64; BUCKETS];
    for &t in candidates.iter() {
        mass[bucket(weights, t)] += f64::from(weights[t as usize]);
    }
    let mut need = f64::from(nucleus);
    let mut boundary = 0;
    for b in (0..mass.len()).rev() {
        if mass[b] > 0.0 {
            boundary = b;
            if mass[b] >= need {
                break;
            }
            need -= mass[b];
        }
    }
    let first_edge = keep_from_bucket(candidates, weights, boundary);
    candidates[first_edge..].sort_unstable_by(&by);
    let mut kept = first_edge;
    let mut acc = 0.0f64;
    for &t in &candidates[first_edge..] {
        kept += 1;
        acc += f64::from(weights[t as usize]);
        if acc >= need {
            break;
        }
    }
    candidates.truncate(kept.max(1));
}

/// Keeps the `k` best candidates (by `by`, which must order them by falling weight), the
/// worst of them last. Linear like [`keep_nucleus`]: counts by weight bucket find the bucket
/// the k-th best falls in, and only that bucket's candidates are ordered (a selection over
/// all of a 262k vocabulary took ~2 ms per draw).
pub(super) fn keep_top_k(
    candidates: &mut Vec<u32>,
    weights: &[f32],
    k: usize,
    by: impl Fn(&u32, &u32) -> std::cmp::Ordering,
) {
    if k == 0 || k >= candidates.len() {
        return;
    }
    let mut count = [0u32; BUCKETS];
    for &t in candidates.iter() {
        count[bucket(weights, t)] += 1;
    }
    let mut need = k;
    let mut boundary = 0;
    for b in (0..count.len()).rev() {
        let c = count[b] as usize;
        if c > 0 {
            boundary = b;
            if c >= need {
                break;
            }
            need -= c;
        }
    }
    let first_edge = keep_from_bucket(candidates, weights, boundary);
    let edge = &mut candidates[first_edge..];
    if need < edge.len() {
        // The need-th best of the bucket lands at need - 1, the better ones before it.
        edge.select_nth_unstable_by(need - 1, &by);
    }
    candidates.truncate(first_edge + need);
}

/// Weight buckets of [`bucket`].
const BUCKETS: usize = 1 << 12;

/// A weight's bucket: positive finite f32s order like their bits, and the top 13 bits are
/// the exponent and 4 mantissa bits (16 buckets per power of two), so every weight of a
/// bucket is above every weight of a lower one.
fn bucket(weights: &[f32], t: u32) -> usize {
    (weights[t as usize].to_bits() >> 19) as usize
}

/// Drops the candidates below bucket `boundary` and moves those above it first; returns
/// where the boundary bucket's begin.
fn keep_from_bucket(candidates: &mut Vec<u32>, weights: &[f32], boundary: usize) -> usize {
    candidates.retain(|&t| bucket(weights, t) >= boundary);
    let mut first_edge = 0;
    for i in 0..candidates.len() {
        if bucket(weights, candidates[i]) != boundary {
            candidates.swap(i, first_edge);
            first_edge += 1;
        }
    }
    first_edge
}

/// Which tokens a draw keeps, all of positive weight.
#[derive(Debug, Clone, Copy)]
pub(super) enum Kept {
    Every,
    /// Weighing at least this (min-p).
    AtLeast(f32),
    /// No later than this token in the order of falling weight, ties by id: a prefix of
    /// that order (top-k, top-p), marked by its last token.
    UpTo {
        weight: f32,
        id: u32,
    },
}

/// The kept token `u` (uniform in [0, 1)) picks by inverse CDF over the weights
/// (unnormalised, indexed by token id), walking the ids in order; `None` when nothing kept
/// weighs anything.
///
/// Two linear passes and no sort: ordering even a top-p prefix by id (most of a flat
/// 262k-token distribution) took 1 ms per draw.
pub(super) fn pick_in_id_order(weights: &[f32], kept: Kept, u: f32) -> Option<u32> {
    match kept {
        // Weights are never negative: every token counts as it weighs.
        Kept::Every => pick_where(weights, u, |_, _| true),
        Kept::AtLeast(min) => pick_where(weights, u, |_, w| w >= min),
        // Non-short-circuiting, so that the total's pass vectorises.
        Kept::UpTo { weight, id } => pick_where(weights, u, |t, w| {
            (w > weight) | ((w == weight) & (t <= id))
        }),
    }
}

fn pick_where(weights: &[f32], u: f32, keeps: impl Fn(u32, f32) -> bool) -> Option<u32> {
    let total = lane_sum(weights, |t, w| if keeps(t, w) { w } else { 0.0 });
    if total.is_nan() || total <= 0.0 {
        return None;
    }
    let target = f64::from(u) * total;
    let mut acc = 0.0f64;
    let mut picked = None;
    for (t, &w) in weights.iter().enumerate() {
        if w > 0.0 && keeps(t as u32, w) {
            acc += f64::from(w);
            picked = Some(t as u32);
            if target < acc {
                break;
            }
        }
    }
    picked
}

/// [`pick_in_id_order`] over a list of kept tokens, walked in the order given (by id for
/// the same pick).
pub(super) fn pick_listed(kept: &[u32], weights: &[f32], u: f32) -> Option<u32> {
    let weight = |t: u32| f64::from(weights[t as usize]);
    let total: f64 = kept.iter().map(|&t| weight(t)).sum();
    if total.is_nan() || total <= 0.0 {
        return None;
    }
    let target = f64::from(u) * total;
    let mut acc = 0.0f64;
    for &token in kept {
        acc += weight(token);
        if target < acc {
            return Some(token);
        }
    }
    kept.last().copied()
}

/// Σ of `counted(id, weight)` over the weights, in f64 (against rounding) and in sixteen
/// partial sums, so that the pass vectorises.
fn lane_sum(weights: &[f32], counted: impl Fn(u32, f32) -> f32) -> f64 {
    let mut lanes = [0f64; 16];
    let chunks = weights.chunks_exact(16);
    let rest = chunks.remainder();
    let mut first = 0u32;
    for chunk in chunks {
        for i in 0..16 {
            lanes[i] += f64::from(counted(first + i as u32, chunk[i]));
        }
        first += 16;
    }
    let rest: f64 = rest
        .iter()
        .enumerate()
        .map(|(i, &w)| f64::from(counted(first + i as u32, w)))
        .sum();
    lanes.iter().sum::<f64>() + rest
}
