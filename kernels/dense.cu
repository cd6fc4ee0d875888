// dense.cu: out = x · wᵀ for dense 16-bit weights (the CUDA matmul with KILN_DENSE_MATMUL=1), with
// ONE reduction order per output element whatever the number of rows, so a token's result does
// not depend on its batch (1 row, 64 rows or 1 000 rows give the same bits for that row).
// Entry points: dense_xwt_{f16,bf16} (output in the compute type), dense_xwt_{f16,bf16}_f32
// (f32 output: the lm_head's logits); the small tensor-core kernels dense_mma_small_rg* with their
// prologues / epilogues (NORM, SWIGLU, RES, and NORM + ROPE: the q|k|v projection with RoPE and
// the KV-cache write in its epilogue, dense_mma_small_rg*_norm_rope_{t}_{c}).
//
// x: [m, k], w: [n, k] (row-major, k a multiple of 8, both 16-byte aligned), out: [m, n].
// Grid (ceil(n / DENSE_WARPS), ceil(m / DENSE_ROWS)), block DENSE_WARPS warps. Warp `w` of a block
// owns output column `col`; lane `l` reads w[col, 8l + 256j .. +8] with one 128-bit load per j and
// keeps one f32 accumulator per row of the block's DENSE_ROWS-row tile, updated with fmaf over the
// 8 elements in order, j ascending. The 32 lane sums are then added by a fixed xor butterfly.
// Every step of a row's sum depends only on that row and the weight, never on the other rows of
// the tile or on m: that is the batch invariance. A weight row is read once per row tile (the
// tiles after the first hit L2 for these small matrices).
#define DENSE_ROWS 8
#define DENSE_WARPS 4

// The PDL helpers (pdl_wait, pdl_launch_dependents) and the tensor-core helpers dmma, dmma_block
// and dmma_store are in dense_common.cuh, prepended to this file (shared with dense_gemm.cu).

__device__ __forceinline__ void unpack8(uint4 v, float* f, __half) {
    unsigned int u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        f[2 * i] = __half2float(__ushort_as_half((unsigned short)(u[i] & 0xffffu)));
        f[2 * i + 1] = __half2float(__ushort_as_half((unsigned short)(u[i] >> 16)));
    }
}

__device__ __forceinline__ void unpack8(uint4 v, float* f, bf16_t) {
    unsigned int u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        f[2 * i] = __uint_as_float(u[i] << 16);
        f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
    }
}

template <typename T, typename O>
__device__ void dense_xwt(const T* __restrict__ x, const T* __restrict__ w, O* __restrict__ out,
                          int m, int n, int k) {
    pdl_wait();
    int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    int col = blockIdx.x * DENSE_WARPS + warp;
    int row0 = blockIdx.y * DENSE_ROWS;
    if (col >= n) return;
    int rows = min(DENSE_ROWS, m - row0);
    float acc[DENSE_ROWS];
#pragma unroll
    for (int r = 0; r < DENSE_ROWS; ++r) acc[r] = 0.0f;
    const T* wr = w + (long)col * k;
    const T* xr = x + (long)row0 * k;
    for (int k0 = lane * 8; k0 < k; k0 += WARP_SIZE * 8) {
        float wf[8];
        unpack8(*reinterpret_cast<const uint4*>(wr + k0), wf, T());
#pragma unroll
        for (int r = 0; r < DENSE_ROWS; ++r) {
            if (r < rows) {
                float xf[8];
                unpack8(*reinterpret_cast<const uint4*>(xr + (long)r * k + k0), xf, T());
                float s = acc[r];
#pragma unroll
                for (int e = 0; e < 8; ++e) s = fmaf(xf[e], wf[e], s);
                acc[r] = s;
            }
        }
    }
#pragma unroll
    for (int r = 0; r < DENSE_ROWS; ++r) {
        float v = acc[r];
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
        if (lane == 0 && r < rows) Io<O>::store(out, (long)(row0 + r) * n + col, v);
    }
}

#define DENSE(SUF, T)                                                                               \
    extern "C" __global__ void dense_xwt_##SUF(const T* x, const T* w, T* out, int m, int n, int k) { \
        dense_xwt<T, T>(x, w, out, m, n, k);                                                        \
    }                                                                                               \
    extern "C" __global__ void dense_xwt_##SUF##_f32(const T* x, const T* w, float* out, int m,     \
                                                     int n, int k) {                                \
        dense_xwt<T, float>(x, w, out, m, n, k);                                                    \
    }
DENSE(f16, __half)
DENSE(bf16, bf16_t)

