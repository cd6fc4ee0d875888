// gdn_chunk.cu: the chunked gated delta rule (the WY / UT-transform form, chunk C = 64) for the
// prefill of a Gated DeltaNet layer, continuing from each sequence's recurrent state. Math:
// shared/docs/qwen3_5.md §3.6; the oracle is gdn.cu's sequential scan (same inputs, same state
// layout), the CPU twin src/backend/cpu/gdn/delta_rule.rs (`chunked`).
//
// Per (sequence, value head h) and chunk of L <= 64 tokens (rows = positions, f32 unless said):
//   q^, k^ = l2norm rows (q scaled by dk^-1/2), beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias),
//   gc = cumsum(g) over the chunk, G[i,j] = exp(gc_i - gc_j) (j <= i)
//   A   = strictly_lower(beta_i (k^_i . k^_j) G[i,j])          Ti = (I + A)^-1 (blocked substitution)
//   U   = Ti (beta V)        W = Ti (beta K exp(gc))           P = lower_incl_diag((Q K^T) o G)
//   Qg  = Q exp(gc)          Kd = K exp(gc_{L-1} - gc)         eL = exp(gc_{L-1})
//   Vn  = U - W S            O = Qg S + P Vn                   S <- eL S + Kd^T Vn
// Every exponent is <= 0 (g <= 0), so nothing overflows.
//
// Two kernels (T = f16 | bf16, the 16-bit compute dtypes; f32 compute keeps the scan):
//   gdn_chunk_prep_{T}  grid (seqs, value heads, chunks): everything that does not depend on the
//                       state, all chunks in parallel; writes W, Qg, Kd^T, U, P (T) and eL (f32) of
//                       each (chunk, head) to the workspace, rows >= L zero.
//   gdn_chunk_scan_{T}  grid (seqs, value heads, ceil(dv / 16)): the state pass, one chunk after
//                       another; each block owns 16 value columns of S (f32 in registers as mma
//                       accumulators, a T copy in shared memory as the B operand) and writes O.
// Matrix products are 16 x 8 tiles over k (`gc_gemm_nt`, operands in T in shared memory, k
// contiguous on both sides, the result in the m16n8 accumulator layout): mma.sync.m16n8k16 with
// f32 accumulation on sm_80+; on sm_70 / sm_75 (no bf16, no cp.async, dynamic shared memory <= 96
// KB) mma.sync.m8n8k4 f16 -> f32 regrouped into that layout by shuffles (bf16 there, or with
// -DGC_FMA_TILES: the same tiles in f32 FMAs). Workspace chunk id of chunk c of sequence s: token_start / 64 + s
// + c (distinct for every (s, c); at most tokens / 64 + seqs + 1). Sequences shorter than
// `min_len`, without tokens or without a slot are left to the scan (it skips the others).
// Shapes: dk a multiple of 16, at most 128; dv a multiple of 8, at most 128 (the host checks).

#define GC_C 64
#define GC_THREADS 128
#define GC_DVS 16
#define GC_MAX_DK 128
// Shared rows of mma operands are padded by 8 elements (16 bytes): a row stride of 2 (n + 8) bytes
// puts the 8 rows a fragment load touches in distinct banks.
#define GC_PAD 8

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

__device__ __forceinline__ unsigned gc_ld32(const void* p) { return *reinterpret_cast<const unsigned*>(p); }

