// gguf_mm.cu: matmuls on GGUF Q4_0 / Q4_1 / Q8_0 / Q4_K / Q6_K weights kept quantized on the device
// (issue 10),
// with the dequantization fused: out[r, n] = sum_k x[r, k] * W[n, k], x [m, k] and out [m, n]
// row-major, x in the 16-bit (or f32) compute dtype (A16: activations are never quantized).
//
// The device layout ("gguf tiles", built on the host by src/tensor/gguf_tiles.rs):
//   qw      uint4 [Np/8][KB][V][32]  KB = Kp/128, V = 1 (4-bit: Q4_0, Q4_1, Q4_K) or 2 (8-bit:
//                                    Q8_0, Q6_K as q - 32);
//                                    n8 tile nt, k block kb, lane l = 4g + t holds the values of
//                                    output n = 8nt + g for the k's the m16n8k16 B fragment gives
//                                    lane l. 4-bit: chunk c (16 k's, 0..7) sits in bits 16(c&1)..
//                                    of word c/2 of its one uint4, nibbles (low first) k = 16c+2t,
//                                    16c+2t+1, 16c+8+2t, 16c+9+2t (the w4 tile order of
//                                    w4a16.cu). 8-bit: chunk c is word c&3 of uint4 c>>2, bytes
//                                    (low first) for the same four k's.
//   scales  Q4_0 / Q4_1 / Q8_0: u16 [Np/8][KB][8][4], the block's f16 `d` of (output 8nt + g,
//           ggml block 4kb + i): lane g reads its four as one 64-bit word.
//           Q4_K: u8 [Np/8][KB][8][8], the 6-bit sc of sub-blocks 4(kb&1) + i (bytes 0-3) and
//           their 6-bit mn (bytes 4-7) of super-block kb/2. Q6_K: i8 [Np/8][KB][8][8], the
//           scale of 16-column sub-block 8(kb&1) + c (chunk c). One 64-bit word per lane.
//   aux     Q4_1: its f16 `m`, laid out as scales. Q4_K: u32 [Np/8][KB/2][8], f16 d | dmin << 16
//           of the super-block. Q6_K: u16 [Np/8][KB/2][8], its f16 d. nullptr for Q4_0 / Q8_0.
//   W[n, j] = the ggml reference value in f32, then one rounding to the compute dtype:
//     Q4_0: (u - 8) * d      Q4_1: fmaf(u, d, m) (= u * d + m: u * d is exact)      Q8_0: q * d
//     Q4_K: fmaf(u, d*sc, -(dmin*mn)) (each product exact in f32, so = ggml's d*sc*u - dmin*mn)
//     Q6_K: (q - 32) * (d*sc) (d*sc exact: ggml's order)
// Np is N rounded up to 64, Kp is K rounded up to 128 (padding has d = m = 0: W = 0); x is read
// only below column k and row m, out written only below n and m.
//
// ONE NUMERIC PATH FOR EVERY ROW COUNT (as w4a16.cu). On sm_80+ (f16 / bf16) both kernels use
// mma.sync.m16n8k16 with f32 accumulation over the same fragments: K is cut into `ks` slices (a
// function of K alone, chosen by the host); slice s accumulates its k blocks in ascending order
// from zero into P_s, and the result is ((0 + P_0) + P_1) + ... in f32. `gguf_gemv` (rows 1..16:
// one m16 tile, one warp per slice, P_s summed through shared memory) and `gguf_gemm` (larger
// steps: 64 x 32 tiles per warp, the slices one after another) perform exactly these operations per
// output element, so a row's result does not depend on its batch and the two kernels agree bit for
// bit (tests/cuda_gguf_quant.rs checks it). `gguf_fma` is the path for sm_70 / sm_75 and the f32
// compute dtype: f32 FMAs in a fixed k order per lane, a fixed quad shuffle, the same slice sum;
// one kernel for every row count. `gguf_gather` is the embedding row gather from the same layout.
// Nothing allocates; every launch has fixed pointers (graph-capturable).

#define GG_KB 128       // k per tile block
#define GG_MAX_KS 8     // K slices at most
#define GG_GEMV_NT 2    // n8 tiles per warp in the GEMV (16 outputs)
#define GG_GEMM_MT 4    // m16 tiles per warp in the GEMM (64 rows)
#define GG_GEMM_NT 4    // n8 tiles per warp in the GEMM (32 outputs); 2 x 2 warps: 128 x 64

