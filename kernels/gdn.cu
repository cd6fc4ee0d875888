// gdn.cu: Gated DeltaNet (Qwen3.5 linear attention) and the small ops of its gated attention.
// Math: shared/docs/qwen3_5.md §3.2-§3.7; the CPU twin is src/backend/cpu/gdn/.
// Entry points (T = f32 | f16 | bf16, the compute dtype):
//   gdn_conv1d_{T}       causal depthwise conv + SiLU over the step's tokens, reading the conv state
//                        (and, for sequences with one new token, updating it)
//   gdn_conv_state_{T}   the conv state after the step of the other sequences (after gdn_conv1d)
//   gdn_scan_{T}         the gated delta rule (l2norm, g, beta, state update, output), fused, as
//                        a sequential scan with the state on chip: decode tokens, short prefills,
//                        and every prefill of the f32 compute dtype; 8 lanes per value column (key
//                        head dims that are multiples of 8). Sequences of at least `chunk_min` new
//                        tokens are skipped: gdn_chunk.cu's chunked form runs them.
//   gated_rms_norm_{T}   out = x / rms(x) * w * silu(z) per row
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
// sm_70-safe: f32 math only, bf16 through common.cuh's integer conversions, no cp.async.

#define GDN_MAX_KERNEL 8

__device__ __forceinline__ float gdn_silu(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float gdn_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
// torch softplus (beta 1, threshold 20).
__device__ __forceinline__ float gdn_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// grid (ceil(conv_dim / blockDim.x), num_tokens). out[t, c] = silu(sum_j w[c, j] x[t - (K-1) + j, c]),
// rows before the sequence's first new token from its conv state (zeros when cached_len == 0).
// A sequence with one new token (decode) has one thread per channel here, which also shifts its
// conv state in place (it read every old row first); gdn_conv_state skips those sequences.
template <typename T>
__device__ void gdn_conv1d(const T* mixed, const T* weight, float* conv_state,
                           const int* token_seq, const int* seq_meta, T* out, int conv_dim, int kern,
                           int num_layers, int layer) {
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

// grid (ceil(conv_dim / blockDim.x), num_seqs). The new conv state: the last K-1 rows of
// [old state (zeros when fresh); the sequence's new rows]. Each thread owns one channel of one
// slot, reads every old row before writing, so it may run in place.
template <typename T>
__device__ void gdn_conv_state(const T* mixed, float* conv_state, const int* seq_meta,
                               int conv_dim, int kern, int num_layers, int layer) {
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

template <typename T, int R>
__device__ void gdn_scan(const T* qkv, const T* a_in, const T* b_in, const T* a_log, const T* dt_bias,
                         float* rec_state, const int* seq_meta, T* out, int num_key_heads,
                         int num_value_heads, int dk, int dv, int num_layers, int layer,
                         int chunk_min) {
    constexpr int COLS = GDN_THREADS / R;
    constexpr int MAX_ROWS = GDN_MAX_DK / R;
    __shared__ float qs[GDN_TILE][GDN_MAX_DK];
    __shared__ float ks[GDN_TILE][GDN_MAX_DK];
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
    float S[MAX_ROWS];
#pragma unroll
    for (int r = 0; r < MAX_ROWS; r++)
        S[r] = (r < rows && active && cached != 0) ? st[(long)col * dk + s + R * r] : 0.0f;

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
#pragma unroll
            for (int r = 0; r < MAX_ROWS; r += 2) {
                if (r < rows) {
                    kv0 += S[r] * ks[i][s + R * r];
                    sq0 += S[r] * qs[i][s + R * r];
                }
                if (r + 1 < rows) {
                    kv1 += S[r + 1] * ks[i][s + R * (r + 1)];
                    sq1 += S[r + 1] * qs[i][s + R * (r + 1)];
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
#pragma unroll
            for (int r = 0; r < MAX_ROWS; r++)
                if (r < rows) S[r] = S[r] * eg + ks[i][s + R * r] * delta;
            if (active && s == 0) {
                float o = eg * sq + delta * kqs[i];
                Io<T>::store(out, ((long)(start + t0 + i) * num_value_heads + h) * dv + col, o);
            }
        }
    }
    if (active) {
#pragma unroll
        for (int r = 0; r < MAX_ROWS; r++)
            if (r < rows) st[(long)col * dk + s + R * r] = S[r];
    }
}

// One block per row of `dim`: out = x / sqrt(mean(x^2) + eps) * w * silu(z) (norm before the gate,
// a plain weight), f32 math.
template <typename T>
__device__ void gated_rms_norm(const T* x, const T* z, const T* w, T* out, int dim, float eps) {
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

// Zero-centred RMSNorm (Qwen3.5's (1 + w) norms), one block per row of `dim`, as rms_norm.cu's
// rms_norm (same residual handling) but with the weight w stored as is and 1 + w formed in f32:
// stored as 1 + w in bf16 the factor is rounded to 2^-8 relative, a perturbation of every norm.
//   h = x + residual (when residual != nullptr; written back);  out = (1 + w) * (h / rms(h))
template <typename T, typename X, typename R>
__device__ void rms_norm_1p(const X* x, R* residual, const T* weight, T* out, int dim, float eps) {
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
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    long head = i / hd, d = i % hd;
    q[i] = qg[head * 2 * hd + d];
    gate[i] = qg[head * 2 * hd + hd + d];
}

template <typename T>
__device__ void sigmoid_mul(T* x, const T* gate, long n) {
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
        gdn_scan<T, 8>(qkv, a, b, a_log, dt_bias, rec_state, seq_meta, out, num_key_heads,           \
                       num_value_heads, dk, dv, num_layers, layer, chunk_min);                       \
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
