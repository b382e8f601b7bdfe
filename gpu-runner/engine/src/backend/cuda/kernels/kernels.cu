// Fallow's CUDA kernels, compiled at run time with NVRTC (see kernels.rs).
//
// Conventions: the residual stream and GEMM outputs are f32; matrix inputs (normalised
// activations, attention output, gated FFN activation) and the weights are bf16, stored as
// `unsigned short` so that no toolkit header is needed at run time. Every pointer is a raw
// device address passed by the host; rows are `blockIdx.x`.

typedef unsigned short bf16;

#define NEG_INF (-__int_as_float(0x7f800000))

__device__ __forceinline__ float bf16_to_f32(bf16 h) {
    return __uint_as_float(((unsigned int)h) << 16);
}

// Round to nearest even, NaN kept quiet.
__device__ __forceinline__ bf16 f32_to_bf16(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) {
        return (bf16)((u >> 16) | 0x40);
    }
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16)(u >> 16);
}

// Two values as one register of a bf16 pair (the first in the low half).
__device__ __forceinline__ unsigned int bf16_pair(float x0, float x1) {
    return (unsigned int)f32_to_bf16(x0) | ((unsigned int)f32_to_bf16(x1) << 16);
}

// 8 values as bf16, one 16-byte vector (the first in the lowest half-word).
__device__ __forceinline__ uint4 bf16x8(const float* v) {
    return make_uint4(bf16_pair(v[0], v[1]), bf16_pair(v[2], v[3]), bf16_pair(v[4], v[5]),
                      bf16_pair(v[6], v[7]));
}

// The 8 bf16 of a 16-byte vector as floats (bf16x8's inverse, exact).
__device__ __forceinline__ void bf16x8_as_floats(uint4 v, float* out) {
    unsigned int words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int e = 0; e < 4; e++) {
        out[2 * e] = __uint_as_float(words[e] << 16);
        out[2 * e + 1] = __uint_as_float(words[e] & 0xffff0000u);
    }
}