// Two f32 values rounded to the 16-bit compute dtype T, packed low | high << 16.
template <typename T> struct GgPack;
template <> struct GgPack<__half> {
    static __device__ __forceinline__ unsigned pack(float lo, float hi) {
        const __half2 h = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<const unsigned*>(&h);
    }
};
template <> struct GgPack<bf16_t> {
    static __device__ __forceinline__ unsigned pack(float lo, float hi) {
        return (unsigned)f32_to_bf16(lo) | ((unsigned)f32_to_bf16(hi) << 16);
    }
};

// x[row, col] and x[row, col + 1] (16-bit each) as one word; 0 outside the m x k input (k is a
// multiple of 32, col even: the word is aligned).
__device__ __forceinline__ unsigned gg_pair(const unsigned short* __restrict__ x, int row, int m,
                                            int col, int k) {
    if (row >= m || col >= k) return 0u;
    return __ldg(reinterpret_cast<const unsigned*>(x + (size_t)row * k + col));
}

__device__ __forceinline__ float gg_f16(unsigned bits) {
    return __half2float(__ushort_as_half((unsigned short)(bits & 0xffffu)));
}

// The block parameters of a lane's output for one k block, loaded at once (`load`), and the f32
// (d, m) of chunk c (`dm`; the values decode as W = f(value, d, m)).
// The 32-element formats: f16 d (and Q4_1's m) per ggml block (chunks 2b, 2b + 1).
template <bool MINS> struct GgParF16 {
    uint2 d4, m4;
    __device__ __forceinline__ void load(const void* scales, const void* aux, int nt, int kb,
                                         int kblocks, int g) {
        const size_t i = ((size_t)nt * kblocks + kb) * 8 + g;
        d4 = __ldg(reinterpret_cast<const uint2*>(scales) + i);
        m4 = MINS ? __ldg(reinterpret_cast<const uint2*>(aux) + i) : make_uint2(0u, 0u);
    }
    __device__ __forceinline__ void dm(int c, float& d, float& m) const {
        const int b = c >> 1;
        const unsigned dw = b < 2 ? d4.x : d4.y, mw = b < 2 ? m4.x : m4.y;
        d = gg_f16(dw >> (16 * (b & 1)));
        m = gg_f16(mw >> (16 * (b & 1)));
    }
};
// Index of (tile nt, super-block kb / 2, output g) in the K-quants' aux arrays.
__device__ __forceinline__ size_t gg_super(int nt, int kb, int kblocks, int g) {
    return ((size_t)nt * (kblocks >> 1) + (kb >> 1)) * 8 + g;
}
// Q4_K: sub-block b = c / 2 (32 columns): d = f16(d) * sc_b, m = -(f16(dmin) * mn_b).
struct GgParQ4K {
    uint2 s;      // sc bytes (x), mn bytes (y)
    unsigned dd;  // f16 d | f16 dmin << 16
    __device__ __forceinline__ void load(const void* scales, const void* aux, int nt, int kb,
                                         int kblocks, int g) {
        s = __ldg(reinterpret_cast<const uint2*>(scales) + ((size_t)nt * kblocks + kb) * 8 + g);
        dd = __ldg(reinterpret_cast<const unsigned*>(aux) + gg_super(nt, kb, kblocks, g));
    }
    __device__ __forceinline__ void dm(int c, float& d, float& m) const {
        const int b = c >> 1;
        d = gg_f16(dd) * (float)((s.x >> (8 * b)) & 0xffu);
        m = -(gg_f16(dd >> 16) * (float)((s.y >> (8 * b)) & 0xffu));
    }
};
// Q6_K: sub-block c (16 columns): d = f16(d) * sc_c (signed), m unused.
struct GgParQ6K {
    uint2 s;           // the eight signed scale bytes
    unsigned short dh;  // f16 d
    __device__ __forceinline__ void load(const void* scales, const void* aux, int nt, int kb,
                                         int kblocks, int g) {
        s = __ldg(reinterpret_cast<const uint2*>(scales) + ((size_t)nt * kblocks + kb) * 8 + g);
        dh = __ldg(reinterpret_cast<const unsigned short*>(aux) + gg_super(nt, kb, kblocks, g));
    }
    __device__ __forceinline__ void dm(int c, float& d, float& m) const {
        const unsigned w = c < 4 ? s.x : s.y;
        d = gg_f16(dh) * (float)(int)(signed char)((w >> (8 * (c & 3))) & 0xffu);
        m = 0.0f;
    }
};

