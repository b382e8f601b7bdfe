// GGUF block formats on the device (appended to kernels.cu at compile time): matrices kept in
// quantized blocks, dequantized where they are used. Decode-sized products read the blocks
// directly (gemv_<format>: a quarter to a half of bf16's bytes per weight); larger ones
// first expand a matrix to bf16 (dequant_<format>) for cuBLAS.
//
// Values follow quant/legacy.rs and quant/kquants.rs (the host's reference). Each format is
// a row type for gemv_t (kernels.cu: the bf16 GEMV's prefetching loop) that reads a row as
// chunks with 16-byte loads; the expansion decodes the same chunks (dequant_t). So that
// every load is aligned, the device keeps the formats whose blocks are not a multiple of 16
// bytes split (weights.rs, device_layout): each block's bytes in segments, segment s of every
// block of the matrix stored together, in block order, one region after another. Q4_K and
// Q5_K (144 and 176 bytes) stay as ggml stores them.

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

// Quants as floats without the conversion unit: an int-to-float conversion issues at a
// quarter of the rate of an FMA (sm_80/sm_90), and a dequantizing GEMV converts every weight
// it reads, several per byte, so at decode's bandwidth the conversions, not the loads, would
// set the pace. Instead an integer's bits are placed in the mantissa of a float whose unit
// in the last place is 1 (2^23 ≤ f < 2^24), and that float's offset subtracted: exact, one
// integer op (add or byte permute) and one float add.
//
// v, for |v| < 2^22.
__device__ __forceinline__ float small_int_as_float(int v) {
    return __int_as_float(0x4B400000 + v) - 12582912.0f;  // 1.5 · 2^23: room for either sign
}

// The four bytes of `word` (least significant first) as unsigned values 0..255.
__device__ __forceinline__ void u8x4_as_floats(unsigned int word, float* out) {
#pragma unroll
    for (int i = 0; i < 4; i++)  // bytes [i, 0, 0, 0x4B] of (word, 0x4B000000): 2^23 + byte i
        out[i] = __uint_as_float(__byte_perm(word, 0x4B000000u, 0x7540u | i)) - 8388608.0f;
}

// The four bytes of `word` as signed values -128..127 (flipping the sign bit adds 128).
__device__ __forceinline__ void s8x4_as_floats(unsigned int word, float* out) {
#pragma unroll
    for (int i = 0; i < 4; i++)
        out[i] = __uint_as_float(__byte_perm(word ^ 0x80808080u, 0x4B000000u, 0x7540u | i)) -
                 8388736.0f;  // 2^23 + 128
}

// Byte i (0..4) of `word` as a signed value.
__device__ __forceinline__ int s8_of(unsigned int word, int i) {
    return (int)(signed char)((word >> (8 * i)) & 0xFF);
}

// Bits 0..3 of `bits` moved to bit 0 of bytes 0..3 (the four shifted copies never overlap).
__device__ __forceinline__ unsigned int spread_bits(unsigned int bits) {
    return ((bits & 0xF) * 0x00204081u) & 0x01010101u;
}

// Word e (0..4) of `v`: with e known at compile time the word itself, else three selects (an
// array indexed by a lane's value would live in local memory).
__device__ __forceinline__ unsigned int word_of(uint4 v, int e) {
    return e == 0 ? v.x : e == 1 ? v.y : e == 2 ? v.z : v.w;
}

// acc plus the products of 16 signed bytes (q's four words) with the 16 of qx, four pairs per
// __dp4a: a chunk's quants times x staged as int8 (gemv_stage_x8).
__device__ __forceinline__ int dot_s8x16(const unsigned int* q, uint4 qx, int acc) {
    acc = __dp4a((int)q[0], (int)qx.x, acc);
    acc = __dp4a((int)q[1], (int)qx.y, acc);
    acc = __dp4a((int)q[2], (int)qx.z, acc);
    return __dp4a((int)q[3], (int)qx.w, acc);
}

// A token row of x as gemv_stage_x8 stages a tile of TILE elements: its int8 values, each
// group of 32's scale and each half-group of 16's sum (of the bf16 values).
template <int TILE>
struct StagedX8 {
    const unsigned char* q;
    const float *scales, *sums;
    __device__ __forceinline__ explicit StagedX8(const uint4* x)
        : q((const unsigned char*)x),
          scales((const float*)(q + GEMV_X8_SCALES(TILE))),
          sums((const float*)(q + GEMV_X8_SUMS(TILE))) {}
    // The 16 int8 values from element `pos` (a multiple of 16).
    __device__ __forceinline__ uint4 sixteen(int pos) const { return *(const uint4*)(q + pos); }
};

