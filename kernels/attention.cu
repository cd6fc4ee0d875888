// attention.cu: causal GQA attention over the paged KV cache, for prefill chunks and decode.
// Entry points: attention_{f32,f16,bf16}_{same,e5m2,e4m3} (split-K, one query per block; head_dim ≤ 64),
// attention_serial_{f32,f16,bf16}_{same,e5m2,e4m3} (the first split-K kernel; head_dim > 64),
// attention_combine_{f32,f16,bf16}, and
// attention_prefill_{f32,f16,bf16}_{same,e5m2,e4m3}_d{64,128,256} (tiled, flash-style; below).
// Decode normally runs the memory-speed kernel of attention_decode.cu; the split-K kernels here
// serve the shapes it does not take (head_dim not a multiple of 8, more than 8 query heads per KV
// head).
//
// Every query token t belongs to sequence q_seq[t] and sits at position q_pos[t]; it attends to that
// sequence's keys 0..=q_pos[t], which are already in the cache (the caller writes the new tokens'
// K/V first). So a prefill chunk is causal and also sees the cached prefix, and decode is the
// one-token case.
//
// Shapes: q, out [n_q, n_heads, head_dim] (compute type T); caches [num_blocks, block_size,
// n_kv_heads, head_dim] (storage C); block_tables [n_seqs, max_blocks] (int32).
//
// ---- Split-K kernel (decode) ----
// head_dim is at most 256 (ATTN_MAX_DIM_PER_LANE * 32); part_len at most ATTN_PART_MAX.
// Grid (n_heads, n_rows, n_parts): block row y handles query token t = q_index[y] (or y when
// q_index is null, i.e. every token of the step), so a mixed step can send only its decode tokens
// here. Part p covers keys [p*part_len, (p+1)*part_len) ∩ [0, ctx); a part past the context is
// empty and writes an empty partial (max = -inf, sum 0, acc 0), which the merge skips.
// Three passes over the part's keys, each spread over the whole block so that many independent
// loads are in flight (the kernel is bound by memory latency at small batch and by bandwidth at
// long contexts, never by arithmetic):
//   1. scores: thread i takes keys i, i + blockDim, ...: s_j = (scale · q) · k_j over head_dim
//      (q staged in shared memory as f32; a key row is read by one thread, through L1), into
//      shared s[j]; the block's max M.
//   2. p_j = exp(s_j - M) in place; the block's sum L = Σ p_j.
//   3. acc = Σ p_j v_j: warp w takes keys w, w + ATTN_WARPS, ... (unrolled, so several rows are
//      loaded at once), lane l dims l, l + 32, ... (coalesced rows); the warps' sums are merged in
//      shared memory.
// With n_parts == 1 the result acc / L goes straight to `out`; otherwise partial (M, L, acc) go to
// part_m/part_l [n_rows, n_heads, n_parts] and part_acc [n_rows, n_heads, n_parts, head_dim] (f32,
// indexed by the block row y) and attention_combine_* merges them. Softmax in f32; `scale` is
// usually 1/sqrt(head_dim). Launch with ATTN_WARPS * 32 threads.
#define ATTN_WARPS 4
#define ATTN_MAX_DIM_PER_LANE 8
#define ATTN_PART_MAX 512
#define ATTN_THREADS (ATTN_WARPS * WARP_SIZE)

__device__ __forceinline__ float block_reduce(float v, float* red, bool is_max) {
    int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    v = is_max ? warp_max(v) : warp_sum(v);
    __syncthreads();  // `red` may still be read from the previous reduction
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float r = red[0];
    for (int w = 1; w < ATTN_WARPS; ++w) r = is_max ? fmaxf(r, red[w]) : r + red[w];
    return r;
}

