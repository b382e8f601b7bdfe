// A mixture-of-experts feed-forward on the device (moe.rs launches them, in this order):
// the router's logits (a plain product) → moe_route (each token's experts and weights) →
// moe_sort (the step's (token, choice) slots grouped by expert, cut into tiles of at most
// GEMV_MAX_ROWS slots of one expert) → moe_gather (each slot's input row) → moe_gemv_* for
// every expert's [gate | up] at once (the activation written as bf16) → moe_gemv_* for every
// expert's down → moe_combine (each token's weighted sum of its experts, plus a shared
// expert) → add_rms_norm. gpt-oss's experts add their biases and activate with a clamped
// SwiGLU: their [gate | up] product writes f32 rows, moe_clamped_glu activates them, and
// moe_expert_bias adds the down biases. Every grid is sized by the step's token count alone (what a CUDA
// graph captures): tiles no expert fills are launched and return at once. Experts no token
// chose have no tile, so their weights are never read.

#define MOE_MAX_EXPERTS 256
#define MOE_SORT_THREADS 256
#define MOE_TILE_INTS 4  // expert, first slot, rows, unused (16 bytes a tile)

// Each token's top_k experts and their weights from its router logits (row t of `logits`,
// `ld` apart, plus `bias` where the router has one: gpt-oss): softmax over the n_experts logits, the largest probabilities first (ties: the
// lower expert, as the CPU backend's moe_routing.rs picks), renormalised to sum to 1 with
// `norm_topk`. With `shared_scale`, the logit at column n_experts is a shared expert's gate:
// shared_scale[t] = sigmoid(it). A thread per token.
extern "C" __global__ void moe_route(const float* __restrict__ logits,
                                     const float* __restrict__ bias, int ld,
                                     int* __restrict__ ids, float* __restrict__ weights,
                                     float* __restrict__ shared_scale, int n, int n_experts,
                                     int top_k, int norm_topk) {
    grid_dependency_sync();  // the router's product wrote the logits
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n) return;
    const float* row = logits + (size_t)t * ld;
    auto logit = [&](int e) { return bias ? row[e] + bias[e] : row[e]; };
    float mx = NEG_INF;
    for (int e = 0; e < n_experts; e++) mx = fmaxf(mx, logit(e));
    float sum = 0.0f;
    for (int e = 0; e < n_experts; e++) sum += expf(logit(e) - mx);
    unsigned int taken[MOE_MAX_EXPERTS / 32];
    for (int w = 0; w < MOE_MAX_EXPERTS / 32; w++) taken[w] = 0;
    float total = 0.0f;
    for (int k = 0; k < top_k; k++) {
        int best = 0;
        float bp = -1.0f;  // probabilities are >= 0: the first untaken expert at worst
        for (int e = 0; e < n_experts; e++) {
            if (taken[e / 32] >> (e % 32) & 1u) continue;
            float p = expf(logit(e) - mx) / sum;
            if (p > bp) {
                best = e;
                bp = p;
            }
        }
        taken[best / 32] |= 1u << (best % 32);
        ids[t * top_k + k] = best;
        weights[t * top_k + k] = bp;
        total += bp;
    }
    if (norm_topk && total > 0.0f)
        for (int k = 0; k < top_k; k++) weights[t * top_k + k] /= total;
    if (shared_scale) shared_scale[t] = 1.0f / (1.0f + expf(-row[n_experts]));
}

