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
    const bf16* row = table + (size_t)ids[blockIdx.x] * hidden;
    float* out = x + (size_t)blockIdx.x * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) out[i] = bf16_to_f32(row[i]) * scale;
}

// out[r] = bf16(rmsnorm(x[rows[r]]) * w): the pre-norm of a block, or (with `rows`) the final
// norm of the rows that produce logits. `rows` may be null (row r reads x[r]).
extern "C" __global__ void rms_norm_bf16(const float* x, const int* rows, const float* w,
                                         bf16* out, int hidden, float eps) {
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

#define ATTN_WARPS 8
#define ATTN_HEADS 4  // query heads of one KV head per block
#define ATTN_KEYS 4   // keys a warp loads at once (independent loads in flight)

// Causal attention over the paged KV cache. Block (t, c, s) serves query token t, query heads
// c·ATTN_HEADS.. of one KV head (GQA: each key and value row is read once for all of them),
// and the s-th `partition` keys of the token's range (split-K: a long context of a few
// sequences spreads over many blocks). Each warp walks every ATTN_WARPS-th key, ATTN_KEYS of
// them per iteration (their rows loaded together, so that a short decode is not a chain of
// one memory latency per key), with an online softmax; then the warps merge. With one split
// the block writes the normalised bf16 output; with several it writes (max, sum,
// unnormalised accumulator) to `partial`, which attention_merge combines. DIMS = head_dim
// rounded up to whole warps / 32 (the paged_attention_<DIMS> kernels below).
// Serves decode (one query per sequence) and prefill (every prompt token, attending to the
// cached prefix and to the chunk's own earlier tokens, which qkv_prepare wrote first).
template <int DIMS>
__device__ void paged_attention_t(
    const float* qkv, int qkv_width, const bf16* k_cache, const bf16* v_cache,
    const int* block_tables, int max_blocks, const int* token_seq, const int* positions,
    bf16* out, float* partial, int n_heads, int n_kv_heads, int head_dim, int block_size,
    float scale, float softcap, int window, int partition) {
    int t = blockIdx.x;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int group = n_heads / n_kv_heads;
    int chunks = (group + ATTN_HEADS - 1) / ATTN_HEADS;
    int kvh = blockIdx.y / chunks;
    int h0 = kvh * group + (blockIdx.y % chunks) * ATTN_HEADS;
    int heads = min(ATTN_HEADS, (kvh + 1) * group - h0);
    int kv_dim = n_kv_heads * head_dim;
    int pos = positions[t];
    int lo = window > 0 ? max(0, pos + 1 - window) : 0;
    long long first = (long long)lo + (long long)blockIdx.z * partition;
    int begin = (int)min(first, (long long)pos + 1);
    int end = (int)min(first + partition, (long long)pos + 1);
    const int* table = block_tables + (size_t)token_seq[t] * max_blocks;
    const float* q = qkv + (size_t)t * qkv_width + (size_t)h0 * head_dim;

    float qr[ATTN_HEADS][DIMS], acc[ATTN_HEADS][DIMS];
    float m[ATTN_HEADS], l[ATTN_HEADS];
#pragma unroll
    for (int g = 0; g < ATTN_HEADS; g++) {
        m[g] = NEG_INF;
        l[g] = 0.0f;
#pragma unroll
        for (int r = 0; r < DIMS; r++) {
            int d = lane + 32 * r;
            qr[g][r] = g < heads && d < head_dim ? q[g * head_dim + d] * scale : 0.0f;
            acc[g][r] = 0.0f;
        }
    }
    for (int j0 = begin + warp; j0 < end; j0 += ATTN_WARPS * ATTN_KEYS) {
        float kf[ATTN_KEYS][DIMS], vf[ATTN_KEYS][DIMS];
#pragma unroll
        for (int u = 0; u < ATTN_KEYS; u++) {
            int j = j0 + u * ATTN_WARPS;
            size_t row = 0;
            if (j < end) {
                size_t slot = (size_t)table[j / block_size] * block_size + (j % block_size);
                row = slot * kv_dim + (size_t)kvh * head_dim;
            }
#pragma unroll
            for (int r = 0; r < DIMS; r++) {
                bool in = j < end && lane + 32 * r < head_dim;
                kf[u][r] = in ? bf16_to_f32(k_cache[row + lane + 32 * r]) : 0.0f;
                vf[u][r] = in ? bf16_to_f32(v_cache[row + lane + 32 * r]) : 0.0f;
            }
        }
#pragma unroll
        for (int g = 0; g < ATTN_HEADS; g++) {
            if (g >= heads) break;
            float s[ATTN_KEYS];
#pragma unroll
            for (int u = 0; u < ATTN_KEYS; u++) {
                s[u] = 0.0f;
#pragma unroll
                for (int r = 0; r < DIMS; r++) s[u] += qr[g][r] * kf[u][r];
            }
#pragma unroll
            for (int u = 0; u < ATTN_KEYS; u++) s[u] = warp_sum(s[u]);
#pragma unroll
            for (int u = 0; u < ATTN_KEYS; u++) {
                if (j0 + u * ATTN_WARPS >= end) break;
                float su = softcap > 0.0f ? softcap * tanhf(s[u] / softcap) : s[u];
                float m_new = fmaxf(m[g], su);
                float correction = __expf(m[g] - m_new);
                float pu = __expf(su - m_new);
                l[g] = l[g] * correction + pu;
#pragma unroll
                for (int r = 0; r < DIMS; r++) acc[g][r] = acc[g][r] * correction + pu * vf[u][r];
                m[g] = m_new;
            }
        }
    }

    __shared__ float sm[ATTN_WARPS][ATTN_HEADS], sl[ATTN_WARPS][ATTN_HEADS];
    __shared__ float sacc[ATTN_WARPS][ATTN_HEADS][DIMS * 32];
#pragma unroll
    for (int g = 0; g < ATTN_HEADS; g++) {
        if (lane == 0) {
            sm[warp][g] = m[g];
            sl[warp][g] = l[g];
        }
#pragma unroll
        for (int r = 0; r < DIMS; r++)
            if (lane + 32 * r < head_dim) sacc[warp][g][lane + 32 * r] = acc[g][r];
    }
    __syncthreads();
    int splits = gridDim.z;
    for (int i = threadIdx.x; i < heads * head_dim; i += blockDim.x) {
        int g = i / head_dim, d = i - g * head_dim;
        float m_all = NEG_INF;
        for (int w = 0; w < ATTN_WARPS; w++)
            if (sl[w][g] > 0.0f) m_all = fmaxf(m_all, sm[w][g]);
        float l_all = 0.0f, sum = 0.0f;
        for (int w = 0; w < ATTN_WARPS; w++) {
            if (sl[w][g] > 0.0f) {
                float f = __expf(sm[w][g] - m_all);
                l_all += sl[w][g] * f;
                sum += sacc[w][g][d] * f;
            }
        }
        int h = h0 + g;
        if (splits == 1) {
            out[((size_t)t * n_heads + h) * head_dim + d] = f32_to_bf16(sum / l_all);
        } else {
            float* rec = partial + (((size_t)t * n_heads + h) * splits + blockIdx.z) * (head_dim + 2);
            if (d == 0) {
                rec[0] = m_all;
                rec[1] = l_all;
            }
            rec[2 + d] = sum;
        }
    }
}

#define PAGED_ATTENTION(DIMS)                                                                   \
    extern "C" __global__ void paged_attention_##DIMS(                                          \
        const float* qkv, int qkv_width, const bf16* k_cache, const bf16* v_cache,              \
        const int* block_tables, int max_blocks, const int* token_seq, const int* positions,    \
        bf16* out, float* partial, int n_heads, int n_kv_heads, int head_dim, int block_size,   \
        float scale, float softcap, int window, int partition) {                                \
        paged_attention_t<DIMS>(qkv, qkv_width, k_cache, v_cache, block_tables, max_blocks,     \
                                token_seq, positions, out, partial, n_heads, n_kv_heads,        \
                                head_dim, block_size, scale, softcap, window, partition);       \
    }

