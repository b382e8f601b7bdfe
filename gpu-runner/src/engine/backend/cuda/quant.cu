// GGUF block formats on the device (appended to kernels.cu at compile time): matrices kept in
// their file's quantized blocks, dequantized where they are used. Decode-sized products read
// the blocks directly (gemv_<format>: a quarter to a half of bf16's bytes per weight);
// larger ones first expand a matrix to bf16 (dequant_<format>) for cuBLAS.
//
// Layouts follow quant/legacy.rs and quant/kquants.rs (the host's reference): every format
// is read as groups of 32 consecutive elements of a row; a row of K elements is K/32 groups
// (legacy blocks hold one group, K-quant super-blocks eight).

typedef unsigned char u8;

__device__ __forceinline__ float f16_to_f32(unsigned short h) {
    unsigned int sign = (unsigned int)(h >> 15) << 31, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    if (exp == 0) {
        float f = (float)mant * 5.9604644775390625e-8f;  // 2^-24
        return sign ? -f : f;
    }
    if (exp == 31) return __uint_as_float(sign | 0x7f800000u | (mant << 13));
    return __uint_as_float(sign | ((exp + 112) << 23) | (mant << 13));
}

__device__ __forceinline__ float f16_at(const u8* p) {
    return f16_to_f32((unsigned short)(p[0] | (p[1] << 8)));
}

#define FMT_Q4_0 0
#define FMT_Q4_1 1
#define FMT_Q5_0 2
#define FMT_Q5_1 3
#define FMT_Q8_0 4
#define FMT_Q4_K 5
#define FMT_Q5_K 6
#define FMT_Q6_K 7

template <int FMT>
__device__ __forceinline__ int block_bytes() {
    return FMT == FMT_Q4_0 ? 18 : FMT == FMT_Q4_1 ? 20 : FMT == FMT_Q5_0 ? 22
         : FMT == FMT_Q5_1 ? 24 : FMT == FMT_Q8_0 ? 34 : FMT == FMT_Q4_K ? 144
         : FMT == FMT_Q5_K ? 176 : 210;
}

template <int FMT>
__device__ __forceinline__ int groups_per_block() {
    return FMT >= FMT_Q4_K ? 8 : 1;
}

// Bytes of one row of K elements.
template <int FMT>
__device__ __forceinline__ size_t row_bytes(int K) {
    return (size_t)(K / 32 / groups_per_block<FMT>()) * block_bytes<FMT>();
}

// The 6-bit scale and min of group j (0..8) of a Q4_K/Q5_K super-block.
__device__ __forceinline__ void scale_min_k4(int j, const u8* s, float* sc, float* m) {
    if (j < 4) {
        *sc = (float)(s[j] & 63);
        *m = (float)(s[j + 4] & 63);
    } else {
        *sc = (float)((s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4));
        *m = (float)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

// v = the 32 elements of group g of a row (every format but Q8_0, which has kernels of its
// own below).
template <int FMT>
__device__ __forceinline__ void dequant32(const u8* row, int g, float* v) {
    const u8* b = row + (size_t)(g / groups_per_block<FMT>()) * block_bytes<FMT>();
    if (FMT == FMT_Q4_0 || FMT == FMT_Q4_1) {
        float d = f16_at(b), m = FMT == FMT_Q4_1 ? f16_at(b + 2) : -8.0f * d;
        const u8* qs = b + (FMT == FMT_Q4_1 ? 4 : 2);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            v[j] = d * (float)(qs[j] & 0x0F) + m;
            v[j + 16] = d * (float)(qs[j] >> 4) + m;
        }
    } else if (FMT == FMT_Q5_0 || FMT == FMT_Q5_1) {
        float d = f16_at(b), m = FMT == FMT_Q5_1 ? f16_at(b + 2) : -16.0f * d;
        const u8* qh = b + (FMT == FMT_Q5_1 ? 4 : 2);
        const u8* qs = qh + 4;
        unsigned int high = qh[0] | (qh[1] << 8) | (qh[2] << 16) | ((unsigned int)qh[3] << 24);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            v[j] = d * (float)((qs[j] & 0x0F) | (((high >> j) & 1) << 4)) + m;
            v[j + 16] = d * (float)((qs[j] >> 4) | (((high >> (j + 16)) & 1) << 4)) + m;
        }
    } else if (FMT == FMT_Q4_K || FMT == FMT_Q5_K) {
        int sub = g % 8, c = sub / 2;
        float d = f16_at(b), dmin = f16_at(b + 2), sc, m;
        scale_min_k4(sub, b + 4, &sc, &m);
        float dg = d * sc, mg = dmin * m;
        const u8* qs = b + (FMT == FMT_Q5_K ? 48 : 16) + c * 32;
        const u8* qh = b + 16;
        int shift = (sub & 1) * 4;
#pragma unroll
        for (int l = 0; l < 32; l++) {
            int q = (qs[l] >> shift) & 0x0F;
            if (FMT == FMT_Q5_K) q |= ((qh[l] >> sub) & 1) << 4;
            v[l] = dg * (float)q - mg;
        }
    } else {  // Q6_K: 32 elements are two 16-element groups with their own scales
        int sub = g % 8, half = sub / 4, quarter = sub % 4;
        const u8* ql = b + half * 64;
        const u8* qh = b + 128 + half * 32;
        float d = f16_at(b + 208);
        // Element i = half*128 + quarter*32 + l: low nibble of ql[l] (quarter 0), ql[l+32]
        // (1), high nibble of ql[l] (2), ql[l+32] (3); high bits (qh[l] >> 2*quarter) & 3.
        int lo_off = (quarter & 1) * 32, lo_shift = (quarter >> 1) * 4;
#pragma unroll
        for (int l = 0; l < 32; l++) {
            int q = ((ql[l + lo_off] >> lo_shift) & 0x0F) | (((qh[l] >> (2 * quarter)) & 3) << 4);
            int i = half * 128 + quarter * 32 + l;
            v[l] = d * (float)(signed char)b[192 + i / 16] * (float)(q - 32);
        }
    }
}

