//! Tests of the block formats: golden vectors from ggml's reference, round trips through
//! small reference quantizers, matrix products against f32 maths, SIMD against scalar.

use crate::quant::GgmlType;

mod golden;
#[cfg(target_arch = "x86_64")]
mod interleaved;
mod matmul;
mod ref_quant;
mod roundtrip;
#[cfg(target_arch = "x86_64")]
mod simd;

/// Random bytes for `n` blocks of `t`, with small finite f16 scale (and offset) fields, so
/// every quant and packed-scale value (including Q8_0's −128) occurs.
pub(crate) fn raw_blocks(rng: &mut Rng, t: GgmlType, n: usize) -> Vec<u8> {
    let bb = t.block_bytes();
    let mut bytes: Vec<u8> = (0..n * bb).map(|_| rng.next_u64() as u8).collect();
    let fields: &[usize] = match t {
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4K | GgmlType::Q5K => &[0, 2],
        GgmlType::Q6K => &[208],
        // An E8M0 scale byte, not an f16: kept near 1 so that sums stay finite.
        GgmlType::MXFP4 => &[],
        _ => &[0],
    };
    for block in bytes.chunks_exact_mut(bb) {
        if t == GgmlType::MXFP4 {
            block[0] = 120 + (rng.next_u64() % 12) as u8;
        }
        for &at in fields {
            let v = half::f16::from_f32(rng.normal() * 0.05).to_le_bytes();
            block[at..at + 2].copy_from_slice(&v);
        }
    }
    bytes
}

/// A small deterministic generator (xorshift64*), so tests need no extra crates.
pub(crate) struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f32 {
        let u = self.uniform().max(1e-7);
        let v = self.uniform();
        (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
    }

    pub fn normals(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.normal() * scale).collect()
    }
}

/// Whether a SIMD kernel's `got` for one row and token agrees with the portable kernel's
/// `want`. Kernels may round in another order; f32 rounding scales with the size of the
/// per-block terms, which random blocks make thousands of times larger than their
/// (cancelling) sum.
#[cfg(target_arch = "x86_64")]
pub(super) fn kernel_agrees<W: crate::quant::formats::WeightFormat>(
    wrow: &[u8],
    acts: &[W::Act],
    tn: usize,
    tok: usize,
    want: f32,
    got: f32,
) -> bool {
    let terms: f32 = wrow
        .chunks_exact(W::BLOCK_BYTES)
        .enumerate()
        .map(|(b, block)| W::dot(block, &acts[b * tn + tok]).abs())
        .sum();
    (want - got).abs() <= 1e-4 * want.abs().max(1.0) + 1e-6 * terms
}

/// Activations of `tn` random tokens of `cols` inputs, block-major as kernels take them.
#[cfg(target_arch = "x86_64")]
pub(super) fn random_acts<A: crate::quant::act::ActBlock>(
    rng: &mut Rng,
    cols: usize,
    tn: usize,
) -> Vec<A> {
    let nb = cols / A::ELEMS;
    let mut acts = vec![A::default(); nb * tn];
    for tok in 0..tn {
        let x = rng.normals(cols, 2.0);
        for (b, chunk) in x.chunks_exact(A::ELEMS).enumerate() {
            acts[b * tn + tok] = A::quantize(chunk);
        }
    }
    acts
}
