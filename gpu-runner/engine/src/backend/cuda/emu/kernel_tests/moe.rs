//! The mixture-of-experts kernels (moe.cu): routing (with a router bias too) and grouping
//! against the CPU backend's `Routing`, the grouped products of every expert format against
//! each expert's own product with the host-dequantized rows, and gpt-oss's expert biases and
//! clamped SwiGLU against the CPU backend's.

use super::runner::Runner;
use super::{assert_close, from_bf16, Values};
use crate::backend::cpu::ops::clamped_swiglu;
use crate::backend::cuda::emu::Arg;
use crate::backend::cuda::moe::max_tiles;
use crate::backend::cuda::weights::{device_layout, quant_kernels};
use crate::backend::moe_routing::Routing;
use crate::quant::tests::{raw_blocks, Rng};
use crate::quant::{GgmlType, QMatrix, TensorBytes};

/// Routes `logits` (`n` rows `ld` apart, the first `e` the router's, plus `bias`) on the
/// device: each token's `k` (expert, weight), and the shared scales where `shared`.
fn route(
    emu: &Runner,
    (logits, bias): (&[f32], Option<&[f32]>),
    (n, ld, e, k): (usize, usize, usize, usize),
    norm: bool,
    shared: bool,
) -> (Vec<i32>, Vec<f32>, Vec<f32>) {
    let mut logits = logits.to_vec();
    let mut bias = bias.map(<[f32]>::to_vec);
    let bias_arg = match &mut bias {
        Some(b) => Arg::buf(b.as_mut_slice()),
        None => Arg::Ptr(0),
    };
    let (mut ids, mut weights, mut scale) =
        (vec![-1i32; n * k], vec![f32::NAN; n * k], vec![f32::NAN; n]);
    let scale_arg = if shared {
        Arg::buf(&mut scale)
    } else {
        Arg::Ptr(0)
    };
    emu.launch(
        "moe_route",
        (n.div_ceil(128) as u32, 1, 1),
        128,
        &[
            Arg::buf(&mut logits),
            bias_arg,
            Arg::I32(ld as i32),
            Arg::buf(&mut ids),
            Arg::buf(&mut weights),
            scale_arg,
            Arg::I32(n as i32),
            Arg::I32(e as i32),
            Arg::I32(k as i32),
            Arg::I32(norm as i32),
        ],
    );
    (ids, weights, scale)
}

/// The step's slots grouped by expert on the device: (slot_token, slot_of, tiles).
fn sort(emu: &Runner, ids: &[i32], k: usize, e: usize) -> (Vec<i32>, Vec<i32>, Vec<i32>) {
    let slots = ids.len();
    let tiles_max = max_tiles(slots, e);
    let mut ids = ids.to_vec();
    let (mut slot_token, mut slot_of) = (vec![-1i32; slots], vec![-1i32; slots]);
    let mut tiles = vec![-1i32; tiles_max * 4];
    emu.launch(
        "moe_sort",
        (1, 1, 1),
        256,
        &[
            Arg::buf(&mut ids),
            Arg::I32(slots as i32),
            Arg::I32(k as i32),
            Arg::I32(e as i32),
            Arg::I32(tiles_max as i32),
            Arg::buf(&mut slot_token),
            Arg::buf(&mut slot_of),
            Arg::buf(&mut tiles),
        ],
    );
    (slot_token, slot_of, tiles)
}

/// The tiles the grouping makes: each expert's slots (counts in expert order) in tiles of 8,
/// then empty tiles up to `max_tiles`.
fn expected_tiles(counts: &[usize], slots: usize) -> Vec<i32> {
    let mut tiles = Vec::new();
    let mut start = 0;
    for (x, &c) in counts.iter().enumerate() {
        for r in (0..c).step_by(8) {
            tiles.extend([x as i32, (start + r) as i32, (c - r).min(8) as i32, 0]);
        }
        start += c;
    }
    tiles.resize(max_tiles(slots, counts.len()) * 4, 0);
    tiles
}

