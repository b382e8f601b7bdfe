//! The tests' quantizer (f32 → ggml block bytes) for every type: the float types' encodings,
//! and the block formats' through the engine's own quantizers (`QMatrix::quantized`'s: ggml's
//! reference rounding for the legacy formats and Q8_0, round to nearest for the K-quants) —
//! good enough to bound round-trip error and to build weight matrices for the product tests.

use half::{bf16, f16};

use crate::quant::quantize::block_quantizer;
use crate::quant::GgmlType;

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
            let block = block_quantizer(dtype).expect("every block format has a quantizer");
            x.chunks_exact(dtype.block_elems())
                .for_each(|b| block(b, &mut out));
        }
    }
    out
}
