// w4a16_xs.cu: the 9..16-row W4A16 GEMV with x resident in shared memory per K slice (sm_90+,
// issue 10 item 7): `w4_gemvxc{TPC}{d|p}{D}b{B}[hp{PF}][w|f]_{f16,bf16}`.
//
// What NVRTC compiles: common.cuh, then kernels/w4a16.cu up to its entry points (the layout, the
// decode helpers W4Dec / w4_decode_any / w4_szf / w4_store, the PDL helpers: the same
// code, not a copy; src/backend/cuda/kernels.rs `KernelModule::full_source`), then
// kernels/w4a16_hints.cuh (the L2 hints of the weight stream, shared with w4a16_gemv.cu), then
// this file.
//
// Numerics: exactly those of w4a16.cu's `w4_gemv_fast` / `w4_gemv_xs` with RG = 2 (read
// w4a16.cu's header, "ONE NUMERIC PATH FOR EVERY ROW COUNT"): for each m16 output tile and K
// slice s, P_s accumulates the slice's k blocks in ascending order, chunks 0..7 in order, each
// row group's mma.sync.m16n8k16 from a zero f32 accumulator on the same decoded A fragments and
// the same x words; the output is ((0 + P_0) + P_1) + ... + P_7 in f32, stored once. So its
// outputs equal `w4_gemv_xs`'s (and the GEMM's) bit for bit (tests/cuda_w4a16.rs checks it).
//
// What differs is who shares x. In `w4_gemv_xs` a block is one m16 tile (or two) x the 8 K
// slices; each warp streams its slice's x (4 KB per k block at 16 rows, 4x the tile's 1 KB of
// weights) through a 2-stage cp.async ring with a barrier per half k block, so x costs L2
// traffic and issue slots in proportion to the weights, and a warp waits on x besides its weights
// (docs/benchmarks.md, "the x-staged W4A16 GEMV": ~220 SASS instructions per k block, 1.6x the
// one-row time at 16 rows). Here the 8 CTAs of one thread-block cluster (1, 1, 8) are the 8 K
// slices of TPC m16 tiles: CTA s (cluster rank s = blockIdx.z) copies its slice's x of the 16
// rows ONCE into shared memory (per k blocks x 4 KB, cp.async: the first k block in one group,
// the rest in a second; each thread copies fixed 16-byte pieces, one address per piece stepped by
// a k block), and each of its TPC warps runs one tile over that slice, reading its B
// fragments from the resident x (one 128-bit shared load per row group and x word, no barrier in
// the main loop). The weights and (scale, zero) words come through a register ring of D k blocks
// per warp as in `w4_gemv_fast`. The slice sums are added in slice order by one of two exchanges:
// - barrier builds (`w4_gemvxc{TPC}d{D}b{B}`): each CTA writes its slice sums [TPC][2][4][32] f32
//   into its own shared memory, the cluster synchronises, and thread i of CTA s sums value
//   s * 32 TPC + i over the 8 CTAs through distributed shared memory (`mapa` +
//   `ld.shared::cluster`), then stores it; a second cluster barrier keeps every CTA's shared
//   memory alive until all reads are done;
// - push builds (`w4_gemvxc{TPC}p{D}b{B}`, PX): CTA s sends each lane's 8 sums with two 16-byte
//   `st.async` into slot s of the owner CTA's [8][32 TPC] f32 buffer (after x), counted on the
//   owner's mbarrier (TPC KB expected), so a CTA waits only for the sums it adds, never for
//   another CTA's readers, and no release barrier (a GPU-wide MEMBAR in SASS) follows the main
//   loop. The mbarriers are initialised at the start and published by a relaxed cluster arrive
//   there, whose wait precedes the first push.
//
// x layout in shared memory: k block j of the slice at j * 4096 bytes, row r (0..15) at r * 256,
// its 16-byte unit u (columns 8u .. 8u + 7 of the block) at slot u ^ ((u >> 3) << 1) ^ (r & 1)
// (`w4_xc_unit`; the GEMM's `w4_a_unit` rule): a 128-bit B-fragment load phase (lanes g = 2p,
// 2p + 1, t = 0..3, word q: units 4t + q of rows g) hits 8 distinct 16-byte bank groups.
//
// Launch (the host checks it): grid (Np / (16 TPC), ceil(m / 16), 8), 32 TPC threads, cluster
// (1, 1, 8) (compiled in), ks == 8, dynamic shared memory max(per x 4096, TPC x 1024) bytes (per =
// kblocks / 8: 20 KB for K = 5120, 68 KB for K = 17408; push builds: per x 4096 + TPC x 1024 +
// 16), 16-bit compute dtype, k % 128 == 0, no perm, NVFP4 or groups of >= 32 columns (the fast
// layouts), Np / 16 a multiple of TPC, sm_90+
// (below it the kernel traps: the module is built only for sm_90+, `KernelModule::builds_for`,
// but `cuda_kernels_compile` compiles it everywhere). Rows past m are zero-filled in shared
// memory and their outputs are not stored.
//
// PDL: the first D k blocks of weights and (scale, zero) words are loaded before
// griddepcontrol.wait in the source (they are never written by a step); x is read and out
// written after it. In the SASS (NVRTC 12.9, sm_90) ptxas schedules the wait (ACQBULK) above
// those loads in every D = 2 build: they do not overlap the previous grid's tail. Builds that
// kept them above it (volatile loads plus an L2 prefetch loop of the next k blocks or of the
// whole slice before the wait) measured 2-6% slower at 9-16 rows on the H200 (docs/benchmarks.md,
// "rows 9-16 with the L2 hints") and were removed. `trig` places
// griddepcontrol.launch_dependents (0 first, 1 after the main loop).
//
// L2 hints (`hp{PF}` builds, w4a16_hints.cuh; same bits): the weight words are loaded
// evict-first and not allocated in the L1, and each warp asks the L2 for its two tiles' k block
// PF ahead of the one it consumes.

