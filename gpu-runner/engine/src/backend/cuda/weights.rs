//! The model's weights on the device, in the layout the step wants: Q/K/V fused into one
//! `[q + k + v, hidden]` matrix and gate/up into one `[2·ffn, hidden]` matrix so that each is
//! one product, the small vectors as f32, and every matrix either as bf16 rows (GGUF
//! quantized types dequantized once at load; bf16 tensors copied from the mapped file as they
//! are) or, with [`CudaWeights::Quantized`], in its GGUF blocks as the file has them (the
//! embedding table stays bf16: the gather reads it row by row; blocks whose size is not a
//! multiple of 16 bytes are split into their quants and their headers, [`device_layout`]).

use std::borrow::Cow;
use std::sync::Arc;

use cudarc::driver::CudaStream;
use rayon::prelude::*;

use super::buffer::DeviceBuf;
use super::moe::DeviceMoe;
use super::CudaError;
use crate::model::{FeedForward, ModelConfig, Weights};
use crate::quant::ggml_type::{QK, QK_K};
use crate::quant::{GgmlType, Layout, QMatrix};

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
    /// As `Q8_0`, but float matrices whose rows are whole 256-element super-blocks become
    /// Q4_K (round to nearest, `QMatrix::quantized`): about 0.28 of bf16's bytes, at 4-bit
    /// precision (others Q8_0).
    Q4K,
}

impl std::str::FromStr for CudaWeights {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "bf16" => Ok(CudaWeights::Bf16),
            "quantized" => Ok(CudaWeights::Quantized),
            "q8_0" => Ok(CudaWeights::Q8_0),
            "q4_k" => Ok(CudaWeights::Q4K),
            _ => Err(format!(
                "unknown CUDA weight storage `{s}` (bf16, quantized, q8_0 or q4_k)"
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
    /// Its decode product with x staged as int8.
    pub gemv_int8_x: &'static str,
    pub dequant: &'static str,
    /// Its int8 tensor-core product of larger batches with x as int8 (mmq.cu).
    pub mmq: &'static str,
    /// Its grouped product through a layer's experts (moe.cu).
    pub moe: &'static str,
}

impl QuantKernels {
    /// The decode product that reads x as `x` says.
    pub fn gemv_reading(&self, x: QuantX) -> &'static str {
        match x {
            QuantX::Int8 => self.gemv_int8_x,
            QuantX::Bf16 => self.gemv,
        }
    }
}

/// How the decode products of quantized matrices read their input rows: as the bf16 rows
/// they are (each weight's exact product), or rounded to int8 per group of 32 with integer
/// dot products (every format the kernels read; about a fifth of the K-quants' instructions
/// per weight, x's precision that of llama.cpp's quantized products). `--cuda-quant-x int8`
/// chooses the second, which also gives the batches past the GEMVs' (up to 64 token rows,
/// prompt chunks included) the int8 tensor-core products (mmq.cu) of every format, where
/// bf16 x expands the blocks for cuBLAS.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QuantX {
    #[default]
    Bf16,
    Int8,
}

impl std::str::FromStr for QuantX {
    type Err = String;

    /// `--cuda-quant-x`'s value.
    fn from_str(setting: &str) -> Result<QuantX, String> {
        match setting.trim() {
            "bf16" => Ok(QuantX::Bf16),
            "int8" => Ok(QuantX::Int8),
            other => Err(format!("{other:?}: expected bf16 or int8")),
        }
    }
}

/// A block format's kernels, named after it (quant.cu, mmq.cu): `gemv_f`, `gemv_f_x8`,
/// `dequant_f`, `mmq_f`, `moe_gemv_f`.
macro_rules! format_kernels {
    ($f:literal) => {
        QuantKernels {
            gemv: concat!("gemv_", $f),
            gemv_int8_x: concat!("gemv_", $f, "_x8"),
            dequant: concat!("dequant_", $f),
            mmq: concat!("mmq_", $f),
            moe: concat!("moe_gemv_", $f),
        }
    };
}

/// The kernels for a block format, if they read it.
pub fn quant_kernels(dtype: GgmlType) -> Option<QuantKernels> {
    Some(match dtype {
        GgmlType::Q4_0 => format_kernels!("q4_0"),
        GgmlType::Q4_1 => format_kernels!("q4_1"),
        GgmlType::Q5_0 => format_kernels!("q5_0"),
        GgmlType::Q5_1 => format_kernels!("q5_1"),
        GgmlType::Q8_0 => format_kernels!("q8_0"),
        GgmlType::Q4K => format_kernels!("q4_k"),
        GgmlType::Q5K => format_kernels!("q5_k"),
        GgmlType::Q6K => format_kernels!("q6_k"),
        // No device kernel reads MXFP4: it is widened like the float types (`fill_bf16`,
        // through the host's dequantiser) or re-quantized to `--cuda-weights`' format.
        GgmlType::MXFP4 | GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => return None,
    })
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
    /// The output projection's bias (gpt-oss).
    pub bo: Option<DeviceBuf<f32>>,
    /// A sink logit per query head (gpt-oss).
    pub sinks: Option<DeviceBuf<f32>>,
    pub post_attn_norm: Option<DeviceBuf<f32>>,
    pub ffn_norm: DeviceBuf<f32>,
    pub ffn: DeviceFfn,
    pub post_ffn_norm: Option<DeviceBuf<f32>>,
}