// ---------------------------------------------------------------------------------------------
// THE TENSOR-CORE VARIANTS (sm_80+, f16 / bf16): dense_mma_small_{t}[_f32] and
// dense_mma_large_{t}[_f32], and their SwiGLU-epilogue twins dense_mma_{small,large}_swiglu_{t}.
//
// MMA OPERANDS AND K ORDER. out^T = W x^T: W is the A operand of mma.m16n8k16 (16 outputs x 16 k,
// row-major as stored), x the B operand (16 k x 8 rows, "col": row r of x is column r of B). K is
// walked in k blocks of 32 columns; lane l = 4g + t reads the 8 columns kb*32 + 8t .. +8 of weight
// rows n0 + g and n0 + g + 8 and of x row g of each 8-row group, one 128-bit load each. Chunk c
// (0, 1) of a block is one mma whose k index 2t, 2t+1 is column 8t + 4c, +1 and whose k index
// 8 + 2t, 9 + 2t is column 8t + 4c + 2, +3 (the same assignment for A and B: the same products).
// Columns >= k and outputs >= n read as 0 (k % 8 == 0: a 128-bit word is all in or all out).
//
// ONE NUMERIC PATH FOR EVERY ROW COUNT. K is cut into slices of `sb` k blocks (a function of K
// alone, chosen by the host: dense.rs); slice s accumulates its blocks in ascending order, chunk 0
// then 1, from +0 into P_s (f32, mma accumulation), and the output is ((+0 + P_0) + P_1) + ... in
// f32. Both kernels perform exactly these operations per output element; an output element's
// mma lane depends only on its own weight row and x row, so a row's result does not depend on m,
// on the other rows, or on the kernel (tests/cuda_dense.rs checks rows 1..257 bit for bit).
//   small: grid (ceil(n / 16), ceil(m / (8 RG))), block S = ceil(kb / sb) warps, warp s = slice s
//          of one 16-output x 8RG-row tile; the S partial tiles go through dynamic shared memory
//          (S x RG x 128 floats; rg8 with 16 slices: 64 KiB, allowed by the host) and are summed
//          in slice order. A slice is 4 blocks for K <= 2048; its weight words are loaded before
//          the PDL wait and its x words for 4 blocks (rg8: 2) at once (DMMA_BPRE), so a 1..32-row
//          step is about one memory round trip after the wait. RG = 1, 2, 4, 8 (8..64-row tiles).
//   large: grid (ceil(n / 128), ceil(m / 64)), block 8 warps; warp w owns outputs n0 + 16w .. +16
//          and all 64 rows (8 row groups); slices one after another, each added into the total.
// SWIGLU. For the fused gate|up weight interleaved at load (dense.rs: every 16-row tile is gate
// rows 8i .. 8i+8 then up rows 8i .. 8i+8), the D fragment of a lane holds gate (d0, d1) and up
// (d2, d3) of the same intermediate column and rows: the epilogue rounds both to T and writes
// T(silu(g) * u) into out [m, n / 2], exactly what the unfused matmul + swiglu_* computes.

// Row `r` (< rows) of a [rows, k] 16-bit matrix, columns col .. col + 8 as one 128-bit word; 0
// outside it.
__device__ __forceinline__ uint4 dmma_ld(const unsigned short* __restrict__ p, int r, int rows,
                                         int col, int k) {
    if (r >= rows || col >= k) return make_uint4(0u, 0u, 0u, 0u);
    return __ldg(reinterpret_cast<const uint4*>(p + (long)r * k + col));
}

// The A fragments of k blocks c0 .. c0 + 4 (those < kb1; zeros past it) for weight rows lo
// (fragment outputs g) and hi (g + 8) of w [n, k], lane column 8t of each block.
__device__ __forceinline__ void dmma_ld_a4(const unsigned short* __restrict__ w, int lo, int hi,
                                           int n, int k, int c0, int kb1, int t, uint4* a_lo,
                                           uint4* a_hi) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int col = (c0 + j) * 32 + 8 * t;
        const bool in = c0 + j < kb1;
        a_lo[j] = in ? dmma_ld(w, lo, n, col, k) : make_uint4(0u, 0u, 0u, 0u);
        a_hi[j] = in ? dmma_ld(w, hi, n, col, k) : make_uint4(0u, 0u, 0u, 0u);
    }
}

// The 16-bit bits of `v` rounded to T.
template <typename T>
__device__ __forceinline__ unsigned int dmma_bits(float v) {
    T tmp;
    Io<T>::store(&tmp, 0, v);
    return (unsigned int)*reinterpret_cast<unsigned short*>(&tmp);
}

