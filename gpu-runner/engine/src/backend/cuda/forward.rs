//! One step's launches: embedding, then per block attention (fused QKV GEMM, bias/norm/RoPE
//! with the KV store — in a step of decode tokens only, done by the attention blocks for their
//! own heads —, paged attention split over the keys when few tokens would leave the GPU
//! idle (its last split block merging), output GEMM) and feed-forward (fused gate/up GEMM, gated
//! activation — in a decode step written by the gate/up GEMV itself —, down GEMM), with each
//! residual add fused into the next block's RMSNorm — for a
//! single decode token the last block of the output and down GEMVs does both (after the last
//! block, the final norm), with no launch of its own; finally the norm and LM head over the
//! rows that produce logits only.

use cudarc::driver::LaunchConfig;

use super::attention_split::{head_blocks, AttentionSplit};
use super::gemm::{GemvForm, GemvInput, NormAfter};
use super::lora::Delta;
use super::params::{
    AddBiasRows, AddRmsNorm, Embed, GatedAct, MaskRows, PagedAttention, PagedPrefill, PickRows,
    QkvPrepare, RmsNormBf16, Softcap,
};
use super::step::{addr, grow, LOGPROB_STRIDE};
use super::weights::{DeviceFfn, DeviceMatrix};
use super::{rope_style_code, CudaBackend, CudaError};
use crate::backend::cpu::rope::attention_factor;
use crate::backend::step_masks::{wait_for_masks, words_for};
use crate::backend::{SeqSlice, StepMasks, StepOutput};
use crate::lora::Target;
use crate::model::{Activation, ModelConfig};
use crate::sampler::Sampled;

/// Threads per block of the row-wise kernels: one block per token row, so a decode step of
/// one sequence is one block; the widest block keeps its per-thread loop short.
pub(super) const ROW_THREADS: u32 = 1024;
/// Threads per block of elementwise kernels.
pub(super) const ELEMENT_THREADS: u32 = 256;
/// Threads per block of the decode attention kernel (ATTN_WARPS in attention.cu).
pub(super) const ATTN_THREADS: u32 = 256;
/// The attention kernels by head_dim / 32 rounded up to 1, 2, 4 or 8 ([`kernel_variant`]).
const DECODE_KERNELS: [&str; 4] = [
    "paged_attention_1",
    "paged_attention_2",
    "paged_attention_4",
    "paged_attention_8",
];

/// Which instantiation serves `dims` = head_dim / 32 rounded up (at most 8).
pub(super) fn kernel_variant(dims: usize) -> usize {
    dims.clamp(1, 8).next_power_of_two().trailing_zeros() as usize
}

/// Threads per (token, head) block of `qkv_prepare`.
pub(super) const HEAD_THREADS: u32 = 64;
/// The most token rows whose sub-block a GEMV's last block ends ([`NormAfter`]): that one
/// block normalises the rows one after another, where `add_rms_norm` takes a block per row
/// in parallel; past one row the launch it saves costs less than the rows it serialises.
const FUSED_NORM_MAX_ROWS: usize = 1;
/// Elements of a row a thread of that block loads at once (ROW_BATCH in kernels.cu). The
/// block ends the row in one memory round trip per pass where each thread has at most this
/// many of its elements; past that it takes longer than the `add_rms_norm` launch it saves
/// (its 1024 threads hold 4096 elements at one round trip): on an H200 the 8B shape's
/// 256-thread output GEMV took 12 µs more with the norm than without, its `add_rms_norm` 7 µs.
/// (More elements per batch would raise the GEMVs' registers and lower their occupancy.)
const FUSED_NORM_ROW_BATCH: usize = 4;

/// Whether a GEMV block of `threads` ends a `hidden`-wide row in one round trip per pass.
fn last_block_ends_rows_of(hidden: usize, threads: usize) -> bool {
    hidden <= FUSED_NORM_ROW_BATCH * threads
}