/// A layer's feed-forward.
pub enum DeviceFfn {
    Dense {
        /// `[2·ffn, hidden]`: gate rows, then up rows.
        gate_up: DeviceMatrix,
        down: DeviceMatrix,
    },
    Moe(Box<DeviceMoe>),
}

impl DeviceFfn {
    /// The dense feed-forward's `[gate | up]` matrix (`None`: experts).
    pub fn gate_up(&self) -> Option<&DeviceMatrix> {
        match self {
            DeviceFfn::Dense { gate_up, .. } => Some(gate_up),
            DeviceFfn::Moe(_) => None,
        }
    }

    /// The dense feed-forward's down projection (`None`: experts).
    pub fn down(&self) -> Option<&DeviceMatrix> {
        match self {
            DeviceFfn::Dense { down, .. } => Some(down),
            DeviceFfn::Moe(_) => None,
        }
    }

    /// Every matrix a step may read (an expert bank counts as none: it is not one matrix).
    fn matrices(&self) -> Vec<&DeviceMatrix> {
        match self {
            DeviceFfn::Dense { gate_up, down } => vec![gate_up, down],
            DeviceFfn::Moe(moe) => moe.matrices(),
        }
    }

    /// Bytes on the device.
    fn bytes(&self) -> usize {
        match self {
            DeviceFfn::Dense { gate_up, down } => gate_up.bytes() + down.bytes(),
            DeviceFfn::Moe(moe) => moe.bytes(),
        }
    }
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
            let ffn = match &l.ffn {
                FeedForward::Dense(d) => DeviceFfn::Dense {
                    gate_up: stacked(&[&d.gate, &d.up])?,
                    down: stacked(&[&d.down])?,
                },
                FeedForward::Moe(m) => {
                    DeviceFfn::Moe(Box::new(DeviceMoe::upload(stream, m, mode)?))
                }
            };
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
                bo: optional(&l.bo)?,
                sinks: optional(&l.sinks)?,
                post_attn_norm: optional(&l.post_attn_norm)?,
                ffn_norm: vector(&l.ffn_norm)?,
                ffn,
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
        self.matrices().map(quantized).max().unwrap_or(0)
    }

    /// Every weight matrix products read: each layer's, then the output head where it is its
    /// own (not the embedding table).
    pub fn matrices(&self) -> impl Iterator<Item = &DeviceMatrix> {
        self.layers
            .iter()
            .flat_map(|l| [&l.wqkv, &l.wo].into_iter().chain(l.ffn.matrices()))
            .chain(self.output.as_ref())
    }

    /// Bytes of every matrix (what a decode step streams, embeddings aside).
    pub fn matrix_bytes(&self) -> usize {
        let layers: usize = self
            .layers
            .iter()
            .map(|l| l.wqkv.bytes() + l.wo.bytes() + l.ffn.bytes())
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
        CudaWeights::Q4K if m.cols.is_multiple_of(QK_K) => Some(GgmlType::Q4K),
        CudaWeights::Q8_0 | CudaWeights::Q4K if m.cols.is_multiple_of(QK) => Some(GgmlType::Q8_0),
        _ => None,
    }
}

/// How the device splits each block of `dtype` (quant.cu): byte ranges of a block, each
/// stored for every block of the matrix together, in block order, one region after another,
/// so that the kernels read them with aligned loads. None: ggml's layout as it is.
fn device_segments(dtype: GgmlType) -> &'static [std::ops::Range<usize>] {
    match dtype {
        // Low bits (the block's last 16 or 32 bytes), then the header before them.
        GgmlType::Q8_0 => &[2..34, 0..2],
        GgmlType::Q4_0 => &[2..18, 0..2],
        GgmlType::Q4_1 => &[4..20, 0..4],
        GgmlType::Q5_0 => &[6..22, 0..6],
        GgmlType::Q5_1 => &[8..24, 0..8],
        // ql and qh, the 16 scales, d.
        GgmlType::Q6K => &[0..192, 192..208, 208..210],
        _ => &[],
    }
}

