//! Per-step device state: the step's indices (token ids, positions, KV slots, block tables,
//! logit rows) packed into one host vector and uploaded in one copy, and the activation
//! buffers, which only grow.

use std::sync::Arc;

use cudarc::driver::CudaStream;

use super::attention_split::head_blocks;
use super::buffer::DeviceBuf;
use super::gemm::GEMV_MAX_ROWS;
use super::moe::MoeScratch;
use super::CudaError;
use crate::backend::batch::BatchLayout;
use crate::backend::SeqSlice;
use crate::model::ModelConfig;
use crate::sampler::{TokenDraw, MAX_TOP_LOGPROBS};

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
    /// [`PICK_PARAMS`] values per picked row (floats as their bits), after the LM-head rows.
    pub pick_params: usize,
    pub block_tables: usize,
    /// Row width of the block-table matrix (the longest table of the step).
    pub max_blocks: usize,
    /// Rows of single-token (decode) sequences, for the decode attention kernel; when every
    /// sequence has one token it is all of them and the kernel takes no list.
    pub decode_rows: usize,
    pub n_decode: usize,
    /// `(first row, count)` pairs: the prompt runs' tiles, of at most the prefill kernel's
    /// [`PrefillKernel::tile_tokens`](super::prefill::PrefillKernel::tile_tokens) rows.
    pub tiles: usize,
    pub n_tiles: usize,
    /// Token rows the kernels run over: the step's tokens, then any padding.
    pub tokens: usize,
    /// LM-head rows returning logits, then rows returning a picked token (padding included).
    pub full_rows: usize,
    pub picked_rows: usize,
}

/// Values per picked row of `pick_rows` (PICK_PARAMS in pick.cu): temperature, top-k,
/// top-p, min-p, u, top logprobs (−1: no logprobs), grammar mask (−1: none; `mask_rows`).
pub const PICK_PARAMS: usize = 7;

/// Floats per picked row of `pick_rows`' logprobs (LOGPROB_STRIDE in pick.cu): the
/// token's, then (id bits, logprob) of up to [`MAX_TOP_LOGPROBS`] alternatives.
pub const LOGPROB_STRIDE: usize = 1 + 2 * MAX_TOP_LOGPROBS;

/// A picked row's parameters: its draw, and which of the step's masks applies (if any).
pub(super) fn pick_params(d: &TokenDraw, mask: Option<usize>) -> [i32; PICK_PARAMS] {
    let bits = |x: f32| x.to_bits() as i32;
    [
        bits(d.temperature),
        d.top_k.min(i32::MAX as u32) as i32,
        bits(d.top_p),
        bits(d.min_p),
        bits(d.u),
        d.logprobs.map_or(-1, i32::from),
        mask.map_or(-1, |m| m as i32),
    ]
}

/// How a decode step is padded to a captured graph's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Padding {
    /// Token rows of the graph (at least the step's).
    pub tokens: usize,
    /// Block-table row width the graph baked in.
    pub table_width: usize,
    /// A KV block no sequence owns, where padding tokens write their keys and values.
    pub pad_block: usize,
}

