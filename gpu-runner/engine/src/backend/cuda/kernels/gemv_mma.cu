// Decode GEMV on the tensor cores (appended to kernels.cu at compile time, after
// prefill_mma.cu's mma_bf16_16816; sm_80+): the same product, arguments and forms as
// gemv_t's bf16 variants (plain, GLU output, a NormAfter end, L2 asked for the rows), in
// m16n8k16 tiles. With a few token rows the CUDA-core GEMV spends ~n FMAs plus conversions
// per weight and lane (at 8 rows the instructions, not the memory, set its pace); one mma
// does 16 rows × 8 token rows × 16 inputs.
//
// A tile is 16 weight rows, walked over K in steps of 32 inputs (by one warp, or split over
// a block's warps, see gemv_mma_t). Lane l = 4g + q loads 16 bytes
// (8 inputs) of rows g and g + 8 and of x's token row g, at inputs 8q..8q+7 of the step, and
// feeds them to two mmas as they are: a dot product may take its terms in any order, so the
// fragments' 16 "columns" of the first mma are the step's inputs 8q + {0,1,2,3} of every q
// (in A's and B's registers alike) and the second's 8q + {4,5,6,7}. No shuffles, no shared
// memory for x (it stays in L1: every warp of the block reads the same bytes), and a warp's
// weight load is 8 rows × 64 contiguous bytes.

#define MMA_ROWS 16  // weight rows of a tile (MMA_TILE_ROWS in gemv_tune.rs)
#define MMA_STEP 32  // inputs per step: two m16n8k16 (MMA_STEP in gemv_tune.rs)

// The row this lane loads for row r (0..15) of the tile from row `first` (`offset` rows on:
// a GLU pair's up rows), and whether it is the matrix's: rows past `last` read row `last`
// (their sums unused).
struct MmaRow {
    const uint4* at;
    bool real;
};

__device__ __forceinline__ MmaRow mma_row(const bf16* w, int K, int first, int r, int last,
                                          int offset, int q) {
    int row = first + r;
    MmaRow m;
    m.real = row <= last;
    m.at = (const uint4*)(w + (size_t)(offset + min(row, last)) * K) + q;
    return m;
}

