// w4a16_bulk.cu: the 1..8-row W4A16 GEMV with its weight stream moved off the registers (sm_90+,
// issue 10 item 7): `w4b_gemv_{f16,bf16}`.
//
// What NVRTC compiles: common.cuh, then kernels/w4a16.cu up to its entry points (the layout, the
// decode helpers W4Dec / w4_decode_any / w4_store, the PDL helpers: the same code, not a
// copy; src/backend/cuda/kernels.rs `KernelModule::full_source`), then this file.
//
// Numerics: exactly those of w4a16.cu's `w4_gemv_fast` with RG = 1 and one K slice per warp (read
// w4a16.cu's header, "ONE NUMERIC PATH FOR EVERY ROW COUNT"): grid (Np / 16, ceil(m / 8)), block
// 32 ks threads, warp s = K slice s of the block's m16 output tile (n8 tiles 2 blockIdx.x, + 1);
// the slice's k blocks in ascending order, each chunks 0..7 in order through mma.sync.m16n8k16
// from a zero f32 accumulator; the same decode calls on the same words and (scale, zero) values;
// the slice sums added ((0 + P_0) + P_1) + ... by the same loop. So its outputs are those of
// `w4_gemv` bit for bit (tests/cuda_w4a16.rs checks it on the 27B shapes, sym and asym, 1..8 rows).
//
// What differs is how the weights arrive. `w4_gemv_fast` holds one k block of weights in flight
// per warp in registers (48 registers, 5 blocks of 256 per SM: ~40 KB in flight per SM at best,
// and a warp's slice of 5..17 k blocks spends much of its life filling; docs/benchmarks.md, "what
// limits it"). Here each warp has a ring of `stages` shared-memory stages (a runtime argument;
// the host sizes the dynamic shared memory), each one k block of its two n8 tiles (2 x 512 B,
// contiguous in the tile layout) with one mbarrier: lane 0 issues the stage's two 1D bulk copies
// (`cp.async.bulk ... mbarrier::complete_tx::bytes`, the TMA engine) `stages` k blocks ahead, the
// lanes wait on the stage's barrier (phase = use count & 1), read their 128-bit words with one
// shared load per tile, decode, and after the decode (the words are in registers and used)
// lane 0 refills the stage with the k block `stages` further on. So stages x 1 KB per warp are in
// flight at no register cost. The slice's scales (and zero points) are copied into shared memory
// by the warp's lanes once at the start (a slice spans `ngs` groups at most; the host passes the
// bound) and read back per k block; x is read through the L1 as in `w4_gemv_fast`.
//
// PDL: lane 0 issues the first `stages` bulk copies and the lanes load the (scale, zero) values
// (never written by a step) before griddepcontrol.wait; x is read and out written after it.
// `trig` places griddepcontrol.launch_dependents as in `w4_gemv_fast` (0 first, 1 after the main
// loop). `hint` 1 gives the weight copies the L2 evict-first policy (read once per step).
//
// Shared memory (dynamic, 16-byte aligned), for ks warps:
//   ring    [ks][stages][2 tiles][512 B]   after the main loop warp s's ring holds its slice sum
//                                          ([4][32] f32: stages >= 1 gives the 512 B)
//   scales  [ks][2 tiles][ngs][8] u16      (16 B per (tile, group))
//   zeros   [ks][2 tiles][ngs][8] u8       (the host reserves them only with zero points)
//   bars    [ks][stages] u64
// (every part a multiple of 16 bytes but the barriers, which come last). The persistent form
// `w4b_gemvp` (below) has its own: ring [ks][stages][1 KB sk], sums [ks][4][32] f32, tables
// [2 buffers][ks][scales (+ zeros)], bars [ks][stages] u64 (host: `smem_bytes`).
// Scope (the host checks it): 16-bit compute dtype, k % 128 == 0, no perm, NVFP4 or groups of
// >= 32 columns (the fast layouts), m <= 8 rows per grid.y block, sm_90+ (below it the kernel
// traps: the module is built only for sm_90+, `KernelModule::builds_for`, but
// `cuda_kernels_compile` compiles it everywhere).

#define W4B_KB_BYTES 1024  // one k block of the warp's two n8 tiles (2 x 512 B)
#ifndef W4B_BLOCKS
#define W4B_BLOCKS 4  // resident blocks of 256 per SM the register budget allows
#endif

