//! Each CUDA kernel, run on the CPU by the [`emulator`](super::emulator), against a plain
//! reference: the kernels' arithmetic and indexing are checked on every machine, the GPU
//! conformance suite checks them on the hardware. Every test skips (passing) where no C++
//! compiler is available.

use half::bf16;

use super::attention_split::{head_blocks, AttentionSplit};
use super::emulator::{Arg, Emulator};
use super::step::{pick_params, LOGPROB_STRIDE};
use super::weights::quant_kernels;
use crate::engine::backend::cpu::rope::{inv_freqs, RopeTable};
use crate::engine::model::{RopeScaling, RopeStyle};
use crate::engine::quant::tests::{raw_blocks, Rng};
use crate::engine::quant::{GgmlType, QMatrix, TensorBytes};
use crate::engine::sampler::Sampled;
use crate::engine::sampler::TokenDraw;

/// A small deterministic generator (xorshift) of values in [-1, 1).
struct Values(u64);

impl Values {
    fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next()).collect()
    }

    fn bf16s(&mut self, n: usize) -> Vec<u16> {
        (0..n).map(|_| to_bf16(self.next())).collect()
    }
}

fn to_bf16(x: f32) -> u16 {
    bf16::from_f32(x).to_bits()
}

fn from_bf16(b: u16) -> f32 {
    bf16::from_bits(b).to_f32()
}

fn assert_close(got: &[f32], want: &[f32], tolerance: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tolerance,
            "{what}: element {i} is {g}, want {w} (±{tolerance})"
        );
    }
}

/// The shape of one attention case.
#[derive(Debug, Clone, Copy)]
struct Heads {
    n_heads: usize,
    n_kv: usize,
    head_dim: usize,
    softcap: f32,
    window: usize,
}

impl Heads {
    fn qkv_width(&self) -> usize {
        (self.n_heads + 2 * self.n_kv) * self.head_dim
    }
}

/// One step over a paged cache: sequences `(cached tokens, new tokens)`, their blocks
/// scattered over the pool.
struct PagedStep {
    block_size: usize,
    positions: Vec<i32>,
    token_seq: Vec<i32>,
    block_tables: Vec<i32>,
    max_blocks: usize,
}

impl PagedStep {
    fn new(seqs: &[(usize, usize)], block_size: usize, num_blocks: usize) -> PagedStep {
        let max_blocks = seqs
            .iter()
            .map(|&(cached, new)| (cached + new).div_ceil(block_size))
            .max()
            .unwrap_or(1);
        // Blocks handed out backwards and interleaved, so that no table is contiguous.
        let mut free: Vec<i32> = (0..num_blocks as i32).rev().collect();
        free.sort_by_key(|b| (b % 3, -b));
        let mut step = PagedStep {
            block_size,
            positions: Vec::new(),
            token_seq: Vec::new(),
            block_tables: Vec::new(),
            max_blocks,
        };
        for (s, &(cached, new)) in seqs.iter().enumerate() {
            let used = (cached + new).div_ceil(block_size);
            for b in 0..max_blocks {
                let block = if b < used {
                    free.pop().expect("pool large enough")
                } else {
                    0
                };
                step.block_tables.push(block);
            }
            for p in cached..cached + new {
                step.positions.push(p as i32);
                step.token_seq.push(s as i32);
            }
        }
        step
    }

    fn slot(&self, t: usize, pos: usize) -> usize {
        let table = &self.block_tables[self.token_seq[t] as usize * self.max_blocks..];
        table[pos / self.block_size] as usize * self.block_size + pos % self.block_size
    }

    fn tokens(&self) -> usize {
        self.positions.len()
    }
}