// The formats: how many uint4 a lane holds per k block, their parameters, and the four f32
// weights of chunk c from (d, m).
struct GgQ4_0 {
    static constexpr int V = 1;
    using P = GgParF16<false>;
    static __device__ __forceinline__ void values(const uint4* w, int c, float d, float m,
                                                  float* v) {
        const unsigned word = (c >> 1) == 0 ? w[0].x : (c >> 1) == 1 ? w[0].y
                            : (c >> 1) == 2 ? w[0].z : w[0].w;
        const unsigned bits = word >> (16 * (c & 1));
#pragma unroll
        for (int q = 0; q < 4; ++q) v[q] = (float)((int)((bits >> (4 * q)) & 15u) - 8) * d;
    }
};
struct GgQ4_1 {
    static constexpr int V = 1;
    using P = GgParF16<true>;
    static __device__ __forceinline__ void values(const uint4* w, int c, float d, float m,
                                                  float* v) {
        const unsigned word = (c >> 1) == 0 ? w[0].x : (c >> 1) == 1 ? w[0].y
                            : (c >> 1) == 2 ? w[0].z : w[0].w;
        const unsigned bits = word >> (16 * (c & 1));
#pragma unroll
        for (int q = 0; q < 4; ++q) v[q] = fmaf((float)((bits >> (4 * q)) & 15u), d, m);
    }
};
struct GgQ8_0 {
    static constexpr int V = 2;
    using P = GgParF16<false>;
    static __device__ __forceinline__ void values(const uint4* w, int c, float d, float m,
                                                  float* v) {
        const uint4& h = w[c >> 2];
        const unsigned word = (c & 3) == 0 ? h.x : (c & 3) == 1 ? h.y : (c & 3) == 2 ? h.z : h.w;
#pragma unroll
        for (int q = 0; q < 4; ++q) v[q] = (float)(signed char)((word >> (8 * q)) & 0xffu) * d;
    }
};
// The K-quants decode their values as Q4_1 (nibbles, fmaf(u, d, m)) and Q8_0 (signed bytes,
// q * d) do, with their own parameters.
struct GgQ4K : GgQ4_1 {
    using P = GgParQ4K;
};
struct GgQ6K : GgQ8_0 {
    using P = GgParQ6K;
};

// The lane's words of (tile nt, k block kb).
template <typename F>
__device__ __forceinline__ void gg_load(const uint4* __restrict__ qw, int nt, int kb, int kblocks,
                                        int lane, uint4* w) {
#pragma unroll
    for (int h = 0; h < F::V; ++h)
        w[h] = __ldg(qw + (((size_t)nt * kblocks + kb) * F::V + h) * 32 + lane);
}

// B fragment (two words) of chunk c.
template <typename F, typename T>
__device__ __forceinline__ void gg_frag(const uint4* w, int c, const typename F::P& p,
                                        unsigned& b0, unsigned& b1) {
    float d, m, v[4];
    p.dm(c, d, m);
    F::values(w, c, d, m, v);
    b0 = GgPack<T>::pack(v[0], v[1]);
    b1 = GgPack<T>::pack(v[2], v[3]);
}

// Store one output element (compute dtype, or f32 logits).
template <typename T>
__device__ __forceinline__ void gg_store(void* out, int out_f32, int row, int n, int col, float v) {
    const size_t i = (size_t)row * n + col;
    if (out_f32) {
        static_cast<float*>(out)[i] = v;
    } else {
        Io<T>::store(static_cast<T*>(out), (long)i, v);
    }
}