__device__ __forceinline__ unsigned w4b_smem(const void* p) {
    return (unsigned)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void w4b_bar_init(unsigned bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar) : "memory");
#endif
}

// Make the barrier inits visible to the bulk-copy (async) proxy.
__device__ __forceinline__ void w4b_bar_fence() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

// Lane 0: `bytes` / 2 from each of src0 and src1 into dst and dst + half (one stage: up to SK k
// blocks of tile 0, then of tile 1), completing on barrier `bar` (arrive with the expected byte
// count, then the two copies).
__device__ __forceinline__ void w4b_issue(unsigned dst, unsigned half, unsigned bar,
                                          const uint4* src0, const uint4* src1, unsigned bytes,
                                          int hint, unsigned long long pol) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
                 : "memory");
    const unsigned each = bytes >> 1;
    if (hint) {
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint "
            "[%0], [%1], %2, [%3], %4;" ::"r"(dst),
            "l"(src0), "r"(each), "r"(bar), "l"(pol)
            : "memory");
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint "
            "[%0], [%1], %2, [%3], %4;" ::"r"(dst + half),
            "l"(src1), "r"(each), "r"(bar), "l"(pol)
            : "memory");
    } else {
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, "
            "[%3];" ::"r"(dst),
            "l"(src0), "r"(each), "r"(bar)
            : "memory");
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, "
            "[%3];" ::"r"(dst + half),
            "l"(src1), "r"(each), "r"(bar)
            : "memory");
    }
#else
    __trap();
#endif
}

// Wait until barrier `bar` has completed the phase of parity `parity`.
__device__ __forceinline__ void w4b_wait(unsigned bar, unsigned parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    unsigned done;
    do {
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, "
            "1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(bar), "r"(parity));
    } while (!done);
#else
    __trap();
#endif
}

// The CTA barrier across the cluster (release / acquire: shared memory written before it is
// visible to the other CTAs after it) and an f32 read of the same shared offset in CTA `rank`.
__device__ __forceinline__ void w4b_cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#else
    __trap();
#endif
}
__device__ __forceinline__ float w4b_dsmem_f(const float* local, int rank) {
    float v = 0.0f;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    unsigned ra;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n"
                 : "=r"(ra) : "r"(w4b_smem(local)), "r"(rank));
    asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(ra) : "memory");
#else
    __trap();
#endif
    return v;
}

__device__ __forceinline__ uint4 w4b_lds128(unsigned a) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(a));
    return v;
}

// (Neither the wait nor the shared loads below clobber "memory": they are volatile, so they stay
// in order with each other and with the issue, and the x and table loads may be scheduled
// across them; every ring access is between `__syncwarp`s, which are compiler barriers.)
// CL: the cluster form (`w4b_gemvc`): one warp per CTA, CTA z of grid (Np / 16, ceil(m / 8), ks)
// is slice z (its cluster rank; cluster (1, 1, ks), ks == W4B_CLUSTER_KS), the slice sums added
// in order through distributed shared memory. Same operations per output element.
// One ring stage's k blocks (SK of them, the last stage possibly partial: k block j < per) of a
// warp's slice, decoded and multiplied into acc in k order: the block and persistent forms' one
// main-loop body. st: the lane's 16-byte column of the stage in shared memory; ssm / zsm: the
// slice's (scale, zero) tables; xp / c0: the lane's x words and chunk index (see the callers).
template <typename T, bool FP4, bool ZP, int SK>
__device__ __forceinline__ void w4b_stage_mma(float* acc, unsigned st, int u, int per, const uint4* xp,
                                              int c0, int gshift, int gfirst,
                                              const unsigned short* ssm, const unsigned char* zsm,
                                              int ngs, int g, unsigned zc) {
    constexpr bool G16 = FP4;
    constexpr unsigned HALF = SK * 512;
#pragma unroll
    for (int i = 0; i < SK; ++i) {
        const int j = u * SK + i;
        if (i == 0 || j < per) {
            uint4 xr[4];
#pragma unroll
            for (int q = 0; q < 4; ++q) xr[q] = __ldg(xp + j * 16 + q);
            const int glo = ((c0 + 8 * j) >> gshift) - gfirst;
            const unsigned sz0 = ssm[glo * 8 + g], sz1 = ssm[(ngs + glo) * 8 + g];
            const unsigned s0l = __byte_perm(sz0, 0u, 0x1010), s1l = __byte_perm(sz1, 0u, 0x1010);
            const unsigned z0l = ZP ? W4Dec<T>::bias((int)zsm[glo * 8 + g]) : zc;
            const unsigned z1l = ZP ? W4Dec<T>::bias((int)zsm[(ngs + glo) * 8 + g]) : zc;
            unsigned s0h = s0l, s1h = s1l;
            if (G16) {
                const int ghi = ((c0 + 8 * j + 1) >> gshift) - gfirst;
                s0h = __byte_perm((unsigned)ssm[ghi * 8 + g], 0u, 0x1010);
                s1h = __byte_perm((unsigned)ssm[(ngs + ghi) * 8 + g], 0u, 0x1010);
            }
            const uint4 w0 = w4b_lds128(st + 512 * i), w1 = w4b_lds128(st + HALF + 512 * i);
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                unsigned d0[4], d1[4];
                w4_decode_any<T, FP4>(w4_word(w0, q), q < 2 ? s0l : s0h, z0l, d0);
                w4_decode_any<T, FP4>(w4_word(w1, q), q < 2 ? s1l : s1h, z1l, d1);
                const unsigned a0[4] = {d0[0], d1[0], d0[1], d1[1]};  // chunk 2q
                const unsigned a1[4] = {d0[2], d1[2], d0[3], d1[3]};  // chunk 2q + 1
                mma_m16n8k16<T>(acc, a0, xr[q].x, xr[q].y);
                mma_m16n8k16<T>(acc, a1, xr[q].z, xr[q].w);
            }
        }
    }
}