PAGED_ATTENTION(1)
PAGED_ATTENTION(2)
PAGED_ATTENTION(4)
PAGED_ATTENTION(8)

// Combines the split-K partial results of paged_attention: per (token, head), the splits'
// accumulators rescaled to the largest maximum, over the sum of their rescaled sums.
// Empty splits (sum 0) are skipped; the first split always holds the token itself.
extern "C" __global__ void attention_merge(const float* partial, bf16* out, int n_heads,
                                           int head_dim, int splits) {
    int t = blockIdx.x, h = blockIdx.y;
    int stride = head_dim + 2;
    const float* rec = partial + ((size_t)t * n_heads + h) * splits * stride;
    float m_all = NEG_INF;
    for (int s = 0; s < splits; s++)
        if (rec[s * stride + 1] > 0.0f) m_all = fmaxf(m_all, rec[s * stride]);
    float l_all = 0.0f;
    for (int s = 0; s < splits; s++)
        if (rec[s * stride + 1] > 0.0f) l_all += rec[s * stride + 1] * __expf(rec[s * stride] - m_all);
    bf16* o = out + ((size_t)t * n_heads + h) * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float sum = 0.0f;
        for (int s = 0; s < splits; s++)
            if (rec[s * stride + 1] > 0.0f) sum += rec[s * stride + 2 + d] * __expf(rec[s * stride] - m_all);
        o[d] = f32_to_bf16(sum / l_all);
    }
}

