// w4a16_gemv.cu: the W4A16 GEMV for steps of 1..8 rows on the fast layouts (`w4_gemv_{f16,bf16}`,
// issue 10 item 7) and its measured variants (`w4_gemv{V}_{f16,bf16}`, the list of
// src/backend/cuda/backend/w4a16_gemv.rs `W4_GEMV_VARIANTS`, picked by `KILN_W4_GEMV`; the default
// is `w4_gemvhp2`: POL 1 and PF 2 below, measured fastest on the H200, docs/benchmarks.md).
//
// What NVRTC compiles: common.cuh, then kernels/w4a16.cu up to its entry points (the layout, the
// decode helpers W4Dec / w4_decode_any / w4_szf / w4_store, the PDL helpers: the same code, not
// a copy; src/backend/cuda/kernels.rs `KernelModule::full_source`), then kernels/w4a16_hints.cuh
// (the L2 hints below, shared with w4a16_xs.cu), then this file.
//
// Numerics: w4a16.cu's header, "ONE NUMERIC PATH FOR EVERY ROW COUNT" (the same fragments, k order
// within a K slice and slice sum as `w4_gemv32` / `w4_gemvx*` / the GEMMs: bit-identical outputs,
// tests/cuda_w4a16.rs). The variants differ only in how the weights are fetched:
// - POL 1: the weight words are loaded with the L2 evict-first policy (`createpolicy` once per
//   thread, `ld.global.nc.L1::no_allocate.L2::cache_hint`): they are read once per step, so they
//   should not push x, the (scale, zero) words or the next kernel's data out of the L2; nor are
//   they kept in the L1 (no lane reads a weight word twice).
// - PF > 0: each warp asks the L2 for its two tiles' k block PF ahead of the one it consumes
//   (`prefetch.global.L2`, no registers), so the register ring's loads mostly hit the L2: more
//   bytes in flight than the ring depth D alone gives, at two instructions per k block.
// - D / blocks per SM: the register ring depth and the `__launch_bounds__` occupancy.
// - READ (the read ceiling, not a GEMV: its output is not a product): the same grid, ring and
//   loads (weights, (scale, zero) words, x) with no decode and no mma, the loaded words XOR-ed
//   into one word per lane that is stored once per slice (so that no load is dead).
// A backend compiles only the build(s) it runs (W4V_MASK_*, below the kernels' helpers).

// The L2 hints (POL, PF: `w4v_policy`, `w4v_ldw`, `w4v_prefetch_l2`) are kernels/w4a16_hints.cuh's,
// compiled in before this file (`KernelModule::full_source`), shared with w4a16_xs.cu.

// One k block of a warp's two tiles into the accumulators of RG row groups: lane words `w`
// (tile 0, tile 1), (scale[, zero]) words `sz` (chunks 0..3; `szh` chunks 4..7 for NVFP4's groups
// of 16 columns), x words `xr`: chunks 0..7 in order, the fixed fragments of w4a16.cu's header
// (every 1..8-row build runs this one sequence, so their bits agree).
template <typename T, int RG, bool FP4, bool ZP>
__device__ __forceinline__ void w4v_kblock(float (&acc)[RG][4], const uint4 (&w)[2], const unsigned (&sz)[2],
                                           const unsigned (&szh)[2], const uint4 (&xr)[RG][4]) {
    constexpr bool G16 = FP4;
    const unsigned zc = W4Dec<T>::bias(8);
    const unsigned s0l = __byte_perm(sz[0], 0u, 0x1010), s1l = __byte_perm(sz[1], 0u, 0x1010);
    const unsigned z0l = ZP ? W4Dec<T>::bias((int)(sz[0] >> 16)) : zc;
    const unsigned z1l = ZP ? W4Dec<T>::bias((int)(sz[1] >> 16)) : zc;
    const unsigned s0h = G16 ? __byte_perm(szh[0], 0u, 0x1010) : s0l;
    const unsigned s1h = G16 ? __byte_perm(szh[1], 0u, 0x1010) : s1l;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        unsigned d0[4], d1[4];
        w4_decode_any<T, FP4>(w4_word(w[0], q), q < 2 ? s0l : s0h, z0l, d0);
        w4_decode_any<T, FP4>(w4_word(w[1], q), q < 2 ? s1l : s1h, z1l, d1);
        const unsigned a0[4] = {d0[0], d1[0], d0[1], d1[1]};  // chunk 2q
        const unsigned a1[4] = {d0[2], d1[2], d0[3], d1[3]};  // chunk 2q + 1
#pragma unroll
        for (int rg = 0; rg < RG; ++rg) {
            mma_m16n8k16<T>(acc[rg], a0, xr[rg][q].x, xr[rg][q].y);
            mma_m16n8k16<T>(acc[rg], a1, xr[rg][q].z, xr[rg][q].w);
        }
    }
}