// What a row type that takes x staged as int8 declares: that it does (StagesInt8), and the
// tile whose staging it reads (gemv_rows checks it against its own).
template <int TILE_ELEMS>
struct ReadsX8 {
    static constexpr bool X_INT8 = true;
    static constexpr int TILE = TILE_ELEMS;
};

// A chunk's runs of 16 quants as N × 4 words, a byte per quant: word e of run t is quants(e, t).
template <int N, class Quants>
__device__ __forceinline__ void gather_quants(unsigned int (&q)[N][4], Quants quants) {
#pragma unroll
    for (int t = 0; t < N; t++)
#pragma unroll
        for (int e = 0; e < 4; e++) q[t][e] = quants(e, t);
}

// 16 values as bf16, two 16-byte stores.
__device__ __forceinline__ void store_bf16x16(bf16* o, const float* v) {
    ((uint4*)o)[0] = bf16x8(v);
    ((uint4*)o)[1] = bf16x8(v + 8);
}

#define FMT_Q4_0 0
#define FMT_Q4_1 1
#define FMT_Q5_0 2
#define FMT_Q5_1 3
#define FMT_Q4_K 5
#define FMT_Q5_K 6

// Where block `b` of a matrix of `blocks` blocks keeps a segment of `bytes` bytes per block,
// after `before` bytes of every block's earlier segments (device_layout's regions).
__device__ __forceinline__ const u8* segment(const void* w, size_t blocks, int before, int bytes,
                                             size_t b) {
    return (const u8*)w + blocks * before + b * bytes;
}

// Q4_0, Q4_1, Q5_0 and Q5_1 (one group of 32 per block), split on the device into the
// blocks' 16 bytes of low bits (byte j: element j in its low nibble, j + 16 in its high
// one), then their headers: d (Q4_0), d and m (Q4_1), d and the 32 fifth bits (Q5_0), d, m
// and the fifth bits (Q5_1). A chunk is a block: its low bits and header in one load each
// (Q5_0's 6-byte header in three 2-byte loads). Value d·q + m (Q4_0: m = −8·d; Q5_0: −16·d).
template <int FMT>
struct LegacyRows {
    static constexpr bool FIFTH = FMT == FMT_Q5_0 || FMT == FMT_Q5_1;
    static constexpr bool HAS_MIN = FMT == FMT_Q4_1 || FMT == FMT_Q5_1;
    static constexpr int PER_CHUNK = 32, CHUNK_BYTES = 16;
    static constexpr int HEADER = 2 + (HAS_MIN ? 2 : 0) + (FIFTH ? 4 : 0);
    struct Raw {
        uint4 q;
        unsigned int d_m, high;  // d (and m above it); the fifth bits
    };
    struct Chunk {
        float v[32];
    };
    const uint4* row;
    const u8* header;  // this row's first block's
    __device__ __forceinline__ LegacyRows(const void* w, int m, int M, int K) {
        size_t blocks = (size_t)M * (K / 32), first = (size_t)m * (K / 32);
        row = (const uint4*)segment(w, blocks, 0, 16, first);
        header = segment(w, blocks, 16, HEADER, first);
    }
    __device__ __forceinline__ Raw load(int c) const {
        Raw r{};
        r.q = __ldg(row + c);
        const u8* h = header + (size_t)c * HEADER;
        if constexpr (FMT == FMT_Q4_0) {
            r.d_m = __ldg((const unsigned short*)h);
        } else if constexpr (FMT == FMT_Q5_0) {
            const unsigned short* hs = (const unsigned short*)h;
            r.d_m = __ldg(hs);
            r.high = __ldg(hs + 1) | (unsigned int)__ldg(hs + 2) << 16;
        } else if constexpr (FMT == FMT_Q4_1) {
            r.d_m = __ldg((const unsigned int*)h);
        } else {
            uint2 both = __ldg((const uint2*)h);
            r.d_m = both.x;
            r.high = both.y;
        }
        return r;
    }
    // The block's scale and offset: value d·q + m.
    __device__ __forceinline__ static void scale_min(const Raw& r, float* d, float* m) {
        *d = f16_to_f32((unsigned short)(r.d_m & 0xFFFF));
        *m = HAS_MIN ? f16_to_f32((unsigned short)(r.d_m >> 16)) : (FIFTH ? -16.0f : -8.0f) * *d;
    }
    // Word e (0..4) of the block's quants of elements [16·half, 16·half + 16): elements
    // 16·half + 4e .. + 4, a byte each, 0..31 (the fifth bit from the block's 32).
    __device__ __forceinline__ static unsigned int quants(const Raw& r, int e, int half) {
        unsigned int q = (word_of(r.q, e) >> (4 * half)) & 0x0F0F0F0Fu;
        if constexpr (FIFTH) q |= spread_bits(r.high >> (16 * half + 4 * e)) << 4;
        return q;
    }
    __device__ __forceinline__ Chunk decode(const Raw& r, int) const {
        float d, m;
        scale_min(r, &d, &m);
        Chunk ch;
#pragma unroll
        for (int half = 0; half < 2; half++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float f[4];
                u8x4_as_floats(quants(r, e, half), f);
#pragma unroll
                for (int i = 0; i < 4; i++) ch.v[16 * half + 4 * e + i] = d * f[i] + m;
            }
        return ch;
    }
    // The chunk's 32 products with x, in element order.
    __device__ __forceinline__ float dot(const Chunk& ch, const uint4* x, int at) const {
        float s = 0.0f;
#pragma unroll
        for (int p = 0; p < 4; p++) s = dot_bf16x8(ch.v + 8 * p, x[4 * at + p], s);
        return s;
    }
    __device__ __forceinline__ void store(const Chunk& ch, bf16* out, int c) const {
        store_bf16x32(out + (size_t)c * 32, ch.v);
    }
};

