//! Attention and what prepares it: paged attention (whole and split over the keys, with the
//! merge; with and without sinks) against plain softmax attention, and qkv_prepare against the
//! CPU backend's RoPE.

use super::runner::Runner;
use super::{assert_close, from_bf16, Values};
use crate::backend::cpu::rope::{inv_freqs, RopeTable};
use crate::backend::cuda::attention_split::{head_blocks, AttentionSplit};
use crate::backend::cuda::emu::Arg;
use crate::backend::cuda::forward::kernel_variant;
use crate::backend::cuda::l2_prefetch::ATTENTION_KEYS;
use crate::backend::cuda::PrefillKernel;
use crate::model::{RopeScaling, RopeStyle};

/// The shape of one attention case.
#[derive(Debug, Clone, Copy)]
struct Heads {
    n_heads: usize,
    n_kv: usize,
    head_dim: usize,
    softcap: f32,
    window: usize,
    /// Each query head has a sink logit ([`sink_of`]).
    sinks: bool,
}

impl Heads {
    fn qkv_width(&self) -> usize {
        (self.n_heads + 2 * self.n_kv) * self.head_dim
    }

    /// The sink of every query head, where the heads have them.
    fn sinks(&self) -> Option<Vec<f32>> {
        self.sinks.then(|| (0..self.n_heads).map(sink_of).collect())
    }
}

/// Query head `h`'s sink: below, among and above the cases' scores (a sink of 6 takes most
/// of a head's weight).
fn sink_of(h: usize) -> f32 {
    [-3.0, 0.5, 2.0, 6.0][h % 4]
}

/// One step over a paged cache: sequences `(cached tokens, new tokens)`, their blocks
/// scattered over the pool.
struct PagedStep {
    block_size: usize,
    positions: Vec<i32>,
    token_seq: Vec<i32>,
    block_tables: Vec<i32>,
    max_blocks: usize,
    /// Rows of single-token sequences (the decode kernel's), and `(first row, count)` tiles
    /// of the longer runs (the prefill kernel's), as `StepInputs::pack` lists them.
    decode_rows: Vec<i32>,
    tiles: Vec<i32>,
}

