// kv_cache.cu: write new tokens' K and V into the paged cache, and copy whole blocks.
// Entry points: kv_write_{f32,f16,bf16}_{same,e5m2,e4m3}, kv_copy_block_{b1,b2,b4}.
//
// Cache layout per layer: [num_blocks, block_size, n_kv_heads, head_dim] in the storage type C.
// k, v: [n_tokens, n_kv_heads, head_dim] in the compute type T. slot_mapping[t] = block *
// block_size + offset, or -1 to skip the token. grid (n_tokens), block loops over n_kv_heads * head_dim.
template <typename T, typename C>
__device__ void kv_write(const T* k, const T* v, C* k_cache, C* v_cache, const int* slot_mapping,
                         int row_elems) {
    long t = blockIdx.x;
    long slot = slot_mapping[t];
    if (slot < 0) return;
    for (int i = threadIdx.x; i < row_elems; i += blockDim.x) {
        Io<C>::store(k_cache, slot * row_elems + i, Io<T>::load(k, t * row_elems + i));
        Io<C>::store(v_cache, slot * row_elems + i, Io<T>::load(v, t * row_elems + i));
    }
}

#define KV_WRITE(SUF, T)                                                                            \
    extern "C" __global__ void kv_write_##SUF##_same(const T* k, const T* v, T* kc, T* vc,          \
                                                     const int* slots, int row_elems) {             \
        kv_write<T, T>(k, v, kc, vc, slots, row_elems);                                             \
    }                                                                                               \
    extern "C" __global__ void kv_write_##SUF##_e5m2(const T* k, const T* v, E5M2* kc, E5M2* vc,    \
                                                     const int* slots, int row_elems) {             \
        kv_write<T, E5M2>(k, v, kc, vc, slots, row_elems);                                          \
    }                                                                                               \
    extern "C" __global__ void kv_write_##SUF##_e4m3(const T* k, const T* v, E4M3* kc, E4M3* vc,    \
                                                     const int* slots, int row_elems) {             \
        kv_write<T, E4M3>(k, v, kc, vc, slots, row_elems);                                          \
    }
KILN_FOR_FLOAT_TYPES(KV_WRITE)

// Copy block `src` to block `dst` in one layer's cache: `block_elems` elements of `bytes` bytes each
// (b1 = fp8, b2 = f16/bf16, b4 = f32). grid covers block_elems.
#define KV_COPY(SUF, U)                                                                             \
    extern "C" __global__ void kv_copy_block_##SUF(U* cache, long src, long dst, long block_elems) { \
        long i = (long)blockIdx.x * blockDim.x + threadIdx.x;                                       \
        if (i < block_elems) cache[dst * block_elems + i] = cache[src * block_elems + i];           \
    }
KV_COPY(b1, unsigned char)
KV_COPY(b2, unsigned short)
KV_COPY(b4, float)