// NORM's B operand: columns col .. col + 8 of row r of h = rms_norm(x) · nw, computed from the f32
// residual row x[r] and its 1 / rms `inv` exactly as rms_norm.cu writes h (T(nw · (x · inv)));
// 0 outside [rows, k]. dmma_ld_norm_w takes the norm weight's word nwv = nw[col .. col + 8]
// already loaded (the early loads before the wait); dmma_ld_norm loads it.
template <typename T>
__device__ __forceinline__ uint4 dmma_ld_norm_w(const float* __restrict__ x, uint4 nwv, int r,
                                                int rows, int col, int k, float inv) {
    if (r >= rows || col >= k) return make_uint4(0u, 0u, 0u, 0u);
    const float4 x0 = *reinterpret_cast<const float4*>(x + (long)r * k + col);
    const float4 x1 = *reinterpret_cast<const float4*>(x + (long)r * k + col + 4);
    float wf[8];
    unpack8(nwv, wf, T());
    const float xf[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
    unsigned int u[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
        u[i] = dmma_bits<T>(wf[2 * i] * (xf[2 * i] * inv)) |
               (dmma_bits<T>(wf[2 * i + 1] * (xf[2 * i + 1] * inv)) << 16);
    return make_uint4(u[0], u[1], u[2], u[3]);
}

template <typename T>
__device__ __forceinline__ uint4 dmma_ld_norm(const float* __restrict__ x,
                                              const unsigned short* __restrict__ nw, int r,
                                              int rows, int col, int k, float inv) {
    if (r >= rows || col >= k) return make_uint4(0u, 0u, 0u, 0u);
    return dmma_ld_norm_w<T>(x, __ldg(reinterpret_cast<const uint4*>(nw + col)), r, rows, col, k,
                             inv);
}

// MODE of the small kernel. PLAIN: x is [m, k] in T. NORM: x is the f32 residual stream [m, k] and
// the block RMS-normalizes its own rows (weight nw [k], eps) before the product: the prologue that
// replaces a separate (add_)rms_norm launch; each row's sum of squares is taken by one warp in a
// fixed order (lane-strided float4s, then the xor butterfly), so it depends on that row alone. RES:
// out is the f32 residual stream [m, n] and receives out += T(product) (the epilogue that replaces
// the residual half of add_rms_norm). The product itself is the same in every mode.
#define DMMA_PLAIN 0
#define DMMA_NORM 1
#define DMMA_RES 2
#define DMMA_NORM_ROPE 3

// NORM_ROPE: the NORM prologue, then kv_cache.cu's qkv_rope_write in the epilogue (for a model
// without per-head q/k norms, head_dim = 2 · rot_half, rot_half a multiple of 8). The weight is
// the ordinary q|k|v matrix [(n_heads + 2 n_kv_heads) · head_dim, k]; only the map from tiles to
// its rows changes: tile b (16 outputs) of head h = b / (rot_half / 8), part p = b % (rot_half / 8)
// takes rows h · head_dim + 8p + g (fragment outputs g = 0..7) and h · head_dim + rot_half + 8p + g
// (outputs g + 8), so every lane holds both halves of a rotated pair, as the SWIGLU epilogue
// holds gate and up. Each output is the same dot product, in the same order, as the plain kernel's
// (the A rows are just fetched from elsewhere), so the rounded q|k|v value equals the matmul's.
// The epilogue then does what qkv_rope_write does to that value, with the same roundings and the
// same explicitly rounded products (no contraction into FMAs, in both kernels): q rotated into
// q_out [m, n_heads, head_dim] in T, k rotated, rounded to T and stored in the cache type C at the
// token's slot, v rounded to T and stored in C (slot -1: no k / v write).
struct DmmaRope {
    void* k_cache;
    void* v_cache;
    const int* positions;
    const int* slots;
    const float* cos_table;
    const float* sin_table;
    int n_heads, n_kv_heads, head_dim, rot_half;
};

// The weight row of output j (0..15) of tile `tile` in the NORM_ROPE layout.
__device__ __forceinline__ int dmma_rope_row(const DmmaRope& rp, int tile, int j) {
    const int tph = rp.rot_half / 8;
    const int h = tile / tph, p = tile % tph;
    return h * rp.head_dim + (j >= 8 ? rp.rot_half : 0) + 8 * p + (j & 7);
}

// Store the rotated pair of D-fragment element i (0, 1) of tile `tile`: v is head dim d = 8p + g,
// u is dim d + rot_half, of row row0 + 2t + i.
template <typename T, typename C>
__device__ __forceinline__ void dmma_store_rope(T* __restrict__ q_out, const DmmaRope& rp, int m,
                                                int tile, int row0, int lane, int i, float v,
                                                float u) {
    const int g = lane >> 2, t = lane & 3;
    const int row = row0 + 2 * t + (i & 1);
    if (row >= m) return;
    const int nh = rp.n_heads, nkv = rp.n_kv_heads, hd = rp.head_dim, rh = rp.rot_half;
    const int tph = rh / 8;
    const int h = tile / tph, d = 8 * (tile % tph) + g;
    const float x1 = round_to<T>(v), x2 = round_to<T>(u);
    const long slot = rp.slots[row];
    const long row_elems = (long)nkv * hd;
    if (h >= nh + nkv) {  // v: into the cache as the matmul rounded it
        if (slot < 0) return;
        C* dst = reinterpret_cast<C*>(rp.v_cache) + slot * row_elems + (long)(h - nh - nkv) * hd;
        Io<C>::store(dst, d, x1);
        Io<C>::store(dst, d + rh, x2);
        return;
    }
    const long pos = rp.positions[row];
    const float c = rp.cos_table[pos * rh + d], s = rp.sin_table[pos * rh + d];
    const float o1 = __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
    const float o2 = __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
    if (h < nh) {
        T* dst = q_out + ((long)row * nh + h) * hd;
        Io<T>::store(dst, d, o1);
        Io<T>::store(dst, d + rh, o2);
    } else if (slot >= 0) {
        C* dst = reinterpret_cast<C*>(rp.k_cache) + slot * row_elems + (long)(h - nh) * hd;
        Io<C>::store(dst, d, round_to<T>(o1));
        Io<C>::store(dst, d + rh, round_to<T>(o2));
    }
}

// The small kernel's early loads of the norm weight (NORM) and of the residual (RES); off with
// -DKILN_DENSE_NO_PREFETCH (KILN_DENSE_PREFETCH=0, a measurement switch: the same bits).
#ifdef KILN_DENSE_NO_PREFETCH
#define DMMA_PREFETCH false
#else
#define DMMA_PREFETCH true
#endif

// The small kernel's x words (B operands) of several k blocks loaded before their mmas: one
// round trip per 4 blocks (2 for the 64-row tile, whose 8 row groups would take 128 registers)
// instead of one per block, where the per-block branch kept the loads apart. Off with
// -DKILN_DENSE_NO_BPRE (KILN_DENSE_BPRE=0, a measurement switch: main's loop; the same bits,
// the same mmas in the same order).
#ifdef KILN_DENSE_NO_BPRE
#define DMMA_BPRE false
#else
#define DMMA_BPRE true
#endif

// NORM with one row group: every warp sums the squares of the tile's rows itself (dmma_row_ss,
// the same order as one warp per row, and the butterfly leaves every lane the same bits) and keeps
// its lane's row's 1 / rms in a register: no shared memory, no barrier before the product. Off
// with -DKILN_DENSE_NORM_SHARED (KILN_DENSE_NORM=shared: one warp per row, as before).
#ifdef KILN_DENSE_NORM_SHARED
#define DMMA_NORM_PER_WARP false
#else
#define DMMA_NORM_PER_WARP true
#endif

// Sum of squares of row `row` of x [.., k] by one warp: common.cuh's rms_row_sumsq (lane l's
// float4s l, l + 32, ... in order, then the butterfly), the order rms_norm.cu's f32-stream entry
// points use too, so the fused norm and the unfused one give the same 1 / rms.
__device__ __forceinline__ float dmma_row_ss(const float* __restrict__ x, int row, int k,
                                             int lane) {
    return rms_row_sumsq(x + (long)row * k, k, lane);
}

// Sums of squares of R rows of x [.., k] by one warp (row[i] < 0: no row, ss[i] = 0): per row
// exactly rms_row_sumsq's operations in its order (lane l's float4s l, l + 32, ... with __fmaf_rn,
// then warp_sum), the R rows' loads interleaved so that their round trips overlap. Its aligned
// path only: the host passes x 16-byte aligned with k a multiple of 8 (fused.rs, dense_rope.rs),
// so every row is float4-aligned and rms_row_sumsq takes that path too.
template <int R>
__device__ __forceinline__ void dmma_rows_ss(const float* __restrict__ x, const int* row, int k,
                                             int lane, float* ss) {
    float s[R];
#pragma unroll
    for (int i = 0; i < R; ++i) s[i] = 0.0f;
    for (int c = lane * 4; c < k; c += WARP_SIZE * 4) {
        float4 v[R];
#pragma unroll
        for (int i = 0; i < R; ++i)
            v[i] = row[i] >= 0 ? *reinterpret_cast<const float4*>(x + (long)row[i] * k + c)
                              : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
        for (int i = 0; i < R; ++i) {
            s[i] = __fmaf_rn(v[i].x, v[i].x, s[i]);
            s[i] = __fmaf_rn(v[i].y, v[i].y, s[i]);
            s[i] = __fmaf_rn(v[i].z, v[i].z, s[i]);
            s[i] = __fmaf_rn(v[i].w, v[i].w, s[i]);
        }
    }
#pragma unroll
    for (int i = 0; i < R; ++i) ss[i] = warp_sum(s[i]);
}

// NT: 16-output tiles per block (1; 2 for the wide 64-row tile rg8w: every x word a warp loads
// feeds both tiles, so x is read n / 32 times instead of n / 16). Tile nt of block b is the
// tile b · NT + nt of the NT = 1 grid with the same lanes, fragments and slices: the same bits.
template <typename T, typename O, int RG, bool SWIGLU, int MODE = DMMA_PLAIN, typename C = T,
          int NT = 1>
__device__ void dense_mma_small(const T* __restrict__ x, const T* __restrict__ w,
                                O* __restrict__ out, int m, int n, int k, int sb,
                                const T* __restrict__ nw, float eps,
                                const DmmaRope rp = DmmaRope{}) {
    constexpr bool NORM = MODE == DMMA_NORM || MODE == DMMA_NORM_ROPE;
    constexpr bool ROPE = MODE == DMMA_NORM_ROPE;
    constexpr bool PAIRS = SWIGLU || ROPE;  // the epilogue takes outputs g and g + 8 together
    constexpr bool NORM_WARP = NORM && RG == 1 && DMMA_NORM_PER_WARP;
    static_assert(NT == 1 || !ROPE, "the RoPE epilogue maps one tile per block");
    extern __shared__ float dmma_part[];  // [S][NT][RG][4][32]
    __shared__ float dmma_inv[8 * RG];
    const unsigned short* xs = reinterpret_cast<const unsigned short*>(x);
    const float* xf = reinterpret_cast<const float*>(x);
    const unsigned short* ws = reinterpret_cast<const unsigned short*>(w);
    const unsigned short* nws = reinterpret_cast<const unsigned short*>(nw);
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int slices = blockDim.x / WARP_SIZE;
    const int g = lane >> 2, t = lane & 3;
    const int n0 = blockIdx.x * 16 * NT, row0 = blockIdx.y * 8 * RG;
    const int kbt = (k + 31) / 32;
    const int kb0 = warp * sb, kb1 = min(kb0 + sb, kbt);
    // The weight rows of fragment outputs g and g + 8 of each tile.
    int wr_lo[NT], wr_hi[NT];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        wr_lo[nt] = ROPE ? dmma_rope_row(rp, blockIdx.x, g) : n0 + 16 * nt + g;
        wr_hi[nt] = ROPE ? dmma_rope_row(rp, blockIdx.x, g + 8) : n0 + 16 * nt + g + 8;
    }
    // The weight fragments of the slice's first 4 k blocks (all of it for K <= 2048) are loaded
    // before waiting for the previous kernel: a step never writes weights.
    // NORM: the norm weight's words of those k blocks too (a weight as well).
    uint4 a_lo[NT][4], a_hi[NT][4], nwv[4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
        dmma_ld_a4(ws, wr_lo[nt], wr_hi[nt], n, k, kb0, kb1, t, a_lo[nt], a_hi[nt]);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int col = (kb0 + j) * 32 + 8 * t;
        nwv[j] = DMMA_PREFETCH && NORM && kb0 + j < kb1 && col < k
                     ? __ldg(reinterpret_cast<const uint4*>(nws + col))
                     : make_uint4(0u, 0u, 0u, 0u);
    }
    pdl_wait();
    pdl_launch_dependents();
    // RES: when the epilogue gives each thread at most one element (NT · RG · 128 <= threads),
    // its residual value is read now, beside the product's loads, not after the sum.
    const bool res_early =
        DMMA_PREFETCH && MODE == DMMA_RES && NT * RG * 128 <= (int)blockDim.x;
    float res_pre = 0.0f;
    if (res_early && (int)threadIdx.x < NT * RG * 128) {
        const int nt = threadIdx.x / (RG * 128), q = threadIdx.x % (RG * 128);
        const int l = q % 32, i = (q / 32) % 4;
        const int row = row0 + 8 * (q / 128) + 2 * (l & 3) + (i & 1);
        const int col = n0 + 16 * nt + (l >> 2) + 8 * (i >> 1);
        if (row < m && col < n)
            res_pre = reinterpret_cast<const float*>(out)[(long)row * n + col];
    }
    // NORM_WARP: lane g's row's 1 / rms, taken by this warp itself.
    float inv_g = 0.0f;
    if (NORM_WARP) {
        for (int r = 0; r < 8 && row0 + r < m; ++r) {
            const float ss = dmma_row_ss(xf, row0 + r, k, lane);
            if (g == r) inv_g = rms_inv(ss, k, eps);
        }
    } else if (NORM && RG >= 4) {
        // 32 / 64 rows: warp w takes rows w, w + S, w + 2S, ... RG at a time (interleaved loads;
        // each row's sum in rms_row_sumsq's order, so the same bits as the loop below).
        constexpr int R = RG >= 4 ? RG : 1;
        for (int r = warp; r < 8 * RG; r += R * slices) {
            int rows[R];
#pragma unroll
            for (int i = 0; i < R; ++i) {
                const int rr = r + i * slices;
                rows[i] = rr < 8 * RG && row0 + rr < m ? row0 + rr : -1;
            }
            float ss[R];
            dmma_rows_ss<R>(xf, rows, k, lane, ss);
#pragma unroll
            for (int i = 0; i < R; ++i) {
                const int rr = r + i * slices;
                if (lane == 0 && rr < 8 * RG)
                    dmma_inv[rr] = rms_inv(rows[i] >= 0 ? ss[i] : 0.0f, k, eps);
            }
        }
        __syncthreads();
    } else if (NORM) {
        for (int r = warp; r < 8 * RG; r += slices) {
            const int row = row0 + r;
            const float ss = row < m ? dmma_row_ss(xf, row, k, lane) : 0.0f;
            if (lane == 0) dmma_inv[r] = rms_inv(ss, k, eps);
        }
        __syncthreads();
    }
    float acc[NT][RG][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int r = 0; r < RG; ++r)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[nt][r][i] = 0.0f;
    for (int c0 = kb0; c0 < kb1; c0 += 4) {
        if (c0 != kb0)
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
                dmma_ld_a4(ws, wr_lo[nt], wr_hi[nt], n, k, c0, kb1, t, a_lo[nt], a_hi[nt]);
        if (DMMA_BPRE) {
            constexpr int JB = NT * RG >= 16 ? 1 : RG >= 8 ? 2 : 4;
#pragma unroll
            for (int j0 = 0; j0 < 4; j0 += JB) {
                uint4 bw[JB][RG];
#pragma unroll
                for (int jj = 0; jj < JB; ++jj) {
                    const int j = j0 + jj;
                    const int col = (c0 + j) * 32 + 8 * t;
                    const int mr = c0 + j < kb1 ? m : 0;  // a block past the slice: zeros, unused
#pragma unroll
                    for (int r = 0; r < RG; ++r) {
                        const int row = row0 + 8 * r + g;
                        const float inv = !NORM ? 0.0f : NORM_WARP ? inv_g : dmma_inv[8 * r + g];
                        bw[jj][r] = !NORM ? dmma_ld(xs, row, mr, col, k)
                                    : DMMA_PREFETCH && c0 == kb0
                                        ? dmma_ld_norm_w<T>(xf, nwv[j], row, mr, col, k, inv)
                                        : dmma_ld_norm<T>(xf, nws, row, mr, col, k, inv);
                    }
                }
#pragma unroll
                for (int jj = 0; jj < JB; ++jj)
                    if (c0 + j0 + jj < kb1)
#pragma unroll
                        for (int r = 0; r < RG; ++r)
#pragma unroll
                            for (int nt = 0; nt < NT; ++nt)
                                dmma_block<T>(acc[nt][r], a_lo[nt][j0 + jj], a_hi[nt][j0 + jj],
                                              bw[jj][r]);
            }
            continue;
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            if (c0 + j < kb1) {
                const int col = (c0 + j) * 32 + 8 * t;
#pragma unroll
                for (int r = 0; r < RG; ++r) {
                    const int row = row0 + 8 * r + g;
                    const float inv = !NORM ? 0.0f : NORM_WARP ? inv_g : dmma_inv[8 * r + g];
                    const uint4 b =
                        !NORM ? dmma_ld(xs, row, m, col, k)
                        : DMMA_PREFETCH && c0 == kb0
                            ? dmma_ld_norm_w<T>(xf, nwv[j], row, m, col, k, inv)
                            : dmma_ld_norm<T>(xf, nws, row, m, col, k, inv);
#pragma unroll
                    for (int nt = 0; nt < NT; ++nt)
                        dmma_block<T>(acc[nt][r], a_lo[nt][j], a_hi[nt][j], b);
                }
            }
        }
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int r = 0; r < RG; ++r)
#pragma unroll
            for (int i = 0; i < 4; ++i)
                dmma_part[(((warp * NT + nt) * RG + r) * 4 + i) * 32 + lane] = acc[nt][r][i];
    __syncthreads();
    // Element e = ((nt * RG + r) * 4 + i) * 32 + lane of the block, summed over the slices in
    // order.
    constexpr int PER_TILE = PAIRS ? RG * 64 : RG * 128;
    for (int qt = threadIdx.x; qt < NT * PER_TILE; qt += blockDim.x) {
        const int nt = qt / PER_TILE, q = qt % PER_TILE, n0t = n0 + 16 * nt;
        int r, i, l;
        if (PAIRS) {
            r = q / 64;
            i = (q / 32) % 2;
            l = q % 32;
        } else {
            r = q / 128;
            i = (q / 32) % 4;
            l = q % 32;
        }
        const int e = ((nt * RG + r) * 4 + i) * 32 + l;
        float v = 0.0f, u = 0.0f;
        for (int s = 0; s < slices; ++s) {
            v += dmma_part[s * NT * RG * 128 + e];
            if (PAIRS) u += dmma_part[s * NT * RG * 128 + e + 64];
        }
        if (ROPE)
            dmma_store_rope<T, C>(reinterpret_cast<T*>(out), rp, m, blockIdx.x, row0 + 8 * r, l, i,
                                  v, u);
        else if (MODE == DMMA_RES && res_early) {  // dmma_store's RES add, residual read early
            const int row = row0 + 8 * r + 2 * (l & 3) + (i & 1);
            const int col = n0t + (l >> 2) + 8 * (i >> 1);
            if (row < m && col < n)
                Io<O>::store(out, (long)row * n + col, res_pre + round_to<T>(v));
        } else
            dmma_store<T, O, SWIGLU, MODE == DMMA_RES>(out, m, n, n0t, row0 + 8 * r, l, i, v, u);
    }
}

template <typename T, typename O, bool SWIGLU>
__device__ void dense_mma_large(const T* __restrict__ x, const T* __restrict__ w,
                                O* __restrict__ out, int m, int n, int k, int sb) {
    const unsigned short* xs = reinterpret_cast<const unsigned short*>(x);
    const unsigned short* ws = reinterpret_cast<const unsigned short*>(w);
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int g = lane >> 2, t = lane & 3;
    const int n0 = blockIdx.x * 128 + warp * 16, row0 = blockIdx.y * 64;
    const int kbt = (k + 31) / 32;
    pdl_wait();
    float tot[8][4];
#pragma unroll
    for (int r = 0; r < 8; ++r)
#pragma unroll
        for (int i = 0; i < 4; ++i) tot[r][i] = 0.0f;
    for (int s0 = 0; s0 < kbt; s0 += sb) {
        float acc[8][4];
#pragma unroll
        for (int r = 0; r < 8; ++r)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[r][i] = 0.0f;
        const int s1 = min(s0 + sb, kbt);
        for (int kb = s0; kb < s1; ++kb) {
            const int col = kb * 32 + 8 * t;
            const uint4 a_lo = dmma_ld(ws, n0 + g, n, col, k);
            const uint4 a_hi = dmma_ld(ws, n0 + g + 8, n, col, k);
            uint4 b[8];
#pragma unroll
            for (int r = 0; r < 8; ++r) b[r] = dmma_ld(xs, row0 + 8 * r + g, m, col, k);
#pragma unroll
            for (int r = 0; r < 8; ++r) dmma_block<T>(acc[r], a_lo, a_hi, b[r]);
        }
#pragma unroll
        for (int r = 0; r < 8; ++r)
#pragma unroll
            for (int i = 0; i < 4; ++i) tot[r][i] += acc[r][i];
    }
    if (n0 >= n) return;
#pragma unroll
    for (int r = 0; r < 8; ++r) {
        if (SWIGLU) {
            dmma_store<T, O, true>(out, m, n, n0, row0 + 8 * r, lane, 0, tot[r][0], tot[r][2]);
            dmma_store<T, O, true>(out, m, n, n0, row0 + 8 * r, lane, 1, tot[r][1], tot[r][3]);
        } else {
#pragma unroll
            for (int i = 0; i < 4; ++i)
                dmma_store<T, O, false>(out, m, n, n0, row0 + 8 * r, lane, i, tot[r][i], 0.0f);
        }
    }
}

// The NORM_ROPE entry point of row group RG, compute type T, KV storage C (suffix CSUF): x the f32
// residual stream [m, k], w the q|k|v weight [n, k], out = q_out [m, n_heads, head_dim].
#define DENSE_MMA_ROPE(SUF, T, RG, CSUF, C)                                                        \
    extern "C" __global__ void dense_mma_small_rg##RG##_norm_rope_##SUF##_##CSUF(                  \
        const float* x, const T* w, T* out, int m, int n, int k, int sb, const T* nw, float eps,   \
        C* kc, C* vc, const int* positions, const int* slots, const float* cos_table,              \
        const float* sin_table, int n_heads, int n_kv_heads, int head_dim, int rot_half) {         \
        const DmmaRope rp{kc,        vc,      positions,  slots,    cos_table,                     \
                          sin_table, n_heads, n_kv_heads, head_dim, rot_half};                     \
        dense_mma_small<T, T, RG, false, DMMA_NORM_ROPE, C>(reinterpret_cast<const T*>(x), w, out, \
                                                            m, n, k, sb, nw, eps, rp);             \
    }

