// attention_decode.cu: decode attention over the paged KV cache at memory speed (issue 8 item 7),
// with Qwen3.5's sigmoid output gate optionally fused into its epilogue (issue 9 item 5).
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
// multiple of 8 and at most DV (the entry suffix d64/d128/d256); the GQA group n_heads / n_kv_heads
// is at most GB (suffix g4/g8; smaller groups run in g4 with the spare heads skipped). gate (may
// be null): element (t, head, d) at gate[t * gate_row + head * gate_head + d], compute type T;
// when present the output is attn · sigmoid(gate) (sigmoid in f32, on the f32 attention value).
//
// Split of the keys (a function of the context length and of `single_keys`, a constant of the
// host's, alone, so a row's result is the same bits whatever the batch, the grid or a graph's
// padding): a row of ctx ≤ single_keys keys is ONE part (short decode rows: one pass, no
// partials); otherwise part_len = max(DEC_MIN_PART, round_up(ceil(ctx / DEC_MAX_PARTS),
// DEC_PART_ALIGN)) keys, n_active = ceil(ctx / part_len) ≤ DEC_MAX_PARTS parts (decode_part_len in
// attention_plan.rs is the host's copy; single_keys = 0 is the rule before it existed).
//
// Grid (n_kv_heads, n_rows, Z): block (h, y, z) takes parts z, z + Z, ... < n_active of row y for
// KV head h and ALL query heads of its group, so each K/V row is read once per KV head, not once
// per query head. Z is any value ≥ 1 (the host picks it for occupancy; a block past n_active exits
// at once); the result does not depend on it.
//
// Inside a block (DEC_THREADS threads, at most 128 registers each by __launch_bounds__ so that
// DEC_MIN_BLOCKS = 4 blocks share an SM: 16 warps) a part is walked in tiles of TK keys, one key
// per DS = DV / SW lanes (SW = 32 dims per lane, 16 for f32 storage): TK = 64 / 32 / 16 keys for
// head widths 64 / 128 / 256 (half that for f32 storage). Each tile in three barriers:
//   1. staging: the tile's K and V rows are copied into one of two shared buffers as raw storage
//      bytes (8-byte units for fp8, 16 otherwise; zeros past the part's end and past head_dim).
//      On sm_80+ by cp.async, issued for tile i + 1 right after tile i became visible, so one
//      tile per block is always in flight and no register holds it; on sm_70 / sm_75 by plain
//      loads and stores at the same point. fp8 is converted when read from shared memory, to f16
//      bit patterns (e5m2 is the upper byte of an f16; e4m3 is (sign << 15 | (byte & 0x7f) << 7)
//      as an f16 times 2^8, that 2^8 folded into q and into the output).
//   2. scores: a lane group of DS lanes per key, each lane SW dims of it, for every query head of
//      the group (q pre-scaled by scale · log2 e, broadcast from shared memory), summed by
//      log2(DS) shuffles.
//   3. softmax: one warp per query head, once per tile: the tile's max, the running max m, the
//      correction exp2(m_old - m_new) (exactly 1 when the max did not grow), p = exp2(s - m), the
//      running sum l.
//   4. P·V: a thread takes 4 dims and every (512 / DV)-th quad of keys, for every query head,
//      rescaling its accumulators only when a head's correction is not 1 (the lazy rescale).
// At the end of a part the key groups' accumulators are summed through shared memory (they share
// one running max, so no rescale): with n_active == 1 the row's result acc / l goes straight to
// `out` (short contexts: no combine work); otherwise (m, l, acc) go to part_m/part_l [n_rows,
// n_heads, n_slots] and part_acc [n_rows, n_heads, n_slots, head_dim] (f32, by block row y; n_slots
// ≥ every row's n_active) and are merged (m in base 2) in a FIXED order of the parts, either
//   - in the same launch (`counters` not null, [n_rows, n_kv_heads] u32, zero between launches):
//     every block of (h, y) publishes its partials (__threadfence) and takes a ticket (atomicAdd
//     on its counter); the block that takes the last of the min(Z, n_active) tickets resets the
//     counter to 0 and merges the row's parts for the group's heads. Which block that is varies,
//     the merge does not (same reads, same order): no atomics on values, bits independent of Z
//     and of scheduling; or
//   - by attention_decode_combine_* in a second launch (`counters` null): the same merge
//     (dec_merge_weights / dec_merge_out), so both ways give the same bits.
// PROGRAMMATIC DEPENDENT LAUNCH (sm_90+; no-ops below): the host may launch this kernel with PDL
// (launch.rs). Before griddepcontrol.wait a block reads step metadata (q_index, q_pos, q_seq, the
// block table, pf_meta: uploaded by copies, never written by a kernel) and, when `pf_meta` (the
// step's per-sequence [token_start, len, cached_len, slot] rows; null: no prefetch) is given and
// the first tile of its first part holds only keys below its sequence's cached length, it issues
// that tile's staging (K/V bytes into its own shared memory) too: those keys were written by
// earlier steps. This step's keys (from the cached length on: one per new token of the sequence,
// the previous kernels write them) are staged after the wait as before, whether the sequence has
// one row here or several (a prefill chunk sent through this kernel, or the 2–16 tokens of a
// speculative verification step), so the bound is the sequence's, not the row's. q, the gate,
// out and the partials come after the wait. The block then lets the next kernel launch early
// (griddepcontrol.launch_dependents; that kernel waits for this grid's completion before it
// reads `out`). The same bytes are staged either way, so the bits do not change.
//
// The fp8 NaN byte 0x7f of e4m3 (which the KV writer never produces — it saturates to 448) would
// read as 480. No bf16 intrinsics or tensor cores; cp.async only behind __CUDA_ARCH__ >= 800.
// Static shared memory ≤ 46.2 KB per block (two K/V buffers, q, p; see DecShape). ptxas (NVRTC
// 12.9, sm_90) gives 95–115 registers per thread and no spills for every (dtype, storage, DV, GB)
// (120–122 for sm_70): 4 blocks of 4 warps per SM on the H200 (the previous layout held the next
// tile in registers and used 144–254, 2–3 blocks per SM; docs/benchmarks.md).
#define DEC_WARPS 4
#define DEC_THREADS (DEC_WARPS * WARP_SIZE)
#define DEC_MIN_BLOCKS 4
#define DEC_MIN_PART 128
#define DEC_MAX_PARTS 128
#define DEC_PART_ALIGN 64
#define DEC_LOG2E 1.4426950408889634f

