// Picking a token where the logits are (appended to kernels.cu at compile time, see
// kernels.rs): greedy, or a draw by temperature, min-p, top-k and top-p as the host sampler
// defines them (sampler/draw.rs), with the logprobs a request asked for.

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

// f(i, row[i]) for the elements of a row this thread visits (every blockDim.x-th one, in
// any order): four per 16-byte load, two loads in flight before either is used where the
// row allows (row_pass; more take more registers than 1024 threads have). A vocabulary is
// ~10^5 logits per block: waited for one at a time, each pass over it took ~50 µs on an H200.
template <class F>
__device__ __forceinline__ void for_each_logit(const float* row, int vocab, F f) {
    if (vocab % 4 == 0 && ((unsigned long long)row & 15ull) == 0) {
        const float4* quads = (const float4*)row;
        row_pass<2>(vocab / 4, [&](int c) { return quads[c]; },
                 [&](int c, float4 v) {
                     f(4 * c, v.x);
                     f(4 * c + 1, v.y);
                     f(4 * c + 2, v.z);
                     f(4 * c + 3, v.w);
                 });
    } else {
        row_pass(vocab, [&](int i) { return row[i]; }, f);
    }
}

// The weight of a logit relative to the row's best, exp((l - max) / T); NaN and masked
// tokens weigh 0. Recomputed in every pass rather than stored: the row stays intact.
__device__ __forceinline__ float weight_of(float l, float max, float inv_t) {
    float x = (l - max) * inv_t;
    return (l == l && x >= -87.0f) ? __expf(x) : 0.0f;
}

// Masses in fixed point, 2^-43 of a weight (<= 1): a vocabulary of up to 2^21 tokens sums
// without overflow, and sums are exact whatever their order — the same whether a pass visits
// a whole row or the candidates a pass gathered in no particular order.
#define MASS_ONE 8796093022208.0

__device__ __forceinline__ unsigned long long fixed_mass(unsigned bits) {
    return (unsigned long long)((double)__uint_as_float(bits) * MASS_ONE + 0.5);
}

// Of the tokens `each` visits (each(f) calls f(weight bits) for this thread's share; positive
// floats order like their bits): how many weigh >= bits `t`, and their mass.
template <class Each>
__device__ int count_at_least(Each each, unsigned t) {
    int c = 0;
    each([&](unsigned b) { c += b >= t; });
    return block_total(c);
}

template <class Each>
__device__ unsigned long long mass_at_least(Each each, unsigned t) {
    unsigned long long m = 0;
    each([&](unsigned b) {
        if (b >= t) m += fixed_mass(b);
    });
    return block_total(m);
}

// What a draw keeps: every token weighing more than bits `t`, and the first `ties` (in id
// order) of those weighing exactly t.
struct Cut {
    unsigned t;
    int ties;
};

#define ONE_BITS 0x3f800000u
#define PICK_PARAMS 7
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

// Top-k, then top-p, over the tokens `each` visits — every token of the row weighing at least
// bits `lo` (>= cut.t), where the answers lie: at least top_k of them when `by_k`, and with
// top-p alone at least `need` of mass. Thresholds found by bisection over the weights' bits.
// `kept_mass`: the mass of the tokens weighing at least cut.t (all of them: top-p alone).
template <class Each>
__device__ Cut top_k_and_p_over(Each each, Cut cut, unsigned lo, bool by_k, int top_k,
                                float top_p, unsigned long long kept_mass) {
    if (by_k) {
        unsigned a = lo, b = ONE_BITS;  // count(w >= a) >= top_k throughout
        while (a < b) {
            unsigned mid = a + (b - a + 1) / 2;
            if (count_at_least(each, mid) >= top_k) a = mid; else b = mid - 1;
        }
        cut.t = a;
        cut.ties = top_k - count_at_least(each, a + 1);
    }
    if (top_p < 1.0f) {
        unsigned long long total = kept_mass;
        if (by_k) {
            int at_t = count_at_least(each, cut.t) - count_at_least(each, cut.t + 1);
            total = mass_at_least(each, cut.t + 1) +
                    (unsigned long long)min(cut.ties, at_t) * fixed_mass(cut.t);
        }
        double need = (double)(top_p * (float)((double)total / MASS_ONE)) * MASS_ONE;
        unsigned a = max(lo, cut.t), b = ONE_BITS;  // the mass from a up reaches `need`
        while (a < b) {
            unsigned mid = a + (b - a + 1) / 2;
            if ((double)mass_at_least(each, mid) >= need) a = mid; else b = mid - 1;
        }
        if (a > cut.t) {
            cut.t = a;
            cut.ties = 0x7fffffff;
        }
        double above = (double)mass_at_least(each, cut.t + 1);
        int wanted = (int)ceil((need - above) / ((double)__uint_as_float(cut.t) * MASS_ONE));
        cut.ties = min(cut.ties, max(wanted, 1));
    }
    return cut;
}