// The legacy formats' rows for dot products with x staged as int8 (gemv_stage_x8, a tile of
// TILE_ELEMS): a block's 32 quants stay bytes, and its share of the dot is
// d·sx·Σ q·qx (four pairs per __dp4a) + m·Σ x — llama.cpp's q4_0/q4_1/q5_0/q5_1 · q8_1
// products (there m·Σ x is taken from the rounded x), where the bf16-x form converts every
// weight and every x to a float.
template <int FMT, int TILE_ELEMS>
struct LegacyX8Rows : LegacyRows<FMT>, ReadsX8<TILE_ELEMS> {
    using Base = LegacyRows<FMT>;
    using Raw = typename Base::Raw;
    struct Chunk {
        unsigned int q[2][4];  // elements 0..16 and 16..32, a byte per quant
        float d, m;
    };
    __device__ __forceinline__ LegacyX8Rows(const void* w, int m, int M, int K)
        : Base(w, m, M, K) {}
    __device__ __forceinline__ Chunk decode(const Raw& r, int) const {
        Chunk ch;
        Base::scale_min(r, &ch.d, &ch.m);
        gather_quants(ch.q, [&](int e, int half) { return Base::quants(r, e, half); });
        return ch;
    }
    // The block's products with the staged x (chunk `at` of the tile: elements 32·at on).
    __device__ __forceinline__ float dot(const Chunk& ch, const uint4* x, int at) const {
        const StagedX8<TILE_ELEMS> sx(x);
        int pos = 32 * at;
        int dot = dot_s8x16(ch.q[1], sx.sixteen(pos + 16), dot_s8x16(ch.q[0], sx.sixteen(pos), 0));
        // |dot| ≤ 32 · 31 · 127: exact as a float without the conversion unit.
        return ch.d * sx.scales[at] * small_int_as_float(dot) +
               ch.m * (sx.sums[2 * at] + sx.sums[2 * at + 1]);
    }
};

// The 6-bit scale and min of group j (0..8) of a Q4_K/Q5_K super-block, whose 12 scale bytes
// s(i) gives.
template <class Bytes>
__device__ __forceinline__ void scale_min_k4(int j, Bytes s, float* sc, float* m) {
    if (j < 4) {
        *sc = small_int_as_float(s(j) & 63);
        *m = small_int_as_float(s(j + 4) & 63);
    } else {
        *sc = small_int_as_float((s(j + 4) & 0x0F) | ((s(j - 4) >> 6) << 4));
        *m = small_int_as_float((s(j + 4) >> 4) | ((s(j) >> 6) << 4));
    }
}