__device__ __forceinline__ int decode_part_len(int ctx, int single_keys) {
    if (ctx <= single_keys) return ctx;  // one part
    int per = (ctx + DEC_MAX_PARTS - 1) / DEC_MAX_PARTS;
    per = (per + DEC_PART_ALIGN - 1) / DEC_PART_ALIGN * DEC_PART_ALIGN;
    return max(DEC_MIN_PART, per);
}

__device__ __forceinline__ void dec_pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void dec_pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Storage traits: element bytes and the factor staged values are below the true ones (2^8 for
// e4m3: its bytes are read as f16 bit patterns, see dec_fp8_word).
template <typename C> struct DecStore {
    static constexpr int BYTES = (int)sizeof(C);
    static constexpr float kScale = 1.0f;
};
template <> struct DecStore<E4M3> {
    static constexpr int BYTES = 1;
    static constexpr float kScale = 256.0f;
};

// Two fp8 bytes (bits 0-7 and 8-15 of `b`, after the selector) as two f16 bit patterns in one
// word: e5m2 is the upper byte of an f16; e4m3 is (sign << 15 | (byte & 0x7f) << 7), an f16 2^8
// below the value.
template <typename C> __device__ __forceinline__ unsigned int dec_fp8_word(unsigned int w);
template <> __device__ __forceinline__ unsigned int dec_fp8_word<E5M2>(unsigned int w) { return w; }
template <> __device__ __forceinline__ unsigned int dec_fp8_word<E4M3>(unsigned int w) {
    return (w & 0x80008000u) | ((w & 0x7f007f00u) >> 1);
}
__device__ __forceinline__ void dec_h2(unsigned int w, float* o) {
    o[0] = __half2float(__ushort_as_half((unsigned short)(w & 0xffffu)));
    o[1] = __half2float(__ushort_as_half((unsigned short)(w >> 16)));
}
__device__ __forceinline__ void dec_bf2(unsigned int w, float* o) {
    o[0] = __uint_as_float(w << 16);
    o[1] = __uint_as_float(w & 0xffff0000u);
}

// N (4 or 8) staged elements of storage C at shared address p (N * BYTES aligned) as f32, times
// 1 / kScale.
template <typename C, int N> struct DecRead;
template <int N> struct DecRead<float, N> {
    static __device__ __forceinline__ void run(const unsigned char* p, float* o) {
#pragma unroll
        for (int k = 0; k < N / 4; ++k) {
            const float4 a = reinterpret_cast<const float4*>(p)[k];
            o[4 * k] = a.x; o[4 * k + 1] = a.y; o[4 * k + 2] = a.z; o[4 * k + 3] = a.w;
        }
    }
};
template <bool BF, int N> struct DecRead16 {
    static __device__ __forceinline__ void run(const unsigned char* p, float* o) {
        unsigned int w[N / 2];
        if constexpr (N == 8) {
            const uint4 u = *reinterpret_cast<const uint4*>(p);
            w[0] = u.x; w[1] = u.y; w[2] = u.z; w[3] = u.w;
        } else {
            const uint2 u = *reinterpret_cast<const uint2*>(p);
            w[0] = u.x; w[1] = u.y;
        }
#pragma unroll
        for (int k = 0; k < N / 2; ++k) {
            if constexpr (BF) dec_bf2(w[k], o + 2 * k);
            else dec_h2(w[k], o + 2 * k);
        }
    }
};
template <int N> struct DecRead<bf16_t, N> : DecRead16<true, N> {};
template <int N> struct DecRead<__half, N> : DecRead16<false, N> {};
template <typename C8, int N> struct DecRead8 {
    static __device__ __forceinline__ void run(const unsigned char* p, float* o) {
        unsigned int w[N / 4];
        if constexpr (N == 8) {
            const uint2 u = *reinterpret_cast<const uint2*>(p);
            w[0] = u.x; w[1] = u.y;
        } else {
            w[0] = *reinterpret_cast<const unsigned int*>(p);
        }
#pragma unroll
        for (int k = 0; k < N / 4; ++k) {
            dec_h2(dec_fp8_word<C8>(__byte_perm(w[k], 0u, 0x1404)), o + 4 * k);
            dec_h2(dec_fp8_word<C8>(__byte_perm(w[k], 0u, 0x3424)), o + 4 * k + 2);
        }
    }
};
template <int N> struct DecRead<E5M2, N> : DecRead8<E5M2, N> {};
template <int N> struct DecRead<E4M3, N> : DecRead8<E4M3, N> {};

// Global → shared copy of one staging unit (UB = 8 or 16 bytes); `ok` false writes zeros. sm_80+:
// cp.async (no registers, the copy stays in flight until dec_cp_wait); before: a plain load and
// store.
template <int UB>
__device__ __forceinline__ void dec_cp(unsigned char* dst, const unsigned char* src, bool ok) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    const int n = ok ? UB : 0;
    if constexpr (UB == 16) {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(n));
    } else {
        asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(d), "l"(src), "r"(n));
    }