// The 8-row GEMV (`w4_gemv_fast` with RG = 1): 1 k block of weights in flight per warp (the
// register ring's depth) at 5 resident blocks of 256 per SM (48 registers). On the H200 this was
// the best of the measured (depth, blocks) pairs 1/5, 1/6, 2/4, 2/5, 3/3, 4/2, 6/2, 1/8 for
// K = 5120 / 6144 and equal to the best (3/3) for K = 17408, and two slices per warp in blocks
// of 4 warps was slower at 1 row (docs/benchmarks.md, "the fast W4A16 GEMV"). The generic
// RG = 4 `w4_gemv` of w4a16.cu keeps a 2-deep ring.
#define W4_GEMV_DEPTH 1
#define W4_GEMV_BLOCKS 5

// The fast GEMV (`w4_gemv_*`, RG = 1: 1..8 rows; the host launches it only on layouts with
// k % 128 == 0, no perm, and NVFP4 or groups of >= 32 columns, and only with m <= 8 RG, so every
// row group of the block exists): the same fragments,
// k order and slice sum as `w4_gemv` above, with the per-block overhead cut (issue 10: 224 warp
// instructions per KB of weights, 38% of them address, guard and zero-point work, in the
// profile of docs/benchmarks.md). The differences are in the bookkeeping only:
// - ZP is a template flag: symmetric formats load no zero point and decode with the constant
//   bias of 8; G16 (NVFP4, groups of 16 columns) is the only variant that reads a second
//   (scale) word per k block.
// - pointers are advanced per slot from bases fixed before the loop (k block j of the slice at
//   base + j * stride), so a slot's loads are one address computation and immediate offsets;
// - one uniform branch per k block (the slice length `per` is a runtime value), none per mma;
// - D k blocks of weights and (scale[, zero]) words in flight per warp in a register ring.
template <typename T, int RG, bool FP4, bool ZP, int D, int POL = 0, int PF = 0, bool READ = false>
__device__ __forceinline__ void w4_gemv_fast(const T* x, int m, int k, const uint4* __restrict__ qw,
                                             const T* scales, const unsigned char* zeros,
                                             int kblocks, int ks, int gshift, int gstore, int n,
                                             void* out, int out_f32, float* part, int trig) {
    constexpr bool G16 = FP4;
    static_assert(POL == 0 || POL == 1, "weight load policy");
    static_assert(PF >= 0 && PF <= 8, "L2 prefetch distance");
    if (trig == 0) w4_pdl_launch_dependents();
    const unsigned long long pol = w4v_policy<POL>();
    const int lane = threadIdx.x & 31, s = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int nt0 = blockIdx.x * 2;
    const int r0 = blockIdx.y * 8 * RG;
    // Warp s runs slices s * S .. s * S + S - 1 one after another, its k blocks contiguous
    // (S = ks / warps per block: the host launches one warp per slice, S = 1; blocks of fewer
    // warps, S = 2, were measured and were slower at 1 row).
    const int nw = blockDim.x >> 5, S = ks / nw;
    const int per = kblocks / ks, kb0 = s * S * per, nkb = S * per;
    const unsigned short* xs = reinterpret_cast<const unsigned short*>(x);
    // Lane x words of row group rg from the slice's first k block (rows past m read row m - 1:
    // a row of x reaches only its own output column, which is not stored).
    const uint4* xp[RG];
#pragma unroll
    for (int rg = 0; rg < RG; ++rg)
        xp[rg] = reinterpret_cast<const uint4*>(xs + (size_t)min(r0 + 8 * rg + g, m - 1) * k + 32 * t) +
                 (size_t)kb0 * 16;
    const uint4* wp0 = qw + ((size_t)nt0 * kblocks + kb0) * 32 + lane;
    const uint4* wp1 = wp0 + (size_t)kblocks * 32;
    // Tile 0's (scale, zero) column; tile 1's is `sstride` elements on (32-bit offsets from one
    // base per array: fewer live 64-bit pointers under the 8-row build's 48-register cap).
    const unsigned sstride = (unsigned)gstore * 8u;
    const size_t sbase = (size_t)nt0 * sstride + g;
    const unsigned short* sp0 = reinterpret_cast<const unsigned short*>(scales) + sbase;
    const unsigned char* zp0 = ZP ? zeros + sbase : nullptr;
    // Opaque to the optimiser, so that it keeps the two pointers instead of re-deriving them
    // from the kernel parameters in 64-bit arithmetic at every load.
    asm("" : "+l"(sp0));
    asm("" : "+l"(zp0));
    // 16-column chunk index of the lane's chunks 0..1 in k block kb0 (>> gshift: its group).
    const unsigned gbase = (unsigned)(kb0 * 8 + 2 * t);
    float acc[RG][4];
#pragma unroll
    for (int h = 0; h < RG; ++h)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[h][e] = 0.0f;
    uint4 wr[D][2];
    unsigned rd = 0u;  // READ: the XOR of every loaded word
    unsigned sz[D][2], szh[D][2];
    // Slot d's loads for k block `j` of the slice; `wq0` / `wq1` point at the ring's current
    // first k block (jb) and `o` = j - jb is a compile-time offset in the loop below, so the
    // weight loads are immediate offsets from pointers bumped once per D k blocks.
    // `gq` is the chunk index of k block jb (gbase + 8 jb).
    auto load = [&](int d, const uint4* wq0, const uint4* wq1, unsigned gq, int o) {
        wr[d][0] = w4v_ldw<POL>(wq0 + o * 32, pol);
        wr[d][1] = w4v_ldw<POL>(wq1 + o * 32, pol);
        const unsigned glo = (gq + 8u * o) >> gshift;
        sz[d][0] = w4_szf<ZP>(sp0, zp0, glo * 8u);
        sz[d][1] = w4_szf<ZP>(sp0, zp0, glo * 8u + sstride);
        if (G16) {
            const unsigned ghi = (gq + 8u * o + 1u) >> gshift;
            szh[d][0] = w4_szf<ZP>(sp0, zp0, ghi * 8u);
            szh[d][1] = w4_szf<ZP>(sp0, zp0, ghi * 8u + sstride);
        }
    };
    // After each k block: at a slice's end its sum goes to `part` and the accumulator restarts
    // from zero (`left` counts the slice's k blocks still to come).
    float(*pp)[RG][4][32] = reinterpret_cast<float(*)[RG][4][32]>(part);
    int left = per, slice = s * S;
    auto slice_end = [&]() {
        if (--left == 0) {
            if (READ) acc[0][0] = __uint_as_float(rd);
#pragma unroll
            for (int h = 0; h < RG; ++h)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    pp[slice][h][e][lane] = acc[h][e];
                    acc[h][e] = 0.0f;
                }
            left = per;
            ++slice;
        }
    };
    auto consume = [&](int d, const uint4* const* xq, int o) {
        uint4 xr[RG][4];
#pragma unroll
        for (int rg = 0; rg < RG; ++rg)
#pragma unroll
            for (int q = 0; q < 4; ++q) xr[rg][q] = __ldg(xq[rg] + o * 16 + q);
        if (READ) {
            // The read ceiling: every loaded word reaches `rd`, nothing is decoded.
#pragma unroll
            for (int j = 0; j < 2; ++j) rd ^= wr[d][j].x ^ wr[d][j].y ^ wr[d][j].z ^ wr[d][j].w ^ sz[d][j];
#pragma unroll
            for (int rg = 0; rg < RG; ++rg)
#pragma unroll
                for (int q = 0; q < 4; ++q) rd ^= xr[rg][q].x ^ xr[rg][q].y ^ xr[rg][q].z ^ xr[rg][q].w;
            return;
        }
        w4v_kblock<T, RG, FP4, ZP>(acc, wr[d], sz[d], szh[d], xr);
    };