// GEMV: grid (Np / 16, ceil(m / 16)), block 32 * ks threads (warp s = K slice s).
template <typename F, typename T>
__device__ __forceinline__ void gg_gemv(const T* x, int m, int k, const uint4* __restrict__ qw,
                                        const void* scales, const void* mins,
                                        int kblocks, int ks, int n, void* out, int out_f32) {
    __shared__ float part[GG_MAX_KS][GG_GEMV_NT][4][32];
    const int lane = threadIdx.x & 31, s = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int nt0 = blockIdx.x * GG_GEMV_NT;
    const int r0 = blockIdx.y * 16;
    const unsigned short* xs = reinterpret_cast<const unsigned short*>(x);
    const int per = kblocks / ks, kb0 = s * per;
    float acc[GG_GEMV_NT][4];
#pragma unroll
    for (int j = 0; j < GG_GEMV_NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
    // The next k block's words and parameters are loaded one block ahead (hides their latency;
    // the arithmetic is the same).
    uint4 next[GG_GEMV_NT][F::V];
    typename F::P pn[GG_GEMV_NT];
    if (per > 0) {
#pragma unroll
        for (int j = 0; j < GG_GEMV_NT; ++j) {
            gg_load<F>(qw, nt0 + j, kb0, kblocks, lane, next[j]);
            pn[j].load(scales, mins, nt0 + j, kb0, kblocks, g);
        }
    }
    for (int kb = kb0; kb < kb0 + per; ++kb) {
        uint4 w[GG_GEMV_NT][F::V];
        typename F::P pc[GG_GEMV_NT];
#pragma unroll
        for (int j = 0; j < GG_GEMV_NT; ++j) {
#pragma unroll
            for (int h = 0; h < F::V; ++h) w[j][h] = next[j][h];
            pc[j] = pn[j];
            if (kb + 1 < kb0 + per) {
                gg_load<F>(qw, nt0 + j, kb + 1, kblocks, lane, next[j]);
                pn[j].load(scales, mins, nt0 + j, kb + 1, kblocks, g);
            }
        }
#pragma unroll
        for (int c = 0; c < 8; ++c) {
            const int col = kb * GG_KB + 16 * c + 2 * t;
            unsigned a[4];
            a[0] = gg_pair(xs, r0 + g, m, col, k);
            a[1] = gg_pair(xs, r0 + g + 8, m, col, k);
            a[2] = gg_pair(xs, r0 + g, m, col + 8, k);
            a[3] = gg_pair(xs, r0 + g + 8, m, col + 8, k);
#pragma unroll
            for (int j = 0; j < GG_GEMV_NT; ++j) {
                unsigned b0, b1;
                gg_frag<F, T>(w[j], c, pc[j], b0, b1);
                mma_m16n8k16<T>(acc[j], a, b0, b1);
            }
        }
    }
#pragma unroll
    for (int j = 0; j < GG_GEMV_NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) part[s][j][e][lane] = acc[j][e];
    __syncthreads();
    if (s != 0) return;
#pragma unroll
    for (int j = 0; j < GG_GEMV_NT; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            float total = 0.0f;
            for (int q = 0; q < ks; ++q) total += part[q][j][e][lane];
            const int row = r0 + g + (e >= 2 ? 8 : 0);
            const int col = (nt0 + j) * 8 + 2 * t + (e & 1);
            if (row < m && col < n) gg_store<T>(out, out_f32, row, n, col, total);
        }
    }
}

// GEMM: grid (Np / 64, ceil(m / 128)), block 128 threads = 2 (rows) x 2 (outputs) warps, each
// 64 rows x 32 outputs; the ks slices in order, each from zero, summed into `total`.
template <typename F, typename T>
__device__ __forceinline__ void gg_gemm(const T* x, int m, int k, const uint4* __restrict__ qw,
                                        const void* scales, const void* mins,
                                        int kblocks, int ks, int n, void* out, int out_f32) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int r0 = blockIdx.y * 128 + (warp >> 1) * 64;
    const int nt0 = blockIdx.x * 8 + (warp & 1) * GG_GEMM_NT;
    const unsigned short* xs = reinterpret_cast<const unsigned short*>(x);
    const int per = kblocks / ks;
    float total[GG_GEMM_MT][GG_GEMM_NT][4];
#pragma unroll
    for (int i = 0; i < GG_GEMM_MT; ++i)
