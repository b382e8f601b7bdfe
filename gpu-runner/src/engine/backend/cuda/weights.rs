//! The model's weights on the device, in the layout the step wants: Q/K/V fused into one
//! `[q + k + v, hidden]` matrix and gate/up into one `[2·ffn, hidden]` matrix so that each is
//! one product, the small vectors as f32, and every matrix either as bf16 rows (GGUF
//! quantized types dequantized once at load; bf16 safetensors copied as they are) or, with
//! [`CudaWeights::Quantized`], in its GGUF blocks as the file has them (the embedding table
//! stays bf16: the gather reads it row by row; Q8_0 blocks are split into quants and scales,
//! [`device_layout`]).

use std::borrow::Cow;
use std::sync::Arc;

use cudarc::driver::CudaStream;
use half::bf16;
use rayon::prelude::*;

use super::buffer::DeviceBuf;
use super::CudaError;
use crate::engine::model::{ModelConfig, Weights};
use crate::engine::quant::ggml_type::QK;
use crate::engine::quant::legacy::quantize_q8_0;
use crate::engine::quant::{GgmlType, Layout, QMatrix};

/// How a backend stores weight matrices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CudaWeights {
    /// bf16, whatever the file's format: cuBLAS and the bf16 GEMV at every batch size.
    #[default]
    Bf16,
    /// A GGUF file's quantized blocks as they are (where every stacked part is of a format
    /// the kernels read; others bf16): decode reads fewer bytes, larger batches expand a
    /// matrix to bf16 per product.
    Quantized,
    /// As `Quantized`, and float matrices (safetensors, F16/BF16 GGUF tensors) quantized
    /// to Q8_0 at load: about half of bf16's memory and decode bytes, near-lossless.
    Q8_0,
}

impl std::str::FromStr for CudaWeights {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "bf16" => Ok(CudaWeights::Bf16),
            "quantized" => Ok(CudaWeights::Quantized),
            "q8_0" => Ok(CudaWeights::Q8_0),
            _ => Err(format!(
                "unknown CUDA weight storage `{s}` (bf16, quantized or q8_0)"
            )),
        }
    }
}

/// A `[rows, cols]` matrix on the device.
pub struct DeviceMatrix {
    pub rows: usize,
    pub cols: usize,
    pub storage: Storage,
}

pub enum Storage {
    Bf16(DeviceBuf<u16>),
    /// Parts stacked by rows, each in its own block format.
    Quantized(Vec<QuantPart>),
}

/// Rows of a matrix in one GGUF block format, ggml's layout.
pub struct QuantPart {
    pub dtype: GgmlType,
    /// The format's decode product and its expansion to bf16 (quant.cu).
    pub kernels: QuantKernels,
    pub rows: usize,
    pub buf: DeviceBuf<u8>,
}

impl DeviceMatrix {
    /// Bytes on the device (what a decode step streams).
    pub fn bytes(&self) -> usize {
        match &self.storage {
            Storage::Bf16(_) => self.rows * self.cols * 2,
            Storage::Quantized(parts) => parts
                .iter()
                .map(|p| p.rows * self.cols / p.dtype.block_elems() * p.dtype.block_bytes())
                .sum(),
        }
    }

    /// The bf16 rows' address, for a matrix stored as bf16.
    pub fn bf16_ptr(&self) -> Option<u64> {
        match &self.storage {
            Storage::Bf16(buf) => Some(buf.ptr()),
            Storage::Quantized(_) => None,
        }
    }
}

/// The kernels that read one block format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuantKernels {
    pub gemv: &'static str,
    pub dequant: &'static str,
}

/// The kernels for a block format, if they read it.
pub fn quant_kernels(dtype: GgmlType) -> Option<QuantKernels> {
    let (gemv, dequant) = match dtype {
        GgmlType::Q4_0 => ("gemv_q4_0", "dequant_q4_0"),
        GgmlType::Q4_1 => ("gemv_q4_1", "dequant_q4_1"),
        GgmlType::Q5_0 => ("gemv_q5_0", "dequant_q5_0"),
        GgmlType::Q5_1 => ("gemv_q5_1", "dequant_q5_1"),
        GgmlType::Q8_0 => ("gemv_q8_0", "dequant_q8_0"),
        GgmlType::Q4K => ("gemv_q4_k", "dequant_q4_k"),
        GgmlType::Q5K => ("gemv_q5_k", "dequant_q5_k"),
        GgmlType::Q6K => ("gemv_q6_k", "dequant_q6_k"),
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => return None,
    };
    Some(QuantKernels { gemv, dequant })
}

