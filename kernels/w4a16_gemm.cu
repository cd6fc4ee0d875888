// w4a16_gemm.cu: the sm_90 tensor-core GEMMs on packed 4-bit integer weights (issue 10 item 7),
// out[r, n] = sum_k x[r, k] * W[n, k] for steps of more than 32 rows on the common layouts:
// `w4g_split` (cluster split-K over 64 x 128 tiles: steps of few tiles), `w4g_tile` (64 x 128
// tiles: the other steps to 2048 rows) and `w4g_gemm` (the wide 128 x 256 tiles: larger steps);
// the host picks by the step's shape (src/backend/cuda/backend/w4a16_gemm.rs). The sm_90a
// warpgroup-MMA GEMM `w4g_wgmma` is kernels/w4a16_wgmma.cu (same layout and numerics).
//
// Layout and numerics: exactly those of kernels/w4a16.cu (read its header first): the w4 tile
// layout (qw uint4 [Np/8][KB][32], scales T [Np/8][GS][8], zeros u8 or nullptr), the weights
// the A operand of mma.sync.m16n8k16 (16 outputs x 16 k), x the B operand (16 k x 8 rows), chunk
// c of a k block covering lane columns 32t + 4c .. +3, chunks 0..7 in order, K cut into the
// host's `ks` slices, slice s accumulated from zero in f32 and the total ((0 + P_0) + P_1) + ...
// in f32. So these kernels give the same bits as `w4_gemv*` / `w4_gemm` of w4a16.cu for every
// row (tests/cuda_w4a16.rs checks GEMV = GEMM bit for bit), and which of them runs a step does
// not change a row's result. The registry compiles this file after w4a16.cu's helpers
// (`KernelModule::full_source`), so the decode, mma, swizzle and cp.async helpers (`W4Dec`,
// `w4_decode2`, `w4_a_unit`, `w4_cp16`, ...) and `W4_KB` are w4a16.cu's own: one copy.
//
// Scope (the host checks it: src/backend/cuda/backend/w4a16_gemm.rs): 16-bit compute dtype on
// sm_90 / sm_100 (the wide block needs 224 KB of shared memory, the split kernel clusters),
// integer nibbles (not NVFP4), no act-order perm, k % 128 == 0, groups of >= 32 columns
// (gshift >= 1: one (scale, zero) per lane per k block). Everything else runs w4a16.cu.
//
// The wide tiling (`w4g_gemm`): 256 threads = 2 (rows) x 4 (outputs) warps; warp tile 64 rows
// x 64 outputs (8 n8 tiles = 4 m16 A tiles x 8 row groups: 32 mma per 16 k), CTA tile 128 rows x
// 256 outputs, grid (ceil(Np / 256), ceil(m / 128)). Against w4a16.cu's 64 x 32 warp tile each x
// fragment read from shared memory feeds twice as many mma (x shared-memory traffic per mma
// halved) while each decoded weight still serves 64 rows. The slice partial P_s lives in the 128
// accumulator registers; the running total in shared memory (128 f32 per thread, 128 KB,
// each thread's own words: [i][256 threads], conflict-free), added at each slice end.
// Two cp.async stages of one 128-column k block: x 128 rows x 256 B (16-byte units swizzled as
// w4a16.cu's GEMM does) and the CTA's 32 n8 weight tiles (32 x 512 B).

#define W4G_X_BYTES (128 * 256)                           // x rows of one stage
#define W4G_W_BYTES (32 * 512)                            // weight tiles of one stage
#define W4G_STAGE_BYTES (W4G_X_BYTES + W4G_W_BYTES)       // 48 KB
#define W4G_STAGES 2
#define W4G_TOTAL_BYTES (128 * 256 * 4)                   // f32 running totals, 128 KB
#define W4G_SMEM_BYTES (W4G_STAGES * W4G_STAGE_BYTES + W4G_TOTAL_BYTES)  // 224 KB

