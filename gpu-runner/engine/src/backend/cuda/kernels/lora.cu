// LoRA deltas of a step's rows, each row through its own adapter (Punica's BGMV): after a
// targeted projection y = W·x, row r of an adapter's sequence gets y[r] += B·(A·x[r]) (B
// already scaled), in two launches: lora_shrink (t = A·x, rank values per row), then
// lora_expand (y += B·t). Base rows (row_slot -1) are left alone.
//
// Each adapter on the device has a descriptor: for every (layer, target) entry, LORA_TARGETS
// entries per layer, the addresses of its A (rank × in, f16) and its scaled Bᵀ (rank × out,
// f16), both 0 where the adapter leaves that projection alone. A step's adapters are its
// slots: slot_desc[s] is slot s's descriptor, slot_rank[s] its rank.

#define LORA_TARGETS 7

// The (A, Bᵀ) addresses of `entry` in row r's adapter; false for a base row or a projection
// its adapter leaves alone.
__device__ __forceinline__ bool lora_pair(const int* row_slot, const unsigned long long* slot_desc,
                                          int r, int entry, const unsigned short** a,
                                          const unsigned short** b) {
    int slot = row_slot[r];
    if (slot < 0) return false;
    const unsigned long long* desc = (const unsigned long long*)slot_desc[slot];
    *a = (const unsigned short*)desc[2 * entry];
    *b = (const unsigned short*)desc[2 * entry + 1];
    return *a != nullptr;
}

// t[r·max_rank + j] = A[j] · x[r] for j < rank of row r's adapter (x bf16, K wide): a block
// per row, a warp per rank index at a time, lanes over K.
extern "C" __global__ void lora_shrink(const bf16* __restrict__ x, int K,
                                       const int* __restrict__ row_slot,
                                       const unsigned long long* __restrict__ slot_desc,
                                       const int* __restrict__ slot_rank, int entry,
                                       float* __restrict__ t, int max_rank) {
    grid_dependency_sync();  // the previous launch wrote x
    int r = blockIdx.x;
    const unsigned short *a, *b;
    if (!lora_pair(row_slot, slot_desc, r, entry, &a, &b)) return;
    int rank = slot_rank[row_slot[r]];
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    const bf16* xr = x + (size_t)r * K;
    for (int j = warp; j < rank; j += warps) {
        const unsigned short* aj = a + (size_t)j * K;
        float s = 0.0f;
        for (int k = lane; k < K; k += 32) s += f16_to_f32(aj[k]) * bf16_to_f32(xr[k]);
        s = warp_sum(s);
        if (lane == 0) t[(size_t)r * max_rank + j] = s;
    }
}

// y[r·ldy + col0 + m] += Σ_j t[r·max_rank + j] · Bᵀ[j, m] for m < out: a thread per output
// element; grid (output blocks, rows).
extern "C" __global__ void lora_expand(const float* __restrict__ t,
                                       const int* __restrict__ row_slot,
                                       const unsigned long long* __restrict__ slot_desc,
                                       const int* __restrict__ slot_rank, int entry,
                                       float* __restrict__ y, int ldy, int col0, int out,
                                       int max_rank) {
    grid_dependency_sync();  // lora_shrink wrote t, the product y
    int r = blockIdx.y, m = blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned short *a, *b;
    if (m >= out || !lora_pair(row_slot, slot_desc, r, entry, &a, &b)) return;
    int rank = slot_rank[row_slot[r]];
    const float* tr = t + (size_t)r * max_rank;
    float s = 0.0f;
    for (int j = 0; j < rank; j++) s += tr[j] * f16_to_f32(b[(size_t)j * out + m]);
    y[(size_t)r * ldy + col0 + m] += s;
}
