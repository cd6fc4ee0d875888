// gdn.cu: Gated DeltaNet (Qwen3.5 linear attention) and the small ops of its gated attention.
// Math: shared/docs/qwen3_5.md §3.2-§3.7; the CPU twin is src/backend/cpu/gdn/.
// Entry points (T = f32 | f16 | bf16, the compute dtype):
//   gdn_conv1d_{T}       causal depthwise conv + SiLU over the step's tokens, reading the conv state
//                        (and, for sequences with one new token, updating it)
//   gdn_conv1d_vec_{T}   the same for conv_dim a multiple of 8 and kernel 4: 8 channels and a run
//                        of tokens per thread, 128-bit accesses, the window in registers
//   gdn_conv_state_{T}   the conv state after the step of the other sequences (after gdn_conv1d)
//   gdn_scan_{T}         the gated delta rule (l2norm, g, beta, state update, output), fused, as
//                        a sequential scan with the state on chip: decode tokens, short prefills,
//                        and every prefill of the f32 compute dtype; 8 lanes per value column (key
//                        head dims that are multiples of 8). Sequences of at least `chunk_min` new
//                        tokens are skipped: gdn_chunk.cu's chunked form runs them.
//   gdn_scan_v4_{T}      the same for dk a multiple of 32: state, q^ and k^ through 128-bit accesses
//   gated_rms_norm_{T}   out = x / rms(x) * w * silu(z) per row
//   gated_rms_norm_vec_{T} the same for dim a multiple of 8: a few lanes per row, 128-bit accesses
//   split_query_gate_{T} [q | gate] per head -> q, gate
//   sigmoid_mul_{T}      x *= sigmoid(gate)
//   rms_norm_1p_{T}[_rf32|_xf32]  the (1 + w) RMSNorm with w as stored (f32 residual variants)
//
// Step metadata (from CudaStep): token_seq [T] (the sequence of each token) and seq_meta [S, 4]
// (token_start, len, cached_len, state slot). A sequence with cached_len == 0 starts from a zero
// state whatever its slot holds. States are f32: conv [slots, layers, K-1, conv_dim] (oldest row
// first, as the CPU), recurrent [slots, layers, Hv, dv, dk] (transposed against the CPU's
// [Hv, dk, dv]: a value column's dk entries are contiguous, so a warp's loads coalesce).
// Nothing here allocates, syncs with the host, or reads a host value that changes per step other
// than the grid size and the scalar arguments, so the launches can be captured in a CUDA graph.
// sm_70-safe: f32 math only, bf16 through common.cuh's integer conversions, no cp.async; the
// 128-bit accesses are plain uint4 / float4 loads and stores (every arch).

#define GDN_MAX_KERNEL 8

__device__ __forceinline__ float gdn_silu(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float gdn_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
// torch softplus (beta 1, threshold 20).
__device__ __forceinline__ float gdn_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// PROGRAMMATIC DEPENDENT LAUNCH (sm_90+; no-ops below, and no-ops when the host launches without
// the attribute: launch.rs, `CudaBackend::pdl`). Every kernel of this file begins with
// gdn_pdl_enter(): griddepcontrol.wait (returns once the stream's previous grid has completed and
// its memory is visible) before it touches any memory, then griddepcontrol.launch_dependents (the
// next kernel may start its blocks now; it in turn waits for this grid before touching what this
// grid writes). So any of them may be launched with the attribute; what overlaps is the launch
// and the ramp of the next grid with this grid's tail.
__device__ __forceinline__ void gdn_pdl_enter() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// grid (ceil(conv_dim / blockDim.x), num_tokens). out[t, c] = silu(sum_j w[c, j] x[t - (K-1) + j, c]),
// rows before the sequence's first new token from its conv state (zeros when cached_len == 0).
// A sequence with one new token (decode) has one thread per channel here, which also shifts its
// conv state in place (it read every old row first); gdn_conv_state skips those sequences.
template <typename T>
__device__ void gdn_conv1d(const T* mixed, const T* weight, float* conv_state,
                           const int* token_seq, const int* seq_meta, T* out, int conv_dim, int kern,
                           int num_layers, int layer) {
    gdn_pdl_enter();
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    long t = blockIdx.y;
    if (c >= conv_dim) return;
    int s = token_seq[t];
    int start = seq_meta[4 * s], len = seq_meta[4 * s + 1], cached = seq_meta[4 * s + 2],
        slot = seq_meta[4 * s + 3];
    int off = (int)t - start;
    int hist = kern - 1;
    float* st = conv_state + ((long)slot * num_layers + layer) * hist * conv_dim;
    float old[GDN_MAX_KERNEL];
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < GDN_MAX_KERNEL; j++) {
        if (j >= kern) break;
        int r = off - hist + j;  // row relative to the sequence's first new token
        float x;
        if (r >= 0) x = Io<T>::load(mixed, (long)(start + r) * conv_dim + c);
        else if (cached == 0) x = 0.0f;
        else x = st[(long)(hist + r) * conv_dim + c];
        old[j] = x;
        acc += Io<T>::load(weight, (long)c * kern + j) * x;
    }
    Io<T>::store(out, t * conv_dim + c, gdn_silu(acc));
    if (len == 1 && slot >= 0) {
        // The window was [old rows (hist); the new row]: the new state is its last hist rows.
#pragma unroll
        for (int r = 0; r < GDN_MAX_KERNEL - 1; r++) {
            if (r >= hist) break;
            st[(long)r * conv_dim + c] = old[r + 1];
        }
    }
}

