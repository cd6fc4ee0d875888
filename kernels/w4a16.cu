// w4a16.cu: matmuls on 4-bit integer weights kept packed on the device (issue 10), with the
// dequantization fused: out[r, n] = sum_k x[r, k] * W[n, k], x [m, k] and out [m, n] row-major.
//
// The device layout ("w4 tiles", built on the host by src/tensor/packed_tiles.rs from every int4
// format: compressed-tensors pack-quantized sym/asym, AutoAWQ GEMM, GPTQ incl. desc_act):
//   qw      uint4 [Np/8][KB][32]   KB = Kp/128; n8 tile nt, k block kb, lane l = 4g + t holds the
//                                  32 nibbles of output n = 8nt + g for the 32 contiguous columns
//                                  kb*128 + 32t + [0, 32): word q (x, y, z, w) holds columns
//                                  32t + 8q + o, o = 0..7, at bit 16(o & 1) + 4(o >> 1) (even
//                                  columns in the low half, odd ones in the high half).
//   scales  T     [Np/8][GS][8]    scale of (n, group), the compute dtype; the group of column j
//                                  is (j >> 4) >> gshift (a group is 2^gshift 16-column chunks).
//   zeros   u8    [Np/8][GS][8]    zero point, or nullptr (symmetric: 8).
//   perm    i32   [Kp]             act-order: permuted column j holds input column perm[j]
//                                  (groups made contiguous at load), or nullptr.
//   W[n, j] = (u - z) * s, exact before one rounding to the compute dtype.
// Np is N rounded up to 64, Kp is K rounded up to 128 (padding has scale 0); x is read only
// below column k and row m, out written only below n and m.
//
// MMA OPERANDS AND K ORDER. The tensor-core kernels compute out^T: the weights are the A operand
// of mma.m16n8k16 (16 outputs = n8 tiles 2u and 2u + 1, x 16 k) and x the B operand (16 k x 8
// rows), so a 1..8-row step wastes nothing and x's 128-bit words are B fragments as loaded. Chunk
// c (0..7) of a k block is one mma; its k index 2t, 2t+1 is column 32t + 4c, +1 of the block and
// its k index 8+2t, 9+2t is column 32t + 4c + 2, +3. The sum over the block is the same set of
// products as in natural order; what matters is that every kernel uses the same assignment.
// With it a lane reads its 32 columns of x as four 128-bit words and its weights as one 128-bit
// word; word q decodes into the A fragments of chunks 2q and 2q+1 with one mask and a shift per
// pair (no table).
//
// ONE NUMERIC PATH FOR EVERY ROW COUNT. On sm_80+ (f16 / bf16) both kernels use
// mma.sync.m16n8k16 with f32 accumulation over the same fragments: K is cut into `ks` slices
// (a function of K alone, chosen by the host); slice s accumulates its k blocks in ascending
// order, chunks 0..7 in order, from zero into P_s, and the result is ((0 + P_0) + P_1) + ... in
// f32. The GEMV (rows 1..32: `w4_gemv`, blocks of one n8 row group, for 1..8 rows;
// `w4_gemvx1` / `w4_gemvx2`, two row groups sharing one weight decode with x staged in shared
// memory, for 9..32 rows (9..16 on sm_90: w4a16_xs.cu's cluster `w4_gemvxc`, the same sums);
// `w4_gemv32` for 9..32 rows of the generic layouts; one warp per slice) and `w4_gemm`
// (larger steps: the slices one after another, each added into the total at its end) perform
// exactly these operations per output element, so a row's result does not depend on its batch and the two
// kernels agree bit for bit (tests/cuda_w4a16.rs checks it). `w4_fma` is the path for sm_70 /
// sm_75 and the f32 compute dtype: f32 FMAs in a fixed k order per lane, a fixed quad shuffle,
// the same slice sum; one kernel for every row count (rows in chunks of 16 by grid.y).
// No split-K depends on the row count; nothing allocates; every launch has fixed pointers
// (graph-capturable).

#define W4_KB 128       // k per tile block
#define W4_MAX_KS 8     // K slices at most
#define W4_GEMV_NT 2    // n8 tiles per warp in the GEMV (16 outputs: one m16 A tile; must be 2)

// PROGRAMMATIC DEPENDENT LAUNCH (sm_90+; no-ops below, and no-ops when the host launches without
// the attribute: launch.rs, `CudaBackend::pdl`). The GEMV kernels (`w4_gemv_*`, `w4_gemv32_*`,
// `w4_gemvx1_*`, `w4_gemvx2_*`) may start while the stream's previous kernel still runs. Each
// lets the next kernel launch (w4_pdl_launch_dependents: it may then start its own pre-wait
// part; it waits for this grid's completion before touching anything this grid writes) and
// reads only what no step writes (the packed weights, scales and zero points: uploaded once at
// load) before w4_pdl_wait() (griddepcontrol.wait: returns once the previous grid has completed
// and its memory is visible); x is read and out written only after it. Every block waits, so
// this grid completes only after the previous one (the chain stays ordered). `trig` (the fast
// GEMVs' last parameter) places the trigger: 0 at the start (the next grid may become resident
// as soon as all of this grid's blocks have started), 1 after the main loop (once every block
// has finished its k blocks: the next grid fills the tail, no earlier).
__device__ __forceinline__ void w4_pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void w4_pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
// The GEMM: 2 (rows) x 4 (outputs) warps of 64 rows x 32 outputs each, 128 x 128 per block.

// x[row, col .. col + 8) (16-bit each) as one 128-bit word; 0 outside the m x k input. `col` is a
// position in the (permuted) tile order; with `perm` the input column is perm[col]. One 128-bit
// load when the 8 columns are in range, contiguous and aligned (k % 8 == 0, no perm).
__device__ __forceinline__ uint4 w4_x8(const unsigned short* __restrict__ x, int row, int m,
                                       int col, int k, const int* __restrict__ perm) {
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (row >= m || col >= k) return v;
    const unsigned short* xr = x + (size_t)row * k;
    if (!perm && (k & 7) == 0) return __ldg(reinterpret_cast<const uint4*>(xr + col));
    unsigned h[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
        const int c = col + e;
        h[e] = c < k ? (unsigned)__ldg(xr + (perm ? __ldg(perm + c) : c)) : 0u;
    }
    v.x = h[0] | (h[1] << 16);
    v.y = h[2] | (h[3] << 16);
    v.z = h[4] | (h[5] << 16);
    v.w = h[6] | (h[7] << 16);
    return v;
}

// Word q of a lane's 128-bit tile word.
__device__ __forceinline__ unsigned w4_word(const uint4& w, int q) {
    return q == 0 ? w.x : q == 1 ? w.y : q == 2 ? w.z : w.w;
}