// Stage k block kb of the CTA (rows r0 .. r0 + 127, n8 tiles ntc .. ntc + 31) into `st`: x by
// cp.async with zero fill past row m (k % 128 == 0: every column exists), the tiles that exist.
__device__ __forceinline__ void w4g_stage(unsigned char* st, const unsigned short* xs, int m, int k,
                                          const uint4* qw, int kblocks, int tiles, int r0, int ntc,
                                          int kb) {
    const int tid = threadIdx.x;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int id = tid + 256 * i, row = id >> 4, u = id & 15;
        unsigned char* dst = st + row * 256 + w4_a_unit(u, row) * 16;
        const int r = r0 + row;
        const bool in = r < m;
        const unsigned short* src = in ? xs + (size_t)r * k + kb * W4_KB + 8 * u : xs;
        w4_cp16((unsigned)__cvta_generic_to_shared(dst), src, in ? 16 : 0);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int id = tid + 256 * i, tile = id >> 5, l = id & 31;
        if (ntc + tile < tiles) {
            unsigned char* dst = st + W4G_X_BYTES + tile * 512 + l * 16;
            w4_cp16((unsigned)__cvta_generic_to_shared(dst),
                     qw + ((size_t)(ntc + tile) * kblocks + kb) * 32 + l, 16);
        }
    }
}