// out[j·ldo + m] = Σ_k x[j, k]·w[m, k] for j < n <= GEMV_MAX_ROWS, with w in format FMT:
// one warp per output row, each lane dequantizing whole groups of 32 (consecutive lanes
// read consecutive blocks) and keeping n sums. K % 32 == 0 (K % 256 for K-quants).
template <int FMT>
__device__ void gemv_q(const u8* __restrict__ w, const bf16* __restrict__ x,
                       float* __restrict__ out, int M, int K, int n, int ldo) {
    grid_dependency_sync();
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int m = blockIdx.x * GEMV_WARPS + warp;
    if (m >= M) return;
    const u8* row = w + (size_t)m * row_bytes<FMT>(K);
    float acc[GEMV_MAX_ROWS];
#pragma unroll
    for (int j = 0; j < GEMV_MAX_ROWS; j++) acc[j] = 0.0f;
    for (int g = lane; g < K / 32; g += 32) {
        float v[32];
        dequant32<FMT>(row, g, v);
#pragma unroll
        for (int j = 0; j < GEMV_MAX_ROWS; j++) {
            if (j < n) {
                const uint4* xr = (const uint4*)(x + (size_t)j * K + (size_t)g * 32);
                float s = 0.0f;
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    uint4 xv = __ldg(xr + c);
                    unsigned int xw[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        s += v[8 * c + 2 * e] * __uint_as_float(xw[e] << 16);
                        s += v[8 * c + 2 * e + 1] * __uint_as_float(xw[e] & 0xffff0000u);
                    }
                }
                acc[j] += s;
            }
        }
    }
    gemv_write(acc, out + m, (size_t)ldo, m < M, n);
}

// out = the rows × K matrix as bf16, one thread per group of 32.
template <int FMT>
__device__ void dequant_bf16(const u8* __restrict__ w, bf16* __restrict__ out, int rows, int K) {
    grid_dependency_sync();  // `out` is the expansion buffer the previous GEMM read
    long long g = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    int groups = K / 32;
    if (g >= (long long)rows * groups) return;
    int r = (int)(g / groups), gg = (int)(g % groups);
    float v[32];
    dequant32<FMT>(w + (size_t)r * row_bytes<FMT>(K), gg, v);
    store_bf16x32(out + (size_t)r * K + (size_t)gg * 32, v);
}

#define QUANT_KERNELS(name, FMT)                                                            \
    extern "C" __global__ void gemv_##name(const u8* w, const bf16* x, float* out, int M,   \
                                           int K, int n, int ldo) {                         \
        gemv_q<FMT>(w, x, out, M, K, n, ldo);                                               \
    }                                                                                       \
    extern "C" __global__ void dequant_##name(const u8* w, bf16* out, int rows, int K) {    \
        dequant_bf16<FMT>(w, out, rows, K);                                                 \
    }