#pragma unroll
        for (int j = 0; j < GG_GEMM_NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) total[i][j][e] = 0.0f;
    for (int s = 0; s < ks; ++s) {
        float acc[GG_GEMM_MT][GG_GEMM_NT][4];
#pragma unroll
        for (int i = 0; i < GG_GEMM_MT; ++i)
#pragma unroll
            for (int j = 0; j < GG_GEMM_NT; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
        for (int kb = s * per; kb < (s + 1) * per; ++kb) {
            uint4 w[GG_GEMM_NT][F::V];
            typename F::P p[GG_GEMM_NT];
#pragma unroll
            for (int j = 0; j < GG_GEMM_NT; ++j) {
                gg_load<F>(qw, nt0 + j, kb, kblocks, lane, w[j]);
                p[j].load(scales, mins, nt0 + j, kb, kblocks, g);
            }
#pragma unroll
            for (int c = 0; c < 8; ++c) {
                const int col = kb * GG_KB + 16 * c + 2 * t;
                unsigned b[GG_GEMM_NT][2];
#pragma unroll
                for (int j = 0; j < GG_GEMM_NT; ++j)
                    gg_frag<F, T>(w[j], c, p[j], b[j][0], b[j][1]);
#pragma unroll
                for (int i = 0; i < GG_GEMM_MT; ++i) {
                    const int row = r0 + 16 * i + g;
                    unsigned a[4];
                    a[0] = gg_pair(xs, row, m, col, k);
                    a[1] = gg_pair(xs, row + 8, m, col, k);
                    a[2] = gg_pair(xs, row, m, col + 8, k);
                    a[3] = gg_pair(xs, row + 8, m, col + 8, k);
#pragma unroll
                    for (int j = 0; j < GG_GEMM_NT; ++j) mma_m16n8k16<T>(acc[i][j], a, b[j][0], b[j][1]);
                }
            }
        }
#pragma unroll
        for (int i = 0; i < GG_GEMM_MT; ++i)
#pragma unroll
            for (int j = 0; j < GG_GEMM_NT; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) total[i][j][e] += acc[i][j][e];
    }
#pragma unroll
    for (int i = 0; i < GG_GEMM_MT; ++i)
#pragma unroll
        for (int j = 0; j < GG_GEMM_NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int row = r0 + 16 * i + g + (e >= 2 ? 8 : 0);
                const int col = (nt0 + j) * 8 + 2 * t + (e & 1);
                if (row < m && col < n) gg_store<T>(out, out_f32, row, n, col, total[i][j][e]);
            }
}

