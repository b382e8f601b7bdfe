// Prefill attention on the tensor cores (mma.sync, sm_80+): the same causal attention over a
// paged cache as paged_prefill (attention.cu), for head_dim a multiple of 16 up to 256, in
// the FlashAttention-2 shape. Block (i, c) serves tiles[i] = {first row, count <=
// MMA_TOKENS} of one sequence and query heads c·ATTN_HEADS.. of one KV head, one warp per
// head: the warp's 16 tokens are the rows of every m16n8k16 product. Keys come in tiles of
// MMA_KEYS through shared memory (K as rows, V transposed), loaded once for all the heads.
// Per tile a warp computes S = Q·Kᵀ, updates the online softmax in registers (a row's
// values are spread over the 4 lanes of a quad), and adds P·V, P's registers being exactly
// the A fragments the second product needs.
//
// Precision: K and V are bf16 already. Q (f32) is split into a bf16 high part and a bf16
// remainder and both multiply, so scores carry ~16 bits of mantissa: an error in a score is
// an error in the exponent of its weight, and trained models' scores reach the tens, where
// Q in bf16 alone would be off by per cents (the emulator test has such a case). P is
// rounded to bf16 once, as FlashAttention does: its error is of the order of V's own bf16
// rounding and of the output's.

#define MMA_TOKENS 16  // prompt tokens per block: the M of every product
#define MMA_KEYS 32    // keys per shared-memory tile

// D += A·B for one m16n8k16 tile: A 16×16 bf16 (row major), B 16×8 bf16 (column major), D
// 16×8 f32. Lane l = 4g + q holds A[g | g+8][2q, 2q+1 | +8] in a[0..3] (a0: row g, a1: row
// g+8, a2/a3: the same rows 8 columns on), B[2q, 2q+1 | +8][g] in b[0..1], and D[g | g+8]
// [2q, 2q+1] in d[0..3]; the lower column (or B row) in a register's low half (PTX ISA,
// "Matrix Fragments for mma.m16n8k16 with floating point type"). The emulator implements the
// same contract.
#ifndef FALLOW_EMULATOR
__device__ __forceinline__ void mma_bf16_16816(float d[4], const unsigned int a[4],
                                               const unsigned int b[2]) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#endif

// Two values split into two bf16 pairs: `hi` their rounding, `lo` what it left out (rounded
// too), so that hi + lo is x to ~16 bits.
__device__ __forceinline__ void split_pair(float x0, float x1, unsigned int& hi, unsigned int& lo) {
    hi = bf16_pair(x0, x1);
    lo = bf16_pair(x0 - bf16_to_f32((bf16)(hi & 0xffffu)), x1 - bf16_to_f32((bf16)(hi >> 16)));
}

// This lane's A fragment of Q's 16-dimension chunk c (rows: tokens g and g + 8 of the
// tile, of query head `head`), split in high and low bf16 parts; rows past `count` and
// dimensions past head_dim are zeros.
__device__ __forceinline__ void q_fragment(const float* qkv, int qkv_width, int first_row,
                                           int count, int head, int head_dim, int c,
                                           unsigned int hi[4], unsigned int lo[4]) {
    int lane = threadIdx.x & 31, g = lane >> 2, q4 = lane & 3;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int t = g + ((i & 1) ? 8 : 0);
        int d = c * 16 + 2 * q4 + ((i & 2) ? 8 : 0);
        float x0 = 0.0f, x1 = 0.0f;
        if (t < count && d < head_dim) {
            const float* src = qkv + (size_t)(first_row + t) * qkv_width + (size_t)head * head_dim + d;
            x0 = src[0];
            x1 = src[1];
        }
        split_pair(x0, x1, hi[i], lo[i]);
    }
}