// 32 values as bf16 at `o` (64-byte aligned) in four 16-byte stores: the threads of a warp
// each writing their own 32 values with two-byte stores would touch 32 sectors per 64 bytes
// stored; these touch 32 per 512.
__device__ __forceinline__ void store_bf16x32(bf16* o, const float* v) {
#pragma unroll
    for (int s = 0; s < 4; s++) ((uint4*)o)[s] = bf16x8(v + 8 * s);
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Programmatic dependent launch (sm_90; kernels.rs's early-start launches): a kernel may begin
// while the one before it on the stream is finishing, so every thread calls this before it
// reads anything an earlier kernel wrote, or writes anything an earlier kernel reads; only
// weights and the step's inputs (which no kernel writes: the host copies the inputs before
// the step's first kernel, and a copy waits for the kernels before it) may be read before
// it, and shared memory written. It waits until the previous grid
// has finished and its writes are visible, then lets the next kernel start launching (its
// blocks take the SMs this grid's last blocks free, and wait in turn). A no-op before sm_90.
// The emulator checks that every thread of every launch calls it.
#ifndef FALLOW_EMULATOR
__device__ __forceinline__ void grid_dependency_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Asks L2 for `bytes` at `p` (both multiples of 16), without waiting: what a kernel does with
// the weights or KV rows it will read, before grid_dependency_sync, so that with an early
// start the memory streams them while the previous kernel (an attention or a norm, which
// leave the memory idle) finishes. A hint: nothing waits for it, nothing is stored, and a
// line an earlier kernel is still writing stays right (L2 is where writes land). sm_90's
// bulk prefetch; nothing before it (no early start there). The emulator checks the range is
// memory.
__device__ __forceinline__ void l2_prefetch(const void* p, unsigned int bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#endif
}
#endif

#define SUM_SLOTS 1024
// Elements a thread loads before it uses any of them (FUSED_NORM_ROW_BATCH in forward.rs).
#define ROW_BATCH 4

// f(i) then use(i, value) for each of this thread's elements i < len (i = threadIdx.x +
// k·blockDim.x), in ascending order, BATCH of them at a time: a batch's loads are all in
// flight before the first is used. Where one block works through a whole row (a GEMV's last
// block ending the sub-block), loads waited for one at a time would make each thread's pass
// as many memory round trips as it has elements.
template <int BATCH = ROW_BATCH, class F, class Use>
__device__ __forceinline__ void row_pass(int len, F f, Use use) {
    for (int i0 = threadIdx.x; i0 < len; i0 += BATCH * blockDim.x) {
        decltype(f(0)) v[BATCH];
#pragma unroll
        for (int u = 0; u < BATCH; u++) {
            int i = i0 + u * blockDim.x;
            if (i < len) v[u] = f(i);
        }
#pragma unroll
        for (int u = 0; u < BATCH; u++) {
            int i = i0 + u * blockDim.x;
            if (i < len) use(i, v[u]);
        }
    }
}

// Sum over the block of f(i) for i < len, in an order set by len alone, whatever the block's
// size (a power of two up to SUM_SLOTS): slot s < SUM_SLOTS adds f(s), f(s + SUM_SLOTS), … in
// turn; each 32 slots are added by warp_sum, and those sums by warp_sum again. So a GEMV's
// last block (of any variant's size) normalises a row to the same bits as the 1024-thread
// row kernels, in which slot s is thread s. Slots and groups past len would only add zeros:
// left out. A slot's terms all fall to one thread (s mod blockDim.x), which adds each as it
// is loaded (row_pass). (Adds are __fadd_rn: never contracted with f's product into an FMA,
// which the compiler might do in one kernel and not in another.)
// (The shared memory is declared outside the template, so that a kernel holds one copy of it
// however many sums it takes.)
struct SumScratch {
    float slot_sum[SUM_SLOTS];
    float group_sum[32];
    float total;
};

__device__ __forceinline__ SumScratch& sum_scratch() {
    __shared__ SumScratch scratch;
    return scratch;
}

__device__ __forceinline__ float ordered_sum_of_slots(int groups);

// The slots' groups for a sum over len elements; slots no element reaches (len under
// SUM_SLOTS, not a multiple of 32) set to 0.
__device__ __forceinline__ int sum_groups(int len) {
    int groups = (min(len, SUM_SLOTS) + 31) / 32;
    float* slot_sum = sum_scratch().slot_sum;
    for (int s = len + threadIdx.x; s < groups * 32; s += blockDim.x) slot_sum[s] = 0.0f;
    return groups;
}

// Term v of element i into its slot (the slot's first term: 0 + v, as a running sum from 0).
__device__ __forceinline__ void slot_add(int i, float v) {
    float* slot = &sum_scratch().slot_sum[i & (SUM_SLOTS - 1)];
    *slot = __fadd_rn(i < SUM_SLOTS ? 0.0f : *slot, v);
}

template <class F>
__device__ float ordered_sum(int len, F f) {
    int groups = sum_groups(len);
    row_pass(len, f, [](int i, float v) { slot_add(i, v); });
    return ordered_sum_of_slots(groups);
}

// The second half of ordered_sum: the first `groups` × 32 slots, summed.
__device__ __forceinline__ float ordered_sum_of_slots(int groups) {
    SumScratch& sc = sum_scratch();
    float *slot_sum = sc.slot_sum, *group_sum = sc.group_sum;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    __syncthreads();
    for (int g = warp; g < groups; g += warps) {
        float v = warp_sum(slot_sum[g * 32 + lane]);
        if (lane == 0) group_sum[g] = v;
    }
    __syncthreads();
    if (warp == 0) {
        float v = warp_sum(lane < groups ? group_sum[lane] : 0.0f);
        if (lane == 0) sc.total = v;
    }
    __syncthreads();
    float r = sc.total;
    __syncthreads();
    return r;
}

// x[t] = table[ids[t]] * scale (Gemma scales its embeddings by sqrt(hidden)).
extern "C" __global__ void embed(const bf16* table, const unsigned int* ids, float* x,
                                 int hidden, float scale) {
    grid_dependency_sync();
    const bf16* row = table + (size_t)ids[blockIdx.x] * hidden;
    float* out = x + (size_t)blockIdx.x * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) out[i] = bf16_to_f32(row[i]) * scale;
}

// out[r] = bf16(rmsnorm(x[rows[r]]) * w): the pre-norm of a block, or (with `rows`) the final
// norm of the rows that produce logits. `rows` may be null (row r reads x[r]).
extern "C" __global__ void rms_norm_bf16(const float* x, const int* rows, const float* w,
                                         bf16* out, int hidden, float eps) {
    grid_dependency_sync();
    int src = rows ? rows[blockIdx.x] : (int)blockIdx.x;
    const float* xr = x + (size_t)src * hidden;
    float inv = rsqrtf(ordered_sum(hidden, [&](int i) { return xr[i] * xr[i]; }) / hidden + eps);
    bf16* o = out + (size_t)blockIdx.x * hidden;
    row_pass(hidden, [&](int i) { return xr[i] * inv * w[i]; },
             [&](int i, float v) { o[i] = f32_to_bf16(v); });
}

// The end of a sub-block and the start of the next, for one row (any block size):
// x += post_w ? rmsnorm(delta) * post_w : delta;  then, unless next_w is null (the last
// block), out = bf16(rmsnorm(x) * next_w). `delta` is read past L1: in a GEMV's last block
// it holds the other blocks' outputs. The new x's sum of squares is taken as it is written.
// With `inv` (a split end's last block, see GemvNorm) x already holds the sum (the other
// blocks' rows: read past L1 too) and only 1/rms is written, to *inv. (One function for
// both: a second copy of the sum in the GEMVs' tails raised their registers.)
__device__ void add_rms_norm_row(float* __restrict__ x, const volatile float* delta,
                                 const float* post_w, const float* next_w, bf16* __restrict__ out,
                                 int hidden, float eps, float* inv = nullptr) {
    float post_inv = 1.0f;
    if (post_w) {
        float ss = ordered_sum(hidden, [&](int i) { return delta[i] * delta[i]; });
        post_inv = rsqrtf(ss / hidden + eps);
    }
    int groups = sum_groups(hidden);
    const volatile float* summed = x;
    // (__fadd_rn: the same rounding in the add_rms_norm kernel and in a GEMV's last block.)
    row_pass(
        hidden,
        [&](int i) {
            if (inv) return summed[i];
            float d = delta[i];
            return __fadd_rn(x[i], post_w ? d * post_inv * post_w[i] : d);
        },
        [&](int i, float v) {
            if (!inv) x[i] = v;
            if (next_w) slot_add(i, v * v);
        });
    if (!next_w) return;
    float r = rsqrtf(ordered_sum_of_slots(groups) / hidden + eps);
    if (inv) {
        if (threadIdx.x == 0) *inv = r;
        return;
    }
    row_pass(hidden, [&](int i) { return x[i] * r * next_w[i]; },
             [&](int i, float v) { out[i] = f32_to_bf16(v); });
}

// add_rms_norm_row for each row (one block per row), after a product that was not a GEMV
// with the norm fused (see gemv_t's `done`).
extern "C" __global__ void add_rms_norm(float* __restrict__ x, const float* __restrict__ delta,
                                        const float* post_w, const float* next_w,
                                        bf16* __restrict__ out, int hidden, float eps) {
    grid_dependency_sync();
    size_t row = (size_t)blockIdx.x * hidden;
    add_rms_norm_row(x + row, delta + row, post_w, next_w, out + row, hidden, eps);
}

// RoPE: pair i of a head is elements (a, b) = (2i, 2i + 1) (style 0, interleaved) or
// (i, i + half) (style 1, NEOX), rotated by pos · inv_freq[i]. qkv_prepare and the decode
// attention's own preparation (attention.cu) share these, so both give the same bits.
struct RopePair {
    int i, a, b;
};

// The pair element d of a head belongs to.
__device__ __forceinline__ RopePair rope_pair(int d, int half, int style) {
    RopePair p;
    p.i = style == 0 ? d >> 1 : (d < half ? d : d - half);
    p.a = style == 0 ? 2 * p.i : p.i;
    p.b = style == 0 ? 2 * p.i + 1 : p.i + half;
    return p;
}

// cos and sin of the angle, computed in double (positions in the hundreds of thousands
// times frequencies near 1 lose the angle's low bits in f32).
__device__ __forceinline__ void rope_angle(int pos, double inv_freq, float* c, float* s) {
    double sd, cd;
    sincos((double)pos * inv_freq, &sd, &cd);
    *c = (float)cd;
    *s = (float)sd;
}

// The rotation, with its FMA written out: the compiler's own contraction of `x0·c - x1·s`
// could differ between the two kernels that compute it.
__device__ __forceinline__ float rope_first(float x0, float x1, float c, float s) {
    return __fmaf_rn(x0, c, -__fmul_rn(x1, s));
}

__device__ __forceinline__ float rope_second(float x0, float x1, float c, float s) {
    return __fmaf_rn(x0, s, __fmul_rn(x1, c));
}

// Per (token, head) of the fused QKV rows: bias, per-head RMSNorm (Q and K heads) and RoPE
// (Q and K heads), then each K and V head is written to the token's KV slot (the attention
// reads the current tokens' keys from the cache, like the cached ones). Heads are ordered Q
// heads, then K heads, then V heads. inv_freq: head_dim/2 doubles; style 0 = interleaved
// pairs, 1 = NEOX halves.
extern "C" __global__ void qkv_prepare(float* qkv, const float* bias, const float* q_norm,
                                       const float* k_norm, const double* inv_freq,
                                       const int* positions, const int* slots, bf16* k_cache,
                                       bf16* v_cache, int n_heads, int n_kv_heads, int head_dim,
                                       float eps, int style) {
    grid_dependency_sync();
    int t = blockIdx.x, h = blockIdx.y;
    int width = (n_heads + 2 * n_kv_heads) * head_dim;
    float* v = qkv + (size_t)t * width + (size_t)h * head_dim;
    size_t slot = (size_t)slots[t] * n_kv_heads * head_dim;
    if (bias) {
        for (int i = threadIdx.x; i < head_dim; i += blockDim.x) v[i] += bias[h * head_dim + i];
        __syncthreads();
    }
    if (h >= n_heads + n_kv_heads) {  // V heads: bias only
        bf16* dst = v_cache + slot + (size_t)(h - n_heads - n_kv_heads) * head_dim;
        for (int i = threadIdx.x; i < head_dim; i += blockDim.x) dst[i] = f32_to_bf16(v[i]);
        return;
    }
    const float* norm = h < n_heads ? q_norm : k_norm;
    if (norm) {
        float ss = ordered_sum(head_dim, [&](int i) { return v[i] * v[i]; });
        float inv = rsqrtf(ss / head_dim + eps);
        for (int i = threadIdx.x; i < head_dim; i += blockDim.x) v[i] = v[i] * inv * norm[i];
        __syncthreads();
    }
    int half = head_dim / 2;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        RopePair p = rope_pair(style == 0 ? 2 * i : i, half, style);  // (p.i == i)
        float c, s;
        rope_angle(positions[t], inv_freq[p.i], &c, &s);
        float x0 = v[p.a], x1 = v[p.b];
        v[p.a] = rope_first(x0, x1, c, s);
        v[p.b] = rope_second(x0, x1, c, s);
    }
    if (h < n_heads) return;
    __syncthreads();  // RoPE moved values between threads' elements
    bf16* dst = k_cache + slot + (size_t)(h - n_heads) * head_dim;
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) dst[i] = f32_to_bf16(v[i]);
}

