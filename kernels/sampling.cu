// sampling.cu: f32 logits rows -> sampled token ids (and requested logprobs) on the GPU, so only
// those reach the host. Entry points: sample_rows, argmax_rows (the greedy fast path; logits are f32
// whatever the compute dtype).
//
// This is src/sampling.rs (`sample_row`) bit for bit; read its header for the semantics.
// Exactness: every float operation on the path that decides the token uses the explicitly rounded
// intrinsics (__fadd_rn, __fmul_rn, ...), so NVRTC's --fmad=true cannot contract them into FMAs
// and the results equal the host's IEEE f32 ops; masses are integers (p * 2^40 truncated), summed
// in u64, so no result depends on the order of a parallel sum. Only the logprob values use
// ordinary expf/log (compared with a tolerance).
//
// One block of SAMPLE_THREADS threads per sampled row. Row r reads:
//   iparams[r * 8 + _]: 0 logits row, 1 top_k (0 = off), 2 greedy (1/0), 3..4 penalty entries
//                       [start, end), 5 logprobs N (-1 = off), 6 output offset (in pairs)
//   fparams[r * 8 + _]: 0 1/temperature, 1 top_p, 2 min_p, 3 repetition, 4 presence, 5 frequency
//   draws[r]: the uniform u in [0, 1)
//   pens[e * 3 + _]: token, repeated (1/0), output count (entries of a row distinct)
// and writes pairs (token id, logprob f32 bits) at out + 2 * offset: the sampled token first,
// then the N top alternatives in rank order; id -1 means the row has no finite maximum.
// scratch: [rows, vocab] f32, the row's penalized copy z.
//
// Rank order: larger value first, lower id on ties, as the u64 `rank_key` (order-preserving
// 32-bit key of the value above ~id) read descending. Thresholds (top_k count, top_p mass) are
// found with a 4-pass 8-bit radix select over the value keys plus a prefix search over token ids
// among the values equal to the threshold: no sort. Histograms are per warp in shared memory,
// summed over lanes that share a bin with __match_any_sync (sm_70+), so no atomics are needed.
// Shared memory: 32 KB (histograms) + a few hundred bytes.

#define SAMPLE_THREADS 512
#define SAMPLE_WARPS (SAMPLE_THREADS / WARP_SIZE)
#define FULL_MASK 0xffffffffu

typedef unsigned long long u64;

// NaN -> -inf, -0 -> +0.
__device__ __forceinline__ float canon(float x) { return (x != x) ? KILN_NEG_INF : __fadd_rn(x, 0.0f); }