/// Softmax attention of token `t`'s query head `h` over its key range, in f64.
fn reference_attention(
    step: &PagedStep,
    heads: Heads,
    qkv: &[f32],
    k_cache: &[u16],
    v_cache: &[u16],
    scale: f32,
    (t, h): (usize, usize),
) -> Vec<f32> {
    let (hd, softcap, window) = (heads.head_dim, heads.softcap, heads.window);
    let qkv_width = heads.qkv_width();
    let kv_dim = heads.n_kv * hd;
    let kvh = h / (heads.n_heads / heads.n_kv);
    let pos = step.positions[t] as usize;
    let lo = if window > 0 {
        (pos + 1).saturating_sub(window)
    } else {
        0
    };
    let q = &qkv[t * qkv_width + h * hd..][..hd];
    let rows: Vec<usize> = (lo..=pos)
        .map(|j| step.slot(t, j) * kv_dim + kvh * hd)
        .collect();
    let scores: Vec<f64> = rows
        .iter()
        .map(|&r| {
            let s: f64 = (0..hd)
                .map(|d| (q[d] * scale) as f64 * from_bf16(k_cache[r + d]) as f64)
                .sum();
            if softcap > 0.0 {
                softcap as f64 * (s / softcap as f64).tanh()
            } else {
                s
            }
        })
        .collect();
    let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
    let total: f64 = weights.iter().sum();
    (0..hd)
        .map(|d| {
            let sum: f64 = rows
                .iter()
                .zip(&weights)
                .map(|(&r, w)| w * from_bf16(v_cache[r + d]) as f64)
                .sum();
            (sum / total) as f32
        })
        .collect()
}

/// Runs paged_attention (and the merge when split) for one step; returns `[tokens, n_heads,
/// head_dim]`.
#[allow(clippy::too_many_arguments)]
fn emulated_attention(
    emu: &Emulator,
    step: &mut PagedStep,
    heads: Heads,
    qkv: &mut [f32],
    k_cache: &mut [u16],
    v_cache: &mut [u16],
    scale: f32,
    split: AttentionSplit,
) -> Vec<f32> {
    let (n_heads, n_kv, hd) = (heads.n_heads, heads.n_kv, heads.head_dim);
    let n = step.tokens();
    let mut out = vec![0u16; n * n_heads * hd];
    let mut partial = vec![0f32; n * n_heads * split.splits * (hd + 2)];
    let kernel = [
        "paged_attention_1",
        "paged_attention_2",
        "paged_attention_4",
        "paged_attention_8",
    ][hd.div_ceil(32).next_power_of_two().trailing_zeros() as usize];
    emu.launch(
        kernel,
        (
            n as u32,
            head_blocks(n_heads, n_kv) as u32,
            split.splits as u32,
        ),
        256,
        &[
            Arg::buf(qkv),
            Arg::I32(heads.qkv_width() as i32),
            Arg::buf(k_cache),
            Arg::buf(v_cache),
            Arg::buf(&mut step.block_tables),
            Arg::I32(step.max_blocks as i32),
            Arg::buf(&mut step.token_seq),
            Arg::buf(&mut step.positions),
            Arg::buf(&mut out),
            Arg::buf(&mut partial),
            Arg::I32(n_heads as i32),
            Arg::I32(n_kv as i32),
            Arg::I32(hd as i32),
            Arg::I32(step.block_size as i32),
            Arg::F32(scale),
            Arg::F32(heads.softcap),
            Arg::I32(heads.window as i32),
            Arg::I32(split.partition as i32),
        ],
    );
    if split.splits > 1 {
        emu.launch(
            "attention_merge",
            (n as u32, n_heads as u32, 1),
            64,
            &[
                Arg::buf(&mut partial),
                Arg::buf(&mut out),
                Arg::I32(n_heads as i32),
                Arg::I32(hd as i32),
                Arg::I32(split.splits as i32),
            ],
        );
    }
    out.into_iter().map(from_bf16).collect()
}