// Row groups of the small kernel: rg1 (1..8 rows per tile), rg2 (16), rg4 (32), rg8 (64: its
// S x 8 x 128 floats of partials pass 48 KiB for S > 12 slices, the host allows the function that
// much dynamic shared memory, dense.rs). Every small entry
// point takes (x, w, out, m, n, k, sb, nw, eps); nw and eps are read by the _norm ones only.
#define DENSE_MMA_SMALL(SUF, T, RG)                                                                \
    extern "C" __global__ void dense_mma_small_rg##RG##_##SUF(const T* x, const T* w, T* out,       \
                                                              int m, int n, int k, int sb,         \
                                                              const T* nw, float eps) {            \
        dense_mma_small<T, T, RG, false>(x, w, out, m, n, k, sb, nw, eps);                         \
    }                                                                                              \
    extern "C" __global__ void dense_mma_small_rg##RG##_##SUF##_f32(                               \
        const T* x, const T* w, float* out, int m, int n, int k, int sb, const T* nw, float eps) { \
        dense_mma_small<T, float, RG, false>(x, w, out, m, n, k, sb, nw, eps);                     \
    }                                                                                              \
    extern "C" __global__ void dense_mma_small_rg##RG##_swiglu_##SUF(                              \
        const T* x, const T* w, T* out, int m, int n, int k, int sb, const T* nw, float eps) {     \
        dense_mma_small<T, T, RG, true>(x, w, out, m, n, k, sb, nw, eps);                          \
    }                                                                                              \
    extern "C" __global__ void dense_mma_small_rg##RG##_norm_##SUF(                                \
        const float* x, const T* w, T* out, int m, int n, int k, int sb, const T* nw, float eps) { \
        dense_mma_small<T, T, RG, false, DMMA_NORM>(reinterpret_cast<const T*>(x), w, out, m, n,   \
                                                    k, sb, nw, eps);                               \
    }                                                                                              \
    extern "C" __global__ void dense_mma_small_rg##RG##_norm_swiglu_##SUF(                         \
        const float* x, const T* w, T* out, int m, int n, int k, int sb, const T* nw, float eps) { \
        dense_mma_small<T, T, RG, true, DMMA_NORM>(reinterpret_cast<const T*>(x), w, out, m, n, k, \
                                                   sb, nw, eps);                                   \
    }                                                                                              \
    extern "C" __global__ void dense_mma_small_rg##RG##_res_##SUF(                                 \
        const T* x, const T* w, float* out, int m, int n, int k, int sb, const T* nw, float eps) { \
        dense_mma_small<T, float, RG, false, DMMA_RES>(x, w, out, m, n, k, sb, nw, eps);           \
    }                                                                                              \
    DENSE_MMA_ROPE(SUF, T, RG, same, T)                                                            \
    DENSE_MMA_ROPE(SUF, T, RG, e5m2, E5M2)                                                         \
    DENSE_MMA_ROPE(SUF, T, RG, e4m3, E4M3)