template <typename T>
__device__ __forceinline__ void w4g_gemm(const T* x, int m, int k, const uint4* __restrict__ qw,
                                         const T* scales, const unsigned char* zeros, int kblocks,
                                         int ks, int gshift, int gstore, int n, void* out,
                                         int out_f32, int tiles) {
    extern __shared__ __align__(16) unsigned char w4g_smem[];
    float* tot = reinterpret_cast<float*>(w4g_smem + W4G_STAGES * W4G_STAGE_BYTES);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int wm = warp >> 2, wn = warp & 3;
    const int r0 = blockIdx.y * 128;
    const int ntc = blockIdx.x * 32;   // the CTA's first n8 tile
    const int nt0 = ntc + wn * 8;      // the warp's first n8 tile (8: four m16 A tiles)
    const bool active = nt0 < tiles;   // tiles is a multiple of 8: all 8 or none
    const unsigned short* xs = reinterpret_cast<const unsigned short*>(x);
    const int per = kblocks / ks;
    const int sstride = gstore * 8;
    // scales[nt0 + j][gi][g] = sp[j * sstride + gi * 8]; the same index into zeros.
    const size_t sbase = (size_t)(active ? nt0 : 0) * sstride + g;
    const unsigned short* sp = reinterpret_cast<const unsigned short*>(scales) + sbase;
    const unsigned char* zp = zeros ? zeros + sbase : nullptr;
    // acc[u][rg][e]: m16 output tile u (n8 tiles nt0 + 2u, + 1), row group rg (8 rows).
    float acc[4][8][4];
#pragma unroll
    for (int u = 0; u < 4; ++u)
#pragma unroll
        for (int rg = 0; rg < 8; ++rg)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[u][rg][e] = 0.0f;
#pragma unroll 8
    for (int i = 0; i < 128; ++i) tot[i * 256 + tid] = 0.0f;
    // Packed (scale | zero << 16) of tile j for the lane's group of k block kb (gshift >= 1:
    // one group per lane per k block).
    unsigned szc[8];
    auto load_sz = [&](int kb) {
        const int gi = (kb * 8 + 2 * t) >> gshift;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            const int i = j * sstride + gi * 8;
            szc[j] = (unsigned)__ldg(sp + i) | ((zp ? (unsigned)__ldg(zp + i) : 8u) << 16);
        }
    };
    if (active) load_sz(0);
    w4g_stage(w4g_smem, xs, m, k, qw, kblocks, tiles, r0, ntc, 0);
    w4_cp_commit();
    for (int kb = 0; kb < kblocks; ++kb) {
        w4_cp_wait(0);
        __syncthreads();  // stage kb landed for all; stage kb - 1's buffer is free
        if (kb + 1 < kblocks)
            w4g_stage(w4g_smem + ((kb + 1) & 1) * W4G_STAGE_BYTES, xs, m, k, qw, kblocks, tiles,
                      r0, ntc, kb + 1);
        w4_cp_commit();
        if (!active) continue;
        const unsigned char* st = w4g_smem + (kb & 1) * W4G_STAGE_BYTES;
        const unsigned char* wst = st + W4G_X_BYTES + wn * 8 * 512 + lane * 16;
        // The decode's scale pair and zero bias of tile j, unpacked where used (registers).
        unsigned sz[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) sz[j] = szc[j];
        if (kb + 1 < kblocks) load_sz(kb + 1);
        auto s2 = [&](int j) { return __byte_perm(sz[j], 0u, 0x1010); };
        auto zb = [&](int j) { return W4Dec<T>::bias((int)(sz[j] >> 16)); };
#pragma unroll 1
        for (int h = 0; h < 2; ++h) {
            // Words 2h, 2h + 1 of the lane's word in each of the warp's 8 tiles.
            uint2 wv[8];
#pragma unroll
            for (int j = 0; j < 8; ++j) wv[j] = *reinterpret_cast<const uint2*>(wst + j * 512 + 8 * h);
#pragma unroll
            for (int qq = 0; qq < 2; ++qq) {
                const int q = 2 * h + qq;
                uint4 xr[8];
#pragma unroll
                for (int rg = 0; rg < 8; ++rg) {
                    const int row = wm * 64 + rg * 8 + g;
                    xr[rg] = *reinterpret_cast<const uint4*>(st + row * 256 + w4_a_unit(4 * t + q, row) * 16);
                }
#pragma unroll
                for (int u = 0; u < 4; ++u) {
                    unsigned d0[4], d1[4];
                    w4_decode2<T>(qq ? wv[2 * u].y : wv[2 * u].x, s2(2 * u), zb(2 * u), d0);
                    w4_decode2<T>(qq ? wv[2 * u + 1].y : wv[2 * u + 1].x, s2(2 * u + 1),
                                   zb(2 * u + 1), d1);
                    const unsigned a0[4] = {d0[0], d1[0], d0[1], d1[1]};
                    const unsigned a1[4] = {d0[2], d1[2], d0[3], d1[3]};
#pragma unroll
                    for (int rg = 0; rg < 8; ++rg) {
                        mma_m16n8k16<T>(acc[u][rg], a0, xr[rg].x, xr[rg].y);
                        mma_m16n8k16<T>(acc[u][rg], a1, xr[rg].z, xr[rg].w);
                    }
                }
            }
        }
        if ((kb + 1) % per == 0) {
            // Slice end: total += P_s (f32, slices in order), P restarts from zero.
#pragma unroll
            for (int u = 0; u < 4; ++u)
#pragma unroll
                for (int rg = 0; rg < 8; ++rg)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int i = (u * 8 + rg) * 4 + e;
                        tot[i * 256 + tid] += acc[u][rg][e];
                        acc[u][rg][e] = 0.0f;
                    }
        }
    }
    w4_cp_wait(0);
    if (!active) return;
#pragma unroll
    for (int u = 0; u < 4; ++u)
#pragma unroll
        for (int rg = 0; rg < 8; ++rg)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int row = r0 + wm * 64 + rg * 8 + 2 * t + (e & 1);
                const int col = (nt0 + 2 * u) * 8 + g + (e >= 2 ? 8 : 0);
                if (row < m && col < n) {
                    const float v = tot[((u * 8 + rg) * 4 + e) * 256 + tid];
                    const size_t i = (size_t)row * n + col;
                    if (out_f32) {
                        static_cast<float*>(out)[i] = v;
                    } else {
                        Io<T>::store(static_cast<T*>(out), (long)i, v);
                    }
                }
            }
}