#[test]
fn paged_attention_matches_plain_attention_whole_and_split_over_the_keys() {
    let Some(emu) = Emulator::get() else { return };
    let cases = [
        (4, 2, 16, 0.0, 0),   // the tiny fixtures
        (9, 3, 64, 0.0, 0),   // SmolLM2: groups of 3
        (14, 2, 32, 0.0, 0),  // groups of 7: two blocks per KV head
        (4, 1, 256, 0.0, 0),  // Gemma 3 270M: one KV head, head_dim 256
        (4, 1, 256, 30.0, 0), // soft-capped scores
        (8, 8, 48, 0.0, 37),  // multi-head, head_dim not a multiple of 32, sliding window
        (8, 2, 128, 0.0, 0),  // Llama-3 8B's head_dim and groups of 4
    ];
    // Decodes at positions 0, 40 and 150, and a prefill chunk of 5 after 20 cached tokens.
    let seqs = [(0, 1), (40, 1), (150, 1), (20, 5)];
    let (block_size, num_blocks) = (16, 64);
    let mut values = Values(0x9e37_79b9_7f4a_7c15);
    for (n_heads, n_kv, head_dim, softcap, window) in cases {
        let heads = Heads {
            n_heads,
            n_kv,
            head_dim,
            softcap,
            window,
        };
        let mut step = PagedStep::new(&seqs, block_size, num_blocks);
        let n = step.tokens();
        let kv_len = num_blocks * block_size * n_kv * head_dim;
        let (mut k_cache, mut v_cache) = (values.bf16s(kv_len), values.bf16s(kv_len));
        let mut qkv = values.vec(n * (n_heads + 2 * n_kv) * head_dim);
        let scale = 1.0 / (head_dim as f32).sqrt() * 4.0; // sharp enough to matter
        let want: Vec<f32> = (0..n)
            .flat_map(|t| (0..n_heads).map(move |h| (t, h)))
            .flat_map(|(t, h)| {
                reference_attention(&step, heads, &qkv, &k_cache, &v_cache, scale, (t, h))
            })
            .collect();
        let keys = step.max_blocks * block_size;
        for partition in [usize::MAX, 32, 64] {
            let split = if partition == usize::MAX {
                AttentionSplit::WHOLE
            } else {
                AttentionSplit {
                    splits: keys.div_ceil(partition),
                    partition,
                }
            };
            let got = emulated_attention(
                emu,
                &mut step,
                heads,
                &mut qkv,
                &mut k_cache,
                &mut v_cache,
                scale,
                split,
            );
            // bf16 output: 2^-8 relative to values below 1.
            assert_close(&got, &want, 8e-3, &format!("{heads:?} {split:?}"));
        }
    }
}

#[test]
fn qkv_prepare_adds_bias_normalises_rotates_and_stores_k_and_v() {
    let Some(emu) = Emulator::get() else { return };
    let (n_heads, n_kv, hd, eps) = (4usize, 2usize, 32usize, 1e-6f32);
    let (q_dim, kv_dim) = (n_heads * hd, n_kv * hd);
    let width = q_dim + 2 * kv_dim;
    let positions = [0usize, 7, 300];
    let slots = [5i32, 0, 11];
    let mut values = Values(42);
    for (style, with_norms) in [(RopeStyle::Neox, true), (RopeStyle::Interleaved, false)] {
        let input = values.vec(positions.len() * width);
        let mut bias = values.vec(width);
        let mut q_norm: Vec<f32> = values.vec(hd).iter().map(|v| 1.0 + v / 2.0).collect();
        let mut k_norm: Vec<f32> = values.vec(hd).iter().map(|v| 1.0 + v / 2.0).collect();
        let mut inv_freq = inv_freqs(hd, 10000.0, RopeScaling::None, None);

        // Reference: the CPU backend's order of operations.
        let mut want = input.clone();
        let mut table = RopeTable::default();
        table.fill(&inv_freq, &positions);
        for row in want.chunks_exact_mut(width) {
            row.iter_mut().zip(&bias).for_each(|(v, b)| *v += b);
            if with_norms {
                for (h, head) in row[..q_dim + kv_dim].chunks_exact_mut(hd).enumerate() {
                    let w = if h < n_heads { &q_norm } else { &k_norm };
                    let ss: f32 = head.iter().map(|v| v * v).sum::<f32>() / hd as f32;
                    let inv = 1.0 / (ss + eps).sqrt();
                    head.iter_mut().zip(w).for_each(|(v, w)| *v *= inv * w);
                }
            }
        }
        let mut q_part: Vec<f32> = want
            .chunks_exact(width)
            .flat_map(|r| r[..q_dim].to_vec())
            .collect();
        let mut k_part: Vec<f32> = want
            .chunks_exact(width)
            .flat_map(|r| r[q_dim..q_dim + kv_dim].to_vec())
            .collect();
        table.apply(&mut q_part, n_heads, style);
        table.apply(&mut k_part, n_kv, style);

        let mut qkv = input.clone();
        let mut positions_i32: Vec<i32> = positions.iter().map(|&p| p as i32).collect();
        let mut slots_buf = slots.to_vec();
        let cache_len = 16 * kv_dim;
        let (mut k_cache, mut v_cache) = (vec![0u16; cache_len], vec![0u16; cache_len]);
        let norm = |v: &mut Vec<f32>| if with_norms { Arg::buf(v) } else { Arg::Ptr(0) };
        emu.launch(
            "qkv_prepare",
            (positions.len() as u32, (n_heads + 2 * n_kv) as u32, 1),
            64,
            &[
                Arg::buf(&mut qkv),
                Arg::buf(&mut bias),
                norm(&mut q_norm),
                norm(&mut k_norm),
                Arg::buf(&mut inv_freq),
                Arg::buf(&mut positions_i32),
                Arg::buf(&mut slots_buf),
                Arg::buf(&mut k_cache),
                Arg::buf(&mut v_cache),
                Arg::I32(n_heads as i32),
                Arg::I32(n_kv as i32),
                Arg::I32(hd as i32),
                Arg::F32(eps),
                Arg::I32(super::rope_style_code(style)),
            ],
        );
        for (t, &slot) in slots.iter().enumerate() {
            let what = format!("{style:?} token {t}");
            assert_close(
                &qkv[t * width..t * width + q_dim],
                &q_part[t * q_dim..(t + 1) * q_dim],
                1e-4,
                &format!("{what}: Q"),
            );
            let stored = |cache: &[u16]| -> Vec<f32> {
                cache[slot as usize * kv_dim..][..kv_dim]
                    .iter()
                    .map(|&b| from_bf16(b))
                    .collect()
            };
            assert_close(
                &stored(&k_cache),
                &k_part[t * kv_dim..(t + 1) * kv_dim],
                2e-2,
                &format!("{what}: K in the cache"),
            );
            assert_close(
                &stored(&v_cache),
                &want[t * width + q_dim + kv_dim..(t + 1) * width],
                2e-2,
                &format!("{what}: V in the cache"),
            );
        }
    }
}