#define W4XC_KS 8           // K slices = cluster size
#define W4XC_KB_BYTES 4096  // one k block of 16 x rows in shared memory

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define W4XC_CLUSTER __cluster_dims__(1, 1, W4XC_KS)
#else
#define W4XC_CLUSTER
#endif

__device__ __forceinline__ void w4xc_cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#else
    __trap();
#endif
}

// The same barrier without memory ordering (the last one: every CTA's reads of the others' shared
// memory have returned, their values stored, before it arrives; nothing is published).
__device__ __forceinline__ void w4xc_cluster_sync_relaxed() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\nbarrier.cluster.wait.aligned;\n" ::: "memory");
#else
    __trap();
#endif
}

// The f32 at shared address `a` (this CTA's window) in the cluster's CTA `rank`.
__device__ __forceinline__ float w4xc_dsmem_f(unsigned a, unsigned rank) {
    float v = 0.0f;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    unsigned ra;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(ra) : "r"(a), "r"(rank));
    asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(ra) : "memory");
#else
    __trap();
#endif
    return v;
}

// The slice sums at shared address `a` of the cluster's W4XC_KS CTAs added in rank (= K slice)
// order from zero, ((0 + P_0) + P_1) + ... (the GEMV = GEMM contract); all loads issued first.
__device__ __forceinline__ float w4xc_slice_sum(unsigned a) {
    float p[W4XC_KS];
#pragma unroll
    for (int q = 0; q < W4XC_KS; ++q) p[q] = w4xc_dsmem_f(a, (unsigned)q);
    float total = 0.0f;
#pragma unroll
    for (int q = 0; q < W4XC_KS; ++q) total += p[q];
    return total;
}

// Store element e of lane vl's m16n8 accumulator (D fragment: output 16 tile + vl / 4 (+ 8 for
// e >= 2), row rg0 + 2 (vl % 4) + e % 2 of a row group starting at rg0), inside (m, n) only.
template <typename T>
__device__ __forceinline__ void w4xc_store_acc(void* out, int out_f32, int m, int n, int rg0, int tile, int vl,
                                               int e, float v) {
    const int row = rg0 + 2 * (vl & 3) + (e & 1);
    const int col = tile * 16 + (vl >> 2) + (e >= 2 ? 8 : 0);
    if (row < m && col < n) w4_store<T>(out, out_f32, row, n, col, v);
}