// The narrow tiles (`w4g_tile`, `w4g_split`): WN warps side by side along the outputs, each
// covering all 8 RGW rows of the CTA and NTW n8 tiles (NTW / 2 m16 A tiles): CTA tile 8 RGW rows
// x 8 NTW WN outputs, 32 WN threads, S cp.async stages of one k block (x: 8 RGW rows x 256 B,
// swizzled as above; weights: NTW WN tiles x 512 B). Per k block a warp decodes its NTW tiles
// once and runs them against every present row group (row groups wholly past m are skipped: a
// uniform branch), chunks 0..7 in order for every accumulator (the arithmetic of the header).
// The built shape (RGW 8, NTW 2, WN 8, S 3: 64 rows x 128 outputs, 128 registers, 72 KB, two
// CTAs per SM) was the fastest of five measured at M = 33..1024 (docs/benchmarks.md, branch
// `gemm`); the slice partial and total (32 f32 each) stay in registers.
template <int RGW, int NTW, int WN, int S>
struct W4gCfg {
    static constexpr int THREADS = 32 * WN;
    static constexpr int ROWS = 8 * RGW;
    static constexpr int TILES = NTW * WN;  // n8 tiles of the CTA
    static constexpr int XB = ROWS * 256;
    static constexpr int STAGE = XB + TILES * 512;
    static constexpr int SMEM = S * STAGE;  // dynamic shared memory of a CTA
};

template <int N>
__device__ __forceinline__ void w4g_cp_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

template <int RGW, int NTW, int WN, int S>
__device__ __forceinline__ void w4g_tile_stage(unsigned char* st, const unsigned short* xs, int m,
                                               int k, const uint4* qw, int kblocks, int tiles,
                                               int r0, int ntc, int kb) {
    using C = W4gCfg<RGW, NTW, WN, S>;
    const int tid = threadIdx.x;
#pragma unroll
    for (int i = 0; i < C::ROWS * 16 / C::THREADS; ++i) {
        const int id = tid + C::THREADS * i, row = id >> 4, u = id & 15;
        unsigned char* dst = st + row * 256 + w4_a_unit(u, row) * 16;
        const int r = r0 + row;
        const bool in = r < m;
        const unsigned short* src = in ? xs + (size_t)r * k + kb * W4_KB + 8 * u : xs;
        w4_cp16((unsigned)__cvta_generic_to_shared(dst), src, in ? 16 : 0);
    }
#pragma unroll
    for (int i = 0; i < C::TILES * 32 / C::THREADS; ++i) {
        const int id = tid + C::THREADS * i, tile = id >> 5, l = id & 31;
        if (ntc + tile < tiles) {
            unsigned char* dst = st + C::XB + tile * 512 + l * 16;
            w4_cp16((unsigned)__cvta_generic_to_shared(dst),
                     qw + ((size_t)(ntc + tile) * kblocks + kb) * 32 + l, 16);
        }
    }
}