// out = bf16(act(gate) * up) over the fused [gate | up] rows; act 0 = SiLU, 1 = GELU (tanh).
// Grid (tokens, ffn / blockDim): one element per thread, so a single token still spreads
// over the whole GPU.
__device__ __forceinline__ float gated_f32(float gate, float up, int act) {
    float a;
    if (act == 0) {
        a = gate / (1.0f + __expf(-gate));
    } else {
        a = 0.5f * gate * (1.0f + tanhf(0.7978845608f * (gate + 0.044715f * gate * gate * gate)));
    }
    return a * up;
}

__device__ __forceinline__ bf16 gated(float gate, float up, int act) {
    return f32_to_bf16(gated_f32(gate, up, act));
}

extern "C" __global__ void gated_act(const float* __restrict__ gate_up, bf16* __restrict__ out,
                                     int ffn, int act) {
    grid_dependency_sync();
    int i = blockIdx.y * blockDim.x + threadIdx.x;
    if (i >= ffn) return;
    const float* g = gate_up + (size_t)blockIdx.x * 2 * ffn;
    out[(size_t)blockIdx.x * ffn + i] = gated(g[i], g[ffn + i], act);
}

// x[r] += bias for each row r of a product (`width` wide): the attention output projection's
// bias (gpt-oss), before the sub-block's end. Grid (element blocks, rows).
extern "C" __global__ void add_bias_rows(float* __restrict__ x, const float* __restrict__ bias,
                                         int width) {
    grid_dependency_sync();
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < width) x[(size_t)blockIdx.y * width + i] += bias[i];
}

