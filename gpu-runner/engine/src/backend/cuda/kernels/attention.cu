// Attention over the paged KV cache (appended to kernels.cu at compile time, see kernels.rs):
// the GQA-aware decode kernel, optionally split over the keys (its last split block merging
// the partial results), and the tiled prefill kernel.

#define ATTN_WARPS 8
#define ATTN_HEADS 4  // query heads of one KV head per block
#define ATTN_KEYS 4   // keys a warp loads at once (independent loads in flight)

// The query heads block (·, c) serves: up to ATTN_HEADS of KV head kvh's group, from h0.
struct HeadGroup {
    int kvh, h0, heads;
};

__device__ __forceinline__ HeadGroup head_group(int n_heads, int n_kv_heads) {
    int group = n_heads / n_kv_heads;
    int chunks = (group + ATTN_HEADS - 1) / ATTN_HEADS;
    HeadGroup g;
    g.kvh = blockIdx.y / chunks;
    g.h0 = g.kvh * group + (blockIdx.y % chunks) * ATTN_HEADS;
    g.heads = min(ATTN_HEADS, (g.kvh + 1) * group - g.h0);
    return g;
}

// What query head h's sink adds to the denominator of a softmax whose sum is relative to its
// maximum m: exp(sink - m), or 0 without sinks. A sink is a logit with no value (gpt-oss): the
// weights sum to less than one, as the CPU backend's softmax_with_sink. Added once, at the
// end, it leaves the online softmax's walk over the keys as it is.
__device__ __forceinline__ float sink_share(const float* sinks, int h, float m) {
    return sinks ? __expf(sinks[h] - m) : 0.0f;
}

#define ATTN_MAX_SPLITS 64  // MAX_SPLITS in attention_split.rs: lanes 0..63 of a warp's two passes

// Each split's share of one (token, head)'s output from the records of its `splits` split-K
// blocks ({max, sum, unnormalised accumulator[head_dim]} each), by one warp: the split's sum
// rescaled to the largest maximum, over the rescaled sums' total. Every (max, sum) pair is
// read at once (a lane per split), not one after another. Empty splits (sum 0) weigh 0; the
// first split always holds the token itself. The head's sink (NEG_INF: none) joins the total.
__device__ void split_weights(const volatile float* rec, int splits, int head_dim, float sink,
                              float* weight) {
    int lane = threadIdx.x & 31, stride = head_dim + 2;
    float ms[2], ls[2], m_all = NEG_INF;
#pragma unroll
    for (int i = 0; i < 2; i++) {
        int s = lane + 32 * i;
        ms[i] = s < splits ? rec[s * stride] : NEG_INF;
        ls[i] = s < splits ? rec[s * stride + 1] : 0.0f;
        if (ls[i] > 0.0f) m_all = fmaxf(m_all, ms[i]);
    }
    m_all = warp_max(m_all);
    float f[2];
#pragma unroll
    for (int i = 0; i < 2; i++) f[i] = ls[i] > 0.0f ? __expf(ms[i] - m_all) : 0.0f;
    float l_all = warp_sum(ls[0] * f[0] + ls[1] * f[1]) + __expf(sink - m_all);
#pragma unroll
    for (int i = 0; i < 2; i++)
        if (lane + 32 * i < splits) weight[lane + 32 * i] = f[i] / l_all;
}

// The RoPE angles of a decode token, once for its attention block (one pair per thread, not
// one per element per warp).
template <int DIMS>
struct RopeAngles {
    float cos[DIMS * 16], sin[DIMS * 16];
};