// Tokens a block gathers to search top-k's and top-p's thresholds among (16 KiB of shared
// memory): a typical cut keeps a few of a vocabulary's ~10^5 tokens.
#define PICK_CANDIDATES 4096
#define WEIGHT_EXPONENTS 128

// Top-k then top-p cuts of a row (kept so far: `cut`). A whole-row pass per bisection step
// would be ~30 passes per search; instead one pass counts the tokens and their mass per
// exponent of their weight, the heaviest exponents that hold the answers are chosen, one
// pass gathers their tokens into shared memory, and the bisections run there. A row whose
// answers need more than PICK_CANDIDATES tokens (a flat one) is searched pass by pass.
__device__ Cut cut_top_k_and_p(const float* row, int vocab, float best, float inv_t, Cut cut,
                               int top_k, float top_p) {
    __shared__ int counts[WEIGHT_EXPONENTS];
    __shared__ unsigned long long masses[WEIGHT_EXPONENTS];
    __shared__ unsigned candidates[PICK_CANDIDATES];
    __shared__ int gathered;
    __shared__ unsigned from;
    auto whole_row = [&](auto f) {
        for_each_logit(row, vocab, [&](int, float l) { f(__float_as_uint(weight_of(l, best, inv_t))); });
    };
    for (int e = threadIdx.x; e < WEIGHT_EXPONENTS; e += blockDim.x) {
        counts[e] = 0;
        masses[e] = 0;
    }
    if (threadIdx.x == 0) gathered = 0;
    __syncthreads();
    whole_row([&](unsigned b) {
        if (b < cut.t) return;
        atomicAdd(&counts[b >> 23], 1);  // weights <= 1: exponents < 128
        atomicAdd(&masses[b >> 23], fixed_mass(b));
    });
    __syncthreads();
    if (threadIdx.x == 0) {
        int kept = 0;
        unsigned long long kept_mass = 0;
        for (int e = 0; e < WEIGHT_EXPONENTS; e++) {
            kept += counts[e];
            kept_mass += masses[e];
        }
        bool by_k = top_k > 0 && top_k < kept;
        double need = (double)(top_p * (float)((double)kept_mass / MASS_ONE)) * MASS_ONE;
        // The heaviest exponents whose tokens hold the answers (else all of them).
        int e = WEIGHT_EXPONENTS - 1, count = counts[e];
        unsigned long long mass = masses[e];
        while (e > 0 && (by_k ? count < top_k : (double)mass < need)) {
            e--;
            count += counts[e];
            mass += masses[e];
        }
        from = max((unsigned)e << 23, cut.t);
        gathered = count;  // how many the gathering pass will find
        masses[0] = kept_mass;
        counts[0] = kept;
    }
    __syncthreads();
    unsigned lo = from;
    int expected = gathered;
    unsigned long long kept_mass = masses[0];
    bool by_k = top_k > 0 && top_k < counts[0];
    __syncthreads();
    if (!by_k && top_p >= 1.0f) return cut;
    if (expected > PICK_CANDIDATES) return top_k_and_p_over(whole_row, cut, cut.t, by_k, top_k, top_p, kept_mass);
    if (threadIdx.x == 0) gathered = 0;
    __syncthreads();
    whole_row([&](unsigned b) {
        if (b >= lo) candidates[atomicAdd(&gathered, 1)] = b;
    });
    __syncthreads();
    int n = gathered;
    auto gathered_tokens = [&](auto f) {
        for (int i = threadIdx.x; i < n; i += blockDim.x) f(candidates[i]);
    };
    Cut result = top_k_and_p_over(gathered_tokens, cut, lo, by_k, top_k, top_p, kept_mass);
    __syncthreads();
    return result;
}

