//! A mixture-of-experts layer's expert weights on the device: every expert of one
//! projection in one buffer, in one format ([`super::moe`] runs them).

use std::sync::Arc;

use cudarc::driver::CudaStream;

use super::buffer::DeviceBuf;
use super::weights::{
    bf16_bits_in_place, device_block_format, device_layout, fill_bf16, quant_kernels, CudaWeights,
};
use super::CudaError;
use crate::quant::{GgmlType, QMatrix};

/// Every expert's matrix of one projection: `experts` matrices of `rows × cols`, expert `e`'s
/// at `e · stride` bytes, read by `kernel` (`moe_gemv_bf16` or a block format's).
pub struct ExpertBank {
    pub rows: usize,
    pub cols: usize,
    pub(super) stride: usize,
    pub(super) kernel: &'static str,
    pub(super) buf: DeviceBuf<u8>,
}

impl ExpertBank {
    /// Uploads each expert's `parts` stacked by rows (e.g. `[gate, up]`): in the one block
    /// format every part of every expert takes under `mode`, or bf16 where they differ.
    pub(super) fn upload(
        stream: &Arc<CudaStream>,
        experts: &[Vec<&QMatrix>],
        mode: CudaWeights,
    ) -> Result<Self, CudaError> {
        let first = experts
            .first()
            .ok_or_else(|| CudaError::Failure("a mixture of experts without experts".into()))?;
        let cols = first[0].cols;
        let rows: usize = first.iter().map(|p| p.rows).sum();
        for parts in experts {
            let shape = (parts.iter().map(|p| p.rows).sum::<usize>(), parts[0].cols);
            if shape != (rows, cols) || parts.iter().any(|p| p.cols != cols) {
                return Err(CudaError::Failure(format!(
                    "experts of one layer differ in shape: {shape:?} and {:?}",
                    (rows, cols)
                )));
            }
        }
        match common_block_format(experts, mode) {
            Some(dtype) => Self::upload_blocks(stream, experts, dtype, rows, cols),
            None => Self::upload_bf16(stream, experts, rows, cols),
        }
    }

    fn upload_blocks(
        stream: &Arc<CudaStream>,
        experts: &[Vec<&QMatrix>],
        dtype: GgmlType,
        rows: usize,
        cols: usize,
    ) -> Result<Self, CudaError> {
        let kernel = quant_kernels(dtype)
            .map(|k| k.moe)
            .ok_or_else(|| CudaError::Failure(format!("no kernels read {dtype:?}")))?;
        // Every expert's bytes in the device layout of a `rows × cols` matrix (whole blocks,
        // padded to 16 bytes): the same size for each.
        let stride = (rows * cols / dtype.block_elems() * dtype.block_bytes()).next_multiple_of(16);
        let mut buf = DeviceBuf::zeros(stream, stride * experts.len())?;
        let mut blocks = Vec::with_capacity(stride);
        for (e, parts) in experts.iter().enumerate() {
            blocks.clear();
            for p in parts {
                if p.dtype == dtype {
                    blocks.extend_from_slice(p.bytes());
                } else {
                    let q = p.quantized(dtype).map_err(|err| {
                        CudaError::Failure(format!("quantizing {p:?} at load: {err}"))
                    })?;
                    blocks.extend_from_slice(q.bytes());
                }
            }
            buf.write_at(stream, e * stride, &device_layout(dtype, &blocks))?;
        }
        Ok(ExpertBank {
            rows,
            cols,
            stride,
            kernel,
            buf,
        })
    }

    fn upload_bf16(
        stream: &Arc<CudaStream>,
        experts: &[Vec<&QMatrix>],
        rows: usize,
        cols: usize,
    ) -> Result<Self, CudaError> {
        let stride = rows * cols * 2;
        let mut buf = DeviceBuf::zeros(stream, stride * experts.len())?;
        let mut host = Vec::new();
        for (e, parts) in experts.iter().enumerate() {
            let mut at = e * stride;
            for p in parts {
                let bits = match bf16_bits_in_place(p) {
                    Some(bits) => bits,
                    None => {
                        host.resize(p.rows * p.cols, 0u16);
                        fill_bf16(p, &mut host);
                        &host[..]
                    }
                };
                let bytes: &[u8] = bytemuck::cast_slice(bits);
                buf.write_at(stream, at, bytes)?;
                at += bytes.len();
            }
        }
        Ok(ExpertBank {
            rows,
            cols,
            stride,
            kernel: "moe_gemv_bf16",
            buf,
        })
    }

    /// Bytes on the device.
    pub fn bytes(&self) -> usize {
        self.buf.len()
    }
}

/// The block format every part of every expert takes under `mode`, if they agree on one.
fn common_block_format(experts: &[Vec<&QMatrix>], mode: CudaWeights) -> Option<GgmlType> {
    let mut formats = experts
        .iter()
        .flatten()
        .map(|p| device_block_format(p, mode));
    let first = formats.next()??;
    formats.all(|f| f == Some(first)).then_some(first)
}