#[test]
fn the_device_routes_each_token_to_the_hosts_experts_and_groups_the_slots_by_expert() {
    let Some(emu) = Runner::get() else { return };
    let mut values = Values(31);
    // (tokens, experts, top_k, renormalised, shared gate, router bias): one token; a shared
    // expert's column; experts with more than 8 slots (several tiles); 64 experts, 8 each;
    // gpt-oss's biased router.
    for (n, e, k, norm, shared, biased) in [
        (1usize, 8usize, 2usize, true, false, false),
        (13, 8, 2, false, true, false),
        (40, 6, 3, true, false, false),
        (5, 64, 8, true, false, false),
        (9, 8, 2, true, false, true),
    ] {
        let ld = e + shared as usize;
        let logits: Vec<f32> = values.vec(n * ld).iter().map(|v| v * 4.0).collect();
        let bias: Option<Vec<f32>> =
            biased.then(|| values.vec(e).iter().map(|v| v * 3.0).collect());
        let (ids, weights, scale) =
            route(emu, (&logits, bias.as_deref()), (n, ld, e, k), norm, shared);
        let router: Vec<f32> = logits
            .chunks_exact(ld)
            .flat_map(|row| {
                let bias = bias.as_deref();
                (0..e).map(move |x| row[x] + bias.map_or(0.0, |b| b[x]))
            })
            .collect();
        let mut routing = Routing::default();
        routing.route(&router, e, k, norm);
        let case = format!("{n} tokens, {e} experts, top {k}");
        for t in 0..n {
            for (c, &(x, w)) in routing.token_choices(t).iter().enumerate() {
                assert_eq!(ids[t * k + c], x as i32, "{case}: token {t} choice {c}");
                let got = weights[t * k + c];
                assert!(
                    (got - w).abs() <= 1e-5 * w.max(1e-3),
                    "{case}: weight {got}, want {w}"
                );
            }
            if shared {
                let want = 1.0 / (1.0 + (-logits[t * ld + e]).exp());
                assert!((scale[t] - want).abs() <= 1e-6, "{case}: shared scale");
            }
        }

        let (slot_token, slot_of, tiles) = sort(emu, &ids, k, e);
        let want_tokens: Vec<i32> = (0..e)
            .flat_map(|x| routing.expert_slots(x).iter().map(|&(t, _)| t as i32))
            .collect();
        assert_eq!(slot_token, want_tokens, "{case}: tokens grouped by expert");
        for (i, &s) in slot_of.iter().enumerate() {
            assert_eq!(
                slot_token[s as usize],
                (i / k) as i32,
                "{case}: choice {i}'s slot"
            );
        }
        let mut sorted_slots = slot_of.clone();
        sorted_slots.sort_unstable();
        assert_eq!(
            sorted_slots,
            (0..(n * k) as i32).collect::<Vec<_>>(),
            "{case}"
        );
        let counts: Vec<usize> = (0..e).map(|x| routing.expert_slots(x).len()).collect();
        assert_eq!(tiles, expected_tiles(&counts, n * k), "{case}: tiles");
    }
}

/// One projection's experts as the device keeps them: the kernel and the bank's bytes, each
/// expert `stride` bytes apart, with the host's dequantized rows of each.
struct Bank {
    kernel: &'static str,
    bytes: Vec<u8>,
    stride: usize,
    rows: Vec<Vec<Vec<f32>>>,
}