impl StepInputs {
    /// Packs the step's indices on the host. With `padding`, dummy tokens (id 0 at position
    /// 0, of one dummy sequence whose table holds only the pad block) fill the step up to
    /// the graph's rows and produce outputs of the step's kind that are never read. Prompt
    /// runs go to the prefill kernel in tiles of up to `prefill_tile` tokens.
    pub fn pack(
        &mut self,
        layout: &BatchLayout,
        batch: &[SeqSlice<'_>],
        block_size: usize,
        padding: Option<Padding>,
        prefill_tile: usize,
    ) {
        let real = layout.n_tokens();
        let n = padding.map_or(real, |p| p.tokens.max(real));
        let pads = n - real;
        let pad_seq = batch.len() as i32;
        let pad_slot = padding.map_or(0, |p| (p.pad_block * block_size) as i32);
        let h = &mut self.host;
        h.clear();
        self.tokens = n;
        self.ids = 0;
        h.extend(layout.token_ids.iter().map(|&t| t as i32));
        h.extend(std::iter::repeat_n(0, pads));
        self.positions = h.len();
        h.extend(layout.positions.iter().map(|&p| p as i32));
        h.extend(std::iter::repeat_n(0, pads));
        self.slots = h.len();
        self.token_seq = self.slots + n;
        h.resize(self.slots + n, pad_slot);
        for (s, (seq, win)) in batch.iter().zip(layout.offsets.windows(2)).enumerate() {
            for t in win[0]..win[1] {
                let pos = layout.positions[t];
                let block = seq.block_table[pos / block_size] as usize;
                h[self.slots + t] = (block * block_size + pos % block_size) as i32;
                h.push(s as i32);
            }
        }
        h.extend(std::iter::repeat_n(pad_seq, pads));
        // Rows through the LM head: full-logit rows first, then the picked ones; padding
        // rows join whichever kind the step has (a padded step has one kind only) and are
        // picked greedily.
        let picks = !layout.picked_rows.is_empty();
        let pad_rows = real..n;
        self.logit_rows = h.len();
        h.extend(layout.logit_rows.iter().map(|&r| r as i32));
        if !picks {
            h.extend(pad_rows.clone().map(|r| r as i32));
        }
        h.extend(layout.picked_rows.iter().map(|&r| r as i32));
        if picks {
            h.extend(pad_rows.map(|r| r as i32));
        }
        self.full_rows = layout.logit_rows.len() + if picks { 0 } else { pads };
        self.picked_rows = layout.picked_rows.len() + if picks { pads } else { 0 };
        self.pick_params = h.len();
        for (draw, &mask) in layout.draws.iter().zip(&layout.masks) {
            h.extend(pick_params(draw, mask));
        }
        let padding_draws = self.picked_rows - layout.draws.len();
        for _ in 0..padding_draws {
            h.extend(pick_params(&TokenDraw::GREEDY, None));
        }
        self.block_tables = h.len();
        // Only the blocks that hold positions up to the step's last token are needed.
        let longest = batch
            .iter()
            .map(|s| (s.start_pos + s.tokens.len()).div_ceil(block_size))
            .max()
            .unwrap_or(1)
            .max(1);
        self.max_blocks = padding.map_or(longest, |p| p.table_width.max(longest));
        for seq in batch {
            let used = (seq.start_pos + seq.tokens.len()).div_ceil(block_size);
            h.extend(seq.block_table[..used].iter().map(|&b| b as i32));
            h.extend(std::iter::repeat_n(0, self.max_blocks - used));
        }
        if pads > 0 {
            h.push(pad_slot / block_size as i32);
            h.extend(std::iter::repeat_n(0, self.max_blocks - 1));
        }
        // Attention: single tokens (and padding) to the decode kernel, runs of prompt tokens
        // in tiles to the prefill kernel.
        self.decode_rows = h.len();
        for win in layout.offsets.windows(2) {
            if win[1] - win[0] == 1 {
                h.push(win[0] as i32);
            }
        }
        h.extend((real..n).map(|r| r as i32));
        self.n_decode = h.len() - self.decode_rows;
        self.tiles = h.len();
        for win in layout.offsets.windows(2) {
            if win[1] - win[0] > 1 {
                for first in (win[0]..win[1]).step_by(prefill_tile) {
                    h.push(first as i32);
                    h.push((win[1] - first).min(prefill_tile) as i32);
                }
            }
        }
        self.n_tiles = (h.len() - self.tiles) / 2;
    }

    /// The decode kernel's row list: none (every row) when the step has no prompt runs.
    pub fn decode_row_list(&self) -> u64 {
        if self.n_tiles == 0 {
            0
        } else {
            self.at(self.decode_rows)
        }
    }

    /// Copies the packed indices to the device. Returns whether the device buffer moved.
    pub fn upload(&mut self, stream: &Arc<CudaStream>) -> Result<bool, CudaError> {
        let len = self.host.len();
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

    /// The packed host indices from `offset`, `len` of them (for tests).
    #[cfg(test)]
    fn host(&self, offset: usize, len: usize) -> &[i32] {
        &self.host[offset..offset + len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::LogitsMode;

    fn config() -> ModelConfig {
        crate::model::config::from_hf_json(&serde_json::json!({
            "model_type": "llama", "num_hidden_layers": 1, "hidden_size": 8,
            "num_attention_heads": 2, "intermediate_size": 16, "vocab_size": 100,
            "max_position_embeddings": 256,
        }))
        .expect("config")
    }

    fn packed(batch: &[SeqSlice<'_>], padding: Option<Padding>) -> StepInputs {
        packed_in_tiles(batch, padding, 8)
    }

    fn packed_in_tiles(
        batch: &[SeqSlice<'_>],
        padding: Option<Padding>,
        prefill_tile: usize,
    ) -> StepInputs {
        let mut layout = BatchLayout::default();
        layout.build(batch, &config(), 4, 100).expect("valid batch");
        let mut inputs = StepInputs::default();
        inputs.pack(&layout, batch, 4, padding, prefill_tile);
        inputs
    }

    #[test]
    fn a_padded_decode_step_fills_the_graph_with_dummy_tokens_in_the_pad_block() {
        let tables = [vec![7u32, 8], vec![3u32], vec![9u32, 10, 11]];
        let tokens = [[11u32], [12], [13]];
        let positions = [5usize, 2, 9];
        let batch: Vec<SeqSlice<'_>> = (0..3)
            .map(|s| SeqSlice {
                adapter: None,
                tokens: &tokens[s],
                start_pos: positions[s],
                block_table: &tables[s],
                logits: LogitsMode::Argmax,
            })
            .collect();
        let pad = Padding {
            tokens: 4,
            table_width: 16,
            pad_block: 100,
        };
        let p = packed(&batch, Some(pad));
        assert_eq!(p.tokens, 4);
        assert_eq!(p.host(p.ids, 4), &[11, 12, 13, 0]);
        assert_eq!(p.host(p.positions, 4), &[5, 2, 9, 0]);
        // Slots: block·4 + position % 4; the padding writes the pad block's first slot.
        assert_eq!(p.host(p.slots, 4), &[8 * 4 + 1, 3 * 4 + 2, 11 * 4 + 1, 400]);
        assert_eq!(p.host(p.token_seq, 4), &[0, 1, 2, 3]);
        assert_eq!((p.full_rows, p.picked_rows), (0, 4));
        assert_eq!(p.host(p.logit_rows, 4), &[0, 1, 2, 3]);
        let greedy = pick_params(&TokenDraw::GREEDY, None);
        let params = p.host(p.pick_params, 4 * PICK_PARAMS);
        assert!(
            params.chunks(PICK_PARAMS).all(|row| row == greedy),
            "padding picks greedily"
        );
        assert_eq!(p.max_blocks, 16, "the graph's table width");
        let tables_packed = p.host(p.block_tables, 4 * 16);
        assert_eq!(&tables_packed[..3], &[7, 8, 0]);
        assert_eq!(&tables_packed[32..35], &[9, 10, 11]);
        assert_eq!(
            &tables_packed[48..50],
            &[100, 0],
            "the padding sequence's table"
        );
    }

    #[test]
    fn an_unpadded_step_packs_only_its_tokens_with_full_rows_first() {
        let tables = [vec![1u32, 2], vec![5u32]];
        let prompt = [4u32, 5, 6, 7, 8];
        let next = [9u32];
        let batch = [
            SeqSlice {
                adapter: None,
                tokens: &prompt,
                start_pos: 0,
                block_table: &tables[0],
                logits: LogitsMode::All,
            },
            SeqSlice {
                adapter: None,
                tokens: &next,
                start_pos: 3,
                block_table: &tables[1],
                logits: LogitsMode::Argmax,
            },
        ];
        let p = packed(&batch, None);
        assert_eq!(p.tokens, 6);
        assert_eq!((p.full_rows, p.picked_rows), (5, 1));
        assert_eq!(p.host(p.logit_rows, 6), &[0, 1, 2, 3, 4, 5]);
        assert_eq!(p.host(p.slots, 6), &[4, 5, 6, 7, 8, 23]);
        assert_eq!(p.max_blocks, 2, "the longest table used");
        assert_eq!(p.host(p.block_tables, 4), &[1, 2, 5, 0]);
        // Row 5 decodes; rows 0..5 are a prompt run, one tile.
        assert_eq!(p.host(p.decode_rows, p.n_decode), &[5]);
        assert_eq!(p.host(p.tiles, 2 * p.n_tiles), &[0, 5]);
    }
    #[test]
    fn prompt_runs_split_into_tiles_and_single_tokens_go_to_decode() {
        let tables = [vec![1u32, 2, 3, 4, 5, 6], vec![7u32]];
        let prompt: Vec<u32> = (0..19).collect();
        let next = [9u32];
        let batch = [
            SeqSlice {
                adapter: None,
                tokens: &next,
                start_pos: 2,
                block_table: &tables[1],
                logits: LogitsMode::Last,
            },
            SeqSlice {
                adapter: None,
                tokens: &prompt,
                start_pos: 3,
                block_table: &tables[0],
                logits: LogitsMode::Last,
            },
        ];
        let p = packed(&batch, None);
        assert_eq!(p.host(p.decode_rows, p.n_decode), &[0]);
        assert_eq!(p.host(p.tiles, 2 * p.n_tiles), &[1, 8, 9, 8, 17, 3]);
        // The tensor-core kernel's tiles are twice as long.
        let p = packed_in_tiles(&batch, None, 16);
        assert_eq!(p.host(p.tiles, 2 * p.n_tiles), &[1, 16, 17, 3]);
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
    /// The token of each picked row.
    pub picked: Option<DeviceBuf<i32>>,
    /// `[picked rows, LOGPROB_STRIDE]` logprobs of the picked rows that want them.
    pub picked_logprobs: Option<DeviceBuf<f32>>,
    /// Split-K attention's partial results `[decode rows, n_heads, splits, 2 + head_dim]` f32.
    pub partial: Option<DeviceBuf<f32>>,
    /// Split-K attention's count of finished split blocks per `[decode row, head group]`
    /// (zero between launches: the last block resets its own).
    pub split_counters: Option<DeviceBuf<i32>>,
    /// The counter of a GEMV whose last block adds and normalises ([`super::gemm::NormAfter`];
    /// zero between launches: that block resets it).
    pub norm_done: Option<DeviceBuf<i32>>,
    /// Each token row's 1/rms from a GEMV that split its sub-block's end with the next
    /// product, which scales its sums by it ([`super::gemm::NormAfter::inv`]).
    pub norm_inv: Option<DeviceBuf<f32>>,
    /// Grammar masks of the step's masked draws `[masks, vocab / 32 rounded up]`, written
    /// after the step's launches (never read by a captured graph).
    pub masks: Option<DeviceBuf<u32>>,
    /// The mixture-of-experts layers' buffers (none for a dense model).
    pub moe: MoeScratch,
}

/// Makes `slot` hold `len` elements; returns whether its address changed.
pub(super) fn grow<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
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
    /// Makes room for `n` tokens, `logit_rows` LM-head rows and the attention of
    /// `decode_rows` split in `attn_splits`; returns whether any buffer moved (which
    /// invalidates captured CUDA graphs).
    pub fn ensure(
        &mut self,
        stream: &Arc<CudaStream>,
        c: &ModelConfig,
        n: usize,
        logit_rows: usize,
        (decode_rows, attn_splits): (usize, usize),
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
            grow(&mut self.picked, stream, rows)?,
            grow(&mut self.picked_logprobs, stream, rows * LOGPROB_STRIDE)?,
            grow(
                &mut self.partial,
                stream,
                if attn_splits > 1 {
                    decode_rows * c.n_heads * attn_splits * (2 + c.head_dim)
                } else {
                    1
                },
            )?,
            grow(
                &mut self.split_counters,
                stream,
                decode_rows.max(1) * head_blocks(c.n_heads, c.n_kv_heads),
            )?,
            grow(&mut self.norm_done, stream, 1)?,
            grow(&mut self.norm_inv, stream, GEMV_MAX_ROWS)?,
            self.moe.ensure(stream, c, n)?,
        ];
        Ok(moved.contains(&true))
    }
}

/// The address of an optional buffer: a scratch buffer `ensure` allocated, or an optional
/// weight; 0 (a null pointer to the kernels) when absent.
pub fn addr<T>(b: &Option<DeviceBuf<T>>) -> u64 {
    b.as_ref().map_or(0, |b| b.ptr())
}
