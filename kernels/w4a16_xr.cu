// w4a16_xr.cu: the 17..64-row W4A16 cluster GEMV (sm_90+): `w4_gemvxr{NW}w{MT}t{RG}r{XS}s{B}b[hp{PF}]_{f16,bf16}`.
//
// What NVRTC compiles: common.cuh, kernels/w4a16.cu up to its entry points, w4a16_hints.cuh, then
// kernels/w4a16_xs.cu up to its entry points (the cluster helpers: barriers, distributed shared
// memory loads, the x swizzle `w4_xc_unit`; the same code, not a copy; `kernels.rs`
// `KernelModule::full_source`), then this file.
//
// Numerics: exactly those of w4a16.cu's `w4_gemv_xs` and w4a16_xs.cu's `w4_gemv_xc` (read
// w4a16.cu's header, "ONE NUMERIC PATH FOR EVERY ROW COUNT"): for each m16 output tile, row group
// of 8 rows and K slice s, P_s accumulates the slice's k blocks in ascending order, chunks 0..7 in
// order, each an mma.sync.m16n8k16 on the same decoded A fragments and the same x words from a
// zero f32 accumulator; the output is ((0 + P_0) + P_1) + ... + P_7 in f32, stored once. So its
// outputs equal the GEMV's and the GEMMs' bit for bit (tests/cuda_w4a16_xr.rs checks it).
//
// What differs from `w4_gemv_xc` (16 rows per CTA, one m16 tile per warp) is how many x rows one
// decode serves: a CTA holds 8 RG rows (RG = 4: 32, RG = 8: 64) and each warp MT m16 tiles, so a
// weight is decoded once for 8 RG rows (xc at 32 rows decodes it twice: the GEMV is issue-bound,
// the decode being ~120 of ~220 SASS instructions per k block), and each 128-bit x word read from
// shared memory feeds MT tiles' mmas (shared-memory reads per weight byte: RG / MT x 2 KB per KB).
// The 8 CTAs of a cluster (1, 1, 8) are the 8 K slices of NW MT tiles; CTA s copies its slice's x
// by cp.async through a ring of XS k-block stages (8 RG rows x 256 bytes each; whole slices do
// not fit at 32 rows of K = 17408: 136 KB), one commit group per k block issued XS - 1 blocks
// ahead, one __syncthreads per k block (block j landed everywhere, block j - 1's stage free). The
// weights and (scale, zero) words come through a register ring of 2 k blocks per warp as in
// `w4_gemv_xc`. The slice sums are added in slice order through distributed shared memory after a
// cluster barrier (as xc's barrier builds: `w4xc_slice_sum`), a second (relaxed) barrier keeping
// every CTA's shared memory alive until all reads are done.
//
// x layout in a stage: row r (0 .. 8 RG - 1) at r * 256 bytes, its 16-byte unit u at slot
// `w4_xc_unit(u, r)` (xc's rule: a B-fragment load phase hits 8 distinct bank groups); row group
// rg at rg * 2048.
//
// Launch (the host checks it, `w4a16_xr.rs`): grid (Np / (16 NW MT), ceil(m / (8 RG)), 8), 32 NW
// threads, cluster (1, 1, 8) (compiled in), ks == 8, dynamic shared memory max(XS x RG x 2048,
// NW x MT x RG x 512) bytes, 16-bit compute dtype, the fast layouts (k % 128 == 0, no perm,
// NVFP4 or groups of >= 32 columns), Np / 16 a multiple of NW MT, sm_90+ (below it the cluster
// helpers trap; the module is built only for sm_90+). Rows past m are zero-filled in shared
// memory and their outputs are not stored.
//
// PDL: the first 2 k blocks of weights and (scale, zero) words are loaded before
// griddepcontrol.wait (never written by a step); x is read and out written after it. `trig`
// places griddepcontrol.launch_dependents (0 first, 1 after the main loop).