#else
    if constexpr (UB == 16) {
        *reinterpret_cast<uint4*>(dst) = ok ? *reinterpret_cast<const uint4*>(src) : make_uint4(0u, 0u, 0u, 0u);
    } else {
        *reinterpret_cast<uint2*>(dst) = ok ? *reinterpret_cast<const uint2*>(src) : make_uint2(0u, 0u);
    }
#endif
}
__device__ __forceinline__ void dec_cp_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}
__device__ __forceinline__ void dec_cp_wait_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group 0;\n" ::);
#endif
}

// exp2(a - m) for a running max m that may be -inf (then the term is empty: 0).
__device__ __forceinline__ float dec_scale(float a, float m) {
    return a == KILN_NEG_INF ? 0.0f : exp2f(a - m);
}

// attn · sigmoid(gate) when there is a gate (sigmoid in f32), else attn.
template <typename T>
__device__ __forceinline__ float dec_gated(float v, const T* gate, long t, int head, int d,
                                           int gate_row, int gate_head) {
    if (!gate) return v;
    const float g = Io<T>::load(gate, t * (long)gate_row + (long)head * gate_head + d);
    return v * (1.0f / (1.0f + expf(-g)));
}

// The merge of one (row, head)'s n_active ≥ 2 parts at ph0 = (row_y · n_heads + head) · n_slots,
// step 1, by one warp: the parts' weights exp2(m_p - max) into w_s[0..n_active) and the returned
// 1 / Σ l_p · w_p (0 when the sum is 0), the same on every lane. Reads through L2 (__ldcg): the
// partials may come from other blocks of this launch.
__device__ __forceinline__ float dec_merge_weights(const float* part_m, const float* part_l,
                                                   long ph0, int n_active, int lane, float* w_s) {
    float mx = KILN_NEG_INF;
    for (int p = lane; p < n_active; p += WARP_SIZE) mx = fmaxf(mx, __ldcg(part_m + ph0 + p));
    mx = warp_max(mx);
    float lsum = 0.0f;
    for (int p = lane; p < n_active; p += WARP_SIZE) {
        const float w = dec_scale(__ldcg(part_m + ph0 + p), mx);
        w_s[p] = w;
        lsum = fmaf(__ldcg(part_l + ph0 + p), w, lsum);
    }
    lsum = warp_sum(lsum);
    return lsum > 0.0f ? 1.0f / lsum : 0.0f;
}