// One k block of a warp of `w4g_tile` / `w4g_split` from stage `st`: its NTW tiles decoded once
// (scale | zero << 16 words `sz`) and run against the present row groups (nrg of RGW), chunks 0..7
// in order for every accumulator.
template <typename T, int RGW, int NTW, int WN, int S>
__device__ __forceinline__ void w4g_tile_kblock(float (*acc)[RGW][4], const unsigned char* st,
                                                int warp, int lane, const unsigned* sz, int nrg) {
    using C = W4gCfg<RGW, NTW, WN, S>;
    constexpr int U = NTW / 2;
    const int g = lane >> 2, t = lane & 3;
    const unsigned char* wst = st + C::XB + warp * NTW * 512 + lane * 16;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        uint2 wv[NTW];
#pragma unroll
        for (int j = 0; j < NTW; ++j) wv[j] = *reinterpret_cast<const uint2*>(wst + j * 512 + 8 * h);
#pragma unroll
        for (int qq = 0; qq < 2; ++qq) {
            const int q = 2 * h + qq;
            unsigned a0[U][4], a1[U][4];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                unsigned d0[4], d1[4];
                const int j0 = 2 * u, j1 = 2 * u + 1;
                w4_decode2<T>(qq ? wv[j0].y : wv[j0].x, __byte_perm(sz[j0], 0u, 0x1010),
                               W4Dec<T>::bias((int)(sz[j0] >> 16)), d0);
                w4_decode2<T>(qq ? wv[j1].y : wv[j1].x, __byte_perm(sz[j1], 0u, 0x1010),
                               W4Dec<T>::bias((int)(sz[j1] >> 16)), d1);
                a0[u][0] = d0[0]; a0[u][1] = d1[0]; a0[u][2] = d0[1]; a0[u][3] = d1[1];
                a1[u][0] = d0[2]; a1[u][1] = d1[2]; a1[u][2] = d0[3]; a1[u][3] = d1[3];
            }
#pragma unroll
            for (int rg = 0; rg < RGW; ++rg) {
                if (rg == 0 || rg < nrg) {
                    const int row = rg * 8 + g;
                    const uint4 xr = *reinterpret_cast<const uint4*>(st + row * 256 + w4_a_unit(4 * t + q, row) * 16);
#pragma unroll
                    for (int u = 0; u < U; ++u) {
                        mma_m16n8k16<T>(acc[u][rg], a0[u], xr.x, xr.y);
                        mma_m16n8k16<T>(acc[u][rg], a1[u], xr.z, xr.w);
                    }
                }
            }
        }
    }
}

template <typename T, int RGW, int NTW, int WN, int S>
__device__ __forceinline__ void w4g_tile(const T* x, int m, int k, const uint4* __restrict__ qw,
                                         const T* scales, const unsigned char* zeros, int kblocks,
                                         int ks, int gshift, int gstore, int n, void* out,
                                         int out_f32, int tiles) {
    using C = W4gCfg<RGW, NTW, WN, S>;
    constexpr int U = NTW / 2;
    extern __shared__ __align__(16) unsigned char w4g_smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int r0 = blockIdx.y * C::ROWS;
    const int nrg = min(RGW, (m - r0 + 7) >> 3);  // row groups with a row below m
    const int ntc = blockIdx.x * C::TILES;
    const int nt0 = ntc + warp * NTW;
    const bool active = nt0 < tiles;  // tiles % 8 == 0 and NTW | 8: all NTW tiles or none
    const unsigned short* xs = reinterpret_cast<const unsigned short*>(x);
    const int per = kblocks / ks;
    const int sstride = gstore * 8;
    const size_t sbase = (size_t)(active ? nt0 : 0) * sstride + g;
    const unsigned short* sp = reinterpret_cast<const unsigned short*>(scales) + sbase;
    const unsigned char* zp = zeros ? zeros + sbase : nullptr;
    // acc: the running slice's partial P_s; tot: the slice sum ((0 + P_0) + P_1) + ...
    float acc[U][RGW][4], tot[U][RGW][4];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
        for (int rg = 0; rg < RGW; ++rg)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                acc[u][rg][e] = 0.0f;
                tot[u][rg][e] = 0.0f;
            }
    unsigned szc[NTW];
    auto load_sz = [&](int kb) {
        const int gi = (kb * 8 + 2 * t) >> gshift;
#pragma unroll
        for (int j = 0; j < NTW; ++j) {
            const int i = j * sstride + gi * 8;
            szc[j] = (unsigned)__ldg(sp + i) | ((zp ? (unsigned)__ldg(zp + i) : 8u) << 16);
        }
    };
    if (active) load_sz(0);