template <typename T, bool FP4, bool ZP, int SK, bool CL>
__device__ __forceinline__ void w4b_gemv(const T* x, int m, int k, const uint4* __restrict__ qw,
                                         const T* scales, const unsigned char* zeros, int kblocks,
                                         int ks, int gshift, int gstore, int n, void* out,
                                         int out_f32, int trig, int stages, int ngs, int hint) {
    constexpr unsigned STAGE = SK * W4B_KB_BYTES, HALF = SK * 512;
    extern __shared__ __align__(16) unsigned char w4b_sm[];
    if (trig == 0) w4_pdl_launch_dependents();
    const int lane = threadIdx.x & 31, s = CL ? (int)blockIdx.z : (int)(threadIdx.x >> 5);
    const int g = lane >> 2, t = lane & 3;
    const int nt0 = blockIdx.x * 2;
    const int r0 = blockIdx.y * 8;
    const int per = kblocks / ks, kb0 = s * per;
    const int nst = (per + SK - 1) / SK;  // stages of the slice (the last one may be partial)
    // This warp's ring, scales, zeros and barriers (warp w of the block's nb).
    const int nb = CL ? 1 : ks, w = CL ? 0 : s;
    unsigned char* ring = w4b_sm + (size_t)w * stages * STAGE;
    const unsigned ring_a = w4b_smem(ring);
    unsigned char* tables = w4b_sm + (size_t)nb * stages * STAGE;
    unsigned short* ssm = reinterpret_cast<unsigned short*>(tables) + (size_t)w * 2 * ngs * 8;
    unsigned char* zsm = tables + (size_t)nb * 2 * ngs * 16 + (size_t)w * 2 * ngs * 8;
    const unsigned bars_a =
        w4b_smem(tables + (size_t)nb * 2 * ngs * (ZP ? 24 : 16)) + 8u * w * stages;
    // The slice's tile words: k block j of tile 0 at src0 + 32 j, of tile 1 at src1 + 32 j.
    const uint4* src0 = qw + ((size_t)nt0 * kblocks + kb0) * 32;
    const uint4* src1 = src0 + (size_t)kblocks * 32;
    // Stage u: k blocks u SK .. of both tiles, 1 KB per k block.
    auto stage_bytes = [&](int u) { return (unsigned)min(SK, per - u * SK) * W4B_KB_BYTES; };
    unsigned long long pol = 0;
    if (lane == 0) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        if (hint) asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
#endif
        for (int d = 0; d < stages; ++d) w4b_bar_init(bars_a + 8u * d);
        w4b_bar_fence();
        const int first = min(stages, nst);
        for (int d = 0; d < first; ++d)
            w4b_issue(ring_a + d * STAGE, HALF, bars_a + 8u * d, src0 + 32 * SK * d,
                      src1 + 32 * SK * d, stage_bytes(d), hint, pol);
    }
    // The slice's groups gfirst .. glast of both tiles into shared memory (16 B of scales and
    // 8 B of zeros per (tile, group): aligned units of the [Np/8][GS][8] arrays).
    const int gfirst = (kb0 * 8) >> gshift, glast = ((kb0 + per) * 8 - 1) >> gshift;
    const int cnt = glast - gfirst + 1;  // <= ngs (the host's bound)
    for (int i = lane; i < 2 * cnt; i += 32) {
        const int j = i >= cnt ? 1 : 0, r = i - j * cnt;
        const size_t e = ((size_t)(nt0 + j) * gstore + gfirst + r) * 8;
        reinterpret_cast<uint4*>(ssm)[j * ngs + r] =
            __ldg(reinterpret_cast<const uint4*>(reinterpret_cast<const unsigned short*>(scales) + e));
        if (ZP) reinterpret_cast<uint2*>(zsm)[j * ngs + r] = __ldg(reinterpret_cast<const uint2*>(zeros + e));
    }
    __syncwarp();
    const unsigned short* xs = reinterpret_cast<const unsigned short*>(x);
    const uint4* xp = reinterpret_cast<const uint4*>(xs + (size_t)min(r0 + g, m - 1) * k + 32 * t) +
                      (size_t)kb0 * 16;
    // The lane's 16-column chunk index of chunks 0..3 in k block j: c0 + 8 j.
    const int c0 = kb0 * 8 + 2 * t;
    const unsigned zc = W4Dec<T>::bias(8);
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    w4_pdl_wait();  // weights and (scale, zero) values only above; x from here on
    int slot = 0;
    unsigned parity = 0;
    for (int u = 0; u < nst; ++u) {
        const unsigned st = ring_a + slot * STAGE + 16 * lane;
        w4b_wait(bars_a + 8u * slot, parity);
        w4b_stage_mma<T, FP4, ZP, SK>(acc, st, u, per, xp, c0, gshift, gfirst, ssm, zsm, ngs, g, zc);
        // Every lane's words of the stage are decoded (used): it may be overwritten.
        __syncwarp();
        if (lane == 0 && u + stages < nst)
            w4b_issue(ring_a + slot * STAGE, HALF, bars_a + 8u * slot, src0 + 32 * SK * (u + stages),
                      src1 + 32 * SK * (u + stages), stage_bytes(u + stages), hint, pol);
        if (++slot == stages) {
            slot = 0;
            parity ^= 1u;
        }
    }
    if (trig != 0) w4_pdl_launch_dependents();
    // The slice sum into this warp's (drained) ring: [4][32] f32.
    float* mine = reinterpret_cast<float*>(ring);
