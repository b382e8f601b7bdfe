//! The per-row and element-wise kernels and the bf16 GEMV: products, norms, activations,
//! biases, the embedding gather and soft-capping against their plain definitions.

use super::runner::Runner;
use super::{assert_close, from_bf16, to_bf16, Values};
use crate::backend::cuda::emu::Arg;
use crate::backend::cuda::tune::gemv_tune::{GemvVariant, GEMV_VARIANTS};

#[test]
fn gemv_matches_a_plain_matrix_product_for_every_row_count() {
    let Some(emu) = Runner::get() else { return };
    // M not a multiple of the 8 warps per block, K not a multiple of the staged tile.
    let (m, k) = (37usize, 1032usize);
    let mut values = Values(7);
    let mut w = values.bf16s(m * k);
    for n in [1usize, 3, 8] {
        let mut x = values.bf16s(n * k);
        let shape = GemvShape::new(m, k, n, 8);
        let out = shape.run(emu, "gemv_bf16_w8u4", &mut w, Arg::buf(&mut x), None);
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

#[test]
fn add_rms_norm_adds_the_residual_and_normalises_for_the_next_block() {
    let Some(emu) = Runner::get() else { return };
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
    let Some(emu) = Runner::get() else { return };
    let (rows, ffn) = (2usize, 300usize);
    let mut values = Values(5);
    let mut gate_up: Vec<f32> = values.vec(rows * 2 * ffn).iter().map(|v| v * 4.0).collect();
    for (kind, act) in [
        (0, (|x: f32| x / (1.0 + (-x).exp())) as fn(f32) -> f32),
        (1, |x: f32| {
            0.5 * x * (1.0 + (0.797_884_6 * (x + 0.044715 * x * x * x)).tanh())
        }),
    ] {
        let out = gated_act(emu, &mut gate_up, (rows, ffn), kind);
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
    let Some(emu) = Runner::get() else { return };
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
    let Some(emu) = Runner::get() else { return };
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

#[test]
fn add_bias_rows_adds_the_bias_to_every_row() {
    let Some(emu) = Runner::get() else { return };
    // A width past one block of 256, three rows (the grid's y).
    let (rows, width) = (3usize, 300usize);
    let mut values = Values(23);
    let (mut x, mut bias) = (values.vec(rows * width), values.vec(width));
    let want: Vec<f32> = (0..rows * width).map(|i| x[i] + bias[i % width]).collect();
    emu.launch(
        "add_bias_rows",
        (width.div_ceil(256) as u32, rows as u32, 1),
        256,
        &[
            Arg::buf(&mut x),
            Arg::buf(&mut bias),
            Arg::I32(width as i32),
        ],
    );
    assert_close(&x, &want, 0.0, "biased rows");
}

#[test]
fn the_fused_down_projection_equals_the_activation_then_the_gemv() {
    let Some(emu) = Runner::get() else { return };
    // K (the ffn width) not a multiple of the staged tile, M not of the 8 warps per block.
    let (m, k) = (21usize, 1096usize);
    let mut values = Values(19);
    let mut w = values.bf16s(m * k);
    for (act, n) in [(0i32, 1usize), (1, 3), (0, 8)] {
        let mut gate_up: Vec<f32> = values.vec(n * 2 * k).iter().map(|v| v * 4.0).collect();
        // Separately: the activation's own kernel, then the GEMV.
        let mut activated = gated_act(emu, &mut gate_up, (n, k), act);
        let shape = GemvShape::new(m, k, n, 8);
        let separate = shape.run(
            emu,
            "gemv_bf16_w8u4",
            &mut w,
            Arg::buf(&mut activated),
            None,
        );
        let fused = shape.run(
            emu,
            "gemv_bf16_gated_w8u4",
            &mut w,
            Arg::buf(&mut gate_up),
            Some(act),
        );
        // The same bf16 inputs summed in the same order.
        assert_eq!(fused, separate, "act {act}, {n} rows");
    }
}

/// The gate/up GEMV writing act(gate)·up from its paired rows leaves the bits of the plain
/// product then gated_act, in every variant, for both activations.
#[test]
fn a_gate_up_gemv_writing_the_activation_equals_the_product_then_gated_act() {
    let Some(emu) = Runner::get() else { return };
    let mut values = Values(31);
    // 37 pairs: a multiple of no block's half (2, 4 or 8 pairs; 32 or 64 on the tensor
    // cores). K in whole 32-input steps, for those too.
    let (f, k) = (37usize, 288usize);
    let mut w = values.bf16s(2 * f * k);
    for (act, n) in [(0i32, 1usize), (1, 3), (0, 8)] {
        let mut x = values.bf16s(n * k);
        for v in GEMV_VARIANTS {
            assert!(v.fits(n, k), "{}", v.name);
            let shape = GemvShape::of(&v, 2 * f, k, n);
            let mut product = shape.run(emu, v.plain, &mut w, Arg::buf(&mut x), None);
            let want = gated_act(emu, &mut product, (n, f), act);
            let got = shape.run_glu(emu, v.plain, &mut w, Arg::buf(&mut x), act);
            let what = format!("{}: act {act}, {n} rows", v.name);
            if v.ksplit {
                // K shared by half the warps here, by all of them in the plain product: the
                // same terms summed in other groups, within a bf16 rounding.
                for (g, w) in got.iter().zip(&want) {
                    let (g, w) = (from_bf16(*g), from_bf16(*w));
                    assert!(
                        (g - w).abs() <= w.abs() / 128.0 + 1e-6,
                        "{what}: {g} vs {w}"
                    );
                }
            } else {
                assert_eq!(got, want, "{what}");
            }
        }
    }
}

#[test]
fn every_gemv_variant_gives_the_same_bits() {
    let Some(emu) = Runner::get() else { return };
    let mut values = Values(23);
    // M not a multiple of any block's columns; K past one tile of every variant and not a
    // multiple of any (tiles of 1024 and 2048 elements), and K under one tile.
    for (m, k) in [(37usize, 2056usize), (19, 200)] {
        let mut w = values.bf16s(m * k);
        for n in [1usize, 4, 7] {
            let mut x = values.bf16s(n * k);
            let mut gate_up: Vec<f32> = values.vec(n * 2 * k);
            let mut want: Option<(Vec<f32>, Vec<f32>)> = None;
            for v in GEMV_VARIANTS.iter().filter(|v| !v.on_tensor_cores()) {
                // (Every case fits a resident x: 7 rows of 2056 are 28 KiB.)
                assert!(v.fits(n, k), "{} at {n}x{k}", v.name);
                // What each row asks of L2 (before the wait, ahead of the loads): nothing,
                // 48 bytes ahead, all of it before the wait (the bits of -16 as unsigned).
                for l2 in [[0, 0], [0, 48], [-16, 0]] {
                    let shape = GemvShape {
                        l2,
                        ..GemvShape::new(m, k, n, v.warps)
                    };
                    let plain = shape.run(emu, v.plain, &mut w, Arg::buf(&mut x), None);
                    let gated_kernel = v.gated.expect("a gated form on the CUDA cores");
                    let gated =
                        shape.run(emu, gated_kernel, &mut w, Arg::buf(&mut gate_up), Some(1));
                    match &want {
                        None => want = Some((plain, gated)),
                        Some((p, g)) => {
                            let what = format!("{} at {m}x{k}, {n} rows, L2 {l2:?}", v.name);
                            assert_eq!(&plain, p, "{what}");
                            assert_eq!(&gated, g, "{what}, gated");
                        }
                    }
                }
            }
        }
    }
}

/// The tensor-core GEMV computes the product to f32 rounding (its sums in the hardware's
/// order), for any token rows up to 8, M not a multiple of a warp's 16 rows or a block's, K
/// of one step and of many (past two passes of loads), with whatever it asks of L2.
#[test]
fn every_tensor_core_gemv_computes_the_product() {
    let Some(emu) = Runner::get() else { return };
    let mut values = Values(41);
    for (m, k) in [(37usize, 2080usize), (19, 96), (70, 32)] {
        let w = values.bf16s(m * k);
        for n in [1usize, 3, 8] {
            let x = values.bf16s(n * k);
            let want: Vec<f32> = (0..n)
                .flat_map(|j| (0..m).map(move |r| (j, r)))
                .map(|(j, r)| {
                    (0..k)
                        .map(|i| {
                            f64::from(from_bf16(w[r * k + i])) * f64::from(from_bf16(x[j * k + i]))
                        })
                        .sum::<f64>() as f32
                })
                .collect();
            for v in GEMV_VARIANTS.iter().filter(|v| v.on_tensor_cores()) {
                for l2 in [[0, 0], [0, 48], [-16, 0]] {
                    let shape = GemvShape {
                        l2,
                        ..GemvShape::of(v, m, k, n)
                    };
                    let (mut w, mut x) = (w.clone(), x.clone());
                    let got = shape.run(emu, v.plain, &mut w, Arg::buf(&mut x), None);
                    let what = format!("{} at {m}x{k}, {n} rows, L2 {l2:?}", v.name);
                    assert_close(&got, &want, 1e-3, &what);
                }
            }
        }
    }
}

/// Every bf16 GEMV variant, plain and gated, with the residual add and the next norm fused
/// (its last block doing them) leaves the bits a GEMV then the `add_rms_norm` launch leave,
/// with and without Gemma's post-norm, for the last block of a model (no next norm) too; and
/// its counter back at 0.
#[test]
fn a_gemv_with_the_norm_fused_leaves_the_bits_of_the_gemv_then_add_rms_norm() {
    let cases = [(1usize, false, false), (3, true, false), (8, false, true)];
    for_each_gemv_end(29, &cases, |mut case| {
        let (fused, x, out) = case.fused(None);
        let what = &case.what;
        assert_eq!(fused, case.product, "{what}: the product");
        assert_eq!(x, case.x, "{what}: the residual stream");
        assert_eq!(out, case.out, "{what}: the next block's input");
    });
}

/// Every bf16 GEMV variant, plain and gated, with its sub-block's end split with the next
/// product: the residual stream gets the bits a GEMV then `add_rms_norm` leave, the next
/// block's input is bf16(x · next_w) (not yet normalised), each row's 1/rms the one
/// `add_rms_norm` normalised with (its output recomputed from it to the bit), the counter
/// back at 0; for the last block of a model (no next norm) only the add.
#[test]
fn a_gemv_splitting_its_end_leaves_the_residual_and_the_1_over_rms_of_add_rms_norm() {
    let cases = [(1usize, false, false), (5, false, false), (8, false, true)];
    for_each_gemv_end(43, &cases, |mut case| {
        let (m, n, eps) = (case.shape.m, case.shape.n, case.eps);
        let mut inv = vec![f32::NAN; n];
        let (_, x, out) = case.fused(Some(&mut inv));
        let what = &case.what;
        assert_eq!(x, case.x, "{what}: the residual stream");
        let Some(next) = case.next.as_deref() else {
            assert!(out.iter().all(|&b| b == 0), "{what}: no next input");
            assert!(inv.iter().all(|v| v.is_nan()), "{what}: no 1/rms");
            return;
        };
        for j in 0..n {
            let row = &x[j * m..(j + 1) * m];
            let mean = row
                .iter()
                .map(|&v| f64::from(v) * f64::from(v))
                .sum::<f64>()
                / m as f64;
            let exact = 1.0 / (mean + f64::from(eps)).sqrt();
            assert!(
                (f64::from(inv[j]) - exact).abs() <= exact * 1e-5,
                "{what}: row {j}'s 1/rms {} vs {exact}",
                inv[j]
            );
            for i in 0..m {
                let at = j * m + i;
                assert_eq!(out[at], to_bf16(row[i] * next[i]), "{what}: input {at}");
                let normed = to_bf16(row[i] * inv[j] * next[i]);
                assert_eq!(normed, case.out[at], "{what}: normalised {at}");
            }
        }
    });
}

/// Calls `check` for every bf16 GEMV variant's plain and gated kernels ending a sub-block,
/// for each case of (token rows, a post-norm, the model's last block: no next norm), with
/// what the GEMV then `add_rms_norm` leave. hidden (M) is not a multiple of any block's
/// columns, and past the 1024 sum slots; K in whole 32-input steps (the tensor cores' too).
fn for_each_gemv_end(seed: u64, cases: &[(usize, bool, bool)], mut check: impl FnMut(GemvEnd<'_>)) {
    let Some(emu) = Runner::get() else { return };
    let mut values = Values(seed);
    let (m, k, eps) = (1100usize, 288usize, 1e-6f32);
    let mut w = values.bf16s(m * k);
    let mut post = values.vec(m);
    let mut next = values.vec(m);
    for &(n, sandwich, last) in cases {
        let mut x_in = values.bf16s(n * k);
        let mut gate_up: Vec<f32> = values.vec(n * 2 * k);
        let residual = values.vec(n * m);
        for v in GEMV_VARIANTS {
            let shape = GemvShape::of(&v, m, k, n);
            let forms = [
                Some((v.plain, Arg::buf(&mut x_in), None)),
                v.gated.map(|g| (g, Arg::buf(&mut gate_up), Some(0))),
            ];
            for (name, input, act) in forms.into_iter().flatten() {
                let (post, next) = (
                    sandwich.then_some(&mut post[..]),
                    (!last).then_some(&mut next[..]),
                );
                let mut case = GemvEnd {
                    emu,
                    shape: &shape,
                    kernel: (name, &mut w[..], input, act),
                    residual: &residual,
                    post,
                    next,
                    eps,
                    product: Vec::new(),
                    x: Vec::new(),
                    out: Vec::new(),
                    what: format!("{name}, {n} rows, post-norm {sandwich}, last {last}"),
                };
                case.separately();
                check(case);
            }
        }
    }
}

/// One GEMV kernel ending a sub-block ([`for_each_gemv_end`]): its launch, the residual rows,
/// the norms' weights, and what the product then `add_rms_norm` leave (the product, the
/// residual stream, the next block's input).
struct GemvEnd<'a> {
    emu: &'a Runner,
    shape: &'a GemvShape,
    /// The kernel, its weights, its input, a gated kernel's activation.
    kernel: (&'a str, &'a mut [u16], Arg, Option<i32>),
    residual: &'a [f32],
    post: Option<&'a mut [f32]>,
    next: Option<&'a mut [f32]>,
    eps: f32,
    product: Vec<f32>,
    x: Vec<f32>,
    out: Vec<u16>,
    what: String,
}

impl GemvEnd<'_> {
    /// The unfused end: the GEMV, then the `add_rms_norm` launch over its rows.
    fn separately(&mut self) {
        let (name, ref mut w, input, act) = self.kernel;
        let mut product = self.shape.run(self.emu, name, w, input, act);
        let (mut x, mut out) = (self.residual.to_vec(), vec![0u16; self.residual.len()]);
        let optional = |w: &mut Option<&mut [f32]>| w.as_deref_mut().map_or(Arg::Ptr(0), Arg::buf);
        self.emu.launch(
            "add_rms_norm",
            (self.shape.n as u32, 1, 1),
            1024,
            &[
                Arg::buf(&mut x),
                Arg::buf(&mut product),
                optional(&mut self.post),
                optional(&mut self.next),
                Arg::buf(&mut out),
                Arg::I32(self.shape.m as i32),
                Arg::F32(self.eps),
            ],
        );
        (self.product, self.x, self.out) = (product, x, out);
    }

    /// The GEMV ending the sub-block itself (split with the next product where given `inv`,
    /// where it writes each row's 1/rms): its product, the residual stream and the next
    /// block's input; its counter checked back at 0.
    fn fused(&mut self, inv: Option<&mut [f32]>) -> (Vec<f32>, Vec<f32>, Vec<u16>) {
        let (name, ref mut w, input, act) = self.kernel;
        let (mut x, mut out, mut done) = (
            self.residual.to_vec(),
            vec![0u16; self.residual.len()],
            [0i32],
        );
        let mut norm = NormArgs {
            x: &mut x,
            post_w: self.post.as_deref_mut(),
            next_w: self.next.as_deref_mut(),
            out: &mut out,
            done: &mut done,
            eps: self.eps,
            inv,
        };
        let product =
            self.shape
                .run_then_norm(self.emu, name, w, input, act, Some(&mut norm), None);
        assert_eq!(done, [0], "{}: the counter", self.what);
        (product, x, out)
    }
}

/// Every bf16 GEMV variant given an input scale per token row (a split end's 1/rms)
/// multiplies each row's sums by it: exactly the product times the scale, but where a
/// block's warps share a tile (their parts scaled before they are summed: within f32
/// rounding); in a GLU-output product gate and up both, before the activation.
#[test]
fn a_gemv_given_an_input_scale_multiplies_each_token_row_by_it() {
    let Some(emu) = Runner::get() else { return };
    let mut values = Values(47);
    let (f, k) = (37usize, 288usize);
    let mut w = values.bf16s(2 * f * k);
    for (act, n) in [(0i32, 1usize), (1, 3), (0, 8)] {
        let mut x = values.bf16s(n * k);
        let mut scale: Vec<f32> = (0..n).map(|j| 0.25 + 0.5 * j as f32).collect();
        for v in GEMV_VARIANTS {
            let shape = GemvShape::of(&v, 2 * f, k, n);
            let what = format!("{}: {n} rows", v.name);
            let product = shape.run(emu, v.plain, &mut w, Arg::buf(&mut x), None);
            let mut want: Vec<f32> = product
                .iter()
                .enumerate()
                .map(|(i, p)| p * scale[i / (2 * f)])
                .collect();
            let got = shape.run_then_norm(
                emu,
                v.plain,
                &mut w,
                Arg::buf(&mut x),
                None,
                None,
                Some(&mut scale),
            );
            if v.ksplit {
                let tolerance = want.iter().fold(0f32, |t, v| t.max(v.abs())) * 1e-5;
                assert_close(&got, &want, tolerance, &what);
            } else {
                assert_eq!(got, want, "{what}");
            }
            let glu_want = gated_act(emu, &mut want, (n, f), act);
            let glu = shape.run_glu_scaled(
                emu,
                v.plain,
                &mut w,
                Arg::buf(&mut x),
                act,
                Some(&mut scale),
            );
            for (g, w) in glu.iter().zip(&glu_want) {
                let (g, w) = (from_bf16(*g), from_bf16(*w));
                assert!(
                    if v.ksplit {
                        (g - w).abs() <= w.abs() / 128.0 + 1e-6
                    } else {
                        g == w
                    },
                    "{what}, GLU act {act}: {g} vs {w}"
                );
            }
        }
    }
}

/// A GEMV launch of `n` rows through an `m`×`k` matrix, `warps` per block serving
/// `rows_per_block` output columns (`pairs_per_block` gate columns in a GLU-output product).
struct GemvShape {
    m: usize,
    k: usize,
    n: usize,
    warps: usize,
    rows_per_block: usize,
    pairs_per_block: usize,
    /// What a bf16 kernel asks L2 for (kernels.cu's GemvL2, as i32 bits): bytes of each row
    /// before the wait, bytes ahead of the loads.
    l2: [i32; 2],
}

/// A bf16 GEMV's fused residual add and norm (kernels.cu's GemvNorm), as its last
/// parameters: the residual rows, the optional weights, the normalised rows, the counter,
/// and for a split end the rows' 1/rms.
struct NormArgs<'a> {
    x: &'a mut [f32],
    post_w: Option<&'a mut [f32]>,
    next_w: Option<&'a mut [f32]>,
    out: &'a mut [u16],
    done: &'a mut [i32],
    eps: f32,
    inv: Option<&'a mut [f32]>,
}

impl NormArgs<'_> {
    fn args(&mut self) -> [Arg; 7] {
        let optional = |w: &mut Option<&mut [f32]>| w.as_deref_mut().map_or(Arg::Ptr(0), Arg::buf);
        [
            Arg::buf(self.x),
            optional(&mut self.post_w),
            optional(&mut self.next_w),
            Arg::buf(self.out),
            Arg::buf(self.done),
            Arg::F32(self.eps),
            optional(&mut self.inv),
        ]
    }
}

impl GemvShape {
    /// Each row asked of L2 whole before the wait (more than a row asks for all of it: an
    /// unsigned int, the bits of -16), and nothing ahead: the emulator checks every range.
    fn new(m: usize, k: usize, n: usize, warps: usize) -> Self {
        GemvShape {
            m,
            k,
            n,
            warps,
            rows_per_block: warps,
            pairs_per_block: warps / 2,
            l2: [-16, 0],
        }
    }

    /// [`GemvShape::new`] for bf16 variant `v`.
    fn of(v: &GemvVariant, m: usize, k: usize, n: usize) -> Self {
        GemvShape {
            rows_per_block: v.rows_per_block(),
            pairs_per_block: v.pairs_per_block(),
            ..GemvShape::new(m, k, n, v.warps)
        }
    }

    /// Runs GEMV kernel `name` over `w` and the input `x` (bf16 rows, or [gate | up] f32
    /// rows for a gated kernel, which takes `act`).
    fn run(&self, emu: &Runner, name: &str, w: &mut [u16], x: Arg, act: Option<i32>) -> Vec<f32> {
        self.run_then_norm(emu, name, w, x, act, None, None)
    }

    /// [`GemvShape::run`] of a bf16 kernel ending its sub-block with `norm` where given, and
    /// scaling each token row's sums by `scale` where given.
    #[allow(clippy::too_many_arguments)]
    fn run_then_norm(
        &self,
        emu: &Runner,
        name: &str,
        w: &mut [u16],
        x: Arg,
        act: Option<i32>,
        norm: Option<&mut NormArgs<'_>>,
        scale: Option<&mut [f32]>,
    ) -> Vec<f32> {
        let mut out = vec![0f32; self.n * self.m];
        let form = act.map_or(Form::Plain, Form::Gated);
        let out_arg = (Arg::buf(&mut out), self.m);
        self.launch(emu, name, w, x, out_arg, form, norm, scale);
        out
    }

    /// Plain kernel `name` over the fused [gate | up] matrix `w` (m = 2·F rows) writing
    /// bf16(act(gate)·up), F per token row.
    fn run_glu(&self, emu: &Runner, name: &str, w: &mut [u16], x: Arg, act: i32) -> Vec<u16> {
        self.run_glu_scaled(emu, name, w, x, act, None)
    }

    /// [`GemvShape::run_glu`], with each token row's input `scale` where given.
    fn run_glu_scaled(
        &self,
        emu: &Runner,
        name: &str,
        w: &mut [u16],
        x: Arg,
        act: i32,
        scale: Option<&mut [f32]>,
    ) -> Vec<u16> {
        let f = self.m / 2;
        let mut out = vec![0u16; self.n * f];
        let out_arg = (Arg::buf(&mut out), f);
        self.launch(emu, name, w, x, out_arg, Form::Glu(act), None, scale);
        out
    }

    /// One launch of `name` writing `out` (rows `ldo` apart), a bf16 kernel ending with
    /// `norm` and scaling each token row's sums by `scale` where given.
    #[allow(clippy::too_many_arguments)]
    fn launch(
        &self,
        emu: &Runner,
        name: &str,
        w: &mut [u16],
        x: Arg,
        (out, ldo): (Arg, usize),
        form: Form,
        norm: Option<&mut NormArgs<'_>>,
        scale: Option<&mut [f32]>,
    ) {
        let mut args = vec![
            Arg::buf(w),
            x,
            out,
            Arg::I32(self.m as i32),
            Arg::I32(self.k as i32),
            Arg::I32(self.n as i32),
            Arg::I32(ldo as i32),
        ];
        if let Form::Gated(act) = form {
            args.push(Arg::I32(act));
        }
        if name.starts_with("gemv_bf16") || name.starts_with("gemv_mma") {
            match norm {
                Some(norm) => args.extend(norm.args()),
                None => args.extend(
                    [Arg::Ptr(0); 5]
                        .into_iter()
                        .chain([Arg::F32(0.0), Arg::Ptr(0)]),
                ),
            }
            args.push(scale.map_or(Arg::Ptr(0), Arg::buf));
            args.extend(self.l2.map(Arg::I32));
            match form {
                Form::Plain => args.push(Arg::I32(-1)),
                Form::Glu(act) => args.push(Arg::I32(act)),
                Form::Gated(_) => {}
            }
        }
        let blocks = match form {
            Form::Glu(_) => (self.m / 2).div_ceil(self.pairs_per_block),
            _ => self.m.div_ceil(self.rows_per_block),
        } as u32;
        emu.launch(name, (blocks, 1, 1), 32 * self.warps as u32, &args);
    }
}

/// What a GEMV launch computes besides the product (gemm.rs's GemvForm).
#[derive(Clone, Copy)]
enum Form {
    Plain,
    Gated(i32),
    Glu(i32),
}

/// `gated_act` over `rows` [gate | up] rows of `ffn` pairs, activation `act`.
fn gated_act(emu: &Runner, gate_up: &mut [f32], (rows, ffn): (usize, usize), act: i32) -> Vec<u16> {
    let mut out = vec![0u16; rows * ffn];
    emu.launch(
        "gated_act",
        (rows as u32, ffn.div_ceil(256) as u32, 1),
        256,
        &[
            Arg::buf(gate_up),
            Arg::buf(&mut out),
            Arg::I32(ffn as i32),
            Arg::I32(act),
        ],
    );
    out
}
