// dense.cu: out = x · wᵀ for dense 16-bit weights (the CUDA matmul with KILN_DENSE_MATMUL=1), with
// ONE reduction order per output element whatever the number of rows, so a token's result does
// not depend on its batch (1 row, 64 rows or 1 000 rows give the same bits for that row).
// Entry points: dense_xwt_{f16,bf16} (output in the compute type), dense_xwt_{f16,bf16}_f32
// (f32 output: the lm_head's logits).
//
// x: [m, k], w: [n, k] (row-major, k a multiple of 8, both 16-byte aligned), out: [m, n].
// Grid (ceil(n / DENSE_WARPS), ceil(m / DENSE_ROWS)), block DENSE_WARPS warps. Warp `w` of a block
// owns output column `col`; lane `l` reads w[col, 8l + 256j .. +8] with one 128-bit load per j and
// keeps one f32 accumulator per row of the block's DENSE_ROWS-row tile, updated with fmaf over the
// 8 elements in order, j ascending. The 32 lane sums are then added by a fixed xor butterfly.
// Every step of a row's sum depends only on that row and the weight, never on the other rows of
// the tile or on m: that is the batch invariance. A weight row is read once per row tile (the
// tiles after the first hit L2 for these small matrices).
#define DENSE_ROWS 8
#define DENSE_WARPS 4

__device__ __forceinline__ void unpack8(uint4 v, float* f, __half) {
    unsigned int u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        f[2 * i] = __half2float(__ushort_as_half((unsigned short)(u[i] & 0xffffu)));
        f[2 * i + 1] = __half2float(__ushort_as_half((unsigned short)(u[i] >> 16)));
    }
}

__device__ __forceinline__ void unpack8(uint4 v, float* f, bf16_t) {
    unsigned int u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        f[2 * i] = __uint_as_float(u[i] << 16);
        f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
    }
}

template <typename T, typename O>
__device__ void dense_xwt(const T* __restrict__ x, const T* __restrict__ w, O* __restrict__ out,
                          int m, int n, int k) {
    int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    int col = blockIdx.x * DENSE_WARPS + warp;
    int row0 = blockIdx.y * DENSE_ROWS;
    if (col >= n) return;
    int rows = min(DENSE_ROWS, m - row0);
    float acc[DENSE_ROWS];
#pragma unroll
    for (int r = 0; r < DENSE_ROWS; ++r) acc[r] = 0.0f;
    const T* wr = w + (long)col * k;
    const T* xr = x + (long)row0 * k;
    for (int k0 = lane * 8; k0 < k; k0 += WARP_SIZE * 8) {
        float wf[8];
        unpack8(*reinterpret_cast<const uint4*>(wr + k0), wf, T());
#pragma unroll
        for (int r = 0; r < DENSE_ROWS; ++r) {
            if (r < rows) {
                float xf[8];
                unpack8(*reinterpret_cast<const uint4*>(xr + (long)r * k + k0), xf, T());
                float s = acc[r];
#pragma unroll
                for (int e = 0; e < 8; ++e) s = fmaf(xf[e], wf[e], s);
                acc[r] = s;
            }
        }
    }
#pragma unroll
    for (int r = 0; r < DENSE_ROWS; ++r) {
        float v = acc[r];
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
        if (lane == 0 && r < rows) Io<O>::store(out, (long)(row0 + r) * n + col, v);
    }
}

#define DENSE(SUF, T)                                                                               \
    extern "C" __global__ void dense_xwt_##SUF(const T* x, const T* w, T* out, int m, int n, int k) { \
        dense_xwt<T, T>(x, w, out, m, n, k);                                                        \
    }                                                                                               \
    extern "C" __global__ void dense_xwt_##SUF##_f32(const T* x, const T* w, float* out, int m,     \
                                                     int n, int k) {                                \
        dense_xwt<T, float>(x, w, out, m, n, k);                                                    \
    }
DENSE(f16, __half)
DENSE(bf16, bf16_t)