#[test]
fn gemv_matches_a_plain_matrix_product_for_every_row_count() {
    let Some(emu) = Emulator::get() else { return };
    // M not a multiple of the 8 warps per block, K not a multiple of the staged tile.
    let (m, k) = (37usize, 1032usize);
    let mut values = Values(7);
    let mut w = values.bf16s(m * k);
    for n in [1usize, 3, 8] {
        let mut x = values.bf16s(n * k);
        let mut out = vec![0f32; n * m];
        emu.launch(
            "gemv_bf16",
            (m.div_ceil(8) as u32, 1, 1),
            256,
            &[
                Arg::buf(&mut w),
                Arg::buf(&mut x),
                Arg::buf(&mut out),
                Arg::I32(m as i32),
                Arg::I32(k as i32),
                Arg::I32(n as i32),
                Arg::I32(m as i32),
            ],
        );
        let want: Vec<f32> = (0..n)
            .flat_map(|j| (0..m).map(move |r| (j, r)))
            .map(|(j, r)| {
                (0..k)
                    .map(|i| from_bf16(w[r * k + i]) as f64 * from_bf16(x[j * k + i]) as f64)
                    .sum::<f64>() as f32
            })
            .collect();
        assert_close(&out, &want, 1e-3, &format!("{n} rows"));
    }
}

/// Runs pick_rows over `rows` (each `vocab` wide, after a logit row that it must not touch)
/// with `draws`, on blocks of `threads`: the picks as the backend reports them.
fn emulated_picks(
    emu: &Emulator,
    rows: &[Vec<f32>],
    draws: &[TokenDraw],
    threads: u32,
) -> Vec<Sampled> {
    let vocab = rows[0].len();
    let first = 1;
    let mut logits = vec![7.0f32; vocab];
    logits.extend(rows.iter().flatten());
    let before = logits.clone();
    let mut params: Vec<i32> = draws.iter().flat_map(pick_params).collect();
    let mut ids = vec![-1i32; rows.len()];
    let mut logprobs = vec![f32::NAN; rows.len() * LOGPROB_STRIDE];
    emu.launch(
        "pick_rows",
        (rows.len() as u32, 1, 1),
        threads,
        &[
            Arg::buf(&mut logits),
            Arg::I32(first),
            Arg::I32(vocab as i32),
            Arg::buf(&mut params),
            Arg::buf(&mut ids),
            Arg::buf(&mut logprobs),
        ],
    );
    let same = |a: &f32, b: &f32| a.to_bits() == b.to_bits();
    assert!(
        logits.iter().zip(&before).all(|(a, b)| same(a, b)),
        "the rows are untouched"
    );
    ids.iter()
        .zip(draws)
        .enumerate()
        .map(|(r, (&id, d))| {
            let row = &logprobs[r * LOGPROB_STRIDE..(r + 1) * LOGPROB_STRIDE];
            super::forward::picked_row(id as u32, d.logprobs, Some(row), vocab)
        })
        .collect()
}