// The wide 64-row tile (rg8w: 32 outputs x 64 rows per block, NT = 2), every mode but NORM_ROPE.
#define DENSE_MMA_WIDE(SUF, T)                                                                     \
    extern "C" __global__ void dense_mma_small_rg8w_##SUF(const T* x, const T* w, T* out, int m,   \
                                                          int n, int k, int sb, const T* nw,       \
                                                          float eps) {                             \
        dense_mma_small<T, T, 8, false, DMMA_PLAIN, T, 2>(x, w, out, m, n, k, sb, nw, eps);        \
    }                                                                                              \
    extern "C" __global__ void dense_mma_small_rg8w_##SUF##_f32(                                   \
        const T* x, const T* w, float* out, int m, int n, int k, int sb, const T* nw, float eps) { \
        dense_mma_small<T, float, 8, false, DMMA_PLAIN, T, 2>(x, w, out, m, n, k, sb, nw, eps);    \
    }                                                                                              \
    extern "C" __global__ void dense_mma_small_rg8w_swiglu_##SUF(                                  \
        const T* x, const T* w, T* out, int m, int n, int k, int sb, const T* nw, float eps) {     \
        dense_mma_small<T, T, 8, true, DMMA_PLAIN, T, 2>(x, w, out, m, n, k, sb, nw, eps);         \
    }                                                                                              \
    extern "C" __global__ void dense_mma_small_rg8w_norm_##SUF(                                    \
        const float* x, const T* w, T* out, int m, int n, int k, int sb, const T* nw, float eps) { \
        dense_mma_small<T, T, 8, false, DMMA_NORM, T, 2>(reinterpret_cast<const T*>(x), w, out, m, \
                                                         n, k, sb, nw, eps);                       \
    }                                                                                              \
    extern "C" __global__ void dense_mma_small_rg8w_norm_swiglu_##SUF(                             \
        const float* x, const T* w, T* out, int m, int n, int k, int sb, const T* nw, float eps) { \
        dense_mma_small<T, T, 8, true, DMMA_NORM, T, 2>(reinterpret_cast<const T*>(x), w, out, m,  \
                                                        n, k, sb, nw, eps);                        \
    }                                                                                              \
    extern "C" __global__ void dense_mma_small_rg8w_res_##SUF(                                     \
        const T* x, const T* w, float* out, int m, int n, int k, int sb, const T* nw, float eps) { \
        dense_mma_small<T, float, 8, false, DMMA_RES, T, 2>(x, w, out, m, n, k, sb, nw, eps);      \
    }
