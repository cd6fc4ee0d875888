// gated_attention.cu: the pre-attention part of Qwen3.5's gated full attention, fused (issue 9
// item 5). Entry points gated_qkv_rope_write_{f32,f16,bf16}_{same,e5m2,e4m3}.
//
// Per token: q_proj's rows are [query | gate] per head; the query and k heads are RMS-normed per
// head with the zero-centred (1 + w) weights (w as stored, 1 + w formed in f32), rotated NeoX style
// over the first 2 * rot_half dims (partial RoPE; cos/sin tables [positions][rot_half]); q goes to
// q_out, the gate to gate_out, k and v to the token's KV slot (slot -1: not written). Replaces
// split_query_gate + rms_norm_1p x2 + rope + kv_write (HybridBackend's unfused composition, the
// CPU twin) with the same roundings: the normed head rounded to T (as rms_norm_1p stores it), the
// rotated k rounded to T and then to the cache type C (as rope then kv_write store it).
//
// qg [n_tokens, n_heads, 2 * head_dim], k, v [n_tokens, n_kv_heads, head_dim] in T; q_out
// [n_tokens, n_heads, head_dim], gate_out [n_tokens, n_heads * head_dim] in T; caches [slots,
// n_kv_heads, head_dim] in C; q_norm, k_norm [head_dim] in T. head_dim <= GQ_MAX_DIM.
// grid (n_tokens, ceil(heads / GQ_WARPS)), block GQ_WARPS * 32, heads = the token's n_heads q heads,
// then n_kv_heads k heads, then n_kv_heads v heads: warp w of block y takes head y * GQ_WARPS + w
// (and every GQ_WARPS * gridDim.y-th after it, for a smaller grid). A head's arithmetic is one
// warp's whatever the grid, so the bits do not depend on it.
#define GQ_WARPS 4
#define GQ_MAX_DIM 256

template <typename T, typename C>
__device__ void gated_qkv_rope_write(const T* qg, const T* k, const T* v, T* q_out, T* gate_out,
                                     C* k_cache, C* v_cache, const int* positions,
                                     const int* slot_mapping, const float* cos_table,
                                     const float* sin_table, const T* q_norm, const T* k_norm,
                                     int n_heads, int n_kv_heads, int head_dim, int rot_half,
                                     float eps) {
    __shared__ float buf[GQ_WARPS][GQ_MAX_DIM];
    const long t = blockIdx.x;
    const int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    const long pos = positions[t], slot = slot_mapping[t];
    const int heads = n_heads + 2 * n_kv_heads;
    const long row_elems = (long)n_kv_heads * head_dim;
    const float* cs = cos_table + pos * rot_half;
    const float* sn = sin_table + pos * rot_half;
    float* s = buf[warp];
    for (int h = blockIdx.y * GQ_WARPS + warp; h < heads; h += GQ_WARPS * gridDim.y) {
        if (h >= n_heads + n_kv_heads) {  // v: straight into the cache
            if (slot < 0) continue;
            const int kvh = h - n_heads - n_kv_heads;
            const T* src = v + (t * n_kv_heads + kvh) * (long)head_dim;
            C* dst = v_cache + slot * row_elems + (long)kvh * head_dim;
            for (int i = lane; i < head_dim; i += WARP_SIZE) Io<C>::store(dst, i, Io<T>::load(src, i));
            continue;
        }
        const bool is_q = h < n_heads;
        const T* src = is_q ? qg + (t * n_heads + h) * 2L * head_dim
                            : k + (t * n_kv_heads + (h - n_heads)) * (long)head_dim;
        if (is_q) {  // the gate half, as split_query_gate copies it
            const T* g = src + head_dim;
            T* dst = gate_out + (t * n_heads + h) * (long)head_dim;
            for (int i = lane; i < head_dim; i += WARP_SIZE) dst[i] = g[i];
        }
        const T* nw = is_q ? q_norm : k_norm;
        float ss = 0.0f;
        for (int i = lane; i < head_dim; i += WARP_SIZE) {
            float x = Io<T>::load(src, i);
            s[i] = x;
            ss += x * x;
        }
        ss = warp_sum(ss);
        const float inv = rsqrtf(ss / (float)head_dim + eps);
        for (int i = lane; i < head_dim; i += WARP_SIZE)
            s[i] = round_to<T>((1.0f + Io<T>::load(nw, i)) * (s[i] * inv));
        __syncwarp();
        for (int i = lane; i < head_dim; i += WARP_SIZE) {
            float val = s[i];
            if (i < rot_half) {
                val = s[i] * cs[i] - s[i + rot_half] * sn[i];
            } else if (i < 2 * rot_half) {
                int p = i - rot_half;
                val = s[i] * cs[p] + s[p] * sn[p];
            }
            if (is_q) {
                Io<T>::store(q_out + (t * n_heads + h) * (long)head_dim, i, val);
            } else if (slot >= 0) {
                Io<C>::store(k_cache + slot * row_elems + (long)(h - n_heads) * head_dim, i,
                             round_to<T>(val));
            }
        }
        __syncwarp();  // every lane has read s before the next head overwrites it
    }
}

#define GATED_QKV_ONE(SUF, T, CSUF, C)                                                                 \
    extern "C" __global__ void __launch_bounds__(GQ_WARPS * WARP_SIZE)                                 \
        gated_qkv_rope_write_##SUF##_##CSUF(                                                           \
            const T* qg, const T* k, const T* v, T* q_out, T* gate_out, C* kc, C* vc,                  \
            const int* positions, const int* slots, const float* cos_table, const float* sin_table,   \
            const T* q_norm, const T* k_norm, int n_heads, int n_kv_heads, int head_dim,              \
            int rot_half, float eps) {                                                                 \
        gated_qkv_rope_write<T, C>(qg, k, v, q_out, gate_out, kc, vc, positions, slots, cos_table,    \
                                   sin_table, q_norm, k_norm, n_heads, n_kv_heads, head_dim,          \
                                   rot_half, eps);                                                     \
    }
#define GATED_QKV(SUF, T)                                                                             \
    GATED_QKV_ONE(SUF, T, same, T)                                                                    \
    GATED_QKV_ONE(SUF, T, e5m2, E5M2)                                                                 \
    GATED_QKV_ONE(SUF, T, e4m3, E4M3)
KILN_FOR_FLOAT_TYPES(GATED_QKV)
