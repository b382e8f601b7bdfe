//! Encoding floats as Q4_K / Q5_K / Q6_K super-blocks (layouts in `kquants.rs`): round to
//! nearest over each group's min/max range (Q6_K: its signed extreme), not llama.cpp's
//! error-minimising search (files quantized by llama.cpp's tools keep their better blocks).
//! `QMatrix::quantized` (quantize.rs) encodes rows with it; the tests build K-quant matrices
//! with it.

use half::f16;

/// `v` as the 2 little-endian bytes of an f16.
pub(crate) fn put_f16(out: &mut Vec<u8>, v: f32) {
    out.extend(f16::from_f32(v).to_le_bytes());
}

/// One super-block of 256 values as Q4_K (`five` false) or Q5_K bytes: per group of 32 the
/// affine range `[−min, max]` (min ≥ 0, so the range holds 0), its scale and min rounded to
/// 6 bits against the super-block's `d` and `dmin`, each value rounded to the nearest quant.
pub(crate) fn quantize_q45_k(x: &[f32], five: bool, out: &mut Vec<u8>) {
    let top = if five { 31.0 } else { 15.0 };
    let mut scales = [0f32; 8];
    let mut mins = [0f32; 8];
    for g in 0..8 {
        let grp = &x[32 * g..32 * g + 32];
        let lo = grp.iter().copied().fold(0f32, f32::min);
        let hi = grp.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        scales[g] = (hi - lo) / top;
        mins[g] = -lo;
    }
    let d = scales.iter().copied().fold(0f32, f32::max) / 63.0;
    let dmin = mins.iter().copied().fold(0f32, f32::max) / 63.0;
    // Round through f16 so the quants below use the scales the decoder will see.
    let (d, dmin) = (f16::from_f32(d).to_f32(), f16::from_f32(dmin).to_f32());
    let sc: [u8; 8] = std::array::from_fn(|g| {
        if d > 0.0 {
            (scales[g] / d).round().min(63.0) as u8
        } else {
            0
        }
    });
    let mn: [u8; 8] = std::array::from_fn(|g| {
        if dmin > 0.0 {
            (mins[g] / dmin).round().min(63.0) as u8
        } else {
            0
        }
    });
    let mut q = [0u8; 256];
    for g in 0..8 {
        let (dg, mg) = (d * sc[g] as f32, dmin * mn[g] as f32);
        for l in 0..32 {
            let v = if dg > 0.0 {
                ((x[32 * g + l] + mg) / dg).round()
            } else {
                0.0
            };
            q[32 * g + l] = v.clamp(0.0, top) as u8;
        }
    }
    put_f16(out, d);
    put_f16(out, dmin);
    out.extend(pack_scale_min_k4(&sc, &mn));
    if five {
        out.extend((0..32).map(|l| (0..8).map(|g| ((q[32 * g + l] >> 4) & 1) << g).sum::<u8>()));
    }
    for c in 0..4 {
        out.extend((0..32).map(|l| (q[64 * c + l] & 0x0F) | ((q[64 * c + 32 + l] & 0x0F) << 4)));
    }
}

/// The inverse of `scale_min_k4`: 8 six-bit scales and mins into 12 bytes.
fn pack_scale_min_k4(sc: &[u8; 8], mn: &[u8; 8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for j in 0..4 {
        s[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
        s[j + 4] = mn[j] | ((mn[j + 4] >> 4) << 6);
        s[j + 8] = (sc[j + 4] & 0x0F) | ((mn[j + 4] & 0x0F) << 4);
    }
    s
}

/// Q6_K: per group of 16 a signed scale, quantized to i8 against the super-block's `d`.
pub(crate) fn quantize_q6_k(x: &[f32], out: &mut Vec<u8>) {
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