template <typename T, typename C>
__device__ void attention(const T* q, const C* k_cache, const C* v_cache, const int* block_tables,
                          const int* q_seq, const int* q_pos, const int* q_index, T* out,
                          float* part_m, float* part_l, float* part_acc, int n_heads,
                          int n_kv_heads, int head_dim, int block_size, int max_blocks,
                          int part_len, float scale) {
    __shared__ float q_s[ATTN_MAX_DIM_PER_LANE * WARP_SIZE];
    __shared__ float s_s[ATTN_PART_MAX];
    __shared__ float red[ATTN_WARPS];
    __shared__ float sacc[ATTN_WARPS][ATTN_MAX_DIM_PER_LANE * WARP_SIZE];
    int head = blockIdx.x;
    long row_y = blockIdx.y;
    long t = q_index ? q_index[row_y] : row_y;
    int part = blockIdx.z, n_parts = gridDim.z;
    int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    int kv_head = head / (n_heads / n_kv_heads);
    int per_lane = (head_dim + WARP_SIZE - 1) / WARP_SIZE;
    int ctx = q_pos[t] + 1;
    int start = part * part_len;
    int n = min(ctx, start + part_len) - start;  // keys of this part (≤ 0: an empty part)
    const int* table = block_tables + (long)q_seq[t] * max_blocks;
    long row = (long)n_kv_heads * head_dim;
    long head_off = (long)kv_head * head_dim;

    const T* qr = q + (t * n_heads + head) * (long)head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) q_s[d] = Io<T>::load(qr, d) * scale;
    __syncthreads();

    // 1. scores and their max.
    float m = KILN_NEG_INF;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        int key = start + j;
        long base = ((long)table[key / block_size] * block_size + key % block_size) * row + head_off;
        float s = 0.0f;
        for (int d = 0; d < head_dim; ++d) s += q_s[d] * Io<C>::load(k_cache, base + d);
        s_s[j] = s;
        m = fmaxf(m, s);
    }
    float M = block_reduce(m, red, true);
    // 2. probabilities and their sum (each thread rewrites only the scores it wrote).
    float l = 0.0f;
    if (M != KILN_NEG_INF) {
        for (int j = threadIdx.x; j < n; j += blockDim.x) {
            float p = expf(s_s[j] - M);
            s_s[j] = p;
            l += p;
        }
    }
    float L = block_reduce(l, red, false);  // its barriers also publish s_s
    // 3. acc = Σ p_j v_j.
    float acc[ATTN_MAX_DIM_PER_LANE];
    for (int i = 0; i < ATTN_MAX_DIM_PER_LANE; ++i) acc[i] = 0.0f;
#pragma unroll 4
    for (int j = warp; j < n; j += ATTN_WARPS) {
        int key = start + j;
        long base = ((long)table[key / block_size] * block_size + key % block_size) * row + head_off;
        float p = s_s[j];
        for (int i = 0; i < per_lane; ++i) {
            int d = lane + i * WARP_SIZE;
            if (d < head_dim) acc[i] += p * Io<C>::load(v_cache, base + d);
        }
    }
    for (int i = 0; i < per_lane; ++i) {
        int d = lane + i * WARP_SIZE;
        if (d < head_dim) sacc[warp][d] = acc[i];
    }
    __syncthreads();
    long ph = (row_y * n_heads + head) * (long)n_parts + part;
    if (n_parts > 1 && threadIdx.x == 0) {
        part_m[ph] = M;
        part_l[ph] = L;
    }
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float o = 0.0f;
        for (int w = 0; w < ATTN_WARPS; ++w) o += sacc[w][d];
        if (n_parts > 1) {
            part_acc[ph * head_dim + d] = o;
        } else {
            Io<T>::store(out, (t * n_heads + head) * (long)head_dim + d, L > 0.0f ? o / L : 0.0f);
        }
    }
}