// Step 2: dimension d of the merged output, Σ_p acc_p[d] · w_p in part order, times inv.
__device__ __forceinline__ float dec_merge_out(const float* part_acc, long ph0, int n_active,
                                               int head_dim, int d, const float* w_s, float inv) {
    float o = 0.0f;
    for (int p = 0; p < n_active; ++p) o = fmaf(__ldcg(part_acc + (ph0 + p) * head_dim + d), w_s[p], o);
    return o * inv;
}

// Tile geometry of one (DV, storage bytes CB) class.
template <int DV, int CB> struct DecShape {
    static constexpr int SW = CB == 4 ? 16 : 32;              // scores: dims per lane
    static constexpr int NCH = SW / 8;                        // scores: 8-dim chunks per lane
    static constexpr int DS = DV / SW;                        // scores: lanes per key
    static constexpr int TK = DEC_THREADS / DS;               // keys per tile (one per lane group)
    static constexpr int RB = DV * CB;                        // bytes of a K or V row
    // Row stride: padded by one chunk step (DS chunks of 8) when a step is under 128 bytes, so
    // the keys of a warp's 8-element reads fall in distinct banks (RB / step = SW / 8 is even,
    // the padded stride an odd number of steps).
    static constexpr int STEP = DS * 8 * CB;
    static constexpr int RSB = RB + (STEP >= 128 ? 0 : STEP);
    static constexpr int TILE = TK * RSB;                     // one K (or V) tile, bytes
    static constexpr int UE = CB == 1 ? 8 : 16 / CB;          // staging: elements per unit
    static constexpr int UB = UE * CB;                        // staging: bytes per unit (8 or 16)
    static constexpr int UPR = DV / UE;                       // staging: units per row
    static constexpr int CPT = TK * UPR / DEC_THREADS;        // staging: units per thread, K or V
    static constexpr int DC = DV / 4;                         // P·V: 4-dim columns per row
    static constexpr int KG = DEC_THREADS / DC;               // P·V: key groups
    static constexpr int QPT = TK / 4 / KG;                   // P·V: key quads per thread
    static constexpr int STAGE = 4 * TILE;                    // two buffers of (K, V)
};