__device__ __forceinline__ uint4 w4xc_lds128(unsigned a) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(a));
    return v;
}

__device__ __forceinline__ void w4xc_cp16(unsigned dst, const void* src, int bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
#else
    __trap();
#endif
}

// Slot of 16-byte unit u (0..15) of x row r in a k block's 256-byte row.
__device__ __forceinline__ unsigned w4_xc_unit(unsigned u, unsigned r) {
    return u ^ ((u >> 3) << 1) ^ (r & 1u);
}

// The push exchange (PX builds): one mbarrier per CTA counts the bytes of slice sums the 8 CTAs
// store into it (st.async ... mbarrier::complete_tx), so no CTA waits for another CTA's readers.
__device__ __forceinline__ void w4xc_bar_init(unsigned bar, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(bar) : "memory");
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#else
    __trap();
#endif
}

__device__ __forceinline__ void w4xc_cluster_arrive_relaxed() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
#else
    __trap();
#endif
}

__device__ __forceinline__ void w4xc_cluster_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
#else
    __trap();
#endif
}

// Four f32 at shared address `a` of CTA `rank`, counted on that CTA's mbarrier at `bar` (both
// addresses in this CTA's window: the same offsets there).
__device__ __forceinline__ void w4xc_push4(unsigned a, unsigned bar, unsigned rank, float v0, float v1,
                                           float v2, float v3) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    unsigned ra, rb;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(ra) : "r"(a), "r"(rank));
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(rb) : "r"(bar), "r"(rank));
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];\n"
                 ::"r"(ra), "f"(v0), "f"(v1), "f"(v2), "f"(v3), "r"(rb) : "memory");
#else
    __trap();
#endif
}

// Wait until phase 0 of the mbarrier at `bar` completed (every byte pushed into this CTA).
__device__ __forceinline__ void w4xc_bar_wait0(unsigned bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    unsigned done = 0;
    while (!done) {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"(bar) : "memory");
    }
#else
    __trap();
#endif
}