#pragma unroll
    for (int p = 0; p < S - 1; ++p) {
        if (p < kblocks)
            w4g_tile_stage<RGW, NTW, WN, S>(w4g_smem + p * C::STAGE, xs, m, k, qw, kblocks, tiles,
                                            r0, ntc, p);
        w4_cp_commit();
    }
    for (int kb = 0; kb < kblocks; ++kb) {
        w4g_cp_wait<S - 2>();
        __syncthreads();  // stage kb landed for all; the buffer of kb - 1 is free
        {
            const int kn = kb + S - 1;
            if (kn < kblocks)
                w4g_tile_stage<RGW, NTW, WN, S>(w4g_smem + (kn % S) * C::STAGE, xs, m, k, qw,
                                                kblocks, tiles, r0, ntc, kn);
            w4_cp_commit();
        }
        if (!active) continue;
        unsigned sz[NTW];
#pragma unroll
        for (int j = 0; j < NTW; ++j) sz[j] = szc[j];
        if (kb + 1 < kblocks) load_sz(kb + 1);
        w4g_tile_kblock<T, RGW, NTW, WN, S>(acc, w4g_smem + (kb % S) * C::STAGE, warp, lane, sz, nrg);
        if ((kb + 1) % per == 0) {
            // Slice end: total += P_s (f32, slices in order), P restarts from zero.
#pragma unroll
            for (int u = 0; u < U; ++u)
#pragma unroll
                for (int rg = 0; rg < RGW; ++rg)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        tot[u][rg][e] += acc[u][rg][e];
                        acc[u][rg][e] = 0.0f;
                    }
        }
    }
    w4g_cp_wait<0>();
    if (!active) return;
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
        for (int rg = 0; rg < RGW; ++rg)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int row = r0 + rg * 8 + 2 * t + (e & 1);
                const int col = (nt0 + 2 * u) * 8 + g + (e >= 2 ? 8 : 0);
                if (row < m && col < n) {
                    const size_t i = (size_t)row * n + col;
                    if (out_f32) {
                        static_cast<float*>(out)[i] = tot[u][rg][e];
                    } else {
                        Io<T>::store(static_cast<T*>(out), (long)i, tot[u][rg][e]);
                    }
                }
            }
}

// Cluster helpers (sm_90): the CTA barrier across the cluster (release / acquire: shared memory
// written before it is visible to the other CTAs after it), and a 16-byte read of the same
// shared offset in cluster CTA `rank`.
__device__ __forceinline__ void w4g_cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
#else
    __trap();
#endif
}
__device__ __forceinline__ float4 w4g_dsmem_f4(const void* local, int rank) {
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    unsigned ra;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n"
                 : "=r"(ra) : "r"((unsigned)__cvta_generic_to_shared(local)), "r"(rank));
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(ra) : "memory");
#else
    __trap();
#endif
    return v;
}