// The step's `slots` choices (ids: top_k per token) grouped by expert, tokens ascending within
// an expert: slot_token[s] is sorted slot s's token, slot_of[i] choice i's sorted slot, and
// tiles[MOE_TILE_INTS·t] tile t's (expert, first slot, rows), rows at most GEMV_MAX_ROWS, the
// experts' tiles in expert order, then tiles of 0 rows up to max_tiles. One block.
extern "C" __global__ void moe_sort(const int* __restrict__ ids, int slots, int top_k,
                                    int n_experts, int max_tiles, int* __restrict__ slot_token,
                                    int* __restrict__ slot_of, int* __restrict__ tiles) {
    grid_dependency_sync();  // moe_route wrote the ids
    __shared__ int count[MOE_MAX_EXPERTS], start[MOE_MAX_EXPERTS], first_tile[MOE_MAX_EXPERTS];
    for (int e = threadIdx.x; e < n_experts; e += blockDim.x) count[e] = 0;
    for (int i = threadIdx.x; i < max_tiles * MOE_TILE_INTS; i += blockDim.x) tiles[i] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < slots; i += blockDim.x) atomicAdd(&count[ids[i]], 1);
    __syncthreads();
    if (threadIdx.x == 0) {
        int s = 0, t = 0;
        for (int e = 0; e < n_experts; e++) {
            start[e] = s;
            first_tile[e] = t;
            s += count[e];
            t += (count[e] + GEMV_MAX_ROWS - 1) / GEMV_MAX_ROWS;
        }
    }
    __syncthreads();
    // A thread per expert walks the choices in order: the same grouping whatever order the
    // counts were made in.
    for (int e = threadIdx.x; e < n_experts; e += blockDim.x) {
        int at = start[e];
        for (int i = 0; i < slots; i++) {
            if (ids[i] != e) continue;
            slot_token[at] = i / top_k;
            slot_of[i] = at;
            at++;
        }
        for (int r = 0; r < count[e]; r += GEMV_MAX_ROWS) {
            int* tile = tiles + (size_t)(first_tile[e] + r / GEMV_MAX_ROWS) * MOE_TILE_INTS;
            tile[0] = e;
            tile[1] = start[e] + r;
            tile[2] = min(GEMV_MAX_ROWS, count[e] - r);
        }
    }
}

// out[s] = x[slot_token[s]]: each sorted slot's input row (bf16, `hidden` wide, a multiple of
// 8), a thread per 16 bytes; grid (chunk blocks, slots).
extern "C" __global__ void moe_gather(const bf16* __restrict__ x, const int* __restrict__ slot_token,
                                      bf16* __restrict__ out, int hidden) {
    grid_dependency_sync();  // the norm wrote x, moe_sort the slots' tokens
    int chunks = hidden / 8, c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= chunks) return;
    int s = blockIdx.y;
    const uint4* src = (const uint4*)(x + (size_t)slot_token[s] * hidden);
    ((uint4*)(out + (size_t)s * hidden))[c] = __ldg(src + c);
}

// Tile blockIdx.y's product through its expert: the expert's matrix at w + expert·stride
// (bytes; every expert of a layer in one format and shape), x the tile's rows of the sorted
// input, out its rows of the sorted output (`ldo` apart: f32, or with `glu` >= 0 the bf16
// activation of a [gate | up] product, as gemv_t writes them). A tile of 0 rows returns.
template <class ROWS, int UNROLL>
__device__ __forceinline__ void moe_gemv_t(const u8* w, long long stride, const int* tiles,
                                           const bf16* x, void* out, int M, int K, int ldo,
                                           int glu) {
    grid_dependency_sync();  // moe_sort wrote the tiles
    const int* tile = tiles + (size_t)blockIdx.y * MOE_TILE_INTS;
    int expert = tile[0], first = tile[1], rows = tile[2];
    if (rows == 0) return;
    float* o = glu >= 0 ? (float*)((bf16*)out + (size_t)first * ldo)
                        : (float*)out + (size_t)first * ldo;
    gemv_t<ROWS, false, GEMV_WARPS, UNROLL, true, false>(
        w + (size_t)expert * stride, x + (size_t)first * K, o, M, K, rows, ldo, 0, GemvNorm{},
        GemvL2{0, 0}, glu);
}

// moe_gemv_bf16 and a grouped product per block format (the GEMVs' row types and unrolls).
#define MOE_GEMV(name, ROWS, UNROLL)                                                          \
    extern "C" __global__ void moe_gemv_##name(const u8* w, long long stride, const int* tiles, \
                                               const bf16* x, void* out, int M, int K, int ldo,  \
                                               int glu) {                                      \
        moe_gemv_t<ROWS, UNROLL>(w, stride, tiles, x, out, M, K, ldo, glu);                     \
    }
