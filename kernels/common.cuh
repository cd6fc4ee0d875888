// common.cuh: device helpers shared by every kernel file. The registry (src/backend/cuda/kernels.rs)
// prepends this file to each .cu source before NVRTC compiles it, so no include path is needed for it.
//
// Storage types: `float`, `__half` (cuda_fp16.h, all archs) and `bf16_t` (raw bfloat16 bits in an
// unsigned short). bf16 is converted with integer bit operations so that the same code runs on
// sm_70/sm_75, which have no bf16 arithmetic; all math is done in f32.
// fp8 KV storage: `fp8e5m2_t` / `fp8e4m3_t` (raw bytes), converted in software for the same reason.
#pragma once
#include <cuda_fp16.h>

typedef unsigned short bf16_t;
typedef unsigned char fp8e5m2_t;
typedef unsigned char fp8e4m3_t;

#define WARP_SIZE 32
#define KILN_NEG_INF __int_as_float(0xff800000)

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f32_bf16(bf16_t x) { return __uint_as_float(((unsigned int)x) << 16); }

// Round-to-nearest-even f32 -> bf16 (NaN kept quiet).
__device__ __forceinline__ bf16_t f32_to_bf16(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16_t)((u >> 16) | 0x40u);
    unsigned int rounding = 0x7fffu + ((u >> 16) & 1u);
    return (bf16_t)((u + rounding) >> 16);
}

// e5m2 is the upper byte of an f16 (same exponent bias): round-to-nearest-even on the f16 bits.
__device__ __forceinline__ float fp8e5m2_to_f32(fp8e5m2_t x) {
    return __half2float(__ushort_as_half((unsigned short)x << 8));
}
__device__ __forceinline__ fp8e5m2_t f32_to_fp8e5m2(float f) {
    unsigned short h = __half_as_ushort(__float2half_rn(f));
    if ((h & 0x7fffu) > 0x7c00u) return (fp8e5m2_t)0x7f;  // NaN
    unsigned short rounding = 0x7fu + ((h >> 8) & 1u);
    unsigned int r = ((unsigned int)h + rounding) >> 8;
    // Saturate to the largest finite e5m2 (57344) instead of overflowing to inf.
    if ((r & 0x7fu) > 0x7bu) r = (r & 0x80u) | 0x7bu;
    return (fp8e5m2_t)r;
}

// e4m3 (OCP "fn" variant: bias 7, no infinities, 0x7f/0xff are NaN, max 448).
__device__ __forceinline__ float fp8e4m3_to_f32(fp8e4m3_t x) {
    unsigned int sign = (x & 0x80u) << 24;
    unsigned int exp = (x >> 3) & 0xfu;
    unsigned int man = x & 0x7u;
    float v;
    if (exp == 0) {
        v = (float)man * 0.001953125f;  // 2^-9: subnormal, man * 2^-3 * 2^-6
    } else if (exp == 0xf && man == 0x7) {
        return __uint_as_float(0x7fc00000u);
    } else {
        v = __uint_as_float(((exp + 120u) << 23) | (man << 20));
    }
    return __uint_as_float(__float_as_uint(v) | sign);
}
__device__ __forceinline__ fp8e4m3_t f32_to_fp8e4m3(float f) {
    unsigned int sign = (__float_as_uint(f) >> 24) & 0x80u;
    float a = fabsf(f);
    if (!(a == a)) return (fp8e4m3_t)(sign | 0x7fu);
    if (a >= 448.0f) return (fp8e4m3_t)(sign | 0x7eu);
    if (a < 0.015625f) {  // below 2^-6: subnormal steps of 2^-9
        int m = __float2int_rn(a * 512.0f);
        return (fp8e4m3_t)(sign | (unsigned int)m);  // m == 8 rolls into the smallest normal
    }
    unsigned int u = __float_as_uint(a);
    unsigned int rounding = 0x7ffffu + ((u >> 20) & 1u);
    u += rounding;
    unsigned int exp = (u >> 23) - 120u;
    unsigned int man = (u >> 20) & 0x7u;
    if (exp > 15u || (exp == 15u && man == 7u)) return (fp8e4m3_t)(sign | 0x7eu);
    return (fp8e4m3_t)(sign | (exp << 3) | man);
}