// Split-K over a cluster (sm_90; the host runs it when ks == W4G_SPLIT_KS): grid (Np / OUTS,
// ceil(m / ROWS), ks), cluster (1, 1, ks), so the ks CTAs of one output tile are one cluster and
// CTA z (its cluster rank) computes slice z's partial P_z alone: k blocks z * per .. + per - 1 in
// order, from zero, exactly as the one-CTA kernels do (the `w4g_tile` machinery: x and the tiles
// staged by cp.async, S stages). P_z goes to the CTA's shared memory (f32 [ROWS][OUTS + 4]), the
// cluster synchronizes, and CTA z then sums 1/ks of the tile's elements over the ks CTAs in
// slice order, ((0 + P_0) + P_1) + ... (distributed shared memory reads), rounds and stores them.
// Same bits as every other kernel of the w4 tiles; no workspace, one launch (graph-capturable).
#define W4G_SPLIT_KS 8
template <typename T, int RGW, int NTW, int WN, int S>
__device__ __forceinline__ void w4g_split(const T* x, int m, int k, const uint4* __restrict__ qw,
                                          const T* scales, const unsigned char* zeros,
                                          int kblocks, int ks, int gshift, int gstore, int n,
                                          void* out, int out_f32, int tiles) {
    using C = W4gCfg<RGW, NTW, WN, S>;
    constexpr int U = NTW / 2;
    constexpr int OUTS = C::TILES * 8;
    constexpr int PS = OUTS + 4;  // P row stride (f32): conflict-free writes, 16-byte rows
    static_assert(C::ROWS * PS * 4 <= S * C::STAGE, "the partial fits the stages");
    static_assert((C::ROWS * OUTS / 4) % W4G_SPLIT_KS == 0, "whole float4 shares");
    extern __shared__ __align__(16) unsigned char w4g_smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int r0 = blockIdx.y * C::ROWS;
    const int nrg = min(RGW, (m - r0 + 7) >> 3);
    const int ntc = blockIdx.x * C::TILES;
    const int nt0 = ntc + warp * NTW;
    const bool active = nt0 < tiles;
    const int z = blockIdx.z;  // the slice = the cluster rank (cluster (1, 1, ks))
    const unsigned short* xs = reinterpret_cast<const unsigned short*>(x);
    const int per = kblocks / ks, kb0 = z * per;
    const int sstride = gstore * 8;
    const size_t sbase = (size_t)(active ? nt0 : 0) * sstride + g;
    const unsigned short* sp = reinterpret_cast<const unsigned short*>(scales) + sbase;
    const unsigned char* zp = zeros ? zeros + sbase : nullptr;
    float acc[U][RGW][4];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
        for (int rg = 0; rg < RGW; ++rg)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[u][rg][e] = 0.0f;
    unsigned szc[NTW];
    auto load_sz = [&](int kb) {
        const int gi = (kb * 8 + 2 * t) >> gshift;
#pragma unroll
        for (int j = 0; j < NTW; ++j) {
            const int i = j * sstride + gi * 8;
            szc[j] = (unsigned)__ldg(sp + i) | ((zp ? (unsigned)__ldg(zp + i) : 8u) << 16);
        }
    };
    if (active) load_sz(kb0);
#pragma unroll
    for (int p = 0; p < S - 1; ++p) {
        if (p < per)
            w4g_tile_stage<RGW, NTW, WN, S>(w4g_smem + p * C::STAGE, xs, m, k, qw, kblocks, tiles,
                                            r0, ntc, kb0 + p);
        w4_cp_commit();
    }
    for (int i = 0; i < per; ++i) {
        w4g_cp_wait<S - 2>();
        __syncthreads();
        {
            const int kn = i + S - 1;
            if (kn < per)
                w4g_tile_stage<RGW, NTW, WN, S>(w4g_smem + (kn % S) * C::STAGE, xs, m, k, qw,
                                                kblocks, tiles, r0, ntc, kb0 + kn);
            w4_cp_commit();
        }
        if (!active) continue;
        unsigned sz[NTW];
#pragma unroll
        for (int j = 0; j < NTW; ++j) sz[j] = szc[j];
        if (i + 1 < per) load_sz(kb0 + i + 1);
        w4g_tile_kblock<T, RGW, NTW, WN, S>(acc, w4g_smem + (i % S) * C::STAGE, warp, lane, sz, nrg);
    }
    w4g_cp_wait<0>();
    __syncthreads();  // every warp is done with the stages
    float* pt = reinterpret_cast<float*>(w4g_smem);
    if (active) {
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
            for (int rg = 0; rg < RGW; ++rg)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int row = rg * 8 + 2 * t + (e & 1);
                    const int col = (warp * NTW + 2 * u) * 8 + g + (e >= 2 ? 8 : 0);
                    pt[row * PS + col] = acc[u][rg][e];
                }
    }
    w4g_cluster_sync();  // every slice's partial is in its CTA's shared memory
    constexpr int SHARE = C::ROWS * OUTS / 4 / W4G_SPLIT_KS;  // float4 pieces per CTA
    for (int c = z * SHARE + tid; c < (z + 1) * SHARE; c += C::THREADS) {
        const int row = c / (OUTS / 4), c4 = (c % (OUTS / 4)) * 4;
        const float* src = pt + row * PS + c4;
        float tot[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int q = 0; q < W4G_SPLIT_KS; ++q) {
            const float4 v = w4g_dsmem_f4(src, q);
            tot[0] += v.x;
            tot[1] += v.y;
            tot[2] += v.z;
            tot[3] += v.w;
        }
        const int r = r0 + row, col = ntc * 8 + c4;
        if (r >= m) continue;
        if (!out_f32 && (n & 3) == 0 && col + 4 <= n &&
            (reinterpret_cast<size_t>(out) & 7) == 0) {
            T v4[4];
#pragma unroll
            for (int j = 0; j < 4; ++j) Io<T>::store(v4, j, tot[j]);
            *reinterpret_cast<uint2*>(static_cast<T*>(out) + (size_t)r * n + col) =
                *reinterpret_cast<const uint2*>(v4);
        } else {
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                if (col + j >= n) break;
                const size_t o = (size_t)r * n + col + j;
                if (out_f32) {
                    static_cast<float*>(out)[o] = tot[j];
                } else {
                    Io<T>::store(static_cast<T*>(out), (long)o, tot[j]);
                }
            }
        }
    }
    w4g_cluster_sync();  // no CTA leaves while another still reads its shared memory
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define W4G_CLUSTER __cluster_dims__(1, 1, W4G_SPLIT_KS)
#else
#define W4G_CLUSTER
#endif