template <typename T, bool FP4, bool ZP, int NW, int MT, int RG, int XS, int PF>
__device__ __forceinline__ void w4_gemv_xr(const T* x, int m, int k, const uint4* __restrict__ qw,
                                           const T* scales, const unsigned char* zeros,
                                           int kblocks, int gshift, int gstore, int n, void* out,
                                           int out_f32, int trig) {
    constexpr int D = 2;                  // weight register ring (k blocks per warp)
    constexpr bool G16 = FP4;
    constexpr int POL = PF > 0 ? 1 : 0;
    constexpr int NT = 32 * NW;           // threads
    constexpr int XB = RG * 2048;         // bytes of one x stage (8 RG rows x 256)
    constexpr int PIECES = RG * 128;      // 16-byte pieces of one stage
    constexpr int PPT = PIECES / NT;      // pieces per thread per stage
    static_assert(PIECES % NT == 0, "whole pieces per thread");
    static_assert(XS >= 2, "a ring of at least 2 stages");
    static_assert(MT * RG % 2 == 0, "whole values per thread in the slice-sum exchange");
    static_assert(PF >= 0 && PF <= 8, "L2 prefetch distance");
    extern __shared__ __align__(16) unsigned char w4_smem[];
    if (trig == 0) w4_pdl_launch_dependents();
    const unsigned long long pol = w4v_policy<POL>();
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int s = blockIdx.z;  // K slice = rank in the cluster (cluster dims (1, 1, 8))
    const int r0 = blockIdx.y * 8 * RG;
    const int per = kblocks / W4XC_KS, kb0 = s * per;
    const unsigned sm0 = (unsigned)__cvta_generic_to_shared(w4_smem);
    const unsigned sstride = (unsigned)gstore * 8u;
    // Warp w's m16 tiles: (blockIdx.x NW + w) MT + mt, i.e. n8 tiles 2 (that) and 2 (that) + 1.
    const uint4* wp[MT];
    const unsigned short* sp[MT];
    const unsigned char* zp[MT];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
        const int nt0 = ((blockIdx.x * NW + w) * MT + mt) * 2;
        wp[mt] = qw + ((size_t)nt0 * kblocks + kb0) * 32 + lane;
        const size_t sbase = (size_t)nt0 * sstride + g;
        sp[mt] = reinterpret_cast<const unsigned short*>(scales) + sbase;
        zp[mt] = ZP ? zeros + sbase : nullptr;
    }
    const size_t wstride = (size_t)kblocks * 32;  // n8 tile 2u -> 2u + 1
    const unsigned gbase = (unsigned)(kb0 * 8 + 2 * t);
    float acc[MT][RG][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int rg = 0; rg < RG; ++rg)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mt][rg][e] = 0.0f;
    uint4 wr[D][MT][2];
    unsigned sz[D][MT][2], szh[D][MT][2];
    // Slot d's loads for k block o of the slice (as `w4_gemv_xc`'s `load`, per tile).
    auto load = [&](int d, int o) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            wr[d][mt][0] = w4v_ldw<POL>(wp[mt] + o * 32, pol);
            wr[d][mt][1] = w4v_ldw<POL>(wp[mt] + wstride + o * 32, pol);
            const unsigned glo = (gbase + 8u * o) >> gshift;
            sz[d][mt][0] = w4_szf<ZP>(sp[mt], zp[mt], glo * 8u);
            sz[d][mt][1] = w4_szf<ZP>(sp[mt], zp[mt], glo * 8u + sstride);
            if (G16) {
                const unsigned ghi = (gbase + 8u * o + 1u) >> gshift;
                szh[d][mt][0] = w4_szf<ZP>(sp[mt], zp[mt], ghi * 8u);
                szh[d][mt][1] = w4_szf<ZP>(sp[mt], zp[mt], ghi * 8u + sstride);
            }
        }
    };