// The tensor-core decode works in the 16-bit type itself: a nibble u OR-ed into the mantissa of
// MAGIC (1024 for f16, 128 for bf16) is the exact value MAGIC + u; minus (MAGIC + z) is the exact
// small integer u - z; times the scale rounds once (RNE). That is bit for bit the f32 product
// (u - z) * s rounded to T, since that product is exact in f32: a cheaper route to the same value.
template <typename T> struct W4Dec;
template <> struct W4Dec<__half> {
    static constexpr unsigned MAGIC = 0x64006400u;
    // f16 bits of 1024 + z (exact for z <= 1024), in both halves.
    static __device__ __forceinline__ unsigned bias(int z) { return (0x6400u + (unsigned)z) * 0x10001u; }
    static __device__ __forceinline__ unsigned apply(unsigned q, unsigned zb, unsigned s2) {
        const __half2 d = __hsub2(*reinterpret_cast<const __half2*>(&q),
                                  *reinterpret_cast<const __half2*>(&zb));
        const __half2 w = __hmul2(d, *reinterpret_cast<const __half2*>(&s2));
        return *reinterpret_cast<const unsigned*>(&w);
    }
};
template <> struct W4Dec<bf16_t> {
    static constexpr unsigned MAGIC = 0x43004300u;
    // bf16 bits of 128 + z (exact for z < 128), in both halves.
    static __device__ __forceinline__ unsigned bias(int z) { return (0x4300u + (unsigned)z) * 0x10001u; }
    static __device__ __forceinline__ unsigned apply(unsigned q, unsigned zb, unsigned s2) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
        unsigned d, w;
        // q * 1 - zb (exact), then d * s2 + (-0) (one rounding; -0 keeps the sign of a zero).
        asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(d) : "r"(q), "r"(0x3f803f80u), "r"(zb ^ 0x80008000u));
        asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(w) : "r"(d), "r"(s2), "r"(0x80008000u));
        return w;
#else
        __trap();
        return 0u;
#endif
    }
};

// The stored group of a lane's chunk c in k block kb (lane column 32t + 4c of the block).
__device__ __forceinline__ int w4_group(int kb, int t, int c, int gshift) {
    return ((kb * W4_KB + 32 * t + 4 * c) >> 4) >> gshift;
}

// Scale and zero point of output 8*nt + g in stored group gi, packed as one word: the scale's
// 16 bits | zero << 16 (what the GEMV keeps in its register ring; unpacked per k block).
template <typename T>
__device__ __forceinline__ unsigned w4_sz(const T* __restrict__ scales,
                                          const unsigned char* __restrict__ zeros, int nt, int gi,
                                          int gstore, int g) {
    const size_t i = ((size_t)nt * gstore + gi) * 8 + g;
    const unsigned sv = __ldg(reinterpret_cast<const unsigned short*>(scales) + i);
    return sv | ((zeros ? (unsigned)__ldg(zeros + i) : 8u) << 16);
}

// Packed (scale, zero) of a lane's chunks 0..3 (lo) and 4..7 (hi) of k block kb; they differ only
// for groups of 16 columns (gshift 0).
template <typename T>
__device__ __forceinline__ void w4_sz2(const T* __restrict__ scales,
                                       const unsigned char* __restrict__ zeros, int nt, int kb,
                                       int t, int gshift, int gstore, int g, unsigned& lo,
                                       unsigned& hi) {
    lo = w4_sz<T>(scales, zeros, nt, w4_group(kb, t, 0, gshift), gstore, g);
    hi = gshift == 0 ? w4_sz<T>(scales, zeros, nt, w4_group(kb, t, 4, gshift), gstore, g) : lo;
}

// A packed (scale, zero) word as the decode's scale pair and zero bias.
template <typename T>
__device__ __forceinline__ void w4_unpack_sz(unsigned sz, unsigned& s2, unsigned& zb) {
    s2 = __byte_perm(sz, 0u, 0x1010);
    zb = W4Dec<T>::bias((int)(sz >> 16));
}

// B fragments of chunks 2q (b[0], b[1]) and 2q + 1 (b[2], b[3]) from word q: nibbles at bits
// 0 / 16 are the pair (4c, 4c + 1), at bits 4 / 20 the pair (4c + 2, 4c + 3); >> 8 for chunk 2q+1.
// (a & b) | c in one LOP3 (the compiler splits it in two when b and c are immediates).
__device__ __forceinline__ unsigned w4_and_or(unsigned a, unsigned b, unsigned c) {
    unsigned r;
    asm("lop3.b32 %0, %1, %2, %3, 0xea;\n" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}

template <typename T>
__device__ __forceinline__ void w4_decode2(unsigned w, unsigned s2, unsigned zb, unsigned* b) {
    const unsigned M = 0x000f000fu, X = W4Dec<T>::MAGIC;
    b[0] = W4Dec<T>::apply(w4_and_or(w, M, X), zb, s2);
    b[1] = W4Dec<T>::apply(w4_and_or(w >> 4, M, X), zb, s2);
    b[2] = W4Dec<T>::apply(w4_and_or(w >> 8, M, X), zb, s2);
    b[3] = W4Dec<T>::apply(w4_and_or(w >> 12, M, X), zb, s2);
}

// NVFP4 (e2m1 nibbles: sign bit 3, magnitude 0, .5, 1, 1.5, 2, 3, 4, 6): the exact 16-bit value
// of a nibble pair from two byte lookups (prmt; high and low bytes of T's encoding, the sign
// OR-ed in), then times the scale (one rounding, like the int4 path; no zero point).
template <typename T> struct W4Fp4;
template <> struct W4Fp4<__half> {
    static constexpr unsigned HI_LO = 0x3E3C3800u, HI_HI = 0x46444240u, LO_LO = 0u, LO_HI = 0u;
};
template <> struct W4Fp4<bf16_t> {
    static constexpr unsigned HI_LO = 0x3F3F3F00u, HI_HI = 0x40404040u, LO_LO = 0xC0800000u,
                              LO_HI = 0xC0804000u;
};
// e2m1 codes at bits 0..3 and 16..19 of `w` as a T pair.
template <typename T>
__device__ __forceinline__ unsigned w4_e2m1_pair(unsigned w) {
    const unsigned em = w & 0x00070007u;
    const unsigned sel = __byte_perm(em * 0x11u, 0u, 0x4420);  // em0 em0 em1 em1 selectors
    const unsigned hi = __byte_perm(W4Fp4<T>::HI_LO, W4Fp4<T>::HI_HI, sel);
    const unsigned lo = __byte_perm(W4Fp4<T>::LO_LO, W4Fp4<T>::LO_HI, sel);
    return (hi & 0xff00ff00u) | (lo & 0x00ff00ffu) | ((w & 0x00080008u) << 12);
}
template <typename T>
__device__ __forceinline__ unsigned w4_scale_pair(unsigned v, unsigned s2);
template <>
__device__ __forceinline__ unsigned w4_scale_pair<__half>(unsigned v, unsigned s2) {
    const __half2 r = __hmul2(*reinterpret_cast<const __half2*>(&v), *reinterpret_cast<const __half2*>(&s2));
    return *reinterpret_cast<const unsigned*>(&r);
}
template <>
__device__ __forceinline__ unsigned w4_scale_pair<bf16_t>(unsigned v, unsigned s2) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    unsigned r;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(r) : "r"(v), "r"(s2), "r"(0x80008000u));
    return r;