// x = cap * tanh(x / cap) (Gemma 2's final logit soft-capping).
extern "C" __global__ void softcap(float* x, long long n, float cap) {
    grid_dependency_sync();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = cap * tanhf(x[i] / cap);
}

#define GEMV_MAX_ROWS 8
#define GEMV_WARPS 8  // columns per block of the quantized GEMVs (quant.cu)

// out[j·ldo + m] = sum_k x[j, k] * w[m, k] for j < n <= GEMV_MAX_ROWS: the decode-sized matrix
// product, bound by reading W once. One warp per output column m, WARPS per block; x is
// staged in shared memory (read from L2 once per block, not once per warp and row), and
// each lane keeps UNROLL independent 16-byte loads of W in flight: a tile is 32 lanes ×
// UNROLL chunks of ROWS::PER_CHUNK weights (ROWS: how a weight row is stored, Bf16Rows
// here, each block format's row type in quant.cu). Lane l adds chunks l, l + 32, l + 64, … of K in ascending
// order whatever the variant, so every instantiation gives the same bits; which is fastest
// depends on the GPU and the shape (gemv_tune.rs times them at load). K % 8 == 0.
//
// PREFETCH: the next tile's W is requested before the current one is summed, so a warp
// keeps loads in flight while it computes (twice the registers for W). RESIDENT: all of x
// is staged once, in dynamic shared memory (n·K·2 bytes, at most GEMV_RESIDENT_BYTES: the
// 48 KiB a block gets without opting in to more, less the fused norm's static ~4 KiB),
// instead of tile by tile: no block-wide barrier inside the loop, each warp streams its
// rows of W at its own pace (always with PREFETCH).
//
// GATED: x is not bf16 rows but the fused [gate | up] f32 rows of the feed-forward (2·K wide),
// and each staged element is gated_act's bf16(act(gate)·up), computed here: the down
// projection of a decode step without the activation's own launch (same values, same sums).
//
// With `norm.done` (a counter at 0), the product ends its sub-block: the last block to
// finish adds the output rows to the residual stream and normalises them for the next
// sub-block (add_rms_norm_row, same bits as the add_rms_norm launch it replaces), and sets
// the counter back to 0. One launch fewer, and the next product's early start overlaps this
// one's tail instead of waiting behind a one-block kernel.
//
// With `norm.inv` the end is split with the next product instead (no post-norm): every
// block adds its own output rows to the residual stream (add_rms_norm's add, same bits) and
// writes them times the next norm's weight, bf16(x·next_w), as the next sub-block's input,
// not yet normalised; the last block (counting on `done`) only sums the new rows' squares
// (add_rms_norm's order, so the same 1/rms) into inv[j]. The next product, given those as
// `x_scale`, multiplies each token row's sums by them: rmsnorm folded into its output
// (inv·Σ w·bf16(x·next_w), where the unsplit end rounds x·inv·next_w to bf16: within bf16
// rounding of it, not its bits). No block walks whole rows: the last one's tail is one read
// of each row, where the whole end in the last block is three passes (too slow for an 8B's
// 4096-wide rows, see FUSED_NORM_ROW_BATCH in forward.rs). Without next_w (the model's last
// block) only the add.
//
// `x_scale` (any product, null for none): each token row's sums times x_scale[j] — the
// previous product's split end.
struct GemvNorm {
    float* x;             // the residual stream, n rows of M
    const float* post_w;  // Gemma's norm of the sub-block's output, or null
    const float* next_w;  // the next sub-block's norm, or null (the model's last block)
    bf16* out;            // the next sub-block's input, n rows of M
    int* done;            // null: no norm here
    float eps;
    float* inv;             // a split end: each row's 1/rms, n of them; null: not split
    const float* x_scale;   // this product's input scale per token row, or null
};

// Each token row's input scale (GemvNorm::x_scale), 1 without one (x · 1 is x: the same
// bits as no scale), into `scale` (shared, GEMV_MAX_ROWS): called by the whole block after
// the grid dependency wait (the previous kernel wrote them), read after a barrier.
__device__ __forceinline__ void gemv_load_scale(float* scale, const GemvNorm& norm, int n) {
    if (threadIdx.x < GEMV_MAX_ROWS)
        scale[threadIdx.x] =
            norm.x_scale && (int)threadIdx.x < n ? norm.x_scale[threadIdx.x] : 1.0f;
}