// What a decode step's attention block prepares itself when qkv_prepare did not run before
// it (see paged_attention_t): qkv_prepare's work for the block's query heads and its KV head,
// one warp per head — bias, the per-head norm (same order of sums as ordered_sum), RoPE by
// `angles` (stored by the block before its wait) — into `prepared` (shared memory: the query
// heads, then K, then V); with `k_dst`/`v_dst` the K and V rows are also stored in the cache.
// The same arithmetic as qkv_prepare, so the same bits.
template <int DIMS>
__device__ void attention_prepare(const float* row, const HeadGroup& hg, int n_heads,
                                  int n_kv_heads, int head_dim, const float* bias,
                                  const float* q_norm, const float* k_norm,
                                  const RopeAngles<DIMS>& angles, int style, float eps,
                                  float (*prepared)[DIMS * 32], bf16* k_dst, bf16* v_dst) {
    __syncthreads();  // the angles
    int half = head_dim / 2;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (warp > hg.heads + 1) return;
    bool is_v = warp == hg.heads + 1, is_k = warp == hg.heads;
    int h = is_v ? n_heads + n_kv_heads + hg.kvh : is_k ? n_heads + hg.kvh : hg.h0 + warp;
    float x[DIMS];
#pragma unroll
    for (int r = 0; r < DIMS; r++) {
        int d = lane + 32 * r;
        x[r] = d < head_dim ? row[(size_t)h * head_dim + d] : 0.0f;
        if (bias && d < head_dim) x[r] += bias[h * head_dim + d];
    }
    if (is_v) {
#pragma unroll
        for (int r = 0; r < DIMS; r++) {
            int d = lane + 32 * r;
            if (d < head_dim && v_dst) v_dst[d] = f32_to_bf16(x[r]);
        }
        return;
    }
    const float* norm = is_k ? k_norm : q_norm;
    if (norm) {
        // ordered_sum's order for a head (under SUM_SLOTS long): each 32 elements by
        // warp_sum, then those sums by warp_sum.
        float group = 0.0f;
#pragma unroll
        for (int r = 0; r < DIMS; r++) {
            int d = lane + 32 * r;
            float s = warp_sum(d < head_dim ? x[r] * x[r] : 0.0f);
            if (lane == r) group = s;
        }
        float ss = warp_sum(lane < (head_dim + 31) / 32 ? group : 0.0f);
        float inv = rsqrtf(ss / head_dim + eps);
#pragma unroll
        for (int r = 0; r < DIMS; r++) {
            int d = lane + 32 * r;
            if (d < head_dim) x[r] = x[r] * inv * norm[d];
        }
    }
    float* hv = prepared[warp];
#pragma unroll
    for (int r = 0; r < DIMS; r++)
        if (lane + 32 * r < head_dim) hv[lane + 32 * r] = x[r];
    __syncwarp();
#pragma unroll
    for (int r = 0; r < DIMS; r++) {
        int d = lane + 32 * r;
        if (d >= head_dim) continue;
        RopePair p = rope_pair(d, half, style);
        float c = angles.cos[p.i], s = angles.sin[p.i];
        float x0 = hv[p.a], x1 = hv[p.b];
        x[r] = d == p.a ? rope_first(x0, x1, c, s) : rope_second(x0, x1, c, s);
    }
    __syncwarp();
#pragma unroll
    for (int r = 0; r < DIMS; r++) {
        int d = lane + 32 * r;
        if (d >= head_dim) continue;
        hv[d] = x[r];
        if (is_k && k_dst) k_dst[d] = f32_to_bf16(x[r]);
    }
}

