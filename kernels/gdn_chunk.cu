// gdn_chunk.cu: the chunked gated delta rule (the WY / UT-transform form, chunk C = 64) for the
// prefill of a Gated DeltaNet layer, continuing from each sequence's recurrent state. Math:
// shared/docs/qwen3_5.md §3.6; the oracle is gdn.cu's sequential scan (same inputs, same state
// layout), the CPU twin src/backend/cpu/gdn/delta_rule.rs (`chunked`).
//
// Per (sequence, value head h) and chunk of L <= 64 tokens (rows = positions, f32 unless said):
//   q^, k^ = l2norm rows (q scaled by dk^-1/2), beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias),
//   gc = cumsum(g) over the chunk, G[i,j] = exp(gc_i - gc_j) (j <= i)
//   A   = strictly_lower(beta_i (k^_i . k^_j) G[i,j])          Ti = (I + A)^-1 (forward substitution)
//   U   = Ti (beta V)        W = Ti (beta K exp(gc))           P = lower_incl_diag((Q K^T) o G)
//   Qg  = Q exp(gc)          Kd = K exp(gc_{L-1} - gc)         eL = exp(gc_{L-1})
//   Vn  = U - W S            O = Qg S + P Vn                   S <- eL S + Kd^T Vn
// Every exponent is <= 0 (g <= 0), so nothing overflows.
//
// Two kernels (T = f16 | bf16, the 16-bit compute dtypes; f32 compute keeps the scan):
//   gdn_chunk_prep_{T}  grid (seqs, value heads, chunks): everything that does not depend on the
//                       state, all chunks in parallel; writes W, Qg, Kd, U, P (T) and eL (f32) of
//                       each (chunk, head) to the workspace, rows >= L zero.
//   gdn_chunk_scan_{T}  grid (seqs, value heads, ceil(dv / 32)): the state pass, one chunk after
//                       another; each block owns 32 value columns of S (f32 in registers as mma
//                       accumulators, a T copy in shared memory as the B operand) and writes O.
// Matrix products are 16x8x16 tiles (`gc_tile`): mma.sync.m16n8k16 with f32 accumulation on sm_80+
// (operands rounded to T), the same tile with f32 FMAs elsewhere (sm_70 / sm_75: no cp.async,
// dynamic shared memory <= 96 KB). Workspace chunk id of chunk c of sequence s: token_start / 64 + s
// + c (distinct for every (s, c); at most tokens / 64 + seqs + 1). Sequences shorter than
// `min_len`, without tokens or without a slot are left to the scan (it skips the others).
// Shapes: dk a multiple of 16, at most 128; dv a multiple of 8, at most 128 (the host checks).

#define GC_C 64
#define GC_THREADS 128
#define GC_DVS 32
#define GC_MAX_DK 128

template <typename T> struct GcPack;
template <> struct GcPack<__half> {
    static __device__ __forceinline__ unsigned pack(float lo, float hi) {
        return (unsigned)__half_as_ushort(__float2half_rn(lo)) |
               ((unsigned)__half_as_ushort(__float2half_rn(hi)) << 16);
    }
};
template <> struct GcPack<bf16_t> {
    static __device__ __forceinline__ unsigned pack(float lo, float hi) {
        return (unsigned)f32_to_bf16(lo) | ((unsigned)f32_to_bf16(hi) << 16);
    }
};

