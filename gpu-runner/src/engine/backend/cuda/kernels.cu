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
// weights (which no kernel writes) may be read before it. It waits until the previous grid
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
#endif

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024).
__device__ float block_sum(float v) {
    __shared__ float partial[32];
    __shared__ float total;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float s = lane < (int)(blockDim.x >> 5) ? partial[lane] : 0.0f;
        s = warp_sum(s);
        if (lane == 0) total = s;
    }
    __syncthreads();
    float r = total;
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
    float ss = 0.0f;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) ss += xr[i] * xr[i];
    float inv = rsqrtf(block_sum(ss) / hidden + eps);
    bf16* o = out + (size_t)blockIdx.x * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) o[i] = f32_to_bf16(xr[i] * inv * w[i]);
}

// The end of a sub-block and the start of the next, one pass per row:
// x += post_w ? rmsnorm(delta) * post_w : delta;  then, unless next_w is null (the last
// block), out = bf16(rmsnorm(x) * next_w).
extern "C" __global__ void add_rms_norm(float* __restrict__ x, const float* __restrict__ delta,
                                        const float* post_w, const float* next_w,
                                        bf16* __restrict__ out, int hidden, float eps) {
    grid_dependency_sync();
    float* xr = x + (size_t)blockIdx.x * hidden;
    const float* dr = delta + (size_t)blockIdx.x * hidden;
    float post_inv = 1.0f;
    if (post_w) {
        float ss = 0.0f;
        for (int i = threadIdx.x; i < hidden; i += blockDim.x) ss += dr[i] * dr[i];
        post_inv = rsqrtf(block_sum(ss) / hidden + eps);
    }
    float ss = 0.0f;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) {
        float d = post_w ? dr[i] * post_inv * post_w[i] : dr[i];
        float v = xr[i] + d;
        xr[i] = v;
        ss += v * v;
    }
    if (!next_w) return;
    float inv = rsqrtf(block_sum(ss) / hidden + eps);
    bf16* o = out + (size_t)blockIdx.x * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) o[i] = f32_to_bf16(xr[i] * inv * next_w[i]);
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
        float ss = 0.0f;
        for (int i = threadIdx.x; i < head_dim; i += blockDim.x) ss += v[i] * v[i];
        float inv = rsqrtf(block_sum(ss) / head_dim + eps);
        for (int i = threadIdx.x; i < head_dim; i += blockDim.x) v[i] = v[i] * inv * norm[i];
        __syncthreads();
    }
    int half = head_dim / 2;
    double pos = (double)positions[t];
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        double s, c;
        sincos(pos * inv_freq[i], &s, &c);
        float cf = (float)c, sf = (float)s;
        int a = style == 0 ? 2 * i : i;
        int b = style == 0 ? 2 * i + 1 : i + half;
        float x0 = v[a], x1 = v[b];
        v[a] = x0 * cf - x1 * sf;
        v[b] = x0 * sf + x1 * cf;
    }
    if (h < n_heads) return;
    __syncthreads();  // RoPE moved values between threads' elements
    bf16* dst = k_cache + slot + (size_t)(h - n_heads) * head_dim;
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) dst[i] = f32_to_bf16(v[i]);
}

// out = bf16(act(gate) * up) over the fused [gate | up] rows; act 0 = SiLU, 1 = GELU (tanh).
// Grid (tokens, ffn / blockDim): one element per thread, so a single token still spreads
// over the whole GPU.
__device__ __forceinline__ bf16 gated(float gate, float up, int act) {
    float a;
    if (act == 0) {
        a = gate / (1.0f + __expf(-gate));
    } else {
        a = 0.5f * gate * (1.0f + tanhf(0.7978845608f * (gate + 0.044715f * gate * gate * gate)));
    }
    return f32_to_bf16(a * up);
}

