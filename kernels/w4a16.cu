// w4a16.cu: matmuls on 4-bit integer weights kept packed on the device (issue 10), with the
// dequantization fused: out[r, n] = sum_k x[r, k] * W[n, k], x [m, k] and out [m, n] row-major.
//
// The device layout ("w4 tiles", built on the host by src/tensor/packed_tiles.rs from every int4
// format: compressed-tensors pack-quantized sym/asym, AutoAWQ GEMM, GPTQ incl. desc_act):
//   qw      uint4 [Np/8][KB][32]   KB = Kp/128; n8 tile nt, k block kb, lane l = 4g + t holds the
//                                  nibbles of output n = 8nt + g for the k's the m16n8k16 B fragment
//                                  gives lane l: chunk c (16 k's, 0..7) sits in bits 16(c&1).. of
//                                  word c/2, nibbles k = 16c+2t, 16c+2t+1, 16c+8+2t, 16c+9+2t.
//   scales  T     [Np/8][GS][8]    scale of (n, group), the compute dtype; group of chunk
//                                  kb*8+c is (kb*8+c) >> gshift (a group is 2^gshift chunks).
//   zeros   u8    [Np/8][GS][8]    zero point, or nullptr (symmetric: 8).
//   perm    i32   [Kp]             act-order: permuted column j holds input column perm[j]
//                                  (groups made contiguous at load), or nullptr.
//   W[n, j] = (u - z) * s, exact before one rounding to the compute dtype.
// Np is N rounded up to 64, Kp is K rounded up to 128 (padding has scale 0); x is read only
// below column k and row m, out written only below n and m.
//
// ONE NUMERIC PATH FOR EVERY ROW COUNT. On sm_80+ (f16 / bf16) both kernels use
// mma.sync.m16n8k16 with f32 accumulation over the same fragments: K is cut into `ks` slices
// (a function of K alone, chosen by the host); slice s accumulates its k blocks in ascending
// order from zero into P_s, and the result is ((0 + P_0) + P_1) + ... in f32. `w4_gemv` (rows
// 1..16: one m16 tile, one warp per slice, P_s summed through shared memory) and `w4_gemm`
// (larger steps: 64 x 32 tiles per warp, the slices run one after another) perform exactly these
// operations per output element, so a row's result does not depend on its batch and the two
// kernels agree bit for bit (tests/cuda_w4a16.rs checks it). `w4_fma` is the path for sm_70 /
// sm_75 and the f32 compute dtype: f32 FMAs in a fixed k order per lane, a fixed quad shuffle,
// the same slice sum; one kernel for every row count (rows in chunks of 16 by grid.y).
// No split-K depends on the row count; nothing allocates; every launch has fixed pointers
// (graph-capturable).

#define W4_KB 128       // k per tile block
#define W4_MAX_KS 8     // K slices at most
#define W4_GEMV_NT 2    // n8 tiles per warp in the GEMV (16 outputs)
#define W4_GEMM_MT 4    // m16 tiles per warp in the GEMM (64 rows)
#define W4_GEMM_NT 4    // n8 tiles per warp in the GEMM (32 outputs); 2 x 2 warps: 128 x 64

// Two values rounded to the 16-bit compute dtype T, packed low | high << 16.
template <typename T> struct W4Pack;
template <> struct W4Pack<__half> {
    static __device__ __forceinline__ unsigned pack(float lo, float hi) {
        return (unsigned)__half_as_ushort(__float2half_rn(lo)) |
               ((unsigned)__half_as_ushort(__float2half_rn(hi)) << 16);
    }
};
template <> struct W4Pack<bf16_t> {
    static __device__ __forceinline__ unsigned pack(float lo, float hi) {
        return (unsigned)f32_to_bf16(lo) | ((unsigned)f32_to_bf16(hi) << 16);
    }
};

// D += A * B for one m16n8k16 tile (fragments as the PTX ISA lays them out).
template <typename T>
__device__ __forceinline__ void w4_mma(float* d, const unsigned* a, unsigned b0, unsigned b1);
template <>
__device__ __forceinline__ void w4_mma<__half>(float* d, const unsigned* a, unsigned b0, unsigned b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    __trap();  // the host launches the tensor-core kernels on sm_80+ only
#endif
}
template <>
__device__ __forceinline__ void w4_mma<bf16_t>(float* d, const unsigned* a, unsigned b0, unsigned b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    __trap();
#endif
}

