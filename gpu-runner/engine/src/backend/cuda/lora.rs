//! LoRA adapters on the device: each adapter's pairs uploaded once (f16, in one buffer, with
//! a descriptor of their addresses per layer and projection), kept while the device budget
//! allows, least recently used first out; and a step's deltas, every row through its own
//! adapter in two launches per projection (`lora.cu`, Punica's BGMV).
//!
//! A step with adapters runs its products unfused (each product's output is complete in
//! memory before the delta is added: no activation or norm inside a GEMV) and eagerly (no
//! CUDA graph); base-only steps are unchanged.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::CudaStream;
use half::f16;

use super::buffer::DeviceBuf;
use super::forward::{grid, ELEMENT_THREADS};
use super::params::{LoraExpand, LoraShrink};
use super::step::grow;
use super::{CudaBackend, CudaError};
use crate::backend::SeqSlice;
use crate::lora::{LoraAdapter, LoraPair, PairWeights, Target};

/// Projections a descriptor has per layer (LORA_TARGETS in lora.cu).
const TARGETS: usize = 7;
/// Threads of `lora_shrink` (a warp per rank index at a time).
pub(super) const SHRINK_THREADS: u32 = 256;
/// Adapters' bytes kept on the device; past it the least recently used adapters not in the
/// step are dropped (and uploaded again when next asked for).
const DEVICE_BUDGET_BYTES: usize = 1 << 30;

/// One adapter on the device.
struct DeviceAdapter {
    rank: usize,
    /// `[layer][target][A, Bᵀ]` addresses into `weights` (0: not adapted).
    desc: DeviceBuf<u64>,
    weights: DeviceBuf<u16>,
    /// The step that last used it.
    last_used: u64,
}

impl DeviceAdapter {
    fn upload(stream: &Arc<CudaStream>, adapter: &LoraAdapter) -> Result<Self, CudaError> {
        // Every pair's A then Bᵀ as f16 bits, each padded to 16 bytes.
        let mut host: Vec<u16> = Vec::new();
        let mut offsets = vec![None; adapter.layers.len() * TARGETS];
        for (l, layer) in adapter.layers.iter().enumerate() {
            for t in Target::ALL {
                let Some(pair) = layer.get(t) else { continue };
                if pair.rank != adapter.rank {
                    return Err(CudaError::Failure(format!(
                        "adapter `{}`: a pair of rank {} in an adapter of rank {}",
                        adapter.name, pair.rank, adapter.rank
                    )));
                }
                let (a, b) = f16_bits(pair);
                let at_a = host.len();
                host.extend(a);
                host.resize(host.len().next_multiple_of(8), 0);
                let at_b = host.len();
                host.extend(b);
                host.resize(host.len().next_multiple_of(8), 0);
                offsets[l * TARGETS + t as usize] = Some((at_a, at_b));
            }
        }
        let weights = DeviceBuf::from_host(stream, &host)?;
        let addr = |at: usize| weights.ptr() + (at * 2) as u64;
        let desc: Vec<u64> = offsets
            .iter()
            .flat_map(|o| match o {
                Some((a, b)) => [addr(*a), addr(*b)],
                None => [0, 0],
            })
            .collect();
        Ok(DeviceAdapter {
            rank: adapter.rank,
            desc: DeviceBuf::from_host(stream, &desc)?,
            weights,
            last_used: 0,
        })
    }

    fn bytes(&self) -> usize {
        self.weights.len() * 2 + self.desc.len() * 8
    }
}

/// A pair's `A` and `Bᵀ` as f16 bits.
fn f16_bits(pair: &LoraPair) -> (Vec<u16>, Vec<u16>) {
    let bits = |v: &[f32]| v.iter().map(|&x| f16::from_f32(x).to_bits()).collect();
    match &pair.weights {
        PairWeights::F16 { a, b_t } => (
            a.iter().map(|v| v.to_bits()).collect(),
            b_t.iter().map(|v| v.to_bits()).collect(),
        ),
        PairWeights::F32 { a, b_t } => (bits(a), bits(b_t)),
    }
}

/// The adapters on the device, by [`LoraAdapter::id`], and the current step's.
#[derive(Default)]
pub struct DeviceAdapters {
    by_id: HashMap<u64, DeviceAdapter>,
    steps: u64,
    /// Whether the step being run has adapters.
    active: bool,
    /// The widest rank among the step's adapters.
    max_rank: usize,
    /// Each token row's slot (-1: the base), each slot's descriptor and rank.
    row_slot: Option<DeviceBuf<i32>>,
    slot_desc: Option<DeviceBuf<u64>>,
    slot_rank: Option<DeviceBuf<i32>>,
    /// `A·x` of each row, `[rows, max_rank]`.
    t: Option<DeviceBuf<f32>>,
}