// FMA path (sm_70 / sm_75, f32): grid (Np / 8, ceil(m / 16)), block 32 * ks threads. Lane (g, t) of
// warp s sums output 8*blockIdx.x + g over its 32 k's of each k block of slice s, in order, for
// up to 16 rows; the quad's four sums meet by a fixed xor shuffle, the slices in order.
template <typename F, typename T>
__device__ __forceinline__ void gg_fma(const T* x, int m, int k, const uint4* __restrict__ qw,
                                       const void* scales, const void* mins,
                                       int kblocks, int ks, int n, void* out, int out_f32) {
    __shared__ float part[GG_MAX_KS][16][8];
    const int lane = threadIdx.x & 31, s = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int nt = blockIdx.x;
    const int r0 = blockIdx.y * 16;
    const int per = kblocks / ks;
    float acc[16];
#pragma unroll
    for (int r = 0; r < 16; ++r) acc[r] = 0.0f;
    for (int kb = s * per; kb < (s + 1) * per; ++kb) {
        uint4 w[F::V];
        typename F::P p;
        gg_load<F>(qw, nt, kb, kblocks, lane, w);
        p.load(scales, mins, nt, kb, kblocks, g);
        float wf[32];
        int cols[32];
#pragma unroll
        for (int c = 0; c < 8; ++c) {
            float d, mm, v[4];
            p.dm(c, d, mm);
            F::values(w, c, d, mm, v);
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                wf[4 * c + q] = round_to<T>(v[q]);
                const int col = kb * GG_KB + 16 * c + 2 * t + (q & 1) + (q >= 2 ? 8 : 0);
                cols[4 * c + q] = col < k ? col : -1;
            }
        }
#pragma unroll
        for (int r = 0; r < 16; ++r) {
            if (r0 + r >= m) break;
            const T* xr = x + (size_t)(r0 + r) * k;
#pragma unroll
            for (int q = 0; q < 32; ++q) {
                const float xv = cols[q] >= 0 ? Io<T>::load(xr, cols[q]) : 0.0f;
                acc[r] = fmaf(wf[q], xv, acc[r]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < 16; ++r) {
        float v = acc[r];
        v += __shfl_xor_sync(0xffffffffu, v, 1);
        v += __shfl_xor_sync(0xffffffffu, v, 2);
        if (t == 0) part[s][r][g] = v;
    }
    __syncthreads();
    if (s != 0 || t != 0) return;
    const int col = nt * 8 + g;
    for (int r = 0; r < 16 && r0 + r < m; ++r) {
        float total = 0.0f;
        for (int q = 0; q < ks; ++q) total += part[q][r][g];
        if (col < n) gg_store<T>(out, out_f32, r0 + r, n, col, total);
    }
}

// Row gather (embeddings): out[i, :] = W[ids[i], :] rounded to T (what the dense table in T would
// hold), stored as O. Grid (rows), block 256; thread j walks the columns j, j + 256, ...
template <typename F, typename T, typename O>
__device__ __forceinline__ void gg_gather(const int* ids, const uint4* __restrict__ qw,
                                          const void* scales, const void* mins,
                                          int kblocks, int k, O* out) {
    const int n = __ldg(ids + blockIdx.x);
    const int nt = n >> 3, g = n & 7;
    for (int j = threadIdx.x; j < k; j += blockDim.x) {
        const int kb = j / GG_KB, jj = j % GG_KB;
        const int c = jj >> 4, r = jj & 15;
        // r = 2t + (q & 1) + 8 (q >= 2)
        const int hi = r >> 3, t = (r & 7) >> 1, q = (r & 1) + 2 * hi;
        const int lane = 4 * g + t;
        uint4 w[F::V];
        typename F::P p;
        gg_load<F>(qw, nt, kb, kblocks, lane, w);
        p.load(scales, mins, nt, kb, kblocks, g);
        float d, mm, v[4];
        p.dm(c, d, mm);
        F::values(w, c, d, mm, v);
        Io<O>::store(out, (long)blockIdx.x * k + j, round_to<T>(v[q]));
    }
}

#define GG_ARGS(T)                                                                              \
    const T *x, int m, int k, const uint4 *qw, const void *scales, const void *mins, int kblocks, \
        int ks, int n, void *out, int out_f32
#define GG_PASS x, m, k, qw, scales, mins, kblocks, ks, n, out, out_f32
#define GG_GATHER_ARGS(O)                                                                       \
    const int *ids, const uint4 *qw, const void *scales, const void *mins,                      \
        int kblocks, int k, O *out
#define GG_GATHER_PASS ids, qw, scales, mins, kblocks, k, out

#define GG_TC_ENTRIES(FS, F, SUF, T)                                                            \
    extern "C" __global__ void __launch_bounds__(256, 4) gguf_gemv_##FS##_##SUF(GG_ARGS(T)) {  \
        gg_gemv<F, T>(GG_PASS);                                                                  \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(128) gguf_gemm_##FS##_##SUF(GG_ARGS(T)) {      \
        gg_gemm<F, T>(GG_PASS);                                                                  \
    }                                                                                            \
    extern "C" __global__ void gguf_gather_##FS##_##SUF##_to_f32(GG_GATHER_ARGS(float)) {       \
        gg_gather<F, T, float>(GG_GATHER_PASS);                                                  \
    }
#define GG_ALL_ENTRIES(FS, F, SUF, T)                                                           \
    extern "C" __global__ void gguf_fma_##FS##_##SUF(GG_ARGS(T)) { gg_fma<F, T>(GG_PASS); }     \
    extern "C" __global__ void gguf_gather_##FS##_##SUF(GG_GATHER_ARGS(T)) {                    \
        gg_gather<F, T, T>(GG_GATHER_PASS);                                                      \
    }
#define GG_FORMATS(M, SUF, T)                                                                   \
    M(q4_0, GgQ4_0, SUF, T) M(q4_1, GgQ4_1, SUF, T) M(q8_0, GgQ8_0, SUF, T) M(q4_k, GgQ4K, SUF, T) \
        M(q6_k, GgQ6K, SUF, T)
#define GG_TC_TYPE(SUF, T) GG_FORMATS(GG_TC_ENTRIES, SUF, T)
#define GG_ALL_TYPE(SUF, T) GG_FORMATS(GG_ALL_ENTRIES, SUF, T)
GG_TC_TYPE(f16, __half)
GG_TC_TYPE(bf16, bf16_t)
KILN_FOR_FLOAT_TYPES(GG_ALL_TYPE)