// Q4_K and Q5_K rows as ggml stores them, for gemv_t (kernels.cu): their super-blocks (144 and
// 176 bytes) keep 16-byte alignment, so a lane reads them with 16-byte loads in the same
// prefetching loop as bf16 rows. A super-block is 8 groups of 32 (each its 6-bit scale and
// min, after d and dmin, in its first 16 bytes) whose low 4 bits are 128 bytes: byte l of
// its 32-byte pair p holds element l of group 2p (low nibble) and of group 2p + 1 (high);
// Q5_K's fifth bits are bit g of byte l of 32 more bytes (qh). Chunk i (0..8) of a
// super-block is bytes [16i, 16i + 16) of the low bits: elements [16h, 16h + 16) of groups
// 2p and 2p + 1 (p = i / 2, h = i % 2). A lane loads its chunk's header with it (the 8 lanes
// of a super-block read the same 16 bytes: one sector) and, for Q5_K, its 16 bytes of qh.
template <int FMT>
struct KQuantRows {
    static constexpr bool Q5 = FMT == FMT_Q5_K;
    static constexpr int PER_CHUNK = 32, BLOCK_BYTES = Q5 ? 176 : 144, LOW_BITS = Q5 ? 48 : 16;
    static constexpr int CHUNK_BYTES = BLOCK_BYTES / 8;
    struct Raw {
        uint4 head, low, high;  // high: Q5_K's fifth bits (unused by Q4_K)
    };
    struct Chunk {
        float lo[16], hi[16];  // elements of groups 2p and 2p + 1
    };
    const u8* row;
    __device__ __forceinline__ KQuantRows(const void* w, int m, int, int K)
        : row((const u8*)w + (size_t)m * (K / 256) * BLOCK_BYTES) {}
    __device__ __forceinline__ Raw load(int c) const {
        const u8* block = row + (size_t)(c / 8) * BLOCK_BYTES;
        Raw r{};
        r.head = __ldg((const uint4*)block);
        r.low = __ldg((const uint4*)(block + LOW_BITS) + c % 8);
        if constexpr (Q5) r.high = __ldg((const uint4*)(block + 16) + c % 2);
        return r;
    }
    // Chunk c's groups 2p and 2p + 1: their d·scale (dg) and dmin·min (mg), value dg·q − mg.
    __device__ __forceinline__ static void group_scales(const Raw& r, int c, float* dg,
                                                        float* mg) {
        int sub = c % 8 / 2 * 2;  // group 2p
        float d = f16_to_f32((unsigned short)(r.head.x & 0xffff));
        float dmin = f16_to_f32((unsigned short)(r.head.x >> 16));
        // The 12 scale bytes are the header's bytes 4..16: words y, z, w.
        auto scale_byte = [&](int i) {
            unsigned int word = i < 4 ? r.head.y : i < 8 ? r.head.z : r.head.w;
            return (int)((word >> (8 * (i & 3))) & 0xFF);
        };
        float sc0, m0, sc1, m1;
        scale_min_k4(sub, scale_byte, &sc0, &m0);
        scale_min_k4(sub + 1, scale_byte, &sc1, &m1);
        dg[0] = d * sc0, mg[0] = dmin * m0, dg[1] = d * sc1, mg[1] = dmin * m1;
    }
    // Word e of the chunk's quants of group 2p (half 0) or 2p + 1 (half 1): four values
    // 0..31, a byte each (Q5_K's fifth bit from the same byte of qh).
    __device__ __forceinline__ static unsigned int quants(const Raw& r, int c, int e, int half) {
        unsigned int q = (word_of(r.low, e) >> (4 * half)) & 0x0F0F0F0Fu;
        if constexpr (Q5) q |= ((word_of(r.high, e) >> (c % 8 / 2 * 2 + half)) & 0x01010101u) << 4;
        return q;
    }
    __device__ __forceinline__ Chunk decode(const Raw& r, int c) const {
        float dg[2], mg[2];
        group_scales(r, c, dg, mg);
        Chunk ch;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float flo[4], fhi[4];
            u8x4_as_floats(quants(r, c, e, 0), flo);
            u8x4_as_floats(quants(r, c, e, 1), fhi);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                ch.lo[4 * e + i] = dg[0] * flo[i] - mg[0];
                ch.hi[4 * e + i] = dg[1] * fhi[i] - mg[1];
            }
        }
        return ch;
    }
    // Where chunk c's low-nibble elements start, from its super-block's first element.
    __device__ __forceinline__ static int first(int c) { return c % 8 / 2 * 64 + c % 2 * 16; }
    // The chunk's 32 products with x (chunk `at` of the tile: super-block at / 8 of it).
    __device__ __forceinline__ float dot(const Chunk& ch, const uint4* x, int at) const {
        const uint4* lo = x + (at / 8 * 256 + first(at)) / 8;  // 8 bf16 per uint4
        float s = dot_bf16x8(ch.lo, lo[0], 0.0f);
        s = dot_bf16x8(ch.lo + 8, lo[1], s);
        s = dot_bf16x8(ch.hi, lo[4], s);
        return dot_bf16x8(ch.hi + 8, lo[5], s);
    }
    __device__ __forceinline__ void store(const Chunk& ch, bf16* out, int c) const {
        bf16* lo = out + (size_t)(c / 8) * 256 + first(c);
        store_bf16x16(lo, ch.lo);
        store_bf16x16(lo + 32, ch.hi);
    }
};