// Eight consecutive elements of T at p + i (i a multiple of 8, p 16-byte aligned for 16-bit T,
// 32-byte for f32) as f32, and back: one or two 128-bit accesses.
template <typename T>
struct Vec8 {  // 16-bit storage types: one uint4
    static __device__ __forceinline__ void load(const T* p, long i, float* v) {
        uint4 u = *reinterpret_cast<const uint4*>(p + i);
        const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
        for (int k = 0; k < 8; k++) v[k] = Io<T>::load(e, k);
    }
    static __device__ __forceinline__ void store(T* p, long i, const float* v) {
        uint4 u;
        T* e = reinterpret_cast<T*>(&u);
#pragma unroll
        for (int k = 0; k < 8; k++) Io<T>::store(e, k, v[k]);
        *reinterpret_cast<uint4*>(p + i) = u;
    }
};
template <>
struct Vec8<float> {
    static __device__ __forceinline__ void load(const float* p, long i, float* v) {
        float4 a = *reinterpret_cast<const float4*>(p + i);
        float4 b = *reinterpret_cast<const float4*>(p + i + 4);
        v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
        v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
    }
    static __device__ __forceinline__ void store(float* p, long i, const float* v) {
        *reinterpret_cast<float4*>(p + i) = make_float4(v[0], v[1], v[2], v[3]);
        *reinterpret_cast<float4*>(p + i + 4) = make_float4(v[4], v[5], v[6], v[7]);
    }
};

// Eight consecutive elements of T as stored (one uint4 for 16-bit T, two for f32): rows kept in
// registers at half the cost of f32 values, converted where used.
template <typename T>
struct Raw8 {
    uint4 u[sizeof(T) / 2];
};
template <typename T>
__device__ __forceinline__ Raw8<T> raw8_load(const T* p, long i) {
    Raw8<T> r;
#pragma unroll
    for (int k = 0; k < (int)(sizeof(T) / 2); k++) r.u[k] = reinterpret_cast<const uint4*>(p + i)[k];
    return r;
}
template <typename T>
__device__ __forceinline__ Raw8<T> raw8_zero() {
    Raw8<T> r;
#pragma unroll
    for (int k = 0; k < (int)(sizeof(T) / 2); k++) r.u[k] = make_uint4(0u, 0u, 0u, 0u);
    return r;
}
template <typename T>
__device__ __forceinline__ float raw8_get(const Raw8<T>& r, int e) {
    return Io<T>::load(reinterpret_cast<const T*>(r.u), e);
}