// c += A B^T-stored for one tile from 16-bit shared rows where k is contiguous on both sides:
// A(r, k) = a[r * lda + k] (16 x 16), B(k, n) = b[n * ldb + k] (16 x 8); lda, ldb and the base
// offsets even (fragments are read as 32-bit pairs). The warp's lanes hold c as the m16n8
// accumulator fragment: lane = 4 grp + t holds rows grp (c[0], c[1]) and grp + 8 (c[2], c[3]),
// columns 2t and 2t + 1.
template <typename T>
__device__ __forceinline__ void gc_tile_nt(float* c, const T* a, int lda, const T* b, int ldb) {
    const int lane = threadIdx.x & 31, grp = lane >> 2, t = lane & 3;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const T* a0 = a + grp * lda + 2 * t;
    const T* a1 = a0 + 8 * lda;
    unsigned ra[4];
    ra[0] = gc_ld32(a0);
    ra[1] = gc_ld32(a1);
    ra[2] = gc_ld32(a0 + 8);
    ra[3] = gc_ld32(a1 + 8);
    const T* b0 = b + grp * ldb + 2 * t;
    mma_m16n8k16<T>(c, ra, gc_ld32(b0), gc_ld32(b0 + 8));
#else
#pragma unroll 4
    for (int k = 0; k < 16; k++) {
        const float x0 = Io<T>::load(a, (long)grp * lda + k), x1 = Io<T>::load(a, (long)(grp + 8) * lda + k);
        const float y0 = Io<T>::load(b, (long)(2 * t) * ldb + k), y1 = Io<T>::load(b, (long)(2 * t + 1) * ldb + k);
        c[0] += x0 * y0;
        c[1] += x0 * y1;
        c[2] += x1 * y0;
        c[3] += x1 * y1;
    }
#endif
}

// sm_70 / sm_75 tensor cores (f16 only; there is no bf16 below sm_80): mma.sync.m8n8k4, one
// instruction = four independent 8 x 8 x 4 products, one per quad-pair (QP q = lanes 4q..4q+3 and
// 16+4q..16+4q+3). In a QP, lane l gives row (l & 3) + 4 (l >= 16) of A (4 k-contiguous halves)
// and the same column of B, and holds the 8 x 8 result as d[i] at row (l & 1) + (i & 2) + 4 (l >=
// 16), column (i & 4) + (l & 2) + (i & 1) (PTX ISA, "matrix fragments for mma.m8n8k4").
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800 && !defined(GC_FMA_TILES)
#define GC_SM70_TC 1
__device__ __forceinline__ void gc_mma884(float* d, unsigned a0, unsigned a1, unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m8n8k4.row.col.f32.f16.f16.f32 {%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%11}, {%0,%1,%2,%3,%4,%5,%6,%7};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
        : "r"(a0), "r"(a1), "r"(b0), "r"(b1));
}