extern "C" __global__ void gated_act(const float* __restrict__ gate_up, bf16* __restrict__ out,
                                     int ffn, int act) {
    grid_dependency_sync();
    int i = blockIdx.y * blockDim.x + threadIdx.x;
    if (i >= ffn) return;
    const float* g = gate_up + (size_t)blockIdx.x * 2 * ffn;
    out[(size_t)blockIdx.x * ffn + i] = gated(g[i], g[ffn + i], act);
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
// UNROLL chunks of 8 elements. Lane l adds chunks l, l + 32, l + 64, … of K in ascending
// order whatever the variant, so every instantiation gives the same bits; which is fastest
// depends on the GPU and the shape (gemv_tune.rs times them at load). K % 8 == 0.
//
// PREFETCH: the next tile's W is requested before the current one is summed, so a warp
// keeps loads in flight while it computes (twice the registers for W). RESIDENT: all of x
// is staged once, in dynamic shared memory (n·K·2 bytes, at most GEMV_RESIDENT_BYTES),
// instead of tile by tile: no block-wide barrier inside the loop, each warp streams its
// rows of W at its own pace (always with PREFETCH).
//
// GATED: x is not bf16 rows but the fused [gate | up] f32 rows of the feed-forward (2·K wide),
// and each staged element is gated_act's bf16(act(gate)·up), computed here: the down
// projection of a decode step without the activation's own launch (same values, same sums).

#define GEMV_RESIDENT_BYTES (48 * 1024)

// This lane's UNROLL chunks (of `chunks`) of one tile of a weight row.
template <int UNROLL>
__device__ __forceinline__ void gemv_load_w(uint4* wv, const uint4* tile, int lane, int chunks) {
#pragma unroll
    for (int u = 0; u < UNROLL; u++) {
        int c = lane + 32 * u;
        if (c < chunks) wv[u] = __ldg(tile + c);
    }
}

// Each row's sum over the warp's lanes, written to out[j·ldo + m] (for a warp with m < M).
__device__ __forceinline__ void gemv_write(const float* acc, float* out, int ldo, int m, int M,
                                           int n) {
    if (m >= M) return;
#pragma unroll
    for (int j = 0; j < GEMV_MAX_ROWS; j++) {
        if (j < n) {
            float s = warp_sum(acc[j]);
            if ((threadIdx.x & 31) == 0) out[(size_t)j * ldo + m] = s;
        }
    }
}

// Stages chunks [k0 / 8, k0 / 8 + chunks) of the n rows of x into xs (row j at j·stride),
// by the whole block.
template <bool GATED>
__device__ __forceinline__ void gemv_stage_x(uint4* xs, int stride, const void* __restrict__ xin,
                                             int K, int k0, int chunks, int n, int act) {
    for (int i = threadIdx.x; i < n * chunks; i += blockDim.x) {
        int j = i / chunks, c = i - j * chunks;
        if (GATED) {
            const float* g = (const float*)xin + (size_t)j * 2 * K + k0 + 8 * c;
            unsigned int packed[4];
#pragma unroll
            for (int e = 0; e < 4; e++)
                packed[e] = gated(g[2 * e], g[K + 2 * e], act) |
                            ((unsigned int)gated(g[2 * e + 1], g[K + 2 * e + 1], act) << 16);
            xs[j * stride + c] = make_uint4(packed[0], packed[1], packed[2], packed[3]);
        } else {
            xs[j * stride + c] = __ldg((const uint4*)((const bf16*)xin + (size_t)j * K + k0) + c);
        }
    }
}

#ifdef FALLOW_EMULATOR
#define GEMV_DYNAMIC_X(name) uint4* name = (uint4*)emu::dynamic_shared()
#else
#define GEMV_DYNAMIC_X(name) extern __shared__ uint4 name[]
#endif

template <bool GATED, int WARPS, int UNROLL, bool PREFETCH, bool RESIDENT>
__device__ void gemv_bf16_t(const bf16* __restrict__ w, const void* __restrict__ xin,
                            float* __restrict__ out, int M, int K, int n, int ldo, int act) {
    static_assert(PREFETCH || !RESIDENT, "a resident x streams W with prefetching");
    const int TILE = 32 * UNROLL * 8;
    __shared__ uint4 x_tile[RESIDENT ? 1 : GEMV_MAX_ROWS][TILE / 8];
    GEMV_DYNAMIC_X(x_all);
    uint4* xs = RESIDENT ? x_all : &x_tile[0][0];
    int stride = RESIDENT ? K / 8 : TILE / 8;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int m = blockIdx.x * WARPS + warp;
    const uint4* wrow = (const uint4*)(w + (size_t)min(m, M - 1) * K);
    float acc[GEMV_MAX_ROWS];
#pragma unroll
    for (int j = 0; j < GEMV_MAX_ROWS; j++) acc[j] = 0.0f;
    // The first tile of W is requested before waiting for the kernel that writes x: with an
    // early start its latency hides behind the previous kernel's last blocks.
    uint4 wv[UNROLL];
    gemv_load_w<UNROLL>(wv, wrow, lane, min(TILE, K) / 8);
    grid_dependency_sync();
    if constexpr (RESIDENT) {
        gemv_stage_x<GATED>(xs, stride, xin, K, 0, K / 8, n, act);
        __syncthreads();
    }
    for (int k0 = 0; k0 < K; k0 += TILE) {
        int chunks = min(TILE, K - k0) / 8;
        if constexpr (!RESIDENT) {
            gemv_stage_x<GATED>(xs, stride, xin, K, k0, chunks, n, act);
            __syncthreads();
        }
        uint4 next[PREFETCH ? UNROLL : 1];
        if constexpr (PREFETCH) {
            int ahead = K - k0 - TILE;
            if (ahead > 0) gemv_load_w<UNROLL>(next, wrow + (k0 + TILE) / 8, lane, min(TILE, ahead) / 8);
        } else if (k0 > 0) {
            gemv_load_w<UNROLL>(wv, wrow + k0 / 8, lane, chunks);
        }
        const uint4* xt = RESIDENT ? xs + k0 / 8 : xs;
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            int c = lane + 32 * u;
            if (c < chunks) {
                float wf[8];
                unsigned int words[4] = {wv[u].x, wv[u].y, wv[u].z, wv[u].w};
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    wf[2 * e] = __uint_as_float(words[e] << 16);
                    wf[2 * e + 1] = __uint_as_float(words[e] & 0xffff0000u);
                }
#pragma unroll
                for (int j = 0; j < GEMV_MAX_ROWS; j++) {
                    if (j < n) {
                        uint4 xv = xt[j * stride + c];
                        unsigned int xw[4] = {xv.x, xv.y, xv.z, xv.w};
                        float s = 0.0f;
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            s += wf[2 * e] * __uint_as_float(xw[e] << 16);
                            s += wf[2 * e + 1] * __uint_as_float(xw[e] & 0xffff0000u);
                        }
                        acc[j] += s;
                    }
                }
            }
        }
        if constexpr (PREFETCH) {
#pragma unroll
            for (int u = 0; u < UNROLL; u++) wv[u] = next[u];
        }
        if constexpr (!RESIDENT) __syncthreads();
    }
    gemv_write(acc, out, ldo, m, M, n);
}