// Q4_K and Q5_K rows as KQuantRows reads them, for dot products with x staged as int8
// (gemv_stage_x8: per group of 32 a scale sx, x ≈ sx·qx): a chunk's quants stay bytes, and
// each group's share of the dot is dg·sx·Σ q·qx (four pairs per __dp4a) − mg·Σ x. About a
// fifth of KQuantRows' instructions per weight (no conversion of a weight or an x to a
// float), for x rounded to 8 bits per group as llama.cpp's quantized products do. TILE: the
// GEMV's tile (where the staging keeps its scales and sums).
template <int FMT, int TILE_ELEMS>
struct KQuantX8Rows : KQuantRows<FMT>, ReadsX8<TILE_ELEMS> {
    using Base = KQuantRows<FMT>;
    using Raw = typename Base::Raw;
    struct Chunk {
        unsigned int q[2][4];  // groups 2p and 2p + 1: 16 quants each, a byte per quant
        float dg[2], mg[2];
    };
    __device__ __forceinline__ KQuantX8Rows(const void* w, int m, int M, int K)
        : Base(w, m, M, K) {}
    __device__ __forceinline__ Chunk decode(const Raw& r, int c) const {
        Chunk ch;
        Base::group_scales(r, c, ch.dg, ch.mg);
        gather_quants(ch.q, [&](int e, int half) { return Base::quants(r, c, e, half); });
        return ch;
    }
    // The chunk's products with the staged x (chunk `at` of the tile).
    __device__ __forceinline__ float dot(const Chunk& ch, const uint4* x, int at) const {
        const StagedX8<TILE_ELEMS> sx(x);
        float s = 0.0f;
#pragma unroll
        for (int half = 0; half < 2; half++) {
            int pos = at / 8 * 256 + Base::first(at) + 32 * half;  // its 16 elements' first
            int dot = dot_s8x16(ch.q[half], sx.sixteen(pos), 0);
            // |dot| ≤ 16 · 31 · 127: exact as a float without the conversion unit.
            s += ch.dg[half] * sx.scales[pos / 32] * small_int_as_float(dot) -
                 ch.mg[half] * sx.sums[pos / 16];
        }
        return s;
    }
};