#[test]
fn pick_rows_takes_the_first_largest_logit_for_greedy_rows_and_never_nan() {
    let Some(emu) = Emulator::get() else { return };
    let vocab = 3000usize;
    let mut values = Values(3);
    let mut rows: Vec<Vec<f32>> = (0..3).map(|_| values.vec(vocab)).collect();
    rows[0][2999] = 5.0; // the last token
    rows[1][17] = 9.0; // a tie: the lower id wins
    rows[1][2500] = 9.0;
    rows[1][3] = f32::NAN;
    rows[2].fill(f32::NAN); // nothing but NaN: token 0
    let picks = emulated_picks(emu, &rows, &[TokenDraw::GREEDY; 3], 1024);
    let ids: Vec<u32> = picks.iter().map(|p| p.token).collect();
    assert_eq!(ids, vec![2999, 17, 0]);
    assert!(picks
        .iter()
        .all(|p| p.logprob.is_none() && p.top.is_empty()));
}

#[test]
fn pick_rows_draws_what_the_host_definition_draws() {
    let Some(emu) = Emulator::get() else { return };
    let vocab = 1000usize;
    let mut values = Values(21);
    let knobs = [
        (1.0, 0, 1.0, 0.0),
        (0.7, 0, 1.0, 0.0),
        (1.0, 40, 1.0, 0.0),
        (1.0, 0, 0.9, 0.0),
        (1.3, 0, 0.5, 0.0),
        (1.0, 0, 1.0, 0.05),
        (0.8, 50, 0.8, 0.01),
        (1.0, 1, 1.0, 0.0),
        (1.0, 0, 0.0, 0.0),
        (2.0, 5000, 0.95, 0.0),
    ];
    let mut rows = Vec::new();
    let mut draws = Vec::new();
    for (i, &(temperature, top_k, top_p, min_p)) in knobs.iter().enumerate() {
        for u in [0.0f32, 0.31, 0.77, 0.999] {
            // Sharp rows (logits over ±8) and rows with tied logits, NaN and −∞.
            let mut row: Vec<f32> = values.vec(vocab).iter().map(|v| v * 8.0).collect();
            if i % 2 == 1 {
                for t in (0..vocab).step_by(7) {
                    row[t] = 4.0;
                }
                row[5] = f32::NAN;
                row[6] = f32::NEG_INFINITY;
            }
            rows.push(row);
            draws.push(TokenDraw {
                temperature,
                top_k,
                top_p,
                min_p,
                u,
                logprobs: None,
            });
        }
    }
    // Cuts that fall inside a run of tied tokens: one best token, twenty tied at e^-5 of it.
    let mut tied = vec![-10.0f32; vocab];
    tied[0] = 10.0;
    tied[1..=20].fill(5.0);
    for (top_k, top_p) in [(0, 0.885), (0, 0.9), (3, 1.0), (3, 0.995)] {
        for u in [0.5f32, 0.999] {
            rows.push(tied.clone());
            draws.push(TokenDraw {
                temperature: 1.0,
                top_k,
                top_p,
                min_p: 0.0,
                u,
                logprobs: None,
            });
        }
    }
    let want: Vec<u32> = rows
        .iter()
        .zip(&draws)
        .map(|(row, d)| d.pick(row))
        .collect();
    let got = emulated_picks(emu, &rows, &draws, 256);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.token, *w, "row {i}: {:?}", draws[i]);
    }
}