template <typename T>
__device__ __forceinline__ void gc_mma(float* d, const unsigned* a, unsigned b0, unsigned b1);
template <>
__device__ __forceinline__ void gc_mma<__half>(float* d, const unsigned* a, unsigned b0, unsigned b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}
template <>
__device__ __forceinline__ void gc_mma<bf16_t>(float* d, const unsigned* a, unsigned b0, unsigned b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// c += A B for one tile, A 16 x 16 read as a(r, k), B 16 x 8 read as b(k, n) (f32 values). The
// warp's lanes hold c as the m16n8 accumulator fragment: lane = 4 grp + t holds rows grp (c[0],
// c[1]) and grp + 8 (c[2], c[3]), columns 2t and 2t + 1.
template <typename T, typename FA, typename FB>
__device__ __forceinline__ void gc_tile(float* c, const FA& a, const FB& b) {
    const int lane = threadIdx.x & 31, grp = lane >> 2, t = lane & 3;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    unsigned ra[4];
    ra[0] = GcPack<T>::pack(a(grp, 2 * t), a(grp, 2 * t + 1));
    ra[1] = GcPack<T>::pack(a(grp + 8, 2 * t), a(grp + 8, 2 * t + 1));
    ra[2] = GcPack<T>::pack(a(grp, 2 * t + 8), a(grp, 2 * t + 9));
    ra[3] = GcPack<T>::pack(a(grp + 8, 2 * t + 8), a(grp + 8, 2 * t + 9));
    const unsigned b0 = GcPack<T>::pack(b(2 * t, grp), b(2 * t + 1, grp));
    const unsigned b1 = GcPack<T>::pack(b(2 * t + 8, grp), b(2 * t + 9, grp));
    gc_mma<T>(c, ra, b0, b1);
#else
#pragma unroll 4
    for (int k = 0; k < 16; k++) {
        const float x0 = a(grp, k), x1 = a(grp + 8, k);
        const float y0 = b(k, 2 * t), y1 = b(k, 2 * t + 1);
        c[0] += x0 * y0;
        c[1] += x0 * y1;
        c[2] += x1 * y0;
        c[3] += x1 * y1;
    }
#endif
}

// Row and column (within a 16 x 8 tile) of accumulator element e (0..3) of this lane.
__device__ __forceinline__ int gc_row(int e) { return ((threadIdx.x & 31) >> 2) + (e >= 2 ? 8 : 0); }
__device__ __forceinline__ int gc_col(int e) { return 2 * (threadIdx.x & 3) + (e & 1); }

__device__ __forceinline__ float gc_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// T elements of one (chunk, head) record of the workspace: W, Qg, Kd [64][dk], U [64][dv], P [64][64].
__device__ __forceinline__ long gc_record(int dk, int dv) {
    return 3L * GC_C * dk + (long)GC_C * dv + GC_C * GC_C;
}

template <typename T>
__device__ void gdn_chunk_prep(const T* qkv, const T* a_in, const T* b_in, const T* a_log,
                               const T* dt_bias, const int* seq_meta, T* ws, float* ws_f,
                               int num_key_heads, int num_value_heads, int dk, int dv, int min_len) {
    extern __shared__ __align__(16) unsigned char gc_smem[];
    const int s = blockIdx.x, h = blockIdx.y, c = blockIdx.z;
    const int start = seq_meta[4 * s], len = seq_meta[4 * s + 1], slot = seq_meta[4 * s + 3];
    if (len < min_len || len == 0 || slot < 0) return;
    const int c0 = c * GC_C;
    if (c0 >= len) return;
    const int L = min(GC_C, len - c0);
    const long cid = (long)(start / GC_C) + s + c;

    T* qs = reinterpret_cast<T*>(gc_smem);  // [64][dk] q^ (scaled)
    T* ks = qs + GC_C * dk;                 // [64][dk] k^
    T* vs = ks + GC_C * dk;                 // [64][dv] v
    float* af = reinterpret_cast<float*>(vs + GC_C * dv);  // [64][64] A
    float* ti = af + GC_C * GC_C;                          // [64][65] (I + A)^-1
    float* gcs = ti + GC_C * (GC_C + 1);                   // [64] gc
    float* bet = gcs + GC_C;                               // [64] beta
    float* egc = bet + GC_C;                               // [64] exp(gc)
    float* egl = egc + GC_C;                               // [64] exp(gc_{L-1} - gc)

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int kh = h / (num_value_heads / num_key_heads);
    const long key_dim = (long)num_key_heads * dk;
    const long conv_dim = 2 * key_dim + (long)num_value_heads * dv;
    const float q_scale = rsqrtf((float)dk);
    const float decay_rate = -expf(Io<T>::load(a_log, h));
    const float dtb = Io<T>::load(dt_bias, h);

    // Rows: a warp per row, l2norm in f32, stored rounded to T; rows >= L zero.
    for (int i = warp; i < GC_C; i += GC_THREADS / WARP_SIZE) {
        if (i < L) {
            const long row = (long)(start + c0 + i) * conv_dim;
            float qv[GC_MAX_DK / WARP_SIZE], kv[GC_MAX_DK / WARP_SIZE];
            float ssq = 0.0f, ssk = 0.0f;
#pragma unroll
            for (int r = 0; r < GC_MAX_DK / WARP_SIZE; r++) {
                const int d = lane + WARP_SIZE * r;
                qv[r] = d < dk ? Io<T>::load(qkv, row + (long)kh * dk + d) : 0.0f;
                kv[r] = d < dk ? Io<T>::load(qkv, row + key_dim + (long)kh * dk + d) : 0.0f;
                ssq += qv[r] * qv[r];
                ssk += kv[r] * kv[r];
            }
            ssq = warp_sum(ssq);
            ssk = warp_sum(ssk);
            const float iq = rsqrtf(ssq + 1e-6f) * q_scale, ik = rsqrtf(ssk + 1e-6f);
#pragma unroll
            for (int r = 0; r < GC_MAX_DK / WARP_SIZE; r++) {
                const int d = lane + WARP_SIZE * r;
                if (d < dk) {
                    Io<T>::store(qs, (long)i * dk + d, qv[r] * iq);
                    Io<T>::store(ks, (long)i * dk + d, kv[r] * ik);
                }
            }
            for (int d = lane; d < dv; d += WARP_SIZE)
                vs[i * dv + d] = qkv[row + 2 * key_dim + (long)h * dv + d];
            if (lane == 0) {
                const long tok = (long)(start + c0 + i) * num_value_heads + h;
                gcs[i] = decay_rate * gc_softplus(Io<T>::load(a_in, tok) + dtb);
                bet[i] = 1.0f / (1.0f + expf(-Io<T>::load(b_in, tok)));
            }
        } else {
            for (int d = lane; d < dk; d += WARP_SIZE) {
                Io<T>::store(qs, (long)i * dk + d, 0.0f);
                Io<T>::store(ks, (long)i * dk + d, 0.0f);
            }
            for (int d = lane; d < dv; d += WARP_SIZE) Io<T>::store(vs, (long)i * dv + d, 0.0f);
            if (lane == 0) {
                gcs[i] = 0.0f;
                bet[i] = 0.0f;
            }
        }
    }
    __syncthreads();
    if (tid == 0) {
        float acc = 0.0f;
        for (int i = 0; i < GC_C; i++) {  // in order, as the CPU; rows >= L add 0
            acc += gcs[i];
            gcs[i] = acc;
        }
    }
    __syncthreads();
    const float gl = gcs[GC_C - 1];  // == gc_{L-1}
    if (tid < GC_C) {
        egc[tid] = expf(gcs[tid]);
        egl[tid] = expf(gl - gcs[tid]);
    }

    T* rec = ws + (cid * num_value_heads + h) * gc_record(dk, dv);
    T* w_out = rec;
    T* qg_out = rec + GC_C * dk;
    T* kd_out = rec + 2 * GC_C * dk;
    T* u_out = rec + 3 * GC_C * dk;
    T* p_out = u_out + GC_C * dv;
    if (tid == 0) ws_f[cid * num_value_heads + h] = expf(gl);

    // K K^T and Q K^T: warp w owns rows 16w.. (m-tile w), all 8 column tiles.
    const int m0 = 16 * warp;
    for (int nt = 0; nt < GC_C / 8; nt++) {
        const int n0 = 8 * nt;
        float ak[4] = {0.0f, 0.0f, 0.0f, 0.0f}, aq[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (n0 < m0 + 16) {  // tiles wholly above the diagonal are zero
            for (int k0 = 0; k0 < dk; k0 += 16) {
                auto bk = [&](int kk, int n) { return Io<T>::load(ks, (long)(n0 + n) * dk + k0 + kk); };
                gc_tile<T>(ak, [&](int r, int kk) { return Io<T>::load(ks, (long)(m0 + r) * dk + k0 + kk); }, bk);
                gc_tile<T>(aq, [&](int r, int kk) { return Io<T>::load(qs, (long)(m0 + r) * dk + k0 + kk); }, bk);
            }
        }
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int i = m0 + gc_row(e), j = n0 + gc_col(e);
            const float decay = j <= i ? expf(gcs[i] - gcs[j]) : 0.0f;
            af[i * GC_C + j] = j < i ? bet[i] * ak[e] * decay : 0.0f;
            Io<T>::store(p_out, (long)i * GC_C + j, aq[e] * decay);
        }
    }
    // Qg and Kd (rows >= L are zero because q^ and k^ are).
    __syncthreads();  // egc / egl visible
    for (int e = tid; e < GC_C * dk; e += GC_THREADS) {
        const int i = e / dk;
        Io<T>::store(qg_out, e, Io<T>::load(qs, e) * egc[i]);
        Io<T>::store(kd_out, e, Io<T>::load(ks, e) * egl[i]);
    }
    // Ti = (I + A)^-1, unit lower triangular, one row after another: Ti[i][j] = -sum_{k=j}^{i-1}
    // A[i][k] Ti[k][j] for j < i.
    for (int i = 0; i < GC_C; i++) {
        if (tid < GC_C) {
            const int j = tid;
            float v = j == i ? 1.0f : 0.0f;
            if (j < i)
                for (int k = j; k < i; k++) v -= af[i * GC_C + k] * ti[k * (GC_C + 1) + j];
            ti[i * (GC_C + 1) + j] = v;
        }
        __syncthreads();
    }
    // U = Ti (beta V), W = Ti (beta exp(gc) K): warp w rows 16w..; Ti's k-tiles past the
    // diagonal block are zero.
    for (int nt = 0; nt < dv / 8; nt++) {
        const int n0 = 8 * nt;
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int k0 = 0; k0 <= m0; k0 += 16)
            gc_tile<T>(acc, [&](int r, int kk) { return ti[(m0 + r) * (GC_C + 1) + k0 + kk]; },
                       [&](int kk, int n) {
                           return bet[k0 + kk] * Io<T>::load(vs, (long)(k0 + kk) * dv + n0 + n);
                       });
#pragma unroll
        for (int e = 0; e < 4; e++)
            Io<T>::store(u_out, (long)(m0 + gc_row(e)) * dv + n0 + gc_col(e), acc[e]);
    }
    for (int nt = 0; nt < dk / 8; nt++) {
        const int n0 = 8 * nt;
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int k0 = 0; k0 <= m0; k0 += 16)
            gc_tile<T>(acc, [&](int r, int kk) { return ti[(m0 + r) * (GC_C + 1) + k0 + kk]; },
                       [&](int kk, int n) {
                           return bet[k0 + kk] * egc[k0 + kk] *
                                  Io<T>::load(ks, (long)(k0 + kk) * dk + n0 + n);
                       });
#pragma unroll
        for (int e = 0; e < 4; e++)
            Io<T>::store(w_out, (long)(m0 + gc_row(e)) * dk + n0 + gc_col(e), acc[e]);
    }
}

