// attention_decode.cu: decode attention over the paged KV cache at memory speed (issue 8 item 7).
// Entry points: attention_decode_{f32,f16,bf16}_{same,e5m2,e4m3}_d{64,128,256}_g{4,8} and
// attention_decode_combine_{f32,f16,bf16}.
//
// Every block row y is one query token t = q_index[y] (or y when q_index is null) of sequence
// q_seq[t] at position q_pos[t]; it attends to keys 0..=q_pos[t], already in the cache. Rows are
// independent, so several query tokens of one sequence (a prefill chunk, or the 2–16 draft tokens
// a speculative step verifies) are causal among themselves by their positions.
//
// Shapes: q, out [n_q, n_heads, head_dim] (compute type T); caches [num_blocks, block_size,
// n_kv_heads, head_dim] (storage C); block_tables [n_seqs, max_blocks] (int32). head_dim is a
// multiple of 8 and at most DV (the entry suffix d64/d128/256); the GQA group n_heads / n_kv_heads
// is at most GB (suffix g4/g8; smaller groups run in g4 with the spare heads skipped).
//
// Split of the keys (a function of the context length alone, so a row's result is the same bits
// whatever the batch, the grid or a graph's padding): part_len = max(DEC_MIN_PART,
// round_up(ceil(ctx / DEC_MAX_PARTS), DEC_PART_ALIGN)) keys, n_active = ceil(ctx / part_len) ≤
// DEC_MAX_PARTS parts (decode_part_len in attention_plan.rs is the host's copy).
//
// Grid (n_kv_heads, n_rows, Z): block (h, y, z) takes parts z, z + Z, ... < n_active of row y for
// KV head h and ALL query heads of its group, so each K/V row is read once per KV head, not once
// per query head. Z is any value ≥ 1 (the host picks it for occupancy; a block past n_active exits
// at once); the result does not depend on it.
//
// Inside a block (DEC_WARPS warps): a key row is read by TPK = DV / 8 lanes, 8 elements each (one
// 16-byte load for 16-bit storage, 8 bytes for fp8, two 16-byte loads for f32), converted to f32 in
// registers; a warp covers KPW = 32 / TPK keys at a time and each lane group takes two keys per
// iteration (K and V of both loaded before any arithmetic: four independent loads in flight per
// lane). Scores (q pre-scaled by scale · log2 e) are reduced over the TPK lanes with shuffles; each
// lane group keeps an online softmax (max m, sum l, acc) per query head in base 2. At the end of a
// part the lane groups merge by shuffles, the warps through shared memory.
//
// Output of a part: with n_active == 1 the row's result acc / l goes straight to `out` (short
// contexts: no combine work); otherwise (m, l, acc) go to part_m/part_l [n_rows, n_heads, n_slots]
// and part_acc [n_rows, n_heads, n_slots, head_dim] (f32, by block row y; n_slots ≥ every row's
// n_active) and attention_decode_combine_* merges the row's parts (m is in base 2).
//
// fp8: e5m2 is the upper byte of an f16; e4m3 is (sign << 15 | (byte & 0x7f) << 7) as an f16 times
// 2^8 (exact for every finite and subnormal e4m3 value; the NaN byte 0x7f, which the KV writer never
// produces — it saturates to 448 — would read as 480). No bf16 intrinsics or cp.async: sm_70 runs
// the same code.
#define DEC_WARPS 4
#define DEC_THREADS (DEC_WARPS * WARP_SIZE)
#define DEC_MIN_PART 128
#define DEC_MAX_PARTS 128
#define DEC_PART_ALIGN 64
#define DEC_LOG2E 1.4426950408889634f

__device__ __forceinline__ int decode_part_len(int ctx) {
    int per = (ctx + DEC_MAX_PARTS - 1) / DEC_MAX_PARTS;
    per = (per + DEC_PART_ALIGN - 1) / DEC_PART_ALIGN * DEC_PART_ALIGN;
    return max(DEC_MIN_PART, per);
}