// gdn_conv1d for kernel GDN_VEC_KERNEL (4, Qwen3.5's) and conv_dim a multiple of 8, with 128-bit
// accesses. grid (ceil(conv_dim / 8 / blockDim.x), ceil(num_tokens / tpt)); each thread owns 8
// consecutive channels of a run of tpt consecutive tokens: its 8 channels' weights and the last
// 4 input rows stay in registers (raw), the next GDN_VEC_PREFETCH rows are loaded ahead, so each
// input row of the run is read once (plus the 3 before it) with several loads in flight; the
// sequence of a token is looked up once per sequence, not per token. Same sums in the same order
// as gdn_conv1d (oldest row first, zero rows added as w * 0), so the same results: a token whose
// window reaches before its sequence's first new token reads the conv state (zeros when fresh),
// and a one-token sequence shifts its state in place, reading each row before writing it.
#define GDN_VEC_KERNEL 4
#define GDN_VEC_PREFETCH 4
template <typename T>
__device__ void gdn_conv1d_vec(const T* mixed, const T* weight, float* conv_state,
                               const int* token_seq, const int* seq_meta, T* out, int conv_dim,
                               int num_layers, int layer, int num_tokens, int tpt) {
    gdn_pdl_enter();
    constexpr int K = GDN_VEC_KERNEL, H = K - 1, P = GDN_VEC_PREFETCH;
    long c = ((long)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (c >= conv_dim) return;
    int t0 = blockIdx.y * tpt, t1 = min(num_tokens, t0 + tpt);
    // The weights [channel][tap] of channels c .. c + 7: 8 K contiguous elements.
    Raw8<T> wr[K];
#pragma unroll
    for (int k = 0; k < K; k++) wr[k] = raw8_load(weight, c * K + 8 * k);
#define GDN_W(e, j) raw8_get(wr[((e) * K + (j)) / 8], ((e) * K + (j)) % 8)
    // x[d]: row t - d (raw, whatever sequence it belongs to); q[i]: rows t + i, loaded ahead.
    Raw8<T> x[K], q[P];
    x[0] = raw8_zero<T>();
#pragma unroll
    for (int d = 1; d < K; d++)
        x[d] = t0 - d >= 0 ? raw8_load(mixed, (long)(t0 - d) * conv_dim + c) : raw8_zero<T>();
#pragma unroll
    for (int i = 0; i < P; i++)
        q[i] = t0 + i < t1 ? raw8_load(mixed, (long)(t0 + i) * conv_dim + c) : raw8_zero<T>();
    int seq_end = -1, start = 0, len = 0, cached = 0, slot = -1;
    float* st = conv_state;
    for (int t = t0; t < t1; t++) {
        x[0] = q[0];
#pragma unroll
        for (int i = 0; i < P - 1; i++) q[i] = q[i + 1];
        q[P - 1] = t + P < t1 ? raw8_load(mixed, (long)(t + P) * conv_dim + c) : raw8_zero<T>();
        if (t >= seq_end) {  // a sequence's tokens are contiguous: look it up once
            int s = token_seq[t];
            start = seq_meta[4 * s];
            len = seq_meta[4 * s + 1];
            cached = seq_meta[4 * s + 2];
            slot = seq_meta[4 * s + 3];
            seq_end = start + len;
            st = conv_state + ((long)slot * num_layers + layer) * H * conv_dim;
        }
        int off = t - start;
        float acc[8];
#pragma unroll
        for (int e = 0; e < 8; e++) acc[e] = 0.0f;
#pragma unroll
        for (int d = H; d >= 0; d--) {
            int r = off - d;  // row relative to the sequence's first new token
            if (r >= 0) {
#pragma unroll
                for (int e = 0; e < 8; e++) acc[e] += GDN_W(e, H - d) * raw8_get(x[d], e);
            } else if (cached != 0) {
                float v[8];
                Vec8<float>::load(st, (long)(H + r) * conv_dim + c, v);
#pragma unroll
                for (int e = 0; e < 8; e++) acc[e] += GDN_W(e, H - d) * v[e];
            } else {
#pragma unroll
                for (int e = 0; e < 8; e++) acc[e] += GDN_W(e, H - d) * 0.0f;
            }
        }
#pragma unroll
        for (int e = 0; e < 8; e++) acc[e] = gdn_silu(acc[e]);
        Vec8<T>::store(out, (long)t * conv_dim + c, acc);
        if (len == 1 && slot >= 0) {
            // The window was [old rows (H); the new row]: state row r <- window row r + 1 (old
            // state row r + 1, read before it is written; the new row last).
#pragma unroll
            for (int r = 0; r < H; r++) {
                float v[8];
                if (r == H - 1) {
#pragma unroll
                    for (int e = 0; e < 8; e++) v[e] = raw8_get(x[0], e);
                } else if (cached != 0) {
                    Vec8<float>::load(st, (long)(r + 1) * conv_dim + c, v);
                } else {
#pragma unroll
                    for (int e = 0; e < 8; e++) v[e] = 0.0f;
                }
                Vec8<float>::store(st, (long)r * conv_dim + c, v);
            }
        }
#pragma unroll
        for (int d = K - 1; d > 0; d--) x[d] = x[d - 1];
    }
#undef GDN_W
}

// grid (ceil(conv_dim / blockDim.x), num_seqs). The new conv state: the last K-1 rows of
// [old state (zeros when fresh); the sequence's new rows]. Each thread owns one channel of one
// slot, reads every old row before writing, so it may run in place.
template <typename T>
__device__ void gdn_conv_state(const T* mixed, float* conv_state, const int* seq_meta,
                               int conv_dim, int kern, int num_layers, int layer) {
    gdn_pdl_enter();
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    int s = blockIdx.y;
    if (c >= conv_dim) return;
    int start = seq_meta[4 * s], len = seq_meta[4 * s + 1], cached = seq_meta[4 * s + 2],
        slot = seq_meta[4 * s + 3];
    if (len <= 1 || slot < 0) return;  // one new token: gdn_conv1d updated it
    int hist = kern - 1;
    float* st = conv_state + ((long)slot * num_layers + layer) * hist * conv_dim;
    float old[GDN_MAX_KERNEL];
#pragma unroll
    for (int r = 0; r < GDN_MAX_KERNEL - 1; r++)
        old[r] = (r < hist && cached != 0) ? st[(long)r * conv_dim + c] : 0.0f;
#pragma unroll
    for (int r = 0; r < GDN_MAX_KERNEL - 1; r++) {
        if (r >= hist) break;
        int src = len + r;  // index in the window [old rows (hist); new rows (len)]
        float v;
        if (src < hist) {
            v = 0.0f;
#pragma unroll
            for (int q = 0; q < GDN_MAX_KERNEL - 1; q++)
                if (q == src) v = old[q];
        } else {
            v = Io<T>::load(mixed, (long)(start + src - hist) * conv_dim + c);
        }
        st[(long)r * conv_dim + c] = v;
    }
}

// The gated delta rule, one block of GDN_THREADS threads per (sequence, value head, slice of
// GDN_THREADS / R value columns). Lanes: R consecutive threads share a value column j, each holding
// dk / R rows of the state column S[:, j] in registers (rows s, s + R, s + 2R, ...); R = 8 (dk a
// multiple of 8; a warp per column measured slower at decode batch 1 and 64). Per token (all f32):
//   q^ = l2norm(q) dk^-1/2, k^ = l2norm(k), beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias)
//   kv = e^g S^T k^;  sq = e^g S^T q^ (both of the old S, reduced over the R lanes)
//   delta = beta (v - kv);  S <- e^g S + k^ delta^T;  o = S^T q^ = sq + delta (k^ . q^)
// Tokens are staged GDN_TILE at a time in shared memory: every thread first issues independent
// loads of the tile's raw q, k, v slice, a, b; then a warp per token normalises q and k there and
// computes e^g, beta and k^ . q^; the scan itself runs with no barrier and no global load.
// GDN_TILE is 8 (9 KB of shared memory per block at dk = 128, so 16 blocks fit an SM): the scan
// now mostly sees decode tokens and short prefills (longer 16-bit prefills take gdn_chunk.cu),
// and a 32-token tile (33 KB) capped decode at 7 blocks per SM.
#define GDN_THREADS 128
#define GDN_TILE 8
#define GDN_MAX_DK 128

template <typename T, int R, int V>
__device__ void gdn_scan(const T* qkv, const T* a_in, const T* b_in, const T* a_log, const T* dt_bias,
                         float* rec_state, const int* seq_meta, T* out, int num_key_heads,
                         int num_value_heads, int dk, int dv, int num_layers, int layer,
                         int chunk_min) {
    gdn_pdl_enter();
    constexpr int COLS = GDN_THREADS / R;
    constexpr int MAX_ROWS = GDN_MAX_DK / R;
    __shared__ __align__(16) float qs[GDN_TILE][GDN_MAX_DK];
    __shared__ __align__(16) float ks[GDN_TILE][GDN_MAX_DK];
    __shared__ float vs[GDN_TILE][COLS];
    __shared__ float as[GDN_TILE], bs[GDN_TILE], kqs[GDN_TILE];

    int seq = blockIdx.x, h = blockIdx.y;
    int start = seq_meta[4 * seq], len = seq_meta[4 * seq + 1], cached = seq_meta[4 * seq + 2],
        slot = seq_meta[4 * seq + 3];
    if (len == 0 || slot < 0 || len >= chunk_min) return;
    int tid = threadIdx.x, s = tid % R, jj = tid / R;
    int col = blockIdx.z * COLS + jj;
    bool active = col < dv;
    int rows = dk / R;
    int kh = h / (num_value_heads / num_key_heads);
    long key_dim = (long)num_key_heads * dk;
    long conv_dim = 2 * key_dim + (long)num_value_heads * dv;
    float q_scale = rsqrtf((float)dk);
    float decay_rate = -expf(Io<T>::load(a_log, h));
    float dtb = Io<T>::load(dt_bias, h);

    float* st = rec_state + (((long)slot * num_layers + layer) * num_value_heads + h) * (long)dv * dk;
    // Row of the column held in S[r]: s + R r (V = 1), or with V = 4 (dk a multiple of 4 R) runs
    // of 4: 4 R (r / 4) + 4 s + r % 4, so each lane's state loads / stores and shared reads of q^, k^
    // are 128-bit (a column's R lanes cover 4 R contiguous floats per access).
#define GDN_ROW(r) (V == 1 ? s + R * (r) : ((r) / V) * (V * R) + V * s + (r) % V)
    float S[MAX_ROWS];
    if (V == 4) {
#pragma unroll
        for (int r = 0; r < MAX_ROWS; r += 4) {
            float4 v4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (r < rows && active && cached != 0)
                v4 = *reinterpret_cast<const float4*>(st + (long)col * dk + GDN_ROW(r));
            S[r] = v4.x; S[r + 1] = v4.y; S[r + 2] = v4.z; S[r + 3] = v4.w;
        }
    } else {
#pragma unroll
        for (int r = 0; r < MAX_ROWS; r++)
            S[r] = (r < rows && active && cached != 0) ? st[(long)col * dk + GDN_ROW(r)] : 0.0f;
    }

    int lane = tid % WARP_SIZE, warp = tid / WARP_SIZE, nwarps = GDN_THREADS / WARP_SIZE;
    for (int t0 = 0; t0 < len; t0 += GDN_TILE) {
        int n = min(GDN_TILE, len - t0);
        __syncthreads();  // the previous tile's readers are done
        const long row0 = (long)(start + t0) * conv_dim;
        for (int e = tid; e < n * dk; e += GDN_THREADS) {
            int i = e / dk, d = e % dk;
            long row = row0 + (long)i * conv_dim;
            qs[i][d] = Io<T>::load(qkv, row + (long)kh * dk + d);
            ks[i][d] = Io<T>::load(qkv, row + key_dim + (long)kh * dk + d);
        }
        for (int e = tid; e < n * COLS; e += GDN_THREADS) {
            int i = e / COLS, c = blockIdx.z * COLS + e % COLS;
            vs[i][e % COLS] =
                c < dv ? Io<T>::load(qkv, row0 + (long)i * conv_dim + 2 * key_dim + (long)h * dv + c)
                       : 0.0f;
        }
        if (tid < n) {
            long tok = (long)(start + t0 + tid) * num_value_heads + h;
            as[tid] = Io<T>::load(a_in, tok);
            bs[tid] = Io<T>::load(b_in, tok);
        }
        __syncthreads();
        for (int i = warp; i < n; i += nwarps) {
            float ssq = 0.0f, ssk = 0.0f;
            for (int d = lane; d < dk; d += WARP_SIZE) {
                ssq += qs[i][d] * qs[i][d];
                ssk += ks[i][d] * ks[i][d];
            }
            ssq = warp_sum(ssq);
            ssk = warp_sum(ssk);
            float iq = rsqrtf(ssq + 1e-6f) * q_scale, ik = rsqrtf(ssk + 1e-6f);
            float kq = 0.0f;
            for (int d = lane; d < dk; d += WARP_SIZE) {
                float q = qs[i][d] * iq, k = ks[i][d] * ik;
                qs[i][d] = q;
                ks[i][d] = k;
                kq += q * k;
            }
            kq = warp_sum(kq);
            if (lane == 0) {
                float g = decay_rate * gdn_softplus(as[i] + dtb);
                as[i] = expf(g);  // now e^g
                bs[i] = gdn_sigmoid(bs[i]);
                kqs[i] = kq;
            }
        }
        __syncthreads();
        for (int i = 0; i < n; i++) {
            float kv0 = 0.0f, kv1 = 0.0f, sq0 = 0.0f, sq1 = 0.0f;
            if (V == 4) {
#pragma unroll
                for (int r = 0; r < MAX_ROWS; r += 4) {
                    if (r < rows) {
                        float4 k4 = *reinterpret_cast<const float4*>(&ks[i][GDN_ROW(r)]);
                        float4 q4 = *reinterpret_cast<const float4*>(&qs[i][GDN_ROW(r)]);
                        kv0 += S[r] * k4.x;
                        sq0 += S[r] * q4.x;
                        kv1 += S[r + 1] * k4.y;
                        sq1 += S[r + 1] * q4.y;
                        kv0 += S[r + 2] * k4.z;
                        sq0 += S[r + 2] * q4.z;
                        kv1 += S[r + 3] * k4.w;
                        sq1 += S[r + 3] * q4.w;
                    }
                }
            } else {
#pragma unroll
                for (int r = 0; r < MAX_ROWS; r += 2) {
                    if (r < rows) {
                        kv0 += S[r] * ks[i][GDN_ROW(r)];
                        sq0 += S[r] * qs[i][GDN_ROW(r)];
                    }
                    if (r + 1 < rows) {
                        kv1 += S[r + 1] * ks[i][GDN_ROW(r + 1)];
                        sq1 += S[r + 1] * qs[i][GDN_ROW(r + 1)];
                    }
                }
            }
            float kv = kv0 + kv1, sq = sq0 + sq1;
#pragma unroll
            for (int o = 1; o < R; o <<= 1) {
                kv += __shfl_xor_sync(0xffffffffu, kv, o);
                sq += __shfl_xor_sync(0xffffffffu, sq, o);
            }
            float eg = as[i];
            float delta = bs[i] * (vs[i][jj] - eg * kv);
            if (V == 4) {
#pragma unroll
                for (int r = 0; r < MAX_ROWS; r += 4) {
                    if (r < rows) {
                        float4 k4 = *reinterpret_cast<const float4*>(&ks[i][GDN_ROW(r)]);
                        S[r] = S[r] * eg + k4.x * delta;
                        S[r + 1] = S[r + 1] * eg + k4.y * delta;
                        S[r + 2] = S[r + 2] * eg + k4.z * delta;
                        S[r + 3] = S[r + 3] * eg + k4.w * delta;
                    }
                }
            } else {
#pragma unroll
                for (int r = 0; r < MAX_ROWS; r++)
                    if (r < rows) S[r] = S[r] * eg + ks[i][GDN_ROW(r)] * delta;
            }
            if (active && s == 0) {
                float o = eg * sq + delta * kqs[i];
                Io<T>::store(out, ((long)(start + t0 + i) * num_value_heads + h) * dv + col, o);
            }
        }
    }
    if (active) {
        if (V == 4) {
#pragma unroll
            for (int r = 0; r < MAX_ROWS; r += 4)
                if (r < rows)
                    *reinterpret_cast<float4*>(st + (long)col * dk + GDN_ROW(r)) =
                        make_float4(S[r], S[r + 1], S[r + 2], S[r + 3]);
        } else {
#pragma unroll
            for (int r = 0; r < MAX_ROWS; r++)
                if (r < rows) st[(long)col * dk + GDN_ROW(r)] = S[r];
        }
    }
#undef GDN_ROW
}

// One block per row of `dim`: out = x / sqrt(mean(x^2) + eps) * w * silu(z) (norm before the gate,
// a plain weight), f32 math.
template <typename T>
__device__ void gated_rms_norm(const T* x, const T* z, const T* w, T* out, int dim, float eps) {
    gdn_pdl_enter();
    long row = blockIdx.x;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float v = Io<T>::load(x, row * dim + i);
        ss += v * v;
    }
    ss = block_sum(ss);
    float inv = rsqrtf(ss / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float v = Io<T>::load(x, row * dim + i) * inv;
        Io<T>::store(out, row * dim + i,
                     Io<T>::load(w, i) * v * gdn_silu(Io<T>::load(z, row * dim + i)));
    }
}