// c (the m16n8 accumulator fragment of gc_tile_nt) += A B^T over k = 0..K (K a multiple of 16)
// with f16 operands laid out as for gc_tile_nt. QP q takes rows 8 (q & 1).. of the 16 and, of
// every 16 k, the slices 4 (q >> 1).. and 8 + 4 (q >> 1)..; the two k-halves are summed across
// QPs q and q ^ 2 (lane ^ 8), then each lane gathers its m16n8 elements: element e of lane L is
// d[(e & 1) + 2 kp + 4 ((L >> 1) & 1)] of lane 16 (L >> 4) + 8 kp + 4 (e >> 1) + ((L >> 2) & 1)
// + 2 (L & 1), where kp = (L >> 3) & 1 picks which of the two equal copies is read, so the
// source knows bit 1 of the index (its own kp); bit 2 depends on the reader: two shuffles.
// Every lane of the warp must call it (the shuffles are warp-wide).
__device__ __forceinline__ void gc_gemm_nt_884(float* c, const void* av, int lda, const void* bv, int ldb, int K) {
    const int lane = threadIdx.x & 31, q = (lane >> 2) & 3;
    const int r = (lane & 3) + ((lane >> 4) << 2);
    const unsigned short* ar = reinterpret_cast<const unsigned short*>(av) + (long)(8 * (q & 1) + r) * lda + 4 * (q >> 1);
    const unsigned short* br = reinterpret_cast<const unsigned short*>(bv) + (long)r * ldb + 4 * (q >> 1);
    float d[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    for (int k0 = 0; k0 < K; k0 += 16) {
        gc_mma884(d, gc_ld32(ar + k0), gc_ld32(ar + k0 + 2), gc_ld32(br + k0), gc_ld32(br + k0 + 2));
        gc_mma884(d, gc_ld32(ar + k0 + 8), gc_ld32(ar + k0 + 10), gc_ld32(br + k0 + 8),
                  gc_ld32(br + k0 + 10));
    }
#pragma unroll
    for (int i = 0; i < 8; i++) d[i] += __shfl_xor_sync(0xffffffffu, d[i], 8);
    const int own = (lane >> 3) & 1;
    const int src0 = ((lane >> 4) << 4) + (own << 3) + ((lane >> 2) & 1) + ((lane & 1) << 1);
    const bool upper = (lane >> 1) & 1;
#pragma unroll
    for (int e = 0; e < 4; e++) {
        const float lo = own ? d[2 + (e & 1)] : d[e & 1];
        const float hi = own ? d[6 + (e & 1)] : d[4 + (e & 1)];
        const int src = src0 + ((e >> 1) << 2);
        const float xl = __shfl_sync(0xffffffffu, lo, src), xh = __shfl_sync(0xffffffffu, hi, src);
        c[e] += upper ? xh : xl;
    }
}
#endif

template <typename T> struct GcTensorCores70 { static constexpr bool value = false; };
template <> struct GcTensorCores70<__half> { static constexpr bool value = true; };

// c += A B^T over k = 0..K (a multiple of 16) for one 16 x 8 tile, operands as for gc_tile_nt,
// c in its m16n8 layout: mma m16n8k16 on sm_80+, m8n8k4 for f16 on sm_70 / sm_75 (unless built
// with -DGC_FMA_TILES, `KILN_GDN_CHUNK_TILES=fma`), else f32 FMAs. Warp-wide (all lanes call it).
template <typename T>
__device__ __forceinline__ void gc_gemm_nt(float* c, const T* a, int lda, const T* b, int ldb, int K) {
#ifdef GC_SM70_TC
    if (GcTensorCores70<T>::value)
        gc_gemm_nt_884(c, a, lda, b, ldb, K);
    else
#endif
        for (int k0 = 0; k0 < K; k0 += 16) gc_tile_nt<T>(c, a + k0, lda, b + k0, ldb);
}

// Copy `rows` rows of `cols` 16-bit elements (cols a multiple of 8) from global (row stride cols)
// to shared (row stride ld), 16 bytes at a time; both 16-byte aligned. On sm_80+ the copies are
// cp.async (issued, not waited for: every 16-byte load in flight at once; `gc_copy_wait` then
// a barrier before anything reads them); elsewhere plain loads and stores.
template <typename T>
__device__ __forceinline__ void gc_copy_rows(T* dst, int ld, const T* src, int src_ld, int rows, int cols) {
    const int per = cols / 8;
    for (int e = threadIdx.x; e < rows * per; e += GC_THREADS) {
        const int r = e / per, q = e % per;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
        const unsigned d = (unsigned)__cvta_generic_to_shared(dst + (long)r * ld + 8 * q);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src + (long)r * src_ld + 8 * q));
#else
        reinterpret_cast<uint4*>(dst + (long)r * ld)[q] =
            reinterpret_cast<const uint4*>(src + (long)r * src_ld)[q];
#endif
    }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}

// Wait for this thread's gc_copy_rows (a barrier must follow before other threads read them).
__device__ __forceinline__ void gc_copy_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_all;\n" ::);
#endif
}

// Row and column (within a 16 x 8 tile) of accumulator element e (0..3) of this lane.
__device__ __forceinline__ int gc_row(int e) { return ((threadIdx.x & 31) >> 2) + (e >= 2 ? 8 : 0); }
__device__ __forceinline__ int gc_col(int e) { return 2 * (threadIdx.x & 3) + (e & 1); }

