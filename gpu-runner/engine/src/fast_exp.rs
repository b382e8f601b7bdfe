//! `e^x` for loops that must vectorise: the CPU backend's activations (SiLU, GELU) and the
//! sampler's softmax weights over a whole vocabulary (libm's `expf` is a call per element).

/// `e^x` to within a few ulp, branch-free so that loops over it vectorise (libm's `expf`
/// is a call per element). Cephes' polynomial on `x − n·ln 2`, scaled by `2^n` built from
/// bits; inputs are clamped to where `e^x` is a normal f32, so huge inputs give ~3e38 and
/// very negative ones ~1e-38 instead of inf and 0 (callers only divide by `1 + e^x`).
#[inline(always)]
pub fn exp_fast(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding 1.5·2^23 rounds to an integer, which then sits in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 88.0);
    let t = x * LOG2E + ROUND;
    let n = t - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = ((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
        + 1.666_666_5e-1)
        * r
        + 5.0e-1;
    let er = p * r * r + r + 1.0;
    // Wrapping: the clamp keeps these in range, and an overflow check (debug builds, tests)
    // would stop the loops around this from vectorising.
    let n_int = (t.to_bits() as i32).wrapping_sub(ROUND.to_bits() as i32);
    er * f32::from_bits((n_int.wrapping_add(127) << 23) as u32)
}

#[cfg(test)]
mod tests {
    use super::exp_fast;

    #[test]
    fn exp_fast_matches_libm_within_a_few_ulp_and_saturates_instead_of_overflowing() {
        for i in -8700..=8800 {
            let x = i as f32 * 0.01;
            let (want, got) = (x.exp(), exp_fast(x));
            assert!(
                (got - want).abs() <= 4.0 * f32::EPSILON * want,
                "x={x}: {got} vs {want}"
            );
        }
        assert!(exp_fast(1000.0).is_finite() && exp_fast(1000.0) > 1e38);
        assert!(exp_fast(-1000.0) >= 0.0 && exp_fast(-1000.0) < 1e-37);
        assert_eq!(exp_fast(0.0), 1.0);
    }
}