// gated_rms_norm with 128-bit accesses: dim a multiple of 8. lpr lanes per row (a power of two
// <= 32, host: about dim / 8), blockDim.x / lpr rows per block, grid ceil(rows / rows_per_block);
// each lane holds chunks of 8 elements, the row's sum of squares is reduced over its lpr lanes
// by shuffles (every lane of the warp takes part; rows past the end load nothing). Same math as
// gated_rms_norm (only the order of the sum of squares differs).
template <typename T>
__device__ void gated_rms_norm_vec(const T* x, const T* z, const T* w, T* out, long rows, int dim,
                                   float eps, int lpr) {
    gdn_pdl_enter();
    int rpb = blockDim.x / lpr;
    long row = (long)blockIdx.x * rpb + threadIdx.x / lpr;
    int li = threadIdx.x % lpr;
    bool valid = row < rows;
    int chunks = dim / 8;
    // The lane's first chunk of x, z and w is loaded at once and kept (at dim = 8 lpr, the
    // usual case, the only one); further chunks are read again after the reduction.
    bool first = valid && li < chunks;
    float x0[8], z0[8], w0[8];
    if (first) {
        Vec8<T>::load(x, row * dim + li * 8, x0);
        Vec8<T>::load(z, row * dim + li * 8, z0);
        Vec8<T>::load(w, li * 8, w0);
    }
    float ss = 0.0f;
    if (first) {
#pragma unroll
        for (int e = 0; e < 8; e++) ss += x0[e] * x0[e];
    }
    if (valid)
        for (int ch = li + lpr; ch < chunks; ch += lpr) {
            float v[8];
            Vec8<T>::load(x, row * dim + ch * 8, v);
#pragma unroll
            for (int e = 0; e < 8; e++) ss += v[e] * v[e];
        }
    for (int o = lpr / 2; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (!first) return;
    float inv = rsqrtf(ss / (float)dim + eps);
#pragma unroll
    for (int e = 0; e < 8; e++) x0[e] = w0[e] * (x0[e] * inv) * gdn_silu(z0[e]);
    Vec8<T>::store(out, row * dim + li * 8, x0);
    for (int ch = li + lpr; ch < chunks; ch += lpr) {
        float v[8], zv[8], wv[8];
        Vec8<T>::load(x, row * dim + ch * 8, v);
        Vec8<T>::load(z, row * dim + ch * 8, zv);
        Vec8<T>::load(w, ch * 8, wv);
#pragma unroll
        for (int e = 0; e < 8; e++) v[e] = wv[e] * (v[e] * inv) * gdn_silu(zv[e]);
        Vec8<T>::store(out, row * dim + ch * 8, v);
    }
}

// Zero-centred RMSNorm (Qwen3.5's (1 + w) norms), one block per row of `dim`, as rms_norm.cu's
// rms_norm (same residual handling) but with the weight w stored as is and 1 + w formed in f32:
// stored as 1 + w in bf16 the factor is rounded to 2^-8 relative, a perturbation of every norm.
//   h = x + residual (when residual != nullptr; written back);  out = (1 + w) * (h / rms(h))
template <typename T, typename X, typename R>
__device__ void rms_norm_1p(const X* x, R* residual, const T* weight, T* out, int dim, float eps) {
    gdn_pdl_enter();
    long row = blockIdx.x;
    const X* xr = x + row * dim;
    R* rr = residual ? residual + row * dim : nullptr;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float h = Io<X>::load(xr, i);
        if (rr) {
            h += Io<R>::load(rr, i);
            Io<R>::store(rr, i, h);
        }
        ss += h * h;
    }
    ss = block_sum(ss);
    float inv = rsqrtf(ss / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float h = rr ? Io<R>::load(rr, i) : Io<X>::load(xr, i);
        Io<T>::store(out + row * dim, i, (1.0f + Io<T>::load(weight, i)) * (h * inv));
    }
}

