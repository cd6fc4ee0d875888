// rms_norm.cu: RMSNorm with an optional fused residual add.
// Entry points: rms_norm_{f32,f16,bf16} (x, residual, weight, out all in the compute type T),
// rms_norm_{f16,bf16}_rf32 (residual in f32: x is the delta in T), rms_norm_{f16,bf16}_xf32
// (x in f32, no residual: the first norm of an f32 residual stream).
//
// BATCH INVARIANCE. The f32-stream entry points (_rf32, _xf32) are the llama runner's unfused
// norms (rms_norm / add_rms_norm of the f32 residual); dense.cu's NORM prologue (the fused decode
// ops) normalizes the same rows. Both take a row's 1 / rms through common.cuh's rms_row_sumsq
// (one warp, a fixed order) and rms_inv, and write T(w · (h · inv)), so a row gets the same bits
// in a fused (small) step and in an unfused (large) one. The all-T entry points keep the block
// reduction below: they serve f32 compute and Qwen3's per-head q/k norms, which the fused ops
// never replace.
//
// One block per row of `dim` elements:
//   h = x + residual            (when residual != nullptr; h is written back to `residual`)
//   out = h / sqrt(mean(h^2) + eps) * weight
// Keeping the residual stream in f32 (the model does) costs a few bytes per token and keeps
// 16-bit compute from rounding (or, in fp16, overflowing) the running sum of every layer.
// The sum of squares is accumulated in f32, matching transformers' LlamaRMSNorm (which upcasts).
// Also used for Qwen3's per-head q_norm/k_norm with rows = tokens x heads and dim = head_dim.
template <typename T, typename X, typename R>
__device__ void rms_norm(const X* x, R* residual, const T* weight, T* out, int dim, float eps) {
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
        // Re-read h: from the updated residual when fused, else from x. The stored residual is
        // rounded to R, as the unfused two-kernel path would also round it.
        float h = rr ? Io<R>::load(rr, i) : Io<X>::load(xr, i);
        Io<T>::store(out + row * dim, i, Io<T>::load(weight, i) * (h * inv));
    }
}

#define RMS_NORM(SUF, T)                                                                            \
    extern "C" __global__ void rms_norm_##SUF(const T* x, T* residual, const T* weight, T* out,     \
                                              int dim, float eps) {                                 \
        rms_norm<T, T, T>(x, residual, weight, out, dim, eps);                                      \
    }
KILN_FOR_FLOAT_TYPES(RMS_NORM)


// The f32-stream norm (see the header): h = x + residual is written to the residual first (rf32;
// the block's writes are visible after the barrier), then warp 0 sums the squares of the row as
// stored, in rms_row_sumsq's order, and broadcasts 1 / rms through shared memory. Without a
// residual (xf32) h is x itself, which must then be f32 (X = float); the host never launches the
// rf32 entry points without a residual, and such a call falls back to the generic kernel.
template <typename T, typename X>
__device__ void rms_norm_stream(const X* x, float* residual, const T* weight, T* out, int dim,
                                float eps) {
    __shared__ float inv_shared;
    const long row = blockIdx.x;
    const X* xr = x + row * dim;
    const float* h;
    if (residual) {
        float* rr = residual + row * dim;
        for (int i = threadIdx.x; i < dim; i += blockDim.x)
            rr[i] = Io<X>::load(xr, i) + Io<float>::load(rr, i);
        __syncthreads();
        h = rr;
    } else {
        h = reinterpret_cast<const float*>(xr);
    }
    if (threadIdx.x < WARP_SIZE) {
        const float ss = rms_row_sumsq(h, dim, threadIdx.x);
        if (threadIdx.x == 0) inv_shared = rms_inv(ss, dim, eps);
    }
    __syncthreads();
    const float inv = inv_shared;
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        Io<T>::store(out + row * dim, i, Io<T>::load(weight, i) * (h[i] * inv));
}

#define RMS_NORM_F32_STREAM(SUF, T)                                                                 \
    extern "C" __global__ void rms_norm_##SUF##_rf32(const T* x, float* residual, const T* weight,  \
                                                     T* out, int dim, float eps) {                  \
        if (residual)                                                                               \
            rms_norm_stream<T, T>(x, residual, weight, out, dim, eps);                              \
        else                                                                                        \
            rms_norm<T, T, float>(x, residual, weight, out, dim, eps);                              \
    }                                                                                               \
    extern "C" __global__ void rms_norm_##SUF##_xf32(const float* x, float* residual,               \
                                                     const T* weight, T* out, int dim, float eps) { \
        rms_norm_stream<T, float>(x, residual, weight, out, dim, eps);                              \
    }
RMS_NORM_F32_STREAM(f16, __half)
RMS_NORM_F32_STREAM(bf16, bf16_t)