// out = bf16(act(gate) * up) over the fused [gate | up] rows; act 0 = SiLU, 1 = GELU (tanh).
// Grid (tokens, ffn / blockDim): one element per thread, so a single token still spreads
// over the whole GPU.
extern "C" __global__ void gated_act(const float* __restrict__ gate_up, bf16* __restrict__ out,
                                     int ffn, int act) {
    int i = blockIdx.y * blockDim.x + threadIdx.x;
    if (i >= ffn) return;
    const float* g = gate_up + (size_t)blockIdx.x * 2 * ffn;
    float x = g[i], a;
    if (act == 0) {
        a = x / (1.0f + __expf(-x));
    } else {
        a = 0.5f * x * (1.0f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x)));
    }
    out[(size_t)blockIdx.x * ffn + i] = f32_to_bf16(a * g[ffn + i]);
}

// x = cap * tanh(x / cap) (Gemma 2's final logit soft-capping).
extern "C" __global__ void softcap(float* x, long long n, float cap) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = cap * tanhf(x[i] / cap);
}

#define GEMV_MAX_ROWS 8
#define GEMV_WARPS 8
#define GEMV_UNROLL 4
// K elements of x staged in shared memory per pass: 32 lanes × GEMV_UNROLL chunks of 8.
#define GEMV_TILE (32 * GEMV_UNROLL * 8)

// out[j·ldo + m] = sum_k x[j, k] * w[m, k] for j < n <= GEMV_MAX_ROWS: the decode-sized matrix
// product, bound by reading W once. One warp per output column m, GEMV_WARPS per block; x is
// staged tile by tile in shared memory (read from L2 once per block, not once per warp and
// row), and each lane keeps GEMV_UNROLL independent 16-byte loads of W in flight. Each lane
// adds its chunks of K in ascending order whatever the tiling. K % 8 == 0.
extern "C" __global__ void gemv_bf16(const bf16* __restrict__ w, const bf16* __restrict__ x,
                                     float* __restrict__ out, int M, int K, int n, int ldo) {
    __shared__ uint4 xs[GEMV_MAX_ROWS][GEMV_TILE / 8];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int m = blockIdx.x * GEMV_WARPS + warp;
    const uint4* wrow = (const uint4*)(w + (size_t)min(m, M - 1) * K);
    float acc[GEMV_MAX_ROWS];
#pragma unroll
    for (int j = 0; j < GEMV_MAX_ROWS; j++) acc[j] = 0.0f;
    for (int k0 = 0; k0 < K; k0 += GEMV_TILE) {
        int chunks = min(GEMV_TILE, K - k0) / 8;
        for (int i = threadIdx.x; i < n * chunks; i += blockDim.x) {
            int j = i / chunks, c = i - j * chunks;
            xs[j][c] = __ldg((const uint4*)(x + (size_t)j * K + k0) + c);
        }
        __syncthreads();
        uint4 wv[GEMV_UNROLL];
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++) {
            int c = lane + 32 * u;
            if (c < chunks) wv[u] = __ldg(wrow + k0 / 8 + c);
        }
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++) {
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
                        uint4 xv = xs[j][c];
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
        __syncthreads();
    }
    if (m >= M) return;