// Copy n16 16-byte words from global to shared (both 16-byte aligned).
__device__ __forceinline__ void gc_copy16(void* dst, const void* src, int n16) {
    const uint4* s = reinterpret_cast<const uint4*>(src);
    uint4* d = reinterpret_cast<uint4*>(dst);
    for (int i = threadIdx.x; i < n16; i += GC_THREADS) d[i] = s[i];
}

template <typename T>
__device__ void gdn_chunk_scan(const T* ws, const float* ws_f, float* rec_state, const int* seq_meta,
                               T* out, int num_value_heads, int dk, int dv, int num_layers,
                               int layer, int min_len) {
    extern __shared__ __align__(16) unsigned char gc_smem[];
    const int s = blockIdx.x, h = blockIdx.y, nb = blockIdx.z * GC_DVS;
    const int start = seq_meta[4 * s], len = seq_meta[4 * s + 1], cached = seq_meta[4 * s + 2],
              slot = seq_meta[4 * s + 3];
    if (len < min_len || len == 0 || slot < 0) return;
    const int width = min(GC_DVS, dv - nb);
    const int ntiles = width / 8;

    T* w_s = reinterpret_cast<T*>(gc_smem);  // [64][dk] W, then Qg, Kd (contiguous, as in ws)
    T* qg_s = w_s + GC_C * dk;
    T* kd_s = qg_s + GC_C * dk;
    T* p_s = kd_s + GC_C * dk;     // [64][64]
    T* u_s = p_s + GC_C * GC_C;    // [64][32] this block's columns of U
    T* vn_s = u_s + GC_C * GC_DVS; // [64][32] Vn
    T* sb = vn_s + GC_C * GC_DVS;  // [32][dk] S^T as T (the B operand)

    const int tid = threadIdx.x, warp = tid >> 5;
    const int m0 = 16 * warp;
    float* st = rec_state + (((long)slot * num_layers + layer) * num_value_heads + h) * (long)dv * dk;

    // S: warp w owns the dk m-tiles w and w + 4, all column tiles.
    float S[2][GC_DVS / 8][4];
#pragma unroll
    for (int a = 0; a < 2; a++)
#pragma unroll
        for (int nt = 0; nt < GC_DVS / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int mt = warp + 4 * a;
                const int i = 16 * mt + gc_row(e), j = 8 * nt + gc_col(e);
                float v = 0.0f;
                if (cached != 0 && 16 * mt < dk && nt < ntiles) v = st[(long)(nb + j) * dk + i];
                S[a][nt][e] = v;
                if (16 * mt < dk && nt < ntiles) Io<T>::store(sb, (long)j * dk + i, v);
            }

    const long rec_len = gc_record(dk, dv);
    const long cid0 = (long)(start / GC_C) + s;
    const int nchunks = (len + GC_C - 1) / GC_C;
    for (int c = 0; c < nchunks; c++) {
        const int L = min(GC_C, len - c * GC_C);
        const T* rec = ws + ((cid0 + c) * num_value_heads + h) * rec_len;
        __syncthreads();  // the previous chunk's readers are done; sb written
        gc_copy16(w_s, rec, (int)(3 * GC_C * dk * sizeof(T) / 16));
        gc_copy16(p_s, rec + 3 * GC_C * dk + GC_C * dv, (int)(GC_C * GC_C * sizeof(T) / 16));
        {
            const int per_row = width * (int)sizeof(T) / 16;
            const T* u = rec + 3 * GC_C * dk + nb;
            for (int e = tid; e < GC_C * per_row; e += GC_THREADS) {
                const int i = e / per_row, q = e % per_row;
                reinterpret_cast<uint4*>(u_s + i * GC_DVS)[q] =
                    reinterpret_cast<const uint4*>(u + (long)i * dv)[q];
            }
        }
        const float el = ws_f[(cid0 + c) * num_value_heads + h];
        __syncthreads();
        // Vn = U - W S: warp w rows 16w..
        for (int nt = 0; nt < ntiles; nt++) {
            const int n0 = 8 * nt;
            float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            for (int k0 = 0; k0 < dk; k0 += 16)
                gc_tile<T>(acc, [&](int r, int kk) { return Io<T>::load(w_s, (long)(m0 + r) * dk + k0 + kk); },
                           [&](int kk, int n) { return Io<T>::load(sb, (long)(n0 + n) * dk + k0 + kk); });
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int i = m0 + gc_row(e), j = n0 + gc_col(e);
                Io<T>::store(vn_s, i * GC_DVS + j, Io<T>::load(u_s, i * GC_DVS + j) - acc[e]);
            }
        }
        __syncthreads();
        // O = Qg S + P Vn (P is lower triangular incl. the diagonal: k-tiles up to the row's).
        for (int nt = 0; nt < ntiles; nt++) {
            const int n0 = 8 * nt;
            float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            for (int k0 = 0; k0 < dk; k0 += 16)
                gc_tile<T>(acc, [&](int r, int kk) { return Io<T>::load(qg_s, (long)(m0 + r) * dk + k0 + kk); },
                           [&](int kk, int n) { return Io<T>::load(sb, (long)(n0 + n) * dk + k0 + kk); });
            for (int k0 = 0; k0 <= m0; k0 += 16)
                gc_tile<T>(acc, [&](int r, int kk) { return Io<T>::load(p_s, (m0 + r) * GC_C + k0 + kk); },
                           [&](int kk, int n) { return Io<T>::load(vn_s, (k0 + kk) * GC_DVS + n0 + n); });
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int i = m0 + gc_row(e), j = n0 + gc_col(e);
                if (i < L)
                    Io<T>::store(out, ((long)(start + c * GC_C + i) * num_value_heads + h) * dv + nb + j,
                                 acc[e]);
            }
        }
        // S <- eL S + Kd^T Vn.
