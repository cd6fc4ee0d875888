// rms_norm.cu: RMSNorm with an optional fused residual add.
// Entry points: rms_norm_{f32,f16,bf16} (x, residual, weight, out all in the compute type T),
// rms_norm_{f16,bf16}_rf32 (residual in f32: x is the delta in T), rms_norm_{f16,bf16}_xf32
// (x in f32, no residual: the first norm of an f32 residual stream).
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

#define RMS_NORM_F32_STREAM(SUF, T)                                                                 \
    extern "C" __global__ void rms_norm_##SUF##_rf32(const T* x, float* residual, const T* weight,  \
                                                     T* out, int dim, float eps) {                  \
        rms_norm<T, T, float>(x, residual, weight, out, dim, eps);                                  \
    }                                                                                               \
    extern "C" __global__ void rms_norm_##SUF##_xf32(const float* x, float* residual,               \
                                                     const T* weight, T* out, int dim, float eps) { \
        rms_norm<T, float, float>(x, residual, weight, out, dim, eps);                              \
    }
RMS_NORM_F32_STREAM(f16, __half)
RMS_NORM_F32_STREAM(bf16, bf16_t)
