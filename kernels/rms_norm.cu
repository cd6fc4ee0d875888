// rms_norm.cu: RMSNorm with an optional fused residual add.
// Entry points: rms_norm_{f32,f16,bf16}.
//
// One block per row of `dim` elements:
//   h = x + residual            (when residual != nullptr; h is written back to `residual`)
//   out = h / sqrt(mean(h^2) + eps) * weight
// The sum of squares is accumulated in f32, matching transformers' LlamaRMSNorm (which upcasts).
// Also used for Qwen3's per-head q_norm/k_norm with rows = tokens x heads and dim = head_dim.
template <typename T>
__device__ void rms_norm(const T* x, T* residual, const T* weight, T* out, int dim, float eps) {
    long row = blockIdx.x;
    const T* xr = x + row * dim;
    T* rr = residual ? residual + row * dim : nullptr;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        float h = Io<T>::load(xr, i);
        if (rr) {
            h += Io<T>::load(rr, i);
            Io<T>::store(rr, i, h);
        }
        ss += h * h;
    }
    ss = block_sum(ss);
    float inv = rsqrtf(ss / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) {
        // Re-read h: from the updated residual when fused, else from x. The stored residual is
        // rounded to T, as the unfused two-kernel path would also round it.
        float h = rr ? Io<T>::load(rr, i) : Io<T>::load(xr, i);
        Io<T>::store(out + row * dim, i, Io<T>::load(weight, i) * (h * inv));
    }
}

#define RMS_NORM(SUF, T)                                                                            \
    extern "C" __global__ void rms_norm_##SUF(const T* x, T* residual, const T* weight, T* out,     \
                                              int dim, float eps) {                                 \
        rms_norm<T>(x, residual, weight, out, dim, eps);                                            \
    }
KILN_FOR_FLOAT_TYPES(RMS_NORM)