#pragma unroll
    for (int j = 0; j < GEMV_MAX_ROWS; j++) {
        if (j < n) {
            float s = warp_sum(acc[j]);
            if (lane == 0) out[(size_t)j * ldo + m] = s;
        }
    }
}

// Block-wide sum and inclusive prefix sum of int/double values (blockDim.x a multiple of
// 32, at most 1024); every thread gets the block total in *total.
template <class T>
__device__ T block_inclusive_scan(T v, T* total) {
    __shared__ T warp_totals[32];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    for (int o = 1; o < 32; o <<= 1) {
        T other = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += other;
    }
    if (lane == 31) warp_totals[warp] = v;
    __syncthreads();
    if (warp == 0) {
        T w = lane < warps ? warp_totals[lane] : (T)0;
        for (int o = 1; o < 32; o <<= 1) {
            T other = __shfl_up_sync(0xffffffffu, w, o);
            if (lane >= o) w += other;
        }
        if (lane < warps) warp_totals[lane] = w;
    }
    __syncthreads();
    T before = warp > 0 ? warp_totals[warp - 1] : (T)0;
    *total = warp_totals[warps - 1];
    __syncthreads();
    return v + before;
}

template <class T>
__device__ T block_total(T v) {
    T total;
    block_inclusive_scan(v, &total);
    return total;
}

// The weight of a logit relative to the row's best, exp((l - max) / T); NaN and masked
// tokens weigh 0. Recomputed in every pass rather than stored: the row stays intact.
__device__ __forceinline__ float weight_of(float l, float max, float inv_t) {
    float x = (l - max) * inv_t;
    return (l == l && x >= -87.0f) ? __expf(x) : 0.0f;
}

// Tokens of a row whose weight is >= bits `t` (positive floats order like their bits): their
// count and their mass.
__device__ int count_at_least(const float* row, int vocab, float max, float inv_t, unsigned t) {
    int c = 0;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x)
        c += __float_as_uint(weight_of(row[i], max, inv_t)) >= t;
    return block_total(c);
}

__device__ double mass_at_least(const float* row, int vocab, float max, float inv_t, unsigned t) {
    double m = 0.0;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        float w = weight_of(row[i], max, inv_t);
        if (__float_as_uint(w) >= t) m += w;
    }
    return block_total(m);
}

#define ONE_BITS 0x3f800000u
#define PICK_PARAMS 6
#define MAX_TOP_LOGPROBS 20
#define LOGPROB_STRIDE (1 + 2 * MAX_TOP_LOGPROBS)
#define MIN_LOGPROB (-9999.0f)

// The best (value desc, id asc) of a block's candidates; every thread gets it.
__device__ void block_best(float* best, int* best_i) {
    __shared__ float sv[32];
    __shared__ int si[32];
    float v = *best;
    int vi = *best_i;
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, v, o);
        int oi = __shfl_xor_sync(0xffffffffu, vi, o);
        if (ov > v || (ov == v && oi < vi)) {
            v = ov;
            vi = oi;
        }
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        sv[warp] = v;
        si[warp] = vi;
    }
    __syncthreads();
    v = sv[0];
    vi = si[0];
    for (int w = 1; w < (int)(blockDim.x >> 5); w++) {
        if (sv[w] > v || (sv[w] == v && si[w] < vi)) {
            v = sv[w];
            vi = si[w];
        }
    }
    __syncthreads();
    *best = v;
    *best_i = vi;
}

