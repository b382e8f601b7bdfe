//! The block-format kernels (quant.cu, mmq.cu): expansion to bf16, the dequantizing GEMV of
//! every format and their int8 tensor-core products, in the layout the device keeps it
//! (`device_layout`), against the host's dequantisation.

use super::runner::Runner;
use super::{assert_close, from_bf16, to_bf16, Values};
use crate::backend::cuda::emu::Arg;
use crate::backend::cuda::mmq::{
    MmqSplit, MMQ_BLOCK_ROWS, MMQ_MAX_ROWS, MMQ_SUM_THREADS, MMQ_WARPS,
};
use crate::backend::cuda::weights::{device_layout, quant_kernels};
use crate::quant::kquants::{scale_min_k4, unpack_q45k, unpack_q6k};
use crate::quant::legacy::{unpack_nibbles, unpack_q5};
use crate::quant::tests::{raw_blocks, Rng};
use crate::quant::{GgmlType, QMatrix, TensorBytes};

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
    let Some(emu) = Runner::get() else { return };
    let (rows, cols) = (3usize, 512usize);
    for (i, t) in device_formats().enumerate() {
        let m = random_quantized(t, rows, cols, 40 + i as u64);
        let kernels = quant_kernels(t).expect("a device format");
        let mut blocks = device_layout(t, m.bytes()).into_owned();
        let mut out = vec![0u16; rows * cols];
        // A thread per group of 32 (Q8_0's threads take 8 at a time over their block's
        // range), in blocks of 32 threads: 48 groups are two blocks, the second part-filled.
        let groups = rows * cols / 32;
        emu.launch(
            kernels.dequant,
            (groups.div_ceil(32) as u32, 1, 1),
            32,
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

/// One block-format product's operands: the `shape` (rows, cols) matrix's blocks, n bf16
/// rows of x, and the output's row stride.
struct Product<'a> {
    blocks: &'a mut [u8],
    x: &'a mut [u16],
    shape: (usize, usize),
    n: usize,
    ldo: usize,
}

impl Product<'_> {
    /// The arguments every block-format product starts with, writing to `out` with rows
    /// `ldo` apart.
    fn args(&mut self, out: Arg, ldo: usize) -> Vec<Arg> {
        vec![
            Arg::buf(self.blocks),
            Arg::buf(self.x),
            out,
            Arg::I32(self.shape.0 as i32),
            Arg::I32(self.shape.1 as i32),
            Arg::I32(self.n as i32),
            Arg::I32(ldo as i32),
        ]
    }
}

/// Launches a block format's decode product `kernel`, as the backend does (8 rows of the
/// matrix per block of 256 threads); the output, rows `ldo` apart, NaN where the kernel does
/// not write.
fn gemv(emu: &Runner, kernel: &str, mut p: Product) -> Vec<f32> {
    let mut out = vec![f32::NAN; p.n * p.ldo];
    let args = p.args(Arg::buf(&mut out), p.ldo);
    emu.launch(kernel, (p.shape.0.div_ceil(8) as u32, 1, 1), 256, &args);
    out
}

