//! Each kernel's parameter list as a named, typed struct: a launch site fills fields by name
//! instead of passing up to 28 values by position, where two `int`s swapped would still
//! match the kernel's parameter sizes. Device addresses are `u64`.
//!
//! Each struct's fields are the kernel's parameters, named and ordered as in its `.cu`
//! signature: `#[repr(C)]` lays them out as the C struct of that list would be, and
//! [`KernelParams::push`] hands them to the launch in that order. A unit test reads every
//! signature from the kernel sources and checks each struct against it, and every launch
//! checks the sizes against the compiled kernel's ([`super::launch::Launcher::launch`]).

use super::launch::KernelArgs;

/// A kernel's by-value arguments, pushed in its signature's order.
pub trait KernelParams {
    /// The function (or macro-built family, `paged_attention_##DIMS`) in the `.cu` sources
    /// whose parameter list this mirrors.
    #[cfg(test)]
    const SIGNATURE: &'static str;
    /// The fields' names, in order (what the unit test compares with the signature).
    #[cfg(test)]
    const FIELDS: &'static [&'static str];

    /// Appends every field to `args`, borrowed until the launch.
    fn push<'a>(&'a self, args: &mut KernelArgs<'a>);
}

/// Declares a kernel's parameter struct and its [`KernelParams`].
macro_rules! kernel_params {
    ($(#[$meta:meta])* $name:ident for $signature:literal { $($field:ident: $ty:ty),+ $(,)? }) => {
        $(#[$meta])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug)]
        pub struct $name {
            $(pub $field: $ty),+
        }

        impl KernelParams for $name {
            #[cfg(test)]
            const SIGNATURE: &'static str = $signature;
            #[cfg(test)]
            const FIELDS: &'static [&'static str] = &[$(stringify!($field)),+];

            fn push<'a>(&'a self, args: &mut KernelArgs<'a>) {
                $(args.arg(&self.$field);)+
            }
        }
    };
}

kernel_params! {
    /// `x[t] = table[ids[t]] · scale`.
    Embed for "embed" { table: u64, ids: u64, x: u64, hidden: i32, scale: f32 }
}

kernel_params! {
    /// `out[r] = bf16(rmsnorm(x[rows[r]]) · w)` (`rows` 0: row r reads x[r]).
    RmsNormBf16 for "rms_norm_bf16" { x: u64, rows: u64, w: u64, out: u64, hidden: i32, eps: f32 }
}

kernel_params! {
    /// Bias, q/k norms, RoPE and the KV store of a step's tokens.
    QkvPrepare for "qkv_prepare" {
        qkv: u64,
        bias: u64,
        q_norm: u64,
        k_norm: u64,
        inv_freq: u64,
        positions: u64,
        slots: u64,
        k_cache: u64,
        v_cache: u64,
        n_heads: i32,
        n_kv_heads: i32,
        head_dim: i32,
        eps: f32,
        style: i32,
    }
}

kernel_params! {
    /// Prompt-run attention over tiles of tokens, on the f32 kernel; `PagedPrefillMma` is
    /// the same list for the tensor-core one.
    PagedPrefill for "paged_prefill_##DIMS" {
        qkv: u64,
        qkv_width: i32,
        k_cache: u64,
        v_cache: u64,
        block_tables: u64,
        max_blocks: i32,
        token_seq: u64,
        positions: u64,
        out: u64,
        n_heads: i32,
        n_kv_heads: i32,
        head_dim: i32,
        block_size: i32,
        scale: f32,
        softcap: f32,
        sinks: u64,
        window: i32,
        tiles: u64,
    }
}

/// The tensor-core prefill's list, the f32 one's ([`PagedPrefill`]).
#[cfg(test)]
const PAGED_PREFILL_MMA: &str = "paged_prefill_mma_##DIMS";

