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
// Inside a block (DEC_THREADS threads) a part is walked in tiles of TK keys (TK · DV = 8192 for
// 16-bit shared storage, 4096 for f32), each tile in four phases:
//   1. staging: the tile's K and V rows go to shared memory (16-byte loads, 8 bytes for fp8, two
//      16-byte loads for f32; fp8 converted once here to f16 bit patterns: e5m2 is the upper byte of
//      an f16, e4m3 is (sign << 15 | (byte & 0x7f) << 7) as an f16 times 2^8, that 2^8 folded into
//      q and into the output). The next tile's loads are issued into registers before the
//      arithmetic on this one, so the memory system always has a tile in flight.
//   2. scores: a thread takes KPT keys (2 for 16-bit, 1 for f32) and a 32-dim slice of each, for
//      every query head of the group (q, pre-scaled by scale · log2 e, broadcast from shared
//      memory); the DV / 32 slices of a key are adjacent lanes, summed by log2(DV / 32) shuffles.
//   3. softmax: one warp per query head, once per tile: the tile's max, the running max m, the
//      correction exp2(m_old - m_new) (exactly 1 when the max did not grow), p = exp2(s - m), the
//      running sum l.
//   4. P·V: a thread takes 8 dims and every (1024 / DV)-th quad of keys, for every query head,
//      rescaling its accumulators only when a head's correction is not 1 (the lazy rescale).
// At the end of a part the key groups' accumulators are summed through shared memory (they share
// one running max, so no rescale): with n_active == 1 the row's result acc / l goes straight to
// `out` (short contexts: no combine work); otherwise (m, l, acc) go to part_m/part_l [n_rows,
// n_heads, n_slots] and part_acc [n_rows, n_heads, n_slots, head_dim] (f32, by block row y; n_slots
// ≥ every row's n_active) and attention_decode_combine_* merges the row's parts (m in base 2).
//
// The fp8 NaN byte 0x7f of e4m3 (which the KV writer never produces — it saturates to 448) would
// read as 480. No bf16 intrinsics, cp.async or tensor cores: sm_70 runs the same code. Static
// shared memory ≤ 47.2 KB per block (see DecShape). ptxas (NVRTC 12.9, sm_90, bf16 compute) gives
// 144–254 registers per thread (most for g8 and 16-bit KV: 64 accumulators + the prefetched tile),
// so 2–3 blocks of 4 warps per SM: the occupancy limit behind docs/benchmarks.md's figures.
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

// One chunk of 8 consecutive storage elements: its raw register form R (what the global load
// gives), the shared-memory element S it is staged as (8 S = 16 or 32 bytes), and the factor the
// staged values are below the true ones (2^8 for e4m3, else 1).
template <typename C> struct DecChunk;
template <> struct DecChunk<float> {
    typedef float S;
    struct R { float4 a, b; };
    static constexpr float kScale = 1.0f;
    static __device__ __forceinline__ R load(const float* p, long i) {
        R r;
        r.a = *reinterpret_cast<const float4*>(p + i);
        r.b = *reinterpret_cast<const float4*>(p + i + 4);
        return r;
    }
    static __device__ __forceinline__ R zero() {
        R r;
        r.a = make_float4(0.f, 0.f, 0.f, 0.f);
        r.b = r.a;
        return r;
    }
    static __device__ __forceinline__ void stage(S* dst, const R& r) {
        reinterpret_cast<float4*>(dst)[0] = r.a;
        reinterpret_cast<float4*>(dst)[1] = r.b;
    }
};
template <typename C16> struct DecChunk16 {
    typedef C16 S;
    typedef uint4 R;
    static constexpr float kScale = 1.0f;
    static __device__ __forceinline__ R load(const C16* p, long i) {
        return *reinterpret_cast<const uint4*>(p + i);
    }
    static __device__ __forceinline__ R zero() { return make_uint4(0u, 0u, 0u, 0u); }
    static __device__ __forceinline__ void stage(S* dst, const R& r) {
        *reinterpret_cast<uint4*>(dst) = r;
    }
};
template <> struct DecChunk<bf16_t> : DecChunk16<bf16_t> {};
template <> struct DecChunk<__half> : DecChunk16<__half> {};
// fp8 byte pairs spread to f16 words: [0, b0, 0, b1] and [0, b2, 0, b3] of a 4-byte word.
__device__ __forceinline__ uint4 dec_spread_fp8(uint2 u) {
    return make_uint4(__byte_perm(u.x, 0u, 0x1404), __byte_perm(u.x, 0u, 0x3424),
                      __byte_perm(u.y, 0u, 0x1404), __byte_perm(u.y, 0u, 0x3424));
}
template <> struct DecChunk<E5M2> {
    typedef __half S;
    typedef uint2 R;
    static constexpr float kScale = 1.0f;
    static __device__ __forceinline__ R load(const E5M2* p, long i) {
        return *reinterpret_cast<const uint2*>(p + i);
    }
    static __device__ __forceinline__ R zero() { return make_uint2(0u, 0u); }
    static __device__ __forceinline__ void stage(S* dst, const R& r) {
        *reinterpret_cast<uint4*>(dst) = dec_spread_fp8(r);
    }
};
template <> struct DecChunk<E4M3> {
    typedef __half S;
    typedef uint2 R;
    static constexpr float kScale = 256.0f;
    static __device__ __forceinline__ R load(const E4M3* p, long i) {
        return *reinterpret_cast<const uint2*>(p + i);
    }
    static __device__ __forceinline__ R zero() { return make_uint2(0u, 0u); }
    static __device__ __forceinline__ unsigned int fix(unsigned int w) {
        return (w & 0x80008000u) | ((w & 0x7f007f00u) >> 1);
    }
    static __device__ __forceinline__ void stage(S* dst, const R& r) {
        const uint4 s = dec_spread_fp8(r);
        *reinterpret_cast<uint4*>(dst) = make_uint4(fix(s.x), fix(s.y), fix(s.z), fix(s.w));
    }
};

