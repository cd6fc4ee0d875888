// attention.cu: causal GQA attention over the paged KV cache, for prefill chunks and decode alike.
// Entry points: attention_{f32,f16,bf16}_{same,e5m2,e4m3}, attention_combine_{f32,f16,bf16}.
//
// Every query token t belongs to sequence q_seq[t] and sits at position q_pos[t]; it attends to that
// sequence's keys 0..=q_pos[t], which are already in the cache (the caller writes the new tokens'
// K/V first). So a prefill chunk is causal and also sees the cached prefix, and decode is the
// one-token case.
//
// Shapes: q, out [n_q, n_heads, head_dim] (compute type T); caches [num_blocks, block_size,
// n_kv_heads, head_dim] (storage C); block_tables [n_seqs, max_blocks] (int32).
// head_dim is at most 256 (ATTN_MAX_DIM_PER_LANE * 32); lane l holds dims l, l + 32, ...
//
// Split-K (flash-decoding): grid (n_heads, n_q, n_parts); part p covers keys [p*part_len,
// (p+1)*part_len). Each of the block's ATTN_WARPS warps walks every ATTN_WARPS-th key with an online
// softmax, lanes splitting the head dimension; the warps are merged in shared memory. With
// n_parts == 1 the result goes straight to `out`; otherwise partial (max, sum, acc) go to
// part_m/part_l [n_q, n_heads, n_parts] and part_acc [n_q, n_heads, n_parts, head_dim] (f32) and
// attention_combine_* merges them. Softmax in f32; `scale` is usually 1/sqrt(head_dim).
#define ATTN_WARPS 4
#define ATTN_MAX_DIM_PER_LANE 8

template <typename T, typename C>
__device__ void attention(const T* q, const C* k_cache, const C* v_cache, const int* block_tables,
                          const int* q_seq, const int* q_pos, T* out, float* part_m, float* part_l,
                          float* part_acc, int n_heads, int n_kv_heads, int head_dim, int block_size,
                          int max_blocks, int part_len, float scale) {
    int head = blockIdx.x;
    long t = blockIdx.y;
    int part = blockIdx.z, n_parts = gridDim.z;
    int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    int kv_head = head / (n_heads / n_kv_heads);
    int per_lane = (head_dim + WARP_SIZE - 1) / WARP_SIZE;
    int ctx = q_pos[t] + 1;
    int start = part * part_len;
    int end = min(ctx, start + part_len);
    const int* table = block_tables + (long)q_seq[t] * max_blocks;

    float qv[ATTN_MAX_DIM_PER_LANE], acc[ATTN_MAX_DIM_PER_LANE];
    const T* qr = q + (t * n_heads + head) * (long)head_dim;
    for (int i = 0; i < per_lane; ++i) {
        int d = lane + i * WARP_SIZE;
        qv[i] = d < head_dim ? Io<T>::load(qr, d) * scale : 0.0f;
        acc[i] = 0.0f;
    }
    float m = KILN_NEG_INF, l = 0.0f;
    long row = (long)n_kv_heads * head_dim;
    for (int j = start + warp; j < end; j += ATTN_WARPS) {
        long slot = (long)table[j / block_size] * block_size + j % block_size;
        long base = slot * row + (long)kv_head * head_dim;
        float s = 0.0f;
        for (int i = 0; i < per_lane; ++i) {
            int d = lane + i * WARP_SIZE;
            if (d < head_dim) s += qv[i] * Io<C>::load(k_cache, base + d);
        }
        s = warp_sum(s);
        float m_new = fmaxf(m, s);
        float corr = expf(m - m_new), p = expf(s - m_new);
        l = l * corr + p;
        for (int i = 0; i < per_lane; ++i) {
            int d = lane + i * WARP_SIZE;
            if (d < head_dim) acc[i] = acc[i] * corr + p * Io<C>::load(v_cache, base + d);
        }
        m = m_new;
    }

    __shared__ float sm[ATTN_WARPS], sl[ATTN_WARPS];
    __shared__ float sacc[ATTN_WARPS][ATTN_MAX_DIM_PER_LANE * WARP_SIZE];
    if (lane == 0) {
        sm[warp] = m;
        sl[warp] = l;
    }
    for (int i = 0; i < per_lane; ++i) {
        int d = lane + i * WARP_SIZE;
        if (d < head_dim) sacc[warp][d] = acc[i];
    }
    __syncthreads();
    float M = KILN_NEG_INF;
    for (int w = 0; w < ATTN_WARPS; ++w) M = fmaxf(M, sm[w]);
    float L = 0.0f;
    for (int w = 0; w < ATTN_WARPS; ++w) L += (sm[w] == KILN_NEG_INF) ? 0.0f : sl[w] * expf(sm[w] - M);
    long ph = (t * n_heads + head) * (long)n_parts + part;
    if (n_parts > 1 && threadIdx.x == 0) {
        part_m[ph] = M;
        part_l[ph] = L;
    }
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float o = 0.0f;
        for (int w = 0; w < ATTN_WARPS; ++w)
            if (sm[w] != KILN_NEG_INF) o += sacc[w][d] * expf(sm[w] - M);
        if (n_parts > 1) {
            part_acc[ph * head_dim + d] = o;
        } else {
            Io<T>::store(out, (t * n_heads + head) * (long)head_dim + d, L > 0.0f ? o / L : 0.0f);
        }
    }
}