// A logit as the host's logprobs see it: NaN is -inf.
__device__ __forceinline__ float clean_logit(float l) { return l == l ? l : NEG_INF; }

__device__ __forceinline__ float logprob_of(float l, float normaliser) {
    float lp = clean_logit(l) - normaliser;
    return lp > NEG_INF ? lp : MIN_LOGPROB;
}

// The sampled token of a row whose best logit is `best` (at `best_i`): see pick_rows.
__device__ int draw_token(const float* row, int vocab, float best, float temperature, int top_k,
                          float top_p, float min_p, float u, int best_i) {
    float inv_t = 1.0f / temperature;

    // min-p: every token weighing at least min_p (the best weighs 1); at least the smallest
    // positive weight.
    float min_w = fminf(fmaxf(min_p, 0.0f), 1.0f);
    unsigned t = min_w > 0.0f ? __float_as_uint(min_w) : 1u;
    int ties = 0x7fffffff;  // tokens weighing exactly t that are kept, in id order
    int kept = count_at_least(row, vocab, best, inv_t, t);
    if (top_k > 0 && top_k < kept) {
        unsigned a = t, b = ONE_BITS;  // count(w >= a) >= top_k throughout
        while (a < b) {
            unsigned mid = a + (b - a + 1) / 2;
            if (count_at_least(row, vocab, best, inv_t, mid) >= top_k) a = mid; else b = mid - 1;
        }
        t = a;
        ties = top_k - count_at_least(row, vocab, best, inv_t, t + 1);
    }
    if (top_p < 1.0f) {
        float wt = __uint_as_float(t);
        double above = mass_at_least(row, vocab, best, inv_t, t + 1);
        int at_t = count_at_least(row, vocab, best, inv_t, t) - count_at_least(row, vocab, best, inv_t, t + 1);
        double total = above + (double)min(ties, at_t) * wt;
        double need = (double)(top_p * (float)total);
        unsigned a = t, b = ONE_BITS;  // the kept mass from a up reaches `need` throughout
        while (a < b) {
            unsigned mid = a + (b - a + 1) / 2;
            if (mass_at_least(row, vocab, best, inv_t, mid) >= need) a = mid; else b = mid - 1;
        }
        if (a > t) {
            t = a;
            ties = 0x7fffffff;
            above = mass_at_least(row, vocab, best, inv_t, t + 1);
            wt = __uint_as_float(t);
        }
        int wanted = (int)ceil((need - above) / (double)wt);
        ties = min(ties, max(wanted, 1));
    }

    // The draw: each thread owns a contiguous run of ids, so that id order is thread order.
    float wt = __uint_as_float(t);
    int per = (vocab + blockDim.x - 1) / blockDim.x;
    int lo = min((int)threadIdx.x * per, vocab), hi = min(lo + per, vocab);
    int my_ties = 0;
    double my_above = 0.0;
    for (int i = lo; i < hi; i++) {
        float w = weight_of(row[i], best, inv_t);
        unsigned b = __float_as_uint(w);
        if (b > t) my_above += w; else if (b == t) my_ties++;
    }
    int ties_total;
    int ties_before = block_inclusive_scan(my_ties, &ties_total) - my_ties;
    int my_kept_ties = max(0, min(my_ties, ties - ties_before));
    double my_mass = my_above + (double)my_kept_ties * wt;
    double mass_total;
    double before = block_inclusive_scan(my_mass, &mass_total) - my_mass;
    double target = (double)u * mass_total;
    __shared__ int picked;
    if (threadIdx.x == 0) picked = -1;
    __syncthreads();
    bool mine = my_mass > 0.0 && target >= before && target < before + my_mass;
    // Rounding can leave the target at the very end: the last kept token then.
    bool last = my_mass > 0.0 && before + my_mass >= mass_total && target >= mass_total;
    if (mine || last) {
        double acc = before;
        int tie_rank = ties_before, choice = -1;
        for (int i = lo; i < hi; i++) {
            float w = weight_of(row[i], best, inv_t);
            unsigned b = __float_as_uint(w);
            bool keep = b > t || (b == t && tie_rank++ < ties);
            if (!keep) continue;
            acc += w;
            choice = i;
            if (mine && target < acc) break;
        }
        atomicMax(&picked, choice);
    }
    __syncthreads();
    int result = picked >= 0 ? picked : best_i;
    __syncthreads();
    return result;
}