#pragma unroll
    for (int d = 0; d < D; ++d)
        if (d < nkb) load(d, wp0, wp1, gbase, d);
    w4_pdl_wait();  // weights and (scale[, zero]) words only above; x from here on
    const uint4* wq0 = wp0;
    const uint4* wq1 = wp1;
    unsigned gq = gbase;
    for (int i = 0; i < nkb; i += D) {
#pragma unroll
        for (int d = 0; d < D; ++d) {
            if (i + d < nkb) {
                if (PF > 0 && i + d + PF < nkb) {
                    w4v_prefetch_l2(wq0 + (d + PF) * 32);
                    w4v_prefetch_l2(wq1 + (d + PF) * 32);
                }
                consume(d, xp, d);
                if (i + d + D < nkb) load(d, wq0, wq1, gq, d + D);
                slice_end();
            }
        }
        wq0 += D * 32;
        wq1 += D * 32;
        gq += 8u * D;
#pragma unroll
        for (int rg = 0; rg < RG; ++rg) xp[rg] += D * 16;
    }
    if (trig != 0) w4_pdl_launch_dependents();
    __syncthreads();
    // Warp he (and he + nw, ...) sums element e of row group h over the slices in order.
    for (int he = s; he < RG * 4; he += nw) {
        const int h = he >> 2, e = he & 3;
        float total = 0.0f;
        for (int q = 0; q < ks; ++q) total += pp[q][h][e][lane];
        const int row = r0 + 8 * h + 2 * t + (e & 1);
        const int col = nt0 * 8 + g + (e >= 2 ? 8 : 0);
        if (row < m && col < n) w4_store<T>(out, out_f32, row, n, col, total);
    }
}