template <typename T, typename C, int DV, int GB>
__device__ void attention_decode(const T* q, const C* k_cache, const C* v_cache,
                                 const int* block_tables, const int* q_seq, const int* q_pos,
                                 const int* q_index, T* out, float* part_m, float* part_l,
                                 float* part_acc, unsigned int* counters, int n_heads,
                                 int n_kv_heads, int head_dim, int block_size, int max_blocks,
                                 int n_slots, int single_keys, const int* pf_meta, float scale,
                                 const T* gate, int gate_row, int gate_head) {
    constexpr int CB = DecStore<C>::BYTES;
    typedef DecShape<DV, CB> Sh;
    constexpr int TK = Sh::TK, RSB = Sh::RSB, DS = Sh::DS;
    static_assert(Sh::STAGE >= Sh::KG * GB * DV * 4, "reduction buffer overlays the K/V tiles");
    static_assert(Sh::QPT >= 1 && Sh::CPT >= 1 && TK % 4 == 0 && Sh::CPT * DEC_THREADS == TK * Sh::UPR,
                  "tile geometry");
    static_assert(GB <= 2 * DEC_WARPS, "two query heads per softmax warp at most");
    static_assert(Sh::STAGE + GB * DV * 4 + GB * TK * 4 <= 48 * 1024, "static shared memory");
    static_assert(Sh::STAGE >= GB * DEC_MAX_PARTS * 4, "merge weights overlay the K/V tiles");
    // Two (K tile, V tile) buffers; at the end of a part the same bytes hold the key groups'
    // accumulators.
    __shared__ __align__(16) unsigned char sm_kv[Sh::STAGE];
    __shared__ __align__(16) float sm_q[GB][DV];
    __shared__ __align__(16) float sm_p[GB][TK];
    __shared__ float sm_corr[GB], sm_m[GB], sm_l[GB], sm_inv[GB];
    __shared__ int sm_last;
    float* red = reinterpret_cast<float*>(sm_kv);

    const int kv_head = blockIdx.x;
    const long row_y = blockIdx.y;
    const long t = q_index ? q_index[row_y] : row_y;
    const int ctx = q_pos[t] + 1;
    const int part_len = decode_part_len(ctx, single_keys);
    const int n_active = (ctx + part_len - 1) / part_len;
    if ((int)blockIdx.z >= n_active) return;  // block-uniform: before any barrier

    const int tid = threadIdx.x, lane = tid % WARP_SIZE, warp = tid / WARP_SIZE;
    const int group = n_heads / n_kv_heads;
    const int* table = block_tables + (long)q_seq[t] * max_blocks;
    const long kv_row = (long)n_kv_heads * head_dim;
    const long head_off = (long)kv_head * head_dim;
    const float kscale = DecStore<C>::kScale;
    const unsigned char* kc = reinterpret_cast<const unsigned char*>(k_cache);
    const unsigned char* vc = reinterpret_cast<const unsigned char*>(v_cache);

    // Stage the tile of keys tile_start.. into buffer `buf`: unit idx is row idx / UPR, elements
    // (idx % UPR) · UE..; rows past `end` and elements past head_dim are zeros.
    auto stage_tile = [&](int tile_start, int end, int buf) {
        unsigned char* sk = sm_kv + buf * 2 * Sh::TILE;
        unsigned char* sv = sk + Sh::TILE;
#pragma unroll
        for (int i = 0; i < Sh::CPT; ++i) {
            const int idx = tid + i * DEC_THREADS;
            const int r = idx / Sh::UPR, u = idx - r * Sh::UPR;
            const int j = tile_start + r, e = u * Sh::UE;
            const bool ok = j < end && e < head_dim;
            long off = 0;
            if (ok) off = (((long)table[j / block_size] * block_size + j % block_size) * kv_row + head_off + e) * CB;
            dec_cp<Sh::UB>(sk + r * RSB + u * Sh::UB, kc + off, ok);
            dec_cp<Sh::UB>(sv + r * RSB + u * Sh::UB, vc + off, ok);
        }
        dec_cp_commit();
    };

    // The first tile of the block's first part before the wait when it holds only earlier steps'
    // keys, below the sequence's cached length (pf_meta row q_seq[t], field 2; see the header);
    // block-uniform.
    const int first_start = (int)blockIdx.z * part_len;
    const int first_end = min(ctx, first_start + part_len);
    const int pf_lim = pf_meta ? min(ctx - 1, pf_meta[4 * (long)q_seq[t] + 2]) : 0;
    const bool prefetched = min(first_end, first_start + TK) <= pf_lim;
    if (prefetched) stage_tile(first_start, first_end, 0);
    // Metadata and earlier steps' K/V only above (see the header); q, this step's key and every
    // output below.
    dec_pdl_wait();
    dec_pdl_launch_dependents();

    // q of the group, pre-scaled (and times the staging factor of K), zero past head_dim.
    const float qscale = scale * DEC_LOG2E * kscale;
    for (int idx = tid; idx < GB * DV; idx += DEC_THREADS) {
        const int g = idx / DV, d = idx - g * DV;
        sm_q[g][d] = (g < group && d < head_dim)
                         ? Io<T>::load(q, (t * n_heads + (long)kv_head * group + g) * (long)head_dim + d) * qscale
                         : 0.0f;
    }

    // Score phase: key kgs of the tile, lane slice s_slice; P·V phase: 4-dim column dc, key group kg.
    const int s_slice = tid % DS, kgs = tid / DS;
    const int dc = tid % Sh::DC, kg = tid / Sh::DC;
    const int d_pv = dc * 4;

    for (int part = blockIdx.z; part < n_active; part += gridDim.z) {
        const int start = part * part_len;
        const int end = min(ctx, start + part_len);
        float acc[GB][4];
#pragma unroll
        for (int g = 0; g < GB; ++g)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[g][i] = 0.0f;
        float m_run[2] = {KILN_NEG_INF, KILN_NEG_INF}, l_run[2] = {0.0f, 0.0f};

        __syncthreads();  // the last part's reduction (over the same bytes) has been read
        if (!(prefetched && part == (int)blockIdx.z)) stage_tile(start, end, 0);
        int buf = 0;
        for (int ts = start; ts < end; ts += TK, buf ^= 1) {
            dec_cp_wait_all();
            __syncthreads();  // tile ts is in `buf` for every thread; the last tile's readers are done
            if (ts + TK < end) stage_tile(ts + TK, end, buf ^ 1);  // in flight during the arithmetic
            const unsigned char* sk = sm_kv + buf * 2 * Sh::TILE;
            const unsigned char* sv = sk + Sh::TILE;

            // 2. Scores of key kgs, this lane's SW-dim slice, every head of the group.
            float sc[GB];
#pragma unroll
            for (int g = 0; g < GB; ++g) sc[g] = 0.0f;
#pragma unroll
            for (int c = 0; c < Sh::NCH; ++c) {
                const int d = (c * DS + s_slice) * 8;
                if (d >= head_dim) continue;
                float kf[8];
                DecRead<C, 8>::run(sk + kgs * RSB + d * CB, kf);
#pragma unroll
                for (int g = 0; g < GB; ++g) {
                    if (g >= group) break;  // uniform over the block
                    const float4 qa = *reinterpret_cast<const float4*>(&sm_q[g][d]);
                    const float4 qb = *reinterpret_cast<const float4*>(&sm_q[g][d + 4]);
                    float s = sc[g];
                    s = fmaf(qa.x, kf[0], s); s = fmaf(qa.y, kf[1], s);
                    s = fmaf(qa.z, kf[2], s); s = fmaf(qa.w, kf[3], s);
                    s = fmaf(qb.x, kf[4], s); s = fmaf(qb.y, kf[5], s);
                    s = fmaf(qb.z, kf[6], s); s = fmaf(qb.w, kf[7], s);
                    sc[g] = s;
                }
            }
#pragma unroll
            for (int g = 0; g < GB; ++g) {
                if (g >= group) break;
                float v = sc[g];
#pragma unroll
                for (int o = 1; o < DS; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
                if (s_slice == 0) sm_p[g][kgs] = ts + kgs < end ? v : KILN_NEG_INF;
            }
            __syncthreads();

            // 3. Softmax scalars once per (key, head) of the tile: warp w takes heads w, w + 4.
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                const int g = warp + hh * DEC_WARPS;
                if (g >= group || g >= GB) continue;  // warp-uniform
                float tmax = KILN_NEG_INF;
                for (int r = lane; r < TK; r += WARP_SIZE) tmax = fmaxf(tmax, sm_p[g][r]);
                tmax = warp_max(tmax);
                const float mn = fmaxf(m_run[hh], tmax);  // finite: every tile has a key < end
                const float corr = dec_scale(m_run[hh], mn);
                float sum = 0.0f;
                for (int r = lane; r < TK; r += WARP_SIZE) {
                    const float p = dec_scale(sm_p[g][r], mn);
                    sm_p[g][r] = p;
                    sum += p;
                }
                sum = warp_sum(sum);
                l_run[hh] = fmaf(l_run[hh], corr, sum);
                m_run[hh] = mn;
                if (lane == 0) sm_corr[g] = corr;
            }
            __syncthreads();

            // 4. P·V over the tile: dims d_pv..+4, key quads kg, kg + KG, ...
            if (d_pv < head_dim) {
#pragma unroll
                for (int g = 0; g < GB; ++g) {
                    if (g >= group) break;
                    const float corr = sm_corr[g];
                    if (corr != 1.0f) {  // lazy: only when this head's max grew
#pragma unroll
                        for (int i = 0; i < 4; ++i) acc[g][i] *= corr;
                    }
                }
#pragma unroll
                for (int qd = 0; qd < Sh::QPT; ++qd) {
                    const int j0 = 4 * (kg + qd * Sh::KG);
                    float vf[4][4];
#pragma unroll
                    for (int u = 0; u < 4; ++u) DecRead<C, 4>::run(sv + (j0 + u) * RSB + d_pv * CB, vf[u]);
#pragma unroll
                    for (int g = 0; g < GB; ++g) {
                        if (g >= group) break;
                        const float4 p4 = *reinterpret_cast<const float4*>(&sm_p[g][j0]);
#pragma unroll
                        for (int i = 0; i < 4; ++i) {
                            float a = acc[g][i];
                            a = fmaf(p4.x, vf[0][i], a);
                            a = fmaf(p4.y, vf[1][i], a);
                            a = fmaf(p4.z, vf[2][i], a);
                            a = fmaf(p4.w, vf[3][i], a);
                            acc[g][i] = a;
                        }
                    }
                }
            }
        }

        // End of the part: sum the key groups' accumulators (one shared running max per head).
        __syncthreads();
        if (d_pv < head_dim) {
#pragma unroll
            for (int g = 0; g < GB; ++g) {
                if (g >= group) break;
                float* dst = red + ((long)kg * GB + g) * DV + d_pv;
                *reinterpret_cast<float4*>(dst) = make_float4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]);
            }
        }
        if (lane == 0) {
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                const int g = warp + hh * DEC_WARPS;
                if (g < group && g < GB) {
                    sm_m[g] = m_run[hh];
                    sm_l[g] = l_run[hh];
                }
            }
        }
        __syncthreads();
        for (int idx = tid; idx < group * head_dim; idx += DEC_THREADS) {
            const int g = idx / head_dim, d = idx - g * head_dim;
            float o = 0.0f;
#pragma unroll
            for (int w = 0; w < Sh::KG; ++w) o += red[((long)w * GB + g) * DV + d];
            o *= kscale;  // V was staged 2^8 below its value for e4m3
            const int head = kv_head * group + g;
            const float lsum = sm_l[g];
            if (n_active == 1) {
                const float v = lsum > 0.0f ? o / lsum : 0.0f;
                Io<T>::store(out, (t * n_heads + head) * (long)head_dim + d,
                             dec_gated<T>(v, gate, t, head, d, gate_row, gate_head));
            } else {
                const long ph = (row_y * n_heads + head) * (long)n_slots + part;
                part_acc[ph * head_dim + d] = o;
                if (d == 0) {
                    part_m[ph] = sm_m[g];
                    part_l[ph] = lsum;
                }
            }
        }
        // The next part's first barrier orders these reads before its staging overwrites `red`.
    }

    // In-launch merge (see the header): the last block of (kv_head, row) to finish merges.
    if (n_active == 1 || !counters) return;  // block-uniform
    __threadfence();  // this thread's partials are visible device-wide before the ticket
    __syncthreads();  // every thread's are; the reads of `red` are done (w_s overlays it)
    if (tid == 0) {
        unsigned int* c = counters + row_y * n_kv_heads + kv_head;
        const unsigned int blocks = (unsigned int)min((int)gridDim.z, n_active);
        const int last = atomicAdd(c, 1u) == blocks - 1u;
        if (last) *c = 0u;  // every block of this (kv_head, row) has taken its ticket
        sm_last = last;
    }
    __syncthreads();
    if (!sm_last) return;  // block-uniform
    __threadfence();  // the other blocks' partials are read after their tickets
    float* w_s = red;  // [GB][DEC_MAX_PARTS]
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        const int g = warp + hh * DEC_WARPS;
        if (g >= group || g >= GB) continue;  // warp-uniform
        const long ph0 = (row_y * n_heads + (long)kv_head * group + g) * (long)n_slots;
        const float inv = dec_merge_weights(part_m, part_l, ph0, n_active, lane, w_s + g * DEC_MAX_PARTS);
        if (lane == 0) sm_inv[g] = inv;
    }
    __syncthreads();
    for (int idx = tid; idx < group * head_dim; idx += DEC_THREADS) {
        const int g = idx / head_dim, d = idx - g * head_dim;
        const int head = kv_head * group + g;
        const long ph0 = (row_y * n_heads + head) * (long)n_slots;
        const float o = dec_merge_out(part_acc, ph0, n_active, head_dim, d, w_s + g * DEC_MAX_PARTS, sm_inv[g]);
        Io<T>::store(out, (t * n_heads + head) * (long)head_dim + d,
                     dec_gated<T>(o, gate, t, head, d, gate_row, gate_head));
    }
}