kernel_params! {
    /// Decode attention, one block per (token, head group, split), its last split block
    /// merging; in a decode-only step it also prepares its heads (`inv_freq` non-zero).
    PagedAttention for "paged_attention_##DIMS" {
        qkv: u64,
        qkv_width: i32,
        k_cache: u64,
        v_cache: u64,
        block_tables: u64,
        max_blocks: i32,
        token_seq: u64,
        positions: u64,
        out: u64,
        partial: u64,
        split_counters: u64,
        n_heads: i32,
        n_kv_heads: i32,
        head_dim: i32,
        block_size: i32,
        scale: f32,
        softcap: f32,
        sinks: u64,
        window: i32,
        partition: i32,
        rows: u64,
        bias: u64,
        q_norm: u64,
        k_norm: u64,
        inv_freq: u64,
        slots: u64,
        eps: f32,
        style: i32,
        prefetch_keys: i32,
    }
}

kernel_params! {
    /// `out = act(gate) · up` from `[gate | up]` rows.
    GatedAct for "gated_act" { gate_up: u64, out: u64, ffn: i32, act: i32 }
}

kernel_params! {
    /// A sub-block's end: the residual add, the optional post-norm, and the next pre-norm.
    AddRmsNorm for "add_rms_norm" {
        x: u64,
        delta: u64,
        post_w: u64,
        next_w: u64,
        out: u64,
        hidden: i32,
        eps: f32,
    }
}

kernel_params! {
    /// `x[r] += bias` for each of a product's rows.
    AddBiasRows for "add_bias_rows" { x: u64, bias: u64, width: i32 }
}

kernel_params! {
    /// `x = cap · tanh(x / cap)` over `n` logits.
    Softcap for "softcap" { x: u64, n: i64, cap: f32 }
}

kernel_params! {
    /// Each picked row's token (greedy or drawn) and logprobs.
    PickRows for "pick_rows" {
        logits: u64,
        first: i32,
        vocab: i32,
        params: u64,
        ids: u64,
        logprobs: u64,
    }
}

kernel_params! {
    /// −∞ for the logits a row's grammar mask disallows.
    MaskRows for "mask_rows" {
        logits: u64,
        first: i32,
        vocab: i32,
        params: u64,
        masks: u64,
        words: i32,
    }
}

kernel_params! {
    /// An int8 tensor-core product of one quantized part (`slice_stride` 0: one slice).
    Mmq for "mmq_##name" {
        w: u64,
        x: u64,
        out: u64,
        m: i32,
        k: i32,
        n: i32,
        ldo: i32,
        slice_groups: i32,
        slice_stride: i64,
    }
}

kernel_params! {
    /// The sum of an int8 product's slices, in slice order.
    MmqSum for "mmq_sum" { parts: u64, out: u64, m: i32, n: i32, ldo: i32, slices: i32 }
}

kernel_params! {
    /// A quantized part's blocks expanded to bf16 rows.
    Dequant for "dequant_##name" { w: u64, out: u64, rows: i32, k: i32 }
}

kernel_params! {
    /// A block format's decode product (`gemv_q4_k`, `gemv_q4_k_x8`, …): `out[j·ldo + m] =
    /// x[j] · w[m]`.
    GemvQuantized for "gemv_##name" {
        w: u64,
        x: u64,
        out: u64,
        m: i32,
        k: i32,
        n: i32,
        ldo: i32,
    }
}

kernel_params! {
    /// A bf16 GEMV variant (CUDA-core `gemv_bf16_w8u4…` or tensor-core `gemv_mma_w8s4…`):
    /// the product, the sub-block end it may do (`norm_*`, [`super::gemm::NormAfter`]), its
    /// input's scale, what it asks L2 for, and (`glu` ≥ 0) the activation it writes from
    /// paired gate and up rows.
    GemvBf16 for "gemv_bf16_w##W##u##U##SUFFIX" {
        w: u64,
        x: u64,
        out: u64,
        m: i32,
        k: i32,
        n: i32,
        ldo: i32,
        norm_x: u64,
        norm_post_w: u64,
        norm_next_w: u64,
        norm_out: u64,
        norm_done: u64,
        norm_eps: f32,
        norm_inv: u64,
        x_scale: u64,
        l2_before_wait: u32,
        l2_ahead: u32,
        glu: i32,
    }
}

