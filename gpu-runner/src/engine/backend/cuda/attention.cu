// Attention over the paged KV cache (appended to kernels.cu at compile time, see kernels.rs):
// the GQA-aware, optionally split-K kernel and the merge of its partial results.

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
