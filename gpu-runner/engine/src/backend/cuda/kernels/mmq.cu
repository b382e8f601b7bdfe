// Quantized matrices times a few dozen token rows on the int8 tensor cores (appended to
// kernels.cu at compile time, after quant.cu; sm_80+): the products QuantX::Int8 gives the
// batches too large for the GEMVs (9 to MMQ_MAX_ROWS rows), which otherwise expand the
// matrix to bf16 for cuBLAS and so move ~4.6 bytes per weight (the blocks read, 2 bytes
// written, 2 read again) where the blocks are ~0.56 for Q4. x is rounded to int8 per group
// of 32 exactly as the int8-x GEMVs round it (gemv_stage_x8), so a token row's products are
// the same integers either way; only the f32 sums' order differs.
//
// A block is MMQ_WARPS warps of 16 weight rows each over one slice of K (blockIdx.y; the
// partial sums of several slices are added by mmq_sum in slice order, so the result does not
// depend on which block finishes first). Per stage of MMQ_STAGE inputs the block stages x
// (every token row, as int8 with its groups' scales and sums) in shared memory once for all
// its warps; each warp then takes the stage's groups of 32 one at a time: its 16 rows' quants
// (a byte each, from the format's row type) are the A fragment of an m16n8k32 mma, and each
// tile of 8 token rows is a B fragment read from the staging. The mma's k order is the
// group's element order: lane 4g + q holds elements 4q..4q+3 and 16+4q..16+4q+3 of rows g
// and g + 8, which is where every format's quant words already put them (LegacyRows,
// Q8_0Rows, KQuantRows, Q6KRows). Q6_K's scales cover 16 elements: its groups take two mmas,
// one per half.

#define MMQ_WARPS 8        // warps per block, 16 weight rows each (MMQ_WARPS in gemm.rs)
#define MMQ_MAX_ROWS 64    // token rows (MMQ_MAX_ROWS in gemm.rs)
#define MMQ_STAGE 256      // inputs of x staged at a time (MMQ_STAGE in gemm.rs)
#define MMQ_STAGE_GROUPS 8  // MMQ_STAGE / 32
// A staged token row in uint4: MMQ_STAGE int8 values, then the stage's 8 scales and 16 sums.
#define MMQ_X_STRIDE ((MMQ_STAGE + MMQ_STAGE / 8 + MMQ_STAGE / 4) / 16)

// One warp's m16n8k32 product of signed bytes, D += A·B in s32 (PTX ISA, "Matrix Fragments
// for mma.m16n8k32"): lane 4g + q holds A's rows g (registers 0 and 2) and g + 8 (1 and 3)
// at columns 4q..4q+3 (registers 0, 1) and 16+4q..16+4q+3 (2, 3), a byte each in column
// order; B's column g at rows 4q..4q+3 (register 0) and 16+4q.. (1); D as mma_bf16_16816's.
// The emulator implements the same contract.
#ifndef FALLOW_EMULATOR
__device__ __forceinline__ void mma_s8_16832(int d[4], const unsigned int a[4],
                                             const unsigned int b[2]) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#endif

// A group of 32 weights of one row as lane q of a quad feeds the mma: its quants of elements
// 4q..4q+3 (lo) and 16+4q..16+4q+3 (hi), a byte each (0..63 unsigned or −128..127 signed:
// both fit s8), and the group's value d·q + m — or, for a format whose scales cover 16
// elements (MmqHalves), each half's: d[h]·q + m[h].
struct MmqGroup {
    unsigned int lo, hi;
    float d[2], m[2];
};

// Whether a row type's groups of 32 have a scale per half (Q6_K), which the kernel then
// takes as two mmas, each with the other half's quants zero.
template <class ROWS>
struct MmqHalves {
    static constexpr bool value = false;
};
template <>
struct MmqHalves<Q6KRows> {
    static constexpr bool value = true;
};

// Group G (of 32) of a legacy-format row: its block.
template <int FMT>
__device__ __forceinline__ MmqGroup mmq_group(const LegacyRows<FMT>& rows, int G, int q) {
    using R = LegacyRows<FMT>;
    const typename R::Raw r = rows.load(G);
    MmqGroup g;
    R::scale_min(r, &g.d[0], &g.m[0]);
    g.lo = R::quants(r, q, 0);
    g.hi = R::quants(r, q, 1);
    return g;
}

// Group G of a Q8_0 row: its block's two chunks of 16 signed quants.
__device__ __forceinline__ MmqGroup mmq_group(const Q8_0Rows& rows, int G, int q) {
    const Q8_0Rows::Raw a = rows.load(2 * G), b = rows.load(2 * G + 1);
    return MmqGroup{word_of(a.q, q), word_of(b.q, q), {f16_to_f32(a.d)}, {0.0f}};
}