pub struct DeviceLayer {
    pub attn_norm: DeviceBuf<f32>,
    /// `[q_dim + 2·kv_dim, hidden]`.
    pub wqkv: DeviceMatrix,
    /// `[q | k | v]` biases, zeros where a model has only some.
    pub bqkv: Option<DeviceBuf<f32>>,
    pub q_norm: Option<DeviceBuf<f32>>,
    pub k_norm: Option<DeviceBuf<f32>>,
    pub wo: DeviceMatrix,
    pub post_attn_norm: Option<DeviceBuf<f32>>,
    pub ffn_norm: DeviceBuf<f32>,
    /// `[2·ffn, hidden]`: gate rows, then up rows.
    pub w_gate_up: DeviceMatrix,
    pub w_down: DeviceMatrix,
    pub post_ffn_norm: Option<DeviceBuf<f32>>,
}

pub struct DeviceWeights {
    pub token_embd: DeviceMatrix,
    pub output_norm: DeviceBuf<f32>,
    /// The LM head; `None` when tied to `token_embd`.
    pub output: Option<DeviceMatrix>,
    pub layers: Vec<DeviceLayer>,
}

impl DeviceWeights {
    pub fn upload(
        stream: &Arc<CudaStream>,
        config: &ModelConfig,
        w: &Weights,
        mode: CudaWeights,
    ) -> Result<Self, CudaError> {
        let stacked = |parts: &[&QMatrix]| upload_stacked(stream, parts, mode);
        let vector = |v: &[f32]| DeviceBuf::from_host(stream, v);
        let optional = |v: &Option<Vec<f32>>| v.as_deref().map(vector).transpose();
        let mut layers = Vec::with_capacity(w.layers.len());
        for l in &w.layers {
            let bqkv = if l.bq.is_some() || l.bk.is_some() || l.bv.is_some() {
                let mut b = Vec::with_capacity(config.q_dim() + 2 * config.kv_dim());
                for (bias, len) in [
                    (&l.bq, config.q_dim()),
                    (&l.bk, config.kv_dim()),
                    (&l.bv, config.kv_dim()),
                ] {
                    match bias {
                        Some(v) => b.extend_from_slice(v),
                        None => b.extend(std::iter::repeat_n(0.0, len)),
                    }
                }
                Some(vector(&b)?)
            } else {
                None
            };
            layers.push(DeviceLayer {
                attn_norm: vector(&l.attn_norm)?,
                wqkv: stacked(&[&l.wq, &l.wk, &l.wv])?,
                bqkv,
                q_norm: optional(&l.q_norm)?,
                k_norm: optional(&l.k_norm)?,
                wo: stacked(&[&l.wo])?,
                post_attn_norm: optional(&l.post_attn_norm)?,
                ffn_norm: vector(&l.ffn_norm)?,
                w_gate_up: stacked(&[&l.w_gate, &l.w_up])?,
                w_down: stacked(&[&l.w_down])?,
                post_ffn_norm: optional(&l.post_ffn_norm)?,
            });
        }
        Ok(DeviceWeights {
            // The gather reads rows of bf16 (and a tied LM head uses it as is).
            token_embd: upload_stacked(stream, &[&w.token_embd], CudaWeights::Bf16)?,
            output_norm: vector(&w.output_norm)?,
            output: w.output.as_ref().map(|m| stacked(&[m])).transpose()?,
            layers,
        })
    }

    pub fn lm_head(&self) -> &DeviceMatrix {
        self.output.as_ref().unwrap_or(&self.token_embd)
    }

    /// Elements of the largest matrix kept in blocks (0 if none): the bf16 room a product
    /// over many tokens expands it into.
    pub fn largest_quantized(&self) -> usize {
        let quantized = |m: &DeviceMatrix| match m.storage {
            Storage::Quantized(_) => m.rows * m.cols,
            Storage::Bf16(_) => 0,
        };
        self.layers
            .iter()
            .flat_map(|l| [&l.wqkv, &l.wo, &l.w_gate_up, &l.w_down])
            .chain(self.output.as_ref())
            .map(quantized)
            .max()
            .unwrap_or(0)
    }