// Q6_K (210-byte super-blocks of 16 groups of 16, each its signed 8-bit scale; value
// d·sc·(q − 32)), split on the device into the super-blocks' 192 bytes of quants (ql, then
// qh), their 16 scales, then their d. Element i = 128·h + 32·t + l (half h, quarter t,
// l < 32) has its low 4 bits in ql[64·h + l + 32·(t % 2)] (low nibble for t < 2, high
// nibble else) and its top 2 in bits 2·t of qh[32·h + l]. Chunk c (0..4) of a super-block
// is h = c / 2 and l in [16·a, 16·a + 16) (a = c % 2): 64 elements, 16 of each quarter, from
// three 16-byte loads (the two ql pieces and the qh piece) and the half's 8 scales.
struct Q6KRows {
    static constexpr int PER_CHUNK = 64, CHUNK_BYTES = 48;
    struct Raw {
        uint4 ql0, ql1, qh;  // ql[64h + 16a ..], ql[64h + 32 + 16a ..], qh[32h + 16a ..]
        uint2 scales;        // the half's 8 scales
        unsigned int d;
    };
    struct Chunk {
        float v[4][16];  // quarter t's elements 16a .. 16a + 16
    };
    const u8 *row, *scales;  // row: the quants
    const unsigned short* d;
    __device__ __forceinline__ Q6KRows(const void* w, int m, int M, int K) {
        size_t blocks = (size_t)M * (K / 256), first = (size_t)m * (K / 256);
        row = segment(w, blocks, 0, 192, first);
        scales = segment(w, blocks, 192, 16, first);
        d = (const unsigned short*)segment(w, blocks, 208, 2, first);
    }
    __device__ __forceinline__ Raw load(int c) const {
        int b = c / 4, h = c % 4 / 2, a = c % 2;
        const u8* q = row + (size_t)b * 192;
        Raw r;
        r.ql0 = __ldg((const uint4*)(q + 64 * h + 16 * a));
        r.ql1 = __ldg((const uint4*)(q + 64 * h + 32 + 16 * a));
        r.qh = __ldg((const uint4*)(q + 128 + 32 * h + 16 * a));
        r.scales = __ldg((const uint2*)(scales + (size_t)b * 16 + 8 * h));
        r.d = __ldg(d + b);
        return r;
    }
    // Chunk c's d·scale of each quarter t: the half's scale a + 2·t.
    __device__ __forceinline__ static void quarter_scales(const Raw& r, int c, float* dsc) {
        int a = c % 2;
        float d = f16_to_f32((unsigned short)r.d);
        dsc[0] = d * small_int_as_float(s8_of(r.scales.x, a));
        dsc[1] = d * small_int_as_float(s8_of(r.scales.x, a + 2));
        dsc[2] = d * small_int_as_float(s8_of(r.scales.y, a));
        dsc[3] = d * small_int_as_float(s8_of(r.scales.y, a + 2));
    }
    // Word e (0..4) of quarter t's 16 quants in the chunk: four values 0..63, a byte each.
    __device__ __forceinline__ static unsigned int quants(const Raw& r, int e, int t) {
        unsigned int low = (word_of(t % 2 ? r.ql1 : r.ql0, e) >> (t / 2 * 4)) & 0x0F0F0F0Fu;
        return low | ((word_of(r.qh, e) >> (2 * t)) & 0x03030303u) << 4;
    }
    __device__ __forceinline__ Chunk decode(const Raw& r, int c) const {
        float dsc[4];
        quarter_scales(r, c, dsc);
        Chunk ch;
#pragma unroll
        for (int e = 0; e < 4; e++) {
#pragma unroll
            for (int t = 0; t < 4; t++) {
                float f[4];
                u8x4_as_floats(quants(r, e, t), f);
#pragma unroll
                for (int i = 0; i < 4; i++) ch.v[t][4 * e + i] = dsc[t] * (f[i] - 32.0f);
            }
        }
        return ch;
    }
    // Where chunk c's quarter-0 elements start, from its super-block's first element.
    __device__ __forceinline__ static int first(int c) { return c % 4 / 2 * 128 + c % 2 * 16; }
    // The chunk's 64 products with x, quarter by quarter (chunk `at` of the tile).
    __device__ __forceinline__ float dot(const Chunk& ch, const uint4* x, int at) const {
        const uint4* q0 = x + (at / 4 * 256 + first(at)) / 8;
        float s = 0.0f;
#pragma unroll
        for (int t = 0; t < 4; t++) {
            s = dot_bf16x8(ch.v[t], q0[4 * t], s);
            s = dot_bf16x8(ch.v[t] + 8, q0[4 * t + 1], s);
        }
        return s;
    }
    __device__ __forceinline__ void store(const Chunk& ch, bf16* out, int c) const {
        bf16* q0 = out + (size_t)(c / 4) * 256 + first(c);
#pragma unroll
        for (int t = 0; t < 4; t++) store_bf16x16(q0 + 32 * t, ch.v[t]);
    }
};

// Q6_K rows for dot products with x staged as int8 (gemv_stage_x8, a tile of TILE_ELEMS): a
// chunk's quants stay bytes (0..63), and each quarter's share of the dot is
// dsc·(sx·Σ q·qx − 32·Σ x) (four pairs per __dp4a; the offset on the exact sum of its 16 x):
// a third of Q6KRows' registers for the chunk, no conversion of a weight or an x to a float.
template <int TILE_ELEMS>
struct Q6KX8Rows : Q6KRows, ReadsX8<TILE_ELEMS> {
    struct Chunk {
        unsigned int q[4][4];  // quarter t's 16 quants
        float dsc[4];
    };
    __device__ __forceinline__ Q6KX8Rows(const void* w, int m, int M, int K)
        : Q6KRows(w, m, M, K) {}
    __device__ __forceinline__ Chunk decode(const Raw& r, int c) const {
        Chunk ch;
        quarter_scales(r, c, ch.dsc);
        gather_quants(ch.q, [&](int e, int t) { return quants(r, e, t); });
        return ch;
    }
    // The chunk's products with the staged x, quarter by quarter (chunk `at` of the tile).
    __device__ __forceinline__ float dot(const Chunk& ch, const uint4* x, int at) const {
        const StagedX8<TILE_ELEMS> sx(x);
        int q0 = at / 4 * 256 + first(at);
        float s = 0.0f;
#pragma unroll
        for (int t = 0; t < 4; t++) {
            int pos = q0 + 32 * t;
            // |dot| ≤ 16 · 63 · 127: exact as a float without the conversion unit.
            float dot = small_int_as_float(dot_s8x16(ch.q[t], sx.sixteen(pos), 0));
            s += ch.dsc[t] * (sx.scales[pos / 32] * dot - 32.0f * sx.sums[pos / 16]);
        }
        return s;
    }
};