// Eight staged elements at p (16-byte aligned) as f32.
__device__ __forceinline__ void dec_read8(const float* p, float* o) {
    const float4 a = reinterpret_cast<const float4*>(p)[0];
    const float4 b = reinterpret_cast<const float4*>(p)[1];
    o[0] = a.x; o[1] = a.y; o[2] = a.z; o[3] = a.w;
    o[4] = b.x; o[5] = b.y; o[6] = b.z; o[7] = b.w;
}
__device__ __forceinline__ void dec_read8(const bf16_t* p, float* o) {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    const unsigned int w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        o[2 * k] = __uint_as_float(w[k] << 16);
        o[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
    }
}
__device__ __forceinline__ void dec_read8(const __half* p, float* o) {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    const unsigned int w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        o[2 * k] = __half2float(__ushort_as_half((unsigned short)(w[k] & 0xffffu)));
        o[2 * k + 1] = __half2float(__ushort_as_half((unsigned short)(w[k] >> 16)));
    }
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

// Tile geometry of one (DV, shared element size) class.
template <int DV, int SBYTES> struct DecShape {
    static constexpr int KPT = SBYTES == 4 ? 1 : 2;          // keys per thread in the scores
    static constexpr int TK = DEC_THREADS * 32 * KPT / DV;    // keys per tile
    static constexpr int DS = DV / 32;                        // 32-dim slices (lanes) per key
    static constexpr int SKG = TK / KPT;                      // score key groups (= threads / DS)
    // Row stride in elements: DS chunks of padding (mod 8 in 16-byte units) so the 8-lane phases
    // of the scores' 16-byte reads hit distinct banks.
    static constexpr int RS = DV + (DS % 8) * 8;
    static constexpr int DC = DV / 8;                         // P·V: 8-dim chunks per row
    static constexpr int KG = DEC_THREADS / DC;               // P·V: key groups
    static constexpr int QPT = TK / 4 / KG;                   // P·V: key quads per thread
    static constexpr int CPT = TK * DC / DEC_THREADS;         // staging: chunks per thread
    static constexpr int KV_BYTES = 2 * TK * RS * SBYTES;
};