// Eight consecutive storage elements at p[i..i+8) (i a multiple of 8: aligned) as f32.
template <typename C> struct Load8;
template <> struct Load8<float> {
    static __device__ __forceinline__ void load(const float* p, long i, float* o) {
        const float4 a = *reinterpret_cast<const float4*>(p + i);
        const float4 b = *reinterpret_cast<const float4*>(p + i + 4);
        o[0] = a.x; o[1] = a.y; o[2] = a.z; o[3] = a.w;
        o[4] = b.x; o[5] = b.y; o[6] = b.z; o[7] = b.w;
    }
};
template <> struct Load8<bf16_t> {
    static __device__ __forceinline__ void load(const bf16_t* p, long i, float* o) {
        const uint4 u = *reinterpret_cast<const uint4*>(p + i);
        const unsigned int w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            o[2 * k] = __uint_as_float(w[k] << 16);
            o[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
        }
    }
};
template <> struct Load8<__half> {
    static __device__ __forceinline__ void load(const __half* p, long i, float* o) {
        const uint4 u = *reinterpret_cast<const uint4*>(p + i);
        const unsigned int w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            o[2 * k] = __half2float(__ushort_as_half((unsigned short)(w[k] & 0xffffu)));
            o[2 * k + 1] = __half2float(__ushort_as_half((unsigned short)(w[k] >> 16)));
        }
    }
};
template <> struct Load8<E5M2> {
    static __device__ __forceinline__ void load(const E5M2* p, long i, float* o) {
        const uint2 u = *reinterpret_cast<const uint2*>(p + i);
        const unsigned int w[2] = {u.x, u.y};
#pragma unroll
        for (int k = 0; k < 2; ++k)
#pragma unroll
            for (int b = 0; b < 4; ++b)
                o[4 * k + b] = __half2float(__ushort_as_half((unsigned short)(((w[k] >> (8 * b)) & 0xffu) << 8)));
    }
};
template <> struct Load8<E4M3> {
    static __device__ __forceinline__ void load(const E4M3* p, long i, float* o) {
        const uint2 u = *reinterpret_cast<const uint2*>(p + i);
        const unsigned int w[2] = {u.x, u.y};
#pragma unroll
        for (int k = 0; k < 2; ++k)
#pragma unroll
            for (int b = 0; b < 4; ++b) {
                const unsigned int x = (w[k] >> (8 * b)) & 0xffu;
                const unsigned short h = (unsigned short)(((x & 0x80u) << 8) | ((x & 0x7fu) << 7));
                o[4 * k + b] = __half2float(__ushort_as_half(h)) * 256.0f;
            }
    }
};

// exp2(a - m) for a running max m that may be -inf (then the term is empty: 0).
__device__ __forceinline__ float dec_scale(float a, float m) {
    return a == KILN_NEG_INF ? 0.0f : exp2f(a - m);
}