/// The scale of `layer`'s attention scores: the model's, times the square of YaRN's
/// attention factor where the layer rotates with the scaled frequencies. The CPU backend
/// multiplies cos and sin by that factor, so every rotated q and k; here q and k are rotated
/// unscaled and each score takes both factors at once. The same scores (a sink, a logit of
/// its own, is scaled on neither backend), and no factor in the RoPE kernels.
pub(super) fn score_scale(c: &ModelConfig, layer: usize) -> f32 {
    let factor = match c.uses_local_rope(layer) {
        true => 1.0,
        false => attention_factor(c.rope_scaling),
    };
    c.attn_scale * factor * factor
}

/// Threads per row of `pick_rows`.
pub(super) const PICK_THREADS: u32 = 1024;

/// `x × y` blocks of `threads` threads, no dynamic shared memory.
pub(super) fn grid(x: usize, y: usize, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (x as u32, y as u32, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Launches `name` on the backend's stream with `params`, its parameter struct
/// ([`super::params`]), timed when profiling ([`super::diag::profile`]).
macro_rules! launch {
    ($self:ident, $name:expr, $cfg:expr, $params:expr $(,)?) => {{
        let started = $self.profiler.start(&$self.ctx, &$self.stream)?;
        // SAFETY: every address comes from a live buffer sized for this step by
        // `Scratch::ensure` / `StepInputs::pack`, and the parameter struct mirrors the
        // kernel's signature in its .cu file (checked by `params`' tests).
        let launched = unsafe { $self.launcher.launch_params($name, $cfg, &$params) };
        let tokens = $self.inputs.tokens;
        launched.and_then(|()| {
            $self.profiler.stop(
                started,
                &$self.stream,
                || format!("{} n={tokens}", $name),
                0,
            )
        })
    }};
}

/// `out = x · wᵀ` for `n` token rows, `x` a [`GemvInput`] (its scale, where it has one,
/// applied to the sums: [`super::gemm::Gemm::matmul_scaled`]), timed when profiling with the
/// weight bytes it streams.
macro_rules! gemm {
    ($self:ident, $what:literal, $x:expr, $w:expr, $n:expr, $out:expr) => {{
        let (w, n, x): (&DeviceMatrix, usize, GemvInput) = ($w, $n, $x);
        let started = $self.profiler.start(&$self.ctx, &$self.stream)?;
        let done = $self.gemm.matmul_scaled(x, w, n, $out);
        let bytes = w.bytes() as u64;
        let scaled = if x.scale != 0 { "+scale" } else { "" };
        done.and_then(|()| {
            $self.profiler.stop(
                started,
                &$self.stream,
                || format!("gemm {}{scaled} {}x{} n={n}", $what, w.rows, w.cols),
                bytes,
            )
        })
    }};
}

impl CudaBackend {
    pub(super) fn embed(&mut self, n: usize) -> Result<(), CudaError> {
        let c = &self.config;
        let scale = c.embedding_scale.unwrap_or(1.0);
        let (table, ids, x) = (
            self.weights.token_embd.bf16_ptr().unwrap_or(0),
            self.inputs.at(self.inputs.ids),
            addr(&self.scratch.x),
        );
        let hidden = c.hidden as i32;
        launch!(
            self,
            "embed",
            grid(n, 1, ROW_THREADS),
            Embed {
                table,
                ids,
                x,
                hidden,
                scale
            }
        )?;
        // The first block's pre-norm; later ones are fused into the residual adds.
        let (w, xn, eps, null) = (
            self.weights.layers[0].attn_norm.ptr(),
            addr(&self.scratch.xn),
            c.rms_eps,
            0u64,
        );
        launch!(
            self,
            "rms_norm_bf16",
            grid(n, 1, ROW_THREADS),
            RmsNormBf16 {
                x,
                rows: null,
                w,
                out: xn,
                hidden,
                eps
            }
        )
    }

    pub(super) fn attention(&mut self, layer: usize, n: usize) -> Result<(), CudaError> {
        let l = &self.weights.layers[layer];
        let s = &self.scratch;
        let (qkv, attn) = (addr(&s.qkv), addr(&s.attn));
        // After the first block: the previous feed-forward's end, maybe split into this.
        let input = self.next_input(layer.checked_sub(1), Product::Down(None), n);
        gemm!(self, "qkv", input, &l.wqkv, n, qkv)?;
        if self.adapters.active() {
            self.qkv_deltas(layer, input.x, qkv, n)?;
        }
        let (c, l, s) = (&self.config, &self.weights.layers[layer], &self.scratch);

        let inv_freq = if c.uses_local_rope(layer) {
            self.inv_freq_local.ptr()
        } else {
            self.inv_freq_global.ptr()
        };
        let (n_heads, n_kv, hd) = (c.n_heads as i32, c.n_kv_heads as i32, c.head_dim as i32);
        let positions = self.inputs.at(self.inputs.positions);
        let kv_dim = c.kv_dim();
        let layer_offset = layer * (self.num_blocks + 1) * self.block_size * kv_dim;
        let (k_cache, v_cache) = (self.k_cache.at(layer_offset), self.v_cache.at(layer_offset));
        let (bias, q_norm, k_norm) = (addr(&l.bqkv), addr(&l.q_norm), addr(&l.k_norm));
        let (slots, eps, style) = (
            self.inputs.at(self.inputs.slots),
            c.rms_eps,
            rope_style_code(c.rope_style),
        );
        // A step of decode tokens only: the attention blocks prepare their own heads.
        let prepare_in_attention = self.options.debug.fused_rope && self.inputs.n_decode == n;
        if !prepare_in_attention {
            launch!(
                self,
                "qkv_prepare",
                grid(n, c.n_heads + 2 * c.n_kv_heads, HEAD_THREADS),
                QkvPrepare {
                    qkv,
                    bias,
                    q_norm,
                    k_norm,
                    inv_freq,
                    positions,
                    slots,
                    k_cache,
                    v_cache,
                    n_heads,
                    n_kv_heads: n_kv,
                    head_dim: hd,
                    eps,
                    style
                }
            )?;
        }

        let qkv_width = (c.q_dim() + 2 * kv_dim) as i32;
        let window = c.layer_window(layer);
        let dims = c.head_dim.div_ceil(32);
        let head_blocks = head_blocks(c.n_heads, c.n_kv_heads) as u32;
        let (block_tables, token_seq) = (
            self.inputs.at(self.inputs.block_tables),
            self.inputs.at(self.inputs.token_seq),
        );
        let (max_blocks, block_size) = (self.inputs.max_blocks as i32, self.block_size as i32);
        let (scale, softcap) = (score_scale(c, layer), c.attn_logit_softcap.unwrap_or(0.0));
        let sinks = addr(&l.sinks);
        let window_arg = window.map_or(0, |w| w as i32);
        if self.inputs.n_tiles > 0 {
            launch!(
                self,
                self.prefill.kernel(c.head_dim),
                grid(
                    self.inputs.n_tiles,
                    head_blocks as usize,
                    self.prefill.threads()
                ),
                PagedPrefill {
                    qkv,
                    qkv_width,
                    k_cache,
                    v_cache,
                    block_tables,
                    max_blocks,
                    token_seq,
                    positions,
                    out: attn,
                    n_heads,
                    n_kv_heads: n_kv,
                    head_dim: hd,
                    block_size,
                    scale,
                    softcap,
                    sinks,
                    window: window_arg,
                    tiles: self.inputs.at(self.inputs.tiles)
                }
            )?;
        }
        let decode = self.inputs.n_decode;
        if decode > 0 {
            let split = self.attention_split(window, decode);
            let (partial, counters) = (addr(&s.partial), addr(&s.split_counters));
            let rows = self.inputs.decode_row_list();
            // Nothing overlaps a plain launch: nothing to prefetch for.
            let prefetch_keys = if self.launcher.early_start() {
                self.gemm.l2_prefetch.attention_keys()
            } else {
                0
            };
            launch!(
                self,
                DECODE_KERNELS[kernel_variant(dims)],
                LaunchConfig {
                    grid_dim: (decode as u32, head_blocks, split.splits as u32),
                    block_dim: (ATTN_THREADS, 1, 1),
                    shared_mem_bytes: 0,
                },
                PagedAttention {
                    qkv,
                    qkv_width,
                    k_cache,
                    v_cache,
                    block_tables,
                    max_blocks,
                    token_seq,
                    positions,
                    out: attn,
                    partial,
                    split_counters: counters,
                    n_heads,
                    n_kv_heads: n_kv,
                    head_dim: hd,
                    block_size,
                    scale,
                    softcap,
                    sinks,
                    window: window_arg,
                    partition: split.partition as i32,
                    rows,
                    bias,
                    q_norm,
                    k_norm,
                    inv_freq: if prepare_in_attention { inv_freq } else { 0 },
                    slots,
                    eps,
                    style,
                    prefetch_keys
                }
            )?;
        }
        let (post, next, xn) = (addr(&l.post_attn_norm), l.ffn_norm.ptr(), addr(&s.xn));
        self.product_then_norm(layer, Product::Output, attn, n, (post, next, xn))
    }

    /// Whether the sub-block that `what` of `layer` ends splits its end with the next
    /// sub-block's first product ([`NormAfter::inv`]; the model's last block: only the adds,
    /// the head normalises): where asked for, the model has no post-norm there (Gemma's
    /// needs the whole output first), and both products are bf16 GEMVs.
    fn splits_end(&self, layer: usize, what: Product, n: usize) -> bool {
        if self.adapters.active() {
            return false; // an adapter's delta is added to the whole product
        }
        let l = &self.weights.layers[layer];
        let (w, post, next) = match what {
            // The bias joins the product before the end; a mixture of experts ends its
            // sub-block with its own launches.
            Product::Output if l.bo.is_some() => return false,
            Product::Output => match l.ffn.gate_up() {
                Some(gate_up) => (&l.wo, &l.post_attn_norm, Some(gate_up)),
                None => return false,
            },
            Product::Down(_) => (
                match l.ffn.down() {
                    Some(down) => down,
                    None => return false,
                },
                &l.post_ffn_norm,
                self.weights.layers.get(layer + 1).map(|next| &next.wqkv),
            ),
        };
        self.options.split_norm
            && post.is_none()
            && self.gemm.fuses_into_gemv(w, n)
            && next.is_none_or(|next| self.gemm.fuses_into_gemv(next, n))
    }

    /// The next sub-block's input after `what` of `layer` (none: the embedding's norm):
    /// `xn`, scaled by the 1/rms the product wrote where it split its end.
    fn next_input(&self, layer: Option<usize>, what: Product, n: usize) -> GemvInput {
        let s = &self.scratch;
        let scale = match layer {
            Some(layer) if self.splits_end(layer, what, n) => addr(&s.norm_inv),
            _ => 0,
        };
        GemvInput {
            x: addr(&s.xn),
            scale,
        }
    }

    /// Whether the product of `n` rows through `w` ends its sub-block in the GEMV's last block
    /// ([`NormAfter`]) rather than with an `add_rms_norm` launch.
    fn norm_in_gemv(&self, w: &DeviceMatrix, n: usize, gated: bool) -> bool {
        let form = if gated {
            GemvForm::GatedInput(0)
        } else {
            GemvForm::Plain
        };
        self.options.debug.fused_norm
            && !self.adapters.active()
            && n <= FUSED_NORM_MAX_ROWS
            && self.gemm.fuses_into_gemv(w, n)
            && last_block_ends_rows_of(self.config.hidden, self.gemm.gemv_threads(w, n, form))
    }

    /// The last product of a sub-block (`what` of `layer`, from `input`) into `proj`, then
    /// the sub-block's end: `proj` added to the residual stream (through the `post` norm
    /// where the model has one) and normalised by `next` into `out` (`xn` for the next
    /// sub-block; after the model's last block the LM head's input, or no norm there). A
    /// decode-sized bf16 GEMV takes the down projection's [gate | up] rows directly, and for
    /// one token row does the end in its last block ([`NormAfter`]); otherwise `gated_act`
    /// and `add_rms_norm` launch around the product.
    fn product_then_norm(
        &mut self,
        layer: usize,
        what: Product,
        input: u64,
        n: usize,
        (post, next, out): (u64, u64, u64),
    ) -> Result<(), CudaError> {
        let c = &self.config;
        let l = &self.weights.layers[layer];
        let s = &self.scratch;
        let (x, proj) = (addr(&s.x), addr(&s.proj));
        // (The output projection's bias is added between the product and the end.)
        let bias = match what {
            Product::Output => addr(&l.bo),
            Product::Down(_) => 0,
        };
        let (w, act) = match what {
            Product::Output => (&l.wo, None),
            Product::Down(act) => match &l.ffn {
                DeviceFfn::Dense { down, .. } => (down, act),
                DeviceFfn::Moe(_) => {
                    return Err(CudaError::Failure("a down product in an MoE layer".into()))
                }
            },
        };
        // (With adapters the down product reads the activation, which its delta needs.)
        let fused = self.gemm.fuses_into_gemv(w, n) && !self.adapters.active();
        let (w_cols, target) = match what {
            Product::Output => (w.cols, Target::O),
            Product::Down(_) => (w.cols, Target::Down),
        };
        let mut input = input;
        if let (false, Some(kind)) = (fused, act) {
            let activated = addr(&s.act);
            let ffn = c.ffn as i32;
            let ffn_blocks = c.ffn.div_ceil(ELEMENT_THREADS as usize);
            launch!(
                self,
                "gated_act",
                grid(n, ffn_blocks, ELEMENT_THREADS),
                GatedAct {
                    gate_up: input,
                    out: activated,
                    ffn,
                    act: kind
                }
            )?;
            input = activated;
        }
        let split = self.splits_end(layer, what, n);
        let norm = if split {
            // (No last block without a next norm: only the adds.)
            Some(NormAfter {
                x,
                next_w: next,
                out,
                done: if next != 0 { addr(&s.norm_done) } else { 0 },
                eps: c.rms_eps,
                inv: addr(&s.norm_inv),
                ..NormAfter::default()
            })
        } else {
            let ends_in_gemv = bias == 0 && self.norm_in_gemv(w, n, act.is_some());
            ends_in_gemv.then(|| NormAfter {
                x,
                post_w: post,
                next_w: next,
                out,
                done: addr(&s.norm_done),
                eps: c.rms_eps,
                inv: 0,
            })
        };
        let started = self.profiler.start(&self.ctx, &self.stream)?;
        if fused {
            self.gemm
                .matmul_fused(GemvInput::plain(input), act, w, n, proj, norm.as_ref())?;
        } else {
            self.gemm.matmul(input, w, n, proj)?;
        }
        let label = || {
            let act = if fused && act.is_some() { "+act" } else { "" };
            let norm = match (split, norm.is_some()) {
                (true, _) => "+split",
                (false, true) => "+norm",
                (false, false) => "",
            };
            format!(
                "gemm {}{act}{norm} {}x{} n={n}",
                what.name(),
                w.rows,
                w.cols
            )
        };
        self.profiler
            .stop(started, &self.stream, label, w.bytes() as u64)?;
        if norm.is_some() {
            return Ok(());
        }
        let hidden = self.config.hidden;
        if bias != 0 {
            launch!(
                self,
                "add_bias_rows",
                grid(
                    hidden.div_ceil(ELEMENT_THREADS as usize),
                    n,
                    ELEMENT_THREADS
                ),
                AddBiasRows {
                    x: proj,
                    bias,
                    width: hidden as i32
                }
            )?;
        }
        let delta = Delta {
            target,
            x: input,
            k: w_cols,
            y: proj,
            ldy: hidden,
            col0: 0,
            out: hidden,
        };
        self.lora_delta(layer, delta, n)?;
        let (hidden, eps) = (self.config.hidden as i32, self.config.rms_eps);
        launch!(
            self,
            "add_rms_norm",
            grid(n, 1, ROW_THREADS),
            AddRmsNorm {
                x,
                delta: proj,
                post_w: post,
                next_w: next,
                out,
                hidden,
                eps
            }
        )
    }

    /// How this step's attention splits the keys of a layer with sliding `window` (the key
    /// range is at most the block-table width, or the window).
    pub(super) fn attention_split(&self, window: Option<usize>, n: usize) -> AttentionSplit {
        if !self.options.debug.split_attention {
            return AttentionSplit::WHOLE;
        }
        let c = &self.config;
        let table_keys = self.inputs.max_blocks * self.block_size;
        let max_keys = window.map_or(table_keys, |w| w.min(table_keys));
        AttentionSplit::plan(
            n,
            c.n_heads,
            c.n_kv_heads,
            max_keys,
            self.sm_count,
            self.options.debug.split_min_keys,
        )
    }

    /// The feed-forward of `layer`; returns whether it also applied the model's final norm
    /// into the LM head's input (after the last layer, when its GEMV ends the sub-block).
    pub(super) fn feed_forward(&mut self, layer: usize, n: usize) -> Result<bool, CudaError> {
        let (w_gate_up, w_down) = match &self.weights.layers[layer].ffn {
            DeviceFfn::Dense { gate_up, down } => (gate_up, down),
            DeviceFfn::Moe(_) => {
                self.moe_feed_forward(layer, n)?;
                return Ok(false);
            }
        };
        let c = &self.config;
        let s = &self.scratch;
        let (xn, gate_up, head_in) = (addr(&s.xn), addr(&s.gate_up), addr(&s.head_in));
        // Attention's end, maybe split into the gate/up product.
        let ffn_in = self.next_input(Some(layer), Product::Output, n);
        let act = match c.activation {
            Activation::Silu => 0i32,
            Activation::GeluTanh => 1,
        };
        // Both products decode GEMVs: the gate/up one writes the activation itself (bf16,
        // into `act`), and the down one reads it as a plain product.
        let glu = self.options.debug.fused_glu
            && !self.adapters.active()
            && self.gemm.fuses_into_gemv(w_gate_up, n)
            && self.gemm.fuses_into_gemv(w_down, n);
        let (input, down) = if glu {
            let activated = addr(&s.act);
            let started = self.profiler.start(&self.ctx, &self.stream)?;
            self.gemm.matmul_glu(ffn_in, w_gate_up, n, activated, act)?;
            let w = w_gate_up;
            let scaled = if ffn_in.scale != 0 { "+scale" } else { "" };
            let label = || format!("gemm gate_up+act{scaled} {}x{} n={n}", w.rows, w.cols);
            self.profiler
                .stop(started, &self.stream, label, w.bytes() as u64)?;
            (activated, Product::Down(None))
        } else {
            gemm!(self, "gate_up", ffn_in, w_gate_up, n, gate_up)?;
            if self.adapters.active() {
                self.gate_up_deltas(layer, ffn_in.x, gate_up, n)?;
            }
            (gate_up, Product::Down(Some(act)))
        };
        let w_down = self.weights.layers[layer]
            .ffn
            .down()
            .ok_or_else(|| CudaError::Failure(format!("layer {layer} has no down projection")))?;
        let l = &self.weights.layers[layer];
        let gated = !glu;
        let post = addr(&l.post_ffn_norm);
        // After the last block: the final norm, straight into the LM head's input where the
        // GEMV ends the sub-block (one token: the head's only row), else none here (the head
        // normalises the rows that produce logits).
        let (next, out, final_norm) = match self.weights.layers.get(layer + 1) {
            Some(next) => (next.attn_norm.ptr(), xn, false),
            // (One row: the head reads x[logit_rows[r]], which is row 0 alone here.)
            None if n == 1
                && !self.splits_end(layer, down, n)
                && self.norm_in_gemv(w_down, n, gated) =>
            {
                (self.weights.output_norm.ptr(), head_in, true)
            }
            None => (0, xn, false),
        };
        self.product_then_norm(layer, down, input, n, (post, next, out))?;
        Ok(final_norm)
    }

    /// Every launch of a step, from the embedding to the LM head, and with `picks` the picks
    /// of the rows that return a token: what a CUDA graph captures (no host copies in here).
    /// A step with grammar masks leaves its picks to [`CudaBackend::mask_and_pick`].
    pub(super) fn launch_step(&mut self, n: usize, picks: bool) -> Result<(), CudaError> {
        self.embed(n)?;
        let mut final_norm = false;
        for layer in 0..self.config.n_layers {
            self.attention(layer, n)?;
            final_norm = self.feed_forward(layer, n)?;
        }
        self.head(final_norm)?;
        if picks {
            self.pick()?;
        }
        Ok(())
    }

    /// Final norm (unless `normed`: the last GEMV wrote the only row's) and LM head over the
    /// rows that need it (logits and picked rows).
    fn head(&mut self, normed: bool) -> Result<(), CudaError> {
        let c = &self.config;
        let (full, picked) = (self.inputs.full_rows, self.inputs.picked_rows);
        let rows = full + picked;
        if rows == 0 {
            return Ok(());
        }
        let s = &self.scratch;
        let (x, head_in, logits) = (addr(&s.x), addr(&s.head_in), addr(&s.logits));
        let row_index = self.inputs.at(self.inputs.logit_rows);
        let hidden = c.hidden as i32;
        if !normed {
            launch!(
                self,
                "rms_norm_bf16",
                grid(rows, 1, ROW_THREADS),
                RmsNormBf16 {
                    x,
                    rows: row_index,
                    w: self.weights.output_norm.ptr(),
                    out: head_in,
                    hidden,
                    eps: c.rms_eps
                }
            )?;
        }
        gemm!(
            self,
            "lm_head",
            GemvInput::plain(head_in),
            self.weights.lm_head(),
            rows,
            logits
        )?;
        let total = rows * c.vocab_size;
        if let Some(cap) = c.final_logit_softcap {
            let blocks = total.div_ceil(ELEMENT_THREADS as usize);
            launch!(
                self,
                "softcap",
                grid(blocks, 1, ELEMENT_THREADS),
                Softcap {
                    x: logits,
                    n: total as i64,
                    cap
                }
            )?;
        }
        Ok(())
    }

    /// The token of each picked row (greedy or drawn), from its logits after the LM head.
    fn pick(&mut self) -> Result<(), CudaError> {
        let (full, picked) = (self.inputs.full_rows, self.inputs.picked_rows);
        if picked == 0 {
            return Ok(());
        }
        let s = &self.scratch;
        let (logits, ids) = (addr(&s.logits), addr(&s.picked));
        launch!(
            self,
            "pick_rows",
            grid(picked, 1, PICK_THREADS),
            PickRows {
                logits,
                first: full as i32,
                vocab: self.config.vocab_size as i32,
                params: self.inputs.at(self.inputs.pick_params),
                ids,
                logprobs: addr(&self.scratch.picked_logprobs)
            }
        )
    }

    /// After a step launched without its picks: waits for the grammar masks of its masked
    /// draws (computed on the host while the GPU ran the step), copies them to the device,
    /// sets the logits they disallow to -inf, and picks.
    pub(super) fn mask_and_pick(
        &mut self,
        batch: &[SeqSlice<'_>],
        masks: &mut dyn StepMasks,
    ) -> Result<(), CudaError> {
        let vocab = self.config.vocab_size;
        let words = words_for(vocab);
        let n = wait_for_masks(batch, masks, words, &mut self.host_masks)
            .map_err(|e| CudaError::Failure(e.to_string()))?;
        if n > 0 {
            // Not captured in any graph: its address may change freely.
            grow(&mut self.scratch.masks, &self.stream, n * words)?;
            if let Some(buf) = &mut self.scratch.masks {
                buf.write(&self.stream, &self.host_masks)?;
            }
            let (full, picked) = (self.inputs.full_rows, self.inputs.picked_rows);
            launch!(
                self,
                "mask_rows",
                grid(picked, 1, ELEMENT_THREADS),
                MaskRows {
                    logits: addr(&self.scratch.logits),
                    first: full as i32,
                    vocab: vocab as i32,
                    params: self.inputs.at(self.inputs.pick_params),
                    masks: addr(&self.scratch.masks),
                    words: words as i32
                }
            )?;
        }
        self.pick()
    }

    /// Copies back the full-logit rows and the picked rows' tokens (waits for the stream).
    pub(super) fn read_outputs(&self) -> Result<StepOutput, CudaError> {
        let full = self.layout.logit_rows.len();
        let picked = self.layout.picked_rows.len();
        let vocab = self.config.vocab_size;
        let mut out = StepOutput::default();
        if picked > 0 {
            let tokens = match &self.scratch.picked {
                Some(buf) => buf.read(&self.stream, picked)?,
                None => return Err(CudaError::Failure("picked-token buffer missing".into())),
            };
            let wants_logprobs = self.layout.draws.iter().any(|d| d.logprobs.is_some());
            let logprobs = match &self.scratch.picked_logprobs {
                Some(buf) if wants_logprobs => buf.read(&self.stream, picked * LOGPROB_STRIDE)?,
                _ => Vec::new(),
            };
            out.picked = tokens
                .iter()
                .zip(&self.layout.draws)
                .enumerate()
                .map(|(r, (&token, draw))| {
                    let row = logprobs.get(r * LOGPROB_STRIDE..(r + 1) * LOGPROB_STRIDE);
                    picked_row(token as u32, draw.logprobs, row, vocab)
                })
                .collect();
        }
        if full > 0 {
            out.logits = match &self.scratch.logits {
                Some(buf) => buf.read(&self.stream, full * vocab)?,
                None => return Err(CudaError::Failure("logits buffer missing".into())),
            };
        }
        Ok(out)
    }
}

/// The product that ends a sub-block ([`CudaBackend::product_then_norm`]).
#[derive(Clone, Copy)]
enum Product {
    /// Attention's output projection.
    Output,
    /// The feed-forward's down projection, of [gate | up] rows activated by 0 = SiLU or
    /// 1 = GELU, or (`None`) of the activation the gate/up GEMV wrote.
    Down(Option<i32>),
}

impl Product {
    fn name(self) -> &'static str {
        match self {
            Product::Output => "o",
            Product::Down(_) => "down",
        }
    }
}

/// A picked row as the sampler reports it: the token, and with `logprobs = Some(n)` its
/// logprob and the `n` best alternatives (of a `vocab`) from the row `pick_rows` wrote.
pub(super) fn picked_row(
    token: u32,
    logprobs: Option<u8>,
    row: Option<&[f32]>,
    vocab: usize,
) -> Sampled {
    let (Some(n), Some(row)) = (logprobs, row) else {
        return Sampled {
            token,
            logprob: None,
            top: Vec::new(),
        };
    };
    let top = row[1..]
        .chunks_exact(2)
        .take(usize::from(n).min(vocab))
        .map(|pair| (pair[0].to_bits(), pair[1]))
        .collect();
    Sampled {
        token,
        logprob: Some(row[0]),
        top,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_models_end_their_sub_blocks_in_the_gemv_and_an_8b_shape_launches_the_norm() {
        // SmolLM2 (576) and Gemma 3 270M (640) with the 256-thread variants; Llama-3 8B (4096)
        // whose output GEMV was 256 threads and down projection 512 on the H200.
        assert!(last_block_ends_rows_of(576, 256));
        assert!(last_block_ends_rows_of(640, 256));
        assert!(!last_block_ends_rows_of(4096, 256));
        assert!(!last_block_ends_rows_of(4096, 512));
        assert!(last_block_ends_rows_of(4096, 1024));
    }
}