QUANT_KERNELS(q4_0, FMT_Q4_0)
QUANT_KERNELS(q4_1, FMT_Q4_1)
QUANT_KERNELS(q5_0, FMT_Q5_0)
QUANT_KERNELS(q5_1, FMT_Q5_1)
QUANT_KERNELS(q4_k, FMT_Q4_K)
QUANT_KERNELS(q5_k, FMT_Q5_K)
QUANT_KERNELS(q6_k, FMT_Q6_K)

// Q8_0 as the device keeps it (weights.rs, device_layout): the int8 quants of all M rows
// ([M][K], row-major), then their f16 scales ([M][K / 32]). Unlike the formats above, whose
// blocks are not 16-byte aligned, a lane reads 16 quants per load, so the Q8_0 GEMV is
// gemv_t's loop (kernels.cu) over these rows: 16 quants per chunk, their products with x
// summed, then times the chunk's scale. K % 32 == 0.
struct Q8_0Rows {
    static constexpr int PER_CHUNK = 16;
    struct Chunk {
        float q[16];
        float d;
    };
    const uint4* row;
    const unsigned short* scales;  // this row's, one per 32 quants
    __device__ __forceinline__ Q8_0Rows(const void* w, int m, int M, int K)
        : row((const uint4*)((const u8*)w + (size_t)m * K)),
          scales((const unsigned short*)((const u8*)w + (size_t)M * K) + (size_t)m * (K / 32)) {}
    __device__ __forceinline__ Chunk decode(uint4 wv, int k) const {
        Chunk c;
        c.d = f16_to_f32(scales[k / 32]);
        unsigned int words[4] = {wv.x, wv.y, wv.z, wv.w};
#pragma unroll
        for (int e = 0; e < 16; e++) c.q[e] = (float)(signed char)(words[e / 4] >> (8 * (e % 4)));
        return c;
    }
    // The chunk's products with the 16 bf16 of x at `x` (two 16-byte chunks), times the scale.
    __device__ __forceinline__ float dot(const Chunk& c, const uint4* x) const {
        float s = 0.0f;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            uint4 xv = x[h];
            unsigned int xw[4] = {xv.x, xv.y, xv.z, xv.w};
#pragma unroll
            for (int e = 0; e < 4; e++) {
                s += c.q[8 * h + 2 * e] * __uint_as_float(xw[e] << 16);
                s += c.q[8 * h + 2 * e + 1] * __uint_as_float(xw[e] & 0xffff0000u);
            }
        }
        return c.d * s;
    }
};

// One warp per row, GEMV_WARPS rows per block, x staged per tile, the next tile's quants
// requested before this one is summed; no norm at the end.
extern "C" __global__ void gemv_q8_0(const u8* w, const bf16* x, float* out, int M, int K, int n,
                                     int ldo) {
    gemv_t<Q8_0Rows, false, GEMV_WARPS, 4, true, false>(w, x, out, M, K, n, ldo, 0, GemvNorm{},
                                                        GemvL2{0, 0}, -1);
}

// The rows × K Q8_0 matrix (the device layout above) as bf16. Launched as the other formats'
// dequant kernels (a thread per group of 32), but each thread expands 4 pieces of 8 quants,
// blockDim.x pieces apart in its block's range: consecutive threads load consecutive 8-byte
// pieces and store consecutive 16-byte ones (whole sectors; the expansion is memory-bound).
extern "C" __global__ void dequant_q8_0(const u8* w, bf16* out, int rows, int K) {
    grid_dependency_sync();  // `out` is the expansion buffer the previous GEMM read
    long long pieces = (long long)rows * (K / 8);
    long long first = (long long)blockIdx.x * blockDim.x * 4 + threadIdx.x;
    const unsigned short* scales = (const unsigned short*)(w + (size_t)rows * K);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        long long p = first + (long long)i * blockDim.x;
        if (p >= pieces) return;
        float d = f16_to_f32(scales[p / 4]);
        uint2 q = ((const uint2*)w)[p];
        unsigned int words[2] = {q.x, q.y};
        float v[8];
#pragma unroll
        for (int l = 0; l < 8; l++) v[l] = d * (float)(signed char)(words[l / 4] >> (8 * (l % 4)));
        ((uint4*)out)[p] = bf16x8(v);
    }
}