#[test]
fn pick_rows_reports_the_logprobs_the_host_sampler_reports() {
    let Some(emu) = Emulator::get() else { return };
    let vocab = 700usize;
    let mut values = Values(5);
    let mut rows = Vec::new();
    let mut draws = Vec::new();
    for (i, (temperature, n)) in [(0.0, 0u8), (0.0, 5), (1.0, 20), (0.7, 3)]
        .into_iter()
        .enumerate()
    {
        let mut row: Vec<f32> = values.vec(vocab).iter().map(|v| v * 6.0).collect();
        // Ties among the best (the lower id first), NaN and −∞ tokens.
        row[40] = 9.0;
        row[30] = 9.0;
        row[3] = f32::NAN;
        row[4] = f32::NEG_INFINITY;
        if i == 3 {
            row.iter_mut().skip(10).for_each(|l| *l = f32::NEG_INFINITY);
        }
        rows.push(row);
        draws.push(TokenDraw {
            temperature,
            u: 0.42,
            logprobs: Some(n),
            ..TokenDraw::GREEDY
        });
    }
    let got = emulated_picks(emu, &rows, &draws, 256);
    for (i, (row, d)) in rows.iter().zip(&draws).enumerate() {
        let want = d.draw(row);
        let g = &got[i];
        assert_eq!(g.token, want.token, "row {i}");
        let (gl, wl) = (
            g.logprob.expect("a logprob"),
            want.logprob.expect("a logprob"),
        );
        assert!((gl - wl).abs() <= 1e-4, "row {i}: logprob {gl}, want {wl}");
        assert_eq!(g.top.len(), want.top.len(), "row {i}");
        for ((gt, glp), (wt, wlp)) in g.top.iter().zip(&want.top) {
            assert_eq!(
                gt, wt,
                "row {i}: alternatives {:?}, want {:?}",
                g.top, want.top
            );
            assert!((glp - wlp).abs() <= 1e-4, "row {i}: {glp} vs {wlp}");
        }
    }
}

#[test]
fn add_rms_norm_adds_the_residual_and_normalises_for_the_next_block() {
    let Some(emu) = Emulator::get() else { return };
    let (rows, hidden, eps) = (3usize, 96usize, 1e-5f32);
    let mut values = Values(11);
    let rms = |v: &[f32]| 1.0 / (v.iter().map(|x| x * x).sum::<f32>() / hidden as f32 + eps).sqrt();
    for sandwich in [false, true] {
        let x0 = values.vec(rows * hidden);
        let mut delta = values.vec(rows * hidden);
        let mut post = values.vec(hidden);
        let mut next = values.vec(hidden);
        let mut x = x0.clone();
        let mut out = vec![0u16; rows * hidden];
        emu.launch(
            "add_rms_norm",
            (rows as u32, 1, 1),
            1024,
            &[
                Arg::buf(&mut x),
                Arg::buf(&mut delta),
                if sandwich {
                    Arg::buf(&mut post)
                } else {
                    Arg::Ptr(0)
                },
                Arg::buf(&mut next),
                Arg::buf(&mut out),
                Arg::I32(hidden as i32),
                Arg::F32(eps),
            ],
        );
        for r in 0..rows {
            let d = &delta[r * hidden..(r + 1) * hidden];
            let inv_d = rms(d);
            let sum: Vec<f32> = (0..hidden)
                .map(|i| {
                    let add = if sandwich {
                        d[i] * inv_d * post[i]
                    } else {
                        d[i]
                    };
                    x0[r * hidden + i] + add
                })
                .collect();
            assert_close(&x[r * hidden..(r + 1) * hidden], &sum, 1e-4, "residual");
            let inv = rms(&sum);
            let normed: Vec<f32> = sum.iter().zip(&next).map(|(v, w)| v * inv * w).collect();
            let got: Vec<f32> = out[r * hidden..(r + 1) * hidden]
                .iter()
                .map(|&b| from_bf16(b))
                .collect();
            let tolerance = normed.iter().fold(0f32, |m, v| m.max(v.abs())) / 128.0;
            assert_close(&got, &normed, tolerance, "next block's input");
        }
    }
}