#else
    __trap();
    return 0u;
#endif
}

// The four B fragments of word w (chunks 2q, 2q+1), int4 (FP4 false) or e2m1 (FP4 true).
template <typename T, bool FP4>
__device__ __forceinline__ void w4_decode_any(unsigned w, unsigned s2, unsigned zb, unsigned* b) {
    if (FP4) {
        b[0] = w4_scale_pair<T>(w4_e2m1_pair<T>(w), s2);
        b[1] = w4_scale_pair<T>(w4_e2m1_pair<T>(w >> 4), s2);
        b[2] = w4_scale_pair<T>(w4_e2m1_pair<T>(w >> 8), s2);
        b[3] = w4_scale_pair<T>(w4_e2m1_pair<T>(w >> 12), s2);
    } else {
        w4_decode2<T>(w, s2, zb, b);
    }
}

// The f32 value of a 4-bit code: (u - z) for int4, e2m1 for FP4 (the FMA path): exponent
// field e = (u >> 1) & 3, mantissa bit u & 1; e = 0 is the subnormal 0 / 0.5.
__device__ __forceinline__ float w4_code_value(int u, int z, int fp4) {
    if (!fp4) return (float)(u - z);
    const int e = (u >> 1) & 3, mb = u & 1;
    const float v = e == 0 ? 0.5f * (float)mb : ldexpf(1.0f + 0.5f * (float)mb, e - 1);
    return (u & 8) ? -v : v;
}

// Store one output element (compute dtype, or f32 logits).
template <typename T>
__device__ __forceinline__ void w4_store(void* out, int out_f32, int row, int n, int col, float v) {
    const size_t i = (size_t)row * n + col;
    if (out_f32) {
        static_cast<float*>(out)[i] = v;
    } else {
        Io<T>::store(static_cast<T*>(out), (long)i, v);
    }
}

// One k block of the GEMV for one m16 output tile (n8 tiles 2u and 2u + 1 of the warp) and
// RG row groups of 8 rows (only the first `nrg` exist): W is the mma's A operand (16 outputs x
// 16 k), x its B operand (16 k x 8 rows), so one mma covers 16 outputs x 8 rows and x's 128-bit
// words are B fragments as loaded. The weights are decoded once per k block for all row groups.
// w0 / w1 the two tiles' lane words, (sz) their packed (scale, zero) for chunks 0..3 and 4..7
// (G16 false: groups of >= 32 columns, the hi words are not read), `xq(rg, q)` the lane's x word
// q of row group rg. Chunks 0..7 in order for every row group (the GEMM's order).
template <typename T, int RG, bool FP4, bool G16, typename XQ>
__device__ __forceinline__ void w4_block(float (*acc)[4], uint4 w0, uint4 w1, unsigned sz0l,
                                         unsigned sz0h, unsigned sz1l, unsigned sz1h, int nrg,
                                         XQ xq) {
    unsigned s0l, z0l, s0h, z0h, s1l, z1l, s1h, z1h;
    w4_unpack_sz<T>(sz0l, s0l, z0l);
    w4_unpack_sz<T>(sz1l, s1l, z1l);
    if (G16) {
        w4_unpack_sz<T>(sz0h, s0h, z0h);
        w4_unpack_sz<T>(sz1h, s1h, z1h);
    } else {
        s0h = s0l; z0h = z0l; s1h = s1l; z1h = z1l;
    }
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        unsigned d0[4], d1[4];
        w4_decode_any<T, FP4>(w4_word(w0, q), q < 2 ? s0l : s0h, q < 2 ? z0l : z0h, d0);
        w4_decode_any<T, FP4>(w4_word(w1, q), q < 2 ? s1l : s1h, q < 2 ? z1l : z1h, d1);
        const unsigned a0[4] = {d0[0], d1[0], d0[1], d1[1]};  // chunk 2q
        const unsigned a1[4] = {d0[2], d1[2], d0[3], d1[3]};  // chunk 2q + 1
#pragma unroll
        for (int rg = 0; rg < RG; ++rg) {
            if (rg == 0 || rg < nrg) {
                const uint4 r = xq(rg, q);
                mma_m16n8k16<T>(acc[rg], a0, r.x, r.y);
                mma_m16n8k16<T>(acc[rg], a1, r.z, r.w);
            }
        }
    }
}

// Symmetric formats have no zero tensor: their lanes point at this 8 with stride 0 (and skip
// the load: `zg` is 0, a branch uniform over the grid).
__device__ const unsigned char w4_eight[1] = {8};

// The (scale, zero) word of a GEMV/GEMM lane in group gi: `sp` points at scales[nt][0][g]
// (16-bit), `zp` at zeros[nt][0][g] (or w4_eight), `zg` the zeros' group stride (8, or 0 for
// symmetric: the zero is 8, not loaded).
__device__ __forceinline__ unsigned w4_sz_at(const unsigned short* __restrict__ sp,
                                             const unsigned char* __restrict__ zp, int zg, int gi) {
    return (unsigned)__ldg(sp + gi * 8) | ((zg ? (unsigned)__ldg(zp + gi * zg) : 8u) << 16);
}

