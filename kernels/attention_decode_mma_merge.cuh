// attention_decode_mma_merge.cuh: the combine of the tensor-core decode attention (issue 8 item 7).
// Not a module of its own: KernelModule::full_source (kernels.rs) compiles it after
// attention_decode_mma.cu (its DMMA_* constants, dmma_part_len, dmma_pdl_*, dmma_gated; the same
// KILN_DMMA_ONLY / KILN_DMMA_T_<t> instantiation switches).
//
// attention_decode_mma_combine_{f16,bf16}: the merge of a row's parts, grid (n_heads, n_rows,
// head_dim / 64), DMMA_MERGE_THREADS threads: block (head, y, z) writes dims 64 z .. 64 z + 63 of
// that head. Weights w_p = exp2(m_p - max_p m_p) and inv = 1 / Σ_p l_p w_p as
// attention_decode.cu's dec_merge_weights (one warp: lane-strided max and sum in part order, then
// the xor-shuffle tree); output dim d = inv · Σ_{g < 16} S_g[d], S_g = Σ_{p ≡ g mod 16} acc_p[d]
// w_p in increasing p, the 16 sums added in order g = 0..15. The order is a function of n_active
// alone (bits independent of the grid and of scheduling). A block's loads of the partials are in
// flight together (16 part groups × 16 float4 columns, DMMA_MERGE_NB parts per thread at a time:
// one round trip up to 16 · DMMA_MERGE_NB parts, the first with the weights' (m, l) loads), where attention_decode.cu's
// combine has 24 blocks for a 1-row 27B step and each thread walks the parts one after another.
// It waits (griddepcontrol.wait) before reading the partials, so it may be launched with PDL.

// Partials in flight per thread (float4 each): 4, one round trip up to 64 parts.
// -DDMMA_MERGE_NB=<n> changes it, same bits: 8 (one round trip for the 27B's 128 parts at 32K)
// measured no faster on the H200 (docs/benchmarks.md, `lctx5`, through a switch since removed).
#ifndef DMMA_MERGE_NB
#define DMMA_MERGE_NB 4
#endif

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800

