// elementwise.cu: embedding gather, SiLU-gated product, residual add, dtype casts.
// Entry points: embedding_{f32,f16,bf16}, embedding_{f16,bf16}_to_f32, silu_mul_*, swiglu_*, swiglu_il_*, add_*,
// cast_f32_to_{f16,bf16}, cast_{f16,bf16}_to_f32, gpu_sleep (the profiler's gate), feed_tokens.

// out[t, :] = table[ids[t], :]; grid (n_tokens), block any; table [vocab, dim].
// The `_to_f32` variants write an f32 output (the model's f32 residual stream).
template <typename T, typename O>
__device__ void embedding(const int* ids, const T* table, O* out, int dim) {
    long t = blockIdx.x;
    long row = ids[t];
    for (int i = threadIdx.x; i < dim; i += blockDim.x)
        Io<O>::store(out, t * dim + i, Io<T>::load(table, row * dim + i));
}

// out[i] = silu(gate[i]) * up[i], computed in f32; all three are [n] (rows x intermediate_size).
// Programmatic dependent launch (sm_90+, when the host launches it with the attribute): it waits
// for the previous grid (griddepcontrol.wait) before touching memory, then lets the next start.
template <typename T>
__device__ void silu_mul(const T* gate, const T* up, T* out, long n) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float g = Io<T>::load(gate, i), u = Io<T>::load(up, i);
    Io<T>::store(out, i, g / (1.0f + expf(-g)) * u);
}

// The fused gate|up projection's product: gate_up is [rows, 2 * inter] (gate columns first, then
// up), out[r, i] = silu(gate_up[r, i]) * gate_up[r, inter + i] in f32; out is [rows, inter].
template <typename T>
__device__ void swiglu(const T* gate_up, T* out, long rows, int inter) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * inter) return;
    long r = i / inter, c = i % inter;
    const T* row = gate_up + r * 2 * inter;
    float g = Io<T>::load(row, c), u = Io<T>::load(row, inter + c);
    Io<T>::store(out, i, g / (1.0f + expf(-g)) * u);
}

// swiglu over the product of a gate|up weight interleaved for the mma SwiGLU epilogue (dense.rs:
// every 16 columns are gate columns 8j .. 8j + 8 then up columns 8j .. 8j + 8): the form cuBLAS
// produces from such a weight. The same values as swiglu on the stacked layout.
template <typename T>
__device__ void swiglu_il(const T* gate_up, T* out, long rows, int inter) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * inter) return;
    long r = i / inter, c = i % inter;
    const T* row = gate_up + r * 2 * inter + (c / 8) * 16 + c % 8;
    float g = Io<T>::load(row, 0), u = Io<T>::load(row, 8);
    Io<T>::store(out, i, g / (1.0f + expf(-g)) * u);
}

// x[i] += y[i]
template <typename T>
__device__ void add_inplace(T* x, const T* y, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    Io<T>::store(x, i, Io<T>::load(x, i) + Io<T>::load(y, i));
}

template <typename S, typename D>
__device__ void cast(const S* src, D* dst, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    Io<D>::store(dst, i, Io<S>::load(src, i));
}

#define ELEMENTWISE(SUF, T)                                                                        \
    extern "C" __global__ void embedding_##SUF(const int* ids, const T* table, T* out, int dim) {   \
        embedding<T, T>(ids, table, out, dim);                                                     \
    }                                                                                              \
    extern "C" __global__ void silu_mul_##SUF(const T* gate, const T* up, T* out, long n) {         \
        silu_mul<T>(gate, up, out, n);                                                             \
    }                                                                                              \
    extern "C" __global__ void swiglu_##SUF(const T* gate_up, T* out, long rows, int inter) {     \
        swiglu<T>(gate_up, out, rows, inter);                                                      \
    }                                                                                              \
    extern "C" __global__ void swiglu_il_##SUF(const T* gate_up, T* out, long rows, int inter) {  \
        swiglu_il<T>(gate_up, out, rows, inter);                                                   \
    }                                                                                              \
    extern "C" __global__ void add_##SUF(T* x, const T* y, long n) { add_inplace<T>(x, y, n); }
KILN_FOR_FLOAT_TYPES(ELEMENTWISE)

#define CASTS(SUF, T)                                                                               \
    extern "C" __global__ void cast_f32_to_##SUF(const float* s, T* d, long n) { cast<float, T>(s, d, n); } \
    extern "C" __global__ void cast_##SUF##_to_f32(const T* s, float* d, long n) { cast<T, float>(s, d, n); }
CASTS(f16, __half)
CASTS(bf16, bf16_t)

#define EMBEDDING_TO_F32(SUF, T)                                                                    \
    extern "C" __global__ void embedding_##SUF##_to_f32(const int* ids, const T* table, float* out, \
                                                        int dim) {                                  \
        embedding<T, float>(ids, table, out, dim);                                                  \
    }
EMBEDDING_TO_F32(f16, __half)
EMBEDDING_TO_F32(bf16, bf16_t)

// gpu_sleep: one thread spins on the global timer for `ns` nanoseconds, holding the stream: the
// profiler's gate (KILN_PROFILE_OPS), so a whole step is queued before the GPU starts it.
extern "C" __global__ void gpu_sleep(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}

// feed_tokens: a step's input tokens taken from the previous step's sampled ids on the device
// (overlap: the host built the step before those ids were known). pairs is [n, 2]: (token index
// into token_ids, index of its id in the sampler's output `src`); a failed row's id (< 0) feeds 0.
extern "C" __global__ void feed_tokens(int* token_ids, const int* src, const int* pairs, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int id = src[pairs[2 * i + 1]];
    token_ids[pairs[2 * i]] = id < 0 ? 0 : id;
}