#pragma unroll
    for (int d = 0; d < D; ++d)
        if (d < per) load(d, d);
    w4_pdl_wait();  // weights and (scale[, zero]) words only above; x from here on

    // The x copy: piece pc = r * 16 + u of a stage (row r, unit u); thread i copies pieces
    // i + q NT, fixed per thread, its source stepped by a k block (W4_KB columns) per stage.
    const unsigned short* src[PPT];
    unsigned dst[PPT];
    int nb[PPT];
    {
        const unsigned short* xs = reinterpret_cast<const unsigned short*>(x) + (size_t)kb0 * W4_KB;
#pragma unroll
        for (int q = 0; q < PPT; ++q) {
            const unsigned pc = (unsigned)threadIdx.x + (unsigned)(q * NT);
            const unsigned r = pc >> 4, u = pc & 15u;
            const int row = r0 + (int)r;
            nb[q] = row < m ? 16 : 0;  // rows past m: zero-filled (row r0 as a valid address)
            src[q] = xs + (size_t)(row < m ? row : r0) * k + 8u * u;
            dst[q] = sm0 + r * 256u + (w4_xc_unit(u, r) << 4);
        }
    }
    // Issue k block j of the slice into its stage (nothing past the slice) and close its group.
    auto issue = [&](int j) {
        if (j < per) {
            const unsigned so = (unsigned)(j % XS) * (unsigned)XB;
#pragma unroll
            for (int q = 0; q < PPT; ++q) w4xc_cp16(dst[q] + so, src[q] + (size_t)j * W4_KB, nb[q]);
        }
        w4x_commit();
    };
#pragma unroll
    for (int j = 0; j < XS - 1; ++j) issue(j);
    // The lane's B-fragment word q of row group rg in a stage: xq[q] + rg * 2048 (xc's rule).
    unsigned xq[4];
    {
        const unsigned c = ((unsigned)(t >> 1) << 1) ^ (unsigned)(g & 1);
#pragma unroll
        for (int q = 0; q < 4; ++q) xq[q] = sm0 + (unsigned)g * 256u + ((unsigned)(4 * t) + ((unsigned)q ^ c)) * 16u;
    }

    auto consume = [&](int d, unsigned xoff) {
        const unsigned zc = W4Dec<T>::bias(8);
        unsigned s0l[MT], s1l[MT], s0h[MT], s1h[MT], z0l[MT], z1l[MT];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            s0l[mt] = __byte_perm(sz[d][mt][0], 0u, 0x1010);
            s1l[mt] = __byte_perm(sz[d][mt][1], 0u, 0x1010);
            z0l[mt] = ZP ? W4Dec<T>::bias((int)(sz[d][mt][0] >> 16)) : zc;
            z1l[mt] = ZP ? W4Dec<T>::bias((int)(sz[d][mt][1] >> 16)) : zc;
            s0h[mt] = G16 ? __byte_perm(szh[d][mt][0], 0u, 0x1010) : s0l[mt];
            s1h[mt] = G16 ? __byte_perm(szh[d][mt][1], 0u, 0x1010) : s1l[mt];
        }
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            unsigned a0[MT][4], a1[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                unsigned d0[4], d1[4];
                w4_decode_any<T, FP4>(w4_word(wr[d][mt][0], q), q < 2 ? s0l[mt] : s0h[mt], z0l[mt], d0);
                w4_decode_any<T, FP4>(w4_word(wr[d][mt][1], q), q < 2 ? s1l[mt] : s1h[mt], z1l[mt], d1);
                a0[mt][0] = d0[0], a0[mt][1] = d1[0], a0[mt][2] = d0[1], a0[mt][3] = d1[1];  // chunk 2q
                a1[mt][0] = d0[2], a1[mt][1] = d1[2], a1[mt][2] = d0[3], a1[mt][3] = d1[3];  // 2q + 1
            }