// out[j·ldo + m] = x[j] · w[m] (or with `glu` >= 0, bf16 act(gate)·up from paired tiles of
// gate rows and the same up rows), `w` [M, K] bf16 with K a multiple of MMA_STEP, `x` [n, K]
// bf16, n <= 8. STEPS: steps whose loads are in flight per lane (the next pass's weights go
// out before the current ones are summed). Without KSPLIT each warp owns a tile of 16 rows
// and walks all of K (a GLU block: gate tiles in its first half of warps, the same up tiles
// in the second); with it the block's warps share one tile (a GLU block: half the warps the
// gate tile, half the up tile), each taking every `parts`-th pass of K, and sum their tiles
// through shared memory: a matrix of few rows (Llama-3 8B's output projection: 256 tiles)
// then still has warps enough to keep the memory busy.
template <int WARPS, int STEPS, bool KSPLIT>
__device__ void gemv_mma_t(const bf16* __restrict__ w, const bf16* __restrict__ x,
                           float* __restrict__ out, int M, int K, int n, int ldo,
                           GemvNorm norm, GemvL2 l2, int glu) {
    static_assert(WARPS % 2 == 0, "a GLU block pairs its two halves of warps");
    constexpr int HALF = WARPS / 2;
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    // The warp's tile (its first row; a GLU pair's gate rows run to F, its up rows F on),
    // and its share of K: passes part, part + parts, ...
    bool paired = glu >= 0;
    int group = paired ? HALF : WARPS;  // warps per half of the block that shares rows
    int in_group = paired ? warp % HALF : warp;
    int tile = KSPLIT ? blockIdx.x : blockIdx.x * group + in_group;
    int part = KSPLIT ? in_group : 0, parts = KSPLIT ? group : 1;
    int first = tile * MMA_ROWS, last = paired ? M / 2 - 1 : M - 1;
    int offset = paired && warp >= HALF ? M / 2 : 0;
    bool live = first <= last;
    MmaRow ra = mma_row(w, K, first, g, last, offset, q);
    MmaRow rb = mma_row(w, K, first, g + 8, last, offset, q);
    const uint4* xr = (const uint4*)(x + (size_t)min(g, n - 1) * K) + q;
    bool x_real = g < n;
    int steps = K / MMA_STEP;  // 16-byte pieces of a row per step: 4 (one per q)

    // This warp's first pass, requested before the wait.
    uint4 a[STEPS], b[STEPS];
#pragma unroll
    for (int s = 0; s < STEPS; s++) {
        int step = part * STEPS + s;
        a[s] = b[s] = make_uint4(0u, 0u, 0u, 0u);
        if (step < steps) {
            a[s] = __ldg(ra.at + 4 * step);
            b[s] = __ldg(rb.at + 4 * step);
        }
    }
    // L2 asked for the rows' next bytes up to `l2.before_wait` (at least `l2.ahead` past the
    // first passes), as gemv_t does, by the lanes with q = 0 (whose `at` is the row's start)
    // of the tile's first warp.
    constexpr unsigned int PASS_BYTES = STEPS * MMA_STEP * 2u;
    unsigned int row_bytes = (unsigned int)K * 2u;
    if (q == 0 && live && part == 0) {
        if (ra.real) l2.row_start(ra.at, parts * PASS_BYTES, row_bytes);
        if (rb.real) l2.row_start(rb.at, parts * PASS_BYTES, row_bytes);
    }
    grid_dependency_sync();
    // (Read after the barrier before the sums are written.)
    __shared__ float x_scales[GEMV_MAX_ROWS];
    gemv_load_scale(x_scales, norm, n);

    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int pass = part; pass * STEPS < steps; pass += parts) {
        uint4 xv[STEPS], na[STEPS], nb[STEPS];
#pragma unroll
        for (int s = 0; s < STEPS; s++) {
            int step = pass * STEPS + s, next = step + parts * STEPS;
            xv[s] = make_uint4(0u, 0u, 0u, 0u);
            if (step < steps && x_real) xv[s] = __ldg(xr + 4 * step);
            na[s] = nb[s] = make_uint4(0u, 0u, 0u, 0u);
            if (next < steps) {
                na[s] = __ldg(ra.at + 4 * next);
                nb[s] = __ldg(rb.at + 4 * next);
            }
        }
#pragma unroll
        for (int s = 0; s < STEPS; s++) {
            if (pass * STEPS + s < steps) {
                unsigned int lo_a[4] = {a[s].x, b[s].x, a[s].y, b[s].y}, lo_b[2] = {xv[s].x, xv[s].y};
                unsigned int hi_a[4] = {a[s].z, b[s].z, a[s].w, b[s].w}, hi_b[2] = {xv[s].z, xv[s].w};
                mma_bf16_16816(acc, lo_a, lo_b);
                mma_bf16_16816(acc, hi_a, hi_b);
            }
        }
        // L2 asked for one pass's bytes, `ahead` past the passes whose loads are out (this
        // warp's next one ends at pass + parts + 1: the tile's warps together ask for
        // consecutive ranges).
        if (l2.ahead > 0 && q == 0 && live) {
            unsigned int loaded = (unsigned int)(pass + parts + 1) * PASS_BYTES;
            if (ra.real) l2.row_ahead(ra.at, loaded, PASS_BYTES, row_bytes);
            if (rb.real) l2.row_ahead(rb.at, loaded, PASS_BYTES, row_bytes);
        }
#pragma unroll
        for (int s = 0; s < STEPS; s++) {
            a[s] = na[s];
            b[s] = nb[s];
        }
    }
    // This lane holds D[g | g + 8][2q, 2q + 1]: rows g and g + 8 for token rows 2q and 2q + 1.
    if (norm.x_scale) {
        __syncthreads();
#pragma unroll
        for (int i = 0; i < 4; i++) acc[i] *= x_scales[min(2 * q + (i & 1), GEMV_MAX_ROWS - 1)];
    }
    if (KSPLIT || paired) {
        // Through shared memory: the tile's parts summed in warp order, a GLU pair joined.
        __shared__ float tiles[WARPS][MMA_ROWS][8];
#pragma unroll
        for (int i = 0; i < 4; i++) tiles[warp][g + 8 * (i >> 1)][2 * q + (i & 1)] = acc[i];
        __syncthreads();
        // The warps that write: the block's first when its warps share a tile, else each gate
        // warp.
        bool writes = KSPLIT ? warp == 0 : warp < HALF;
        if (writes && live) {
            for (int i = lane; i < MMA_ROWS * n; i += 32) {
                int r = i % MMA_ROWS, j = i / MMA_ROWS;
                if (first + r > last) continue;
                float sum = 0.0f, up = 0.0f;
                for (int p = 0; p < parts; p++) {
                    sum += tiles[warp + p][r][j];
                    if (paired) up += tiles[warp + HALF + p][r][j];
                }
                if (paired)
                    ((bf16*)out)[(size_t)j * ldo + first + r] = gated(sum, up, glu);
                else
                    gemv_store(norm, out, ldo, M, j, first + r, sum);
            }
        }
        if (paired) return;
    } else {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int j = 2 * q + (i & 1);
            bool real = i < 2 ? ra.real : rb.real;
            if (j < n && real) gemv_store(norm, out, ldo, M, j, first + g + 8 * (i >> 1), acc[i]);
        }
    }
    gemv_end_norm(norm, out, ldo, M, n);
}

// gemv_mma_w<WARPS>s<STEPS>[k]: listed in gemv_tune.rs (GEMV_VARIANTS, no gated form); `k`:
// KSPLIT.
#define GEMV_MMA_NAMED(W, S, KSPLIT, SUFFIX)                                                     \
    extern "C" __global__ void gemv_mma_w##W##s##S##SUFFIX(                                      \
        const bf16* __restrict__ w, const bf16* __restrict__ x, float* __restrict__ out, int M,  \
        int K, int n, int ldo, GEMV_NORM_PARAMS, GEMV_L2_PARAMS, int glu) {                      \
        gemv_mma_t<W, S, KSPLIT>(w, x, out, M, K, n, ldo, GEMV_NORM, GEMV_L2, glu);              \
    }
#define GEMV_MMA(W, S)                 \
    GEMV_MMA_NAMED(W, S, false, )      \
    GEMV_MMA_NAMED(W, S, true, k)

GEMV_MMA(4, 2)
GEMV_MMA(4, 4)
GEMV_MMA(8, 2)
GEMV_MMA(8, 4)
