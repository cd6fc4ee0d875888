// kv_cache.cu: write new tokens' K and V into the paged cache, and copy whole blocks.
// Entry points: kv_write_{f32,f16,bf16}_{same,e5m2,e4m3}, kv_copy_block_{b1,b2,b4},
// qkv_rope_write_{f32,f16,bf16}_{same,e5m2,e4m3}.
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

// The fused attention input of one layer: per token, the q|k|v row of the fused projection is split
// by heads, q and k are optionally RMS-normed per head (Qwen3's q_norm / k_norm; null weights skip
// it), rotated (rope.cu's rotate_half over the first 2 * rot_half dims), q is written to q_out and
// k, v to the token's KV slot (slot -1: not written). Replaces rms_norm x2 + rope + kv_write, with
// the same roundings: the normed head is rounded to T (as rms_norm writes it), the rotated k is
// rounded to T and then to the cache type C (as rope then kv_write store it). For models without
// q/k norms and with full rotary, the fused decode layer does this in the q|k|v matmul's epilogue
// instead (dense.cu, NORM_ROPE), with the same bits.
//
// qkv: [n_tokens, (n_heads + 2 n_kv_heads) * head_dim] in T (q heads, then k heads, then v heads);
// q_out: [n_tokens, n_heads, head_dim] in T; caches [slots, n_kv_heads, head_dim] in C;
// q_norm, k_norm: [head_dim] in T or null. head_dim <= QKV_MAX_DIM.
// grid (n_tokens), block QKV_WARPS * 32: warp w takes heads w, w + QKV_WARPS, ... of the token.
#define QKV_WARPS 4
#define QKV_MAX_DIM 256
template <typename T, typename C>
__device__ void qkv_rope_write(const T* qkv, T* q_out, C* k_cache, C* v_cache, const int* positions,
                               const int* slot_mapping, const float* cos_table,
                               const float* sin_table, const T* q_norm, const T* k_norm,
                               int n_heads, int n_kv_heads, int head_dim, int rot_half, float eps) {
    __shared__ float buf[QKV_WARPS][QKV_MAX_DIM];
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    // Programmatic dependent launch (the backend may launch this kernel with it on sm_90):
    // nothing is read or written before the previous kernel (the q|k|v matmul) completes.
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
    const long t = blockIdx.x;
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const long pos = positions[t], slot = slot_mapping[t];
    const int heads = n_heads + 2 * n_kv_heads;
    const long row_elems = (long)n_kv_heads * head_dim;
    const T* row = qkv + t * heads * (long)head_dim;
    const float* cs = cos_table + pos * rot_half;
    const float* sn = sin_table + pos * rot_half;
    float* s = buf[warp];
    for (int h = warp; h < heads; h += QKV_WARPS) {
        const T* src = row + (long)h * head_dim;
        if (h >= n_heads + n_kv_heads) {  // v: straight into the cache
            if (slot < 0) continue;
            C* dst = v_cache + slot * row_elems + (long)(h - n_heads - n_kv_heads) * head_dim;
            for (int i = lane; i < head_dim; i += WARP_SIZE) Io<C>::store(dst, i, Io<T>::load(src, i));
            continue;
        }
        const bool is_q = h < n_heads;
        const T* nw = is_q ? q_norm : k_norm;
        float ss = 0.0f;
        for (int i = lane; i < head_dim; i += WARP_SIZE) {
            float x = Io<T>::load(src, i);
            s[i] = x;
            ss += x * x;
        }
        if (nw) {  // warp-uniform
            ss = warp_sum(ss);
            float inv = rsqrtf(ss / (float)head_dim + eps);
            for (int i = lane; i < head_dim; i += WARP_SIZE)
                s[i] = round_to<T>(Io<T>::load(nw, i) * (s[i] * inv));
        }
        __syncwarp();
        for (int i = lane; i < head_dim; i += WARP_SIZE) {
            float v = s[i];
            // Explicitly rounded products (no FMA contraction): the same bits as dense.cu's
            // NORM_ROPE epilogue, which fuses this op into the q|k|v matmul.
            if (i < rot_half) {
                v = __fsub_rn(__fmul_rn(s[i], cs[i]), __fmul_rn(s[i + rot_half], sn[i]));
            } else if (i < 2 * rot_half) {
                int p = i - rot_half;
                v = __fadd_rn(__fmul_rn(s[i], cs[p]), __fmul_rn(s[p], sn[p]));
            }
            if (is_q) {
                Io<T>::store(q_out + (t * n_heads + h) * (long)head_dim, i, v);
            } else if (slot >= 0) {
                Io<C>::store(k_cache + slot * row_elems + (long)(h - n_heads) * head_dim, i,
                             round_to<T>(v));
            }
        }
        __syncwarp();  // every lane has read s before the next head overwrites it
    }
}

#define QKV_ROPE_WRITE_ONE(SUF, T, CSUF, C)                                                          \
    extern "C" __global__ void __launch_bounds__(QKV_WARPS * WARP_SIZE) qkv_rope_write_##SUF##_##CSUF( \
        const T* qkv, T* q_out, C* kc, C* vc, const int* positions, const int* slots,               \
        const float* cos_table, const float* sin_table, const T* q_norm, const T* k_norm,           \
        int n_heads, int n_kv_heads, int head_dim, int rot_half, float eps) {                       \
        qkv_rope_write<T, C>(qkv, q_out, kc, vc, positions, slots, cos_table, sin_table, q_norm,    \
                             k_norm, n_heads, n_kv_heads, head_dim, rot_half, eps);                 \
    }
#define QKV_ROPE_WRITE(SUF, T)                                                                      \
    QKV_ROPE_WRITE_ONE(SUF, T, same, T)                                                             \
    QKV_ROPE_WRITE_ONE(SUF, T, e5m2, E5M2)                                                          \
    QKV_ROPE_WRITE_ONE(SUF, T, e4m3, E4M3)
KILN_FOR_FLOAT_TYPES(QKV_ROPE_WRITE)