/// `experts` random `[rows, cols]` matrices in `format` (`None`: bf16).
fn bank(format: Option<GgmlType>, experts: usize, rows: usize, cols: usize, seed: u64) -> Bank {
    let mut bank = Bank {
        kernel: format.map_or("moe_gemv_bf16", |t| {
            quant_kernels(t).expect("a device format").moe
        }),
        bytes: Vec::new(),
        stride: 0,
        rows: Vec::new(),
    };
    let mut values = Values(seed);
    for x in 0..experts {
        let (laid, dequantized) = match format {
            Some(t) => {
                let mut rng = Rng::new(seed + x as u64);
                let blocks = raw_blocks(&mut rng, t, rows * cols / t.block_elems());
                let m = QMatrix::new(t, rows, cols, TensorBytes::Owned(blocks)).expect("blocks");
                let mut out = vec![vec![0f32; cols]; rows];
                for (r, row) in out.iter_mut().enumerate() {
                    m.dequantize_row(r, row);
                }
                (device_layout(t, m.bytes()).into_owned(), out)
            }
            None => {
                let bits = values.bf16s(rows * cols);
                let out = bits
                    .chunks_exact(cols)
                    .map(|r| r.iter().map(|&b| from_bf16(b)).collect())
                    .collect();
                (bits.iter().flat_map(|b| b.to_le_bytes()).collect(), out)
            }
        };
        bank.stride = laid.len().next_multiple_of(16);
        bank.bytes.extend_from_slice(&laid);
        bank.bytes.resize(bank.stride * (x + 1), 0);
        bank.rows.push(dequantized);
    }
    bank
}

fn silu(v: f64) -> f64 {
    v / (1.0 + (-v).exp())
}

/// Launches one grouped product over `tiles`.
#[allow(clippy::too_many_arguments)]
fn grouped(
    emu: &Runner,
    bank: &mut Bank,
    tiles: &mut [i32],
    x: Arg,
    out: Arg,
    (m, k, ldo): (usize, usize, usize),
    glu: i32,
) {
    let per_block = if glu >= 0 { 4 } else { 8 };
    let blocks = if glu >= 0 { m / 2 } else { m }.div_ceil(per_block);
    emu.launch(
        bank.kernel,
        (blocks as u32, (tiles.len() / 4) as u32, 1),
        256,
        &[
            Arg::buf(&mut bank.bytes),
            Arg::I64(bank.stride as i64),
            Arg::buf(tiles),
            x,
            out,
            Arg::I32(m as i32),
            Arg::I32(k as i32),
            Arg::I32(ldo as i32),
            Arg::I32(glu),
        ],
    );
}