// PF: 0 plain `__ldg` weight loads; > 0 the L2 hints of w4a16_hints.cuh (evict-first weight
// loads, each warp's L2 prefetch of its two tiles' k block PF ahead of the one it consumes).
template <typename T, bool FP4, bool ZP, int TPC, int D, bool PX, int PF>
__device__ __forceinline__ void w4_gemv_xc(const T* x, int m, int k, const uint4* __restrict__ qw,
                                           const T* scales, const unsigned char* zeros,
                                           int kblocks, int gshift, int gstore, int n, void* out,
                                           int out_f32, int trig) {
    constexpr int RG = 2;
    constexpr bool G16 = FP4;
    constexpr int POL = PF > 0 ? 1 : 0;
    static_assert(PF >= 0 && PF <= 8, "L2 prefetch distance");
    extern __shared__ __align__(16) unsigned char w4_smem[];
    if (trig == 0) w4_pdl_launch_dependents();
    const unsigned long long pol = w4v_policy<POL>();
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int s = blockIdx.z;  // K slice = rank in the cluster (cluster dims (1, 1, 8))
    const int nt0 = (blockIdx.x * TPC + w) * 2;
    const int r0 = blockIdx.y * 8 * RG;
    const int per = kblocks / W4XC_KS, kb0 = s * per;
    const unsigned sm0 = (unsigned)__cvta_generic_to_shared(w4_smem);
    // PX: the slice sums this CTA owns arrive at [8][32 TPC] f32 after x, counted on the mbarrier
    // after them; initialised here, published by the cluster barrier whose wait precedes the pushes.
    const unsigned recv = sm0 + (unsigned)per * W4XC_KB_BYTES, bar = recv + TPC * 1024u;
    if (PX) {
        if (threadIdx.x == 0) w4xc_bar_init(bar, TPC * 1024u);
        w4xc_cluster_arrive_relaxed();
    }
    const uint4* wp0 = qw + ((size_t)nt0 * kblocks + kb0) * 32 + lane;
    const uint4* wp1 = wp0 + (size_t)kblocks * 32;
    const unsigned sstride = (unsigned)gstore * 8u;
    const size_t sbase = (size_t)nt0 * sstride + g;
    const unsigned short* sp0 = reinterpret_cast<const unsigned short*>(scales) + sbase;
    const unsigned char* zp0 = ZP ? zeros + sbase : nullptr;
    asm("" : "+l"(sp0));
    asm("" : "+l"(zp0));
    const unsigned gbase = (unsigned)(kb0 * 8 + 2 * t);
    float acc[RG][4];
#pragma unroll
    for (int h = 0; h < RG; ++h)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[h][e] = 0.0f;
    uint4 wr[D][2];
    unsigned sz[D][2], szh[D][2];
    // Slot d's loads for k block jb + o of the slice (as `w4_gemv_fast`'s `load`).
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
#pragma unroll
    for (int d = 0; d < D; ++d)
        if (d < per) load(d, wp0, wp1, gbase, d);
    w4_pdl_wait();  // weights and (scale[, zero]) words only above; x from here on

    // The slice's x: a k block is 256 pieces (row r, unit u: piece r * 16 + u). Thread i copies
    // pieces i, i + NT, ... (< 256) of k blocks i / 256, + JS, ... (NT = 32 TPC threads, JS = NT /
    // 256 k blocks at once, or 1), so its source and destination are fixed per piece and step by a
    // k block: k block 0 in the first commit group, the others in the second.
    {
        constexpr int NT = 32 * TPC, PPT = NT >= 256 ? 1 : 256 / NT, JS = NT >= 256 ? NT / 256 : 1;
        const int j0 = NT >= 256 ? (int)threadIdx.x / 256 : 0;
        const unsigned short* xs = reinterpret_cast<const unsigned short*>(x) + (size_t)kb0 * W4_KB;
        const unsigned short* src[PPT];
        unsigned dst[PPT];
        int nb[PPT];
#pragma unroll
        for (int q = 0; q < PPT; ++q) {
            const unsigned pc = ((unsigned)threadIdx.x + (unsigned)(q * NT)) & 255u;
            const unsigned r = pc >> 4, u = pc & 15u;
            const int row = r0 + (int)r;
            nb[q] = row < m ? 16 : 0;  // rows past m: zero-filled (row r0 as a valid address)
            src[q] = xs + (size_t)(row < m ? row : r0) * k + 8u * u + (size_t)j0 * W4_KB;
            dst[q] = sm0 + r * 256u + (w4_xc_unit(u, r) << 4) + (unsigned)j0 * W4XC_KB_BYTES;
        }
        const bool active = NT >= 256 ? (int)threadIdx.x < 256 * JS : true;
        if (active && j0 == 0) {
#pragma unroll
            for (int q = 0; q < PPT; ++q) w4xc_cp16(dst[q], src[q], nb[q]);
        }
        w4x_commit();
        if (active) {
            for (int j = j0 == 0 ? JS : j0; j < per; j += JS) {
                const int o = j - j0;
#pragma unroll
                for (int q = 0; q < PPT; ++q)
                    w4xc_cp16(dst[q] + (unsigned)o * W4XC_KB_BYTES, src[q] + (size_t)o * W4_KB, nb[q]);
            }
        }
        w4x_commit();
    }
    // The lane's B-fragment word q of row group rg in k block j: xq[q] + j * 4096 + rg * 2048.
    unsigned xq[4];
    {
        const unsigned c = ((unsigned)(t >> 1) << 1) ^ (unsigned)(g & 1);
#pragma unroll
        for (int q = 0; q < 4; ++q) xq[q] = sm0 + (unsigned)g * 256u + ((unsigned)(4 * t) + ((unsigned)q ^ c)) * 16u;
    }
    w4x_wait<1>();
    __syncthreads();  // k block 0 of x is in (every thread's copies)

    auto consume = [&](int d, unsigned xoff) {
        const unsigned zc = W4Dec<T>::bias(8);
        const unsigned s0l = __byte_perm(sz[d][0], 0u, 0x1010), s1l = __byte_perm(sz[d][1], 0u, 0x1010);
        const unsigned z0l = ZP ? W4Dec<T>::bias((int)(sz[d][0] >> 16)) : zc;
        const unsigned z1l = ZP ? W4Dec<T>::bias((int)(sz[d][1] >> 16)) : zc;
        const unsigned s0h = G16 ? __byte_perm(szh[d][0], 0u, 0x1010) : s0l;
        const unsigned s1h = G16 ? __byte_perm(szh[d][1], 0u, 0x1010) : s1l;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            uint4 xr[RG];
#pragma unroll
            for (int rg = 0; rg < RG; ++rg) xr[rg] = w4xc_lds128(xq[q] + xoff + (unsigned)rg * 2048u);
            unsigned d0[4], d1[4];
            w4_decode_any<T, FP4>(w4_word(wr[d][0], q), q < 2 ? s0l : s0h, z0l, d0);
            w4_decode_any<T, FP4>(w4_word(wr[d][1], q), q < 2 ? s1l : s1h, z1l, d1);
            const unsigned a0[4] = {d0[0], d1[0], d0[1], d1[1]};  // chunk 2q
            const unsigned a1[4] = {d0[2], d1[2], d0[3], d1[3]};  // chunk 2q + 1
#pragma unroll
            for (int rg = 0; rg < RG; ++rg) {
                mma_m16n8k16<T>(acc[rg], a0, xr[rg].x, xr[rg].y);
                mma_m16n8k16<T>(acc[rg], a1, xr[rg].z, xr[rg].w);
            }
        }
    };
    const uint4* wq0 = wp0;
    const uint4* wq1 = wp1;
    unsigned gq = gbase, xoff = 0;
    for (int i = 0; i < per; i += D) {
#pragma unroll
        for (int d = 0; d < D; ++d) {
            if (i + d < per) {
                if (i + d == 1) {
                    w4x_wait<0>();
                    __syncthreads();  // the rest of the slice's x is in
                }
                if (PF > 0 && i + d + PF < per) {
                    w4v_prefetch_l2(wq0 + (d + PF) * 32);
                    w4v_prefetch_l2(wq1 + (d + PF) * 32);
                }
                consume(d, xoff + (unsigned)d * W4XC_KB_BYTES);
                if (i + d + D < per) load(d, wq0, wq1, gq, d + D);
            }
        }
        wq0 += D * 32;
        wq1 += D * 32;
        gq += 8u * D;
        xoff += (unsigned)D * W4XC_KB_BYTES;
    }
    if (per == 1) w4x_wait<0>();  // the (empty) second group
    if (trig != 0) w4_pdl_launch_dependents();
    if (PX) {
        // Lane l of warp w holds values v = w * 256 + 8 l + 4 h + e (8 in a row); owner CTA
        // o = v / (32 TPC) keeps them at recv[s][v % (32 TPC)]. Thread i of each CTA then adds
        // its value over the 8 slices in slice order, as below.
        w4xc_cluster_wait();  // every CTA's mbarrier is initialised
        const unsigned v = (unsigned)w * 256u + (unsigned)lane * 8u;
        const unsigned o = v / (32u * TPC), a = recv + ((unsigned)s * 32u * TPC + v % (32u * TPC)) * 4u;
        w4xc_push4(a, bar, o, acc[0][0], acc[0][1], acc[0][2], acc[0][3]);
        w4xc_push4(a + 16u, bar, o, acc[1][0], acc[1][1], acc[1][2], acc[1][3]);
        w4xc_bar_wait0(bar);
        const float* rv = reinterpret_cast<const float*>(w4_smem + (size_t)per * W4XC_KB_BYTES);
        float total = 0.0f;
#pragma unroll
        for (int q = 0; q < W4XC_KS; ++q) total += rv[q * 32 * TPC + threadIdx.x];
        const int vv = s * 32 * TPC + (int)threadIdx.x;
        const int vw = vv >> 8, vl = (vv >> 3) & 31, h = (vv >> 2) & 1, e = vv & 3;
        w4xc_store_acc<T>(out, out_f32, m, n, r0 + 8 * h, (int)blockIdx.x * TPC + vw, vl, e, total);
        return;
    }
    __syncthreads();  // every warp is done with x: its space takes the slice sums
    float* part = reinterpret_cast<float*>(w4_smem);  // [TPC][RG][4][32]
