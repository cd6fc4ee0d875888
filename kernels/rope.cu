// rope.cu: rotary position embedding, Hugging Face "rotate_half" (NeoX) layout, in place on q and k.
// Entry points: rope_{f32,f16,bf16}.
//
// q: [n_tokens, n_heads, head_dim], k: [n_tokens, n_kv_heads, head_dim], positions: [n_tokens].
// For pair i < rot_dim/2 of each head: inv_freq = theta^(-2i/rot_dim) (f32, as transformers computes
// it), angle = pos * inv_freq (f32 product), then
//   x[i]' = x[i] cos - x[i + rot_dim/2] sin,  x[i + rot_dim/2]' = x[i + rot_dim/2] cos + x[i] sin.
// Dims >= rot_dim pass through (partial rotary, used by Qwen3.5).
// grid (n_tokens), block covers (n_heads + n_kv_heads) * rot_dim/2 pairs in a loop.
template <typename T>
__device__ void rope(T* q, T* k, const int* positions, int n_heads, int n_kv_heads, int head_dim,
                     int rot_dim, float theta) {
    long t = blockIdx.x;
    float pos = (float)positions[t];
    int half_rot = rot_dim / 2;
    int pairs = (n_heads + n_kv_heads) * half_rot;
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
        int head = p / half_rot, i = p % half_rot;
        T* base = head < n_heads ? q + (t * n_heads + head) * (long)head_dim
                                 : k + (t * n_kv_heads + (head - n_heads)) * (long)head_dim;
        float inv_freq = 1.0f / powf(theta, (float)(2 * i) / (float)rot_dim);
        float angle = pos * inv_freq;
        float c = cosf(angle), s = sinf(angle);
        float x1 = Io<T>::load(base, i), x2 = Io<T>::load(base, i + half_rot);
        Io<T>::store(base, i, x1 * c - x2 * s);
        Io<T>::store(base, i + half_rot, x2 * c + x1 * s);
    }
}

#define ROPE(SUF, T)                                                                                \
    extern "C" __global__ void rope_##SUF(T* q, T* k, const int* positions, int n_heads,            \
                                          int n_kv_heads, int head_dim, int rot_dim, float theta) { \
        rope<T>(q, k, positions, n_heads, n_kv_heads, head_dim, rot_dim, theta);                     \
    }
KILN_FOR_FLOAT_TYPES(ROPE)