// THE PERSISTENT GEMV (`w4_gemvq{D}*` builds, sm_80+ 1..8 rows; issue 10 item 7): the grid is
// G <= Np / 16 blocks of ks warps (the host picks G: [`w4_gemv_grid`] in w4a16_gemv.rs), block b
// runs tile pairs b, b + G, b + 2G, ... and warp s slice s of each, so a warp streams its k blocks
// of one tile pair after the other through ONE register ring of D k blocks that never drains
// between tile pairs (the plain grid fills and drains its ring per block, and 17408 x 5120's
// 1 088 blocks make 1.65 waves of 5 blocks per SM). Each tile pair is summed as in
// `w4_gemv_fast`: the slice sums go to a shared buffer (two of them, alternating by tile pair,
// so one __syncthreads per tile pair suffices), then warps 0..3 add them in slice order and store
// (same fragments, k order, slice sum: the same bits). Weights with the L2 evict-first policy;
// PF > 0: each weight load of k block j of a tile pair also asks the L2 for k block j + PF of the
// same tile pair. READ: the read ceiling of this shape (no decode, no mma; the words XOR-ed into
// the stored value: not a product).
template <typename T, bool FP4, bool ZP, int D, int PF, bool READ>
__device__ __forceinline__ void w4_gemv_pers(const T* x, int m, int k, const uint4* __restrict__ qw,
                                             const T* scales, const unsigned char* zeros,
                                             int kblocks, int ks, int gshift, int gstore, int n,
                                             void* out, int out_f32, float* part, int trig) {
    constexpr bool G16 = FP4;
    static_assert(D >= 1 && D <= 8 && PF >= 0 && PF <= 8, "ring depth, prefetch distance");
    if (trig == 0) w4_pdl_launch_dependents();
    const unsigned long long pol = w4v_policy<1>();
    const int lane = threadIdx.x & 31, s = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int per = kblocks / ks, kb0 = s * per;
    const int tps = ((n + 63) >> 6) * 4;  // Np / 16 (Np: n rounded up to 64)
    const int G = gridDim.x, tp0 = blockIdx.x;
    const int ntp = tp0 < tps ? (tps - 1 - tp0) / G + 1 : 0;
    const int nkb = ntp * per;  // the warp's k blocks, tile pair after tile pair
    const uint4* xq = reinterpret_cast<const uint4*>(reinterpret_cast<const unsigned short*>(x) +
                                                     (size_t)min(g, m - 1) * k + 32 * t) +
                      (size_t)kb0 * 16;
    // The load cursor: k block lj of the slice in the tile pair at `lw` (tile 0's lane word; tile
    // 1's is `w1` words on), its (scale, zero) column at element `ls` (tile 1's `sstride` on).
    const unsigned w1 = (unsigned)kblocks * 32u;
    const size_t wstep = (size_t)G * 2u * w1;  // words from one tile pair of the block to the next
    const unsigned sstride = (unsigned)gstore * 8u, sstep = 2u * (unsigned)G * sstride;
    const uint4* lw = qw + ((size_t)tp0 * 2u * w1 + (unsigned)kb0 * 32u) + lane;
    unsigned ls = (unsigned)tp0 * 2u * sstride + (unsigned)g;
    int lj = 0;
    const unsigned short* sp0 = reinterpret_cast<const unsigned short*>(scales);
    const unsigned char* zp0 = ZP ? zeros : nullptr;
    uint4 wr[D][2];
    unsigned sz[D][2], szh[D][2];
    unsigned rd = 0u;
    auto load = [&](int d) {
        wr[d][0] = w4v_ldw<1>(lw, pol);
        wr[d][1] = w4v_ldw<1>(lw + w1, pol);
        if (PF > 0 && lj + PF < per) {
            w4v_prefetch_l2(lw + PF * 32);
            w4v_prefetch_l2(lw + w1 + PF * 32);
        }
        const unsigned gc = (unsigned)(kb0 + lj) * 8u + 2u * (unsigned)t;
        const unsigned glo = gc >> gshift;
        sz[d][0] = w4_szf<ZP>(sp0, zp0, ls + glo * 8u);
        sz[d][1] = w4_szf<ZP>(sp0, zp0, ls + glo * 8u + sstride);
        if (G16) {
            const unsigned ghi = (gc + 1u) >> gshift;
            szh[d][0] = w4_szf<ZP>(sp0, zp0, ls + ghi * 8u);
            szh[d][1] = w4_szf<ZP>(sp0, zp0, ls + ghi * 8u + sstride);
        }
        if (++lj == per) {
            lj = 0;
            lw += wstep - (size_t)(per - 1) * 32u;
            ls += sstep;
        } else {
            lw += 32;
        }
    };
    float acc[1][4] = {{0.0f, 0.0f, 0.0f, 0.0f}};
    float(*pp)[W4_MAX_KS][4][32] = reinterpret_cast<float(*)[W4_MAX_KS][4][32]>(part);
    int cj = 0, ctp = tp0, buf = 0;  // the consume cursor: k block cj of the slice of tile pair ctp
#pragma unroll
    for (int d = 0; d < D; ++d)
        if (d < nkb) load(d);
    w4_pdl_wait();  // weights and (scale[, zero]) words only above; x from here on
    for (int i = 0; i < nkb; i += D) {
#pragma unroll
        for (int d = 0; d < D; ++d) {
            if (i + d < nkb) {
                uint4 xr[1][4];
#pragma unroll
                for (int q = 0; q < 4; ++q) xr[0][q] = __ldg(xq + cj * 16 + q);
                if (READ) {
#pragma unroll
                    for (int j = 0; j < 2; ++j)
                        rd ^= wr[d][j].x ^ wr[d][j].y ^ wr[d][j].z ^ wr[d][j].w ^ sz[d][j];
#pragma unroll
                    for (int q = 0; q < 4; ++q) rd ^= xr[0][q].x ^ xr[0][q].y ^ xr[0][q].z ^ xr[0][q].w;
                } else {
                    w4v_kblock<T, 1, FP4, ZP>(acc, wr[d], sz[d], szh[d], xr);
                }
                if (i + d + D < nkb) load(d);
                if (++cj == per) {
                    // The slice's sum into buffer `buf`; after the barrier warps 0..3 add the
                    // ks sums of this tile pair in slice order (the other buffer is the next
                    // tile pair's: its writers pass this barrier's successor only after the
                    // readers here are done).
                    if (READ) acc[0][0] = __uint_as_float(rd);
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        pp[buf][s][e][lane] = acc[0][e];
                        acc[0][e] = 0.0f;
                    }
                    cj = 0;
                    __syncthreads();
                    for (int e = s; e < 4; e += ks) {
                        float total = 0.0f;
                        for (int q = 0; q < ks; ++q) total += pp[buf][q][e][lane];
                        const int row = 2 * t + (e & 1);
                        const int col = ctp * 16 + g + (e >= 2 ? 8 : 0);
                        if (row < m && col < n) w4_store<T>(out, out_f32, row, n, col, total);
                    }
                    buf ^= 1;
                    ctp += G;
                }
            }
        }
    }
    if (trig != 0) w4_pdl_launch_dependents();
}