template <typename T, typename C, int DV, int GB>
__device__ void attention_decode(const T* q, const C* k_cache, const C* v_cache,
                                 const int* block_tables, const int* q_seq, const int* q_pos,
                                 const int* q_index, T* out, float* part_m, float* part_l,
                                 float* part_acc, int n_heads, int n_kv_heads, int head_dim,
                                 int block_size, int max_blocks, int n_slots, float scale) {
    constexpr int TPK = DV / 8;           // lanes per key row
    constexpr int KPW = WARP_SIZE / TPK;  // keys per warp at a time
    constexpr int NG = DEC_WARPS * KPW;   // lane groups per block
    __shared__ float sm_m[DEC_WARPS][GB], sm_l[DEC_WARPS][GB];
    __shared__ float sm_acc[DEC_WARPS][GB][DV];

    const int kv_head = blockIdx.x;
    const long row_y = blockIdx.y;
    const long t = q_index ? q_index[row_y] : row_y;
    const int ctx = q_pos[t] + 1;
    const int part_len = decode_part_len(ctx);
    const int n_active = (ctx + part_len - 1) / part_len;
    if ((int)blockIdx.z >= n_active) return;  // block-uniform: before any barrier

    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int kg = lane / TPK;                // this lane's key slot in the warp
    const int d0 = (lane % TPK) * 8;          // this lane's 8 dims
    const bool has_dims = d0 < head_dim;
    const int group = n_heads / n_kv_heads;
    const int* table = block_tables + (long)q_seq[t] * max_blocks;
    const long kv_row = (long)n_kv_heads * head_dim;
    const long head_off = (long)kv_head * head_dim + d0;

    float qf[GB][8];
    const float qscale = scale * DEC_LOG2E;
#pragma unroll
    for (int g = 0; g < GB; ++g) {
        const long qb = (t * n_heads + (long)kv_head * group + g) * (long)head_dim + d0;
#pragma unroll
        for (int i = 0; i < 8; ++i)
            qf[g][i] = (g < group && has_dims) ? Io<T>::load(q, qb + i) * qscale : 0.0f;
    }

    for (int part = blockIdx.z; part < n_active; part += gridDim.z) {
        const int start = part * part_len;
        const int end = min(ctx, start + part_len);
        float m[GB], l[GB], acc[GB][8];
#pragma unroll
        for (int g = 0; g < GB; ++g) {
            m[g] = KILN_NEG_INF;
            l[g] = 0.0f;
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[g][i] = 0.0f;
        }
        // jb is warp-uniform, so every lane runs the same iterations (full-warp shuffles are safe).
        for (int jb = start + warp * KPW; jb < end; jb += 2 * NG) {
            const int j0 = jb + kg, j1 = jb + NG + kg;
            const bool ok0 = j0 < end, ok1 = j1 < end;
            float k0[8], k1[8], v0[8], v1[8];
            if (ok0 && has_dims) {
                const long b0 = ((long)table[j0 / block_size] * block_size + j0 % block_size) * kv_row + head_off;
                Load8<C>::load(k_cache, b0, k0);
                Load8<C>::load(v_cache, b0, v0);
            } else {
#pragma unroll
                for (int i = 0; i < 8; ++i) k0[i] = v0[i] = 0.0f;
            }
            if (ok1 && has_dims) {
                const long b1 = ((long)table[j1 / block_size] * block_size + j1 % block_size) * kv_row + head_off;
                Load8<C>::load(k_cache, b1, k1);
                Load8<C>::load(v_cache, b1, v1);
            } else {
#pragma unroll
                for (int i = 0; i < 8; ++i) k1[i] = v1[i] = 0.0f;
            }
#pragma unroll
            for (int g = 0; g < GB; ++g) {
                if (g >= group) break;  // uniform over the block
                float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
                for (int i = 0; i < 8; ++i) {
                    s0 = fmaf(qf[g][i], k0[i], s0);
                    s1 = fmaf(qf[g][i], k1[i], s1);
                }
#pragma unroll
                for (int o = TPK / 2; o > 0; o >>= 1) {
                    s0 += __shfl_xor_sync(0xffffffffu, s0, o);
                    s1 += __shfl_xor_sync(0xffffffffu, s1, o);
                }
                s0 = ok0 ? s0 : KILN_NEG_INF;
                s1 = ok1 ? s1 : KILN_NEG_INF;
                const float mn = fmaxf(m[g], fmaxf(s0, s1));
                if (mn == KILN_NEG_INF) continue;  // no key yet for this lane group
                const float corr = dec_scale(m[g], mn);
                const float p0 = dec_scale(s0, mn), p1 = dec_scale(s1, mn);
                l[g] = fmaf(l[g], corr, p0 + p1);
#pragma unroll
                for (int i = 0; i < 8; ++i) acc[g][i] = fmaf(acc[g][i], corr, fmaf(p0, v0[i], p1 * v1[i]));
                m[g] = mn;
            }
        }
        // Merge the warp's lane groups (lanes d, d + TPK, ... hold the same dims).
#pragma unroll
        for (int o = TPK; o < WARP_SIZE; o <<= 1) {
#pragma unroll
            for (int g = 0; g < GB; ++g) {
                if (g >= group) break;
                const float mo = __shfl_xor_sync(0xffffffffu, m[g], o);
                const float lo = __shfl_xor_sync(0xffffffffu, l[g], o);
                const float mn = fmaxf(m[g], mo);
                const float cs = dec_scale(m[g], mn), co = dec_scale(mo, mn);
                l[g] = l[g] * cs + lo * co;
#pragma unroll
                for (int i = 0; i < 8; ++i) {
                    const float ao = __shfl_xor_sync(0xffffffffu, acc[g][i], o);
                    acc[g][i] = acc[g][i] * cs + ao * co;
                }
                m[g] = mn;
            }
        }
        if (kg == 0) {
#pragma unroll
            for (int g = 0; g < GB; ++g) {
                if (g >= group) break;
                if (lane == 0) {
                    sm_m[warp][g] = m[g];
                    sm_l[warp][g] = l[g];
                }
                if (has_dims) {
#pragma unroll
                    for (int i = 0; i < 8; ++i) sm_acc[warp][g][d0 + i] = acc[g][i];
                }
            }
        }
        __syncthreads();
        // Merge the warps: one thread per (query head of the group, dim).
        for (int idx = threadIdx.x; idx < group * head_dim; idx += blockDim.x) {
            const int g = idx / head_dim, d = idx - g * head_dim;
            float mx = KILN_NEG_INF;
#pragma unroll
            for (int w = 0; w < DEC_WARPS; ++w) mx = fmaxf(mx, sm_m[w][g]);
            float lsum = 0.0f, o = 0.0f;
#pragma unroll
            for (int w = 0; w < DEC_WARPS; ++w) {
                const float c = dec_scale(sm_m[w][g], mx);
                lsum += sm_l[w][g] * c;
                o += sm_acc[w][g][d] * c;
            }
            const int head = kv_head * group + g;
            if (n_active == 1) {
                Io<T>::store(out, (t * n_heads + head) * (long)head_dim + d, lsum > 0.0f ? o / lsum : 0.0f);
            } else {
                const long ph = (row_y * n_heads + head) * (long)n_slots + part;
                part_acc[ph * head_dim + d] = o;
                if (d == 0) {
                    part_m[ph] = mx;
                    part_l[ph] = lsum;
                }
            }
        }
        __syncthreads();  // the shared buffers are rewritten by the next part
    }
}