// GEMV: grid (Np / 16, ceil(m / (8 RG))), block 32 * ks threads (warp s = K slice s), one m16
// output tile (n8 tiles 2 * blockIdx.x, + 1) and 8 RG rows (r0 = 8 RG blockIdx.y) per block;
// RG = 4 (9..32 rows of the generic layouts, `w4_gemv32_*`): the weights are read and decoded
// once for 8 RG rows.
// Each warp keeps D k blocks of its tiles' weights and (scale, zero) words in flight in a
// register ring (D = 2; the fast layouts run `w4_gemv_fast` of w4a16_gemv.cu and `w4_gemv_xs`
// below, this kernel with less bookkeeping); x is read through the L1 (every warp of the
// grid reads the same rows). Row groups past m (nrg of RG present, uniform per block) are
// skipped.
// FASTX: k % 128 == 0 and no perm, so a lane's x words are whole aligned 128-bit loads
// (predicated on the row only); otherwise the generic `w4_x8`. G16 (FP4, or the generic
// variant): groups of 16 columns possible, so chunks 4..7 read their own (scale, zero); the int4
// fast variants need groups of >= 32 columns (the host routes group 16 to the generic one).
// `part` is the block's shared [ks][RG][4][32] f32 slice sums; warp h < nrg sums row group h's
// slices in order 0..ks-1.
template <typename T, int RG, bool FP4, bool FASTX>
__device__ __forceinline__ void w4_gemv(const T* x, int m, int k, const uint4* __restrict__ qw,
                                        const T* scales, const unsigned char* zeros,
                                        const int* perm, int kblocks, int ks, int gshift,
                                        int gstore, int n, void* out, int out_f32, float* part) {
    constexpr int NT = W4_GEMV_NT, D = 2;
    constexpr bool G16 = FP4 || !FASTX;
    w4_pdl_launch_dependents();
    const int lane = threadIdx.x & 31, s = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int nt0 = blockIdx.x * NT;
    const int r0 = blockIdx.y * 8 * RG;
    const int nrg = min(RG, (m - r0 + 7) >> 3);
    const unsigned short* xs = reinterpret_cast<const unsigned short*>(x);
    const int per = kblocks / ks, kb0 = s * per, kend = kb0 + per;
    // Lane x pointer of row group rg: its 32 columns of row r0 + 8 rg + g (rows past m read row
    // m - 1 instead: a row of x only reaches its own output column, which is not stored).
    const uint4* xp0 = reinterpret_cast<const uint4*>(xs + (size_t)min(r0 + g, m - 1) * k + 32 * t);
    // Tile j's words at wp + j * wstride, its (scale, zero) columns at sp / zp + j * sstride.
    const uint4* wp = qw + (size_t)nt0 * kblocks * 32 + lane;
    const int wstride = kblocks * 32, sstride = gstore * 8;
    const unsigned short* sp = reinterpret_cast<const unsigned short*>(scales) + (size_t)nt0 * sstride + g;
    const unsigned char* zp = zeros ? zeros + (size_t)nt0 * sstride + g : w4_eight;
    const int zg = zeros ? 8 : 0, zt = zeros ? sstride : 0;
    float acc[RG][4];  // D layout: (out g | g + 8, row 2t | 2t + 1) of row group rg
#pragma unroll
    for (int h = 0; h < RG; ++h)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[h][e] = 0.0f;
    uint4 wr[D][NT];
    unsigned szl[D][NT], szh[D][NT];
    auto fill = [&](int d, int kb) {
        const int glo = (kb * 8 + 2 * t) >> gshift, ghi = (kb * 8 + 2 * t + 1) >> gshift;
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            wr[d][j] = __ldg(wp + j * wstride + kb * 32);
            szl[d][j] = w4_sz_at(sp + j * sstride, zp + j * zt, zg, glo);
            szh[d][j] = G16 ? w4_sz_at(sp + j * sstride, zp + j * zt, zg, ghi) : 0u;
        }
    };
#pragma unroll
    for (int d = 0; d < D; ++d) {
        if (kb0 + d < kend) fill(d, kb0 + d);
    }
    w4_pdl_wait();  // weights and (scale, zero) words only above; x from here on
    for (int kb = kb0; kb < kend; kb += D) {
#pragma unroll
        for (int d = 0; d < D; ++d) {
            const int kc = kb + d;
            if (kc < kend) {
                auto xq = [&](int rg, int q) -> uint4 {
                    if (FASTX) {
                        const uint4* p = rg == 0 ? xp0
                                                 : reinterpret_cast<const uint4*>(
                                                       xs + (size_t)min(r0 + 8 * rg + g, m - 1) * k + 32 * t);
                        return __ldg(p + kc * 16 + q);
                    }
                    return w4_x8(xs, r0 + 8 * rg + g, m, kc * W4_KB + 32 * t + 8 * q, k, perm);
                };
                // Consume slot d, then refill it with block kc + D.
                w4_block<T, RG, FP4, G16>(acc, wr[d][0], wr[d][1], szl[d][0], szh[d][0],
                                          szl[d][1], szh[d][1], nrg, xq);
                if (kc + D < kend) fill(d, kc + D);
            }
        }
    }
    float(*pp)[RG][4][32] = reinterpret_cast<float(*)[RG][4][32]>(part);
#pragma unroll
    for (int h = 0; h < RG; ++h)
#pragma unroll
        for (int e = 0; e < 4; ++e) pp[s][h][e][lane] = acc[h][e];
    __syncthreads();
    // Warp h sums row group h (fixed order over the slices); needs ks >= RG warps or loops.
    for (int h = s; h < nrg; h += ks) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            float total = 0.0f;
            for (int q = 0; q < ks; ++q) total += pp[q][h][e][lane];
            const int row = r0 + 8 * h + 2 * t + (e & 1);
            const int col = nt0 * 8 + g + (e >= 2 ? 8 : 0);
            if (row < m && col < n) w4_store<T>(out, out_f32, row, n, col, total);
        }
    }
}

// The fast GEMVs' (scale, zero) word (`kernels/w4a16_gemv.cu`, `w4_gemv_xs`, `w4a16_xs.cu`) at
// element offset `off` of a lane's column (ZP false: the scale alone).
// (Unsigned index arithmetic: one 32 x 32 -> 64-bit multiply-add per address, no sign extension.)
template <bool ZP>
__device__ __forceinline__ unsigned w4_szf(const unsigned short* __restrict__ sp,
                                           const unsigned char* __restrict__ zp, unsigned off) {
    const unsigned sv = (unsigned)__ldg(sp + off);
    return ZP ? sv | ((unsigned)__ldg(zp + off) << 16) : sv;
}


// The x-staged GEMV (`w4_gemvx1_*` / `w4_gemvx2_*`: steps of 9..32 rows on the fast layouts, in
// blocks of 8 RG = 16 rows): the fast GEMV's fragments, k order and slice sum, with x read from
// shared memory. In `w4_gemv_fast` each lane loads its x words from L1 / L2 in the step that uses
// them, and one 128-bit load of a quad is four 16-byte pieces 64 bytes apart (half of every
// sector wasted); at 16 rows the mma waited on them (docs/benchmarks.md, the Nsight section).
// Here the x of a K slice is copied by cp.async, whole sectors, NS - 1 half k blocks ahead of
// use, into a ring of NS stages per slice, and read back as B fragments without bank conflicts.
// - A stage is half a k block (columns 32t + 16h + [0, 16) of every lane quad t, h = 0 / 1: the
//   x words q = 2h, 2h + 1) of the block's 8 RG rows: row r at r * 128 bytes, its 16-byte unit v
//   (= 2t + (q & 1), columns 32t + 16h + 8(q & 1)) at slot v ^ (r & 1) (the 8 lanes of one
//   128-bit load phase read rows g, g + 1 of opposite parities: 8 distinct slots, all 32 banks).
// - A block runs P m16 output tiles (P x ks warps: warp w = P s + p runs K slice s of tile p);
//   the P warps of a slice share its stages (named barrier 1 + s over 32 P threads, __syncwarp
//   for P = 1), so x is fetched once for 16 P outputs.
// - Rows past m are zero-filled (0-byte copies); their outputs are not stored.
// - After the main loop the stages hold the slice sums [P][ks][RG][4][32] f32, added per output
//   in slice order 0..ks-1 (the GEMV = GEMM contract).
// Dynamic shared memory: max(ks * NS * RG KB, P * ks * RG * 512 B) (RG = 2, NS = 2, ks <= 8:
// 32 KB). Measured on the H200 (docs/benchmarks.md): RG 4 blocks (32 rows) lost to two 16-row
// tiles of P = 2; 3 stages, the next k block's weights loaded before the decode, and 48 / 80
// register caps were all slower than this build; the GEMV is issue-bound (the decode is ~120 of
// its ~220 SASS instructions per k block), so the instruction count is what the layout trims.
__device__ __forceinline__ void w4x_cp16(unsigned dst, const void* src, int bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
#else
    __trap();
#endif
}
__device__ __forceinline__ void w4x_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}
// Wait until at most N committed groups of this thread are still in flight.
template <int N>
__device__ __forceinline__ void w4x_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