impl PagedStep {
    fn new(
        seqs: &[(usize, usize)],
        block_size: usize,
        num_blocks: usize,
        prefill_tile: usize,
    ) -> PagedStep {
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
            decode_rows: Vec::new(),
            tiles: Vec::new(),
        };
        for (s, &(cached, new)) in seqs.iter().enumerate() {
            let first = step.positions.len();
            if new == 1 {
                step.decode_rows.push(first as i32);
            }
            for tile in (first..first + new)
                .step_by(prefill_tile)
                .filter(|_| new > 1)
            {
                step.tiles.push(tile as i32);
                step.tiles
                    .push((first + new - tile).min(prefill_tile) as i32);
            }
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

/// What qkv_prepare takes besides the rows and the caches: the model's bias and norms (each
/// optional), RoPE frequencies and style, each token's KV slot.
struct Prepare {
    bias: Option<Vec<f32>>,
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    inv_freq: Vec<f64>,
    slots: Vec<i32>,
    eps: f32,
    style: RopeStyle,
}

impl Prepare {
    /// The decode attention kernel's last parameters, preparing its own heads.
    fn args(&mut self) -> [Arg; 7] {
        let optional = |v: &mut Option<Vec<f32>>| v.as_deref_mut().map_or(Arg::Ptr(0), Arg::buf);
        [
            optional(&mut self.bias),
            optional(&mut self.q_norm),
            optional(&mut self.k_norm),
            Arg::buf(&mut self.inv_freq),
            Arg::buf(&mut self.slots),
            Arg::F32(self.eps),
            Arg::I32(crate::backend::cuda::rope_style_code(self.style)),
        ]
    }

    /// qkv_prepare over every token of `qkv` (`heads` per token), storing K and V.
    fn launch_qkv_prepare(
        &mut self,
        emu: &Runner,
        heads: Heads,
        step: &mut PagedStep,
        qkv: &mut [f32],
        caches: (&mut [u16], &mut [u16]),
    ) {
        let optional = |v: &mut Option<Vec<f32>>| v.as_deref_mut().map_or(Arg::Ptr(0), Arg::buf);
        emu.launch(
            "qkv_prepare",
            (
                step.tokens() as u32,
                (heads.n_heads + 2 * heads.n_kv) as u32,
                1,
            ),
            64,
            &[
                Arg::buf(qkv),
                optional(&mut self.bias),
                optional(&mut self.q_norm),
                optional(&mut self.k_norm),
                Arg::buf(&mut self.inv_freq),
                Arg::buf(&mut step.positions),
                Arg::buf(&mut self.slots),
                Arg::buf(caches.0),
                Arg::buf(caches.1),
                Arg::I32(heads.n_heads as i32),
                Arg::I32(heads.n_kv as i32),
                Arg::I32(heads.head_dim as i32),
                Arg::F32(self.eps),
                Arg::I32(crate::backend::cuda::rope_style_code(self.style)),
            ],
        );
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
    let sink = heads.sinks.then(|| sink_of(h) as f64);
    let max = scores
        .iter()
        .cloned()
        .fold(sink.unwrap_or(f64::NEG_INFINITY), f64::max);
    let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
    // A sink joins the denominator only.
    let total: f64 = weights.iter().sum::<f64>() + sink.map_or(0.0, |s| (s - max).exp());
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

/// Runs one step's attention: `prefill` over the prompt runs' tiles (which `step` was built
/// for), paged_attention over the single tokens (its last split blocks merging when split);
/// returns `[tokens, n_heads, head_dim]`.
#[allow(clippy::too_many_arguments)]
fn emulated_attention(
    emu: &Runner,
    step: &mut PagedStep,
    heads: Heads,
    qkv: &mut [f32],
    k_cache: &mut [u16],
    v_cache: &mut [u16],
    scale: f32,
    split: AttentionSplit,
    prefill: PrefillKernel,
    prepare: Option<&mut Prepare>,
) -> Vec<f32> {
    let (n_heads, n_kv, hd) = (heads.n_heads, heads.n_kv, heads.head_dim);
    let n = step.tokens();
    let mut out = vec![0u16; n * n_heads * hd];
    let mut partial = vec![f32::NAN; step.decode_rows.len() * n_heads * split.splits * (hd + 2)];
    let mut counters = vec![0i32; step.decode_rows.len() * head_blocks(n_heads, n_kv)];
    let variant = kernel_variant(hd.div_ceil(32));
    let mut sinks = heads.sinks();
    let sinks_arg = match &mut sinks {
        Some(s) => Arg::buf(s.as_mut_slice()),
        None => Arg::Ptr(0),
    };
    let common = |step: &mut PagedStep, qkv: &mut [f32], k: &mut [u16], v: &mut [u16]| {
        vec![
            Arg::buf(qkv),
            Arg::I32(heads.qkv_width() as i32),
            Arg::buf(k),
            Arg::buf(v),
            Arg::buf(&mut step.block_tables),
            Arg::I32(step.max_blocks as i32),
            Arg::buf(&mut step.token_seq),
            Arg::buf(&mut step.positions),
        ]
    };
    let shape = [
        Arg::I32(n_heads as i32),
        Arg::I32(n_kv as i32),
        Arg::I32(hd as i32),
        Arg::I32(step.block_size as i32),
        Arg::F32(scale),
        Arg::F32(heads.softcap),
        sinks_arg,
        Arg::I32(heads.window as i32),
    ];
    let n_tiles = step.tiles.len() / 2;
    if n_tiles > 0 {
        let mut args = common(step, qkv, k_cache, v_cache);
        args.push(Arg::buf(&mut out));
        args.extend(shape);
        args.push(Arg::buf(&mut step.tiles));
        emu.launch(
            prefill.kernel(hd),
            (n_tiles as u32, head_blocks(n_heads, n_kv) as u32, 1),
            prefill.threads(),
            &args,
        );
    }
    let decode = step.decode_rows.len();
    // The row list, as the backend passes it: none when every row decodes.
    let rows = if n_tiles > 0 {
        Arg::buf(&mut step.decode_rows)
    } else {
        Arg::Ptr(0)
    };
    if decode > 0 {
        let mut args = common(step, qkv, k_cache, v_cache);
        args.push(Arg::buf(&mut out));
        args.push(Arg::buf(&mut partial));
        args.push(Arg::buf(&mut counters));
        args.extend(shape);
        args.push(Arg::I32(split.partition as i32));
        args.push(rows);
        match prepare {
            Some(p) => args.extend(p.args()),
            // qkv_prepare ran (inv_freq null): no preparation in the attention blocks.
            None => args.extend(
                [Arg::Ptr(0); 5]
                    .into_iter()
                    .chain([Arg::F32(0.0), Arg::I32(0)]),
            ),
        }
        // K and V rows asked into L2 before the wait (the emulator checks each is memory).
        args.push(Arg::I32(ATTENTION_KEYS));
        emu.launch(
            [
                "paged_attention_1",
                "paged_attention_2",
                "paged_attention_4",
                "paged_attention_8",
            ][variant],
            (
                decode as u32,
                head_blocks(n_heads, n_kv) as u32,
                split.splits as u32,
            ),
            256,
            &args,
        );
    }
    assert!(
        counters.iter().all(|&c| c == 0),
        "the merging blocks leave their counters at 0 for the next launch: {counters:?}"
    );
    out.into_iter().map(from_bf16).collect()
}

/// Both prefill kernels (the tensor cores' where the head size fits them) and the decode
/// kernel, whole and split, against f64 softmax attention.
#[test]
fn paged_attention_matches_plain_attention_whole_and_split_over_the_keys() {
    let Some(emu) = Runner::get() else { return };
    // (n_heads, n_kv, head_dim, softcap, window, sharpness: the scale's multiple of 1/√d,
    // sinks)
    let cases = [
        (4, 2, 16, 0.0, 0, 4.0, false), // the tiny fixtures
        (4, 2, 16, 0.0, 5, 4.0, true),  // tiny gpt-oss: sinks, a window of 5 and none
        (4, 2, 16, 0.0, 0, 4.0, true),
        (8, 1, 64, 0.0, 45, 4.0, true), // gpt-oss's heads (64 wide, groups of 8)
        (9, 3, 64, 0.0, 0, 4.0, false), // SmolLM2: groups of 3
        (14, 2, 32, 0.0, 0, 4.0, false), // groups of 7: two blocks per KV head
        (4, 1, 256, 0.0, 0, 4.0, false), // Gemma 3 270M: one KV head, head_dim 256
        (4, 1, 256, 30.0, 0, 4.0, false), // soft-capped scores
        (8, 8, 48, 0.0, 37, 4.0, false), // multi-head, head_dim not a multiple of 32, window
        (8, 2, 128, 0.0, 0, 4.0, false), // Llama-3 8B's head_dim and groups of 4
        (4, 2, 64, 20.0, 45, 4.0, false), // soft caps and a window on the tensor cores
        // Scores in the tens, as trained models have: Q in bf16 alone would be off by
        // several per cent here (the tensor-core kernel splits it in two bf16 parts).
        (8, 2, 128, 0.0, 0, 40.0, false),
    ];
    // Decodes at positions 0, 40 and 150, a prefill chunk of 5 after 20 cached tokens, one of
    // 19 (tiles of 8, 8 and 3, or 16 and 3) after 60, and a fresh prompt of 12.
    let seqs = [(0, 1), (40, 1), (150, 1), (20, 5), (60, 19), (0, 12)];
    let (block_size, num_blocks) = (16, 64);
    let mut values = Values(0x9e37_79b9_7f4a_7c15);
    for (n_heads, n_kv, head_dim, softcap, window, sharpness, sinks) in cases {
        let heads = Heads {
            n_heads,
            n_kv,
            head_dim,
            softcap,
            window,
            sinks,
        };
        let layout = PagedStep::new(&seqs, block_size, num_blocks, 8);
        let n = layout.tokens();
        let kv_len = num_blocks * block_size * n_kv * head_dim;
        let (mut k_cache, mut v_cache) = (values.bf16s(kv_len), values.bf16s(kv_len));
        let mut qkv = values.vec(n * (n_heads + 2 * n_kv) * head_dim);
        let scale = sharpness / (head_dim as f32).sqrt();
        let want: Vec<f32> = (0..n)
            .flat_map(|t| (0..n_heads).map(move |h| (t, h)))
            .flat_map(|(t, h)| {
                reference_attention(&layout, heads, &qkv, &k_cache, &v_cache, scale, (t, h))
            })
            .collect();
        let keys = layout.max_blocks * block_size;
        for prefill in [PrefillKernel::F32, PrefillKernel::TensorCores] {
            if prefill.check(head_dim).is_err() {
                continue;
            }
            // The same blocks and positions, tiled for this kernel.
            let mut step = PagedStep::new(&seqs, block_size, num_blocks, prefill.tile_tokens());
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
                    prefill,
                    None,
                );
                // bf16 output: 2^-8 relative to values below 1.
                assert_close(
                    &got,
                    &want,
                    8e-3,
                    &format!("{heads:?} {split:?} {prefill:?}"),
                );
            }
        }
    }
}

/// A decode step's attention blocks preparing their own heads (bias, q/k norms, RoPE of
/// either style, the K and V store) leave the bits that qkv_prepare then the attention
/// leave: the output, and the cache, whole and split over the keys.
#[test]
fn decode_attention_preparing_its_own_heads_matches_qkv_prepare_then_attention() {
    let Some(emu) = Runner::get() else { return };
    // (n_heads, n_kv, head_dim, RoPE style, q/k norms, bias, soft cap, sliding window)
    let cases = [
        (8, 2, 128, RopeStyle::Neox, false, false, 0.0, 0), // Llama-3 8B's heads
        (9, 3, 64, RopeStyle::Neox, false, true, 0.0, 0),   // groups of 3, a bias (Qwen2-like)
        (14, 2, 32, RopeStyle::Interleaved, true, true, 0.0, 0), // two blocks per KV head
        (4, 1, 256, RopeStyle::Neox, true, false, 0.0, 0),  // Gemma 3: q/k norms, head_dim 256
        (4, 1, 256, RopeStyle::Neox, true, false, 30.0, 45), // its local layers: a window
        (8, 8, 48, RopeStyle::Neox, true, true, 0.0, 0),    // pairs across lanes (half = 24)
    ];
    let seqs = [(0, 1), (40, 1), (150, 1)];
    let (block_size, num_blocks) = (16, 64);
    let mut values = Values(0x51_7cc1_b727_220a);
    for (n_heads, n_kv, head_dim, style, norms, bias, softcap, window) in cases {
        let heads = Heads {
            n_heads,
            n_kv,
            head_dim,
            softcap,
            window,
            sinks: false,
        };
        let kv_len = num_blocks * block_size * n_kv * head_dim;
        let (k_cache, v_cache) = (values.bf16s(kv_len), values.bf16s(kv_len));
        let width = heads.qkv_width();
        let qkv = values.vec(seqs.len() * width);
        let norm = |values: &mut Values| {
            norms.then(|| values.vec(head_dim).iter().map(|v| 1.0 + v / 2.0).collect())
        };
        let mut step = PagedStep::new(&seqs, block_size, num_blocks, 8);
        let mut prepare = Prepare {
            bias: bias.then(|| values.vec(width)),
            q_norm: norm(&mut values),
            k_norm: norm(&mut values),
            inv_freq: inv_freqs(head_dim, 10000.0, RopeScaling::None, None),
            slots: (0..seqs.len())
                .map(|t| step.slot(t, step.positions[t] as usize) as i32)
                .collect(),
            eps: 1e-6,
            style,
        };
        let scale = 1.0 / (head_dim as f32).sqrt();
        let keys = step.max_blocks * block_size;
        for split in [
            AttentionSplit::WHOLE,
            AttentionSplit {
                splits: keys.div_ceil(32),
                partition: 32,
            },
        ] {
            let what = format!("{heads:?} {style:?} norms {norms} bias {bias} {split:?}");
            let (mut qkv_a, mut k_a, mut v_a) = (qkv.clone(), k_cache.clone(), v_cache.clone());
            prepare.launch_qkv_prepare(emu, heads, &mut step, &mut qkv_a, (&mut k_a, &mut v_a));
            let separate = emulated_attention(
                emu,
                &mut step,
                heads,
                &mut qkv_a,
                &mut k_a,
                &mut v_a,
                scale,
                split,
                PrefillKernel::F32,
                None,
            );
            let (mut qkv_b, mut k_b, mut v_b) = (qkv.clone(), k_cache.clone(), v_cache.clone());
            let fused = emulated_attention(
                emu,
                &mut step,
                heads,
                &mut qkv_b,
                &mut k_b,
                &mut v_b,
                scale,
                split,
                PrefillKernel::F32,
                Some(&mut prepare),
            );
            assert!(fused == separate, "{what}: the attention output");
            assert!(k_b == k_a, "{what}: K in the cache");
            assert!(v_b == v_a, "{what}: V in the cache");
        }
    }
}

#[test]
fn qkv_prepare_adds_bias_normalises_rotates_and_stores_k_and_v() {
    let Some(emu) = Runner::get() else { return };
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
                Arg::I32(crate::backend::cuda::rope_style_code(style)),
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
