// W4A16 GEMV for compressed-tensors `pack-quantized` int4 weights, dequantized in registers.
//
// Standalone (issue 10, step 6): not yet wired into the CUDA backend and NOT YET RUN ON A GPU;
// tests/cuda_kernels_compile.rs only checks that it compiles for sm_70..sm_90. The CPU reference it
// must match is src/quant/packed.rs (`dequantize_packed_row`) through
// src/backend/cpu/matmul/packed.rs.
//
// out[r, n] = sum_k x[r, k] * W[n, k], r < m <= 16 (decode rows), W [N, K] stored as
//   qweight  u32 [N, K/8]          nibble k%8 of word k/8 = q + 8 (low nibble first)
//   scales   T   [N, G]            G = ceil(K / group)
//   zeros    u32 [ceil(N/8), G]    nibble n%8 = zp + 8 (asymmetric), or nullptr (symmetric: 8)
//   g_idx    i32 [K]               group of column k (act-order), or nullptr (k / group)
//   W[n, k] = (u_q - u_zp) * scale[n, g(k)], computed exactly in f32.
// x: T [m, K]; out: T [m, N]; accumulation in f32. Requires K % 8 == 0.
//
// Launch: block = 32 * WARPS threads (one warp per output row), grid.x = ceil(N / WARPS).
// Lane l reads words l, l+32, ... of its row (128 coalesced bytes per warp step) and keeps one
// partial sum per activation row; a fixed xor-shuffle tree reduces them. The order of every sum
// depends only on k, never on m: a row's result does not depend on its batch (same numerics for
// 1 and 16 rows, the property the CPU reference has).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#define W4A16_MAX_ROWS 16

__device__ __forceinline__ float w4_to_f(__half v) { return __half2float(v); }
__device__ __forceinline__ float w4_to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ void w4_store(__half* p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ void w4_store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

template <typename T>
__device__ __forceinline__ void w4a16_gemv(const T* __restrict__ x, int m, int k,
                                           const unsigned* __restrict__ qweight,
                                           const T* __restrict__ scales,
                                           const unsigned* __restrict__ zeros,
                                           const int* __restrict__ g_idx, int group, int n,
                                           T* __restrict__ out) {
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= n || m <= 0 || m > W4A16_MAX_ROWS) return;
    const int words = k >> 3;
    const int groups = (k + group - 1) / group;
    const unsigned* wrow = qweight + (size_t)row * words;
    const T* srow = scales + (size_t)row * groups;
    const unsigned* zrow = zeros ? zeros + (size_t)(row >> 3) * groups : nullptr;
    const int zshift = 4 * (row & 7);
    float acc[W4A16_MAX_ROWS];
#pragma unroll
    for (int r = 0; r < W4A16_MAX_ROWS; ++r) acc[r] = 0.0f;
    for (int w = lane; w < words; w += 32) {
        const unsigned q = __ldg(wrow + w);
        const int k0 = w << 3;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int kk = k0 + j;
            const int g = g_idx ? __ldg(g_idx + kk) : kk / group;
            const float s = w4_to_f(srow[g]);
            const int zp = zrow ? (int)((__ldg(zrow + g) >> zshift) & 15u) : 8;
            const float wv = (float)((int)((q >> (4 * j)) & 15u) - zp) * s;
#pragma unroll
            for (int r = 0; r < W4A16_MAX_ROWS; ++r) {
                if (r < m) acc[r] = fmaf(wv, w4_to_f(x[(size_t)r * k + kk]), acc[r]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < W4A16_MAX_ROWS; ++r) {
        float v = acc[r];
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
        if (lane == 0 && r < m) w4_store(out + (size_t)r * n + row, v);
    }
}

extern "C" __global__ void w4a16_gemv_f16(const __half* x, int m, int k, const unsigned* qweight,
                                          const __half* scales, const unsigned* zeros,
                                          const int* g_idx, int group, int n, __half* out) {
    w4a16_gemv<__half>(x, m, k, qweight, scales, zeros, g_idx, group, n, out);
}

extern "C" __global__ void w4a16_gemv_bf16(const __nv_bfloat16* x, int m, int k,
                                           const unsigned* qweight, const __nv_bfloat16* scales,
                                           const unsigned* zeros, const int* g_idx, int group,
                                           int n, __nv_bfloat16* out) {
    w4a16_gemv<__nv_bfloat16>(x, m, k, qweight, scales, zeros, g_idx, group, n, out);
}