// Merge a row's parts in a second launch (the main kernel ran with counters = null): grid
// (n_heads, n_rows), DEC_THREADS threads; rows with one part were written by the main kernel and
// are left alone. Launched without PDL.
template <typename T>
__device__ void attention_decode_combine(const float* part_m, const float* part_l,
                                         const float* part_acc, const int* q_pos,
                                         const int* q_index, T* out, int n_heads, int head_dim,
                                         int n_slots, int single_keys, const T* gate, int gate_row,
                                         int gate_head) {
    __shared__ float w_s[DEC_MAX_PARTS];
    __shared__ float inv_s;
    const int head = blockIdx.x;
    const long row_y = blockIdx.y;
    const long t = q_index ? q_index[row_y] : row_y;
    const int ctx = q_pos[t] + 1;
    const int part_len = decode_part_len(ctx, single_keys);
    const int n_active = (ctx + part_len - 1) / part_len;
    if (n_active <= 1) return;
    const long ph0 = (row_y * n_heads + head) * (long)n_slots;
    if (threadIdx.x < WARP_SIZE) {
        const float inv = dec_merge_weights(part_m, part_l, ph0, n_active, threadIdx.x, w_s);
        if (threadIdx.x == 0) inv_s = inv;
    }
    __syncthreads();
    const float inv = inv_s;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        const float o = dec_merge_out(part_acc, ph0, n_active, head_dim, d, w_s, inv);
        Io<T>::store(out, (t * n_heads + head) * (long)head_dim + d,
                     dec_gated<T>(o, gate, t, head, d, gate_row, gate_head));
    }
}