// Causal attention over the paged KV cache. Block (t, c, s) serves query token t, query heads
// c·ATTN_HEADS.. of one KV head (GQA: each key and value row is read once for all of them),
// and the s-th `partition` keys of the token's range (split-K: a long context of a few
// sequences spreads over many blocks). Each warp walks every ATTN_WARPS-th key, ATTN_KEYS of
// them per iteration (their rows loaded together, so that a short decode is not a chain of
// one memory latency per key), with an online softmax; then the warps merge. With one split
// the block writes the normalised bf16 output; with several it writes (max, sum,
// unnormalised accumulator) to `partial`, and the last split block to finish merges them
// (`split_counters`: one zeroed int per (decode row, head group)). DIMS = head_dim
// rounded up to whole warps / 32 (the paged_attention_<DIMS> kernels below).
// Serves the tokens `rows` lists (all when null): decode tokens, one per sequence; prompt
// tokens go through paged_prefill below. With `inv_freq` (a decode step with no prompt
// tokens) qkv_prepare has not run: each block prepares its own query heads and KV head
// (attention_prepare), and every block whose keys end at the token stores its K and V row
// in the cache at `slots[t]` before reading keys (the blocks of one KV head store the same
// bits) — one launch fewer per layer. With `sinks` (a logit per query head) each head's sink
// joins its softmax's denominator where the output is normalised (sink_share).
template <int DIMS>
__device__ void paged_attention_t(
    const float* qkv, int qkv_width, bf16* k_cache, bf16* v_cache, const int* block_tables,
    int max_blocks, const int* token_seq, const int* positions, bf16* out, float* partial,
    int* split_counters, int n_heads, int n_kv_heads, int head_dim, int block_size, float scale,
    float softcap, const float* sinks, int window, int partition, const int* rows,
    const float* bias, const float* q_norm, const float* k_norm, const double* inv_freq,
    const int* slots, float eps, int style, int prefetch_keys) {
    // Before the wait, what depends only on the step's inputs (which no kernel writes: the host
    // copies them before the step's first kernel): the token's keys and its RoPE angles, and
    // L2 asked for the K and V rows of the range's first `prefetch_keys` keys. With an early
    // start this overlaps the product that writes the query.
    int t = rows ? rows[blockIdx.x] : (int)blockIdx.x;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    HeadGroup hg = head_group(n_heads, n_kv_heads);
    int kvh = hg.kvh, h0 = hg.h0, heads = hg.heads;
    int kv_dim = n_kv_heads * head_dim;
    int pos = positions[t];
    int lo = window > 0 ? max(0, pos + 1 - window) : 0;
    long long first = (long long)lo + (long long)blockIdx.z * partition;
    int begin = (int)min(first, (long long)pos + 1);
    int end = (int)min(first + partition, (long long)pos + 1);
    const int* table = block_tables + (size_t)token_seq[t] * max_blocks;
    __shared__ RopeAngles<DIMS> angles;
    if (inv_freq)
        for (int i = threadIdx.x; i < head_dim / 2; i += blockDim.x)
            rope_angle(pos, inv_freq[i], &angles.cos[i], &angles.sin[i]);
    if (head_dim % 8 == 0) {
        unsigned int row_bytes = (unsigned int)head_dim * 2;
        for (int j = begin + threadIdx.x; j < min(end, begin + prefetch_keys); j += blockDim.x) {
            size_t slot = (size_t)table[j / block_size] * block_size + (j % block_size);
            size_t row = slot * kv_dim + (size_t)kvh * head_dim;
            l2_prefetch(k_cache + row, row_bytes);
            l2_prefetch(v_cache + row, row_bytes);
        }
    }
    grid_dependency_sync();
    const float* q = qkv + (size_t)t * qkv_width + (size_t)h0 * head_dim;
    int q_stride = head_dim;
    __shared__ float prepared[ATTN_HEADS + 2][DIMS * 32];
    if (inv_freq) {
        bool holds_token = begin <= pos && pos < end;
        size_t at = (size_t)slots[t] * kv_dim + (size_t)kvh * head_dim;
        attention_prepare<DIMS>(qkv + (size_t)t * qkv_width, hg, n_heads, n_kv_heads, head_dim,
                                bias, q_norm, k_norm, angles, style, eps, prepared,
                                holds_token ? k_cache + at : nullptr,
                                holds_token ? v_cache + at : nullptr);
        __syncthreads();  // the prepared heads, and the token's K and V row in the cache
        q = &prepared[0][0];
        q_stride = DIMS * 32;
    }

    float qr[ATTN_HEADS][DIMS], acc[ATTN_HEADS][DIMS];
    float m[ATTN_HEADS], l[ATTN_HEADS];
#pragma unroll
    for (int g = 0; g < ATTN_HEADS; g++) {
        m[g] = NEG_INF;
        l[g] = 0.0f;
#pragma unroll
        for (int r = 0; r < DIMS; r++) {
            int d = lane + 32 * r;
            qr[g][r] = g < heads && d < head_dim ? q[g * q_stride + d] * scale : 0.0f;
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
            // One online-softmax update for the iteration's keys together: one maximum and one
            // rescale, not a chain of ATTN_KEYS dependent ones (key j0 always exists).
            float m_new = m[g];
#pragma unroll
            for (int u = 0; u < ATTN_KEYS; u++) {
                s[u] = warp_sum(s[u]);
                if (softcap > 0.0f) s[u] = softcap * tanhf(s[u] / softcap);
                if (j0 + u * ATTN_WARPS < end) m_new = fmaxf(m_new, s[u]);
            }
            float correction = __expf(m[g] - m_new);
            float p[ATTN_KEYS], p_sum = 0.0f;
#pragma unroll
            for (int u = 0; u < ATTN_KEYS; u++) {
                p[u] = j0 + u * ATTN_WARPS < end ? __expf(s[u] - m_new) : 0.0f;
                p_sum += p[u];
            }
            l[g] = l[g] * correction + p_sum;
#pragma unroll
            for (int r = 0; r < DIMS; r++) {
                float v = acc[g][r] * correction;
#pragma unroll
                for (int u = 0; u < ATTN_KEYS; u++) v += p[u] * vf[u][r];
                acc[g][r] = v;
            }
            m[g] = m_new;
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
            out[((size_t)t * n_heads + h) * head_dim + d] =
                f32_to_bf16(sum / (l_all + sink_share(sinks, h, m_all)));
        } else {
            // Records by the block's place in the launch (the decode rows), not by token row.
            float* rec = partial +
                         (((size_t)blockIdx.x * n_heads + h) * splits + blockIdx.z) * (head_dim + 2);
            if (d == 0) {
                rec[0] = m_all;
                rec[1] = l_all;
            }
            rec[2 + d] = sum;
        }
    }
    if (splits == 1) return;

    // The last of the (token, head group)'s split blocks to finish merges them all: a warp per
    // head weighs the splits, then each output dimension sums its splits' accumulators (loads
    // that do not wait for one another).
    int* counter = split_counters + (size_t)blockIdx.x * gridDim.y + blockIdx.y;
    if (!last_block(counter, splits)) return;
    __shared__ float weight[ATTN_HEADS][ATTN_MAX_SPLITS];
    // Volatile: other blocks' records, never through this SM's L1.
    const volatile float* recs = partial + ((size_t)blockIdx.x * n_heads + h0) * splits * (head_dim + 2);
    if (warp < heads)
        split_weights(recs + (size_t)warp * splits * (head_dim + 2), splits, head_dim,
                      sinks ? sinks[h0 + warp] : NEG_INF, weight[warp]);
    __syncthreads();
    for (int i = threadIdx.x; i < heads * head_dim; i += blockDim.x) {
        int g = i / head_dim, d = i - g * head_dim;
        const volatile float* acc_d = recs + (size_t)g * splits * (head_dim + 2) + 2 + d;
        float sum = 0.0f;
#pragma unroll 4
        for (int s = 0; s < splits; s++) sum += acc_d[(size_t)s * (head_dim + 2)] * weight[g][s];
        out[((size_t)t * n_heads + h0 + g) * head_dim + d] = f32_to_bf16(sum);
    }
}

