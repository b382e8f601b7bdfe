//! Each CUDA kernel against a plain reference, run on the CPU by the
//! [`emulator`](super::emulator): the kernels' arithmetic and indexing are checked on every
//! machine. With `FALLOW_KERNEL_TESTS=driver` the same tests launch through the CUDA driver
//! API, on the GPU where there is one ([`runner`]); the GPU conformance suite checks the
//! kernels together. Every test skips (passing) where its runner cannot run here.

use half::bf16;

mod attention;
mod lora;
mod moe;
mod picks;
mod quant;
mod rows;
mod runner;

/// A small deterministic generator (xorshift) of values in [-1, 1).
pub(super) struct Values(pub(super) u64);

impl Values {
    pub(super) fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    pub(super) fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next()).collect()
    }

    pub(super) fn bf16s(&mut self, n: usize) -> Vec<u16> {
        (0..n).map(|_| to_bf16(self.next())).collect()
    }
}

pub(super) fn to_bf16(x: f32) -> u16 {
    bf16::from_f32(x).to_bits()
}

pub(super) fn from_bf16(b: u16) -> f32 {
    bf16::from_bits(b).to_f32()
}

pub(super) fn assert_close(got: &[f32], want: &[f32], tolerance: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tolerance,
            "{what}: element {i} is {g}, want {w} (±{tolerance})"
        );
    }
}