#define ATTENTION_DECODE_ONE(SUF, T, CSUF, C, DV, GB)                                               \
    extern "C" __global__ void __launch_bounds__(DEC_THREADS, DEC_MIN_BLOCKS)                       \
        attention_decode_##SUF##_##CSUF##_d##DV##_g##GB(                                            \
            const T* q, const C* kc, const C* vc, const int* bt, const int* q_seq,                  \
            const int* q_pos, const int* q_index, T* out, float* pm, float* pl, float* pacc,        \
            unsigned int* counters, int n_heads, int n_kv_heads, int head_dim, int block_size,     \
            int max_blocks, int n_slots, int single_keys, const int* pf_meta, float scale,         \
            const T* gate, int gate_row, int gate_head) {                                           \
        attention_decode<T, C, DV, GB>(q, kc, vc, bt, q_seq, q_pos, q_index, out, pm, pl, pacc,     \
                                       counters, n_heads, n_kv_heads, head_dim, block_size,         \
                                       max_blocks, n_slots, single_keys, pf_meta, scale, gate,      \
                                       gate_row, gate_head);                                        \
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
        const int* q_index, T* out, int n_heads, int head_dim, int n_slots, int single_keys,        \
        const T* gate, int gate_row, int gate_head) {                                               \
        attention_decode_combine<T>(pm, pl, pacc, q_pos, q_index, out, n_heads, head_dim, n_slots,  \
                                    single_keys, gate, gate_row, gate_head);                        \
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