// qg [n / hd, 2 hd] (per head [query | gate]) -> q [n], gate [n]; one thread per element of q.
template <typename T>
__device__ void split_query_gate(const T* qg, T* q, T* gate, long n, int hd) {
    gdn_pdl_enter();
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    long head = i / hd, d = i % hd;
    q[i] = qg[head * 2 * hd + d];
    gate[i] = qg[head * 2 * hd + hd + d];
}

template <typename T>
__device__ void sigmoid_mul(T* x, const T* gate, long n) {
    gdn_pdl_enter();
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    Io<T>::store(x, i, Io<T>::load(x, i) * gdn_sigmoid(Io<T>::load(gate, i)));
}

#define GDN(SUF, T)                                                                                  \
    extern "C" __global__ void gdn_conv1d_##SUF(const T* mixed, const T* weight,                      \
                                                float* conv_state, const int* token_seq,              \
                                                const int* seq_meta, T* out, int conv_dim, int kern,  \
                                                int num_layers, int layer) {                          \
        gdn_conv1d<T>(mixed, weight, conv_state, token_seq, seq_meta, out, conv_dim, kern,            \
                      num_layers, layer);                                                             \
    }                                                                                                \
    extern "C" __global__ void gdn_conv_state_##SUF(const T* mixed, float* conv_state,                \
                                                    const int* seq_meta, int conv_dim, int kern,      \
                                                    int num_layers, int layer) {                      \
        gdn_conv_state<T>(mixed, conv_state, seq_meta, conv_dim, kern, num_layers, layer);            \
    }                                                                                                \
    extern "C" __global__ void __launch_bounds__(GDN_THREADS) gdn_scan_##SUF(                         \
        const T* qkv, const T* a, const T* b, const T* a_log, const T* dt_bias, float* rec_state,    \
        const int* seq_meta, T* out, int num_key_heads, int num_value_heads, int dk, int dv,         \
        int num_layers, int layer, int chunk_min) {                                                  \
        gdn_scan<T, 8, 1>(qkv, a, b, a_log, dt_bias, rec_state, seq_meta, out, num_key_heads,        \
                          num_value_heads, dk, dv, num_layers, layer, chunk_min);                    \
    }                                                                                                \
    extern "C" __global__ void __launch_bounds__(GDN_THREADS) gdn_scan_v4_##SUF(                      \
        const T* qkv, const T* a, const T* b, const T* a_log, const T* dt_bias, float* rec_state,    \
        const int* seq_meta, T* out, int num_key_heads, int num_value_heads, int dk, int dv,         \
        int num_layers, int layer, int chunk_min) {                                                  \
        gdn_scan<T, 8, 4>(qkv, a, b, a_log, dt_bias, rec_state, seq_meta, out, num_key_heads,        \
                          num_value_heads, dk, dv, num_layers, layer, chunk_min);                    \
    }                                                                                                \
    extern "C" __global__ void gdn_conv1d_vec_##SUF(                                                 \
        const T* mixed, const T* weight, float* conv_state, const int* token_seq,                    \
        const int* seq_meta, T* out, int conv_dim, int num_layers, int layer, int num_tokens,        \
        int tpt) {                                                                                   \
        gdn_conv1d_vec<T>(mixed, weight, conv_state, token_seq, seq_meta, out, conv_dim, num_layers, \
                          layer, num_tokens, tpt);                                                   \
    }                                                                                                \
    extern "C" __global__ void gated_rms_norm_vec_##SUF(const T* x, const T* z, const T* w, T* out,  \
                                                        long rows, int dim, float eps, int lpr) {    \
        gated_rms_norm_vec<T>(x, z, w, out, rows, dim, eps, lpr);                                    \
    }                                                                                                \
    extern "C" __global__ void gated_rms_norm_##SUF(const T* x, const T* z, const T* w, T* out,      \
                                                    int dim, float eps) {                             \
        gated_rms_norm<T>(x, z, w, out, dim, eps);                                                    \
    }                                                                                                \
    extern "C" __global__ void split_query_gate_##SUF(const T* qg, T* q, T* gate, long n, int hd) {  \
        split_query_gate<T>(qg, q, gate, n, hd);                                                      \
    }                                                                                                \
    extern "C" __global__ void sigmoid_mul_##SUF(T* x, const T* gate, long n) {                      \
        sigmoid_mul<T>(x, gate, n);                                                                   \
    }                                                                                                \
    extern "C" __global__ void rms_norm_1p_##SUF(const T* x, T* residual, const T* weight, T* out,  \
                                                 int dim, float eps) {                                \
        rms_norm_1p<T, T, T>(x, residual, weight, out, dim, eps);                                     \
    }
KILN_FOR_FLOAT_TYPES(GDN)

// The f32 residual stream variants (16-bit compute): _rf32 residual in f32 (x is the delta),
// _xf32 x in f32 without a residual.
#define GDN_NORM_F32_STREAM(SUF, T)                                                                  \
    extern "C" __global__ void rms_norm_1p_##SUF##_rf32(const T* x, float* residual,                 \
                                                        const T* weight, T* out, int dim, float eps) {\
        rms_norm_1p<T, T, float>(x, residual, weight, out, dim, eps);                                 \
    }                                                                                                \
    extern "C" __global__ void rms_norm_1p_##SUF##_xf32(const float* x, float* residual,             \
                                                        const T* weight, T* out, int dim, float eps) {\
        rms_norm_1p<T, float, float>(x, residual, weight, out, dim, eps);                             \
    }
GDN_NORM_F32_STREAM(f16, __half)
GDN_NORM_F32_STREAM(bf16, bf16_t)