// THE SHARED-MEMORY RING (`w4_gemva{A}` builds): the same GEMV with each warp's weights and
// (scale[, zero]) words copied by cp.async into a private ring of A stages in shared memory, A - 1
// k blocks ahead of the one it decodes: the bytes in flight per warp no longer cost registers
// (the register ring holds one k block at 48 registers; a deeper one cut the resident blocks).
// Stage layout (W4V_STAGE uint4 words): [0, 32) lane l's word of tile 0, [32, 64) of tile 1 (each
// lane copies and reads back its own two words), [64] the 8 scales of tile 0's group of this k
// block, [65] tile 1's, [66] the zero points (8 bytes per tile; ZP only) — copied by lanes 0..3
// and read by all after a __syncwarp. Only for int4 with groups of >= 128 columns (gshift >= 3:
// one group per k block for every lane); other layouts run `w4_gemv_fast` (the host never asks,
// the kernel checks). Decode, mma, k order and slice sums are `w4_gemv_fast`'s (same bits).
#define W4V_STAGE 68
__device__ __forceinline__ void w4v_cp16(unsigned dst, const void* src, unsigned long long pol, bool hint) {
#if W4V_HINTS
    if (hint) {
        // src-size (16) before the policy: without it the policy register is read as the src-size
        // (an illegal instruction on the H200, run 1).
        asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, 16, %2;" ::"r"(dst), "l"(src), "l"(pol));
    } else {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src));
    }
#else
    __trap();
#endif
}
__device__ __forceinline__ void w4v_cp8(unsigned dst, const void* src) {
#if W4V_HINTS
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(dst), "l"(src));
#else
    __trap();