/// The tensor-core GEMVs' list, the CUDA-core ones' ([`GemvBf16`]).
#[cfg(test)]
const GEMV_MMA: &str = "gemv_mma_w##W##s##S##SUFFIX";

kernel_params! {
    /// A bf16 GEMV of `[gate | up]` rows, activated (`act`) as it stages them.
    GemvBf16Gated for "gemv_bf16_gated_w##W##u##U##SUFFIX" {
        w: u64,
        gate_up: u64,
        out: u64,
        m: i32,
        k: i32,
        n: i32,
        ldo: i32,
        act: i32,
        norm_x: u64,
        norm_post_w: u64,
        norm_next_w: u64,
        norm_out: u64,
        norm_done: u64,
        norm_eps: f32,
        norm_inv: u64,
        x_scale: u64,
        l2_before_wait: u32,
        l2_ahead: u32,
    }
}

kernel_params! {
    /// Each token's experts and weights from its router logits (moe.cu).
    MoeRoute for "moe_route" {
        logits: u64,
        bias: u64,
        ld: i32,
        ids: u64,
        weights: u64,
        shared_scale: u64,
        n: i32,
        n_experts: i32,
        top_k: i32,
        norm_topk: i32,
    }
}

kernel_params! {
    /// The step's choices grouped by expert, and the tiles of the grouped products.
    MoeSort for "moe_sort" {
        ids: u64,
        slots: i32,
        top_k: i32,
        n_experts: i32,
        max_tiles: i32,
        slot_token: u64,
        slot_of: u64,
        tiles: u64,
    }
}

kernel_params! {
    /// Each sorted slot's input row.
    MoeGather for "moe_gather" { x: u64, slot_token: u64, out: u64, hidden: i32 }
}

kernel_params! {
    /// Every tile's product through its expert (`moe_gemv_bf16`, `moe_gemv_q4_k`, …).
    MoeGemv for "moe_gemv_##name" {
        w: u64,
        stride: i64,
        tiles: u64,
        x: u64,
        out: u64,
        m: i32,
        k: i32,
        ldo: i32,
        glu: i32,
    }
}

kernel_params! {
    /// gpt-oss's experts' biased, clamped SwiGLU over every tile's `[gate | up]` rows.
    MoeClampedGlu for "moe_clamped_glu" {
        gate_up: u64,
        tiles: u64,
        bias: u64,
        act: u64,
        ffn: i32,
        alpha: f32,
        limit: f32,
    }
}

kernel_params! {
    /// Each tile's expert's bias added to the tile's rows.
    MoeExpertBias for "moe_expert_bias" { rows: u64, tiles: u64, bias: u64, width: i32 }
}

kernel_params! {
    /// Each token's weighted sum of its experts' outputs, plus a shared expert's.
    MoeCombine for "moe_combine" {
        down: u64,
        slot_of: u64,
        weights: u64,
        shared: u64,
        shared_scale: u64,
        out: u64,
        hidden: i32,
        top_k: i32,
    }
}

kernel_params! {
    /// Each adapter row's `A·x` for one projection (lora.cu).
    LoraShrink for "lora_shrink" {
        x: u64,
        k: i32,
        row_slot: u64,
        slot_desc: u64,
        slot_rank: u64,
        entry: i32,
        t: u64,
        max_rank: i32,
    }
}