#define PREFILL_TOKENS 8  // consecutive prompt tokens per block: one per warp
#define KEY_TILE 32        // keys per shared-memory tile: one per lane

// Causal attention for runs of consecutive prompt tokens of one sequence (a prefill chunk,
// attending to the cached prefix and to the chunk's earlier tokens, which qkv_prepare wrote
// first). Block (i, c) serves tiles[i] = {first row, count <= PREFILL_TOKENS}, one token per
// warp, and query heads c·ATTN_HEADS.. of one KV head. Keys come in tiles of KEY_TILE rows
// through shared memory, loaded once for the block's tokens and heads; within a tile each lane
// scores one key (a whole dot product: no reduction per key), then one max and one sum over
// the warp update the online softmax, and the weights go through shared memory for the
// weighted sum of V, whose dimensions the lanes share.
template <int DIMS>
__device__ void paged_prefill_t(
    const float* qkv, int qkv_width, const bf16* k_cache, const bf16* v_cache,
    const int* block_tables, int max_blocks, const int* token_seq, const int* positions,
    bf16* out, int n_heads, int n_kv_heads, int head_dim, int block_size, float scale,
    float softcap, const float* sinks, int window, const int* tiles) {
    grid_dependency_sync();
    // K rows padded by one 32-bit word: lanes reading row `lane` at the same column hit
    // distinct banks.
    __shared__ unsigned int ks[KEY_TILE][DIMS * 16 + 1];
    __shared__ bf16 vs[KEY_TILE][DIMS * 32];
    __shared__ float pw[PREFILL_TOKENS][KEY_TILE];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int first_row = tiles[2 * blockIdx.x], count = tiles[2 * blockIdx.x + 1];
    HeadGroup hg = head_group(n_heads, n_kv_heads);
    int kvh = hg.kvh, h0 = hg.h0, heads = hg.heads;
    int kv_dim = n_kv_heads * head_dim;
    int words = head_dim / 2;  // head_dim is even
    const int* table = block_tables + (size_t)token_seq[first_row] * max_blocks;
    int first_pos = positions[first_row], last_pos = positions[first_row + count - 1];
    bool active = warp < count;
    int t = first_row + (active ? warp : 0);
    int pos = positions[t];
    int lo = window > 0 ? max(0, pos + 1 - window) : 0;
    int block_lo = window > 0 ? max(0, first_pos + 1 - window) : 0;
    const float* q = qkv + (size_t)t * qkv_width + (size_t)h0 * head_dim;

    float acc[ATTN_HEADS][DIMS], m[ATTN_HEADS], l[ATTN_HEADS];
#pragma unroll
    for (int g = 0; g < ATTN_HEADS; g++) {
        m[g] = NEG_INF;
        l[g] = 0.0f;
#pragma unroll
        for (int r = 0; r < DIMS; r++) acc[g][r] = 0.0f;
    }
    for (int k0 = block_lo; k0 <= last_pos; k0 += KEY_TILE) {
        // The tile's K and V rows, 32 bits at a time, by the whole block.
        for (int i = threadIdx.x; i < KEY_TILE * words; i += blockDim.x) {
            int key = i / words, w = i - key * words, j = k0 + key;
            unsigned int kw = 0, vw = 0;
            if (j <= last_pos) {
                size_t slot = (size_t)table[j / block_size] * block_size + (j % block_size);
                size_t at = (slot * kv_dim + (size_t)kvh * head_dim) / 2 + w;
                kw = ((const unsigned int*)k_cache)[at];
                vw = ((const unsigned int*)v_cache)[at];
            }
            ks[key][w] = kw;
            ((unsigned int*)vs[key])[w] = vw;
        }
        __syncthreads();
        int j = k0 + lane;  // this lane's key
        bool valid = active && j >= lo && j <= pos;
        if (active && k0 <= pos && k0 + KEY_TILE > lo) {
#pragma unroll
            for (int g = 0; g < ATTN_HEADS; g++) {
                if (g >= heads) break;
                const float* qg = q + g * head_dim;
                float s = 0.0f;
                for (int w = 0; w < words; w++) {
                    unsigned int kw = ks[lane][w];
                    s += qg[2 * w] * __uint_as_float(kw << 16) +
                         qg[2 * w + 1] * __uint_as_float(kw & 0xffff0000u);
                }
                s *= scale;
                if (softcap > 0.0f) s = softcap * tanhf(s / softcap);
                if (!valid) s = NEG_INF;
                float m_new = fmaxf(m[g], warp_max(s));
                float correction = __expf(m[g] - m_new);
                float p = valid ? __expf(s - m_new) : 0.0f;
                l[g] = l[g] * correction + warp_sum(p);
                pw[warp][lane] = p;
                __syncwarp();
#pragma unroll
                for (int r = 0; r < DIMS; r++) {
                    int d = lane + 32 * r;
                    float sum = 0.0f;
                    if (d < head_dim)
                        for (int k = 0; k < KEY_TILE; k++) sum += pw[warp][k] * bf16_to_f32(vs[k][d]);
                    acc[g][r] = acc[g][r] * correction + sum;
                }
                m[g] = m_new;
                __syncwarp();
            }
        }
        __syncthreads();
    }
    if (!active) return;
#pragma unroll
    for (int g = 0; g < ATTN_HEADS; g++) {
        if (g >= heads) break;
        bf16* o = out + ((size_t)t * n_heads + h0 + g) * head_dim;
        float total = l[g] + sink_share(sinks, h0 + g, m[g]);
#pragma unroll
        for (int r = 0; r < DIMS; r++)
            if (lane + 32 * r < head_dim) o[lane + 32 * r] = f32_to_bf16(acc[g][r] / total);
    }
}