#endif
}
__device__ __forceinline__ uint4 w4v_lds16(unsigned a) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a));
    return v;
}
__device__ __forceinline__ unsigned w4v_lds_u16(unsigned a) {
    unsigned short v;
    asm volatile("ld.shared.u16 %0, [%1];" : "=h"(v) : "r"(a));
    return v;
}
__device__ __forceinline__ unsigned w4v_lds_u8(unsigned a) {
    unsigned v;
    asm volatile("ld.shared.u8 %0, [%1];" : "=r"(v) : "r"(a));
    return v;
}

template <typename T, bool ZP, int A, int POL>
__device__ __forceinline__ void w4_gemv_cpa(const T* x, int m, int k, const uint4* __restrict__ qw,
                                            const T* scales, const unsigned char* zeros,
                                            int kblocks, int ks, int gshift, int gstore, int n,
                                            void* out, int out_f32, float* part, uint4* ring,
                                            int trig) {
    static_assert(A >= 2 && A <= 8, "ring stages");
    constexpr unsigned STB = W4V_STAGE * 16;  // bytes of one stage
    if (trig == 0) w4_pdl_launch_dependents();
    const unsigned long long pol = w4v_policy<POL>();
    const int lane = threadIdx.x & 31, s = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int nt0 = blockIdx.x * 2;
    const int r0 = blockIdx.y * 8;
    const int per = kblocks / ks, kb0 = s * per;
    // The warp's stage 0 (shared address) and the lane's own weight slot in it.
    const unsigned wsh = (unsigned)__cvta_generic_to_shared(ring + s * A * W4V_STAGE);
    const unsigned lsh = wsh + lane * 16;
    const uint4* xp = reinterpret_cast<const uint4*>(reinterpret_cast<const unsigned short*>(x) +
                                                     (size_t)min(r0 + g, m - 1) * k + 32 * t) +
                      (size_t)kb0 * 16;
    const uint4* wq = qw + ((size_t)nt0 * kblocks + kb0) * 32 + lane;
    const unsigned wstride = (unsigned)kblocks * 32u;
    // Lanes 0 / 1 copy tile `lane`'s scales, lanes 2 / 3 (ZP) its zero points, to
    // `csh`: the group of k block j of the slice is (kb0 + j) >> (gshift - 3).
    const int ct = lane & 1;
    const unsigned csh = wsh + (lane < 2 ? (64 + ct) * 16 : 66 * 16 + 8 * ct);
    const size_t cbase = (size_t)(nt0 + ct) * gstore * 8;
    const unsigned short* sq = reinterpret_cast<const unsigned short*>(scales) + cbase;
    const unsigned char* zq = ZP ? zeros + cbase : nullptr;
    const int gsh = gshift - 3;
    auto issue = [&](int j, unsigned so) {  // k block kb0 + j into the stage at byte offset so
        w4v_cp16(lsh + so, wq + j * 32, pol, POL == 1);
        w4v_cp16(lsh + so + 512, wq + wstride + j * 32, pol, POL == 1);
        const unsigned gi = (unsigned)(kb0 + j) >> gsh;
        if (lane < 2) w4v_cp16(csh + so, sq + gi * 8u, pol, false);
        else if (ZP && lane < 4) w4v_cp8(csh + so, zq + gi * 8u);
    };
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    float(*pp)[1][4][32] = reinterpret_cast<float(*)[1][4][32]>(part);
#pragma unroll
    for (int j = 0; j < A - 1; ++j) {
        if (j < per) issue(j, j * STB);
        w4x_commit();
    }
    w4_pdl_wait();  // weights and (scale[, zero]) words only above; x from here on
    const unsigned zc = W4Dec<T>::bias(8);
    unsigned rs = 0, ws = (A - 1) * STB;  // byte offsets of the stage read / written next
    for (int j = 0; j < per; ++j) {
        __syncwarp();  // every lane is done with the stage at `ws` (read at j - 1) before the refill
        if (j + A - 1 < per) issue(j + A - 1, ws);
        w4x_commit();
        ws = ws == (A - 1) * STB ? 0u : ws + STB;
        uint4 xr[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) xr[q] = __ldg(xp + j * 16 + q);
        w4x_wait<A - 1>();
        __syncwarp();  // lanes 0..3's copies of stage j are visible to the warp
        const uint4 w0 = w4v_lds16(lsh + rs), w1 = w4v_lds16(lsh + rs + 512);
        const unsigned s0 = __byte_perm(w4v_lds_u16(wsh + rs + 64 * 16 + 2 * g), 0u, 0x1010);
        const unsigned s1 = __byte_perm(w4v_lds_u16(wsh + rs + 65 * 16 + 2 * g), 0u, 0x1010);
        const unsigned z0 = ZP ? W4Dec<T>::bias((int)w4v_lds_u8(wsh + rs + 66 * 16 + g)) : zc;
        const unsigned z1 = ZP ? W4Dec<T>::bias((int)w4v_lds_u8(wsh + rs + 66 * 16 + 8 + g)) : zc;
        rs = rs == (A - 1) * STB ? 0u : rs + STB;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            unsigned d0[4], d1[4];
            w4_decode_any<T, false>(w4_word(w0, q), s0, z0, d0);
            w4_decode_any<T, false>(w4_word(w1, q), s1, z1, d1);
            const unsigned a0[4] = {d0[0], d1[0], d0[1], d1[1]};  // chunk 2q
            const unsigned a1[4] = {d0[2], d1[2], d0[3], d1[3]};  // chunk 2q + 1
            mma_m16n8k16<T>(acc, a0, xr[q].x, xr[q].y);
            mma_m16n8k16<T>(acc, a1, xr[q].z, xr[q].w);
        }
    }
    w4x_wait<0>();
    if (trig != 0) w4_pdl_launch_dependents();