#pragma unroll
        for (int a = 0; a < 2; a++) {
            const int mt = warp + 4 * a;
            if (16 * mt >= dk) continue;
#pragma unroll
            for (int nt = 0; nt < GC_DVS / 8; nt++) {
                if (nt >= ntiles) continue;
                const int n0 = 8 * nt;
#pragma unroll
                for (int e = 0; e < 4; e++) S[a][nt][e] *= el;
                for (int k0 = 0; k0 < GC_C; k0 += 16)
                    gc_tile<T>(S[a][nt],
                               [&](int r, int kk) { return Io<T>::load(kd_s, (long)(k0 + kk) * dk + 16 * mt + r); },
                               [&](int kk, int n) { return Io<T>::load(vn_s, (k0 + kk) * GC_DVS + n0 + n); });
            }
        }
        __syncthreads();  // every read of sb and vn_s is done
#pragma unroll
        for (int a = 0; a < 2; a++)
#pragma unroll
            for (int nt = 0; nt < GC_DVS / 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int mt = warp + 4 * a;
                    if (16 * mt < dk && nt < ntiles)
                        Io<T>::store(sb, (long)(8 * nt + gc_col(e)) * dk + 16 * mt + gc_row(e),
                                     S[a][nt][e]);
                }
    }
#pragma unroll
    for (int a = 0; a < 2; a++)