// The merge of a row's parts (see the header): block (head, y, z), thread (g, col) = (tid / 16,
// tid % 16) loads the float4 of dims 64 z + 4 col .. + 3 of parts g, g + 16, ... (all in flight),
// then weighs them once warp 0 has the weights.
template <typename T>
__device__ void attention_decode_mma_combine(const float* part_m, const float* part_l,
                                             const float* part_acc, const int* q_pos,
                                             const int* q_index, T* out, int n_heads, int head_dim,
                                             int n_slots, int single_keys, int min_part,
                                             int max_parts, const T* gate, int gate_row,
                                             int gate_head) {
    constexpr int PG = DMMA_MERGE_PG, NI = DMMA_MAX_SLOTS / DMMA_MERGE_PG;
    __shared__ float w_s[DMMA_MAX_SLOTS];
    __shared__ __align__(16) float sums[PG][DMMA_MERGE_DIMS];
    __shared__ float inv_s;
    const int head = blockIdx.x;
    const long row_y = blockIdx.y;
    const long t = q_index ? q_index[row_y] : row_y;
    const int ctx = q_pos[t] + 1;
    const int part_len = dmma_part_len(ctx, single_keys, min_part, max_parts);
    const int n_active = (ctx + part_len - 1) / part_len;
    // The partials are the previous grid's (launched with PDL: wait for it before reading them).
    dmma_pdl_wait();
    dmma_pdl_launch_dependents();
    if (n_active <= 1 || n_active > DMMA_MAX_SLOTS) return;  // one part: written by the main kernel
    const int tid = threadIdx.x, lane = tid % WARP_SIZE;
    const int col = tid % (DMMA_MERGE_DIMS / 4), g = tid / (DMMA_MERGE_DIMS / 4);
    const int d0 = blockIdx.z * DMMA_MERGE_DIMS + 4 * col;
    const long ph0 = (row_y * n_heads + head) * (long)n_slots;
    // Parts g + 16 i in batches of NB (the first batch in flight with the weights' loads): one
    // round trip up to 16 NB parts. The same fmaf chain per thread for any NB: the same bits.
    constexpr int NB = DMMA_MERGE_NB;
    auto load = [&](int i) {
        const int p = g + PG * i;
        return p < n_active ? __ldcg(reinterpret_cast<const float4*>(part_acc + (ph0 + p) * head_dim + d0))
                            : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    };
    float4 a[NB];
#pragma unroll
    for (int i = 0; i < NB; ++i) a[i] = load(i);
    if (tid < WARP_SIZE) {
        // Lane's parts lane, lane + 32, ...: (m, l) loaded once, all in flight.
        constexpr int NL = DMMA_MAX_SLOTS / WARP_SIZE;
        float pm[NL], pl[NL];
        float mx = KILN_NEG_INF;
#pragma unroll
        for (int i = 0; i < NL; ++i) {
            const int p = lane + WARP_SIZE * i;
            pm[i] = p < n_active ? __ldcg(part_m + ph0 + p) : KILN_NEG_INF;
            pl[i] = p < n_active ? __ldcg(part_l + ph0 + p) : 0.0f;
        }
#pragma unroll
        for (int i = 0; i < NL; ++i) mx = fmaxf(mx, pm[i]);
        mx = warp_max(mx);
        float lsum = 0.0f;
#pragma unroll
        for (int i = 0; i < NL; ++i) {
            const int p = lane + WARP_SIZE * i;
            if (p < n_active) {
                const float w = pm[i] == KILN_NEG_INF ? 0.0f : exp2f(pm[i] - mx);
                w_s[p] = w;
                lsum = fmaf(pl[i], w, lsum);
            }
        }
        lsum = warp_sum(lsum);
        if (lane == 0) inv_s = lsum > 0.0f ? 1.0f / lsum : 0.0f;
    }
    __syncthreads();
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int i0 = 0; i0 < NI && g + PG * i0 < n_active; i0 += NB) {
        if (i0 > 0) {
#pragma unroll
            for (int i = 0; i < NB; ++i) a[i] = load(i0 + i);
        }
#pragma unroll
        for (int i = 0; i < NB; ++i) {
            const int p = g + PG * (i0 + i);
            if (p < n_active) {
                const float w = w_s[p];
                acc.x = fmaf(a[i].x, w, acc.x);
                acc.y = fmaf(a[i].y, w, acc.y);
                acc.z = fmaf(a[i].z, w, acc.z);
                acc.w = fmaf(a[i].w, w, acc.w);
            }
        }
    }
    *reinterpret_cast<float4*>(&sums[g][4 * col]) = acc;
    __syncthreads();
    if (tid < DMMA_MERGE_DIMS) {
        float o = 0.0f;
#pragma unroll
        for (int k = 0; k < PG; ++k) o += sums[k][tid];
        o *= inv_s;
        const int d = blockIdx.z * DMMA_MERGE_DIMS + tid;
        Io<T>::store(out, (t * n_heads + head) * (long)head_dim + d,
                     dmma_gated<T>(o, gate, t, head, d, gate_row, gate_head));
    }
}

#define DMMA_COMBINE_BODY(T)                                                                        \
    attention_decode_mma_combine<T>(pm, pl, pacc, q_pos, q_index, out, n_heads, head_dim, n_slots,  \
                                    single_keys, min_part, max_parts, gate, gate_row, gate_head);
#else
#define DMMA_COMBINE_BODY(T) __trap();
#endif

#define ATTENTION_DECODE_MMA_COMBINE(SUF, T)                                                        \
    extern "C" __global__ void __launch_bounds__(DMMA_MERGE_THREADS)                                \
        attention_decode_mma_combine_##SUF(                                                         \
            const float* pm, const float* pl, const float* pacc, const int* q_pos,                  \
            const int* q_index, T* out, int n_heads, int head_dim, int n_slots, int single_keys,    \
            int min_part, int max_parts, const T* gate, int gate_row, int gate_head) {              \
        DMMA_COMBINE_BODY(T)                                                                        \
    }
#if !defined(KILN_DMMA_ONLY) || defined(KILN_DMMA_T_f16)
ATTENTION_DECODE_MMA_COMBINE(f16, __half)
#endif
#if !defined(KILN_DMMA_ONLY) || defined(KILN_DMMA_T_bf16)
ATTENTION_DECODE_MMA_COMBINE(bf16, bf16_t)
#endif