// Output m of token row j: out[j·ldo + m] = s, or with a split end (norm.inv, see
// GemvNorm) s added to the residual stream and, before a next norm, written times its
// weight as the next input.
__device__ __forceinline__ void gemv_store(const GemvNorm& norm, float* out, int ldo, int M,
                                           int j, int m, float s) {
    if (!norm.inv) {
        out[(size_t)j * ldo + m] = s;
        return;
    }
    size_t at = (size_t)j * M + m;
    float v = __fadd_rn(norm.x[at], s);
    norm.x[at] = v;
    if (norm.next_w) norm.out[at] = f32_to_bf16(v * norm.next_w[m]);
}

// Whether this block is the last of the `blocks` blocks counting on `counter` to finish, once
// every other one's writes are visible to it (each thread's made visible before the block
// counts itself); the last sets the counter back to 0 for the next launch. The GEMV's fused
// norm counts the whole grid, the split attention's merge a token's split blocks.
__device__ __forceinline__ bool last_block(int* counter, int blocks) {
    __shared__ int last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(counter, 1) == blocks - 1;
        if (last) *counter = 0;
    }
    __syncthreads();
    if (last) __threadfence();
    return last;
}

// With `norm` (its counter set), the GEMV's last block to finish ends the sub-block: the n
// output rows added to the residual stream and normalised (add_rms_norm's arithmetic). Every
// thread of the block calls it.
__device__ __forceinline__ void gemv_end_norm(const GemvNorm& norm, const float* out, int ldo,
                                              int M, int n) {
    // A split end (norm.inv): every block added its rows (gemv_store), and the last sums the
    // squares, for a next norm.
    if (norm.inv && !norm.next_w) return;
    if (norm.done && last_block(norm.done, (int)gridDim.x)) {
        for (int j = 0; j < n; j++)
            add_rms_norm_row(norm.x + (size_t)j * M, out + (size_t)j * ldo, norm.post_w,
                             norm.next_w, norm.out + (size_t)j * M, M, norm.eps,
                             norm.inv ? norm.inv + j : nullptr);
    }
}

#define GEMV_RESIDENT_BYTES (40 * 1024)

// This lane's UNROLL chunks (of `chunks`) of the tile of a weight row that starts at chunk
// `first`, as ROWS loads them (ROWS::Raw: the chunk's bytes and whatever side data it needs,
// e.g. its scale, requested with them so that no load waits inside the sums).
template <int UNROLL, class ROWS>
__device__ __forceinline__ void gemv_load_w(typename ROWS::Raw* wv, const ROWS& rows, int first,
                                            int lane, int chunks) {
#pragma unroll
    for (int u = 0; u < UNROLL; u++) {
        int c = lane + 32 * u;
        if (c < chunks) wv[u] = rows.load(first + c);
    }
}

// Each of the n rows' sum over the warp's lanes times the row's input scale, stored by
// lane 0 with store(j, sum) (when `keep`).
template <class Store>
__device__ __forceinline__ void gemv_write(const float* acc, const float* scale, bool keep, int n,
                                           Store store) {
#pragma unroll
    for (int j = 0; j < GEMV_MAX_ROWS; j++) {
        if (j < n && keep) {
            float s = warp_sum(acc[j]) * scale[j];
            if ((threadIdx.x & 31) == 0) store(j, s);
        }
    }
}

// Stages chunks [k0 / 8, k0 / 8 + chunks) of the n rows of x into xs (row j at j·stride),
// by the whole block, each thread's chunks BATCH at a time (row_pass: x comes from L2, and a
// resident x is dozens of chunks per thread, each a round trip if waited for alone; a tile
// is a chunk or two per thread, where batches only hold registers through the loop).
// GATED: the chunk is 8 gates and their 8 ups, each four in one 16-byte load.
template <bool GATED, int BATCH>
__device__ __forceinline__ void gemv_stage_x(uint4* xs, int stride, const void* __restrict__ xin,
                                             int K, int k0, int chunks, int n, int act) {
    row_pass<BATCH>(
        n * chunks,
        [&](int i) {
            int j = i / chunks, c = i - j * chunks;
            if constexpr (GATED) {
                const float* g = (const float*)xin + (size_t)j * 2 * K + k0 + 8 * c;
                float4 gate[2] = {((const float4*)g)[0], ((const float4*)g)[1]};
                float4 up[2] = {((const float4*)(g + K))[0], ((const float4*)(g + K))[1]};
                float v[8];
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    v[4 * h] = gated_f32(gate[h].x, up[h].x, act);
                    v[4 * h + 1] = gated_f32(gate[h].y, up[h].y, act);
                    v[4 * h + 2] = gated_f32(gate[h].z, up[h].z, act);
                    v[4 * h + 3] = gated_f32(gate[h].w, up[h].w, act);
                }
                return bf16x8(v);
            } else {
                return __ldg((const uint4*)((const bf16*)xin + (size_t)j * K + k0) + c);
            }
        },
        [&](int i, uint4 v) {
            int j = i / chunks;
            xs[j * stride + i - j * chunks] = v;
        });
}

// Whether a row type's dot products take x staged as int8 (gemv_stage_x8) rather than bf16:
// its `X_INT8` member, false where it has none.
template <class ROWS, class = void>
struct StagesInt8 {
    static constexpr bool value = false;
};
template <class ROWS>
struct StagesInt8<ROWS, decltype((void)ROWS::X_INT8)> {
    static constexpr bool value = ROWS::X_INT8;
};

// x staged for int8 dot products, per token row of a tile of `tile` elements: the values as
// int8 (byte e: element e), then each group of 32's scale (f32, at byte `tile`), then each
// half-group of 16's sum of x (f32, at byte tile + tile / 8): 2816 bytes for a 2048 tile,
// within the 4096 its bf16 staging takes.
#define GEMV_X8_SCALES(tile) (tile)
#define GEMV_X8_SUMS(tile) ((tile) + (tile) / 8)