// Merge a row's parts: grid (n_heads, n_rows), DEC_THREADS threads; rows with one part were
// written by the main kernel and are left alone.
template <typename T>
__device__ void attention_decode_combine(const float* part_m, const float* part_l,
                                         const float* part_acc, const int* q_pos,
                                         const int* q_index, T* out, int n_heads, int head_dim,
                                         int n_slots) {
    __shared__ float w_s[DEC_MAX_PARTS];
    __shared__ float inv_s;
    const int head = blockIdx.x;
    const long row_y = blockIdx.y;
    const long t = q_index ? q_index[row_y] : row_y;
    const int ctx = q_pos[t] + 1;
    const int part_len = decode_part_len(ctx);
    const int n_active = (ctx + part_len - 1) / part_len;
    if (n_active <= 1) return;
    const long ph0 = (row_y * n_heads + head) * (long)n_slots;
    if (threadIdx.x < WARP_SIZE) {
        float mx = KILN_NEG_INF;
        for (int p = threadIdx.x; p < n_active; p += WARP_SIZE) mx = fmaxf(mx, part_m[ph0 + p]);
        mx = warp_max(mx);
        float lsum = 0.0f;
        for (int p = threadIdx.x; p < n_active; p += WARP_SIZE) {
            const float w = dec_scale(part_m[ph0 + p], mx);
            w_s[p] = w;
            lsum += part_l[ph0 + p] * w;
        }
        lsum = warp_sum(lsum);
        if (threadIdx.x == 0) inv_s = lsum > 0.0f ? 1.0f / lsum : 0.0f;
    }
    __syncthreads();
    const float inv = inv_s;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float o = 0.0f;
        for (int p = 0; p < n_active; ++p) o = fmaf(part_acc[(ph0 + p) * head_dim + d], w_s[p], o);
        Io<T>::store(out, (t * n_heads + head) * (long)head_dim + d, o * inv);
    }
}

#define ATTENTION_DECODE_ONE(SUF, T, CSUF, C, DV, GB)                                               \
    extern "C" __global__ void __launch_bounds__(DEC_THREADS)                                       \
        attention_decode_##SUF##_##CSUF##_d##DV##_g##GB(                                            \
            const T* q, const C* kc, const C* vc, const int* bt, const int* q_seq,                  \
            const int* q_pos, const int* q_index, T* out, float* pm, float* pl, float* pacc,        \
            int n_heads, int n_kv_heads, int head_dim, int block_size, int max_blocks,             \
            int n_slots, float scale) {                                                             \
        attention_decode<T, C, DV, GB>(q, kc, vc, bt, q_seq, q_pos, q_index, out, pm, pl, pacc,     \
                                       n_heads, n_kv_heads, head_dim, block_size, max_blocks,       \
                                       n_slots, scale);                                             \
    }
