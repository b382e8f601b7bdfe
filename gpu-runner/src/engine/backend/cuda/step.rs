//! Per-step device state: the step's indices (token ids, positions, KV slots, block tables,
//! logit rows) packed into one host vector and uploaded in one copy, and the activation
//! buffers, which only grow.

use std::sync::Arc;

use cudarc::driver::CudaStream;

use super::buffer::DeviceBuf;
use super::CudaError;
use crate::engine::backend::batch::BatchLayout;
use crate::engine::backend::SeqSlice;
use crate::engine::model::ModelConfig;

/// Offsets (in i32 elements) of each index array inside the uploaded step buffer.
#[derive(Default)]
pub struct StepInputs {
    host: Vec<i32>,
    device: Option<DeviceBuf<i32>>,
    pub ids: usize,
    pub positions: usize,
    pub slots: usize,
    pub token_seq: usize,
    pub logit_rows: usize,
    pub block_tables: usize,
    /// Row width of the block-table matrix (the longest table of the step).
    pub max_blocks: usize,
}

impl StepInputs {
    /// Uploads the step's indices. `table_width` fixes the block-table row width (a CUDA
    /// graph bakes it in); otherwise it is the step's longest table. Returns whether the
    /// device buffer moved.
    pub fn upload(
        &mut self,
        stream: &Arc<CudaStream>,
        layout: &BatchLayout,
        batch: &[SeqSlice<'_>],
        block_size: usize,
        table_width: Option<usize>,
    ) -> Result<bool, CudaError> {
        let n = layout.n_tokens();
        let h = &mut self.host;
        h.clear();
        self.ids = 0;
        h.extend(layout.token_ids.iter().map(|&t| t as i32));
        self.positions = h.len();
        h.extend(layout.positions.iter().map(|&p| p as i32));
        self.slots = h.len();
        self.token_seq = self.slots + n;
        h.resize(self.slots + n, 0);
        for (s, (seq, win)) in batch.iter().zip(layout.offsets.windows(2)).enumerate() {
            for t in win[0]..win[1] {
                let pos = layout.positions[t];
                let block = seq.block_table[pos / block_size] as usize;
                h[self.slots + t] = (block * block_size + pos % block_size) as i32;
                h.push(s as i32);
            }
        }
        // Rows through the LM head: full-logit rows first, then the greedy ones.
        self.logit_rows = h.len();
        h.extend(layout.logit_rows.iter().map(|&r| r as i32));
        h.extend(layout.argmax_rows.iter().map(|&r| r as i32));
        self.block_tables = h.len();
        // Only the blocks that hold positions up to the step's last token are needed.
        let longest = batch
            .iter()
            .map(|s| (s.start_pos + s.tokens.len()).div_ceil(block_size))
            .max()
            .unwrap_or(1)
            .max(1);
        self.max_blocks = table_width.unwrap_or(longest).max(longest);
        for seq in batch {
            let used = (seq.start_pos + seq.tokens.len()).div_ceil(block_size);
            h.extend(seq.block_table[..used].iter().map(|&b| b as i32));
            h.extend(std::iter::repeat_n(0, self.max_blocks - used));
        }
        let len = h.len();
        let moved = match &mut self.device {
            Some(d) => d.ensure(stream, len)?,
            None => {
                self.device = Some(DeviceBuf::zeros(stream, len)?);
                true
            }
        };
        if let Some(d) = &mut self.device {
            d.write(stream, &self.host)?;
        }
        Ok(moved)
    }

    /// Device address of element `offset` of the step buffer.
    pub fn at(&self, offset: usize) -> u64 {
        self.device.as_ref().map_or(0, |d| d.at(offset))
    }
}

/// Activations of one step.
#[derive(Default)]
pub struct Scratch {
    /// Residual stream `[n, hidden]` f32.
    pub x: Option<DeviceBuf<f32>>,
    /// Normalised input of the next GEMM `[n, hidden]` bf16.
    pub xn: Option<DeviceBuf<u16>>,
    /// Fused Q/K/V `[n, q + 2·kv]` f32.
    pub qkv: Option<DeviceBuf<f32>>,
    /// Attention output `[n, q_dim]` bf16.
    pub attn: Option<DeviceBuf<u16>>,
    /// Output projection / down projection `[n, hidden]` f32.
    pub proj: Option<DeviceBuf<f32>>,
    /// Fused gate/up `[n, 2·ffn]` f32.
    pub gate_up: Option<DeviceBuf<f32>>,
    /// Gated activation `[n, ffn]` bf16.
    pub act: Option<DeviceBuf<u16>>,
    /// Normalised rows that produce logits `[r, hidden]` bf16.
    pub head_in: Option<DeviceBuf<u16>>,
    /// `[r, vocab]` f32.
    pub logits: Option<DeviceBuf<f32>>,
    /// Greedy token per argmax row.
    pub argmax: Option<DeviceBuf<i32>>,
    /// Split-K attention's partial results `[n, n_heads, splits, 2 + head_dim]` f32.
    pub partial: Option<DeviceBuf<f32>>,
}

/// Makes `slot` hold `len` elements; returns whether its address changed.
fn grow<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
    slot: &mut Option<DeviceBuf<T>>,
    stream: &Arc<CudaStream>,
    len: usize,
) -> Result<bool, CudaError> {
    match slot {
        Some(b) => b.ensure(stream, len),
        None => {
            *slot = Some(DeviceBuf::zeros(stream, len)?);
            Ok(true)
        }
    }
}

impl Scratch {
    /// Makes room for `n` tokens, `logit_rows` LM-head rows and attention split in
    /// `attn_splits`; returns whether any buffer moved (which invalidates captured CUDA
    /// graphs).
    pub fn ensure(
        &mut self,
        stream: &Arc<CudaStream>,
        c: &ModelConfig,
        n: usize,
        logit_rows: usize,
        attn_splits: usize,
    ) -> Result<bool, CudaError> {
        let qkv = c.q_dim() + 2 * c.kv_dim();
        let rows = logit_rows.max(1);
        let moved = [
            grow(&mut self.x, stream, n * c.hidden)?,
            grow(&mut self.xn, stream, n * c.hidden)?,
            grow(&mut self.qkv, stream, n * qkv)?,
            grow(&mut self.attn, stream, n * c.q_dim())?,
            grow(&mut self.proj, stream, n * c.hidden)?,
            grow(&mut self.gate_up, stream, n * 2 * c.ffn)?,
            grow(&mut self.act, stream, n * c.ffn)?,
            grow(&mut self.head_in, stream, rows * c.hidden)?,
            grow(&mut self.logits, stream, rows * c.vocab_size)?,
            grow(&mut self.argmax, stream, rows)?,
            grow(
                &mut self.partial,
                stream,
                if attn_splits > 1 {
                    n * c.n_heads * attn_splits * (2 + c.head_dim)
                } else {
                    1
                },
            )?,
        ];
        Ok(moved.contains(&true))
    }
}

/// The address of an optional buffer: a scratch buffer `ensure` allocated, or an optional
/// weight; 0 (a null pointer to the kernels) when absent.
pub fn addr<T>(b: &Option<DeviceBuf<T>>) -> u64 {
    b.as_ref().map_or(0, |b| b.ptr())
}