// ids[r] = the token picked from logits row `first + r`, one block per row. params[r] =
// {temperature, top_k, top_p, min_p, u, top_logprobs} (floats as bits; top_k an int;
// top_logprobs -1 when no logprobs are wanted). Temperature < 1e-5 (or a row without a
// number) is greedy: the argmax, NaN never wins, ties to the lowest id. Otherwise weights
// exp((l - max) / T) (NaN and masked tokens weigh 0), min-p, top-k and top-p keep a prefix of
// the tokens ordered by weight (ties by id), as the host sampler defines them, and u picks
// in token order among the kept ones, by their weights. The kept prefix is "weight above t,
// and the first m tokens weighing exactly t"; top-k's and top-p's thresholds are found by
// bisection over the weights' bits. With logprobs, logprobs[r] = {the token's logprob, then
// (id as float bits, logprob) of the top_logprobs best tokens}: log-softmax of the raw row.
extern "C" __global__ void pick_rows(const float* logits, int first, int vocab,
                                     const int* params, int* ids, float* logprobs) {
    const float* row = logits + (size_t)(first + blockIdx.x) * vocab;
    const int* p = params + (size_t)blockIdx.x * PICK_PARAMS;
    float temperature = __int_as_float(p[0]), top_p = __int_as_float(p[2]);
    float min_p = __int_as_float(p[3]), u = __int_as_float(p[4]);
    int top_k = p[1], top_logprobs = p[5];

    float best = NEG_INF;
    int best_i = 0x7fffffff;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        float v = row[i];
        if (v > best || (v == best && i < best_i)) {
            best = v;
            best_i = i;
        }
    }
    block_best(&best, &best_i);
    // A row of NaN only: token 0, as the host sampler does.
    int token = best_i == 0x7fffffff ? 0 : best_i;
    bool finite = best > NEG_INF && best < -NEG_INF;
    if (temperature >= 1e-5f && finite) token = draw_token(row, vocab, best, temperature, top_k,
                                                            top_p, min_p, u, best_i);
    if (threadIdx.x == 0) ids[blockIdx.x] = token;
    if (top_logprobs < 0) return;

    // Logprobs: log-softmax of the row, NaN as -inf.
    double sum = 0.0;
    if (finite)
        for (int i = threadIdx.x; i < vocab; i += blockDim.x) sum += __expf(clean_logit(row[i]) - best);
    sum = block_total(sum);
    float normaliser = finite ? best + logf((float)sum) : 0.0f;
    float* out = logprobs + (size_t)blockIdx.x * LOGPROB_STRIDE;
    if (threadIdx.x == 0) out[0] = logprob_of(row[token], normaliser);
    // The best tokens one pass each: the next in (logit desc, id asc) after the last one.
    float prev = -NEG_INF;
    int prev_i = -1;
    for (int k = 0; k < min(top_logprobs, MAX_TOP_LOGPROBS); k++) {
        float v = NEG_INF;
        int vi = 0x7fffffff;
        for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
            float l = clean_logit(row[i]);
            bool after = l < prev || (l == prev && i > prev_i);
            if (after && (l > v || (l == v && i < vi))) {
                v = l;
                vi = i;
            }
        }
        block_best(&v, &vi);
        if (vi == 0x7fffffff) break;  // fewer tokens than asked
        if (threadIdx.x == 0) {
            out[1 + 2 * k] = __int_as_float(vi);
            out[2 + 2 * k] = logprob_of(v, normaliser);
        }
        prev = v;
        prev_i = vi;
    }
}