// Stages elements [k0, k0 + elems) of the n bf16 rows of x for int8 dot products, a thread per
// group of 32: q = round-to-nearest(x · 127 / max|x|), so that x ≈ scale · q with scale =
// max|x| / 127 (the group's largest value exact, the others within scale / 2); and the sums
// of the bf16 values (exact, not of q) for the weights' offsets (Σ (d·q + m)·x = d·Σ q·x +
// m·Σ x). The dot then multiplies 4 pairs of bytes per instruction (__dp4a) instead of
// converting every weight and every x to a float.
__device__ __forceinline__ void gemv_stage_x8(uint4* xs, int stride, const bf16* __restrict__ x,
                                              int K, int k0, int elems, int n, int tile) {
    int groups = elems / 32;
    for (int i = threadIdx.x; i < n * groups; i += blockDim.x) {
        int j = i / groups, g = i - j * groups;
        const uint4* src = (const uint4*)(x + (size_t)j * K + k0 + 32 * g);
        float v[32];
#pragma unroll
        for (int p = 0; p < 4; p++) bf16x8_as_floats(__ldg(src + p), v + 8 * p);
        float amax = 0.0f, low = 0.0f, high = 0.0f;
#pragma unroll
        for (int e = 0; e < 32; e++) amax = fmaxf(amax, fabsf(v[e]));
#pragma unroll
        for (int e = 0; e < 16; e++) low += v[e];
#pragma unroll
        for (int e = 16; e < 32; e++) high += v[e];
        float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        unsigned int packed[8];
#pragma unroll
        for (int w = 0; w < 8; w++) {
            unsigned int word = 0;
#pragma unroll
            for (int b = 0; b < 4; b++) {
                // Rounded to nearest by the add of 1.5 · 2^23 (one FMA, no conversion unit):
                // |v · inv| ≤ 127.
                int q = __float_as_int(__fmaf_rn(v[4 * w + b], inv, 12582912.0f)) - 0x4B400000;
                word |= ((unsigned int)q & 0xFFu) << (8 * b);
            }
            packed[w] = word;
        }
        unsigned char* row = (unsigned char*)(xs + (size_t)j * stride);
        ((uint4*)(row + 32 * g))[0] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
        ((uint4*)(row + 32 * g))[1] = make_uint4(packed[4], packed[5], packed[6], packed[7]);
        ((float*)(row + GEMV_X8_SCALES(tile)))[g] = amax / 127.0f;
        ((float*)(row + GEMV_X8_SUMS(tile)))[2 * g] = low;
        ((float*)(row + GEMV_X8_SUMS(tile)))[2 * g + 1] = high;
    }
}

#ifdef FALLOW_EMULATOR
#define GEMV_DYNAMIC_X(name) uint4* name = (uint4*)emu::dynamic_shared()
#else
#define GEMV_DYNAMIC_X(name) extern __shared__ uint4 name[]
#endif