#[test]
fn gated_act_applies_silu_or_gelu_to_the_gate_times_up() {
    let Some(emu) = Emulator::get() else { return };
    let (rows, ffn) = (2usize, 300usize);
    let mut values = Values(5);
    let mut gate_up: Vec<f32> = values.vec(rows * 2 * ffn).iter().map(|v| v * 4.0).collect();
    for (kind, act) in [
        (0, (|x: f32| x / (1.0 + (-x).exp())) as fn(f32) -> f32),
        (1, |x: f32| {
            0.5 * x * (1.0 + (0.797_884_6 * (x + 0.044715 * x * x * x)).tanh())
        }),
    ] {
        let mut out = vec![0u16; rows * ffn];
        emu.launch(
            "gated_act",
            (rows as u32, ffn.div_ceil(256) as u32, 1),
            256,
            &[
                Arg::buf(&mut gate_up),
                Arg::buf(&mut out),
                Arg::I32(ffn as i32),
                Arg::I32(kind),
            ],
        );
        let want: Vec<f32> = (0..rows * ffn)
            .map(|i| {
                let (r, j) = (i / ffn, i % ffn);
                act(gate_up[r * 2 * ffn + j]) * gate_up[r * 2 * ffn + ffn + j]
            })
            .collect();
        let got: Vec<f32> = out.iter().map(|&b| from_bf16(b)).collect();
        let tolerance = want.iter().fold(0f32, |m, v| m.max(v.abs())) / 128.0;
        assert_close(&got, &want, tolerance, &format!("activation {kind}"));
    }
}

#[test]
fn embed_gathers_scaled_rows_and_the_final_norm_reads_only_logit_rows() {
    let Some(emu) = Emulator::get() else { return };
    let (vocab, hidden, eps) = (50usize, 40usize, 1e-6f32);
    let mut values = Values(13);
    let mut table = values.bf16s(vocab * hidden);
    let mut ids = vec![7u32, 0, 49];
    let mut x = vec![0f32; ids.len() * hidden];
    emu.launch(
        "embed",
        (ids.len() as u32, 1, 1),
        1024,
        &[
            Arg::buf(&mut table),
            Arg::buf(&mut ids),
            Arg::buf(&mut x),
            Arg::I32(hidden as i32),
            Arg::F32(2.0),
        ],
    );
    for (t, &id) in ids.iter().enumerate() {
        let want: Vec<f32> = table[id as usize * hidden..][..hidden]
            .iter()
            .map(|&b| from_bf16(b) * 2.0)
            .collect();
        assert_close(
            &x[t * hidden..(t + 1) * hidden],
            &want,
            0.0,
            "embedding row",
        );
    }
    // The LM head's input: token rows 2 and 0, in that order.
    let mut rows = vec![2i32, 0];
    let mut w = values.vec(hidden);
    let mut out = vec![0u16; rows.len() * hidden];
    emu.launch(
        "rms_norm_bf16",
        (rows.len() as u32, 1, 1),
        1024,
        &[
            Arg::buf(&mut x),
            Arg::buf(&mut rows),
            Arg::buf(&mut w),
            Arg::buf(&mut out),
            Arg::I32(hidden as i32),
            Arg::F32(eps),
        ],
    );
    for (r, &src) in rows.iter().enumerate() {
        let row = &x[src as usize * hidden..][..hidden];
        let inv = 1.0 / (row.iter().map(|v| v * v).sum::<f32>() / hidden as f32 + eps).sqrt();
        let want: Vec<f32> = row.iter().zip(&w).map(|(v, w)| v * inv * w).collect();
        let got: Vec<f32> = out[r * hidden..(r + 1) * hidden]
            .iter()
            .map(|&b| from_bf16(b))
            .collect();
        assert_close(&got, &want, 2e-2, "normalised logit row");
    }
}

#[test]
fn softcap_squashes_logits_into_the_cap() {
    let Some(emu) = Emulator::get() else { return };
    let mut x = vec![-1000.0f32, -3.0, 0.0, 0.5, 29.0, 1e6, 7.0];
    let want: Vec<f32> = x.iter().map(|v| 30.0 * (v / 30.0).tanh()).collect();
    let n = x.len();
    emu.launch(
        "softcap",
        (1, 1, 1),
        256,
        &[Arg::buf(&mut x), Arg::I64(n as i64), Arg::F32(30.0)],
    );
    assert_close(&x, &want, 1e-5, "soft-capped logits");
}