/// Blocks of `dtype` as the device keeps them: ggml's layout, or split as
/// [`device_segments`] says (e.g. Q8_0's 34-byte blocks, an f16 scale then 32 int8 quants,
/// become all the quants, row-major, then all the scales): the same bytes, rearranged, and
/// zeros up to a multiple of 16 bytes (the kernels' 16-byte loads need the buffer's start
/// aligned; a device allocation is, and the emulator places a buffer against its guard
/// page, so its size decides its alignment).
pub fn device_layout(dtype: GgmlType, blocks: &[u8]) -> Cow<'_, [u8]> {
    let segments = device_segments(dtype);
    if segments.is_empty() {
        return Cow::Borrowed(blocks);
    }
    let block = dtype.block_bytes();
    let n = blocks.len() / block;
    let mut out = Vec::with_capacity(n * block);
    for range in segments {
        for b in blocks.chunks_exact(block) {
            out.extend_from_slice(&b[range.clone()]);
        }
    }
    out.resize(out.len().next_multiple_of(16), 0);
    Cow::Owned(out)
}

/// Uploads matrices with the same column count as one matrix, rows stacked in order: in
/// their blocks when `mode` asks for it and every part can, else as bf16.
pub(super) fn upload_stacked(
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
                let q = p
                    .quantized(dtype)
                    .map_err(|e| CudaError::Failure(format!("quantizing {p:?} at load: {e}")))?;
                DeviceBuf::from_host(stream, &device_layout(dtype, q.bytes()))?
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
    let mut buf = DeviceBuf::zeros(stream, rows * cols)?;
    let mut at = 0;
    for part in parts {
        write_bf16(stream, part, &mut buf, at)?;
        at += part.rows * part.cols;
    }
    Ok(DeviceMatrix {
        rows,
        cols,
        storage: Storage::Bf16(buf),
    })
}

/// Writes `m`'s rows as bf16 bits into `buf` from element `at` on: a bf16 matrix straight
/// from its bytes (the mapped file: an 8B model's 16 GB are not copied and zero-filled on
/// the host first), anything else through a host buffer of its own.
fn write_bf16(
    stream: &Arc<CudaStream>,
    m: &QMatrix,
    buf: &mut DeviceBuf<u16>,
    at: usize,
) -> Result<(), CudaError> {
    if let Some(bits) = bf16_bits_in_place(m) {
        return buf.write_at(stream, at, bits);
    }
    let mut host = vec![0u16; m.rows * m.cols];
    fill_bf16(m, &mut host);
    buf.write_at(stream, at, &host)
}

/// A bf16 matrix's bytes as its u16 bits where they already are: little-endian, in row
/// order and 2-byte aligned (files align their tensors; an unaligned one is copied).
pub(super) fn bf16_bits_in_place(m: &QMatrix) -> Option<&[u16]> {
    if m.dtype != GgmlType::BF16 || m.layout != Layout::Rows || cfg!(target_endian = "big") {
        return None;
    }
    bytemuck::try_cast_slice(m.bytes()).ok()
}

/// Fills `dst` with `m`'s rows as bf16 bits: bf16 rows are copied, everything else
/// dequantized (in parallel over rows) and rounded to nearest even.
pub(super) fn fill_bf16(m: &QMatrix, dst: &mut [u16]) {
    if m.dtype == GgmlType::BF16 && m.layout == Layout::Rows {
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
                *o = bf16_bits(v);
            }
        },
    );
}

/// `v` rounded to the nearest bf16, ties to even, as its bits: the bits of
/// `half::bf16::from_f32` (a NaN keeps its sign and upper payload, made quiet), computed
/// without a branch so that a row's loop vectorises (per element through `from_f32`, a
/// sixth of the Gemma 3 conformance test on the emulated driver was this conversion).
fn bf16_bits(v: f32) -> u16 {
    let x = v.to_bits();
    // Adding 0x7FFF, plus one when the kept part is odd, carries into it exactly when the
    // dropped half is over a half, or a half with an odd kept part.
    let rounded = x.wrapping_add(0x7FFF + ((x >> 16) & 1)) >> 16;
    let quiet_nan = (x >> 16) | 0x40;
    let is_nan = x & 0x7FFF_FFFF > 0x7F80_0000;
    (if is_nan { quiet_nan } else { rounded }) as u16
}

#[cfg(test)]
mod tests {
    use half::bf16;

    use super::*;
    use crate::quant::TensorBytes;

    fn matrix(dtype: GgmlType, rows: usize, cols: usize) -> QMatrix {
        let bytes = vec![0u8; rows * cols / dtype.block_elems() * dtype.block_bytes()];
        QMatrix::new(dtype, rows, cols, TensorBytes::Owned(bytes)).expect("whole blocks")
    }