// DIMS = head_dim / 32 rounded up (1, 2, 4 or 8): head_dim is a multiple of 16 and at most
// DIMS·32; Q, K and V past head_dim are zeros.
template <int DIMS>
__device__ void paged_prefill_mma_t(
    const float* qkv, int qkv_width, const bf16* k_cache, const bf16* v_cache,
    const int* block_tables, int max_blocks, const int* token_seq, const int* positions,
    bf16* out, int n_heads, int n_kv_heads, int head_dim, int block_size, float scale,
    float softcap, const float* sinks, int window, const int* tiles) {
    grid_dependency_sync();
    constexpr int CHUNKS = DIMS * 2;          // 16-dimension steps of Q·Kᵀ
    constexpr int DIM_TILES = DIMS * 4;       // 8-dimension column tiles of P·V
    constexpr int KEY_TILES = MMA_KEYS / 8;   // 8-key column tiles of Q·Kᵀ
    constexpr int WORDS = DIMS * 16;          // bf16 pairs in a K row
    constexpr int UNITS = WORDS / 4;          // 16-byte loads in a K or V row
    // Row strides (in words) that put a fragment read's 8 groups × 4 lanes on 32 distinct
    // banks.
    constexpr int K_STRIDE = WORDS + 4;
    constexpr int V_STRIDE = MMA_KEYS / 2 + 4;
    __shared__ unsigned int ks[MMA_KEYS][K_STRIDE];       // [key][dimension pair]
    __shared__ unsigned int vt[DIMS * 32][V_STRIDE];      // [dimension][key pair]
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int g = lane >> 2, q4 = lane & 3;
    int first_row = tiles[2 * blockIdx.x], count = tiles[2 * blockIdx.x + 1];
    HeadGroup hg = head_group(n_heads, n_kv_heads);
    int kv_dim = n_kv_heads * head_dim;
    bool active = warp < hg.heads;
    int head = hg.h0 + (active ? warp : 0);
    const int* table = block_tables + (size_t)token_seq[first_row] * max_blocks;
    int first_pos = positions[first_row], last_pos = positions[first_row + count - 1];
    int block_lo = window > 0 ? max(0, first_pos + 1 - window) : 0;

    // This lane's two rows: tokens g and g + 8 of the tile (pos -1: past the tile, no keys).
    int pos[2], lo[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int t = g + 8 * r;
        pos[r] = t < count ? positions[first_row + t] : -1;
        lo[r] = window > 0 ? max(0, pos[r] + 1 - window) : 0;
    }

    // Q's A fragments, high and low parts: held for the whole key loop up to 128
    // dimensions; at 256 the output accumulators need those registers, and each tile reads
    // the fragments again (from L1 after the first tile).
    constexpr bool Q_HELD = DIMS <= 4;
    unsigned int qh[Q_HELD ? CHUNKS : 1][4], ql[Q_HELD ? CHUNKS : 1][4];
    if constexpr (Q_HELD) {
#pragma unroll
        for (int c = 0; c < CHUNKS; c++)
            q_fragment(qkv, qkv_width, first_row, active ? count : 0, head, head_dim, c, qh[c],
                       ql[c]);
    }

    float o[DIM_TILES][4], m[2] = {NEG_INF, NEG_INF}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < DIM_TILES; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) o[j][i] = 0.0f;

    for (int k0 = block_lo; k0 <= last_pos; k0 += MMA_KEYS) {
        // The tile's K rows and V columns, 16 bytes at a time, consecutive threads on
        // consecutive keys (so that the transposed V stores spread over the banks).
        for (int i = threadIdx.x; i < MMA_KEYS * UNITS; i += blockDim.x) {
            int key = i % MMA_KEYS, u = i / MMA_KEYS, j = k0 + key;
            uint4 kw = make_uint4(0, 0, 0, 0), vw = make_uint4(0, 0, 0, 0);
            if (j <= last_pos && u * 8 < head_dim) {
                size_t slot = (size_t)table[j / block_size] * block_size + (j % block_size);
                size_t at = (slot * kv_dim + (size_t)(hg.kvh * head_dim)) / 8 + u;
                kw = ((const uint4*)k_cache)[at];
                vw = ((const uint4*)v_cache)[at];
            }
            ks[key][4 * u] = kw.x;
            ks[key][4 * u + 1] = kw.y;
            ks[key][4 * u + 2] = kw.z;
            ks[key][4 * u + 3] = kw.w;
            unsigned int words[4] = {vw.x, vw.y, vw.z, vw.w};
#pragma unroll
            for (int w = 0; w < 4; w++) {
                ((bf16*)vt[8 * u + 2 * w])[key] = (bf16)(words[w] & 0xffffu);
                ((bf16*)vt[8 * u + 2 * w + 1])[key] = (bf16)(words[w] >> 16);
            }
        }
        __syncthreads();
        if (active) {
            // S = Q·Kᵀ over the tile's keys, 16 dimensions at a time.
            float s[KEY_TILES][4];
#pragma unroll
            for (int n = 0; n < KEY_TILES; n++)
#pragma unroll
                for (int i = 0; i < 4; i++) s[n][i] = 0.0f;
#pragma unroll
            for (int c = 0; c < CHUNKS; c++) {
                unsigned int* hi = qh[Q_HELD ? c : 0];
                unsigned int* lo = ql[Q_HELD ? c : 0];
                if constexpr (!Q_HELD)
                    q_fragment(qkv, qkv_width, first_row, count, head, head_dim, c, hi, lo);
#pragma unroll
                for (int n = 0; n < KEY_TILES; n++) {
                    unsigned int b[2] = {ks[n * 8 + g][c * 8 + q4], ks[n * 8 + g][c * 8 + 4 + q4]};
                    mma_bf16_16816(s[n], hi, b);
                    mma_bf16_16816(s[n], lo, b);
                }
            }
            // Scale, cap, mask; the tile's maximum per row (over the quad's lanes).
            float tile_max[2] = {NEG_INF, NEG_INF};
#pragma unroll
            for (int n = 0; n < KEY_TILES; n++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    int r = i >> 1, j = k0 + n * 8 + 2 * q4 + (i & 1);
                    float v = s[n][i] * scale;
                    if (softcap > 0.0f) v = softcap * tanhf(v / softcap);
                    if (j < lo[r] || j > pos[r]) v = NEG_INF;
                    s[n][i] = v;
                    tile_max[r] = fmaxf(tile_max[r], v);
                }
            float correction[2], base[2];
#pragma unroll
            for (int r = 0; r < 2; r++) {
                tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
                tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
                float m_new = fmaxf(m[r], tile_max[r]);
                // A row with no key yet keeps everything at 0 (no inf - inf).
                base[r] = m_new == NEG_INF ? 0.0f : m_new;
                correction[r] = __expf(m[r] - base[r]);
                m[r] = m_new;
                l[r] *= correction[r];  // this lane's share of the row sum
            }
#pragma unroll
            for (int n = 0; n < KEY_TILES; n++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    int r = i >> 1;
                    float p = s[n][i] == NEG_INF ? 0.0f : __expf(s[n][i] - base[r]);
                    s[n][i] = p;
                    l[r] += p;
                }
#pragma unroll
            for (int j = 0; j < DIM_TILES; j++)
#pragma unroll
                for (int i = 0; i < 4; i++) o[j][i] *= correction[i >> 1];
            // O += P·V, 16 keys per step: key tiles 2k and 2k + 1 are P's A fragment.
#pragma unroll
            for (int k = 0; k < MMA_KEYS / 16; k++) {
                unsigned int p[4] = {bf16_pair(s[2 * k][0], s[2 * k][1]),
                                     bf16_pair(s[2 * k][2], s[2 * k][3]),
                                     bf16_pair(s[2 * k + 1][0], s[2 * k + 1][1]),
                                     bf16_pair(s[2 * k + 1][2], s[2 * k + 1][3])};
#pragma unroll
                for (int j = 0; j < DIM_TILES; j++) {
                    unsigned int b[2] = {vt[j * 8 + g][k * 8 + q4], vt[j * 8 + g][k * 8 + 4 + q4]};
                    mma_bf16_16816(o[j], p, b);
                }
            }
        }
        __syncthreads();
    }
    if (!active) return;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int t = g + 8 * r;
        if (t >= count) continue;
        float inv = 1.0f / (l[r] + sink_share(sinks, head, m[r]));
        bf16* dst = out + ((size_t)(first_row + t) * n_heads + head) * head_dim;