// attention_serial_*: the first split-K kernel, kept for head_dim > 64, where it measured faster at long
// contexts on the H200 (2026-12-01: 32/8 heads × 128 at 32K keys, 556 vs 221 GB/s): same grid, same
// partial format, same ATTN_WARPS * 32 threads; each of the warps walks every ATTN_WARPS-th key of the
// part with an online softmax, lanes splitting head_dim (lane l holds dims l, l + 32, ...), and the
// warps are merged in shared memory.
template <typename T, typename C>
__device__ void attention_serial(const T* q, const C* k_cache, const C* v_cache, const int* block_tables,
                          const int* q_seq, const int* q_pos, const int* q_index, T* out,
                          float* part_m, float* part_l, float* part_acc, int n_heads,
                          int n_kv_heads, int head_dim, int block_size, int max_blocks,
                          int part_len, float scale) {
    int head = blockIdx.x;
    long row_y = blockIdx.y;
    long t = q_index ? q_index[row_y] : row_y;
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
    long ph = (row_y * n_heads + head) * (long)n_parts + part;
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

// Merge the split-K partials: grid (n_heads, n_rows), block loops over head_dim; rows map to
// tokens through q_index as in attention().
template <typename T>
__device__ void attention_combine(const float* part_m, const float* part_l, const float* part_acc,
                                  const int* q_index, T* out, int n_heads, int head_dim,
                                  int n_parts) {
    int head = blockIdx.x;
    long row_y = blockIdx.y;
    long t = q_index ? q_index[row_y] : row_y;
    long ph0 = (row_y * n_heads + head) * (long)n_parts;
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

// ---- Tiled prefill kernel (flash-style) ----
// For the sequences of a step with more than one new token. The host cuts each such sequence's new
// tokens into tiles of at most FA_TILE_TOKENS consecutive tokens; `tiles` is [n_tiles, 4] int32:
// (sequence index, index of the tile's first token in q/out, tokens in the tile (1..=32), absolute
// position of the tile's first token). A tile has (tokens * group) query rows, group = n_heads /
// n_kv_heads, ordered token-major: row i is token i / group and query head kv_head * group +
// i % group. Grid (n_tiles, n_kv_heads, ceil(FA_TILE_TOKENS * group / ROWS)): block z takes rows
// [z*ROWS, (z+1)*ROWS) of its tile for KV head blockIdx.y (blocks past the tile's rows exit at
// once). So every query head of a GQA group shares each K/V tile staged in shared memory.
//
// The block walks keys 0..=last (last = the position of its latest query row) in tiles of FA_KEYS:
// K tile → shared (f32, converted from the storage type once), S = Q·Kᵀ with lane j scoring key j
// against the warp's RW rows, causal mask by absolute position (a query at position p sees keys
// 0..=p, the cached prefix included), online softmax in f32 (base 2: log2(e) is folded into the Q
// scale), P → shared, then the V tile into the same buffer and O += P·V with lanes splitting
// head_dim (lane l holds dims l, l + 32, ...). Keys past `last` are never read: the partial last
// tile is zero-filled, and their P is 0.
//
// gate (may be null; Qwen3.5's gated attention): element (t, head, d) at gate[t * gate_row + head *
// gate_head + d], compute type T; the output is then attn · sigmoid(gate), in f32 on the attention
// value before its rounding to T.
//
// DPL (template): head_dim ≤ 32 * DPL (entry suffix d64: 2, d128: 4, d256: 8); head_dim must be a
// multiple of 4 (float4 shared-memory reads). Rows per warp RW = 8 (4 for d256), ROWS = 4 * RW.
// Dynamic shared memory, f32: q_s [ROWS][head_dim] | kv_s [FA_KEYS][kstride] | p_s [ROWS][FA_KEYS]
// with kstride = round_up(head_dim, 32) + 4, so that lane j's float4 reads of row j are
// conflict-free. Bytes at the largest head_dim: d64 20992, d128 37376, d256 51712; the last is
// above 48 KB and needs CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES (set by the host; sm_70
// allows 96 KB, sm_75 64 KB). Launch with FA_WARPS * 32 threads.
#define FA_WARPS 4
#define FA_KEYS 32
#define FA_TILE_TOKENS 32
#define FA_LOG2E 1.4426950408889634f

template <int DPL> struct FaShape {
    static constexpr int RW = DPL >= 8 ? 4 : 8;
    static constexpr int ROWS = FA_WARPS * RW;
};

// Stage keys kt..kt+FA_KEYS-1 of one KV head into kv_s [FA_KEYS][kstride] as f32; keys >= n_keys
// are zero (never read from the cache). Warp w fills rows w, w + FA_WARPS, ...
template <typename C>
__device__ __forceinline__ void fa_load_tile(const C* cache, float* kv_s, const int* table, int kt,
                                             int n_keys, int block_size, long kv_row, int kv_head,
                                             int head_dim, int kstride) {
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
#pragma unroll
    for (int jj = 0; jj < FA_KEYS / FA_WARPS; ++jj) {
        const int j = warp + jj * FA_WARPS;
        const int key = kt + j;
        float* dst = kv_s + j * kstride;
        if (key < n_keys) {
            const long slot = (long)table[key / block_size] * block_size + key % block_size;
            const long base = slot * kv_row + (long)kv_head * head_dim;
            for (int d = lane; d < head_dim; d += WARP_SIZE) dst[d] = Io<C>::load(cache, base + d);
        } else {
            for (int d = lane; d < head_dim; d += WARP_SIZE) dst[d] = 0.0f;
        }
    }
}

template <typename T, typename C, int DPL>
__device__ void attention_prefill(const T* q, const C* k_cache, const C* v_cache,
                                  const int* block_tables, const int* tiles, T* out, int n_heads,
                                  int n_kv_heads, int head_dim, int block_size, int max_blocks,
                                  float scale, const T* gate, int gate_row, int gate_head) {
    constexpr int RW = FaShape<DPL>::RW;
    constexpr int ROWS = FaShape<DPL>::ROWS;
    extern __shared__ float4 fa_smem4[];
    float* q_s = reinterpret_cast<float*>(fa_smem4);
    const int kstride = ((head_dim + WARP_SIZE - 1) / WARP_SIZE) * WARP_SIZE + 4;
    float* kv_s = q_s + ROWS * head_dim;
    float* p_s = kv_s + FA_KEYS * kstride;

    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const int group = n_heads / n_kv_heads;
    const int kv_head = blockIdx.y;
    const int* tile = tiles + 4 * (long)blockIdx.x;
    const int seq = tile[0], ntok = tile[2], pos0 = tile[3];
    const long t0 = tile[1];
    const int row0 = blockIdx.z * ROWS;
    const int nrows = min(ROWS, ntok * group - row0);
    if (nrows <= 0) return;  // depends on blockIdx only: the whole block leaves before any barrier
    const int n_keys = pos0 + (row0 + nrows - 1) / group + 1;  // keys 0..=last query position
    const int* table = block_tables + (long)seq * max_blocks;
    const long kv_row = (long)n_kv_heads * head_dim;

    // Q rows → shared, times scale * log2(e); padding rows (>= nrows) are zero.
    const float qscale = scale * FA_LOG2E;
    for (int i = threadIdx.x; i < ROWS * head_dim; i += blockDim.x) {
        const int r = i / head_dim, d = i - r * head_dim;
        float v = 0.0f;
        if (r < nrows) {
            const int fr = row0 + r;
            const long t = t0 + fr / group;
            const int head = kv_head * group + fr % group;
            v = Io<T>::load(q, (t * n_heads + head) * (long)head_dim + d) * qscale;
        }
        q_s[i] = v;
    }

    // This warp's rows wr0..wr0+RW-1 of the block: position (-1 for padding: sees no key), running
    // max m (warp-uniform), per-lane partial sum l, and the lane's output dims.
    const int wr0 = warp * RW;
    int qpos[RW];
    float m[RW], l[RW], acc[RW][DPL];
#pragma unroll
    for (int r = 0; r < RW; ++r) {
        const int br = wr0 + r;
        qpos[r] = br < nrows ? pos0 + (row0 + br) / group : -1;
        m[r] = KILN_NEG_INF;
        l[r] = 0.0f;
#pragma unroll
        for (int i = 0; i < DPL; ++i) acc[r][i] = 0.0f;
    }

    for (int kt = 0; kt < n_keys; kt += FA_KEYS) {  // n_keys is block-uniform: barriers are safe
        fa_load_tile<C>(k_cache, kv_s, table, kt, n_keys, block_size, kv_row, kv_head, head_dim,
                        kstride);
        __syncthreads();  // K tile (and, the first time, Q) visible to every warp

        // S = Q·Kᵀ for key kt + lane.
        float s[RW];
#pragma unroll
        for (int r = 0; r < RW; ++r) s[r] = 0.0f;
        const float* kr = kv_s + lane * kstride;
        const float* qr = q_s + wr0 * head_dim;
        for (int d = 0; d < head_dim; d += 4) {
            const float4 kk = *reinterpret_cast<const float4*>(kr + d);
#pragma unroll
            for (int r = 0; r < RW; ++r) {
                const float4 qq = *reinterpret_cast<const float4*>(qr + r * head_dim + d);
                s[r] = fmaf(qq.x, kk.x, fmaf(qq.y, kk.y, fmaf(qq.z, kk.z, fmaf(qq.w, kk.w, s[r]))));
            }
        }

        // Online softmax; p for this lane's key goes to p_s.
        const int key = kt + lane;
#pragma unroll
        for (int r = 0; r < RW; ++r) {
            const float sv = key <= qpos[r] ? s[r] : KILN_NEG_INF;
            const float m_new = fmaxf(m[r], warp_max(sv));
            // m_new stays -inf only for a padding row, which has seen no key: keep it empty rather
            // than computing exp2(-inf - -inf) = NaN.
            const bool empty = m_new == KILN_NEG_INF;
            const float corr = empty ? 1.0f : exp2f(m[r] - m_new);
            const float p = empty ? 0.0f : exp2f(sv - m_new);
            l[r] = l[r] * corr + p;  // corr is the same on every lane
#pragma unroll
            for (int i = 0; i < DPL; ++i) acc[r][i] *= corr;
            p_s[(wr0 + r) * FA_KEYS + lane] = p;
            m[r] = m_new;
        }
        __syncthreads();  // every warp is done reading K (and P is written)

        fa_load_tile<C>(v_cache, kv_s, table, kt, n_keys, block_size, kv_row, kv_head, head_dim,
                        kstride);
        __syncthreads();  // V tile visible

        // O += P·V over this tile's keys (rows past n_keys are zero with p == 0).
        const int nk = min(FA_KEYS, n_keys - kt);
        for (int j = 0; j < nk; j += 4) {
            float4 pp[RW];
#pragma unroll
            for (int r = 0; r < RW; ++r)
                pp[r] = *reinterpret_cast<const float4*>(p_s + (wr0 + r) * FA_KEYS + j);
#pragma unroll
            for (int i = 0; i < DPL; ++i) {
                const int d = lane + WARP_SIZE * i;
                if (d < head_dim) {
                    const float* vc = kv_s + j * kstride + d;
                    const float v0 = vc[0], v1 = vc[kstride], v2 = vc[2 * kstride],
                                v3 = vc[3 * kstride];
#pragma unroll
                    for (int r = 0; r < RW; ++r)
                        acc[r][i] = fmaf(pp[r].x, v0,
                                         fmaf(pp[r].y, v1, fmaf(pp[r].z, v2, fmaf(pp[r].w, v3, acc[r][i]))));
                }
            }
        }
        __syncthreads();  // every warp is done with V and P before the next tile overwrites them
    }

#pragma unroll
    for (int r = 0; r < RW; ++r) {
        const float total = warp_sum(l[r]);
        const int br = wr0 + r;
        if (br < nrows) {
            const int fr = row0 + br;
            const long t = t0 + fr / group;
            const int head = kv_head * group + fr % group;
            const long base = (t * n_heads + head) * (long)head_dim;
            const float inv = total > 0.0f ? 1.0f / total : 0.0f;
            const long gbase = t * (long)gate_row + (long)head * gate_head;
#pragma unroll
            for (int i = 0; i < DPL; ++i) {
                const int d = lane + WARP_SIZE * i;
                if (d >= head_dim) continue;
                float v = acc[r][i] * inv;
                // Qwen3.5's output gate: attn · sigmoid(gate), in f32 on the unrounded value.
                if (gate) v *= 1.0f / (1.0f + expf(-Io<T>::load(gate, gbase + d)));
                Io<T>::store(out, base + d, v);
            }
        }
    }
}

#define ATTENTION_PREFILL_ONE(SUF, T, CSUF, C, DSUF, DPL)                                           \
    extern "C" __global__ void __launch_bounds__(FA_WARPS * WARP_SIZE)                              \
        attention_prefill_##SUF##_##CSUF##_##DSUF(                                                  \
            const T* q, const C* kc, const C* vc, const int* bt, const int* tiles, T* out,          \
            int n_heads, int n_kv_heads, int head_dim, int block_size, int max_blocks,             \
            float scale, const T* gate, int gate_row, int gate_head) {                              \
        attention_prefill<T, C, DPL>(q, kc, vc, bt, tiles, out, n_heads, n_kv_heads, head_dim,      \
                                     block_size, max_blocks, scale, gate, gate_row, gate_head);    \
    }

#define ATTENTION_ONE(SUF, T, CSUF, C)                                                              \
    extern "C" __global__ void attention_##SUF##_##CSUF(                                            \
        const T* q, const C* kc, const C* vc, const int* bt, const int* q_seq, const int* q_pos,    \
        const int* q_index, T* out, float* pm, float* pl, float* pacc, int n_heads,                \
        int n_kv_heads, int head_dim, int block_size, int max_blocks, int part_len, float scale) {  \
        attention<T, C>(q, kc, vc, bt, q_seq, q_pos, q_index, out, pm, pl, pacc, n_heads,           \
                        n_kv_heads, head_dim, block_size, max_blocks, part_len, scale);             \
    }                                                                                               \
    extern "C" __global__ void attention_serial_##SUF##_##CSUF(                                     \
        const T* q, const C* kc, const C* vc, const int* bt, const int* q_seq, const int* q_pos,    \
        const int* q_index, T* out, float* pm, float* pl, float* pacc, int n_heads,                \
        int n_kv_heads, int head_dim, int block_size, int max_blocks, int part_len, float scale) {  \
        attention_serial<T, C>(q, kc, vc, bt, q_seq, q_pos, q_index, out, pm, pl, pacc, n_heads,    \
                               n_kv_heads, head_dim, block_size, max_blocks, part_len, scale);      \
    }                                                                                               \
    ATTENTION_PREFILL_ONE(SUF, T, CSUF, C, d64, 2)                                                  \
    ATTENTION_PREFILL_ONE(SUF, T, CSUF, C, d128, 4)                                                 \
    ATTENTION_PREFILL_ONE(SUF, T, CSUF, C, d256, 8)
#define ATTENTION(SUF, T)                                                                           \
    ATTENTION_ONE(SUF, T, same, T)                                                                  \
    ATTENTION_ONE(SUF, T, e5m2, E5M2)                                                               \
    ATTENTION_ONE(SUF, T, e4m3, E4M3)                                                               \
    extern "C" __global__ void attention_combine_##SUF(const float* pm, const float* pl,            \
                                                       const float* pacc, const int* q_index,       \
                                                       T* out, int n_heads, int head_dim,           \
                                                       int n_parts) {                               \
        attention_combine<T>(pm, pl, pacc, q_index, out, n_heads, head_dim, n_parts);               \
    }
KILN_FOR_FLOAT_TYPES(ATTENTION)