#[test]
fn grouped_products_in_every_format_equal_each_experts_own_product() {
    let Some(emu) = Runner::get() else { return };
    // 5 experts, 11 tokens, top 2: expert 1 takes 10 slots (two tiles), expert 4 none.
    let (e, n, k, hidden, f) = (5usize, 11usize, 2usize, 256usize, 256usize);
    let ids: Vec<i32> = (0..n)
        .flat_map(|t| [if t < 10 { 1 } else { 0 }, [0, 2, 3][t % 3]])
        .collect();
    let weights: Vec<f32> = (0..n * k)
        .map(|i| 0.25 + 0.5 * (i % 3) as f32 / 2.0)
        .collect();
    let formats = std::iter::once(None).chain(
        GgmlType::ALL
            .into_iter()
            .filter(|&t| quant_kernels(t).is_some())
            .map(Some),
    );
    let mut values = Values(5);
    for (i, format) in formats.enumerate() {
        let case = format!("{format:?}");
        let mut gate_up = bank(format, e, 2 * f, hidden, 100 + 10 * i as u64);
        let mut down = bank(format, e, hidden, f, 500 + 10 * i as u64);
        let x = values.bf16s(n * hidden);
        let (slot_token, slot_of, mut tiles) = sort(emu, &ids, k, e);
        let slots = n * k;

        let (mut xin, mut slot_tokens) = (x.clone(), slot_token.clone());
        let mut xs = vec![0u16; slots * hidden];
        emu.launch(
            "moe_gather",
            ((hidden / 8).div_ceil(128) as u32, slots as u32, 1),
            128,
            &[
                Arg::buf(&mut xin),
                Arg::buf(&mut slot_tokens),
                Arg::buf(&mut xs),
                Arg::I32(hidden as i32),
            ],
        );
        for (s, &t) in slot_token.iter().enumerate() {
            let t = t as usize;
            assert_eq!(
                xs[s * hidden..(s + 1) * hidden],
                x[t * hidden..(t + 1) * hidden]
            );
        }

        let mut act = vec![0u16; slots * f];
        grouped(
            emu,
            &mut gate_up,
            &mut tiles,
            Arg::buf(&mut xs),
            Arg::buf(&mut act),
            (2 * f, hidden, f),
            0,
        );
        for (choice, &s) in slot_of.iter().enumerate() {
            let (t, s) = (choice / k, s as usize);
            let rows = &gate_up.rows[ids[choice] as usize];
            let xt: Vec<f64> = x[t * hidden..(t + 1) * hidden]
                .iter()
                .map(|&b| from_bf16(b) as f64)
                .collect();
            let dot = |r: &[f32]| -> (f64, f64) {
                let terms = r.iter().zip(&xt).map(|(&w, &v)| w as f64 * v);
                terms.fold((0.0, 0.0), |(s, a), p| (s + p, a + p.abs()))
            };
            for c in 0..f {
                let ((g, ga), (u, ua)) = (dot(&rows[c]), dot(&rows[f + c]));
                let want = silu(g) * u;
                // bf16's rounding of the result, and the sums' f32 error carried through.
                let err =
                    want.abs() / 128.0 + 1e-4 * (ga * u.abs().max(1.0) + ua * g.abs().max(1.0));
                let got = from_bf16(act[s * f + c]) as f64;
                assert!(
                    (got - want).abs() <= err,
                    "{case}: act[{s}, {c}] = {got}, want {want}"
                );
            }
        }

        let mut outs = vec![f32::NAN; slots * hidden];
        let mut act_in = act.clone();
        grouped(
            emu,
            &mut down,
            &mut tiles,
            Arg::buf(&mut act_in),
            Arg::buf(&mut outs),
            (hidden, f, hidden),
            -1,
        );
        let (mut outs_in, mut slot_of_in, mut weights_in) =
            (outs.clone(), slot_of.clone(), weights.clone());
        let mut combined = vec![f32::NAN; n * hidden];
        emu.launch(
            "moe_combine",
            (1, n as u32, 1),
            256,
            &[
                Arg::buf(&mut outs_in),
                Arg::buf(&mut slot_of_in),
                Arg::buf(&mut weights_in),
                Arg::Ptr(0),
                Arg::Ptr(0),
                Arg::buf(&mut combined),
                Arg::I32(hidden as i32),
                Arg::I32(k as i32),
            ],
        );
        for t in 0..n {
            for h in 0..hidden {
                let (mut want, mut scale) = (0f64, 0f64);
                for c in 0..k {
                    let choice = t * k + c;
                    let s = slot_of[choice] as usize;
                    let row = &down.rows[ids[choice] as usize][h];
                    let terms = row
                        .iter()
                        .zip(&act[s * f..(s + 1) * f])
                        .map(|(&w, &a)| w as f64 * from_bf16(a) as f64);
                    let (sum, abs) = terms.fold((0.0, 0.0), |(s, a), p| (s + p, a + p.abs()));
                    let w = weights[choice] as f64;
                    want += w * sum;
                    scale += w * abs;
                    let got = outs[s * hidden + h] as f64;
                    assert!(
                        (got - sum).abs() <= 1e-4 * abs + 1e-6,
                        "{case}: down[{s}, {h}] = {got}, want {sum}"
                    );
                }
                let got = combined[t * hidden + h] as f64;
                assert!(
                    (got - want).abs() <= 1e-4 * scale + 1e-6,
                    "{case}: out[{t}, {h}] = {got}, want {want}"
                );
            }
        }
    }
}