MOE_GEMV(bf16, Bf16Rows, 4)
MOE_GEMV(q4_0, LegacyRows<FMT_Q4_0>, 2)
MOE_GEMV(q4_1, LegacyRows<FMT_Q4_1>, 2)
MOE_GEMV(q5_0, LegacyRows<FMT_Q5_0>, 2)
MOE_GEMV(q5_1, LegacyRows<FMT_Q5_1>, 2)
MOE_GEMV(q4_k, KQuantRows<FMT_Q4_K>, 2)
MOE_GEMV(q5_k, KQuantRows<FMT_Q5_K>, 2)
MOE_GEMV(q6_k, Q6KRows, 1)
MOE_GEMV(q8_0, Q8_0Rows, 4)

// gpt-oss's expert activation over every tile's [gate | up] rows (f32, 2·ffn wide, by sorted
// slot), its expert's [gate | up] bias row (2·ffn per expert in `bias`) added first:
// act = bf16((clamp(up, ±limit) + 1) · g · sigmoid(alpha · g)) with g = min(gate, limit), as
// the CPU backend's clamped_swiglu. Grid (column blocks, tiles), as moe_gemv's.
extern "C" __global__ void moe_clamped_glu(const float* __restrict__ gate_up,
                                           const int* __restrict__ tiles,
                                           const float* __restrict__ bias, bf16* __restrict__ act,
                                           int ffn, float alpha, float limit) {
    grid_dependency_sync();  // the gate/up product wrote its rows
    const int* tile = tiles + (size_t)blockIdx.y * MOE_TILE_INTS;
    int expert = tile[0], first = tile[1], rows = tile[2];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= ffn) return;
    const float* b = bias + (size_t)expert * 2 * ffn;
    for (int r = 0; r < rows; r++) {
        const float* row = gate_up + (size_t)(first + r) * 2 * ffn;
        float g = fminf(row[i] + b[i], limit);
        float u = fminf(fmaxf(row[ffn + i] + b[ffn + i], -limit), limit);
        act[(size_t)(first + r) * ffn + i] = f32_to_bf16((u + 1.0f) * g / (1.0f + expf(-alpha * g)));
    }
}

// rows[s] += bias[e] for every sorted slot s of every tile, e its tile's expert (`width` wide,
// f32): the experts' down biases (gpt-oss). Grid (column blocks, tiles).
extern "C" __global__ void moe_expert_bias(float* __restrict__ rows, const int* __restrict__ tiles,
                                           const float* __restrict__ bias, int width) {
    grid_dependency_sync();  // the down product wrote its rows
    const int* tile = tiles + (size_t)blockIdx.y * MOE_TILE_INTS;
    int expert = tile[0], first = tile[1], count = tile[2];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= width) return;
    float b = bias[(size_t)expert * width + i];
    for (int r = 0; r < count; r++) rows[(size_t)(first + r) * width + i] += b;
}

// out[t] = Σ_k weights[t·top_k + k] · down[slot_of[t·top_k + k]] (in choice order), plus
// shared_scale[t] · shared[t] where there is a shared expert (`shared` non-null): token t's
// feed-forward output, `hidden` wide. A thread per element; grid (element blocks, n).
extern "C" __global__ void moe_combine(const float* __restrict__ down, const int* __restrict__ slot_of,
                                       const float* __restrict__ weights,
                                       const float* __restrict__ shared,
                                       const float* __restrict__ shared_scale,
                                       float* __restrict__ out, int hidden, int top_k) {
    grid_dependency_sync();  // the down product wrote its rows
    int h = blockIdx.x * blockDim.x + threadIdx.x;
    if (h >= hidden) return;
    int t = blockIdx.y;
    float s = 0.0f;
    for (int k = 0; k < top_k; k++) {
        int i = t * top_k + k;
        s += weights[i] * down[(size_t)slot_of[i] * hidden + h];
    }
    if (shared) s += shared_scale[t] * shared[(size_t)t * hidden + h];
    out[(size_t)t * hidden + h] = s;
}