#define PAGED_ATTENTION(DIMS)                                                                   \
    extern "C" __global__ void paged_attention_##DIMS(                                          \
        const float* qkv, int qkv_width, bf16* k_cache, bf16* v_cache, const int* block_tables, \
        int max_blocks, const int* token_seq, const int* positions, bf16* out, float* partial,  \
        int* split_counters, int n_heads, int n_kv_heads, int head_dim, int block_size,         \
        float scale, float softcap, const float* sinks, int window, int partition,              \
        const int* rows, const float* bias, const float* q_norm, const float* k_norm,           \
        const double* inv_freq, const int* slots, float eps, int style, int prefetch_keys) {    \
        paged_attention_t<DIMS>(qkv, qkv_width, k_cache, v_cache, block_tables, max_blocks,     \
                                token_seq, positions, out, partial, split_counters, n_heads,    \
                                n_kv_heads, head_dim, block_size, scale, softcap, sinks,        \
                                window, partition, rows, bias, q_norm, k_norm, inv_freq, slots, \
                                eps, style, prefetch_keys);                                     \
    }                                                                                           \
    extern "C" __global__ void paged_prefill_##DIMS(                                            \
        const float* qkv, int qkv_width, const bf16* k_cache, const bf16* v_cache,              \
        const int* block_tables, int max_blocks, const int* token_seq, const int* positions,    \
        bf16* out, int n_heads, int n_kv_heads, int head_dim, int block_size, float scale,      \
        float softcap, const float* sinks, int window, const int* tiles) {                      \
        paged_prefill_t<DIMS>(qkv, qkv_width, k_cache, v_cache, block_tables, max_blocks,       \
                              token_seq, positions, out, n_heads, n_kv_heads, head_dim,         \
                              block_size, scale, softcap, sinks, window, tiles);                \
    }

PAGED_ATTENTION(1)
PAGED_ATTENTION(2)
PAGED_ATTENTION(4)
PAGED_ATTENTION(8)