// Every format's decode product: gemv_t over its row type, one warp per output row,
// GEMV_WARPS rows per block, UNROLL chunks per lane in flight (a tile of at most 2048
// weights: the staged x of 8 token rows is 32 KiB), the next tile's requested before this
// one is summed; no norm at the end.
template <class ROWS, int UNROLL>
__device__ __forceinline__ void gemv_rows(const u8* w, const bf16* x, float* out, int M, int K,
                                          int n, int ldo) {
    gemv_t<ROWS, false, GEMV_WARPS, UNROLL, true, false>(w, x, out, M, K, n, ldo, 0, GemvNorm{},
                                                         GemvL2{0, 0}, -1);
}

// out = the rows × K matrix as bf16: a thread per chunk (launched as a thread per 32
// weights: a format with bigger chunks leaves the surplus threads idle).
template <class ROWS>
__device__ void dequant_t(const u8* __restrict__ w, bf16* __restrict__ out, int rows, int K) {
    grid_dependency_sync();  // `out` is the expansion buffer the previous GEMM read
    long long c = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    int per_row = K / ROWS::PER_CHUNK;
    if (c >= (long long)rows * per_row) return;
    int r = (int)(c / per_row), rc = (int)(c % per_row);
    const ROWS row(w, r, rows, K);
    row.store(row.decode(row.load(rc), rc), out + (size_t)r * K, rc);
}

#define QUANT_KERNELS(name, ROWS, UNROLL)                                                   \
    extern "C" __global__ void gemv_##name(const u8* w, const bf16* x, float* out, int M,   \
                                           int K, int n, int ldo) {                         \
        gemv_rows<ROWS, UNROLL>(w, x, out, M, K, n, ldo);                                   \
    }                                                                                       \
    extern "C" __global__ void dequant_##name(const u8* w, bf16* out, int rows, int K) {    \
        dequant_t<ROWS>(w, out, rows, K);                                                   \
    }

QUANT_KERNELS(q4_0, LegacyRows<FMT_Q4_0>, 2)
QUANT_KERNELS(q4_1, LegacyRows<FMT_Q4_1>, 2)
QUANT_KERNELS(q5_0, LegacyRows<FMT_Q5_0>, 2)
QUANT_KERNELS(q5_1, LegacyRows<FMT_Q5_1>, 2)
QUANT_KERNELS(q4_k, KQuantRows<FMT_Q4_K>, 2)
QUANT_KERNELS(q5_k, KQuantRows<FMT_Q5_K>, 2)
QUANT_KERNELS(q6_k, Q6KRows, 1)

// The decode products with x staged as int8 (tiles of 2048, as the bf16-x forms above):
// gemv_q4_0_x8 … gemv_q6_k_x8 (Q8_0's below, with its rows).
#define QUANT_GEMV_X8(name, UNROLL, ...)                                                     \
    extern "C" __global__ void gemv_##name##_x8(const u8* w, const bf16* x, float* out, int M, \
                                                int K, int n, int ldo) {                     \
        gemv_rows<__VA_ARGS__, UNROLL>(w, x, out, M, K, n, ldo);                             \
    }
QUANT_GEMV_X8(q4_0, 2, LegacyX8Rows<FMT_Q4_0, 2048>)
QUANT_GEMV_X8(q4_1, 2, LegacyX8Rows<FMT_Q4_1, 2048>)
QUANT_GEMV_X8(q5_0, 2, LegacyX8Rows<FMT_Q5_0, 2048>)
QUANT_GEMV_X8(q5_1, 2, LegacyX8Rows<FMT_Q5_1, 2048>)
QUANT_GEMV_X8(q4_k, 2, KQuantX8Rows<FMT_Q4_K, 2048>)
QUANT_GEMV_X8(q5_k, 2, KQuantX8Rows<FMT_Q5_K, 2048>)
QUANT_GEMV_X8(q6_k, 1, Q6KX8Rows<2048>)

