//! The model's weights on the device, in the layout the step wants: every matrix as bf16
//! rows (GGUF quantized types are dequantized once at load; bf16 safetensors are copied as
//! they are), Q/K/V fused into one `[q + k + v, hidden]` matrix and gate/up into one
//! `[2·ffn, hidden]` matrix so that each is one GEMM, and the small vectors as f32.

use std::sync::Arc;

use cudarc::driver::CudaStream;
use half::bf16;
use rayon::prelude::*;

use super::buffer::DeviceBuf;
use super::CudaError;
use crate::engine::model::{ModelConfig, Weights};
use crate::engine::quant::{GgmlType, QMatrix};

/// A `[rows, cols]` bf16 matrix on the device.
pub struct DeviceMatrix {
    pub buf: DeviceBuf<u16>,
    pub rows: usize,
    pub cols: usize,
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
    ) -> Result<Self, CudaError> {
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
                wqkv: upload_stacked(stream, &[&l.wq, &l.wk, &l.wv])?,
                bqkv,
                q_norm: optional(&l.q_norm)?,
                k_norm: optional(&l.k_norm)?,
                wo: upload_stacked(stream, &[&l.wo])?,
                post_attn_norm: optional(&l.post_attn_norm)?,
                ffn_norm: vector(&l.ffn_norm)?,
                w_gate_up: upload_stacked(stream, &[&l.w_gate, &l.w_up])?,
                w_down: upload_stacked(stream, &[&l.w_down])?,
                post_ffn_norm: optional(&l.post_ffn_norm)?,
            });
        }
        Ok(DeviceWeights {
            token_embd: upload_stacked(stream, &[&w.token_embd])?,
            output_norm: vector(&w.output_norm)?,
            output: w
                .output
                .as_ref()
                .map(|m| upload_stacked(stream, &[m]))
                .transpose()?,
            layers,
        })
    }

    pub fn lm_head(&self) -> &DeviceMatrix {
        self.output.as_ref().unwrap_or(&self.token_embd)
    }

    /// Bytes of every matrix (what a decode step streams, embeddings aside).
    pub fn matrix_bytes(&self) -> usize {
        let m = |d: &DeviceMatrix| d.rows * d.cols * 2;
        let layers: usize = self
            .layers
            .iter()
            .map(|l| m(&l.wqkv) + m(&l.wo) + m(&l.w_gate_up) + m(&l.w_down))
            .sum();
        layers + m(&self.token_embd) + self.output.as_ref().map_or(0, m)
    }
}

/// Uploads matrices with the same column count as one matrix, rows stacked in order.
fn upload_stacked(stream: &Arc<CudaStream>, parts: &[&QMatrix]) -> Result<DeviceMatrix, CudaError> {
    let cols = parts[0].cols;
    if let Some(bad) = parts.iter().find(|p| p.cols != cols) {
        return Err(CudaError::Failure(format!(
            "cannot stack {bad:?} under a matrix of {cols} columns"
        )));
    }
    let rows: usize = parts.iter().map(|p| p.rows).sum();
    let mut host: Vec<u16> = Vec::with_capacity(rows * cols);
    for part in parts {
        append_bf16(part, &mut host);
    }
    Ok(DeviceMatrix {
        buf: DeviceBuf::from_host(stream, &host)?,
        rows,
        cols,
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