#pragma unroll
    for (int h = 0; h < RG; ++h)
#pragma unroll
        for (int e = 0; e < 4; ++e) part[((w * RG + h) * 4 + e) * 32 + lane] = acc[h][e];
    w4xc_cluster_sync();
    {
        // Value v of the cluster's [TPC][RG][4][32] slice sums: thread i of CTA s takes
        // v = s * 32 TPC + i (8 CTAs x 32 TPC threads = TPC x 256 values).
        const int v = s * 32 * TPC + (int)threadIdx.x;
        const int vw = v >> 8, h = (v >> 7) & 1, e = (v >> 5) & 3, vl = v & 31;
        const unsigned a = sm0 + (unsigned)v * 4u;
        const float total = w4xc_slice_sum(a);
        w4xc_store_acc<T>(out, out_f32, m, n, r0 + 8 * h, (int)blockIdx.x * TPC + vw, vl, e, total);
    }
    w4xc_cluster_sync_relaxed();  // no CTA leaves while another still reads its shared memory
}

// Entry points: `w4_gemvxc{TPC}d{D}b{B}_{t}` (TPC m16 tiles per CTA, D k blocks of weights in
// flight per warp, registers capped for B CTAs per SM: 64 at 32 warps); the host lists them in
// `kernels.rs` `W4_XC_VARIANTS` and runs the first that applies (`w4a16_xc.rs`).
#define W4XC_ARGS(T)                                                                            \
    const T *x, int m, int k, const uint4 *qw, const T *scales, const unsigned char *zeros,     \
        int kblocks, int gshift, int gstore, int n, void *out, int out_f32, int fp4, int trig