// x[row, col] and x[row, col + 1] (16-bit each) as one word; 0 outside the m x k input. `col` is a
// position in the (permuted) tile order; with `perm` the input column is perm[col].
__device__ __forceinline__ unsigned w4_pair(const unsigned short* __restrict__ x, int row, int m,
                                            int col, int k, const int* __restrict__ perm) {
    if (row >= m || col >= k) return 0u;
    const unsigned short* xr = x + (size_t)row * k;
    if (perm) {
        return (unsigned)__ldg(xr + __ldg(perm + col)) |
               ((unsigned)__ldg(xr + __ldg(perm + col + 1)) << 16);
    }
    return __ldg(reinterpret_cast<const unsigned*>(xr + col));
}

// The 16 bits of chunk c (0..7) of a lane's tile word.
__device__ __forceinline__ unsigned w4_chunk_bits(const uint4& w, int c) {
    const unsigned word = (c >> 1) == 0 ? w.x : (c >> 1) == 1 ? w.y : (c >> 1) == 2 ? w.z : w.w;
    return (word >> (16 * (c & 1))) & 0xffffu;
}

// Scale and zero point of output 8*nt + g in stored group gi (the FMA path: f32 and int).
template <typename T>
__device__ __forceinline__ void w4_scale_zero(const T* __restrict__ scales,
                                              const unsigned char* __restrict__ zeros, int nt,
                                              int gi, int gstore, int g, float& s, int& z) {
    const size_t i = ((size_t)nt * gstore + gi) * 8 + g;
    s = Io<T>::load(scales, (long)i);
    z = zeros ? (int)__ldg(zeros + i) : 8;
}

// The tensor-core decode works in the 16-bit type itself: a nibble u OR-ed into the mantissa of
// MAGIC (1024 for f16, 128 for bf16) is the exact value MAGIC + u; minus (MAGIC + z) is the exact
// small integer u - z; times the scale rounds once (RNE). That is bit for bit the f32 product
// (u - z) * s rounded to T, since that product is exact in f32: a cheaper route to the same value.
template <typename T> struct W4Dec;
template <> struct W4Dec<__half> {
    static constexpr unsigned MAGIC = 0x64006400u;
    static __device__ __forceinline__ unsigned bias(int z) {
        const unsigned h = __half_as_ushort(__float2half_rn(1024.0f + (float)z));
        return h | (h << 16);
    }
    static __device__ __forceinline__ unsigned apply(unsigned q, unsigned zb, unsigned s2) {
        const __half2 d = __hsub2(*reinterpret_cast<const __half2*>(&q),
                                  *reinterpret_cast<const __half2*>(&zb));
        const __half2 w = __hmul2(d, *reinterpret_cast<const __half2*>(&s2));
        return *reinterpret_cast<const unsigned*>(&w);
    }
};
template <> struct W4Dec<bf16_t> {
    static constexpr unsigned MAGIC = 0x43004300u;
    static __device__ __forceinline__ unsigned bias(int z) {
        const unsigned h = f32_to_bf16(128.0f + (float)z);
        return h | (h << 16);
    }
    static __device__ __forceinline__ unsigned apply(unsigned q, unsigned zb, unsigned s2) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
        unsigned d, w;
        // q * 1 - zb (exact), then d * s2 + (-0) (one rounding; -0 keeps the sign of a zero).
        asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(q), "r"(0x3f803f80u), "r"(zb ^ 0x80008000u));
        asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(w) : "r"(d), "r"(s2), "r"(0x80008000u));
        return w;
#else
        __trap();
        return 0u;
#endif
    }
};