template <typename T, int RG, bool FP4, bool ZP, int P, int NS>
__device__ __forceinline__ void w4_gemv_xs(const T* x, int m, int k, const uint4* __restrict__ qw,
                                           const T* scales, const unsigned char* zeros,
                                           int kblocks, int ks, int gshift, int gstore, int n,
                                           void* out, int out_f32, int trig) {
    static_assert(P == 1 || P == 2, "tiles per block");
    static_assert(NS >= 2 && NS <= 4, "x stages");
    if (trig == 0) w4_pdl_launch_dependents();
    extern __shared__ __align__(16) unsigned char w4_smem[];
    constexpr bool G16 = FP4;
    constexpr unsigned XB = RG * 8 * 128;  // bytes of one stage
    constexpr int NCP = 2 * RG / P;        // 16-byte pieces a thread copies per stage
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int p = w & (P - 1), s = w / P;
    const int nt0 = (blockIdx.x * P + p) * 2;  // the warp's m16 tile: n8 tiles nt0, nt0 + 1
    const int r0 = blockIdx.y * 8 * RG;
    const int per = kblocks / ks, kb0 = s * per;
    const unsigned short* xs = reinterpret_cast<const unsigned short*>(x);
    // Copy role: thread p * 32 + lane of the slice's P warps copies the pieces (row, unit v) with
    // v = lane & 7 and row = 4p + (lane >> 3) + 4P i, i < NCP (a warp instruction moves 4 rows x
    // 128 bytes: whole sectors). Rows past m copy 0 bytes (zero fill) from an in-range address.
    const int cv = lane & 7, crow = 4 * p + (lane >> 3);
    // Piece i's source: xb + i * xstride (rows past m: xb itself, 0 bytes).
    const unsigned short* xb =
        xs + (size_t)min(r0 + crow, m - 1) * k + 32 * (cv >> 1) + 8 * (cv & 1) + kb0 * W4_KB;
    unsigned xstride = (unsigned)(4 * P) * (unsigned)k;
    int xrows = m - r0 - crow;  // piece i is in range when 4 P i < xrows
    const unsigned sm0 = (unsigned)__cvta_generic_to_shared(w4_smem);
    const unsigned sring = (unsigned)(s * NS) * XB;  // the slice's stage ring (bytes from w4_smem)
    unsigned cdst = sm0 + sring + (unsigned)crow * 128u + ((unsigned)(cv ^ (crow & 1)) << 4);
    // Opaque to the optimiser: kept in registers rather than re-derived from the kernel
    // parameters at every copy (which it otherwise does under the 64-register cap).
    asm("" : "+l"(xb));
    asm("" : "+r"(xstride), "+r"(xrows), "+r"(cdst));
    // Stage j of the slice (k block kb0 + j / 2, half j % 2) into ring slot `buf`.
    auto copy = [&](int j, unsigned buf) {
        const unsigned col = (unsigned)((j >> 1) * W4_KB + 16 * (j & 1));
#pragma unroll
        for (int i = 0; i < NCP; ++i) {
            const bool in = 4 * P * i < xrows;
            w4x_cp16(cdst + buf * XB + (unsigned)(4 * P * i) * 128u,
                     xb + (in ? (unsigned)i * xstride : 0u) + col, in ? 16 : 0);
        }
    };
    auto gsync = [&]() {
        if (P == 1) {
            __syncwarp();
        } else {
            asm volatile("bar.sync %0, %1;\n" ::"r"(1 + s), "r"(32 * P) : "memory");
        }
    };
    // The lane's B fragment words q = 2h + e of row group rg in a stage: + rg * 1024.
    const unsigned lofs0 = sring + (unsigned)g * 128u + ((unsigned)((2 * t) ^ (g & 1)) << 4);
    const unsigned lofs1 = sring + (unsigned)g * 128u + ((unsigned)((2 * t + 1) ^ (g & 1)) << 4);

    const uint4* wp0 = qw + ((size_t)nt0 * kblocks + kb0) * 32 + lane;
    const uint4* wp1 = wp0 + (size_t)kblocks * 32;
    const unsigned sstride = (unsigned)gstore * 8u;
    const size_t sb = (size_t)nt0 * sstride + g;
    const unsigned short* sp0 = reinterpret_cast<const unsigned short*>(scales) + sb;
    const unsigned char* zp0 = ZP ? zeros + sb : nullptr;
    asm("" : "+l"(sp0));
    asm("" : "+l"(zp0));
    unsigned gq = (unsigned)(kb0 * 8 + 2 * t);
    float acc[RG][4];
#pragma unroll
    for (int h = 0; h < RG; ++h)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[h][e] = 0.0f;

    const int nst = 2 * per;  // stages of the slice
    // Weights and (scale, zero) words of the next k block, loaded before this one's decode (the
    // first ones before w4_pdl_wait: they are never written by a step; x is copied after it).
    uint4 w0 = __ldg(wp0), w1 = __ldg(wp1);
    unsigned sz0, sz1, szh0 = 0, szh1 = 0;
    auto load_sz = [&]() {
        const unsigned glo = gq >> gshift;
        sz0 = w4_szf<ZP>(sp0, zp0, glo * 8u);
        sz1 = w4_szf<ZP>(sp0, zp0, glo * 8u + sstride);
        if (G16) {
            const unsigned ghi = (gq + 1u) >> gshift;
            szh0 = w4_szf<ZP>(sp0, zp0, ghi * 8u);
            szh1 = w4_szf<ZP>(sp0, zp0, ghi * 8u + sstride);
        }
    };
    load_sz();
    w4_pdl_wait();
#pragma unroll
    for (int j = 0; j < NS - 1; ++j) {
        if (j < nst) copy(j, (unsigned)j);
        w4x_commit();
    }
    unsigned rb = 0, wb = NS - 1;
    for (int i = 0; i < per; ++i) {
        // The next k block's weights are loaded after this one's decode, as in the 8-row GEMV
        // (loading them before it, 8 more registers, was 2-6% slower on the H200).
        const uint4 c0 = w0, c1 = w1;
        const unsigned zc = W4Dec<T>::bias(8);
        const unsigned s0l = __byte_perm(sz0, 0u, 0x1010), s1l = __byte_perm(sz1, 0u, 0x1010);
        const unsigned z0 = ZP ? W4Dec<T>::bias((int)(sz0 >> 16)) : zc;
        const unsigned z1 = ZP ? W4Dec<T>::bias((int)(sz1 >> 16)) : zc;
        const unsigned s0h = G16 ? __byte_perm(szh0, 0u, 0x1010) : s0l;
        const unsigned s1h = G16 ? __byte_perm(szh1, 0u, 0x1010) : s1l;
        auto next = [&]() {
            wp0 += 32;
            wp1 += 32;
            gq += 8u;
            w0 = __ldg(wp0);
            w1 = __ldg(wp1);
            load_sz();
        };
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int j = 2 * i + h;
            w4x_wait<NS - 2>();
            gsync();
            if (j + NS - 1 < nst) copy(j + NS - 1, wb);
            w4x_commit();
            wb = wb + 1 == NS ? 0u : wb + 1;
            const unsigned st = rb * XB;
            rb = rb + 1 == NS ? 0u : rb + 1;
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int q = 2 * h + e;
                uint4 xr[RG];
#pragma unroll
                for (int rg = 0; rg < RG; ++rg)
                    xr[rg] = *reinterpret_cast<const uint4*>(w4_smem + st + (e == 0 ? lofs0 : lofs1) +
                                                             rg * 1024u);
                unsigned d0[4], d1[4];
                w4_decode_any<T, FP4>(w4_word(c0, q), h == 0 ? s0l : s0h, z0, d0);
                w4_decode_any<T, FP4>(w4_word(c1, q), h == 0 ? s1l : s1h, z1, d1);
                const unsigned a0[4] = {d0[0], d1[0], d0[1], d1[1]};  // chunk 2q
                const unsigned a1[4] = {d0[2], d1[2], d0[3], d1[3]};  // chunk 2q + 1
#pragma unroll
                for (int rg = 0; rg < RG; ++rg) {
                    mma_m16n8k16<T>(acc[rg], a0, xr[rg].x, xr[rg].y);
                    mma_m16n8k16<T>(acc[rg], a1, xr[rg].z, xr[rg].w);
                }
            }
        }
        if (i + 1 < per) next();
    }
    w4x_wait<0>();  // all groups (the last ones are empty)
    if (trig != 0) w4_pdl_launch_dependents();
    __syncthreads();
    // The slice sums [P][ks][RG][4][32] over the stages, then each output's sum in slice order.
    float* part = reinterpret_cast<float*>(w4_smem);