__device__ __forceinline__ float gc_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// T elements of one (chunk, head) record of the workspace: W, Qg [64][dk], Kd^T [dk][64], U [64][dv],
// P [64][64].
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

    const int ldk = dk + GC_PAD, ldc = GC_C + GC_PAD;
    T* qs = reinterpret_cast<T*>(gc_smem);  // [64][ldk] q^ (scaled), later K^T [dk][ldc]
    T* kt = qs;
    T* ks = qs + max(GC_C * ldk, dk * ldc);  // [64][ldk] k^
    T* vt = ks + GC_C * ldk;                // [dv][ldc] v^T
    float* af = reinterpret_cast<float*>(vt + dv * ldc);  // [64][64] A, later Ti diag(.) [64][ldc] in T
    T* ta = reinterpret_cast<T*>(af);
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
                    Io<T>::store(qs, (long)i * ldk + d, qv[r] * iq);
                    Io<T>::store(ks, (long)i * ldk + d, kv[r] * ik);
                }
            }
            for (int d = lane; d < dv; d += WARP_SIZE)
                vt[d * ldc + i] = qkv[row + 2 * key_dim + (long)h * dv + d];
            if (lane == 0) {
                const long tok = (long)(start + c0 + i) * num_value_heads + h;
                gcs[i] = decay_rate * gc_softplus(Io<T>::load(a_in, tok) + dtb);
                bet[i] = 1.0f / (1.0f + expf(-Io<T>::load(b_in, tok)));
            }
        } else {
            for (int d = lane; d < dk; d += WARP_SIZE) {
                Io<T>::store(qs, (long)i * ldk + d, 0.0f);
                Io<T>::store(ks, (long)i * ldk + d, 0.0f);
            }
            for (int d = lane; d < dv; d += WARP_SIZE) Io<T>::store(vt, (long)d * ldc + i, 0.0f);
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
            gc_gemm_nt<T>(ak, ks + m0 * ldk, ldk, ks + n0 * ldk, ldk, dk);
            gc_gemm_nt<T>(aq, qs + m0 * ldk, ldk, ks + n0 * ldk, ldk, dk);
        }
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int i = m0 + gc_row(e), j = n0 + gc_col(e);
            const float decay = j <= i ? expf(gcs[i] - gcs[j]) : 0.0f;
            af[i * GC_C + j] = j < i ? bet[i] * ak[e] * decay : 0.0f;
            Io<T>::store(p_out, (long)i * GC_C + j, aq[e] * decay);
        }
    }
    // Qg [64][dk] and Kd^T [dk][64] (rows >= L are zero because q^ and k^ are).
    __syncthreads();  // egc / egl visible
    for (int e = tid; e < GC_C * dk; e += GC_THREADS) {
        const int i = e / dk, d = e % dk;
        Io<T>::store(qg_out, e, Io<T>::load(qs, (long)i * ldk + d) * egc[i]);
        const int i2 = e % GC_C, d2 = e / GC_C;
        Io<T>::store(kd_out, e, Io<T>::load(ks, (long)i2 * ldk + d2) * egl[i2]);
    }
    // Ti = (I + A)^-1, unit lower triangular, in 16 x 16 blocks (8 barriers instead of one per row):
    // 1. the four diagonal blocks Ti_bb = (I + A_bb)^-1, a warp each; lane q < 16 owns column q of its
    //    block and walks its 16 rows in registers (a column of a triangular inverse depends only on
    //    itself: Ti[i][j] = -sum_{k=j}^{i-1} A[i][k] Ti[k][j]);
    // 2. block rows b = 1, 2, 3 in turn: X_bc = sum_{k=c}^{b-1} A_bk Ti_kc for every c < b, then
    //    Ti_bc = -Ti_bb X_bc. X_bc is staged in the upper block (c, b) of ti (zero in Ti, never read
    //    while staged), and the upper blocks are zeroed at the end.
    if (lane < 16) {
        const int r0 = 16 * warp, j = r0 + lane;
        float col[16];
#pragma unroll
        for (int r = 0; r < 16; r++) {
            const float* ar = af + (r0 + r) * GC_C + r0;
            // col[k] = 0 for k < lane (above the diagonal), so the sum may start at 0.
            float p0 = 0.0f, p1 = 0.0f;
#pragma unroll
            for (int k = 0; k + 1 < r; k += 2) {
                p0 += ar[k] * col[k];
                p1 += ar[k + 1] * col[k + 1];
            }
            if (r & 1) p0 += ar[r - 1] * col[r - 1];
            const float v = r == lane ? 1.0f : (r > lane ? -(p0 + p1) : 0.0f);
            col[r] = v;
            ti[(r0 + r) * (GC_C + 1) + j] = v;
        }
    }
    for (int b = 1; b < GC_C / 16; b++) {
        __syncthreads();  // block rows < b of Ti complete
        for (int e = tid; e < 256 * b; e += GC_THREADS) {
            const int c = e >> 8, r = (e >> 4) & 15, q = e & 15;
            const float* ar = af + (16 * b + r) * GC_C;
            const float* tc = ti + 16 * c + q;
            float p0 = 0.0f, p1 = 0.0f;
            for (int k = 16 * c; k < 16 * b; k += 2) {
                p0 += ar[k] * tc[k * (GC_C + 1)];
                p1 += ar[k + 1] * tc[(k + 1) * (GC_C + 1)];
            }
            ti[(16 * c + r) * (GC_C + 1) + 16 * b + q] = p0 + p1;  // X_bc (r, q) in block (c, b)
        }
        __syncthreads();  // X_b* staged
        for (int e = tid; e < 256 * b; e += GC_THREADS) {
            const int c = e >> 8, r = (e >> 4) & 15, q = e & 15;
            const float* tb = ti + (16 * b + r) * (GC_C + 1) + 16 * b;  // row r of Ti_bb
            const float* xc = ti + 16 * c * (GC_C + 1) + 16 * b + q;      // column q of X_bc
            float p = 0.0f;
            for (int m = 0; m <= r; m++) p += tb[m] * xc[m * (GC_C + 1)];
            ti[(16 * b + r) * (GC_C + 1) + 16 * c + q] = -p;
        }
    }
    __syncthreads();  // every X read
    for (int e = tid; e < GC_C * GC_C; e += GC_THREADS) {
        const int i = e / GC_C, j = e % GC_C;
        if ((j >> 4) > (i >> 4)) ti[i * (GC_C + 1) + j] = 0.0f;
    }
    __syncthreads();
    // U = (Ti diag(beta)) V and W = (Ti diag(beta exp(gc))) K: the scaled Ti in T as the A operand
    // (in A's place), V^T and K^T (in q's place) as B; warp w rows 16w..; Ti's k-tiles past the
    // diagonal block are zero.
    for (int e = tid; e < GC_C * GC_C; e += GC_THREADS) {
        const int i = e / GC_C, c = e % GC_C;
        Io<T>::store(ta, (long)i * ldc + c, ti[i * (GC_C + 1) + c] * bet[c]);
    }
    for (int e = tid; e < dk * GC_C; e += GC_THREADS) {
        const int d = e / GC_C, c = e % GC_C;
        kt[d * ldc + c] = ks[c * ldk + d];
    }
    __syncthreads();
    for (int nt = 0; nt < dv / 8; nt++) {
        const int n0 = 8 * nt;
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        gc_gemm_nt<T>(acc, ta + m0 * ldc, ldc, vt + n0 * ldc, ldc, m0 + 16);
#pragma unroll
        for (int e = 0; e < 4; e++)
            Io<T>::store(u_out, (long)(m0 + gc_row(e)) * dv + n0 + gc_col(e), acc[e]);
    }
    __syncthreads();  // every read of ta is done
    for (int e = tid; e < GC_C * GC_C; e += GC_THREADS) {
        const int i = e / GC_C, c = e % GC_C;
        Io<T>::store(ta, (long)i * ldc + c, ti[i * (GC_C + 1) + c] * bet[c] * egc[c]);
    }
    __syncthreads();
    for (int nt = 0; nt < dk / 8; nt++) {
        const int n0 = 8 * nt;
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        gc_gemm_nt<T>(acc, ta + m0 * ldc, ldc, kt + n0 * ldc, ldc, m0 + 16);
#pragma unroll
        for (int e = 0; e < 4; e++)
            Io<T>::store(w_out, (long)(m0 + gc_row(e)) * dk + n0 + gc_col(e), acc[e]);
    }
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

    // Shared (16-bit, rows padded by GC_PAD): W, Qg [64][ldk]; Kd^T [dk][ldc]; P [64][ldc];
    // this block's U columns [64][GC_DVS]; Vn^T [GC_DVS][ldc]; S^T [GC_DVS][ldk] (the B operand).
    const int ldk = dk + GC_PAD, ldc = GC_C + GC_PAD;
    T* w_s = reinterpret_cast<T*>(gc_smem);
    T* qg_s = w_s + GC_C * ldk;
    T* kd_s = qg_s + GC_C * ldk;
    T* p_s = kd_s + dk * ldc;
    T* u_s = p_s + GC_C * ldc;
    T* vn_s = u_s + GC_C * GC_DVS;
    T* sb = vn_s + GC_DVS * ldc;

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
                if (16 * mt < dk && nt < ntiles) Io<T>::store(sb, (long)j * ldk + i, v);
            }

    const long rec_len = gc_record(dk, dv);
    const long cid0 = (long)(start / GC_C) + s;
    const int nchunks = (len + GC_C - 1) / GC_C;
    // Each chunk's record is staged as soon as its buffers are dead in the chunk before: W and U
    // after Vn, Qg and P after O, Kd^T after the state update, so most of the next chunk's loads
    // are in flight while this one computes (sm_80+: cp.async; the sm_70 path loads in place).
    auto stage_wu = [&](int c) {
        const T* rec = ws + ((cid0 + c) * num_value_heads + h) * rec_len;
        gc_copy_rows(w_s, ldk, rec, dk, GC_C, dk);
        gc_copy_rows(u_s, GC_DVS, rec + 3 * GC_C * dk + nb, dv, GC_C, width);
    };
    auto stage_qp = [&](int c) {
        const T* rec = ws + ((cid0 + c) * num_value_heads + h) * rec_len;
        gc_copy_rows(qg_s, ldk, rec + GC_C * dk, dk, GC_C, dk);
        gc_copy_rows(p_s, ldc, rec + 3 * GC_C * dk + GC_C * dv, GC_C, GC_C, GC_C);
    };
    auto stage_kd = [&](int c) {
        const T* rec = ws + ((cid0 + c) * num_value_heads + h) * rec_len;
        gc_copy_rows(kd_s, ldc, rec + 2 * GC_C * dk, GC_C, dk, GC_C);
    };
    stage_wu(0);
    stage_qp(0);
    stage_kd(0);
    float el_next = ws_f[cid0 * num_value_heads + h];
    for (int c = 0; c < nchunks; c++) {
        const int L = min(GC_C, len - c * GC_C);
        const bool more = c + 1 < nchunks;
        const float el = el_next;
        if (more) el_next = ws_f[(cid0 + c + 1) * num_value_heads + h];
        gc_copy_wait();
        __syncthreads();  // this chunk's record staged and sb written (the last chunk's readers done)
        // Vn = U - W S: warp w rows 16w..; stored transposed (Vn^T [col][row]).
        for (int nt = 0; nt < ntiles; nt++) {
            const int n0 = 8 * nt;
            float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            gc_gemm_nt<T>(acc, w_s + m0 * ldk, ldk, sb + n0 * ldk, ldk, dk);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int i = m0 + gc_row(e), j = n0 + gc_col(e);
                Io<T>::store(vn_s, j * ldc + i, Io<T>::load(u_s, i * GC_DVS + j) - acc[e]);
            }
        }
        __syncthreads();  // Vn written; W and U dead
        if (more) stage_wu(c + 1);
        // O = Qg S + P Vn (P is lower triangular incl. the diagonal: k-tiles up to the row's).
        for (int nt = 0; nt < ntiles; nt++) {
            const int n0 = 8 * nt;
            float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            gc_gemm_nt<T>(acc, qg_s + m0 * ldk, ldk, sb + n0 * ldk, ldk, dk);
            gc_gemm_nt<T>(acc, p_s + m0 * ldc, ldc, vn_s + n0 * ldc, ldc, m0 + 16);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int i = m0 + gc_row(e), j = n0 + gc_col(e);
                if (i < L)
                    Io<T>::store(out, ((long)(start + c * GC_C + i) * num_value_heads + h) * dv + nb + j,
                                 acc[e]);
            }
        }
        __syncthreads();  // Qg and P dead
        if (more) stage_qp(c + 1);
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
                gc_gemm_nt<T>(S[a][nt], kd_s + 16 * mt * ldc, ldc, vn_s + n0 * ldc, ldc, GC_C);
            }
        }
        __syncthreads();  // every read of sb, vn_s and kd_s is done
        if (more) stage_kd(c + 1);
#pragma unroll
        for (int a = 0; a < 2; a++)
#pragma unroll
            for (int nt = 0; nt < GC_DVS / 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int mt = warp + 4 * a;
                    if (16 * mt < dk && nt < ntiles)
                        Io<T>::store(sb, (long)(8 * nt + gc_col(e)) * ldk + 16 * mt + gc_row(e),
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
