// dequant.cu: ggml block formats -> compute dtype, used once at load (issue 4 allows dequantizing
// GGUF weights at load; fused 4-bit GEMV/GEMM kernels come with the 4-bit issue).
// Entry points: dequant_{q8_0,q4_0,q4_1}_{f32,f16,bf16}.
//
// Layouts (32 elements per block, little-endian):
//   Q8_0: f16 d, int8 q[32]            x = d * q
//   Q4_0: f16 d, u8 qs[16]             x[j] = d * ((qs[j] & 15) - 8), x[j+16] = d * ((qs[j] >> 4) - 8)
//   Q4_1: f16 d, f16 m, u8 qs[16]      x[j] = d * (qs[j] & 15) + m,    x[j+16] = d * (qs[j] >> 4) + m
// One thread per output element; grid covers n_blocks * 32.
__device__ __forceinline__ float load_f16_unaligned(const unsigned char* p) {
    unsigned short bits = (unsigned short)p[0] | ((unsigned short)p[1] << 8);
    return __half2float(__ushort_as_half(bits));
}

template <typename T>
__device__ void dequant_q8_0(const unsigned char* src, T* out, long n_blocks) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_blocks * 32) return;
    const unsigned char* b = src + (i / 32) * 34;
    float d = load_f16_unaligned(b);
    Io<T>::store(out, i, d * (float)(signed char)b[2 + i % 32]);
}

template <typename T>
__device__ void dequant_q4_0(const unsigned char* src, T* out, long n_blocks) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_blocks * 32) return;
    const unsigned char* b = src + (i / 32) * 18;
    int j = i % 32;
    unsigned char q = b[2 + (j % 16)];
    int v = j < 16 ? (q & 15) : (q >> 4);
    Io<T>::store(out, i, load_f16_unaligned(b) * (float)(v - 8));
}

template <typename T>
__device__ void dequant_q4_1(const unsigned char* src, T* out, long n_blocks) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_blocks * 32) return;
    const unsigned char* b = src + (i / 32) * 20;
    int j = i % 32;
    unsigned char q = b[4 + (j % 16)];
    int v = j < 16 ? (q & 15) : (q >> 4);
    Io<T>::store(out, i, load_f16_unaligned(b) * (float)v + load_f16_unaligned(b + 2));
}

#define DEQUANT(SUF, T)                                                                             \
    extern "C" __global__ void dequant_q8_0_##SUF(const unsigned char* s, T* o, long nb) { dequant_q8_0<T>(s, o, nb); } \
    extern "C" __global__ void dequant_q4_0_##SUF(const unsigned char* s, T* o, long nb) { dequant_q4_0<T>(s, o, nb); } \
    extern "C" __global__ void dequant_q4_1_##SUF(const unsigned char* s, T* o, long nb) { dequant_q4_1<T>(s, o, nb); }
KILN_FOR_FLOAT_TYPES(DEQUANT)