#pragma unroll
    for (int h = 0; h < RG; ++h)
#pragma unroll
        for (int e = 0; e < 4; ++e) part[(((p * ks + s) * RG + h) * 4 + e) * 32 + lane] = acc[h][e];
    __syncthreads();
    const int nw = blockDim.x >> 5;
    for (int he = w; he < P * RG * 4; he += nw) {
        const int pp = he / (RG * 4), h = (he >> 2) % RG, e = he & 3;
        float total = 0.0f;
        for (int q = 0; q < ks; ++q) total += part[(((pp * ks + q) * RG + h) * 4 + e) * 32 + lane];
        const int row = r0 + 8 * h + 2 * t + (e & 1);
        const int col = (blockIdx.x * P + pp) * 16 + g + (e >= 2 ? 8 : 0);
        if (row < m && col < n) w4_store<T>(out, out_f32, row, n, col, total);
    }
}

// GEMM: grid (ceil(Np / 128), ceil(m / 128)), block 256 threads = 2 (rows) x 4 (outputs) warps,
// each 64 rows x 32 outputs; dynamic shared memory `stages` x W4_GEMM_STAGE_BYTES. Each k block
// (128 columns) of the CTA's x rows (128 x 128, 32 KB) and weight tiles (16 n8 tiles, 8 KB) is
// staged by cp.async `stages` - 1 blocks ahead (2 or 3 stages, the host picks by the arch's
// shared memory); a warp decodes its 4 tiles once per k block straight from shared memory into
// A fragments (two m16 output tiles) and reads each 8-row group's B fragments with one 128-bit
// load per chunk pair; the (scale, zero) words are loaded one k block ahead. x rows sit 256 bytes
// apart, 16-byte unit u of row r at u ^ ((u >> 3) << 1) ^ (r & 1) (no bank conflicts for the
// A reads). The ks slices accumulate from zero into acc and are added into `total` in order at
// each slice's end: the GEMV's arithmetic exactly.
#define W4_GEMM_A_BYTES (128 * 256)
#define W4_GEMM_B_BYTES (16 * 512)
#define W4_GEMM_STAGE_BYTES (W4_GEMM_A_BYTES + W4_GEMM_B_BYTES)

__device__ __forceinline__ int w4_a_unit(int u, int row) { return u ^ ((u >> 3) << 1) ^ (row & 1); }

__device__ __forceinline__ void w4_cp16(unsigned dst, const void* src, int bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
#else
    __trap();
#endif
}
__device__ __forceinline__ void w4_cp_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}
// Wait until at most `pending` (0 or 1) committed groups are still in flight.
__device__ __forceinline__ void w4_cp_wait(int pending) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if (pending == 0) {
        asm volatile("cp.async.wait_group 0;\n" ::);
    } else {
        asm volatile("cp.async.wait_group 1;\n" ::);
    }
#endif
}

// Stage k block kb of the CTA (rows r0.., tiles nt0..) into `st` (shared). fast: x rows are 16-byte
// aligned and unpermuted (k % 8 == 0, no perm): cp.async with zero fill past m; otherwise the
// generic 8-column read stored synchronously.
__device__ __forceinline__ void w4_gemm_stage(unsigned char* st, const unsigned short* xs, int m,
                                              int k, const int* perm, bool fast,
                                              const uint4* qw, int kblocks, int tiles, int r0,
                                              int nt0, int kb) {
    const int tid = threadIdx.x;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int id = tid + 256 * i, row = id >> 4, u = id & 15;
        unsigned char* dst = st + row * 256 + w4_a_unit(u, row) * 16;
        const int col = kb * W4_KB + 8 * u, r = r0 + row;
        if (fast) {
            const bool in = r < m && col < k;
            const unsigned short* src = in ? xs + (size_t)r * k + col : xs;
            w4_cp16((unsigned)__cvta_generic_to_shared(dst), src, in ? 16 : 0);
        } else {
            *reinterpret_cast<uint4*>(dst) = w4_x8(xs, r, m, col, k, perm);
        }
    }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int id = tid + 256 * i, tile = id >> 5, l = id & 31;
        if (nt0 + tile < tiles) {
            unsigned char* dst = st + W4_GEMM_A_BYTES + tile * 512 + l * 16;
            w4_cp16((unsigned)__cvta_generic_to_shared(dst),
                    qw + ((size_t)(nt0 + tile) * kblocks + kb) * 32 + l, 16);
        }
    }
}