// Group G of a Q4_K/Q5_K row: group j = 2p + s of super-block G / 8, whose elements 0..16 and
// 16..32 are chunks 2p and 2p + 1's half s (KQuantRows); value dg·q − mg.
template <int FMT>
__device__ __forceinline__ MmqGroup mmq_group(const KQuantRows<FMT>& rows, int G, int q) {
    using R = KQuantRows<FMT>;
    int j = G % 8, s = j % 2, c = G / 8 * 8 + j / 2 * 2;
    const typename R::Raw ra = rows.load(c), rb = rows.load(c + 1);
    float dg[2], mg[2];
    R::group_scales(ra, c, dg, mg);
    return MmqGroup{R::quants(ra, c, q, s), R::quants(rb, c + 1, q, s), {s ? dg[1] : dg[0]},
                    {-(s ? mg[1] : mg[0])}};
}

// Group G of a Q6_K row: elements 32·t .. 32·t + 32 of half h of super-block G / 8 (j = G % 8
// = 4h + t), whose two halves are quarter t of chunks 2h and 2h + 1 (Q6KRows), each with its
// own scale; value dsc·(q − 32).
__device__ __forceinline__ MmqGroup mmq_group(const Q6KRows& rows, int G, int q) {
    int j = G % 8, t = j % 4, c = G / 8 * 4 + j / 4 * 2;
    const Q6KRows::Raw ra = rows.load(c), rb = rows.load(c + 1);
    float da[4], db[4];
    Q6KRows::quarter_scales(ra, c, da);
    Q6KRows::quarter_scales(rb, c + 1, db);
    float d0 = t == 0 ? da[0] : t == 1 ? da[1] : t == 2 ? da[2] : da[3];
    float d1 = t == 0 ? db[0] : t == 1 ? db[1] : t == 2 ? db[2] : db[3];
    return MmqGroup{Q6KRows::quants(ra, q, t), Q6KRows::quants(rb, q, t), {d0, d1},
                    {-32.0f * d0, -32.0f * d1}};
}

// out[y·slice_stride + j·ldo + m] = the products of token rows j < n (bf16 x [n, K]) with
// rows m < M of `w` over groups [y·slice_groups, (y + 1)·slice_groups) of K (y = blockIdx.y;
// slice_groups a multiple of MMQ_STAGE_GROUPS), x rounded to int8 per group of 32.
template <class ROWS>
__device__ void mmq_t(const u8* __restrict__ w, const bf16* __restrict__ x,
                      float* __restrict__ out, int M, int K, int n, int ldo, int slice_groups,
                      long long slice_stride) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    int first = (blockIdx.x * MMQ_WARPS + warp) * 16;
    int g0 = blockIdx.y * slice_groups, g1 = min(K / 32, g0 + slice_groups);
    // Rows g and g + 8 of the warp's tile (rows past M read row M - 1: their sums unused).
    const ROWS ra(w, min(first + g, M - 1), M, K), rb(w, min(first + g + 8, M - 1), M, K);
    int tiles = (n + 7) / 8;
    __shared__ uint4 xs[MMQ_MAX_ROWS * MMQ_X_STRIDE];
    const unsigned char* staged = (const unsigned char*)xs;

    // A stage's weights of both rows, the first stage's requested before the wait.
    MmqGroup wa[MMQ_STAGE_GROUPS], wb[MMQ_STAGE_GROUPS];
    auto load_stage = [&](int s0) {
#pragma unroll
        for (int i = 0; i < MMQ_STAGE_GROUPS; i++)
            if (s0 + i < g1) {
                wa[i] = mmq_group(ra, s0 + i, q);
                wb[i] = mmq_group(rb, s0 + i, q);
            }
    };
    load_stage(g0);
    grid_dependency_sync();

    float acc[MMQ_MAX_ROWS / 8][4];