// Generic load/store through tag types so one template serves every storage type.
template <typename T> struct Io;
template <> struct Io<float> {
    static __device__ __forceinline__ float load(const float* p, long i) { return p[i]; }
    static __device__ __forceinline__ void store(float* p, long i, float v) { p[i] = v; }
};
template <> struct Io<__half> {
    static __device__ __forceinline__ float load(const __half* p, long i) { return __half2float(p[i]); }
    static __device__ __forceinline__ void store(__half* p, long i, float v) { p[i] = __float2half_rn(v); }
};
template <> struct Io<bf16_t> {
    static __device__ __forceinline__ float load(const bf16_t* p, long i) { return to_f32_bf16(p[i]); }
    static __device__ __forceinline__ void store(bf16_t* p, long i, float v) { p[i] = f32_to_bf16(v); }
};
// fp8 KV storage tags (distinct types so the two encodings cannot be mixed up).
struct E5M2 { unsigned char b; };
struct E4M3 { unsigned char b; };
template <> struct Io<E5M2> {
    static __device__ __forceinline__ float load(const E5M2* p, long i) { return fp8e5m2_to_f32(p[i].b); }
    static __device__ __forceinline__ void store(E5M2* p, long i, float v) { p[i].b = f32_to_fp8e5m2(v); }
};
template <> struct Io<E4M3> {
    static __device__ __forceinline__ float load(const E4M3* p, long i) { return fp8e4m3_to_f32(p[i].b); }
    static __device__ __forceinline__ void store(E4M3* p, long i, float v) { p[i].b = f32_to_fp8e4m3(v); }
};

// `v` rounded to the storage type T and read back as f32 (what a store then a load would give).
template <typename T> __device__ __forceinline__ float round_to(float v) {
    T tmp;
    Io<T>::store(&tmp, 0, v);
    return Io<T>::load(&tmp, 0);
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = WARP_SIZE / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = WARP_SIZE / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024). Every thread gets the result.
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float partial[32];
    int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    int nwarps = (blockDim.x + WARP_SIZE - 1) / WARP_SIZE;
    v = (lane < nwarps) ? partial[lane] : 0.0f;
    return warp_sum(v);
}

// THE RMSNORM OF THE f32 RESIDUAL STREAM (batch invariance across the fused / unfused layers):
// rms_norm.cu's f32-stream entry points and dense.cu's NORM prologue both take a row's 1 / rms
// through these two helpers, so a row normalized by the fused decode ops and the same row
// normalized by the unfused rms_norm give the same bits.
//
// Sum of squares of one f32 row `row[0 .. k)` by one warp, in a fixed order: lane l accumulates
// elements 4l .. 4l + 4, then 4l + 128 .. , ... (the float4s l, l + 32, ... of the row) from +0
// with explicitly rounded FMAs, element order within a float4, then the xor butterfly (warp_sum):
// every lane returns the same bits. The float4 loads (k a multiple of 4, row 16-byte aligned) and
// the scalar loads (anything else) perform the same operations in the same order. Plain loads (no
// __ldg / __restrict__): rms_norm.cu reads a row its block has just written.
__device__ __forceinline__ float rms_row_sumsq(const float* row, int k, int lane) {
    float ss = 0.0f;
    if ((k & 3) == 0 && (reinterpret_cast<unsigned long long>(row) & 15ull) == 0) {
        for (int i = lane * 4; i < k; i += WARP_SIZE * 4) {
            const float4 v = *reinterpret_cast<const float4*>(row + i);
            ss = __fmaf_rn(v.x, v.x, ss);
            ss = __fmaf_rn(v.y, v.y, ss);
            ss = __fmaf_rn(v.z, v.z, ss);
            ss = __fmaf_rn(v.w, v.w, ss);
        }
    } else {
        for (int i = lane * 4; i < k; i += WARP_SIZE * 4)
            for (int e = 0; e < 4 && i + e < k; ++e) ss = __fmaf_rn(row[i + e], row[i + e], ss);
    }
    return warp_sum(ss);
}

// 1 / rms of a row of `dim` elements from its sum of squares: rsqrt(ss / dim + eps), the division
// and the add explicitly rounded (the same instruction sequence wherever it is inlined).
__device__ __forceinline__ float rms_inv(float ss, int dim, float eps) {
    return rsqrtf(__fadd_rn(__fdiv_rn(ss, (float)dim), eps));
}

// Instantiate `NAME_<suffix>` entry points for the three compute/storage types.
#define KILN_FOR_FLOAT_TYPES(M) M(f32, float) M(f16, __half) M(bf16, bf16_t)

// D += A * B for one m16n8k16 tensor-core tile with f32 accumulators (the fragments as the PTX
// ISA lays them out: a[4] the 16 x 16 A tile, b0 / b1 the 16 x 8 B tile, d[4] the 16 x 8 D tile),
// T = __half or bf16_t. sm_80+: the host launches tensor-core kernels there only (traps below).
template <typename T>
__device__ __forceinline__ void mma_m16n8k16(float* d, const unsigned* a, unsigned b0, unsigned b1);
template <>
__device__ __forceinline__ void mma_m16n8k16<__half>(float* d, const unsigned* a, unsigned b0, unsigned b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    __trap();
#endif
}
template <>
__device__ __forceinline__ void mma_m16n8k16<bf16_t>(float* d, const unsigned* a, unsigned b0, unsigned b1) {
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