// `w4g_tile_{f16,bf16}`: grid (Np / 128, ceil(m / 64)), 256 threads, W4G_TILE_SMEM bytes of
// dynamic shared memory. `w4g_split_{f16,bf16}`: the same tile, grid (Np / 128, ceil(m / 64),
// 8), cluster (1, 1, 8), the same shared memory (the host runs it when ks == 8).
#define W4G_TILE_CFG 8, 2, 8, 3
#define W4G_TILE_SMEM (W4gCfg<W4G_TILE_CFG>::SMEM)
#define W4G_TILE_ENTRIES(SUF, T)                                                                 \
    extern "C" __global__ void __launch_bounds__(256, 2) w4g_tile_##SUF(                          \
        const T* x, int m, int k, const uint4* qw, const T* scales, const unsigned char* zeros,   \
        int kblocks, int ks, int gshift, int gstore, int n, void* out, int out_f32, int tiles) {  \
        w4g_tile<T, W4G_TILE_CFG>(x, m, k, qw, scales, zeros, kblocks, ks, gshift, gstore, n,     \
                                  out, out_f32, tiles);                                          \
    }                                                                                            \
    extern "C" __global__ void W4G_CLUSTER __launch_bounds__(256, 2) w4g_split_##SUF(             \
        const T* x, int m, int k, const uint4* qw, const T* scales, const unsigned char* zeros,   \
        int kblocks, int ks, int gshift, int gstore, int n, void* out, int out_f32, int tiles) {  \
        w4g_split<T, W4G_TILE_CFG>(x, m, k, qw, scales, zeros, kblocks, ks, gshift, gstore, n,    \
                                   out, out_f32, tiles);                                         \
    }
W4G_TILE_ENTRIES(f16, __half)
W4G_TILE_ENTRIES(bf16, bf16_t)

// `w4g_gemm_{f16,bf16}`: grid (ceil(Np / 256), ceil(m / 128)), 256 threads, W4G_SMEM_BYTES of
// dynamic shared memory; `tiles` = Np / 8.
#define W4G_ENTRY(SUF, T)                                                                        \
    extern "C" __global__ void __launch_bounds__(256, 1) w4g_gemm_##SUF(                          \
        const T* x, int m, int k, const uint4* qw, const T* scales, const unsigned char* zeros,   \
        int kblocks, int ks, int gshift, int gstore, int n, void* out, int out_f32, int tiles) {  \
        w4g_gemm<T>(x, m, k, qw, scales, zeros, kblocks, ks, gshift, gstore, n, out, out_f32,   \
                    tiles);                                                                      \
    }
W4G_ENTRY(f16, __half)
W4G_ENTRY(bf16, bf16_t)