/// Random blocks of every format the device reads, as a `[rows, cols]` matrix.
fn random_quantized(t: GgmlType, rows: usize, cols: usize, seed: u64) -> QMatrix {
    let mut rng = Rng::new(seed);
    let bytes = raw_blocks(&mut rng, t, rows * cols / t.block_elems());
    QMatrix::new(t, rows, cols, TensorBytes::Owned(bytes)).expect("whole blocks")
}

/// Every block format the device reads.
fn device_formats() -> impl Iterator<Item = GgmlType> {
    GgmlType::ALL
        .into_iter()
        .filter(|&t| quant_kernels(t).is_some())
}

#[test]
fn quantized_blocks_expand_on_the_device_as_the_host_dequantizes_them() {
    let Some(emu) = Emulator::get() else { return };
    let (rows, cols) = (3usize, 512usize);
    for (i, t) in device_formats().enumerate() {
        let m = random_quantized(t, rows, cols, 40 + i as u64);
        let kernels = quant_kernels(t).expect("a device format");
        let mut blocks = m.bytes().to_vec();
        let mut out = vec![0u16; rows * cols];
        let groups = rows * cols / 32;
        emu.launch(
            kernels.dequant,
            (groups.div_ceil(128) as u32, 1, 1),
            128,
            &[
                Arg::buf(&mut blocks),
                Arg::buf(&mut out),
                Arg::I32(rows as i32),
                Arg::I32(cols as i32),
            ],
        );
        let mut want = vec![0f32; cols];
        for r in 0..rows {
            m.dequantize_row(r, &mut want);
            let want: Vec<f32> = want.iter().map(|&v| from_bf16(to_bf16(v))).collect();
            let got: Vec<f32> = out[r * cols..(r + 1) * cols]
                .iter()
                .map(|&b| from_bf16(b))
                .collect();
            // The same value rounded to bf16, give or take the last bit (a·b+c vs a·(b+c')).
            let tolerance = want.iter().fold(0f32, |a, v| a.max(v.abs())) / 128.0;
            assert_close(&got, &want, tolerance, &format!("{t:?} row {r}"));
        }
    }
}

#[test]
fn quantized_gemv_matches_a_product_with_the_host_dequantized_rows() {
    let Some(emu) = Emulator::get() else { return };
    // 19 rows (not a multiple of the 8 warps per block), written with a row stride of 27:
    // the part sits among other rows of a stacked matrix.
    let (rows, cols, ldo) = (19usize, 512usize, 27usize);
    let mut values = Values(77);
    for (i, t) in device_formats().enumerate() {
        let m = random_quantized(t, rows, cols, 90 + i as u64);
        let kernels = quant_kernels(t).expect("a device format");
        let mut blocks = m.bytes().to_vec();
        for n in [1usize, 3, 8] {
            let mut x = values.bf16s(n * cols);
            let mut out = vec![f32::NAN; n * ldo];
            emu.launch(
                kernels.gemv,
                (rows.div_ceil(8) as u32, 1, 1),
                256,
                &[
                    Arg::buf(&mut blocks),
                    Arg::buf(&mut x),
                    Arg::buf(&mut out),
                    Arg::I32(rows as i32),
                    Arg::I32(cols as i32),
                    Arg::I32(n as i32),
                    Arg::I32(ldo as i32),
                ],
            );
            let mut w = vec![0f32; cols];
            for r in 0..rows {
                m.dequantize_row(r, &mut w);
                for j in 0..n {
                    let want: f64 = (0..cols)
                        .map(|k| w[k] as f64 * from_bf16(x[j * cols + k]) as f64)
                        .sum();
                    let got = out[j * ldo + r];
                    let scale: f64 = (0..cols)
                        .map(|k| (w[k] as f64 * from_bf16(x[j * cols + k]) as f64).abs())
                        .sum();
                    assert!(
                        (got as f64 - want).abs() <= 1e-4 * scale + 1e-6,
                        "{t:?}, {n} rows: out[{j}, {r}] = {got}, want {want}"
                    );
                }
            }
            // Columns past the part's rows are left alone.
            assert!(out[..ldo].iter().skip(rows).all(|v| v.is_nan()), "{t:?}");
        }
    }
}
