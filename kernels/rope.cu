// rope.cu: rotary position embedding, Hugging Face "rotate_half" (NeoX) layout, in place on q and k.
// Entry points: rope_{f32,f16,bf16}.
//
// q: [n_tokens, n_heads, head_dim], k: [n_tokens, n_kv_heads, head_dim], positions: [n_tokens].
// cos, sin: [max_positions, rot_half] (f32), computed once on the host by backend::rope so every
// backend rotates with the same values. For pair i < rot_half of each head:
//   x[i]' = x[i] cos - x[i + rot_half] sin,  x[i + rot_half]' = x[i + rot_half] cos + x[i] sin.
// Dims >= 2 * rot_half pass through (partial rotary, used by Qwen3.5).
// grid (n_tokens), block loops over (n_heads + n_kv_heads) * rot_half pairs.
template <typename T>
__device__ void rope(T* q, T* k, const int* positions, const float* cos_table,
                     const float* sin_table, int n_heads, int n_kv_heads, int head_dim,
                     int rot_half) {
    long t = blockIdx.x;
    long pos = positions[t];
    int pairs = (n_heads + n_kv_heads) * rot_half;
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
        int head = p / rot_half, i = p % rot_half;
        T* base = head < n_heads ? q + (t * n_heads + head) * (long)head_dim
                                 : k + (t * n_kv_heads + (head - n_heads)) * (long)head_dim;
        float c = cos_table[pos * rot_half + i], s = sin_table[pos * rot_half + i];
        float x1 = Io<T>::load(base, i), x2 = Io<T>::load(base, i + rot_half);
        // Explicitly rounded products (no FMA contraction): the same bits as kv_cache.cu's
        // qkv_rope_write and dense.cu's NORM_ROPE epilogue for the same rounded inputs.
        Io<T>::store(base, i, __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s)));
        Io<T>::store(base, i + rot_half, __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s)));
    }
}

#define ROPE(SUF, T)                                                                                \
    extern "C" __global__ void rope_##SUF(T* q, T* k, const int* positions, const float* cos_table, \
                                          const float* sin_table, int n_heads, int n_kv_heads,      \
                                          int head_dim, int rot_half) {                             \
        rope<T>(q, k, positions, cos_table, sin_table, n_heads, n_kv_heads, head_dim, rot_half);    \
    }
KILN_FOR_FLOAT_TYPES(ROPE)