// Scale (as a 16-bit pair) and zero bias of output 8*nt + g in stored group gi.
template <typename T>
__device__ __forceinline__ void w4_scale_bias(const T* __restrict__ scales,
                                              const unsigned char* __restrict__ zeros, int nt,
                                              int gi, int gstore, int g, unsigned& s2,
                                              unsigned& zb) {
    const size_t i = ((size_t)nt * gstore + gi) * 8 + g;
    const unsigned sv = __ldg(reinterpret_cast<const unsigned short*>(scales) + i);
    s2 = sv | (sv << 16);
    zb = W4Dec<T>::bias(zeros ? (int)__ldg(zeros + i) : 8);
}

// B fragment (two words) of one chunk: the four weights of the chunk's 16 bits.
template <typename T>
__device__ __forceinline__ void w4_decode(unsigned bits, unsigned s2, unsigned zb, unsigned& b0,
                                          unsigned& b1) {
    const unsigned q0 = (bits & 0xfu) | ((bits & 0xf0u) << 12) | W4Dec<T>::MAGIC;
    const unsigned q1 = ((bits >> 8) & 0xfu) | ((bits & 0xf000u) << 4) | W4Dec<T>::MAGIC;
    b0 = W4Dec<T>::apply(q0, zb, s2);
    b1 = W4Dec<T>::apply(q1, zb, s2);
}

// Store one output element (compute dtype, or f32 logits).
template <typename T>
__device__ __forceinline__ void w4_store(void* out, int out_f32, int row, int n, int col, float v) {
    const size_t i = (size_t)row * n + col;
    if (out_f32) {
        static_cast<float*>(out)[i] = v;
    } else {
        Io<T>::store(static_cast<T*>(out), (long)i, v);
    }
}

// GEMV: grid (Np / 16, ceil(m / 16)), block 32 * ks threads (warp s = K slice s).
template <typename T>
__device__ __forceinline__ void w4_gemv(const T* x, int m, int k, const uint4* __restrict__ qw,
                                        const T* scales, const unsigned char* zeros,
                                        const int* perm, int kblocks, int ks, int gshift,
                                        int gstore, int n, void* out, int out_f32) {
    __shared__ float part[W4_MAX_KS][W4_GEMV_NT][4][32];
    const int lane = threadIdx.x & 31, s = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int nt0 = blockIdx.x * W4_GEMV_NT;
    const int r0 = blockIdx.y * 16;
    const unsigned short* xs = reinterpret_cast<const unsigned short*>(x);
    const int per = kblocks / ks, kb0 = s * per;
    float acc[W4_GEMV_NT][4];
#pragma unroll
    for (int j = 0; j < W4_GEMV_NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
    // Groups of >= 128 columns (gshift >= 3): one scale / zero per tile per k block, loaded one
    // block ahead with the weights (hides their latency; the arithmetic is the same).
    const bool one_group = gshift >= 3;
    uint4 next[W4_GEMV_NT];
    unsigned s2n[W4_GEMV_NT] = {}, zbn[W4_GEMV_NT] = {};
#pragma unroll
    for (int j = 0; j < W4_GEMV_NT; ++j) {
        next[j] = __ldg(qw + ((size_t)(nt0 + j) * kblocks + kb0) * 32 + lane);
        if (one_group && per > 0)
            w4_scale_bias<T>(scales, zeros, nt0 + j, (kb0 * 8) >> gshift, gstore, g, s2n[j], zbn[j]);
    }
    for (int kb = kb0; kb < kb0 + per; ++kb) {
        uint4 w[W4_GEMV_NT];
        unsigned s2c[W4_GEMV_NT], zbc[W4_GEMV_NT];
#pragma unroll
        for (int j = 0; j < W4_GEMV_NT; ++j) {
            w[j] = next[j];
            s2c[j] = s2n[j];
            zbc[j] = zbn[j];
            if (kb + 1 < kb0 + per) {
                next[j] = __ldg(qw + ((size_t)(nt0 + j) * kblocks + kb + 1) * 32 + lane);
                if (one_group)
                    w4_scale_bias<T>(scales, zeros, nt0 + j, ((kb + 1) * 8) >> gshift, gstore, g,
                                     s2n[j], zbn[j]);
            }
        }
#pragma unroll
        for (int c = 0; c < 8; ++c) {
            const int col = kb * W4_KB + 16 * c + 2 * t;
            unsigned a[4];
            a[0] = w4_pair(xs, r0 + g, m, col, k, perm);
            a[1] = w4_pair(xs, r0 + g + 8, m, col, k, perm);
            a[2] = w4_pair(xs, r0 + g, m, col + 8, k, perm);
            a[3] = w4_pair(xs, r0 + g + 8, m, col + 8, k, perm);
            const int gi = (kb * 8 + c) >> gshift;
#pragma unroll
            for (int j = 0; j < W4_GEMV_NT; ++j) {
                unsigned s2 = s2c[j], zb = zbc[j];
                if (!one_group) w4_scale_bias<T>(scales, zeros, nt0 + j, gi, gstore, g, s2, zb);
                unsigned b0, b1;
                w4_decode<T>(w4_chunk_bits(w[j], c), s2, zb, b0, b1);
                w4_mma<T>(acc[j], a, b0, b1);
            }
        }
    }
#pragma unroll
    for (int j = 0; j < W4_GEMV_NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) part[s][j][e][lane] = acc[j][e];
    __syncthreads();
    if (s != 0) return;
#pragma unroll
    for (int j = 0; j < W4_GEMV_NT; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            float total = 0.0f;
            for (int q = 0; q < ks; ++q) total += part[q][j][e][lane];
            const int row = r0 + g + (e >= 2 ? 8 : 0);
            const int col = (nt0 + j) * 8 + 2 * t + (e & 1);
            if (row < m && col < n) w4_store<T>(out, out_f32, row, n, col, total);
        }
    }
}