#pragma unroll
    for (int e = 0; e < 4; ++e) mine[e * 32 + lane] = acc[e];
    if (CL) {
        w4b_cluster_sync();  // every slice's sum is in its CTA's shared memory
        // CTA e (< 4) sums element e over the slices (CTAs 0..ks-1) in order.
        if (s < 4) {
            float total = 0.0f;
            for (int q = 0; q < ks; ++q) total += w4b_dsmem_f(mine + s * 32 + lane, q);
            const int row = r0 + 2 * t + (s & 1);
            const int col = nt0 * 8 + g + (s >= 2 ? 8 : 0);
            if (row < m && col < n) w4_store<T>(out, out_f32, row, n, col, total);
        }
        w4b_cluster_sync();  // no CTA leaves while another still reads its shared memory
        return;
    }
    __syncthreads();
    // Warp e (< 4) sums element e over the slices in order (as `w4_gemv_fast` with RG = 1).
    const int nw = blockDim.x >> 5;
    for (int e = s; e < 4; e += nw) {
        float total = 0.0f;
        for (int q = 0; q < ks; ++q)
            total += reinterpret_cast<const float*>(w4b_sm + (size_t)q * stages * STAGE)[e * 32 + lane];
        const int row = r0 + 2 * t + (e & 1);
        const int col = nt0 * 8 + g + (e >= 2 ? 8 : 0);
        if (row < m && col < n) w4_store<T>(out, out_f32, row, n, col, total);
    }
}