#pragma unroll
        for (int nt = 0; nt < GC_DVS / 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int mt = warp + 4 * a;
                if (16 * mt < dk && nt < ntiles)
                    st[(long)(nb + 8 * nt + gc_col(e)) * dk + 16 * mt + gc_row(e)] = S[a][nt][e];
            }
}

#define GDN_CHUNK(SUF, T)                                                                             \
    extern "C" __global__ void __launch_bounds__(GC_THREADS) gdn_chunk_prep_##SUF(                    \
        const T* qkv, const T* a, const T* b, const T* a_log, const T* dt_bias, const int* seq_meta, \
        T* ws, float* ws_f, int num_key_heads, int num_value_heads, int dk, int dv, int min_len) {   \
        gdn_chunk_prep<T>(qkv, a, b, a_log, dt_bias, seq_meta, ws, ws_f, num_key_heads,             \
                          num_value_heads, dk, dv, min_len);                                         \
    }                                                                                                \
    extern "C" __global__ void __launch_bounds__(GC_THREADS) gdn_chunk_scan_##SUF(                    \
        const T* ws, const float* ws_f, float* rec_state, const int* seq_meta, T* out,               \
        int num_value_heads, int dk, int dv, int num_layers, int layer, int min_len) {               \
        gdn_chunk_scan<T>(ws, ws_f, rec_state, seq_meta, out, num_value_heads, dk, dv, num_layers,   \
                          layer, min_len);                                                           \
    }
GDN_CHUNK(f16, __half)
GDN_CHUNK(bf16, bf16_t)