#define W4XC_PASS x, m, k, qw, scales, zeros, kblocks, gshift, gstore, n, out, out_f32, trig
#define W4XC_ANY(T, TPC, D, PX, PF)                                                             \
    if (fp4) w4_gemv_xc<T, true, false, TPC, D, PX, PF>(W4XC_PASS);                             \
    else if (zeros) w4_gemv_xc<T, false, true, TPC, D, PX, PF>(W4XC_PASS);                      \
    else w4_gemv_xc<T, false, false, TPC, D, PX, PF>(W4XC_PASS);
// `d` builds: the slice sums read through cluster barriers; `p` builds: pushed (PX). TAIL names
// the hints: empty (none) or `hp{PF}` (w4a16_hints.cuh, prefetch PF k blocks ahead).
#define W4XC_ENTRY(SUF, T, TPC, D, B, PF, TAIL)                                                  \
    extern "C" __global__ void W4XC_CLUSTER __launch_bounds__(32 * TPC, B)                      \
        w4_gemvxc##TPC##d##D##b##B##TAIL##_##SUF(W4XC_ARGS(T)) {                                \
        W4XC_ANY(T, TPC, D, false, PF)                                                          \
    }
#define W4XC_ENTRY_P(SUF, T, TPC, D, B, PF, TAIL)                                                \
    extern "C" __global__ void W4XC_CLUSTER __launch_bounds__(32 * TPC, B)                      \
        w4_gemvxc##TPC##p##D##b##B##TAIL##_##SUF(W4XC_ARGS(T)) {                                \
        W4XC_ANY(T, TPC, D, true, PF)                                                           \
    }
// The order of kernels.rs `W4_XC_VARIANTS`.
#define W4XC_ENTRIES(SUF, T)                                                                \
    W4XC_ENTRY_P(SUF, T, 8, 2, 4, 0, )                                                      \
    W4XC_ENTRY_P(SUF, T, 4, 2, 8, 0, )                                                      \
    W4XC_ENTRY(SUF, T, 8, 2, 4, 0, )                                                        \
    W4XC_ENTRY(SUF, T, 4, 2, 8, 0, )                                                        \
    W4XC_ENTRY(SUF, T, 16, 2, 2, 0, )                                                       \
    W4XC_ENTRY(SUF, T, 4, 2, 8, 3, hp3)                                                     \
    W4XC_ENTRY(SUF, T, 8, 2, 4, 3, hp3)                                                     \
    W4XC_ENTRY_P(SUF, T, 8, 2, 4, 3, hp3)
W4XC_ENTRIES(f16, __half)
W4XC_ENTRIES(bf16, bf16_t)