#pragma unroll
    for (int e = 0; e < 4; ++e) pp[s][0][e][lane] = acc[e];
    __syncthreads();
    const int nw = blockDim.x >> 5;
    for (int e = s; e < 4; e += nw) {
        float total = 0.0f;
        for (int q = 0; q < ks; ++q) total += pp[q][0][e][lane];
        const int row = r0 + 2 * t + (e & 1);
        const int col = nt0 * 8 + g + (e >= 2 ? 8 : 0);
        if (row < m && col < n) w4_store<T>(out, out_f32, row, n, col, total);
    }
}

// Which builds this compile emits (the others trap; src/backend/cuda/kernels.rs
// `KernelModule::defines` sets the masks: a backend compiles the build(s) it runs, for its dtype
// only, unless `KILN_W4_GEMV_BUILDS=all`): bit I of W4V_MASK_{f16,bf16} is build I of
// `W4_GEMV_VARIANTS`. Undefined (the compile test, `kiln doctor`): every build.
#ifndef W4V_MASK_f16
#define W4V_MASK_f16 (~0ull)
#endif
#ifndef W4V_MASK_bf16
#define W4V_MASK_bf16 (~0ull)
#endif
#define W4V_ON(SUF, I) (((W4V_MASK_##SUF) >> (I)) & 1ull)

#define W4V_ARGS(T)                                                                             \
    const T *x, int m, int k, const uint4 *qw, const T *scales, const unsigned char *zeros,     \
        const int *perm, int kblocks, int ks, int gshift, int gstore, int n, void *out,        \
        int out_f32, int fp4, int trig
#define W4V_PASS x, m, k, qw, scales, zeros, kblocks, ks, gshift, gstore, n, out, out_f32, part, trig

// One entry: `NAME` with B resident blocks of 256 (the register cap), ring depth D, weight load
// policy POL, L2 prefetch distance PF, READ (the read ceiling); the fast variant by the format
// (NVFP4, int4 with zero points, symmetric int4). `perm` is unused (the fast layouts have none).
#define W4V_ENTRY(SUF, I, NAME, T, B, D, POL, PF, READ)                                          \
    extern "C" __global__ void __launch_bounds__(256, B) NAME(W4V_ARGS(T)) {                     \
        __shared__ float part[W4_MAX_KS * 1 * 4 * 32];                                           \
        (void)perm;                                                                              \
        if (!W4V_ON(SUF, I)) __trap();                                                           \
        else if (fp4) w4_gemv_fast<T, 1, true, false, D, POL, PF, READ>(W4V_PASS);               \
        else if (zeros) w4_gemv_fast<T, 1, false, true, D, POL, PF, READ>(W4V_PASS);             \
        else w4_gemv_fast<T, 1, false, false, D, POL, PF, READ>(W4V_PASS);                      \
    }
// A shared-memory ring build (A stages per warp, ks <= 8 warps: 8 A 1088 + 4096 bytes of static
// shared memory, under the 48 KB static limit to A = 5; 5 blocks per SM to A = 4, 4 at A = 5):
// int4 with groups of >= 128 columns, anything else through the plain build's code. POL 1 (the
// copies with the L2 evict-first policy) raised CUDA_ERROR_ILLEGAL_INSTRUCTION on the H200 with
// either operand form of `cp.async...L2::cache_hint` (runs 1 and 2): no such build.
#define W4V_CPA_ENTRY(SUF, I, NAME, T, A, POL)                                                   \
    extern "C" __global__ void __launch_bounds__(256, 5) NAME(W4V_ARGS(T)) {                     \
        __shared__ float part[W4_MAX_KS * 1 * 4 * 32];                                           \
        __shared__ uint4 ring[W4_MAX_KS * A * W4V_STAGE];                                        \
        (void)perm;                                                                              \
        if (!W4V_ON(SUF, I)) __trap();                                                           \
        else if (fp4) w4_gemv_fast<T, 1, true, false, 1>(W4V_PASS);                                   \
        else if (gshift < 3) {                                                                   \
            if (zeros) w4_gemv_fast<T, 1, false, true, 1>(W4V_PASS);                             \
            else w4_gemv_fast<T, 1, false, false, 1>(W4V_PASS);                                  \
        } else if (zeros) w4_gemv_cpa<T, true, A, POL>(W4V_CPA_PASS);                            \
        else w4_gemv_cpa<T, false, A, POL>(W4V_CPA_PASS);                                        \
    }
