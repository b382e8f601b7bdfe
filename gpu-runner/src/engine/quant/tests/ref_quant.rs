//! Small reference quantizers (f32 → ggml block bytes), written for the tests from the
//! format descriptions: simple min/max (legacy) and per-group max (Q6_K) scaling, not
//! ggml's error-minimising search — good enough to bound round-trip error and to build
//! weight matrices for the product tests. Q4_K and Q5_K use the engine's own quantizer
//! (`kquants_quantize`, which the CUDA backend runs at load).

use half::{bf16, f16};

use crate::engine::quant::kquants_quantize::{put_f16, quantize_q45_k};
use crate::engine::quant::GgmlType;

/// Quantizes `x` (a whole number of blocks) into `dtype`'s bytes.
pub fn quantize(dtype: GgmlType, x: &[f32]) -> Vec<u8> {
    let mut out = Vec::new();
    match dtype {
        GgmlType::F32 => x.iter().for_each(|v| out.extend(v.to_le_bytes())),
        GgmlType::F16 => x
            .iter()
            .for_each(|v| out.extend(f16::from_f32(*v).to_le_bytes())),
        GgmlType::BF16 => x
            .iter()
            .for_each(|v| out.extend(bf16::from_f32(*v).to_le_bytes())),
        _ => {
            let block: fn(&[f32], &mut Vec<u8>) = match dtype {
                GgmlType::Q4_0 => |x, o| q_symmetric(x, 4, o),
                GgmlType::Q5_0 => |x, o| q_symmetric(x, 5, o),
                GgmlType::Q8_0 => crate::engine::quant::legacy::quantize_q8_0,
                GgmlType::Q4_1 => |x, o| q_affine(x, 4, o),
                GgmlType::Q5_1 => |x, o| q_affine(x, 5, o),
                GgmlType::Q4K => |x, o| quantize_q45_k(x, false, o),
                GgmlType::Q5K => |x, o| quantize_q45_k(x, true, o),
                _ => q6_k,
            };
            x.chunks_exact(dtype.block_elems())
                .for_each(|b| block(b, &mut out));
        }
    }
    out
}

/// Packs 32 quants (< 2^bits): low nibbles as Q4 `qs`, fifth bits (if any) as `qh` first.
fn pack_legacy(q: &[u8; 32], bits: u32, out: &mut Vec<u8>) {
    if bits == 5 {
        let qh: u32 = (0..32).map(|j| (((q[j] >> 4) & 1) as u32) << j).sum();
        out.extend(qh.to_le_bytes());
    }
    out.extend((0..16).map(|j| (q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4)));
}

/// Q4_0 / Q5_0: `x ≈ d·(q − 2^(bits−1))`, with `d` chosen so the signed extreme maps to the
/// most negative quant (as ggml does).
fn q_symmetric(x: &[f32], bits: u32, out: &mut Vec<u8>) {
    let half = (1 << (bits - 1)) as f32;
    let max = x
        .iter()
        .copied()
        .fold(0f32, |m, v| if v.abs() > m.abs() { v } else { m });
    let d = max / -half;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let top = (1u32 << bits) - 1;
    let q: [u8; 32] = std::array::from_fn(|j| ((x[j] * id + half + 0.5) as u32).min(top) as u8);
    put_f16(out, d);
    pack_legacy(&q, bits, out);
}

/// Q4_1 / Q5_1: `x ≈ d·q + m` over the block's range.
fn q_affine(x: &[f32], bits: u32, out: &mut Vec<u8>) {
    let min = x.iter().copied().fold(f32::INFINITY, f32::min);
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let top = (1u32 << bits) - 1;
    let d = (max - min) / top as f32;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let q: [u8; 32] = std::array::from_fn(|j| (((x[j] - min) * id + 0.5) as u32).min(top) as u8);
    put_f16(out, d);
    put_f16(out, min);
    pack_legacy(&q, bits, out);
}

/// Q6_K: per group of 16 a signed scale, quantized to i8 against the super-block's `d`.
fn q6_k(x: &[f32], out: &mut Vec<u8>) {
    let group_scale: [f32; 16] = std::array::from_fn(|g| {
        let max = x[16 * g..16 * g + 16].iter().copied().fold(0f32, |m, v| {
            if v.abs() > m.abs() {
                v
            } else {
                m
            }
        });
        max / -32.0
    });
    let amax = group_scale.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = f16::from_f32(amax / 127.0).to_f32();
    let sc: [i8; 16] = std::array::from_fn(|g| {
        if d > 0.0 {
            (group_scale[g] / d).round().clamp(-127.0, 127.0) as i8
        } else {
            0
        }
    });
    let q: [u8; 256] = std::array::from_fn(|i| {
        let dg = d * sc[i / 16] as f32;
        let v = if dg != 0.0 { (x[i] / dg).round() } else { 0.0 };
        (v.clamp(-32.0, 31.0) + 32.0) as u8
    });
    let (mut ql, mut qh) = ([0u8; 128], [0u8; 64]);
    for half in 0..2 {
        let q = &q[128 * half..];
        for l in 0..32 {
            ql[64 * half + l] = (q[l] & 0x0F) | ((q[l + 64] & 0x0F) << 4);
            ql[64 * half + l + 32] = (q[l + 32] & 0x0F) | ((q[l + 96] & 0x0F) << 4);
            qh[32 * half + l] = (q[l] >> 4)
                | ((q[l + 32] >> 4) << 2)
                | ((q[l + 64] >> 4) << 4)
                | ((q[l + 96] >> 4) << 6);
        }
    }
    out.extend(ql);
    out.extend(qh);
    out.extend(sc.iter().map(|&s| s as u8));
    put_f16(out, d);
}