#define DENSE_MMA(SUF, T)                                                                          \
    DENSE_MMA_SMALL(SUF, T, 1)                                                                     \
    DENSE_MMA_SMALL(SUF, T, 2)                                                                     \
    DENSE_MMA_SMALL(SUF, T, 4)                                                                     \
    DENSE_MMA_SMALL(SUF, T, 8)                                                                     \
    DENSE_MMA_WIDE(SUF, T)                                                                         \
    extern "C" __global__ void dense_mma_large_##SUF(const T* x, const T* w, T* out, int m, int n,  \
                                                     int k, int sb) {                              \
        dense_mma_large<T, T, false>(x, w, out, m, n, k, sb);                                      \
    }                                                                                              \
    extern "C" __global__ void dense_mma_large_##SUF##_f32(const T* x, const T* w, float* out,      \
                                                           int m, int n, int k, int sb) {          \
        dense_mma_large<T, float, false>(x, w, out, m, n, k, sb);                                  \
    }                                                                                              \
    extern "C" __global__ void dense_mma_large_swiglu_##SUF(const T* x, const T* w, T* out, int m,  \
                                                            int n, int k, int sb) {                \
        dense_mma_large<T, T, true>(x, w, out, m, n, k, sb);                                       \
    }
DENSE_MMA(f16, __half)
DENSE_MMA(bf16, bf16_t)