    /// Bytes of every matrix (what a decode step streams, embeddings aside).
    pub fn matrix_bytes(&self) -> usize {
        let layers: usize = self
            .layers
            .iter()
            .map(|l| l.wqkv.bytes() + l.wo.bytes() + l.w_gate_up.bytes() + l.w_down.bytes())
            .sum();
        layers + self.token_embd.bytes() + self.output.as_ref().map_or(0, DeviceMatrix::bytes)
    }
}

/// Whether `m` can stay in its blocks on the device.
pub fn stays_quantized(m: &QMatrix) -> bool {
    quant_kernels(m.dtype).is_some() && m.layout == Layout::Rows
}

/// The block format `m` takes on the device under `mode`, if not bf16.
pub fn device_block_format(m: &QMatrix, mode: CudaWeights) -> Option<GgmlType> {
    match mode {
        CudaWeights::Bf16 => None,
        _ if stays_quantized(m) => Some(m.dtype),
        CudaWeights::Q8_0 if m.cols.is_multiple_of(QK) => Some(GgmlType::Q8_0),
        _ => None,
    }
}

/// Blocks of `dtype` as the device keeps them: ggml's layout, except Q8_0, whose 34-byte
/// blocks (an f16 scale, then 32 int8 quants) become all the quants (`rows·cols` bytes,
/// row-major, so the GEMV reads them 16 at a time from aligned addresses) followed by all
/// the scales (one f16 per 32 quants, in the same order): the same bytes, rearranged.
pub fn device_layout(dtype: GgmlType, blocks: &[u8]) -> Cow<'_, [u8]> {
    if dtype != GgmlType::Q8_0 {
        return Cow::Borrowed(blocks);
    }
    let block = GgmlType::Q8_0.block_bytes();
    let n = blocks.len() / block;
    let mut out = vec![0u8; n * block];
    let (quants, scales) = out.split_at_mut(n * QK);
    for (i, b) in blocks.chunks_exact(block).enumerate() {
        scales[2 * i..2 * i + 2].copy_from_slice(&b[..2]);
        quants[QK * i..QK * (i + 1)].copy_from_slice(&b[2..]);
    }
    Cow::Owned(out)
}

/// `m`'s rows quantized to Q8_0 (from whatever float type it has).
fn to_q8_0(m: &QMatrix) -> Vec<u8> {
    let row_bytes = m.cols / QK * GgmlType::Q8_0.block_bytes();
    let mut out = vec![0u8; m.rows * row_bytes];
    out.par_chunks_mut(row_bytes).enumerate().for_each_init(
        || (vec![0f32; m.cols], Vec::with_capacity(row_bytes)),
        |(row, blocks), (r, dst)| {
            m.dequantize_row(r, row);
            blocks.clear();
            for x in row.chunks_exact(QK) {
                quantize_q8_0(x, blocks);
            }
            dst.copy_from_slice(blocks);
        },
    );
    out
}

/// Uploads matrices with the same column count as one matrix, rows stacked in order: in
/// their blocks when `mode` asks for it and every part can, else as bf16.
fn upload_stacked(
    stream: &Arc<CudaStream>,
    parts: &[&QMatrix],
    mode: CudaWeights,
) -> Result<DeviceMatrix, CudaError> {
    let cols = parts[0].cols;
    if let Some(bad) = parts.iter().find(|p| p.cols != cols) {
        return Err(CudaError::Failure(format!(
            "cannot stack {bad:?} under a matrix of {cols} columns"
        )));
    }
    let rows: usize = parts.iter().map(|p| p.rows).sum();
    let formats: Option<Vec<GgmlType>> =
        parts.iter().map(|p| device_block_format(p, mode)).collect();
    if let Some(formats) = formats {
        let mut quantized = Vec::with_capacity(parts.len());
        for (p, dtype) in parts.iter().zip(formats) {
            let Some(kernels) = quant_kernels(dtype) else {
                continue;
            };
            let buf = if dtype == p.dtype {
                DeviceBuf::from_host(stream, &device_layout(dtype, p.bytes()))?
            } else {
                DeviceBuf::from_host(stream, &device_layout(dtype, &to_q8_0(p)))?
            };
            quantized.push(QuantPart {
                dtype,
                kernels,
                rows: p.rows,
                buf,
            });
        }
        return Ok(DeviceMatrix {
            rows,
            cols,
            storage: Storage::Quantized(quantized),
        });
    }
    let mut host: Vec<u16> = Vec::with_capacity(rows * cols);
    for part in parts {
        append_bf16(part, &mut host);
    }
    Ok(DeviceMatrix {
        rows,
        cols,
        storage: Storage::Bf16(DeviceBuf::from_host(stream, &host)?),
    })
}