// GEMM: grid (Np / 64, ceil(m / 128)), block 128 threads = 2 (rows) x 2 (outputs) warps, each
// 64 rows x 32 outputs; the ks slices in order, each from zero, summed into `total`.
template <typename T>
__device__ __forceinline__ void w4_gemm(const T* x, int m, int k, const uint4* __restrict__ qw,
                                        const T* scales, const unsigned char* zeros,
                                        const int* perm, int kblocks, int ks, int gshift,
                                        int gstore, int n, void* out, int out_f32) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int r0 = blockIdx.y * 128 + (warp >> 1) * 64;
    const int nt0 = blockIdx.x * 8 + (warp & 1) * W4_GEMM_NT;
    const unsigned short* xs = reinterpret_cast<const unsigned short*>(x);
    const int per = kblocks / ks;
    float total[W4_GEMM_MT][W4_GEMM_NT][4];
#pragma unroll
    for (int i = 0; i < W4_GEMM_MT; ++i)
#pragma unroll
        for (int j = 0; j < W4_GEMM_NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) total[i][j][e] = 0.0f;
    for (int s = 0; s < ks; ++s) {
        float acc[W4_GEMM_MT][W4_GEMM_NT][4];
#pragma unroll
        for (int i = 0; i < W4_GEMM_MT; ++i)
#pragma unroll
            for (int j = 0; j < W4_GEMM_NT; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
        for (int kb = s * per; kb < (s + 1) * per; ++kb) {
            uint4 w[W4_GEMM_NT];
#pragma unroll
            for (int j = 0; j < W4_GEMM_NT; ++j)
                w[j] = __ldg(qw + ((size_t)(nt0 + j) * kblocks + kb) * 32 + lane);
#pragma unroll
            for (int c = 0; c < 8; ++c) {
                const int col = kb * W4_KB + 16 * c + 2 * t;
                const int gi = (kb * 8 + c) >> gshift;
                unsigned b[W4_GEMM_NT][2];
#pragma unroll
                for (int j = 0; j < W4_GEMM_NT; ++j) {
                    unsigned s2, zb;
                    w4_scale_bias<T>(scales, zeros, nt0 + j, gi, gstore, g, s2, zb);
                    w4_decode<T>(w4_chunk_bits(w[j], c), s2, zb, b[j][0], b[j][1]);
                }
#pragma unroll
                for (int i = 0; i < W4_GEMM_MT; ++i) {
                    const int row = r0 + 16 * i + g;
                    unsigned a[4];
                    a[0] = w4_pair(xs, row, m, col, k, perm);
                    a[1] = w4_pair(xs, row + 8, m, col, k, perm);
                    a[2] = w4_pair(xs, row, m, col + 8, k, perm);
                    a[3] = w4_pair(xs, row + 8, m, col + 8, k, perm);
#pragma unroll
                    for (int j = 0; j < W4_GEMM_NT; ++j) w4_mma<T>(acc[i][j], a, b[j][0], b[j][1]);
                }
            }
        }
#pragma unroll
        for (int i = 0; i < W4_GEMM_MT; ++i)
#pragma unroll
            for (int j = 0; j < W4_GEMM_NT; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) total[i][j][e] += acc[i][j][e];
    }
#pragma unroll
    for (int i = 0; i < W4_GEMM_MT; ++i)
#pragma unroll
        for (int j = 0; j < W4_GEMM_NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int row = r0 + 16 * i + g + (e >= 2 ? 8 : 0);
                const int col = (nt0 + j) * 8 + 2 * t + (e & 1);
                if (row < m && col < n) w4_store<T>(out, out_f32, row, n, col, total[i][j][e]);
            }
}