template <typename T, typename C, int DV, int GB>
__device__ void attention_decode(const T* q, const C* k_cache, const C* v_cache,
                                 const int* block_tables, const int* q_seq, const int* q_pos,
                                 const int* q_index, T* out, float* part_m, float* part_l,
                                 float* part_acc, int n_heads, int n_kv_heads, int head_dim,
                                 int block_size, int max_blocks, int n_slots, float scale,
                                 const T* gate, int gate_row, int gate_head) {
    typedef DecChunk<C> Chunk;
    typedef typename Chunk::S S;
    typedef DecShape<DV, (int)sizeof(S)> Sh;
    constexpr int TK = Sh::TK, RS = Sh::RS, DS = Sh::DS, KPT = Sh::KPT;
    static_assert(Sh::KV_BYTES >= Sh::KG * GB * DV * 4, "reduction buffer overlays the K/V tiles");
    static_assert(Sh::QPT >= 1 && Sh::CPT >= 1 && TK % 4 == 0, "tile geometry");
    static_assert(GB <= 2 * DEC_WARPS, "two query heads per softmax warp at most");
    // K tile, V tile; at the end of a part the same bytes hold the key groups' accumulators.
    __shared__ __align__(16) unsigned char sm_kv[Sh::KV_BYTES];
    __shared__ __align__(16) float sm_q[GB][DV];
    __shared__ __align__(16) float sm_p[GB][TK];
    __shared__ float sm_corr[GB], sm_m[GB], sm_l[GB];
    S* sk = reinterpret_cast<S*>(sm_kv);
    S* sv = sk + TK * RS;
    float* red = reinterpret_cast<float*>(sm_kv);

    const int kv_head = blockIdx.x;
    const long row_y = blockIdx.y;
    const long t = q_index ? q_index[row_y] : row_y;
    const int ctx = q_pos[t] + 1;
    const int part_len = decode_part_len(ctx);
    const int n_active = (ctx + part_len - 1) / part_len;
    if ((int)blockIdx.z >= n_active) return;  // block-uniform: before any barrier

    const int tid = threadIdx.x, lane = tid % WARP_SIZE, warp = tid / WARP_SIZE;
    const int group = n_heads / n_kv_heads;
    const int* table = block_tables + (long)q_seq[t] * max_blocks;
    const long kv_row = (long)n_kv_heads * head_dim;
    const long head_off = (long)kv_head * head_dim;
    const float kscale = Chunk::kScale;

    // q of the group, pre-scaled (and times the staging factor of K), zero past head_dim.
    const float qscale = scale * DEC_LOG2E * kscale;
    for (int idx = tid; idx < GB * DV; idx += DEC_THREADS) {
        const int g = idx / DV, d = idx - g * DV;
        sm_q[g][d] = (g < group && d < head_dim)
                         ? Io<T>::load(q, (t * n_heads + (long)kv_head * group + g) * (long)head_dim + d) * qscale
                         : 0.0f;
    }

    // Staging chunk i of a tile: key row r = i / DC, dims c * 8.. (c = i % DC).
    auto load_tile = [&](int tile_start, int end, typename Chunk::R* rk, typename Chunk::R* rv) {
#pragma unroll
        for (int i = 0; i < Sh::CPT; ++i) {
            const int idx = tid + i * DEC_THREADS;
            const int r = idx / Sh::DC, c = idx - r * Sh::DC;
            const int j = tile_start + r;
            if (j < end && c * 8 < head_dim) {
                const long base = ((long)table[j / block_size] * block_size + j % block_size) * kv_row + head_off + c * 8;
                rk[i] = Chunk::load(k_cache, base);
                rv[i] = Chunk::load(v_cache, base);
            } else {
                rk[i] = Chunk::zero();
                rv[i] = Chunk::zero();
            }
        }
    };

    // Score phase: key group kgs, slice s; P·V phase: dim chunk dc, key group kg.
    const int s_slice = tid % DS, kgs = tid / DS;
    const int dc = tid % Sh::DC, kg = tid / Sh::DC;
    const int d_pv = dc * 8;

    for (int part = blockIdx.z; part < n_active; part += gridDim.z) {
        const int start = part * part_len;
        const int end = min(ctx, start + part_len);
        float acc[GB][8];
#pragma unroll
        for (int g = 0; g < GB; ++g)
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[g][i] = 0.0f;
        float m_run[2] = {KILN_NEG_INF, KILN_NEG_INF}, l_run[2] = {0.0f, 0.0f};

        typename Chunk::R rk[Sh::CPT], rv[Sh::CPT];
        load_tile(start, end, rk, rv);
        for (int ts = start; ts < end; ts += TK) {
            __syncthreads();  // the previous tile's readers (or the last part's reduction) are done
#pragma unroll
            for (int i = 0; i < Sh::CPT; ++i) {
                const int idx = tid + i * DEC_THREADS;
                const int r = idx / Sh::DC, c = idx - r * Sh::DC;
                Chunk::stage(sk + r * RS + c * 8, rk[i]);
                Chunk::stage(sv + r * RS + c * 8, rv[i]);
            }
            __syncthreads();
            if (ts + TK < end) load_tile(ts + TK, end, rk, rv);  // in flight during the arithmetic

            // 2. Scores of keys kgs + u · SKG, this lane's 32-dim slice, every head of the group.
            float sc[GB][KPT];
#pragma unroll
            for (int g = 0; g < GB; ++g)
#pragma unroll
                for (int u = 0; u < KPT; ++u) sc[g][u] = 0.0f;
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const int d = (c * DS + s_slice) * 8;
                if (d >= head_dim) continue;
                float kf[KPT][8];
#pragma unroll
                for (int u = 0; u < KPT; ++u) dec_read8(sk + (kgs + u * Sh::SKG) * RS + d, kf[u]);
#pragma unroll
                for (int g = 0; g < GB; ++g) {
                    if (g >= group) break;  // uniform over the block
                    float qf[8];
                    dec_read8(&sm_q[g][d], qf);
#pragma unroll
                    for (int u = 0; u < KPT; ++u)
#pragma unroll
                        for (int i = 0; i < 8; ++i) sc[g][u] = fmaf(qf[i], kf[u][i], sc[g][u]);
                }
            }
#pragma unroll
            for (int g = 0; g < GB; ++g) {
                if (g >= group) break;
#pragma unroll
                for (int u = 0; u < KPT; ++u) {
                    float v = sc[g][u];
#pragma unroll
                    for (int o = 1; o < DS; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
                    const int r = kgs + u * Sh::SKG;
                    if (s_slice == 0) sm_p[g][r] = ts + r < end ? v : KILN_NEG_INF;
                }
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

            // 4. P·V over the tile: dims d_pv..+8, key quads kg, kg + KG, ...
            if (d_pv < head_dim) {
#pragma unroll
                for (int g = 0; g < GB; ++g) {
                    if (g >= group) break;
                    const float corr = sm_corr[g];
                    if (corr != 1.0f) {  // lazy: only when this head's max grew
#pragma unroll
                        for (int i = 0; i < 8; ++i) acc[g][i] *= corr;
                    }
                }
#pragma unroll
                for (int qd = 0; qd < Sh::QPT; ++qd) {
                    const int j0 = 4 * (kg + qd * Sh::KG);
                    float4 p4[GB];
#pragma unroll
                    for (int g = 0; g < GB; ++g)
                        p4[g] = g < group ? *reinterpret_cast<const float4*>(&sm_p[g][j0]) : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
                    for (int u = 0; u < 4; ++u) {
                        float vf[8];
                        dec_read8(sv + (j0 + u) * RS + d_pv, vf);
#pragma unroll
                        for (int g = 0; g < GB; ++g) {
                            if (g >= group) break;
                            const float p = u == 0 ? p4[g].x : u == 1 ? p4[g].y : u == 2 ? p4[g].z : p4[g].w;
#pragma unroll
                            for (int i = 0; i < 8; ++i) acc[g][i] = fmaf(p, vf[i], acc[g][i]);
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
                reinterpret_cast<float4*>(dst)[0] = make_float4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]);
                reinterpret_cast<float4*>(dst)[1] = make_float4(acc[g][4], acc[g][5], acc[g][6], acc[g][7]);
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
}

// Merge a row's parts: grid (n_heads, n_rows), DEC_THREADS threads; rows with one part were
// written by the main kernel and are left alone.
template <typename T>
__device__ void attention_decode_combine(const float* part_m, const float* part_l,
                                         const float* part_acc, const int* q_pos,
                                         const int* q_index, T* out, int n_heads, int head_dim,
                                         int n_slots, const T* gate, int gate_row, int gate_head) {
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
        Io<T>::store(out, (t * n_heads + head) * (long)head_dim + d,
                     dec_gated<T>(o * inv, gate, t, head, d, gate_row, gate_head));
    }
}

#define ATTENTION_DECODE_ONE(SUF, T, CSUF, C, DV, GB)                                               \
    extern "C" __global__ void __launch_bounds__(DEC_THREADS)                                       \
        attention_decode_##SUF##_##CSUF##_d##DV##_g##GB(                                            \
            const T* q, const C* kc, const C* vc, const int* bt, const int* q_seq,                  \
            const int* q_pos, const int* q_index, T* out, float* pm, float* pl, float* pacc,        \
            int n_heads, int n_kv_heads, int head_dim, int block_size, int max_blocks,             \
            int n_slots, float scale, const T* gate, int gate_row, int gate_head) {                 \
        attention_decode<T, C, DV, GB>(q, kc, vc, bt, q_seq, q_pos, q_index, out, pm, pl, pacc,     \
                                       n_heads, n_kv_heads, head_dim, block_size, max_blocks,       \
                                       n_slots, scale, gate, gate_row, gate_head);                  \
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
        const int* q_index, T* out, int n_heads, int head_dim, int n_slots, const T* gate,          \
        int gate_row, int gate_head) {                                                              \
        attention_decode_combine<T>(pm, pl, pacc, q_pos, q_index, out, n_heads, head_dim, n_slots,  \
                                    gate, gate_row, gate_head);                                     \
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