/// Appends `m`'s rows as bf16 bits: bf16 is copied, everything else dequantized (in
/// parallel over rows) and rounded to nearest even.
fn append_bf16(m: &QMatrix, out: &mut Vec<u16>) {
    let start = out.len();
    out.resize(start + m.rows * m.cols, 0);
    let dst = &mut out[start..];
    if m.dtype == GgmlType::BF16 {
        for (d, s) in dst.iter_mut().zip(m.bytes().chunks_exact(2)) {
            *d = u16::from_le_bytes([s[0], s[1]]);
        }
        return;
    }
    dst.par_chunks_mut(m.cols).enumerate().for_each_init(
        || vec![0f32; m.cols],
        |row, (r, d)| {
            m.dequantize_row(r, row);
            for (o, &v) in d.iter_mut().zip(row.iter()) {
                *o = bf16::from_f32(v).to_bits();
            }
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::quant::TensorBytes;

    fn matrix(dtype: GgmlType, rows: usize, cols: usize) -> QMatrix {
        let bytes = vec![0u8; rows * cols / dtype.block_elems() * dtype.block_bytes()];
        QMatrix::new(dtype, rows, cols, TensorBytes::Owned(bytes)).expect("whole blocks")
    }

    #[test]
    fn each_storage_keeps_or_makes_the_blocks_the_kernels_read() {
        let q4 = matrix(GgmlType::Q4_1, 2, 64);
        let f32s = matrix(GgmlType::F32, 2, 64);
        let ragged = matrix(GgmlType::F16, 2, 48);
        assert_eq!(device_block_format(&q4, CudaWeights::Bf16), None);
        assert_eq!(
            device_block_format(&q4, CudaWeights::Quantized),
            Some(GgmlType::Q4_1)
        );
        assert_eq!(device_block_format(&f32s, CudaWeights::Quantized), None);
        assert_eq!(
            device_block_format(&q4, CudaWeights::Q8_0),
            Some(GgmlType::Q4_1)
        );
        assert_eq!(
            device_block_format(&f32s, CudaWeights::Q8_0),
            Some(GgmlType::Q8_0)
        );
        assert_eq!(
            device_block_format(&ragged, CudaWeights::Q8_0),
            None,
            "rows that are not whole blocks stay bf16"
        );
        assert_eq!("q8_0".parse(), Ok(CudaWeights::Q8_0));
        assert!("fp8".parse::<CudaWeights>().is_err());
    }

    #[test]
    fn float_rows_quantized_at_load_come_back_within_half_a_step() {
        let (rows, cols) = (3usize, 96usize);
        let values: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * (1 + i % 5) as f32)
            .collect();
        let m = QMatrix::from_f32(rows, cols, &values).expect("f32 matrix");
        let q = QMatrix::new(GgmlType::Q8_0, rows, cols, TensorBytes::Owned(to_q8_0(&m)))
            .expect("whole Q8_0 blocks");
        let mut back = vec![0f32; cols];
        for r in 0..rows {
            q.dequantize_row(r, &mut back);
            for (block, (got, want)) in back
                .chunks(QK)
                .zip(values[r * cols..(r + 1) * cols].chunks(QK))
                .enumerate()
            {
                let step = want.iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0;
                for (g, w) in got.iter().zip(want) {
                    assert!(
                        // Half a step, plus the f16 rounding of the step itself.
                        (g - w).abs() <= step * 0.6,
                        "row {r} block {block}: {g} for {w} (step {step})"
                    );
                }
            }
        }
    }
}