// cp.async of 16 / 8 bytes (the next tile's (scale, zero) table) and its group bookkeeping.
__device__ __forceinline__ void w4b_cp(unsigned dst, const void* src, int bytes16) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (bytes16)
        asm volatile("cp.async.ca.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(dst), "l"(src) : "memory");
#else
    __trap();
#endif
}
__device__ __forceinline__ void w4b_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
// All but the newest `N` committed groups of this thread have landed.
template <int N>
__device__ __forceinline__ void w4b_cp_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// `w4b_gemvp`: the block form on a persistent grid (`KILN_W4_BULK_PERSIST`): block x of grid
// (G, ceil(m / 8)) runs the m16 tiles x, x + G, ... < ntiles, one warp per K slice as
// `w4b_gemv`; a warp's ring runs on from one tile's last stage into the next tile's first
// (stream index v = tile pass i * nst + stage u; slot v % stages, parity (v / stages) & 1),
// and the next tile's (scale, zero) table is copied by cp.async into the other of two table
// buffers while the current tile runs. Every tile's arithmetic is the single-tile one.
template <typename T, bool FP4, bool ZP, int SK>
__device__ __forceinline__ void w4b_gemvp(const T* x, int m, int k, const uint4* __restrict__ qw,
                                         const T* scales, const unsigned char* zeros, int kblocks,
                                         int ks, int gshift, int gstore, int n, void* out,
                                         int out_f32, int trig, int stages, int ngs, int hint,
                                         int ntiles) {
    constexpr unsigned STAGE = SK * W4B_KB_BYTES, HALF = SK * 512;
    extern __shared__ __align__(16) unsigned char w4b_sm[];
    if (trig == 0) w4_pdl_launch_dependents();
    const int lane = threadIdx.x & 31, s = (int)(threadIdx.x >> 5);
    const int g = lane >> 2, t = lane & 3;
    const int r0 = blockIdx.y * 8;
    const int per = kblocks / ks, kb0 = s * per;
    const int nst = (per + SK - 1) / SK;  // stages of the slice (the last one may be partial)
    // Tiles of this block: blockIdx.x + i gridDim.x for i < mine_n.
    const int tstep = (int)gridDim.x;
    const int mine_n = (ntiles - (int)blockIdx.x + tstep - 1) / tstep;
    const int nv = mine_n * nst;  // stages of this warp's whole stream
    // This warp's ring, slice sum, tables and barriers (warp w of the block's nb).
    const int nb = ks, w = s;
    const unsigned ring_a = w4b_smem(w4b_sm) + (unsigned)(w * stages) * STAGE;
    float* sums = reinterpret_cast<float*>(w4b_sm + (size_t)nb * stages * STAGE);  // [nb][4][32]
    unsigned char* tables = w4b_sm + (size_t)nb * stages * STAGE + (size_t)nb * 512;
    // Table buffer b of this warp: scales [2 tiles][ngs][8] u16, then (ZP) zeros [2][ngs][8] u8.
    const unsigned tb_bytes = 2u * ngs * (ZP ? 24 : 16);
    auto table_at = [&](int b) { return tables + ((size_t)b * nb + w) * tb_bytes; };
    const unsigned bars_a = w4b_smem(tables + (size_t)2 * nb * tb_bytes) + 8u * w * stages;
    // Stage u of a tile pass: k blocks kb0 + u SK .. of the tile's two n8 tiles, 1 KB per k
    // block, at `base` + 32 SK u (tile 0) and + 32 kblocks more (tile 1); the next pass's base
    // is 2 tstep kblocks x 32 words further.
    auto stage_bytes = [&](int u) { return (unsigned)min(SK, per - u * SK) * W4B_KB_BYTES; };
    // The slice's groups gfirst .. glast of both n8 tiles (16 B of scales and 8 B of zeros per
    // (tile, group): aligned units of the [Np/8][GS][8] arrays), the same for every tile.
    const int gfirst = (kb0 * 8) >> gshift, glast = ((kb0 + per) * 8 - 1) >> gshift;
    const int cnt = glast - gfirst + 1;  // <= ngs (the host's bound)
    // Tile pass i's table into buffer b: entry e = (n8 tile j, group r) of the 2 cnt, at
    // element ((nt0 + j) gstore + gfirst + r) 8 of scales / zeros (nt0 = 2 (blockIdx.x + i
    // tstep)): `tab0` + i `tab_step` for the lane's first entry (e = lane), 32 entries apart.
    const size_t tab_step = (size_t)2 * tstep * gstore * 8;
    auto entry_at = [&](int e) {
        const int j = e >= cnt ? 1 : 0, r = e - j * cnt;
        return ((size_t)(2 * blockIdx.x + j) * gstore + gfirst + r) * 8;
    };
    auto table_copy = [&](int i, int b) {
        const unsigned tb = w4b_smem(table_at(b));
        for (int e = lane; e < 2 * cnt; e += 32) {
            const int j = e >= cnt ? 1 : 0, r = e - j * cnt;
            const size_t at = entry_at(e) + (size_t)i * tab_step;
            w4b_cp(tb + (j * ngs + r) * 16, reinterpret_cast<const unsigned short*>(scales) + at, 1);
            if (ZP) w4b_cp(tb + 2 * ngs * 16 + (j * ngs + r) * 8, zeros + at, 0);
        }
        w4b_commit();  // one group per tile (empty for lanes past 2 cnt)
    };
    unsigned long long pol = 0;
    // Lane 0's next stage to issue: stage uu of the tile pass at `base` (stream index vi).
    const uint4* base = qw + ((size_t)(2 * blockIdx.x) * kblocks + kb0) * 32;
    const size_t pass_step = (size_t)2 * tstep * kblocks * 32;
    int uu = 0, vi = 0;
    if (lane == 0) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        if (hint) asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
#endif
        for (int d = 0; d < stages; ++d) w4b_bar_init(bars_a + 8u * d);
        w4b_bar_fence();
        for (; vi < min(stages, nv); ++vi) {
            const uint4* s0 = base + 32 * SK * uu;
            w4b_issue(ring_a + vi * STAGE, HALF, bars_a + 8u * vi, s0, s0 + (size_t)kblocks * 32,
                      stage_bytes(uu), hint, pol);
            if (++uu == nst) {
                uu = 0;
                base += pass_step;
            }
        }
    }
    table_copy(0, 0);
    const unsigned short* xs = reinterpret_cast<const unsigned short*>(x);
    const uint4* xp = reinterpret_cast<const uint4*>(xs + (size_t)min(r0 + g, m - 1) * k + 32 * t) +
                      (size_t)kb0 * 16;
    // The lane's 16-column chunk index of chunks 0..3 in k block j: c0 + 8 j.
    const int c0 = kb0 * 8 + 2 * t;
    const unsigned zc = W4Dec<T>::bias(8);
    w4_pdl_wait();  // weights and (scale, zero) values only above; x from here on
    int slot = 0;
    unsigned parity = 0;