#[test]
fn quantized_gemv_matches_a_product_with_the_host_dequantized_rows() {
    let Some(emu) = Runner::get() else { return };
    // 19 rows (not a multiple of the 8 warps per block), written with a row stride of 27:
    // the part sits among other rows of a stacked matrix. 2304 columns: Q8_0's tiles of 2048
    // quants and a partial one.
    let (rows, cols, ldo) = (19usize, 2304usize, 27usize);
    let mut values = Values(77);
    for (i, t) in device_formats().enumerate() {
        let m = random_quantized(t, rows, cols, 90 + i as u64);
        let kernels = quant_kernels(t).expect("a device format");
        let mut blocks = device_layout(t, m.bytes()).into_owned();
        for n in [1usize, 3, 8] {
            let mut x = values.bf16s(n * cols);
            let out = gemv(
                emu,
                kernels.gemv,
                Product {
                    blocks: &mut blocks,
                    x: &mut x,
                    shape: (rows, cols),
                    n,
                    ldo,
                },
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

/// x as `gemv_stage_x8` stages one group of 32: (scale, the int8 values) with the same f32
/// arithmetic (q rounded by an FMA with 1.5 · 2^23).
fn int8_group(x: &[f32]) -> (f32, Vec<i32>) {
    let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    let inv = if amax > 0.0 { 127.0 / amax } else { 0.0 };
    let q = x
        .iter()
        .map(|v| v.mul_add(inv, 12_582_912.0).to_bits() as i32 - 0x4B40_0000)
        .collect();
    (amax / 127.0, q)
}

/// A group of weights as an int8-x product applies them: elements `first..first + q.len()`
/// (16 or 32 of them, within one group of 32 of x), the weights dg·q − mg.
struct Int8Group {
    first: usize,
    dg: f64,
    mg: f64,
    q: Vec<i64>,
}

/// The groups of row `r` of `m` as its int8-x product applies them.
fn int8_x_groups(m: &QMatrix, r: usize) -> Vec<Int8Group> {
    let t = m.dtype;
    let row = &m.bytes()[r * m.row_bytes()..(r + 1) * m.row_bytes()];
    let f16 = |b: &[u8]| half::f16::from_le_bytes([b[0], b[1]]).to_f32();
    let ints = |q: &[u8]| q.iter().map(|&v| i64::from(v)).collect::<Vec<_>>();
    let mut groups = Vec::new();
    for (b, block) in row.chunks_exact(t.block_bytes()).enumerate() {
        let at = b * t.block_elems();
        let mut push = |first, dg: f32, mg: f32, q| {
            groups.push(Int8Group {
                first,
                dg: dg.into(),
                mg: mg.into(),
                q,
            })
        };
        match t {
            GgmlType::Q8_0 => {
                let q = block[2..34].iter().map(|&v| i64::from(v as i8)).collect();
                push(at, f16(&block[0..2]), 0.0, q);
            }
            // Value d·q + m, m = −8·d (Q4_0) or −16·d (Q5_0): mg = −m.
            GgmlType::Q4_0 => {
                let d = f16(&block[0..2]);
                push(at, d, 8.0 * d, ints(&unpack_nibbles(&block[2..18])));
            }
            GgmlType::Q5_0 => {
                let d = f16(&block[0..2]);
                push(
                    at,
                    d,
                    16.0 * d,
                    ints(&unpack_q5(&block[2..6], &block[6..22])),
                );
            }
            GgmlType::Q4_1 => {
                let q = ints(&unpack_nibbles(&block[4..20]));
                push(at, f16(&block[0..2]), -f16(&block[2..4]), q);
            }
            GgmlType::Q5_1 => {
                let q = ints(&unpack_q5(&block[4..8], &block[8..24]));
                push(at, f16(&block[0..2]), -f16(&block[2..4]), q);
            }
            GgmlType::Q4K | GgmlType::Q5K => {
                let (qh, qs) = match t {
                    GgmlType::Q4K => (None, &block[16..144]),
                    _ => (Some(&block[16..48]), &block[48..176]),
                };
                let q = unpack_q45k(qs, qh);
                let (d, dmin) = (f16(&block[0..2]), f16(&block[2..4]));
                for g in 0..8 {
                    let (sc, mn) = scale_min_k4(g, &block[4..16]);
                    // (The kernel's d·sc and dmin·min are f32 products.)
                    let (dg, mg) = (d * f32::from(sc), dmin * f32::from(mn));
                    push(at + g * 32, dg, mg, ints(&q[g * 32..g * 32 + 32]));
                }
            }
            GgmlType::Q6K => {
                // Groups of 16, value d·sc·(q − 32) for the quants 0..64.
                let q = unpack_q6k(block).map(|v| (i16::from(v) + 32) as u8);
                let d = f16(&block[208..210]);
                for g in 0..16 {
                    let dg = d * f32::from(block[192 + g] as i8);
                    push(at + g * 16, dg, 32.0 * dg, ints(&q[g * 16..g * 16 + 16]));
                }
            }
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => unreachable!("not a block format"),
            GgmlType::MXFP4 => unreachable!("no device kernel reads MXFP4"),
        }
    }
    groups
}

/// Checks `out` (n rows `ldo` apart) against `m` times the n bf16 rows of `x` with x rounded
/// to int8 per group of 32, as the int8-x products compute it (the integer dots exact, the
/// rest in f32), and within x's rounding of the exact product; columns past the matrix's
/// rows left alone.
fn assert_int8_x_product(what: &str, m: &QMatrix, x: &[u16], n: usize, out: &[f32], ldo: usize) {
    let (rows, cols) = (m.rows, m.cols);
    let mut w = vec![0f32; cols];
    for r in 0..rows {
        m.dequantize_row(r, &mut w);
        let groups = int8_x_groups(m, r);
        for j in 0..n {
            let xs: Vec<f32> = (0..cols).map(|k| from_bf16(x[j * cols + k])).collect();
            // The kernel's math in f64: per group dg·sx·Σ q·qx − mg·Σ x, sx and qx those of
            // x's group of 32 that holds it.
            let (mut want, mut size, mut rounding) = (0f64, 0f64, 0f64);
            for Int8Group { first, dg, mg, q } in &groups {
                let x_group = first / 32 * 32;
                let (sx, qx) = int8_group(&xs[x_group..x_group + 32]);
                let qx = &qx[first - x_group..];
                let dot: i64 = q.iter().zip(qx).map(|(&a, &b)| a * b as i64).sum();
                let sum: f64 = xs[*first..first + q.len()].iter().map(|&v| v as f64).sum();
                want += dg * sx as f64 * dot as f64 - mg * sum;
                size += (dg * sx as f64 * dot as f64).abs() + (mg * sum).abs();
                // x's rounding: each product off by at most |dg·q| · sx / 2.
                rounding += q
                    .iter()
                    .map(|&v| (dg * v as f64).abs() * sx as f64 / 2.0)
                    .sum::<f64>();
            }
            let got = out[j * ldo + r] as f64;
            assert!(
                (got - want).abs() <= 1e-5 * size + 1e-6,
                "{what}: out[{j}, {r}] = {got}, want {want}"
            );
            let exact: f64 = (0..cols).map(|k| w[k] as f64 * xs[k] as f64).sum();
            assert!(
                (got - exact).abs() <= rounding + 1e-5 * size + 1e-6,
                "{what}: int8 x moved out[{j}, {r}] from {exact} to {got} (bound {rounding})"
            );
        }
    }
    assert!(out[..ldo].iter().skip(rows).all(|v| v.is_nan()), "{what}");
}

#[test]
fn gemv_with_int8_x_computes_the_integer_products_of_the_blocks_and_stays_near_the_exact_one() {
    let Some(emu) = Runner::get() else { return };
    // As the GEMV test above: 19 rows written 27 apart, a tile of 2048 and a partial one.
    let (rows, cols, ldo) = (19usize, 2304usize, 27usize);
    let mut values = Values(78);
    for (i, t) in device_formats().enumerate() {
        let m = random_quantized(t, rows, cols, 120 + i as u64);
        let kernel = quant_kernels(t).expect("a device format").gemv_int8_x;
        let mut blocks = device_layout(t, m.bytes()).into_owned();
        for n in [1usize, 3, 8] {
            let mut x = values.bf16s(n * cols);
            let out = gemv(
                emu,
                kernel,
                Product {
                    blocks: &mut blocks,
                    x: &mut x,
                    shape: (rows, cols),
                    n,
                    ldo,
                },
            );
            assert_int8_x_product(&format!("{t:?}, {n} rows"), &m, &x, n, &out, ldo);
        }
    }
}

/// Launches a block format's int8 tensor-core product `kernel` (mmq.cu), split over K as
/// `split` says, as the backend does: one slice straight into the output, several through
/// partial sums and `mmq_sum`; the output, rows `ldo` apart, NaN where the kernels do not
/// write.
fn mmq(emu: &Runner, kernel: &str, mut p: Product, split: MmqSplit) -> Vec<f32> {
    let ((rows, _), n, ldo) = (p.shape, p.n, p.ldo);
    let mut out = vec![f32::NAN; n * ldo];
    let mut parts = vec![f32::NAN; split.scratch(rows, n)];
    let sliced = split.slices > 1;
    let mut args = if sliced {
        p.args(Arg::buf(&mut parts), rows)
    } else {
        p.args(Arg::buf(&mut out), ldo)
    };
    args.push(Arg::I32(split.slice_groups as i32));
    args.push(Arg::I64(if sliced { (n * rows) as i64 } else { 0 }));
    let grid = (rows.div_ceil(MMQ_BLOCK_ROWS) as u32, split.slices as u32, 1);
    emu.launch(kernel, grid, (MMQ_WARPS * 32) as u32, &args);
    if sliced {
        assert!(
            parts.iter().all(|v| !v.is_nan()),
            "every partial sum written"
        );
        emu.launch(
            "mmq_sum",
            ((rows * n).div_ceil(MMQ_SUM_THREADS) as u32, 1, 1),
            MMQ_SUM_THREADS as u32,
            &[
                Arg::buf(&mut parts),
                Arg::buf(&mut out),
                Arg::I32(rows as i32),
                Arg::I32(n as i32),
                Arg::I32(ldo as i32),
                Arg::I32(split.slices as i32),
            ],
        );
    }
    out
}

#[test]
fn tensor_core_products_with_int8_x_compute_the_int8_x_gemvs_integer_products_in_one_slice_or_several(
) {
    let Some(emu) = Runner::get() else { return };
    // 150 rows: two blocks of 128, the second's last tiles partly past the matrix; written
    // 157 apart. 2304 inputs (9 stages of 256), and 2336 for the formats of 32 (a partial
    // stage); split into 3 slices (of 4 stages, the last shorter) or kept whole.
    let (rows, ldo) = (150usize, 157usize);
    let mut values = Values(79);
    for (i, t) in device_formats().enumerate() {
        let kernel = quant_kernels(t).expect("a device format").mmq;
        let cols = if t.block_elems() == 256 { 2304 } else { 2336 };
        let m = random_quantized(t, rows, cols, 150 + i as u64);
        let mut blocks = device_layout(t, m.bytes()).into_owned();
        for n in [9usize, 24, MMQ_MAX_ROWS] {
            let mut x = values.bf16s(n * cols);
            let whole = MmqSplit {
                slices: 1,
                slice_groups: cols / 32,
            };
            let sliced = MmqSplit::plan(rows, cols, n, 6, usize::MAX);
            assert_eq!(sliced.slices, 3);
            for split in [whole, sliced] {
                let operands = Product {
                    blocks: &mut blocks,
                    x: &mut x,
                    shape: (rows, cols),
                    n,
                    ldo,
                };
                let out = mmq(emu, kernel, operands, split);
                let what = format!("{t:?}, {n} rows, {} slices", split.slices);
                assert_int8_x_product(&what, &m, &x, n, &out, ldo);
            }
        }
    }
}

/// `laid` is `want`, then zeros up to a multiple of 16 bytes.
fn assert_laid_out(laid: &[u8], want: &[u8]) {
    assert_eq!(laid.len(), want.len().next_multiple_of(16));
    assert_eq!(&laid[..want.len()], want);
    assert!(laid[want.len()..].iter().all(|&b| b == 0));
}

#[test]
fn blocks_not_a_multiple_of_16_bytes_split_into_quants_then_headers_on_the_device() {
    let blocks: Vec<u8> = (0..68u8).collect(); // two blocks: scale 0,1 + 2..34; 34,35 + 36..68
    let mut want: Vec<u8> = (2..34).chain(36..68).collect();
    want.extend([0, 1, 34, 35]);
    assert_laid_out(&device_layout(GgmlType::Q8_0, &blocks), &want);
    // Q5_1 (24 bytes): d, m, the fifth bits, then 16 bytes of low bits.
    let want: Vec<u8> = (8..24).chain(32..48).chain(0..8).chain(24..32).collect();
    assert_laid_out(&device_layout(GgmlType::Q5_1, &blocks[..48]), &want);
    // Q6_K (210 bytes): ql and qh, the scales, d.
    let blocks: Vec<u8> = (0..420).map(|i| (i % 251) as u8).collect();
    let want: Vec<u8> = [0..192, 210..402, 192..208, 402..418, 208..210, 418..420]
        .into_iter()
        .flat_map(|r| blocks[r].to_vec())
        .collect();
    assert_laid_out(&device_layout(GgmlType::Q6K, &blocks), &want);
    // Q4_K's 144-byte super-blocks stay as they are.
    assert_eq!(
        &device_layout(GgmlType::Q4K, &blocks[..288])[..],
        &blocks[..288]
    );
}