// FMA path (sm_70 / sm_75, f32): grid (Np / 8, ceil(m / 16)), block 32 * ks threads. Lane (g, t) of
// warp s sums output 8*blockIdx.x + g over its 32 k's of each k block of slice s, in order, for
// up to 16 rows; the quad's four sums meet by a fixed xor shuffle, the slices in order.
template <typename T>
__device__ __forceinline__ void w4_fma(const T* x, int m, int k, const uint4* __restrict__ qw,
                                       const T* scales, const unsigned char* zeros,
                                       const int* perm, int kblocks, int ks, int gshift,
                                       int gstore, int n, void* out, int out_f32) {
    __shared__ float part[W4_MAX_KS][16][8];
    const int lane = threadIdx.x & 31, s = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int nt = blockIdx.x;
    const int r0 = blockIdx.y * 16;
    const int per = kblocks / ks;
    float acc[16];
#pragma unroll
    for (int r = 0; r < 16; ++r) acc[r] = 0.0f;
    for (int kb = s * per; kb < (s + 1) * per; ++kb) {
        const uint4 w = __ldg(qw + ((size_t)nt * kblocks + kb) * 32 + lane);
        float wf[32];
        int cols[32];
#pragma unroll
        for (int c = 0; c < 8; ++c) {
            float sc;
            int z;
            w4_scale_zero<T>(scales, zeros, nt, (kb * 8 + c) >> gshift, gstore, g, sc, z);
            const unsigned bits = w4_chunk_bits(w, c);
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                wf[4 * c + q] = round_to<T>((float)((int)((bits >> (4 * q)) & 15u) - z) * sc);
                const int col = kb * W4_KB + 16 * c + 2 * t + (q & 1) + (q >= 2 ? 8 : 0);
                cols[4 * c + q] = col < k ? (perm ? __ldg(perm + col) : col) : -1;
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
        if (col < n) w4_store<T>(out, out_f32, r0 + r, n, col, total);
    }
}

#define W4_ARGS(T)                                                                              \
    const T *x, int m, int k, const uint4 *qw, const T *scales, const unsigned char *zeros,     \
        const int *perm, int kblocks, int ks, int gshift, int gstore, int n, void *out,        \
        int out_f32
#define W4_PASS x, m, k, qw, scales, zeros, perm, kblocks, ks, gshift, gstore, n, out, out_f32

#define W4_TC_ENTRIES(SUF, T)                                                                   \
    extern "C" __global__ void __launch_bounds__(256, 4) w4_gemv_##SUF(W4_ARGS(T)) {           \
        w4_gemv<T>(W4_PASS);                                                                     \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(128) w4_gemm_##SUF(W4_ARGS(T)) {               \
        w4_gemm<T>(W4_PASS);                                                                     \
    }
W4_TC_ENTRIES(f16, __half)
W4_TC_ENTRIES(bf16, bf16_t)

#define W4_FMA_ENTRY(SUF, T)                                                                    \
    extern "C" __global__ void w4_fma_##SUF(W4_ARGS(T)) { w4_fma<T>(W4_PASS); }
KILN_FOR_FLOAT_TYPES(W4_FMA_ENTRY)