    #[test]
    fn bf16_rounding_gives_the_bits_of_half_for_every_sign_exponent_and_rounding_case() {
        // Every upper half (sign, exponent, kept mantissa: NaNs and infinities included)
        // with each dropped half that decides the rounding.
        let dropped = [0, 1, 0x4000, 0x7FFF, 0x8000, 0x8001, 0xC000, 0xFFFF];
        for upper in 0..=u16::MAX as u32 {
            for low in dropped {
                let v = f32::from_bits(upper << 16 | low);
                assert_eq!(
                    bf16_bits(v),
                    bf16::from_f32(v).to_bits(),
                    "{:#010x}",
                    v.to_bits()
                );
            }
        }
    }

    #[test]
    fn bf16_rows_are_read_in_place_where_aligned_and_copied_or_converted_where_not() {
        let values: Vec<u16> = (0..64u16).map(|i| i.wrapping_mul(0x3F01)).collect();
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        // The same bytes one past a page boundary: not 2-byte aligned.
        let mut anon = memmap2::MmapMut::map_anon(bytes.len() + 1).expect("anonymous map");
        anon[1..].copy_from_slice(&bytes);
        let map = Arc::new(anon.make_read_only().expect("read-only map"));
        let unaligned_bytes = TensorBytes::Mapped {
            map,
            offset: 1,
            len: bytes.len(),
        };
        let aligned =
            QMatrix::new(GgmlType::BF16, 2, 32, TensorBytes::Owned(bytes)).expect("whole rows");
        let unaligned = QMatrix::new(GgmlType::BF16, 2, 32, unaligned_bytes).expect("whole rows");
        assert_eq!(bf16_bits_in_place(&aligned), Some(&values[..]));
        assert_eq!(bf16_bits_in_place(&unaligned), None);
        let mut copied = vec![0u16; values.len()];
        fill_bf16(&unaligned, &mut copied);
        assert_eq!(copied, values);

        let floats: Vec<f32> = (0..64).map(|i| (i as f32 - 20.5) / 3.0).collect();
        let f32s = QMatrix::from_f32(2, 32, &floats).expect("f32 matrix");
        assert_eq!(bf16_bits_in_place(&f32s), None);
        let mut converted = vec![0u16; floats.len()];
        fill_bf16(&f32s, &mut converted);
        let rounded: Vec<u16> = floats
            .iter()
            .map(|&v| bf16::from_f32(v).to_bits())
            .collect();
        assert_eq!(converted, rounded);
    }

    #[test]
    fn int8_x_takes_every_formats_integer_product_and_bf16_x_its_float_one() {
        assert_eq!(QuantX::default(), QuantX::Bf16);
        assert_eq!("bf16".parse(), Ok(QuantX::Bf16));
        assert_eq!("int8".parse(), Ok(QuantX::Int8));
        assert!("int4".parse::<QuantX>().is_err());
        for t in GgmlType::ALL {
            let Some(kernels) = quant_kernels(t) else {
                continue;
            };
            assert_eq!(kernels.gemv_reading(QuantX::Bf16), kernels.gemv, "{t:?}");
            assert_eq!(
                kernels.gemv_reading(QuantX::Int8),
                format!("{}_x8", kernels.gemv),
                "{t:?}"
            );
        }
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
        let wide = matrix(GgmlType::BF16, 2, 512);
        assert_eq!(
            device_block_format(&wide, CudaWeights::Q4K),
            Some(GgmlType::Q4K)
        );
        assert_eq!(
            device_block_format(&f32s, CudaWeights::Q4K),
            Some(GgmlType::Q8_0),
            "rows that are not whole super-blocks take Q8_0"
        );
        assert_eq!(
            device_block_format(&q4, CudaWeights::Q4K),
            Some(GgmlType::Q4_1)
        );
        assert_eq!(device_block_format(&ragged, CudaWeights::Q4K), None);
        assert_eq!("q8_0".parse(), Ok(CudaWeights::Q8_0));
        assert_eq!("q4_k".parse(), Ok(CudaWeights::Q4K));
        assert!("fp8".parse::<CudaWeights>().is_err());
    }

    #[test]
    fn mxfp4_goes_up_widened_or_requantized_through_the_hosts_dequantiser() {
        let values: Vec<f32> = (0..64).map(|i| (i as f32 - 31.0) / 8.0).collect();
        let m = QMatrix::from_f32(2, 32, &values)
            .and_then(|f| f.quantized(GgmlType::MXFP4))
            .expect("an MXFP4 matrix");
        assert!(quant_kernels(GgmlType::MXFP4).is_none());
        assert_eq!(device_block_format(&m, CudaWeights::Quantized), None);
        assert_eq!(
            device_block_format(&m, CudaWeights::Q8_0),
            Some(GgmlType::Q8_0)
        );
        let mut widened = vec![0u16; 64];
        fill_bf16(&m, &mut widened);
        let want: Vec<u16> = m
            .dequantize_all()
            .iter()
            .map(|&v| bf16::from_f32(v).to_bits())
            .collect();
        assert_eq!(widened, want);
    }
}