// A persistent build (`w4_gemv_pers`): B resident blocks of 256, ring depth D, prefetch PF, READ.
#define W4V_PERS_ENTRY(SUF, I, NAME, T, B, D, PF, READ)                                          \
    extern "C" __global__ void __launch_bounds__(256, B) NAME(W4V_ARGS(T)) {                     \
        __shared__ float part[2 * W4_MAX_KS * 4 * 32];                                           \
        (void)perm;                                                                              \
        if (!W4V_ON(SUF, I)) __trap();                                                           \
        else if (fp4) w4_gemv_pers<T, true, false, D, PF, READ>(W4V_PASS);                            \
        else if (zeros) w4_gemv_pers<T, false, true, D, PF, READ>(W4V_PASS);                     \
        else w4_gemv_pers<T, false, false, D, PF, READ>(W4V_PASS);                               \
    }
#define W4V_CPA_PASS x, m, k, qw, scales, zeros, kblocks, ks, gshift, gstore, n, out, out_f32, part, ring, trig
// The entries of one dtype; the names and their order are w4a16_gemv.rs `W4_GEMV_VARIANTS`.
#define W4V_ENTRIES(SUF, T)                                                                      \
    W4V_ENTRY(SUF, 0, w4_gemv_##SUF, T, W4_GEMV_BLOCKS, W4_GEMV_DEPTH, 0, 0, false)            \
    W4V_ENTRY(SUF, 1, w4_gemvh_##SUF, T, 5, 1, 1, 0, false)                                    \
    W4V_ENTRY(SUF, 2, w4_gemvp2_##SUF, T, 5, 1, 0, 2, false)                                   \
    W4V_ENTRY(SUF, 3, w4_gemvhp2_##SUF, T, 5, 1, 1, 2, false)                                  \
    W4V_ENTRY(SUF, 4, w4_gemvhp4_##SUF, T, 5, 1, 1, 4, false)                                  \
    W4V_ENTRY(SUF, 5, w4_gemvd3b3_##SUF, T, 3, 3, 0, 0, false)                                 \
    W4V_ENTRY(SUF, 6, w4_gemvhd3b3_##SUF, T, 3, 3, 1, 0, false)                                \
    W4V_ENTRY(SUF, 7, w4_gemvhd2b4_##SUF, T, 4, 2, 1, 0, false)                                \
    W4V_ENTRY(SUF, 8, w4_gemvrd_##SUF, T, 5, 1, 0, 0, true)                                    \
    W4V_ENTRY(SUF, 9, w4_gemvhrd_##SUF, T, 5, 1, 1, 0, true)                                   \
    W4V_CPA_ENTRY(SUF, 10, w4_gemva3_##SUF, T, 3, 0)                                           \
    W4V_CPA_ENTRY(SUF, 11, w4_gemva4_##SUF, T, 4, 0)                                           \
    W4V_CPA_ENTRY(SUF, 12, w4_gemva5_##SUF, T, 5, 0)                                           \
    W4V_PERS_ENTRY(SUF, 13, w4_gemvq1_##SUF, T, 5, 1, 2, false)                                \
    W4V_PERS_ENTRY(SUF, 14, w4_gemvq2_##SUF, T, 4, 2, 2, false)                                \
    W4V_PERS_ENTRY(SUF, 15, w4_gemvq4_##SUF, T, 3, 4, 0, false)                                \
    W4V_PERS_ENTRY(SUF, 16, w4_gemvq1rd_##SUF, T, 5, 1, 2, true)                               \
    W4V_PERS_ENTRY(SUF, 17, w4_gemvq2rd_##SUF, T, 4, 2, 2, true)                               \
    W4V_PERS_ENTRY(SUF, 18, w4_gemvq4rd_##SUF, T, 3, 4, 0, true)
W4V_ENTRIES(f16, __half)
W4V_ENTRIES(bf16, bf16_t)