// Q8_0 (one group of 32 per block, value d·q), split on the device into the blocks' 32 int8
// quants (so all M rows' quants, [M][K] row-major), then their f16 scales ([M][K / 32]). A
// chunk is half a block: 16 quants, their products with x summed, then times the scale.
struct Q8_0Rows {
    static constexpr int PER_CHUNK = 16, CHUNK_BYTES = 16;
    struct Raw {
        uint4 q;
        unsigned short d;  // loaded with the quants: the sums never wait for it
    };
    struct Chunk {
        float q[16];
        float d;
    };
    const uint4* row;
    const unsigned short* scales;  // this row's, one per 32 quants
    __device__ __forceinline__ Q8_0Rows(const void* w, int m, int M, int K) {
        size_t blocks = (size_t)M * (K / 32), first = (size_t)m * (K / 32);
        row = (const uint4*)segment(w, blocks, 0, 32, first);
        scales = (const unsigned short*)segment(w, blocks, 32, 2, first);
    }
    __device__ __forceinline__ Raw load(int c) const {
        return Raw{__ldg(row + c), __ldg(scales + c / 2)};
    }
    __device__ __forceinline__ Chunk decode(const Raw& r, int) const {
        Chunk c;
        c.d = f16_to_f32(r.d);
        s8x4_as_floats(r.q.x, c.q);
        s8x4_as_floats(r.q.y, c.q + 4);
        s8x4_as_floats(r.q.z, c.q + 8);
        s8x4_as_floats(r.q.w, c.q + 12);
        return c;
    }
    // The chunk's products with its 16 bf16 of x (two 16-byte pieces), times the scale.
    __device__ __forceinline__ float dot(const Chunk& c, const uint4* x, int at) const {
        return c.d * dot_bf16x8(c.q + 8, x[2 * at + 1], dot_bf16x8(c.q, x[2 * at], 0.0f));
    }
};

extern "C" __global__ void gemv_q8_0(const u8* w, const bf16* x, float* out, int M, int K, int n,
                                     int ldo) {
    gemv_rows<Q8_0Rows, 4>(w, x, out, M, K, n, ldo);
}

// Q8_0 rows whose products take x staged as int8 (gemv_stage_x8, a tile of TILE_ELEMS): a
// chunk's 16 quants times x's 16 bytes in four __dp4a, times the block's d and the x group's
// scale (no offsets: Q8_0 is symmetric) — llama.cpp's q8_0 · q8_1 product, where the bf16-x
// form converts every weight and every x to a float.
template <int TILE_ELEMS>
struct Q8_0X8Rows : Q8_0Rows, ReadsX8<TILE_ELEMS> {
    struct Chunk {
        unsigned int q[4];
        float d;
    };
    __device__ __forceinline__ Q8_0X8Rows(const void* w, int m, int M, int K)
        : Q8_0Rows(w, m, M, K) {}
    __device__ __forceinline__ Chunk decode(const Raw& r, int) const {
        return Chunk{{r.q.x, r.q.y, r.q.z, r.q.w}, f16_to_f32(r.d)};
    }
    // The chunk's products with the staged x (chunk `at` of the tile: elements 16·at on).
    __device__ __forceinline__ float dot(const Chunk& c, const uint4* x, int at) const {
        const StagedX8<TILE_ELEMS> sx(x);
        int dot = dot_s8x16(c.q, sx.sixteen(16 * at), 0);
        // |dot| ≤ 16 · 128 · 127: exact as a float without the conversion unit.
        return c.d * sx.scales[at / 2] * small_int_as_float(dot);
    }
};

extern "C" __global__ void gemv_q8_0_x8(const u8* w, const bf16* x, float* out, int M, int K,
                                        int n, int ldo) {
    gemv_rows<Q8_0X8Rows<2048>, 4>(w, x, out, M, K, n, ldo);
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
        float v[8];
        s8x4_as_floats(q.x, v);
        s8x4_as_floats(q.y, v + 4);
#pragma unroll
        for (int l = 0; l < 8; l++) v[l] *= d;
        ((uint4*)out)[p] = bf16x8(v);
    }
}