// gemv_bf16_w<WARPS>u<UNROLL>[p|r], and the down projection of [gate | up] rows
// gemv_bf16_gated_w<WARPS>u<UNROLL>[p|r] (act 0 = SiLU, 1 = GELU); `p`: PREFETCH, `r`:
// RESIDENT (and PREFETCH); see gemv_bf16_t. The variants are listed in gemv_tune.rs
// (GEMV_VARIANTS).
#define GEMV_BF16_NAMED(W, U, P, R, SUFFIX)                                                    \
    extern "C" __global__ void gemv_bf16_w##W##u##U##SUFFIX(const bf16* __restrict__ w,       \
                                                            const bf16* __restrict__ x,       \
                                                            float* __restrict__ out, int M,   \
                                                            int K, int n, int ldo) {          \
        gemv_bf16_t<false, W, U, P, R>(w, x, out, M, K, n, ldo, 0);                           \
    }                                                                                         \
    extern "C" __global__ void gemv_bf16_gated_w##W##u##U##SUFFIX(                            \
        const bf16* __restrict__ w, const float* __restrict__ gate_up, float* __restrict__ out, \
        int M, int K, int n, int ldo, int act) {                                              \
        gemv_bf16_t<true, W, U, P, R>(w, gate_up, out, M, K, n, ldo, act);                    \
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