#pragma unroll
            for (int rg = 0; rg < RG; ++rg) {
                const uint4 xr = w4xc_lds128(xq[q] + xoff + (unsigned)rg * 2048u);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) {
                    mma_m16n8k16<T>(acc[mt][rg], a0[mt], xr.x, xr.y);
                    mma_m16n8k16<T>(acc[mt][rg], a1[mt], xr.z, xr.w);
                }
            }
        }
    };
    int o = 0;  // k block of the slice
    for (int i = 0; i < per; i += D) {
#pragma unroll
        for (int d = 0; d < D; ++d) {
            if (o < per) {
                w4x_wait<XS - 2>();
                __syncthreads();  // block o of x is in; every warp is done with block o - 1
                issue(o + XS - 1);  // into block o - 1's stage
                if (PF > 0 && o + PF < per) {
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt) {
                        w4v_prefetch_l2(wp[mt] + (o + PF) * 32);
                        w4v_prefetch_l2(wp[mt] + wstride + (o + PF) * 32);
                    }
                }
                consume(d, (unsigned)(o % XS) * (unsigned)XB);
                if (o + D < per) load(d, o + D);
            }
            ++o;
        }
    }
    w4x_wait<0>();  // the (empty) trailing groups
    if (trig != 0) w4_pdl_launch_dependents();
    __syncthreads();  // every warp is done with x: its space takes the slice sums
    float* part = reinterpret_cast<float*>(w4_smem);  // [NW][MT][RG][4][32]
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int rg = 0; rg < RG; ++rg)
#pragma unroll
            for (int e = 0; e < 4; ++e) part[(((w * MT + mt) * RG + rg) * 4 + e) * 32 + lane] = acc[mt][rg][e];
    w4xc_cluster_sync();
    {
        // Value v of the cluster's [NW][MT][RG][4][32] slice sums: CTA s owns V = NW MT RG 16 of
        // them, thread i the values s V + i + c NT (c < MT RG / 2).
        constexpr int V = NW * MT * RG * 16;
#pragma unroll
        for (int c = 0; c < MT * RG / 2; ++c) {
            const int v = s * V + (int)threadIdx.x + c * NT;
            const int vl = v & 31, e = (v >> 5) & 3, rg = (v >> 7) % RG, mt = ((v >> 7) / RG) % MT;
            const int vw = (v >> 7) / (RG * MT);
            const unsigned a = sm0 + (unsigned)v * 4u;
            const float total = w4xc_slice_sum(a);
            w4xc_store_acc<T>(out, out_f32, m, n, r0 + 8 * rg, ((int)blockIdx.x * NW + vw) * MT + mt, vl, e, total);
        }
    }
    w4xc_cluster_sync_relaxed();  // no CTA leaves while another still reads its shared memory
}

// Entry points: `w4_gemvxr{NW}w{MT}t{RG}r{XS}s{B}b[hp{PF}]_{t}` (NW warps of MT m16 tiles, 8 RG x
// rows, XS x stages, registers capped for B CTAs per SM); the host lists them in `kernels.rs`
// `W4_XR_VARIANTS` (same order) and picks per launch (`w4a16_xr.rs`).
#define W4XR_ARGS(T)                                                                            \
    const T *x, int m, int k, const uint4 *qw, const T *scales, const unsigned char *zeros,     \
        int kblocks, int gshift, int gstore, int n, void *out, int out_f32, int fp4, int trig
#define W4XR_PASS x, m, k, qw, scales, zeros, kblocks, gshift, gstore, n, out, out_f32, trig
#define W4XR_ENTRY(SUF, T, NW, MT, RG, XS, B, PF, TAIL)                                          \
    extern "C" __global__ void W4XC_CLUSTER __launch_bounds__(32 * NW, B)                       \
        w4_gemvxr##NW##w##MT##t##RG##r##XS##s##B##b##TAIL##_##SUF(W4XR_ARGS(T)) {               \
        if (fp4) w4_gemv_xr<T, true, false, NW, MT, RG, XS, PF>(W4XR_PASS);                      \
        else if (zeros) w4_gemv_xr<T, false, true, NW, MT, RG, XS, PF>(W4XR_PASS);               \
        else w4_gemv_xr<T, false, false, NW, MT, RG, XS, PF>(W4XR_PASS);                         \
    }
// The order of kernels.rs `W4_XR_VARIANTS`: (NW, MT, RG, XS, B, PF).
#define W4XR_ENTRIES(SUF, T)                                                                    \
    W4XR_ENTRY(SUF, T, 4, 2, 4, 4, 3, 3, hp3)                                                   \
    W4XR_ENTRY(SUF, T, 4, 2, 4, 4, 3, 0, )                                                      \
    W4XR_ENTRY(SUF, T, 2, 2, 4, 4, 6, 0, )                                                      \
    W4XR_ENTRY(SUF, T, 4, 1, 4, 4, 4, 0, )                                                      \
    W4XR_ENTRY(SUF, T, 8, 1, 4, 4, 2, 0, )                                                      \
    W4XR_ENTRY(SUF, T, 4, 1, 8, 3, 3, 0, )
W4XR_ENTRIES(f16, __half)
W4XR_ENTRIES(bf16, bf16_t)