#pragma unroll 1
    for (int i = 0; i < mine_n; ++i) {
        // The next tile's table into the other buffer (its last reader, tile i - 1, is done:
        // the block barriers of its slice sum), then wait for this tile's.
        if (i + 1 < mine_n) {
            table_copy(i + 1, (i + 1) & 1);
            w4b_cp_wait<1>();
        } else {
            w4b_cp_wait<0>();
        }
        __syncwarp();
        const unsigned short* ssm = reinterpret_cast<const unsigned short*>(table_at(i & 1));
        const unsigned char* zsm = table_at(i & 1) + 2 * ngs * 16;
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int u = 0; u < nst; ++u) {
            const unsigned st = ring_a + slot * STAGE + 16 * lane;
            w4b_wait(bars_a + 8u * slot, parity);
            w4b_stage_mma<T, FP4, ZP, SK>(acc, st, u, per, xp, c0, gshift, gfirst, ssm, zsm, ngs, g, zc);
            // Every lane's words of the stage are decoded (used): it may be overwritten.
            __syncwarp();
            if (lane == 0 && vi < nv) {
                const uint4* s0 = base + 32 * SK * uu;
                w4b_issue(ring_a + slot * STAGE, HALF, bars_a + 8u * slot, s0,
                          s0 + (size_t)kblocks * 32, stage_bytes(uu), hint, pol);
                ++vi;
                if (++uu == nst) {
                    uu = 0;
                    base += pass_step;
                }
            }
            if (++slot == stages) {
                slot = 0;
                parity ^= 1u;
            }
        }
        if (trig != 0 && i + 1 == mine_n) w4_pdl_launch_dependents();
        const int nt0 = 2 * ((int)blockIdx.x + i * tstep);
        // The slice sum: [4][32] f32 of this warp.
        float* mine = sums + w * 128;