// s plus the products of 8 weights with the 8 bf16 of xv, added in order.
__device__ __forceinline__ float dot_bf16x8(const float* w, uint4 xv, float s) {
    unsigned int xw[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
    for (int e = 0; e < 4; e++) {
        s += w[2 * e] * __uint_as_float(xw[e] << 16);
        s += w[2 * e + 1] * __uint_as_float(xw[e] & 0xffff0000u);
    }
    return s;
}

// A bf16 weight row for gemv_t: 8 weights per 16-byte chunk.
//
// What gemv_t asks of a row type: PER_CHUNK weights per chunk (a multiple of 8), chunk c
// holding weights [c·PER_CHUNK, (c + 1)·PER_CHUNK) of the row in some order; CHUNK_BYTES of
// the row's bytes per chunk, from `row` (where L2 is asked for them); `load(c)` (the Raw a
// lane keeps in flight), `decode(raw, c)`, and `dot(chunk, x, c)`: the chunk's products with
// x, where x holds the tile's elements from the tile's first chunk on (c counted from it).
struct Bf16Rows {
    static constexpr int PER_CHUNK = 8, CHUNK_BYTES = 16;
    using Raw = uint4;
    struct Chunk {
        float w[8];
    };
    const uint4* row;  // this warp's row, in chunks
    __device__ __forceinline__ Bf16Rows(const void* w, int m, int M, int K)
        : row((const uint4*)((const bf16*)w + (size_t)m * K)) {}
    __device__ __forceinline__ Raw load(int c) const { return __ldg(row + c); }
    __device__ __forceinline__ Chunk decode(uint4 wv, int) const {
        Chunk c;
        bf16x8_as_floats(wv, c.w);
        return c;
    }
    // The chunk's products with its 8 bf16 of x, summed in order.
    __device__ __forceinline__ float dot(const Chunk& c, const uint4* x, int at) const {
        return dot_bf16x8(c.w, x[at], 0.0f);
    }
};

// What a GEMV asks L2 for, in bytes of each weight row (multiples of 16): the row's start
// before its early start waits, and how far past the tile whose loads go out the loop keeps
// L2 asked for (more bytes in flight than a warp's registers hold: whether that pays off
// depends on the GPU and the shape, so gemv_tune.rs times it with each variant). 0: none.
struct GemvL2 {
    unsigned int before_wait, ahead;

    // Before the wait: a row's bytes from `loaded` (what the first loads cover) up to
    // `before_wait`, at least `ahead` of them.
    __device__ __forceinline__ void row_start(const void* row, unsigned int loaded,
                                              unsigned int row_bytes) const {
        unsigned int lo = min(loaded, row_bytes);
        unsigned int hi = min(max(before_wait, lo + ahead), row_bytes);
        if (hi > lo) l2_prefetch((const char*)row + lo, hi - lo);
    }

    // In the loop: one pass's `pass` bytes of a row, `ahead` past `loaded` (the end of the
    // loads in flight), so that consecutive passes ask for consecutive ranges.
    __device__ __forceinline__ void row_ahead(const void* row, unsigned int loaded,
                                              unsigned int pass, unsigned int row_bytes) const {
        unsigned int hi = loaded + ahead, lo = hi - pass;
        hi = min(hi, row_bytes);
        if (lo < hi) l2_prefetch((const char*)row + lo, hi - lo);
    }
};

// With `glu` >= 0 (an activation: 0 = SiLU, 1 = GELU) the product is the feed-forward's
// fused [gate | up] rows (M = 2·F) and the block writes bf16(act(gate)·up), F per token row
// (`out` then holds bf16 rows `ldo` apart): the first half of its warps take gate rows, the
// second half the same rows' up rows, and the first half write the activation of the pairs
// (gated_act's arithmetic on the sums the plain product writes: the same bits as the product,
// then gated_act, or the gated down projection's staging). The down projection then stages
// F bf16 per row instead of 2·F floats and F activations per block. -1: a plain product.
template <class ROWS, bool GATED, int WARPS, int UNROLL, bool PREFETCH, bool RESIDENT>
__device__ void gemv_t(const void* __restrict__ w, const void* __restrict__ xin,
                       float* __restrict__ out, int M, int K, int n, int ldo, int act,
                       GemvNorm norm, GemvL2 l2, int glu) {
    static_assert(PREFETCH || !RESIDENT, "a resident x streams W with prefetching");
    constexpr int PER_CHUNK = ROWS::PER_CHUNK, X_CHUNKS = PER_CHUNK / 8;  // x: 8 per uint4
    constexpr int TILE = 32 * UNROLL * PER_CHUNK;
    constexpr bool X8 = StagesInt8<ROWS>::value;  // x staged as int8 (gemv_stage_x8)
    static_assert(!X8 || (!RESIDENT && !GATED), "int8 x is staged tile by tile from bf16 rows");
    __shared__ uint4 x_tile[RESIDENT ? 1 : GEMV_MAX_ROWS][TILE / 8];
    GEMV_DYNAMIC_X(x_all);
    uint4* xs = RESIDENT ? x_all : &x_tile[0][0];
    int stride = RESIDENT ? K / 8 : TILE / 8;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    constexpr int HALF = WARPS / 2;
    int m = blockIdx.x * WARPS + warp;
    bool live = m < M;  // a row of the matrix (else the warp only keeps the block's barriers)
    if (glu >= 0) {
        int f = M / 2, pair = blockIdx.x * HALF + warp % HALF;
        m = warp < HALF ? pair : f + pair;
        live = pair < f;
    }
    const ROWS rows(w, min(m, M - 1), M, K);
    const void* wrow = rows.row;  // where L2 is asked for the row's bytes
    float acc[GEMV_MAX_ROWS];
#pragma unroll
    for (int j = 0; j < GEMV_MAX_ROWS; j++) acc[j] = 0.0f;
    // The first tile of W is requested before waiting for the kernel that writes x, and L2
    // asked for the row's next bytes up to `l2.before_wait` (at least `l2.ahead` of them):
    // with an early start their latency hides behind the previous kernel's last blocks.
    typename ROWS::Raw wv[UNROLL];
    gemv_load_w<UNROLL>(wv, rows, 0, lane, min(TILE, K) / PER_CHUNK);
    constexpr unsigned int TILE_BYTES = TILE / PER_CHUNK * ROWS::CHUNK_BYTES;
    const unsigned int row_bytes = (unsigned int)(K / PER_CHUNK) * ROWS::CHUNK_BYTES;
    if (lane == 0 && live) l2.row_start(wrow, TILE_BYTES, row_bytes);
    grid_dependency_sync();
    // (Visible after the first staging's barrier: every path stages at least once.)
    __shared__ float x_scales[GEMV_MAX_ROWS];
    gemv_load_scale(x_scales, norm, n);
    if constexpr (RESIDENT) {
        // (Two gated chunks at a time: four hold 64 floats, past a 16-warp block's registers.)
        gemv_stage_x<GATED, GATED ? 2 : ROW_BATCH>(xs, stride, xin, K, 0, K / 8, n, act);
        __syncthreads();
    }
    for (int k0 = 0; k0 < K; k0 += TILE) {
        int chunks = min(TILE, K - k0) / PER_CHUNK;
        if constexpr (X8) {
            static_assert(ROWS::TILE == TILE, "the row type reads this tile's staging");
            gemv_stage_x8(xs, stride, (const bf16*)xin, K, k0, chunks * PER_CHUNK, n, TILE);
            __syncthreads();
        } else if constexpr (!RESIDENT) {
            gemv_stage_x<GATED, 1>(xs, stride, xin, K, k0, chunks * X_CHUNKS, n, act);
            __syncthreads();
        }
        typename ROWS::Raw next[PREFETCH ? UNROLL : 1];
        if constexpr (PREFETCH) {
            int ahead = K - k0 - TILE;
            if (ahead > 0)
                gemv_load_w<UNROLL>(next, rows, (k0 + TILE) / PER_CHUNK, lane,
                                    min(TILE, ahead) / PER_CHUNK);
        } else if (k0 > 0) {
            gemv_load_w<UNROLL>(wv, rows, k0 / PER_CHUNK, lane, chunks);
        }
        const uint4* xt = RESIDENT ? xs + k0 / 8 : xs;
        // Each row's start, once per tile: with a resident x (row stride K / 8, not a
        // constant) ptxas otherwise keeps an address per (row, load) live across the loop,
        // ~50 registers more, and a 16-warp block no longer fits the register file.
        const uint4* xrow[GEMV_MAX_ROWS];
#pragma unroll
        for (int j = 0; j < GEMV_MAX_ROWS; j++) xrow[j] = xt + j * stride;
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            int c = lane + 32 * u;
            if (c < chunks) {
                typename ROWS::Chunk wc = rows.decode(wv[u], k0 / PER_CHUNK + c);
#pragma unroll
                for (int j = 0; j < GEMV_MAX_ROWS; j++) {
                    if (j < n) acc[j] += rows.dot(wc, xrow[j], c);
                }
            }
        }
        // L2 asked for one tile's bytes, `ahead` past the end of the tile whose loads went
        // out in this pass (consecutive passes ask for consecutive ranges). Here, after the
        // sums, and nothing kept across the loop: fewer registers live (a 16-warp block
        // loses half its occupancy past 64).
        if (l2.ahead > 0 && lane == 0 && live) {
            unsigned int loaded = (unsigned int)(k0 / PER_CHUNK) * ROWS::CHUNK_BYTES +
                                  (PREFETCH ? 2u : 1u) * TILE_BYTES;
            l2.row_ahead(wrow, loaded, TILE_BYTES, row_bytes);
        }
        if constexpr (PREFETCH) {
#pragma unroll
            for (int u = 0; u < UNROLL; u++) wv[u] = next[u];
        }
        if constexpr (!RESIDENT) __syncthreads();
    }
    if (glu >= 0) {
        __shared__ float sums[WARPS][GEMV_MAX_ROWS];
        gemv_write(acc, x_scales, true, n, [&](int j, float s) { sums[warp][j] = s; });
        __syncthreads();
        // Lane j of a gate warp writes token row j's activation.
        if (warp < HALF && live && lane < n) {
            float gate = sums[warp][lane], up = sums[warp + HALF][lane];
            ((bf16*)out)[(size_t)lane * ldo + m] = gated(gate, up, glu);
        }
        return;
    }
    gemv_write(acc, x_scales, m < M, n,
               [&](int j, float s) { gemv_store(norm, out, ldo, M, j, m, s); });
    gemv_end_norm(norm, out, ldo, M, n);
}