kernel_params! {
    /// Each adapter row's `Bᵀ·t` added to its projection's output.
    LoraExpand for "lora_expand" {
        t: u64,
        row_slot: u64,
        slot_desc: u64,
        slot_rank: u64,
        entry: i32,
        y: u64,
        ldy: i32,
        col0: i32,
        out: i32,
        max_rank: i32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::kernels::SOURCE;

    /// The parameter names of `signature`'s first definition in the kernel sources, in order
    /// (macro line continuations and qualifiers dropped, a parameter macro such as
    /// `GEMV_NORM_PARAMS` expanded, compared without case: `M`, `K`).
    fn parameters_of(signature: &str) -> Vec<String> {
        let needle = format!("void {signature}(");
        let at = SOURCE
            .find(&needle)
            .unwrap_or_else(|| panic!("no `{needle}` in the kernel sources"));
        let rest = &SOURCE[at + needle.len()..];
        names_in(&rest[..rest.find(')').expect("a closing parenthesis")])
    }

    /// The names of a C parameter list, expanding the object-like macros it names.
    fn names_in(list: &str) -> Vec<String> {
        list.replace('\\', " ")
            .split(',')
            .flat_map(|p| {
                let p = p.trim();
                match macro_body(p) {
                    Some(body) => names_in(&body),
                    None => {
                        let name = p.split_whitespace().last().unwrap_or_default();
                        vec![name.trim_start_matches('*').to_ascii_lowercase()]
                    }
                }
            })
            .collect()
    }

    /// The body of `#define NAME …` (its continuation lines joined) if `name` is one.
    fn macro_body(name: &str) -> Option<String> {
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        {
            return None;
        }
        let head = format!("#define {name}");
        let at = SOURCE.lines().position(|l| {
            l.strip_prefix(&head)
                .is_some_and(|rest| rest.starts_with([' ', '\\']))
        })?;
        let mut body = String::new();
        for line in SOURCE.lines().skip(at) {
            body.push_str(line.trim_end_matches('\\'));
            body.push(' ');
            if !line.ends_with('\\') {
                break;
            }
        }
        Some(body.trim_start_matches(head.as_str()).to_string())
    }

    fn assert_mirrors<P: KernelParams>(signature: &str) {
        let fields: Vec<String> = P::FIELDS.iter().map(|f| f.to_string()).collect();
        assert_eq!(fields, parameters_of(signature), "{signature}");
    }

    #[test]
    fn every_parameter_struct_names_its_kernels_parameters_in_their_order() {
        fn check<P: KernelParams>() {
            assert_mirrors::<P>(P::SIGNATURE);
        }
        check::<Embed>();
        check::<RmsNormBf16>();
        check::<QkvPrepare>();
        check::<PagedPrefill>();
        assert_mirrors::<PagedPrefill>(PAGED_PREFILL_MMA);
        check::<PagedAttention>();
        check::<GatedAct>();
        check::<AddRmsNorm>();
        check::<AddBiasRows>();
        check::<Softcap>();
        check::<PickRows>();
        check::<MaskRows>();
        check::<Mmq>();
        check::<MmqSum>();
        check::<Dequant>();
        check::<GemvQuantized>();
        assert_mirrors::<GemvQuantized>("gemv_##name##_x8");
        assert_mirrors::<GemvQuantized>("gemv_q8_0");
        assert_mirrors::<GemvQuantized>("gemv_q8_0_x8");
        check::<GemvBf16>();
        assert_mirrors::<GemvBf16>(GEMV_MMA);
        check::<GemvBf16Gated>();
        check::<MoeRoute>();
        check::<MoeSort>();
        check::<MoeGather>();
        check::<MoeGemv>();
        check::<MoeClampedGlu>();
        check::<MoeExpertBias>();
        check::<MoeCombine>();
        check::<LoraShrink>();
        check::<LoraExpand>();
    }

    #[test]
    fn a_struct_pushes_its_fields_at_their_sizes_in_order() {
        let p = Softcap {
            x: 1,
            n: 2,
            cap: 3.0,
        };
        let mut args = KernelArgs::new();
        p.push(&mut args);
        assert_eq!(args.sizes(), [8, 8, 4]);
    }
}