#[test]
fn a_shared_expert_adds_its_scaled_output_to_each_tokens_sum() {
    let Some(emu) = Runner::get() else { return };
    let (n, k, hidden) = (3usize, 2usize, 16usize);
    let mut values = Values(9);
    let mut down = values.vec(n * k * hidden);
    let mut slot_of: Vec<i32> = (0..(n * k) as i32).rev().collect();
    let mut weights = values.vec(n * k);
    let mut shared = values.vec(n * hidden);
    let mut scale = vec![0.5f32, 0.25, 1.0];
    let mut out = vec![f32::NAN; n * hidden];
    let (d, s, w, sh, sc) = (
        down.clone(),
        slot_of.clone(),
        weights.clone(),
        shared.clone(),
        scale.clone(),
    );
    emu.launch(
        "moe_combine",
        (1, n as u32, 1),
        256,
        &[
            Arg::buf(&mut down),
            Arg::buf(&mut slot_of),
            Arg::buf(&mut weights),
            Arg::buf(&mut shared),
            Arg::buf(&mut scale),
            Arg::buf(&mut out),
            Arg::I32(hidden as i32),
            Arg::I32(k as i32),
        ],
    );
    for t in 0..n {
        for h in 0..hidden {
            let mut want = 0f32;
            for c in 0..k {
                want += w[t * k + c] * d[s[t * k + c] as usize * hidden + h];
            }
            want += sc[t] * sh[t * hidden + h];
            assert!((out[t * hidden + h] - want).abs() <= 1e-6, "out[{t}, {h}]");
        }
    }
}

#[test]
fn gpt_oss_experts_add_their_biases_around_the_clamped_swiglu() {
    let Some(emu) = Runner::get() else { return };
    // 4 experts, 7 tokens, top 2: tiles of one expert's sorted slots, as moe_sort cuts them.
    let (e, n, k, f, hidden) = (4usize, 7usize, 2usize, 40usize, 24usize);
    let (alpha, limit) = (1.702f32, 1.5f32);
    let ids: Vec<i32> = (0..n * k).map(|i| ((i * 3 + i / k) % e) as i32).collect();
    let (_, _, mut tiles) = sort(emu, &ids, k, e);
    let n_tiles = tiles.len() / 4;
    let mut values = Values(0x6a09_e667);
    // [gate | up] rows spread past ±limit, so that both clamps act.
    let mut gate_up: Vec<f32> = values.vec(n * k * 2 * f).iter().map(|v| v * 3.0).collect();
    let mut bias = values.vec(e * 2 * f);
    let mut act = vec![0u16; n * k * f];
    let (rows, b) = (gate_up.clone(), bias.clone());
    emu.launch(
        "moe_clamped_glu",
        (f.div_ceil(256) as u32, n_tiles as u32, 1),
        256,
        &[
            Arg::buf(&mut gate_up),
            Arg::buf(&mut tiles),
            Arg::buf(&mut bias),
            Arg::buf(&mut act),
            Arg::I32(f as i32),
            Arg::F32(alpha),
            Arg::F32(limit),
        ],
    );
    // Each sorted slot's expert, from its tile.
    let mut expert_of = vec![usize::MAX; n * k];
    for tile in tiles.chunks_exact(4) {
        for r in 0..tile[2] as usize {
            expert_of[tile[1] as usize + r] = tile[0] as usize;
        }
    }
    let mut want = Vec::new();
    for (slot, &x) in expert_of.iter().enumerate() {
        let (row, eb) = (&rows[slot * 2 * f..][..2 * f], &b[x * 2 * f..][..2 * f]);
        let mut gate: Vec<f32> = (0..f).map(|i| row[i] + eb[i]).collect();
        let up: Vec<f32> = (0..f).map(|i| row[f + i] + eb[f + i]).collect();
        clamped_swiglu(&mut gate, &up, alpha, limit);
        want.extend(gate);
    }
    let got: Vec<f32> = act.iter().map(|&a| from_bf16(a)).collect();
    // bf16 output: 2^-8 relative, at most |(limit + 1) · limit| = 3.75.
    assert_close(&got, &want, 3.75 / 256.0, "clamped SwiGLU");

    let mut down = values.vec(n * k * hidden);
    let mut down_bias = values.vec(e * hidden);
    let (before, db) = (down.clone(), down_bias.clone());
    emu.launch(
        "moe_expert_bias",
        (1, n_tiles as u32, 1),
        256,
        &[
            Arg::buf(&mut down),
            Arg::buf(&mut tiles),
            Arg::buf(&mut down_bias),
            Arg::I32(hidden as i32),
        ],
    );
    let want: Vec<f32> = (0..n * k * hidden)
        .map(|i| before[i] + db[expert_of[i / hidden] * hidden + i % hidden])
        .collect();
    assert_close(&down, &want, 0.0, "down biases");
}