#pragma unroll
    for (int j = 0; j < MMQ_MAX_ROWS / 8; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[j][i] = 0.0f;
    for (int s0 = g0; s0 < g1; s0 += MMQ_STAGE_GROUPS) {
        int count = min(MMQ_STAGE_GROUPS, g1 - s0);
        __syncthreads();  // every warp is done with the previous stage's x
        gemv_stage_x8(xs, MMQ_X_STRIDE, x, K, 32 * s0, 32 * count, n, MMQ_STAGE);
        __syncthreads();
#pragma unroll
        for (int i = 0; i < MMQ_STAGE_GROUPS; i++) {
            if (i >= count) continue;
            const MmqGroup& ga = wa[i];
            const MmqGroup& gb = wb[i];
#pragma unroll
            for (int j = 0; j < MMQ_MAX_ROWS / 8; j++) {
                if (j >= tiles) continue;
                // B: token row 8j + g's elements of the group, as A's are laid out.
                const unsigned char* bx = staged + (size_t)min(8 * j + g, n - 1) * MMQ_X_STRIDE * 16;
                const unsigned int b[2] = {*(const unsigned int*)(bx + 32 * i + 4 * q),
                                           *(const unsigned int*)(bx + 32 * i + 16 + 4 * q)};
                // The group's dots (each half's, with a scale per half). |dot| ≤ 32 · 128 ·
                // 127: exact as a float without the conversion unit.
                int lo[4] = {0, 0, 0, 0}, hi[4] = {0, 0, 0, 0};
                if constexpr (MmqHalves<ROWS>::value) {
                    const unsigned int a_lo[4] = {ga.lo, gb.lo, 0u, 0u}, a_hi[4] = {0u, 0u, ga.hi, gb.hi};
                    mma_s8_16832(lo, a_lo, b);
                    mma_s8_16832(hi, a_hi, b);
                } else {
                    const unsigned int a[4] = {ga.lo, gb.lo, ga.hi, gb.hi};
                    mma_s8_16832(lo, a, b);
                }
                // This lane's results are token rows 8j + 2q and 8j + 2q + 1 (t): their
                // group's scale and sums of x; rows g (i < 2) and g + 8.
#pragma unroll
                for (int t = 0; t < 2; t++) {
                    const unsigned char* row =
                        staged + (size_t)min(8 * j + 2 * q + t, n - 1) * MMQ_X_STRIDE * 16;
                    float sx = ((const float*)(row + GEMV_X8_SCALES(MMQ_STAGE)))[i];
                    const float* sums = (const float*)(row + GEMV_X8_SUMS(MMQ_STAGE)) + 2 * i;
#pragma unroll
                    for (int r = 0; r < 2; r++) {
                        const MmqGroup& w8 = r ? gb : ga;
                        float& a = acc[j][2 * r + t];
                        if constexpr (MmqHalves<ROWS>::value) {
                            a += w8.d[0] * sx * small_int_as_float(lo[2 * r + t]) + w8.m[0] * sums[0];
                            a += w8.d[1] * sx * small_int_as_float(hi[2 * r + t]) + w8.m[1] * sums[1];
                        } else {
                            a += w8.d[0] * sx * small_int_as_float(lo[2 * r + t]) +
                                 w8.m[0] * (sums[0] + sums[1]);
                        }
                    }
                }
            }
        }
        if (s0 + MMQ_STAGE_GROUPS < g1) load_stage(s0 + MMQ_STAGE_GROUPS);
    }
    // This lane holds D[g | g + 8][2q, 2q + 1] of every tile of token rows.
    float* o = out + (size_t)blockIdx.y * slice_stride;
#pragma unroll
    for (int j = 0; j < MMQ_MAX_ROWS / 8; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int m = first + g + 8 * (i >> 1), t = 8 * j + 2 * q + (i & 1);
            if (j < tiles && m < M && t < n) o[(size_t)t * ldo + m] = acc[j][i];
        }
}

// out[j·ldo + m] = Σ over the `slices` partial products (mmq_t's, slices·n·M floats: slice,
// then token row, then row) in slice order, a thread per output.
extern "C" __global__ void mmq_sum(const float* __restrict__ parts, float* __restrict__ out, int M,
                                   int n, int ldo, int slices) {
    grid_dependency_sync();  // the partial sums are the product's just before
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x, size = (long long)M * n;
    if (i >= size) return;
    float s = 0.0f;
    for (int p = 0; p < slices; p++) s += parts[p * size + i];
    int j = (int)(i / M), m = (int)(i % M);
    out[(size_t)j * ldo + m] = s;
}

#define MMQ_KERNEL(name, ROWS)                                                                  \
    extern "C" __global__ void mmq_##name(const u8* w, const bf16* x, float* out, int M, int K, \
                                          int n, int ldo, int slice_groups,                     \
                                          long long slice_stride) {                             \
        mmq_t<ROWS>(w, x, out, M, K, n, ldo, slice_groups, slice_stride);                       \
    }

MMQ_KERNEL(q4_0, LegacyRows<FMT_Q4_0>)
MMQ_KERNEL(q4_1, LegacyRows<FMT_Q4_1>)
MMQ_KERNEL(q5_0, LegacyRows<FMT_Q5_0>)
MMQ_KERNEL(q5_1, LegacyRows<FMT_Q5_1>)
MMQ_KERNEL(q8_0, Q8_0Rows)
MMQ_KERNEL(q4_k, KQuantRows<FMT_Q4_K>)
MMQ_KERNEL(q5_k, KQuantRows<FMT_Q5_K>)
MMQ_KERNEL(q6_k, Q6KRows)