template <typename T, bool FP4>
__device__ __forceinline__ void w4_gemm(const T* x, int m, int k, const uint4* __restrict__ qw,
                                        const T* scales, const unsigned char* zeros,
                                        const int* perm, int kblocks, int ks, int gshift,
                                        int gstore, int n, void* out, int out_f32, int stages,
                                        int tiles) {
    extern __shared__ __align__(16) unsigned char w4_smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int wm = warp >> 2, wn = warp & 3;
    const int r0 = blockIdx.y * 128;
    const int ntc = blockIdx.x * 16;            // the CTA's first n8 tile
    const int nt0 = ntc + wn * 4;               // the warp's first n8 tile (4: two m16 A tiles)
    const bool active = nt0 < tiles;            // tiles is a multiple of 8: all 4 or none
    const unsigned short* xs = reinterpret_cast<const unsigned short*>(x);
    const bool fast = perm == nullptr && (k & 7) == 0;
    const int per = kblocks / ks;
    const unsigned short* sp = reinterpret_cast<const unsigned short*>(scales) + (size_t)nt0 * gstore * 8 + g;
    const int sstride = gstore * 8;
    const unsigned char* zp = zeros ? zeros + (size_t)nt0 * sstride + g : w4_eight;
    const int zg = zeros ? 8 : 0, zt = zeros ? sstride : 0;
    // total / acc [u][rg][e]: m16 output tile u (n8 tiles nt0 + 2u, + 1), row group rg (8 rows).
    float total[2][8][4], acc[2][8][4];
#pragma unroll
    for (int u = 0; u < 2; ++u)
#pragma unroll
        for (int rg = 0; rg < 8; ++rg)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                total[u][rg][e] = 0.0f;
                acc[u][rg][e] = 0.0f;
            }
    // (scale, zero) words of k block 0, then one block ahead.
    unsigned szl[4], szh[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int glo = (2 * t) >> gshift, ghi = (2 * t + 1) >> gshift;
        szl[j] = active ? w4_sz_at(sp + j * sstride, zp + j * zt, zg, glo) : 0u;
        szh[j] = active ? w4_sz_at(sp + j * sstride, zp + j * zt, zg, ghi) : 0u;
    }
    for (int p = 0; p < stages - 1; ++p) {
        if (p < kblocks)
            w4_gemm_stage(w4_smem + p * W4_GEMM_STAGE_BYTES, xs, m, k, perm, fast, qw, kblocks,
                          tiles, r0, ntc, p);
        w4_cp_commit();
    }
    for (int kb = 0; kb < kblocks; ++kb) {
        w4_cp_wait(stages - 2);
        __syncthreads();
        {
            const int kn = kb + stages - 1;
            if (kn < kblocks)
                w4_gemm_stage(w4_smem + (kn % stages) * W4_GEMM_STAGE_BYTES, xs, m, k, perm, fast,
                              qw, kblocks, tiles, r0, ntc, kn);
            w4_cp_commit();
        }
        if (active) {
            const unsigned char* st = w4_smem + (kb % stages) * W4_GEMM_STAGE_BYTES;
            uint4 w[4];
            unsigned sl[4], zl[4], sh[4], zh[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                w[j] = *reinterpret_cast<const uint4*>(st + W4_GEMM_A_BYTES + (wn * 4 + j) * 512 + lane * 16);
                w4_unpack_sz<T>(szl[j], sl[j], zl[j]);
                w4_unpack_sz<T>(szh[j], sh[j], zh[j]);
            }
            if (kb + 1 < kblocks) {
                const int glo = ((kb + 1) * 8 + 2 * t) >> gshift, ghi = ((kb + 1) * 8 + 2 * t + 1) >> gshift;
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    szl[j] = w4_sz_at(sp + j * sstride, zp + j * zt, zg, glo);
                    szh[j] = w4_sz_at(sp + j * sstride, zp + j * zt, zg, ghi);
                }
            }
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                unsigned d[4][4];
#pragma unroll
                for (int j = 0; j < 4; ++j)
                    w4_decode_any<T, FP4>(w4_word(w[j], q), q < 2 ? sl[j] : sh[j], q < 2 ? zl[j] : zh[j], d[j]);
                unsigned a0[2][4], a1[2][4];
#pragma unroll
                for (int u = 0; u < 2; ++u) {
                    a0[u][0] = d[2 * u][0]; a0[u][1] = d[2 * u + 1][0];
                    a0[u][2] = d[2 * u][1]; a0[u][3] = d[2 * u + 1][1];
                    a1[u][0] = d[2 * u][2]; a1[u][1] = d[2 * u + 1][2];
                    a1[u][2] = d[2 * u][3]; a1[u][3] = d[2 * u + 1][3];
                }
#pragma unroll
                for (int rg = 0; rg < 8; ++rg) {
                    const int row = wm * 64 + rg * 8 + g;
                    const uint4 xr = *reinterpret_cast<const uint4*>(st + row * 256 + w4_a_unit(4 * t + q, row) * 16);
#pragma unroll
                    for (int u = 0; u < 2; ++u) {
                        mma_m16n8k16<T>(acc[u][rg], a0[u], xr.x, xr.y);
                        mma_m16n8k16<T>(acc[u][rg], a1[u], xr.z, xr.w);
                    }
                }
            }
            if ((kb + 1) % per == 0) {
#pragma unroll
                for (int u = 0; u < 2; ++u)
#pragma unroll
                    for (int rg = 0; rg < 8; ++rg)
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            total[u][rg][e] += acc[u][rg][e];
                            acc[u][rg][e] = 0.0f;
                        }
            }
        }
    }
    w4_cp_wait(0);
    if (!active) return;
#pragma unroll
    for (int u = 0; u < 2; ++u)
#pragma unroll
        for (int rg = 0; rg < 8; ++rg)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int row = r0 + wm * 64 + rg * 8 + 2 * t + (e & 1);
                const int col = (nt0 + 2 * u) * 8 + g + (e >= 2 ? 8 : 0);
                if (row < m && col < n) w4_store<T>(out, out_f32, row, n, col, total[u][rg][e]);
            }
}