// Merge the split-K partials: grid (n_heads, n_q), block loops over head_dim.
template <typename T>
__device__ void attention_combine(const float* part_m, const float* part_l, const float* part_acc,
                                  T* out, int n_heads, int head_dim, int n_parts) {
    int head = blockIdx.x;
    long t = blockIdx.y;
    long ph0 = (t * n_heads + head) * (long)n_parts;
    float M = KILN_NEG_INF;
    for (int p = 0; p < n_parts; ++p) M = fmaxf(M, part_m[ph0 + p]);
    float L = 0.0f;
    for (int p = 0; p < n_parts; ++p)
        if (part_m[ph0 + p] != KILN_NEG_INF) L += part_l[ph0 + p] * expf(part_m[ph0 + p] - M);
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float o = 0.0f;
        for (int p = 0; p < n_parts; ++p)
            if (part_m[ph0 + p] != KILN_NEG_INF) o += part_acc[(ph0 + p) * head_dim + d] * expf(part_m[ph0 + p] - M);
        Io<T>::store(out, (t * n_heads + head) * (long)head_dim + d, L > 0.0f ? o / L : 0.0f);
    }
}

#define ATTENTION_ONE(SUF, T, CSUF, C)                                                              \
    extern "C" __global__ void attention_##SUF##_##CSUF(                                            \
        const T* q, const C* kc, const C* vc, const int* bt, const int* q_seq, const int* q_pos,    \
        T* out, float* pm, float* pl, float* pacc, int n_heads, int n_kv_heads, int head_dim,      \
        int block_size, int max_blocks, int part_len, float scale) {                               \
        attention<T, C>(q, kc, vc, bt, q_seq, q_pos, out, pm, pl, pacc, n_heads, n_kv_heads,        \
                        head_dim, block_size, max_blocks, part_len, scale);                         \
    }
#define ATTENTION(SUF, T)                                                                           \
    ATTENTION_ONE(SUF, T, same, T)                                                                  \
    ATTENTION_ONE(SUF, T, e5m2, E5M2)                                                               \
    ATTENTION_ONE(SUF, T, e4m3, E4M3)                                                               \
    extern "C" __global__ void attention_combine_##SUF(const float* pm, const float* pl,            \
                                                       const float* pacc, T* out, int n_heads,      \
                                                       int head_dim, int n_parts) {                 \
        attention_combine<T>(pm, pl, pacc, out, n_heads, head_dim, n_parts);                        \
    }
KILN_FOR_FLOAT_TYPES(ATTENTION)