#define ATTENTION_DECODE_DIMS(SUF, T, CSUF, C, DV)                                                  \
    ATTENTION_DECODE_ONE(SUF, T, CSUF, C, DV, 4)                                                    \
    ATTENTION_DECODE_ONE(SUF, T, CSUF, C, DV, 8)
#define ATTENTION_DECODE_STORAGE(SUF, T, CSUF, C)                                                   \
    ATTENTION_DECODE_DIMS(SUF, T, CSUF, C, 64)                                                      \
    ATTENTION_DECODE_DIMS(SUF, T, CSUF, C, 128)                                                     \
    ATTENTION_DECODE_DIMS(SUF, T, CSUF, C, 256)
#define ATTENTION_DECODE_COMBINE(SUF, T)                                                            \
    extern "C" __global__ void __launch_bounds__(DEC_THREADS) attention_decode_combine_##SUF(       \
        const float* pm, const float* pl, const float* pacc, const int* q_pos,                      \
        const int* q_index, T* out, int n_heads, int head_dim, int n_slots) {                       \
        attention_decode_combine<T>(pm, pl, pacc, q_pos, q_index, out, n_heads, head_dim, n_slots); \
    }

// Instantiations. By default all of them (what `kiln doctor` and the compile test check); a backend
// compiles only its own (compute dtype, KV storage) pair with -DKILN_DECODE_ONLY
// -DKILN_DECODE_T_<dtype> -DKILN_DECODE_C_<storage> (54 kernels → 6: most of the cold start).
#if !defined(KILN_DECODE_ONLY) || (defined(KILN_DECODE_T_f32) && defined(KILN_DECODE_C_same))
ATTENTION_DECODE_STORAGE(f32, float, same, float)
#endif
#if !defined(KILN_DECODE_ONLY) || (defined(KILN_DECODE_T_f32) && defined(KILN_DECODE_C_e5m2))
ATTENTION_DECODE_STORAGE(f32, float, e5m2, E5M2)
#endif
#if !defined(KILN_DECODE_ONLY) || (defined(KILN_DECODE_T_f32) && defined(KILN_DECODE_C_e4m3))
ATTENTION_DECODE_STORAGE(f32, float, e4m3, E4M3)
#endif
#if !defined(KILN_DECODE_ONLY) || (defined(KILN_DECODE_T_f16) && defined(KILN_DECODE_C_same))
ATTENTION_DECODE_STORAGE(f16, __half, same, __half)
#endif
#if !defined(KILN_DECODE_ONLY) || (defined(KILN_DECODE_T_f16) && defined(KILN_DECODE_C_e5m2))
ATTENTION_DECODE_STORAGE(f16, __half, e5m2, E5M2)
#endif
#if !defined(KILN_DECODE_ONLY) || (defined(KILN_DECODE_T_f16) && defined(KILN_DECODE_C_e4m3))
ATTENTION_DECODE_STORAGE(f16, __half, e4m3, E4M3)
#endif
#if !defined(KILN_DECODE_ONLY) || (defined(KILN_DECODE_T_bf16) && defined(KILN_DECODE_C_same))
ATTENTION_DECODE_STORAGE(bf16, bf16_t, same, bf16_t)
#endif
#if !defined(KILN_DECODE_ONLY) || (defined(KILN_DECODE_T_bf16) && defined(KILN_DECODE_C_e5m2))
ATTENTION_DECODE_STORAGE(bf16, bf16_t, e5m2, E5M2)
#endif
#if !defined(KILN_DECODE_ONLY) || (defined(KILN_DECODE_T_bf16) && defined(KILN_DECODE_C_e4m3))
ATTENTION_DECODE_STORAGE(bf16, bf16_t, e4m3, E4M3)
#endif
#if !defined(KILN_DECODE_ONLY) || defined(KILN_DECODE_T_f32)
ATTENTION_DECODE_COMBINE(f32, float)
#endif
#if !defined(KILN_DECODE_ONLY) || defined(KILN_DECODE_T_f16)
ATTENTION_DECODE_COMBINE(f16, __half)
#endif
#if !defined(KILN_DECODE_ONLY) || defined(KILN_DECODE_T_bf16)
ATTENTION_DECODE_COMBINE(bf16, bf16_t)
#endif