// FMA path (sm_70 / sm_75, f32): grid (Np / 8, ceil(m / 16)), block 32 * ks threads. Lane (g, t) of
// warp s sums output 8*blockIdx.x + g over its 32 columns (ascending) of each k block of slice s,
// for up to 16 rows; the quad's four sums meet by a fixed xor shuffle, the slices in order.
template <typename T>
__device__ __forceinline__ void w4_fma(const T* x, int m, int k, const uint4* __restrict__ qw,
                                       const T* scales, const unsigned char* zeros,
                                       const int* perm, int kblocks, int ks, int gshift,
                                       int gstore, int n, void* out, int out_f32, int fp4) {
    __shared__ float part[W4_MAX_KS][16][8];
    const int lane = threadIdx.x & 31, s = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int nt = blockIdx.x;
    const int r0 = blockIdx.y * 16;
    const int per = kblocks / ks;
    float acc[16];
#pragma unroll
    for (int r = 0; r < 16; ++r) acc[r] = 0.0f;
    for (int kb = s * per; kb < (s + 1) * per; ++kb) {
        const uint4 w = __ldg(qw + ((size_t)nt * kblocks + kb) * 32 + lane);
        float wf[32];
        int cols[32];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const unsigned word = w4_word(w, q);
#pragma unroll
            for (int o = 0; o < 8; ++o) {
                const int col = kb * W4_KB + 32 * t + 8 * q + o;
                const size_t i = ((size_t)nt * gstore + ((col >> 4) >> gshift)) * 8 + g;
                const float sc = Io<T>::load(scales, (long)i);
                const int z = zeros ? (int)__ldg(zeros + i) : 8;
                const int u = (int)((word >> (16 * (o & 1) + 4 * (o >> 1))) & 15u);
                wf[8 * q + o] = round_to<T>(w4_code_value(u, z, fp4) * sc);
                cols[8 * q + o] = col < k ? (perm ? __ldg(perm + col) : col) : -1;
            }
        }
#pragma unroll
        for (int r = 0; r < 16; ++r) {
            if (r0 + r >= m) break;
            const T* xr = x + (size_t)(r0 + r) * k;
#pragma unroll
            for (int q = 0; q < 32; ++q) {
                const float xv = cols[q] >= 0 ? Io<T>::load(xr, cols[q]) : 0.0f;
                acc[r] = fmaf(wf[q], xv, acc[r]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < 16; ++r) {
        float v = acc[r];
        v += __shfl_xor_sync(0xffffffffu, v, 1);
        v += __shfl_xor_sync(0xffffffffu, v, 2);
        if (t == 0) part[s][r][g] = v;
    }
    __syncthreads();
    if (s != 0 || t != 0) return;
    const int col = nt * 8 + g;
    for (int r = 0; r < 16 && r0 + r < m; ++r) {
        float total = 0.0f;
        for (int q = 0; q < ks; ++q) total += part[q][r][g];
        if (col < n) w4_store<T>(out, out_f32, r0 + r, n, col, total);
    }
}

#define W4_ARGS(T)                                                                              \
    const T *x, int m, int k, const uint4 *qw, const T *scales, const unsigned char *zeros,     \
        const int *perm, int kblocks, int ks, int gshift, int gstore, int n, void *out,        \
        int out_f32, int fp4
#define W4_PASS x, m, k, qw, scales, zeros, perm, kblocks, ks, gshift, gstore, n, out, out_f32

// The x-staged `w4_gemvx1_*` / `w4_gemvx2_*` (9..32 rows, below; 1..8 rows: `w4_gemv_*` of
// kernels/w4a16_gemv.cu) run only the fast variants: the host launches them when k % 128 == 0,
// no perm, and (NVFP4 or groups of >= 32 columns); everything else (9+ rows) runs
// `w4_gemv32_*` (RG 4, 2 blocks per SM; its generic variant handles any layout).
#define W4_FAST_PASS x, m, k, qw, scales, zeros, kblocks, ks, gshift, gstore, n, out, out_f32

#define W4_TC_ENTRIES(SUF, T)                                                                   \
    extern "C" __global__ void __launch_bounds__(256, 2) w4_gemv32_##SUF(W4_ARGS(T)) {            \
        __shared__ float part[W4_MAX_KS * 4 * 4 * 32];                                           \
        const bool fx = perm == nullptr && (k & 127) == 0 && (fp4 || gshift > 0);                \
        if (fp4) {                                                                               \
            if (fx) w4_gemv<T, 4, true, true>(W4_PASS, part);                                    \
            else w4_gemv<T, 4, true, false>(W4_PASS, part);                                      \
        } else {                                                                                 \
            if (fx) w4_gemv<T, 4, false, true>(W4_PASS, part);                                   \
            else w4_gemv<T, 4, false, false>(W4_PASS, part);                                     \
        }                                                                                        \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(256, 1) w4_gemm_##SUF(W4_ARGS(T), int stages,  \
                                                                       int tiles) {             \
        if (fp4) w4_gemm<T, true>(W4_PASS, stages, tiles);                                       \
        else w4_gemm<T, false>(W4_PASS, stages, tiles);                                          \
    }
W4_TC_ENTRIES(f16, __half)
W4_TC_ENTRIES(bf16, bf16_t)

// The x-staged GEMV (`w4_gemv_xs`, steps of 9..32 rows on the fast layouts, 16-row blocks: RG =
// 2, 2 x stages per slice, ptxas capped at 64 registers): one m16 tile per block (`w4_gemvx1_*`,
// 4 blocks of 256 per SM) or two sharing the x stages (`w4_gemvx2_*`, 2 blocks of 512). The
// H200 measurements behind the choice are in docs/benchmarks.md ("the x-staged W4A16 GEMV").
#define W4_XS(T, P)                                                                               \
    if (fp4) w4_gemv_xs<T, 2, true, false, P, 2>(W4_FAST_PASS, trig);                            \
    else if (zeros) w4_gemv_xs<T, 2, false, true, P, 2>(W4_FAST_PASS, trig);                     \
    else w4_gemv_xs<T, 2, false, false, P, 2>(W4_FAST_PASS, trig);
#define W4_XS_ENTRIES(SUF, T)                                                                     \
    extern "C" __global__ void __launch_bounds__(256, 4) w4_gemvx1_##SUF(W4_ARGS(T), int trig) {  \
        W4_XS(T, 1)                                                                               \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(512, 2) w4_gemvx2_##SUF(W4_ARGS(T), int trig) {  \
        W4_XS(T, 2)                                                                               \
    }
W4_XS_ENTRIES(f16, __half)
W4_XS_ENTRIES(bf16, bf16_t)

#define W4_FMA_ENTRY(SUF, T)                                                                    \
    extern "C" __global__ void w4_fma_##SUF(W4_ARGS(T)) { w4_fma<T>(W4_PASS, fp4); }
KILN_FOR_FLOAT_TYPES(W4_FMA_ENTRY)