impl DeviceAdapters {
    /// Sets up the step of `batch`, whose sequence `s` has rows `offsets[s]..offsets[s + 1]`:
    /// its adapters on the device (uploaded where missing), each row's slot. Returns whether
    /// the step has adapters.
    pub fn prepare(
        &mut self,
        stream: &Arc<CudaStream>,
        batch: &[SeqSlice<'_>],
        offsets: &[usize],
    ) -> Result<bool, CudaError> {
        self.steps += 1;
        self.active = batch.iter().any(|s| s.adapter.is_some());
        if !self.active {
            return Ok(false);
        }
        let mut slots: Vec<u64> = Vec::new();
        let (mut slot_desc, mut slot_rank) = (Vec::new(), Vec::new());
        let rows = offsets.last().copied().unwrap_or(0);
        let mut row_slot = vec![-1i32; rows];
        for (s, seq) in batch.iter().enumerate() {
            let Some(adapter) = seq.adapter else { continue };
            let slot = match slots.iter().position(|&id| id == adapter.id()) {
                Some(slot) => slot,
                None => {
                    let on_device = match self.by_id.entry(adapter.id()) {
                        Entry::Occupied(e) => e.into_mut(),
                        Entry::Vacant(e) => e.insert(DeviceAdapter::upload(stream, adapter)?),
                    };
                    slots.push(adapter.id());
                    slot_desc.push(on_device.desc.ptr());
                    slot_rank.push(on_device.rank as i32);
                    slots.len() - 1
                }
            };
            row_slot[offsets[s]..offsets[s + 1]].fill(slot as i32);
        }
        for id in &slots {
            if let Some(a) = self.by_id.get_mut(id) {
                a.last_used = self.steps;
            }
        }
        self.evict_beyond_budget();
        self.max_rank = slot_rank.iter().copied().max().unwrap_or(0).max(1) as usize;
        grow(&mut self.row_slot, stream, rows)?;
        grow(&mut self.slot_desc, stream, slots.len())?;
        grow(&mut self.slot_rank, stream, slots.len())?;
        grow(&mut self.t, stream, rows * self.max_rank)?;
        let write = |buf: &mut Option<DeviceBuf<i32>>, host: &[i32]| match buf {
            Some(b) => b.write(stream, host),
            None => Ok(()),
        };
        write(&mut self.row_slot, &row_slot)?;
        write(&mut self.slot_rank, &slot_rank)?;
        if let Some(b) = &mut self.slot_desc {
            b.write(stream, &slot_desc)?;
        }
        Ok(true)
    }

    /// Drops the least recently used adapters not in this step while the budget is passed.
    fn evict_beyond_budget(&mut self) {
        let mut total: usize = self.by_id.values().map(DeviceAdapter::bytes).sum();
        while total > DEVICE_BUDGET_BYTES {
            let oldest = self
                .by_id
                .iter()
                .filter(|(_, a)| a.last_used < self.steps)
                .min_by_key(|(_, a)| a.last_used)
                .map(|(&id, _)| id);
            let Some(id) = oldest else { break };
            if let Some(a) = self.by_id.remove(&id) {
                total -= a.bytes();
            }
        }
    }

    /// Whether the step being run has adapters.
    pub fn active(&self) -> bool {
        self.active
    }
}

/// Where a projection's output is and which adapter pairs it takes.
pub(super) struct Delta {
    pub target: Target,
    /// The product's input rows (bf16, `k` wide) and output rows (f32, `ldy` apart, this
    /// target's `out` columns from `col0`).
    pub x: u64,
    pub k: usize,
    pub y: u64,
    pub ldy: usize,
    pub col0: usize,
    pub out: usize,
}

impl CudaBackend {
    /// Adds the step's adapter deltas of `layer`'s projection `d` to its output rows (none in
    /// a step without adapters).
    pub(super) fn lora_delta(&mut self, layer: usize, d: Delta, n: usize) -> Result<(), CudaError> {
        if !self.adapters.active() {
            return Ok(());
        }
        let a = &self.adapters;
        let (row_slot, slot_desc, slot_rank, t) = (
            super::step::addr(&a.row_slot),
            super::step::addr(&a.slot_desc),
            super::step::addr(&a.slot_rank),
            super::step::addr(&a.t),
        );
        let max_rank = a.max_rank as i32;
        let entry = (layer * TARGETS + d.target as usize) as i32;
        launch!(
            self,
            "lora_shrink",
            grid(n, 1, SHRINK_THREADS),
            LoraShrink {
                x: d.x,
                k: d.k as i32,
                row_slot,
                slot_desc,
                slot_rank,
                entry,
                t,
                max_rank,
            }
        )?;
        launch!(
            self,
            "lora_expand",
            grid(d.out.div_ceil(ELEMENT_THREADS as usize), n, ELEMENT_THREADS),
            LoraExpand {
                t,
                row_slot,
                slot_desc,
                slot_rank,
                entry,
                y: d.y,
                ldy: d.ldy as i32,
                col0: d.col0 as i32,
                out: d.out as i32,
                max_rank,
            }
        )
    }
}

impl CudaBackend {
    /// The Q, K and V deltas of `layer` into the fused `[q | k | v]` rows at `qkv`, from the
    /// normalised input `x`.
    pub(super) fn qkv_deltas(
        &mut self,
        layer: usize,
        x: u64,
        qkv: u64,
        n: usize,
    ) -> Result<(), CudaError> {
        let (hidden, q, kv) = (
            self.config.hidden,
            self.config.q_dim(),
            self.config.kv_dim(),
        );
        for (target, col0, out) in [
            (Target::Q, 0, q),
            (Target::K, q, kv),
            (Target::V, q + kv, kv),
        ] {
            let d = Delta {
                target,
                x,
                k: hidden,
                y: qkv,
                ldy: q + 2 * kv,
                col0,
                out,
            };
            self.lora_delta(layer, d, n)?;
        }
        Ok(())
    }

    /// The gate and up deltas of `layer` into the fused `[gate | up]` rows at `gate_up`, from
    /// the normalised input `x`.
    pub(super) fn gate_up_deltas(
        &mut self,
        layer: usize,
        x: u64,
        gate_up: u64,
        n: usize,
    ) -> Result<(), CudaError> {
        let (hidden, f) = (self.config.hidden, self.config.ffn);
        for (target, col0) in [(Target::Gate, 0), (Target::Up, f)] {
            let d = Delta {
                target,
                x,
                k: hidden,
                y: gate_up,
                ldy: 2 * f,
                col0,
                out: f,
            };
            self.lora_delta(layer, d, n)?;
        }
        Ok(())
    }
}
