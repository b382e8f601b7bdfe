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

// The mass top-p keeps of `total` (fixed point): top_p times it in f32, as the host sampler
// computes its nucleus.
__device__ __forceinline__ double nucleus_need(float top_p, unsigned long long total) {
    return (double)(top_p * (float)((double)total / MASS_ONE)) * MASS_ONE;
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
        double need = nucleus_need(top_p, total);
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

// Tokens a block gathers to search among (16 KiB of shared memory): a typical top-k or top-p
// cut keeps a few of a vocabulary's ~10^5 tokens, top_logprobs at most 20.
#define PICK_CANDIDATES 4096
#define WEIGHT_EXPONENTS 128

// What the passes that weigh a row per exponent of its weights and gather its heaviest
// tokens share (one row per block).
__shared__ int exponent_counts[WEIGHT_EXPONENTS];
__shared__ unsigned long long exponent_masses[WEIGHT_EXPONENTS];
__shared__ unsigned gathered_ids[PICK_CANDIDATES];
__shared__ int gathered_count;
__shared__ unsigned gathered_from;

// Tokens and their mass.
struct Weighed {
    int count;
    unsigned long long mass;
};

// One pass: how many of the row's tokens weigh at least bits `t` (weights
// exp((l - best)·inv_t)), and their mass, per exponent of their weight (exponent_counts and
// exponent_masses, which stay for gather_heaviest) and in all.
__device__ Weighed weigh_by_exponent(const float* row, int vocab, float best, float inv_t,
                                     unsigned t) {
    for (int e = threadIdx.x; e < WEIGHT_EXPONENTS; e += blockDim.x) {
        exponent_counts[e] = 0;
        exponent_masses[e] = 0;
    }
    __syncthreads();
    int count = 0;
    unsigned long long mass = 0;
    for_each_logit(row, vocab, [&](int, float l) {
        unsigned b = __float_as_uint(weight_of(l, best, inv_t));
        if (b < t) return;
        unsigned long long m = fixed_mass(b);
        atomicAdd(&exponent_counts[b >> 23], 1);  // weights <= 1: exponents < 128
        atomicAdd(&exponent_masses[b >> 23], m);
        count++;
        mass += m;
    });
    return {block_total(count), block_total(mass)};
}

// After weigh_by_exponent: the tokens of the heaviest exponents, down to the first at which
// enough(count, mass) holds of those counted from the top (else all that were weighed), into
// gathered_ids in no order, in one pass — where they number at most PICK_CANDIDATES. Returns
// how many they are (more than PICK_CANDIDATES: none gathered) and in *from the least weight
// bits among them.
template <class Enough>
__device__ int gather_heaviest(const float* row, int vocab, float best, float inv_t, unsigned t,
                               Enough enough, unsigned* from) {
    if (threadIdx.x == 0) {
        int e = WEIGHT_EXPONENTS - 1, count = exponent_counts[e];
        unsigned long long mass = exponent_masses[e];
        while (e > 0 && !enough(count, mass)) {
            e--;
            count += exponent_counts[e];
            mass += exponent_masses[e];
        }
        gathered_from = max((unsigned)e << 23, t);
        gathered_count = count;
    }
    __syncthreads();
    unsigned lo = gathered_from;
    int expected = gathered_count;
    *from = lo;
    __syncthreads();
    if (expected > PICK_CANDIDATES) return expected;
    if (threadIdx.x == 0) gathered_count = 0;
    __syncthreads();
    for_each_logit(row, vocab, [&](int i, float l) {
        if (__float_as_uint(weight_of(l, best, inv_t)) >= lo)
            gathered_ids[atomicAdd(&gathered_count, 1)] = i;
    });
    __syncthreads();
    return gathered_count;
}

// Top-k then top-p cuts of a row (kept so far: `cut`). A whole-row pass per bisection step
// would be ~30 passes per search; instead one pass weighs the row per exponent of its
// weights, one gathers the tokens of the heaviest exponents that hold the answers (at least
// top_k tokens, or top_p of the mass), and the bisections run among those. A row whose
// answers need more than PICK_CANDIDATES tokens (a flat one) is searched pass by pass.
__device__ Cut cut_top_k_and_p(const float* row, int vocab, float best, float inv_t, Cut cut,
                               int top_k, float top_p) {
    Weighed kept = weigh_by_exponent(row, vocab, best, inv_t, cut.t);
    bool by_k = top_k > 0 && top_k < kept.count;
    if (!by_k && top_p >= 1.0f) return cut;
    double need = nucleus_need(top_p, kept.mass);
    auto enough = [&](int count, unsigned long long mass) {
        return by_k ? count >= top_k : (double)mass >= need;
    };
    unsigned lo;
    int n = gather_heaviest(row, vocab, best, inv_t, cut.t, enough, &lo);
    if (n > PICK_CANDIDATES) {
        auto whole_row = [&](auto f) {
            for_each_logit(row, vocab,
                           [&](int, float l) { f(__float_as_uint(weight_of(l, best, inv_t))); });
        };
        return top_k_and_p_over(whole_row, cut, cut.t, by_k, top_k, top_p, kept.mass);
    }
    auto gathered = [&](auto f) {
        for (int i = threadIdx.x; i < n; i += blockDim.x)
            f(__float_as_uint(weight_of(row[gathered_ids[i]], best, inv_t)));
    };
    Cut result = top_k_and_p_over(gathered, cut, lo, by_k, top_k, top_p, kept.mass);
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
    // The best tokens one pass each: the next in (logit desc, id asc) after the last one,
    // among the tokens of the heaviest exponents of exp(l - best) that number at least as
    // many as asked (a logit above another's weighs at least as much), gathered in one pass;
    // else over the whole row.
    int wanted = min(top_logprobs, MAX_TOP_LOGPROBS);
    int n = PICK_CANDIDATES + 1;
    if (finite && wanted > 0 && weigh_by_exponent(row, vocab, best, 1.0f, 1u).count >= wanted) {
        unsigned from;
        auto enough = [&](int count, unsigned long long) { return count >= wanted; };
        n = gather_heaviest(row, vocab, best, 1.0f, 1u, enough, &from);
    }
    auto tokens = [&](auto f) {
        if (n <= PICK_CANDIDATES)
            for (int c = threadIdx.x; c < n; c += blockDim.x) f(gathered_ids[c], row[gathered_ids[c]]);
        else
            for_each_logit(row, vocab, f);
    };
    float prev = -NEG_INF;
    int prev_i = -1;
    for (int k = 0; k < wanted; k++) {
        float v = NEG_INF;
        int vi = 0x7fffffff;
        tokens([&](int i, float raw) {
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