__device__ __forceinline__ unsigned order_key(float x) {
    unsigned b = __float_as_uint(x);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float key_value(unsigned k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}
__device__ __forceinline__ u64 rank_key(float x, int id) {
    return ((u64)order_key(x) << 32) | (u64)(0xffffffffu - (unsigned)id);
}
__device__ __forceinline__ int rank_id(u64 rk) { return (int)(0xffffffffu - (unsigned)(rk & 0xffffffffull)); }

// e^x for x <= 0 from correctly rounded f32 ops only: sampling.rs `exp_det`, with the same
// constants as bit patterns (log2 e, ln2 high/low, 1/7! .. 1/3!).
__device__ __forceinline__ float exp_det(float x) {
    if (x != x || x < -80.0f) return 0.0f;
    float k = roundf(__fmul_rn(x, __int_as_float(0x3fb8aa3b)));
    float r = __fsub_rn(__fsub_rn(x, __fmul_rn(k, __int_as_float(0x3f318000))),
                        __fmul_rn(k, __int_as_float(0xb95e8083)));
    float p = __int_as_float(0x39500d01);
    p = __fadd_rn(__fmul_rn(p, r), __int_as_float(0x3ab60b61));
    p = __fadd_rn(__fmul_rn(p, r), __int_as_float(0x3c088889));
    p = __fadd_rn(__fmul_rn(p, r), __int_as_float(0x3d2aaaab));
    p = __fadd_rn(__fmul_rn(p, r), __int_as_float(0x3e2aaaab));
    p = __fadd_rn(__fmul_rn(p, r), 0.5f);
    p = __fadd_rn(__fmul_rn(p, r), 1.0f);
    p = __fadd_rn(__fmul_rn(p, r), 1.0f);
    return __fmul_rn(p, __int_as_float(((int)k + 127) << 23));
}
__device__ __forceinline__ u64 mass_of(float p) { return (u64)__fmul_rn(p, 1099511627776.0f); }

// ---- block reductions (every thread calls; every thread gets the result) ----

__device__ __forceinline__ u64 block_max_u64(u64 v) {
    __shared__ u64 sh[SAMPLE_WARPS];
    int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    for (int o = WARP_SIZE / 2; o > 0; o >>= 1) {
        u64 w = __shfl_xor_sync(FULL_MASK, v, o);
        v = w > v ? w : v;
    }
    __syncthreads();  // earlier readers of sh are done
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    u64 r = sh[0];
    for (int w = 1; w < SAMPLE_WARPS; ++w) r = sh[w] > r ? sh[w] : r;
    return r;
}

__device__ __forceinline__ u64 warp_sum_u64(u64 v) {
    for (int o = WARP_SIZE / 2; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ u64 block_sum_u64(u64 v) {
    __shared__ u64 sh[SAMPLE_WARPS];
    int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    v = warp_sum_u64(v);
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    u64 r = 0;
    for (int w = 0; w < SAMPLE_WARPS; ++w) r += sh[w];
    return r;
}

__device__ __forceinline__ double block_sum_f64(double v) {
    __shared__ double sh[SAMPLE_WARPS];
    int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    for (int o = WARP_SIZE / 2; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    __syncthreads();
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    double r = 0.0;
    for (int w = 0; w < SAMPLE_WARPS; ++w) r += sh[w];
    return r;
}

// ---- per-token weights over the penalized row z ----

struct RowCtx {
    const float* z;
    float zmax;
    float inv_t;
    __device__ __forceinline__ float prob(int i) const {
        return exp_det(__fmul_rn(__fsub_rn(z[i], zmax), inv_t));
    }
    __device__ __forceinline__ unsigned key(int i) const { return order_key(z[i]); }
};

// Weight 1 for every token (top_k counts).
struct Ones {
    __device__ __forceinline__ u64 operator()(const RowCtx&, int) const { return 1; }
};
// Mass of tokens ranked at or before `cut` (top_p over the top_k set).
struct MassUpTo {
    u64 cut;
    __device__ __forceinline__ u64 operator()(const RowCtx& c, int i) const {
        return rank_key(c.z[i], i) >= cut ? mass_of(c.prob(i)) : 0;
    }
};
// Mass of the kept set: ranked at or before `cut` and p >= min_p.
struct Kept {
    u64 cut;
    float min_p;
    __device__ __forceinline__ u64 operator()(const RowCtx& c, int i) const {
        if (rank_key(c.z[i], i) < cut) return 0;
        float p = c.prob(i);
        return p >= min_p ? mass_of(p) : 0;
    }
};
// `inner` restricted to tokens whose value key equals `tau`.
template <typename W> struct AtKey {
    W inner;
    unsigned tau;
    __device__ __forceinline__ u64 operator()(const RowCtx& c, int i) const {
        return c.key(i) == tau ? inner(c, i) : 0;
    }
};

// The smallest id t with sum_{i <= t} w(i) > r, or -1 when the whole sum is <= r. Each warp owns
// a contiguous id segment; the warp whose segment holds the crossing walks it 32 ids at a time.
template <typename W>
__device__ int find_prefix(const RowCtx& c, const W& w, int vocab, u64 r) {
    __shared__ u64 seg_sum[SAMPLE_WARPS];
    __shared__ int found;
    int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    int seg = (vocab + SAMPLE_WARPS - 1) / SAMPLE_WARPS;
    int lo = min(warp * seg, vocab), hi = min(lo + seg, vocab);
    u64 s = 0;
    for (int i = lo + lane; i < hi; i += WARP_SIZE) s += w(c, i);
    s = warp_sum_u64(s);
    __syncthreads();  // earlier readers of seg_sum / found are done
    if (lane == 0) seg_sum[warp] = s;
    if (threadIdx.x == 0) found = -1;
    __syncthreads();
    u64 before = 0;
    int target = -1;
    for (int k = 0; k < SAMPLE_WARPS && target < 0; ++k) {
        if (before + seg_sum[k] > r) target = k;
        else before += seg_sum[k];
    }
    if (warp == target) {
        u64 cum = before;
        for (int base = lo; base < hi; base += WARP_SIZE) {
            int i = base + lane;
            u64 inc = i < hi ? w(c, i) : 0;
            for (int o = 1; o < WARP_SIZE; o <<= 1) {
                u64 t = __shfl_up_sync(FULL_MASK, inc, o);
                if (lane >= o) inc += t;
            }
            unsigned hit = __ballot_sync(FULL_MASK, cum + inc > r);
            if (hit) {
                if (lane == __ffs(hit) - 1) found = i;
                break;
            }
            cum += __shfl_sync(FULL_MASK, inc, WARP_SIZE - 1);
        }
    }
    __syncthreads();
    return found;
}

// Radix select: the largest value key tau with W(key >= tau) >= need, where W sums w over the
// row; `above` gets W(key > tau). Requires W(all) >= need >= 1.
// `hist` is [SAMPLE_WARPS * 256] in shared memory (declared once in the kernel: a __shared__
// array here would be allocated once per template instantiation).
template <typename W>
__device__ void radix_select(const RowCtx& c, const W& w, int vocab, u64 need, u64* hist,
                             unsigned* tau_out, u64* above_out) {
    __shared__ unsigned s_prefix;
    __shared__ u64 s_above;
    int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    unsigned prefix = 0;
    u64 above = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        unsigned hi_mask = shift == 24 ? 0u : (0xffffffffu << (shift + 8));
        __syncthreads();  // earlier readers of hist / s_prefix are done
        for (int j = threadIdx.x; j < SAMPLE_WARPS * 256; j += SAMPLE_THREADS) hist[j] = 0;
        __syncthreads();
        for (int base = 0; base < vocab; base += SAMPLE_THREADS) {
            int i = base + threadIdx.x;
            u64 v = 0;
            int bin = 256;  // no bin
            if (i < vocab) {
                unsigned k = c.key(i);
                if ((k & hi_mask) == prefix) {
                    v = w(c, i);
                    if (v) bin = (int)((k >> shift) & 255u);
                }
            }
            if (__ballot_sync(FULL_MASK, bin < 256) == 0) continue;  // warp-uniform skip
            // One leader per distinct bin adds the bin's sum over the warp: the warp's own
            // histogram has no concurrent writers, so no atomics.
            unsigned peers = __match_any_sync(FULL_MASK, bin);
            u64 sum = 0;
            for (int j = 0; j < WARP_SIZE; ++j) {
                u64 vj = __shfl_sync(FULL_MASK, v, j);
                if ((peers >> j) & 1u) sum += vj;
            }
            if (bin < 256 && lane == __ffs(peers) - 1) hist[warp * 256 + bin] += sum;
            __syncwarp();  // the next leader of this bin may be another lane: order the update
        }
        __syncthreads();
        for (int b = threadIdx.x; b < 256; b += SAMPLE_THREADS) {
            u64 t = 0;
            for (int k = 0; k < SAMPLE_WARPS; ++k) t += hist[k * 256 + b];
            hist[b] = t;  // column b is read and written by this thread only
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            int chosen = 0;
            for (int b = 255; b >= 0; --b) {
                u64 h = hist[b];
                if (above + h >= need) {
                    chosen = b;
                    break;
                }
                above += h;
            }
            s_prefix = prefix | ((unsigned)chosen << shift);
            s_above = above;
        }
        __syncthreads();
        prefix = s_prefix;
        above = s_above;
    }
    *tau_out = prefix;
    *above_out = above;
}

// The rank cut (a rank_key: keep tokens whose rank_key is >= it) holding the `need` first
// weight of the row in rank order.
template <typename W>
__device__ u64 rank_cut(const RowCtx& c, const W& w, int vocab, u64 need, u64* hist) {
    unsigned tau;
    u64 above;
    radix_select(c, w, vocab, need, hist, &tau, &above);
    AtKey<W> tie{w, tau};
    int t = find_prefix(c, tie, vocab, need - above - 1);
    if (t < 0) t = vocab - 1;  // unreachable: W(key == tau) >= need - above
    return ((u64)tau << 32) | (u64)(0xffffffffu - (unsigned)t);
}

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_rows(const float* logits, int vocab, const int* iparams, const float* fparams,
                const double* draws, const int* pens, float* scratch, int* out) {
    const int row = blockIdx.x;
    const int* ip = iparams + row * 8;
    const float* fp = fparams + row * 8;
    const float* l = logits + (long)ip[0] * vocab;
    float* z = scratch + (long)row * vocab;
    int* o = out + 2L * ip[6];
    const int top_k = ip[1], greedy = ip[2], n_logprobs = ip[5];
    const int tid = threadIdx.x;
    __shared__ u64 hist[SAMPLE_WARPS * 256];  // radix-select histograms, one per warp (32 KB)

    // 1. Logprobs of the raw row.
    bool ok = true;
    float lse = 0.0f;
    if (n_logprobs >= 0) {
        u64 best = 0;
        for (int i = tid; i < vocab; i += SAMPLE_THREADS) {
            u64 k = rank_key(canon(l[i]), i);
            best = k > best ? k : best;
        }
        best = block_max_u64(best);
        float rmax = key_value((unsigned)(best >> 32));
        if (isfinite(rmax)) {
            double s = 0.0;
            for (int i = tid; i < vocab; i += SAMPLE_THREADS) s += (double)expf(canon(l[i]) - rmax);
            s = block_sum_f64(s);
            lse = rmax + (float)log(s);
            u64 prev = best;
            for (int j = 0; j < n_logprobs; ++j) {
                u64 cur = best;
                if (j > 0) {
                    cur = 0;  // every rank_key is > 0
                    for (int i = tid; i < vocab; i += SAMPLE_THREADS) {
                        u64 k = rank_key(canon(l[i]), i);
                        if (k < prev && k > cur) cur = k;
                    }
                    cur = block_max_u64(cur);
                }
                if (tid == 0) {
                    o[2 * (1 + j)] = rank_id(cur);
                    o[2 * (1 + j) + 1] = __float_as_int(__fsub_rn(key_value((unsigned)(cur >> 32)), lse));
                }
                prev = cur;
            }
        } else {
            ok = false;
        }
    }

    // 2. The penalized copy.
    for (int i = tid; i < vocab; i += SAMPLE_THREADS) z[i] = canon(l[i]);
    __syncthreads();
    const float rep = fp[3], presence = fp[4], frequency = fp[5];
    for (int e = ip[3] + tid; e < ip[4]; e += SAMPLE_THREADS) {
        int tok = pens[3 * e];
        if (tok < 0 || tok >= vocab) continue;
        float x = z[tok];
        if (pens[3 * e + 1]) x = x > 0.0f ? __fdiv_rn(x, rep) : __fmul_rn(x, rep);
        int count = pens[3 * e + 2];
        if (count > 0) x = __fsub_rn(x, __fadd_rn(__fmul_rn(frequency, (float)count), presence));
        z[tok] = canon(x);
    }
    __syncthreads();

    // 3. Argmax of z (greedy, and the max every probability is relative to).
    u64 best = 0;
    for (int i = tid; i < vocab; i += SAMPLE_THREADS) {
        u64 k = rank_key(z[i], i);
        best = k > best ? k : best;
    }
    best = block_max_u64(best);
    const float zmax = key_value((unsigned)(best >> 32));
    if (!ok || !isfinite(zmax)) {
        if (tid == 0) {
            o[0] = -1;
            o[1] = 0;
        }
        return;  // block-uniform
    }
    int chosen = rank_id(best);

    // 4. top_k -> top_p -> min_p -> the draw.
    if (!greedy) {
        RowCtx c{z, zmax, fp[0]};
        const float top_p = fp[1], min_p = fp[2];
        u64 cut = 0;  // every rank_key is >= 0: keep all
        if (top_k > 0) cut = rank_cut(c, Ones{}, vocab, (u64)top_k, hist);
        if (top_p < 1.0f) {
            MassUpTo in_k{cut};
            u64 total = 0;
            for (int i = tid; i < vocab; i += SAMPLE_THREADS) total += in_k(c, i);
            total = block_sum_u64(total);
            u64 need = (u64)ceil(__dmul_rn((double)top_p, (double)total));
            if (need < 1) need = 1;
            if (need > total) need = total;
            if (total > 0) cut = rank_cut(c, in_k, vocab, need, hist);
        }
        Kept kept{cut, min_p};
        u64 m = 0;
        for (int i = tid; i < vocab; i += SAMPLE_THREADS) m += kept(c, i);
        m = block_sum_u64(m);
        if (m > 0) {
            u64 r = (u64)__dmul_rn(draws[row], (double)m);
            if (r > m - 1) r = m - 1;
            int t = find_prefix(c, kept, vocab, r);
            if (t >= 0) chosen = t;
        }
    }
    if (tid == 0) {
        o[0] = chosen;
        o[1] = n_logprobs >= 0 ? __float_as_int(__fsub_rn(canon(l[chosen]), lse)) : 0;
    }
}

// The greedy fast path: rows with no draw, no logprobs and no effective penalty need only step 3
// above, the argmax of canon(l) by rank (lowest id on ties), so they skip the penalized copy and
// the radix machinery. out[r] = that id, or -1 when the row has no finite maximum: exactly what
// sample_rows gives for such a row. rows[r]: the logits row of output r.
// grid (n_rows), block SAMPLE_THREADS.
#define ARGMAX_BATCH 16
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
    argmax_rows(const float* logits, int vocab, const int* rows, int* out) {
    const float* l = logits + (long)rows[blockIdx.x] * vocab;
    u64 best = 0;
    // ARGMAX_BATCH loads in flight per thread before their keys are compared (a max, so the
    // order does not matter): a 49 152-entry row is 6 round trips to L2, not 96.
    int i = threadIdx.x;
    for (; i + (ARGMAX_BATCH - 1) * SAMPLE_THREADS < vocab; i += ARGMAX_BATCH * SAMPLE_THREADS) {
        float v[ARGMAX_BATCH];
#pragma unroll
        for (int j = 0; j < ARGMAX_BATCH; ++j) v[j] = l[i + j * SAMPLE_THREADS];
#pragma unroll
        for (int j = 0; j < ARGMAX_BATCH; ++j) {
            const u64 k = rank_key(canon(v[j]), i + j * SAMPLE_THREADS);
            best = k > best ? k : best;
        }
    }
    for (; i < vocab; i += SAMPLE_THREADS) {
        u64 k = rank_key(canon(l[i]), i);
        best = k > best ? k : best;
    }
    best = block_max_u64(best);
    if (threadIdx.x == 0) {
        const float zmax = key_value((unsigned)(best >> 32));
        out[blockIdx.x] = isfinite(zmax) ? rank_id(best) : -1;
    }
}