#pragma unroll
        for (int e = 0; e < 4; ++e) mine[e * 32 + lane] = acc[e];
        __syncthreads();
        // Warp e (< 4) sums element e over the slices in order (as `w4_gemv_fast` with RG = 1).
        const int nw = blockDim.x >> 5;
        for (int e = s; e < 4; e += nw) {
            float total = 0.0f;
            for (int q = 0; q < ks; ++q) total += sums[q * 128 + e * 32 + lane];
            const int row = r0 + 2 * t + (e & 1);
            const int col = nt0 * 8 + g + (e >= 2 ? 8 : 0);
            if (row < m && col < n) w4_store<T>(out, out_f32, row, n, col, total);
        }
        // The sums are read before the next tile writes them (and the table buffer of tile i
        // is no longer read when tile i + 2's copy lands in it).
        if (i + 1 < mine_n) __syncthreads();
    }
}

#define W4B_ARGS(T)                                                                             \
    const T *x, int m, int k, const uint4 *qw, const T *scales, const unsigned char *zeros,     \
        int kblocks, int ks, int gshift, int gstore, int n, void *out, int out_f32, int fp4,   \
        int trig, int stages, int ngs, int hint, int sk, int ntiles
#define W4BP_PASS x, m, k, qw, scales, zeros, kblocks, ks, gshift, gstore, n, out, out_f32, trig, stages, ngs, hint, ntiles
#define W4B_PASS x, m, k, qw, scales, zeros, kblocks, ks, gshift, gstore, n, out, out_f32, trig, stages, ngs, hint
#define W4B_SK(T, SK, CL)                                                                       \
    if (fp4) w4b_gemv<T, true, false, SK, CL>(W4B_PASS);                                        \
    else if (zeros) w4b_gemv<T, false, true, SK, CL>(W4B_PASS);                                 \
    else w4b_gemv<T, false, false, SK, CL>(W4B_PASS);
#define W4B_ANY_SK(T, CL)                                                                       \
    if (sk == 1) {                                                                              \
        W4B_SK(T, 1, CL)                                                                        \
    } else if (sk == 4) {                                                                       \
        W4B_SK(T, 4, CL)                                                                        \
    } else {                                                                                    \
        W4B_SK(T, 2, CL)                                                                        \
    }
#define W4BP_SK(T, SK)                                                                          \
    if (fp4) w4b_gemvp<T, true, false, SK>(W4BP_PASS);                                          \
    else if (zeros) w4b_gemvp<T, false, true, SK>(W4BP_PASS);                                   \
    else w4b_gemvp<T, false, false, SK>(W4BP_PASS);
#define W4BP_ANY_SK(T)                                                                          \
    if (sk == 1) {                                                                              \
        W4BP_SK(T, 1)                                                                           \
    } else if (sk == 4) {                                                                       \
        W4BP_SK(T, 4)                                                                           \
    } else {                                                                                    \
        W4BP_SK(T, 2)                                                                           \
    }
// Resident blocks of 256 per SM the persistent form's register budget allows (80 registers:
// its tile loop does not fit in 64 without spilling, NVRTC 12.9 ptxas).
#ifndef W4BP_BLOCKS
#define W4BP_BLOCKS 3
#endif
// The cluster form's slice count (the 27B weights' K all have 8 slices).
#define W4B_CLUSTER_KS 8
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define W4B_CLUSTER __cluster_dims__(1, 1, W4B_CLUSTER_KS)
#else
#define W4B_CLUSTER
#endif
// `w4b_gemv_*`: grid (Np / 16, ceil(m / 8)), 32 ks threads. `w4b_gemvp_*`: grid (G <= Np / 16,
// ceil(m / 8)), 32 ks threads, block x running tiles x, x + G, ... (`ntiles` = Np / 16). `w4b_gemvc_*`: grid (Np / 16,
// ceil(m / 8), 8), 32 threads, cluster (1, 1, 8) (the host runs it when ks == 8). `sk`: k blocks
// per ring stage, 1, 2 or 4 (others run as 2).
#define W4B_ENTRY(SUF, T)                                                                       \
    extern "C" __global__ void __launch_bounds__(256, W4B_BLOCKS) w4b_gemv_##SUF(W4B_ARGS(T)) { \
        W4B_ANY_SK(T, false)                                                                    \
    }                                                                                           \
    extern "C" __global__ void W4B_CLUSTER __launch_bounds__(32, 32) w4b_gemvc_##SUF(W4B_ARGS(T)) { \
        W4B_ANY_SK(T, true)                                                                     \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(256, W4BP_BLOCKS) w4b_gemvp_##SUF(W4B_ARGS(T)) { \
        W4BP_ANY_SK(T)                                                                          \
    }
W4B_ENTRY(f16, __half)
W4B_ENTRY(bf16, bf16_t)
