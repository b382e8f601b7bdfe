//! The x86_64 tile kernels of the K-quants (Q4_K, Q5_K, Q6_K; 256 weights a block, in
//! groups of 32 or 16 with their own scales), over the interleaved layout of
//! [`super::interleave`]. Written once and expanded per instruction set by
//! [`x86_ktile_kernels!`], in a module that has expanded [`super::x86_tiles`]'s macro first:
//! these use its helpers (`load_256`, `f16x8`, `prefetch_ahead`, `broadcast4`,
//! `store_tile_group`, `in_tile_groups`) and its imports. The module also supplies
//! `WIDE_REGISTERS`: with 32 vector registers (AVX-512VL) a group of 8 tokens keeps its
//! sums beside a pair of groups' 16 quant vectors; with 16 the groups stop at 4 tokens.
//!
//! Every loop over groups is unrolled through const parameters, so shifts are immediates
//! and each quant vector is loaded once for every group that shares it.

macro_rules! x86_ktile_kernels {
    ($features:literal) => {
        /// The activation block's sums per 32 as i16 pairs, `(s[2p], s[2p + 1])` broadcast to
        /// every lane of `pairs[p]`.
        #[inline]
        #[target_feature(enable = $features)]
        fn bsum32_pairs(a: &BlockQ8K) -> [__m256i; 4] {
            // SAFETY: `bsums` is exactly 16 × i16 = 32 bytes; loadu needs no alignment.
            let bs = unsafe { _mm256_loadu_si256(a.bsums.as_ptr().cast()) };
            let s32 = _mm256_madd_epi16(bs, _mm256_set1_epi16(1));
            // i32 lanes [(s0,s1), (s2,s3), .., .. | (s4,s5), (s6,s7), .., ..] as i16 pairs.
            let packed = _mm256_packs_epi32(s32, s32);
            [0, 1, 4, 5].map(|l| _mm256_permutevar8x32_epi32(packed, _mm256_set1_epi32(l)))
        }

        /// A K-quant tile block's 6-bit scales and mins of its 8 groups of 32 (`scale_min_k4`
        /// of the 12 packed bytes at `tb[32..]`), one lane per row; the mins as i16 pairs
        /// `(m[2p], m[2p + 1])` to meet the activation's sums per 32 ([`bsum32_pairs`]).
        #[inline]
        #[target_feature(enable = $features)]
        fn k4_scales_mins(tb: &[u8]) -> ([__m256i; 8], [__m256i; 4]) {
            let (m4, m6) = (_mm256_set1_epi32(0x0F), _mm256_set1_epi32(63));
            let shr = |v: __m256i, n: i32| _mm256_srlv_epi32(v, _mm256_set1_epi32(n));
            let (sa, sb, sc) = (
                load_256(&tb[32..]),
                load_256(&tb[64..]),
                load_256(&tb[96..]),
            );
            let mut scales = [_mm256_setzero_si256(); 8];
            let mut mins = [_mm256_setzero_si256(); 8];
            for g in 0..4 {
                let k = 8 * g as i32;
                scales[g] = _mm256_and_si256(shr(sa, k), m6);
                mins[g] = _mm256_and_si256(shr(sb, k), m6);
                let high = |v: __m256i| {
                    _mm256_slli_epi32(_mm256_and_si256(shr(v, k + 6), _mm256_set1_epi32(3)), 4)
                };
                scales[g + 4] = _mm256_or_si256(_mm256_and_si256(shr(sc, k), m4), high(sa));
                mins[g + 4] = _mm256_or_si256(_mm256_and_si256(shr(sc, k + 4), m4), high(sb));
            }
            let min_pairs = std::array::from_fn(|p| {
                _mm256_or_si256(mins[2 * p], _mm256_slli_epi32(mins[2 * p + 1], 16))
            });
            (scales, min_pairs)
        }

        /// Groups `2P` (low nibbles) and `2P + 1` (high nibbles) of a Q4_K/Q5_K tile block,
        /// added to `tot` scaled. One load gives both groups' quants, and the two groups'
        /// sums are separate chains (at one token a single chain of 16 `vpdpbusd` would
        /// wait on its own latency). `P` is a constant so every shift is an immediate.
        #[inline]
        #[target_feature(enable = $features)]
        fn q45_k_pair<const FIVE: bool, const P: usize, const G: usize>(
            tb: &[u8],
            a: &[BlockQ8K],
            scales: &[__m256i; 8],
            tot: &mut [__m256i; G],
        ) {
            let qs_at = if FIVE { 384 } else { 128 };
            let nib = _mm256_set1_epi8(0x0F);
            let mut lo = [_mm256_setzero_si256(); 8];
            let mut hi = [_mm256_setzero_si256(); 8];
            for c in 0..8 {
                let q = load_256(&tb[qs_at + 32 * (8 * P + c)..]);
                lo[c] = _mm256_and_si256(q, nib);
                hi[c] = _mm256_and_si256(_mm256_srli_epi16::<4>(q), nib);
                if FIVE {
                    // Group g's fifth bit is bit g of each byte of the qh vectors.
                    let qh = load_256(&tb[128 + 32 * c..]);
                    let bit = |g: usize| {
                        let sel = _mm256_set1_epi8(1i8 << g);
                        let set = _mm256_cmpeq_epi8(_mm256_and_si256(qh, sel), sel);
                        _mm256_and_si256(set, _mm256_set1_epi8(0x10))
                    };
                    lo[c] = _mm256_or_si256(lo[c], bit(2 * P));
                    hi[c] = _mm256_or_si256(hi[c], bit(2 * P + 1));
                }
            }
            for j in 0..G {
                let qs = &a[j].qs[64 * P..];
                let (mut il, mut ih) = (_mm256_setzero_si256(), _mm256_setzero_si256());
                for c in 0..8 {
                    il = dot_u8_i8_acc(il, lo[c], broadcast4(qs, c));
                    ih = dot_u8_i8_acc(ih, hi[c], broadcast4(&qs[32..], c));
                }
                let scaled = _mm256_add_epi32(
                    _mm256_mullo_epi32(il, scales[2 * P]),
                    _mm256_mullo_epi32(ih, scales[2 * P + 1]),
                );
                tot[j] = _mm256_add_epi32(tot[j], scaled);
            }
        }

        /// Q4_K (`FIVE = false`) and Q5_K tile blocks over tokens `t0 .. t0 + G`. Tile block:
        /// `d[8]`, `dmin[8]`, the 12 packed scale bytes as 3 vectors, (Q5_K) the 32 fifth-bit
        /// bytes as 8 vectors, the 128 nibble bytes as 32 vectors (vector `8p + c` holds
        /// quants `4c..4c+4` of groups `2p` (low) and `2p + 1` (high)).
        #[target_feature(enable = $features)]
        fn tile_group_q45_k<const FIVE: bool, const G: usize>(
            tile: &[u8],
            acts: &[BlockQ8K],
            tn: usize,
            t0: usize,
            out: &mut [f32],
        ) {
            let mut acc = [_mm256_setzero_ps(); G];
            let bytes = if FIVE { 1408 } else { 1152 };
            for (b, tb) in tile.chunks_exact(bytes).enumerate() {
                prefetch_ahead::<G>(tb, t0);
                let (d, dmin) = (f16x8(tb), f16x8(&tb[16..]));
                let (scales, min_pairs) = k4_scales_mins(tb);
                let a = &acts[b * tn + t0..][..G];
                let mut tot = [_mm256_setzero_si256(); G];
                q45_k_pair::<FIVE, 0, G>(tb, a, &scales, &mut tot);
                q45_k_pair::<FIVE, 1, G>(tb, a, &scales, &mut tot);
                q45_k_pair::<FIVE, 2, G>(tb, a, &scales, &mut tot);
                q45_k_pair::<FIVE, 3, G>(tb, a, &scales, &mut tot);
                for j in 0..G {
                    let mut min_sum = _mm256_setzero_si256();
                    for (mp, sp) in min_pairs.iter().zip(bsum32_pairs(&a[j])) {
                        min_sum = dot_i16_acc(min_sum, *mp, sp);
                    }
                    let ad = _mm256_set1_ps(a[j].d);
                    acc[j] =
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(tot[j]), _mm256_mul_ps(d, ad), acc[j]);
                    acc[j] = _mm256_fnmadd_ps(
                        _mm256_cvtepi32_ps(min_sum),
                        _mm256_mul_ps(dmin, ad),
                        acc[j],
                    );
                }
            }
            store_tile_group(&acc, t0, out);
        }

        /// Groups `8N + K4 + {0, 2, 4, 6}` (16 quants each) of a Q6_K tile block, added to
        /// `tot` scaled by `scale(s)`. Those four groups read the same 12 vectors (low
        /// nibbles of `ql[16N + K4·4 ..][..4]` and `ql[16N + 8 + K4·4 ..][..4]`, then their
        /// high nibbles; bit pairs 0..4 of `qh[8N + K4·4 ..][..4]`), so each is loaded once,
        /// and every shift is an immediate.
        #[inline]
        #[target_feature(enable = $features)]
        fn q6_k_quarter<const N: usize, const K4: usize, const G: usize>(
            tb: &[u8],
            a: &[BlockQ8K],
            scale: impl Fn(usize) -> __m256i,
            tot: &mut [__m256i; G],
        ) {
            let nib = _mm256_set1_epi8(0x0F);
            let hi2 = _mm256_set1_epi8(0x30);
            // w[h][i]: quants 4i..4i+4 of group 8N + K4 + 2h, every row.
            let mut w = [[_mm256_setzero_si256(); 4]; 4];
            for i in 0..4 {
                let k = 4 * K4 + i;
                let ql0 = load_256(&tb[144 + 32 * (16 * N + k)..]);
                let ql1 = load_256(&tb[144 + 32 * (16 * N + k + 8)..]);
                let qh = load_256(&tb[1168 + 32 * (8 * N + k)..]);
                // High bits 2h, 2h + 1 of `qh` moved to bits 4, 5 of each byte.
                let high = [
                    _mm256_and_si256(_mm256_slli_epi16::<4>(qh), hi2),
                    _mm256_and_si256(_mm256_slli_epi16::<2>(qh), hi2),
                    _mm256_and_si256(qh, hi2),
                    _mm256_and_si256(_mm256_srli_epi16::<2>(qh), hi2),
                ];
                let low = [
                    _mm256_and_si256(ql0, nib),
                    _mm256_and_si256(ql1, nib),
                    _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), nib),
                    _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), nib),
                ];
                for h in 0..4 {
                    w[h][i] = _mm256_or_si256(low[h], high[h]);
                }
            }
            for (h, wh) in w.iter().enumerate() {
                let s = 8 * N + K4 + 2 * h;
                let sc = scale(s);
                for j in 0..G {
                    let mut isum = _mm256_setzero_si256();
                    for (i, wc) in wh.iter().enumerate() {
                        isum = dot_u8_i8_acc(isum, *wc, broadcast4(&a[j].qs[16 * s..], i));
                    }
                    tot[j] = _mm256_add_epi32(tot[j], _mm256_mullo_epi32(isum, sc));
                }
            }
        }

        /// Q6_K tile blocks over tokens `t0 .. t0 + G`. Tile block: `d[8]`, the 16 i8
        /// scales as 4 vectors, the 128 low-nibble bytes as 32 vectors, the 64 high-bit
        /// bytes as 16 vectors (ggml's element order, see `kquants`).
        #[target_feature(enable = $features)]
        fn tile_group_q6_k<const G: usize>(
            tile: &[u8],
            acts: &[BlockQ8K],
            tn: usize,
            t0: usize,
            out: &mut [f32],
        ) {
            let mut acc = [_mm256_setzero_ps(); G];
            for (b, tb) in tile.chunks_exact(1680).enumerate() {
                prefetch_ahead::<G>(tb, t0);
                let d = f16x8(tb);
                let sv: [__m256i; 4] = std::array::from_fn(|z| load_256(&tb[16 + 32 * z..]));
                // Scale of group s (16 quants) sign-extended, one lane per row.
                let scale = |s: usize| {
                    let up =
                        _mm256_sllv_epi32(sv[s / 4], _mm256_set1_epi32(24 - 8 * (s % 4) as i32));
                    _mm256_srai_epi32(up, 24)
                };
                let a = &acts[b * tn + t0..][..G];
                let mut tot = [_mm256_setzero_si256(); G];
                q6_k_quarter::<0, 0, G>(tb, a, scale, &mut tot);
                q6_k_quarter::<0, 1, G>(tb, a, scale, &mut tot);
                q6_k_quarter::<1, 0, G>(tb, a, scale, &mut tot);
                q6_k_quarter::<1, 1, G>(tb, a, scale, &mut tot);
                // Undo the +32 of the stored quants: 32 · Σ_s sc_s · Σ(x in group s), the
                // scales paired as i16 to meet the activation's sums per 16 (also pairs).
                let pairs: [__m256i; 8] = std::array::from_fn(|t| {
                    _mm256_blend_epi16::<0xAA>(
                        scale(2 * t),
                        _mm256_slli_epi32(scale(2 * t + 1), 16),
                    )
                });
                for j in 0..G {
                    // SAFETY: `bsums` is exactly 16 × i16 = 32 bytes; loadu needs no alignment.
                    let bs = unsafe { _mm256_loadu_si256(a[j].bsums.as_ptr().cast()) };
                    let mut offset = _mm256_setzero_si256();
                    for (t, pair) in pairs.iter().enumerate() {
                        let sums = _mm256_permutevar8x32_epi32(bs, _mm256_set1_epi32(t as i32));
                        offset = dot_i16_acc(offset, *pair, sums);
                    }
                    let total = _mm256_sub_epi32(tot[j], _mm256_slli_epi32(offset, 5));
                    let scale = _mm256_mul_ps(d, _mm256_set1_ps(a[j].d));
                    acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), scale, acc[j]);
                }
            }
            store_tile_group(&acc, t0, out);
        }

        /// The group sizes of a K-quant kernel, largest first: 8 tokens only where
        /// `WIDE_REGISTERS` gives room for their sums.
        fn k_groups<A>(kernels: &[(usize, TileGroupFn<A>); 4]) -> &[(usize, TileGroupFn<A>)] {
            if WIDE_REGISTERS {
                kernels
            } else {
                &kernels[1..]
            }
        }

        fn tile_q45_k<const FIVE: bool>(
            tile: &[u8],
            acts: &[BlockQ8K],
            tn: usize,
            out: &mut [f32],
        ) {
            in_tile_groups(
                tile,
                acts,
                tn,
                out,
                k_groups(&[
                    (8, tile_group_q45_k::<FIVE, 8>),
                    (4, tile_group_q45_k::<FIVE, 4>),
                    (2, tile_group_q45_k::<FIVE, 2>),
                    (1, tile_group_q45_k::<FIVE, 1>),
                ]),
            );
        }

        pub(crate) fn tile_q4_k(tile: &[u8], acts: &[BlockQ8K], tn: usize, out: &mut [f32]) {
            tile_q45_k::<false>(tile, acts, tn, out)
        }

        pub(crate) fn tile_q5_k(tile: &[u8], acts: &[BlockQ8K], tn: usize, out: &mut [f32]) {
            tile_q45_k::<true>(tile, acts, tn, out)
        }

        pub(crate) fn tile_q6_k(tile: &[u8], acts: &[BlockQ8K], tn: usize, out: &mut [f32]) {
            in_tile_groups(
                tile,
                acts,
                tn,
                out,
                k_groups(&[
                    (8, tile_group_q6_k::<8>),
                    (4, tile_group_q6_k::<4>),
                    (2, tile_group_q6_k::<2>),
                    (1, tile_group_q6_k::<1>),
                ]),
            );
        }
    };
}

pub(crate) use x86_ktile_kernels;