// The kernels take GemvNorm's fields one by one (plain parameters, as every launch passes).
#define GEMV_NORM_PARAMS                                                                   \
    float *norm_x, const float *norm_post_w, const float *norm_next_w, bf16 *norm_out,      \
        int *norm_done, float norm_eps, float *norm_inv, const float *x_scale
#define GEMV_NORM \
    GemvNorm{norm_x, norm_post_w, norm_next_w, norm_out, norm_done, norm_eps, norm_inv, x_scale}
#define GEMV_L2_PARAMS unsigned int l2_before_wait, unsigned int l2_ahead
#define GEMV_L2 GemvL2{l2_before_wait, l2_ahead}

// gemv_bf16_w<WARPS>u<UNROLL>[p|r] (with `glu`, the [gate | up] product writing the
// activation), and the down projection of [gate | up] rows
// gemv_bf16_gated_w<WARPS>u<UNROLL>[p|r] (act 0 = SiLU, 1 = GELU); `p`: PREFETCH, `r`:
// RESIDENT (and PREFETCH); see gemv_t. The variants are listed in gemv_tune.rs
// (GEMV_VARIANTS).
#define GEMV_BF16_NAMED(W, U, P, R, SUFFIX)                                                    \
    extern "C" __global__ void gemv_bf16_w##W##u##U##SUFFIX(                                  \
        const bf16* __restrict__ w, const bf16* __restrict__ x, float* __restrict__ out, int M, \
        int K, int n, int ldo, GEMV_NORM_PARAMS, GEMV_L2_PARAMS, int glu) {                    \
        gemv_t<Bf16Rows, false, W, U, P, R>(w, x, out, M, K, n, ldo, 0, GEMV_NORM, GEMV_L2,    \
                                            glu);                                             \
    }                                                                                         \
    extern "C" __global__ void gemv_bf16_gated_w##W##u##U##SUFFIX(                            \
        const bf16* __restrict__ w, const float* __restrict__ gate_up, float* __restrict__ out, \
        int M, int K, int n, int ldo, int act, GEMV_NORM_PARAMS, GEMV_L2_PARAMS) {            \
        gemv_t<Bf16Rows, true, W, U, P, R>(w, gate_up, out, M, K, n, ldo, act, GEMV_NORM,     \
                                           GEMV_L2, -1);                                      \
    }
#define GEMV_BF16(W, U)                        \
    GEMV_BF16_NAMED(W, U, false, false, )      \
    GEMV_BF16_NAMED(W, U, true, false, p)      \
    GEMV_BF16_NAMED(W, U, true, true, r)

GEMV_BF16(4, 4)
GEMV_BF16(4, 8)
GEMV_BF16(8, 4)
GEMV_BF16(8, 8)
GEMV_BF16(16, 4)
GEMV_BF16(16, 8)