#pragma unroll
        for (int j = 0; j < DIM_TILES; j++) {
            int d = j * 8 + 2 * q4;
            if (d < head_dim) {
                dst[d] = f32_to_bf16(o[j][2 * r] * inv);
                dst[d + 1] = f32_to_bf16(o[j][2 * r + 1] * inv);
            }
        }
    }
}

#define PAGED_PREFILL_MMA(DIMS)                                                                 \
    extern "C" __global__ void paged_prefill_mma_##DIMS(                                          \
        const float* qkv, int qkv_width, const bf16* k_cache, const bf16* v_cache,              \
        const int* block_tables, int max_blocks, const int* token_seq, const int* positions,    \
        bf16* out, int n_heads, int n_kv_heads, int head_dim, int block_size, float scale,      \
        float softcap, const float* sinks, int window, const int* tiles) {                      \
        paged_prefill_mma_t<DIMS>(qkv, qkv_width, k_cache, v_cache, block_tables, max_blocks,   \
                                  token_seq, positions, out, n_heads, n_kv_heads, head_dim,     \
                                  block_size, scale, softcap, sinks, window, tiles);            \
    }

PAGED_PREFILL_MMA(1)
PAGED_PREFILL_MMA(2)
PAGED_PREFILL_MMA(4)
PAGED_PREFILL_MMA(8)