// The sampled token of a row whose best logit is `best` (at `best_i`): see pick_rows.
__device__ int draw_token(const float* row, int vocab, float best, float temperature, int top_k,
                          float top_p, float min_p, float u, int best_i) {
    float inv_t = 1.0f / temperature;

    // min-p: every token weighing at least min_p (the best weighs 1); at least the smallest
    // positive weight.
    float min_w = fminf(fmaxf(min_p, 0.0f), 1.0f);
    Cut cut = {min_w > 0.0f ? __float_as_uint(min_w) : 1u, 0x7fffffff};
    if (top_k > 0 || top_p < 1.0f) cut = cut_top_k_and_p(row, vocab, best, inv_t, cut, top_k, top_p);
    unsigned t = cut.t;
    int ties = cut.ties;

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

// Grammar masks, before pick_rows: params[r][6] = m >= 0 names the mask of picked row r,
// masks[m·words ..] (bit t % 32 of word t / 32 set when token t is allowed); every other
// token's logit in row `first + r` becomes -inf, as the host sampler masks a row. One block
// per picked row; rows without a mask are left as they are.
extern "C" __global__ void mask_rows(float* logits, int first, int vocab, const int* params,
                                     const unsigned int* masks, int words) {
    grid_dependency_sync();
    int m = params[(size_t)blockIdx.x * PICK_PARAMS + 6];
    if (m < 0) return;
    float* row = logits + (size_t)(first + blockIdx.x) * vocab;
    const unsigned int* mask = masks + (size_t)m * words;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        bool allowed = (i >> 5) < words && ((mask[i >> 5] >> (i & 31)) & 1u);
        if (!allowed) row[i] = NEG_INF;
    }
}

// ids[r] = the token picked from logits row `first + r`, one block per row. params[r] =
// {temperature, top_k, top_p, min_p, u, top_logprobs, mask} (floats as bits; top_k an int;
// top_logprobs -1 when no logprobs are wanted; the mask is mask_rows'). Temperature < 1e-5 (or a row without a
// number) is greedy: the argmax, NaN never wins, ties to the lowest id. Otherwise weights
// exp((l - max) / T) (NaN and masked tokens weigh 0), min-p, top-k and top-p keep a prefix of
// the tokens ordered by weight (ties by id), as the host sampler defines them, and u picks
// in token order among the kept ones, by their weights. The kept prefix is "weight above t,
// and the first m tokens weighing exactly t"; top-k's and top-p's thresholds are found by
// bisection over the weights' bits, among the tokens of the heaviest weight exponents that
// hold them, gathered in shared memory (cut_top_k_and_p). With logprobs, logprobs[r] = {the token's logprob, then
// (id as float bits, logprob) of the top_logprobs best tokens}: log-softmax of the raw row.
extern "C" __global__ void pick_rows(const float* logits, int first, int vocab,
                                     const int* params, int* ids, float* logprobs) {
    grid_dependency_sync();
    const float* row = logits + (size_t)(first + blockIdx.x) * vocab;
    const int* p = params + (size_t)blockIdx.x * PICK_PARAMS;
    float temperature = __int_as_float(p[0]), top_p = __int_as_float(p[2]);
    float min_p = __int_as_float(p[3]), u = __int_as_float(p[4]);
    int top_k = p[1], top_logprobs = p[5];

    float best = NEG_INF;
    int best_i = 0x7fffffff;
    for_each_logit(row, vocab, [&](int i, float v) {
        if (v > best || (v == best && i < best_i)) {
            best = v;
            best_i = i;
        }
    });
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
        for_each_logit(row, vocab, [&](int, float l) { sum += __expf(clean_logit(l) - best); });
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
        for_each_logit(row, vocab, [&](int i, float raw) {
            float l = clean_logit(raw);
            bool after = l < prev || (l == prev && i > prev_i);
            if (after && (l > v || (l == v && i < vi))) {
                v = l;
                vi = i;
            }
        });
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
