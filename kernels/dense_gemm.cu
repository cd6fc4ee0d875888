// dense_gemm.cu: the batch-invariant dense GEMM for prefill sizes (KILN_DENSE_MATMUL=mma above 64
// rows; sm_80+): out = x · wᵀ with exactly the per-element arithmetic of dense.cu's tensor-core
// kernels (dense_mma_small / dense_mma_large), so a row's bits do not depend on the kernel, the
// tile or the number of rows; faster than dense_mma_large by staging both operands through a
// cp.async multi-stage shared-memory ring instead of loading every fragment from global memory.
// Prepended: common.cuh, then dense_common.cuh (pdl_wait, dmma, dmma_store).
//
// x: [m, k] and w: [n, k] 16-bit (T), row-major, k a multiple of 8, rows 16-byte aligned; out:
// [m, n] in O (T or f32), or [m, n / 2] in T for SWIGLU (w's rows interleaved gate|up per 16-row
// tile, see dense.cu). sb: k blocks (of 32 columns) per K slice, dense.rs `slice_blocks(k)`.
//
// THE ARITHMETIC (the same as dense.cu, "MMA OPERANDS AND K ORDER"): per 16-output x 8-row
// fragment tile, k block kb of 32 columns is two mma.m16n8k16 (dense_common.cuh `dmma`, chunk 0
// then 1) on the 128-bit words that lane 4g + t holds: columns kb·32 + 8t .. +8 of weight rows
// g, g + 8 and of x row g; k blocks in ascending order from +0 into the slice partial P_s (slice
// s = blocks s·sb .. min((s+1)·sb, kb_total)); after a slice's last block tot += P_s, from
// tot = +0, slices in order (dense_mma_small sums its slice partials from +0 in slice order too);
// the store (dense_common.cuh `dmma_store`) rounds / applies the epilogue. Columns >= k, rows >= m
// and outputs >= n are zeros in shared memory (cp.async zero-fill), as dmma_ld's zeros; blocks past
// kb_total are never multiplied (a stage's second block may not exist).
//
// THE PIPELINE. Block tile BN outputs x BM rows, warps WARPS_N x WARPS_M, warp tile WN x WM
// (WN / 16 A tiles x WM / 8 row groups). A stage is 2 k blocks (64 columns): the A part [2][BN][32]
// and the B part [2][BM][32] (64-byte rows; chunk c of a part is at byte 16c, k block
// c / (4 rows), row (c / 4) % rows, 16-byte column c % 4: consecutive threads write consecutive
// 16 bytes and read 64 contiguous bytes of a row). A lane's fragment word is one 128-bit
// ld.shared at (row, 16t); the 8 lanes of a quarter warp read two whole 64-byte rows: no bank
// conflicts (ldmatrix cannot produce the column permutation of `dmma` without another layout).
// STAGES - 1 stages are in flight while one is multiplied (cp.async.wait_group STAGES - 2, one
// barrier per stage).
#define DG_KB_STAGE 2

__device__ __forceinline__ void dg_cp16(unsigned dst, const void* src, bool in) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(in ? 16 : 0));
#else
    __trap();  // the host launches this module on sm_80+ only
#endif
}

__device__ __forceinline__ void dg_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}

template <int N>
__device__ __forceinline__ void dg_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// Issue the copies of one part (ROWS rows from `row0` of p [rows, k]) of stage `st` into the
// shared address `dst` (chunk c at dst + 16c, layout above). ROWS · 8 is a multiple of THREADS.
template <int ROWS, int THREADS>
__device__ __forceinline__ void dg_issue_part(unsigned dst, const unsigned short* __restrict__ p,
                                              int row0, int rows, int k, int st) {
#pragma unroll
    for (int it = 0; it < ROWS * 8 / THREADS; ++it) {
        const int c = it * THREADS + threadIdx.x;
        const int kbl = c / (4 * ROWS), row = (c / 4) % ROWS, q = c % 4;
        const int col = st * 32 * DG_KB_STAGE + kbl * 32 + 8 * q;
        const int r = row0 + row;
        const bool in = r < rows && col < k;
        dg_cp16(dst + 16 * c, in ? p + (long)r * k + col : p, in);
    }
}

// The fragment words of k block j of a stage buffer: A tile i's rows g (fa[i][0]) and g + 8
// (fa[i][1]), row group r's x row g (fb[r]); a_off / b_off the lane's offsets in block 0.
template <int TN, int TM, int BN, int BM>
__device__ __forceinline__ void dg_frags(const unsigned char* buf, int a_off, int b_off, int j,
                                         uint4 (*fa)[2], uint4* fb) {
#pragma unroll
    for (int i = 0; i < TN; ++i) {
        const unsigned char* pa = buf + a_off + (j * BN + 16 * i) * 64;
        fa[i][0] = *reinterpret_cast<const uint4*>(pa);
        fa[i][1] = *reinterpret_cast<const uint4*>(pa + 8 * 64);
    }
#pragma unroll
    for (int r = 0; r < TM; ++r)
        fb[r] = *reinterpret_cast<const uint4*>(buf + b_off + (j * BM + 8 * r) * 64);
}

// A slice ended: tot += its partial (in slice order, from +0), and the partial restarts at +0.
template <int TN, int TM>
__device__ __forceinline__ void dg_flush(float (*acc)[TM][4], float (*tot)[TM][4]) {
#pragma unroll
    for (int i = 0; i < TN; ++i)
#pragma unroll
        for (int r = 0; r < TM; ++r)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                tot[i][r][e] += acc[i][r][e];
                acc[i][r][e] = 0.0f;
            }
}

template <typename T, typename O, bool SWIGLU, int BN, int BM, int WN, int WM, int STAGES>
__device__ void dense_gemm(const T* __restrict__ x, const T* __restrict__ w, O* __restrict__ out,
                           int m, int n, int k, int sb) {
    constexpr int WARPS_N = BN / WN, WARPS_M = BM / WM, THREADS = WARPS_N * WARPS_M * 32;
    constexpr int TN = WN / 16, TM = WM / 8;
    constexpr int A_BYTES = DG_KB_STAGE * BN * 64, STAGE_BYTES = DG_KB_STAGE * (BN + BM) * 64;
    // DG_PREFETCH (KILN_DENSE_GEMM_PREFETCH=1): two fragment register sets, for the warp tiles
    // where they fit (at most 64 x 32).
#ifdef DG_PREFETCH
    constexpr bool PREF = TN * TM <= 16;
#else
    constexpr bool PREF = false;
#endif
    static_assert(BN % WN == 0 && BM % WM == 0 && WN % 16 == 0 && WM % 8 == 0, "tile shape");
    static_assert((BN * 8) % THREADS == 0 && (BM * 8) % THREADS == 0, "copy split");
    extern __shared__ __align__(128) unsigned char dg_smem[];
    const unsigned short* xs = reinterpret_cast<const unsigned short*>(x);
    const unsigned short* ws = reinterpret_cast<const unsigned short*>(w);
    const unsigned sm0 = (unsigned)__cvta_generic_to_shared(dg_smem);
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const int g = lane >> 2, t = lane & 3;
    const int wn = warp % WARPS_N, wm = warp / WARPS_N;
    const int nb0 = blockIdx.x * BN, mb0 = blockIdx.y * BM;
    const int kbt = (k + 31) / 32, nst = (kbt + DG_KB_STAGE - 1) / DG_KB_STAGE;
    pdl_wait();
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < nst) {
            const unsigned d = sm0 + s * STAGE_BYTES;
            dg_issue_part<BN, THREADS>(d, ws, nb0, n, k, s);
            dg_issue_part<BM, THREADS>(d + A_BYTES, xs, mb0, m, k, s);
        }
        dg_commit();
    }
    float acc[TN][TM][4], tot[TN][TM][4];
#pragma unroll
    for (int i = 0; i < TN; ++i)
#pragma unroll
        for (int r = 0; r < TM; ++r)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][r][e] = tot[i][r][e] = 0.0f;
    // Offsets (bytes) of this lane's fragment words within a stage's k block 0.
    const int a_off = (wn * WN + g) * 64 + 16 * t;
    const int b_off = A_BYTES + (wm * WM + g) * 64 + 16 * t;
    int slice_end = min(sb, kbt);  // one past the current slice's last k block
    for (int st = 0; st < nst; ++st) {
        dg_wait<STAGES - 2>();
        __syncthreads();  // stage st landed for every thread; stage st - 1's buffer is free
        {
            const int nx = st + STAGES - 1;
            if (nx < nst) {
                const unsigned d = sm0 + (nx % STAGES) * STAGE_BYTES;
                dg_issue_part<BN, THREADS>(d, ws, nb0, n, k, nx);
                dg_issue_part<BM, THREADS>(d + A_BYTES, xs, mb0, m, k, nx);
            }
            dg_commit();
        }
        const unsigned char* buf = dg_smem + (st % STAGES) * STAGE_BYTES;
        if (PREF) {
            // Every fragment word of k block j + 1 is read from shared memory before the mmas
            // of block j are issued (two register sets), so no mma waits on its own loads.
            uint4 fa[2][TN][2], fb[2][TM];
            dg_frags<TN, TM, BN, BM>(buf, a_off, b_off, 0, fa[0], fb[0]);
#pragma unroll
            for (int j = 0; j < DG_KB_STAGE; ++j) {
                const int kb = st * DG_KB_STAGE + j;
                if (j + 1 < DG_KB_STAGE)
                    dg_frags<TN, TM, BN, BM>(buf, a_off, b_off, j + 1, fa[(j + 1) & 1],
                                             fb[(j + 1) & 1]);
                if (kb < kbt) {
#pragma unroll
                    for (int c = 0; c < 2; ++c)
#pragma unroll
                        for (int i = 0; i < TN; ++i)
#pragma unroll
                            for (int r = 0; r < TM; ++r)
                                dmma<T>(acc[i][r], fa[j & 1][i][0], fa[j & 1][i][1], fb[j & 1][r], c);
                    if (kb + 1 == slice_end) {
                        dg_flush<TN, TM>(acc, tot);
                        slice_end = min(slice_end + sb, kbt);
                    }
                }
            }
            continue;
        }
#pragma unroll
        for (int j = 0; j < DG_KB_STAGE; ++j) {
            const int kb = st * DG_KB_STAGE + j;
            if (kb < kbt) {
                // The x fragments of the warp's rows, then one A tile (16 outputs) at a time: its
                // two words live only through its 2 · TM mmas (registers for the 64 x 48 tiles).
                uint4 b[TM];
#pragma unroll
                for (int r = 0; r < TM; ++r)
                    b[r] = *reinterpret_cast<const uint4*>(buf + b_off + (j * BM + 8 * r) * 64);
#pragma unroll
                for (int i = 0; i < TN; ++i) {
                    const unsigned char* pa = buf + a_off + (j * BN + 16 * i) * 64;
                    const uint4 a_lo = *reinterpret_cast<const uint4*>(pa);
                    const uint4 a_hi = *reinterpret_cast<const uint4*>(pa + 8 * 64);
#pragma unroll
                    for (int c = 0; c < 2; ++c)
#pragma unroll
                        for (int r = 0; r < TM; ++r) dmma<T>(acc[i][r], a_lo, a_hi, b[r], c);
                }
                if (kb + 1 == slice_end) {  // the slice's last block
                    dg_flush<TN, TM>(acc, tot);
                    slice_end = min(slice_end + sb, kbt);
                }
            }
        }
    }
    dg_wait<0>();  // no copy outlives the block (the trailing groups are empty)
#pragma unroll
    for (int i = 0; i < TN; ++i) {
        const int n0 = nb0 + wn * WN + 16 * i;
        if (n0 >= n) continue;
#pragma unroll
        for (int r = 0; r < TM; ++r) {
            const int row0 = mb0 + wm * WM + 8 * r;
            if (SWIGLU) {
                dmma_store<T, O, true>(out, m, n, n0, row0, lane, 0, tot[i][r][0], tot[i][r][2]);
                dmma_store<T, O, true>(out, m, n, n0, row0, lane, 1, tot[i][r][1], tot[i][r][3]);
            } else {
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    dmma_store<T, O, false>(out, m, n, n0, row0, lane, e, tot[i][r][e], 0.0f);
            }
        }
    }
}

// The tiles (dense_gemm.rs `GemmTile`, same order and numbers; shared memory STAGES x 2 k blocks
// x (BN + BM) x 64 bytes): t0 128 x 128 (8 warps of 64 x 32, 4 stages, 128 KiB, 1 block / SM),
// t1 64 x 64 (4 warps of 32 x 32, 4 stages, 64 KiB, 3 / SM), t2 128 x 64 (4 warps of 64 x 32,
// 4 stages, 96 KiB, 2 / SM), t3 64 x 32 (4 warps of 32 x 16, 4 stages, 48 KiB, 4 / SM), t4
// 128 x 192 (8 warps of 64 x 48, 4 stages, 160 KiB, 1 / SM), t5 128 x 96 (4 warps of 64 x 48,
// 3 stages, 84 KiB, 2 / SM). The 64 x 48 warp tiles read 14 fragment words per 48 mmas against
// 12 per 32 for 64 x 32 (shared-memory bandwidth bounds these kernels), at 255 registers.
// Entry points dense_gemm_t{i}_{t} (out in T), _{t}_f32 (f32 out: the lm_head) and
// dense_gemm_t{i}_swiglu_{t}, all (x, w, out, m, n, k, sb).
#define DENSE_GEMM_TILE(SUF, T, I, BN, BM, WN, WM, ST, MINB)                                       \
    extern "C" __global__ void __launch_bounds__((BN / WN) * (BM / WM) * 32, MINB)                 \
        dense_gemm_t##I##_##SUF(const T* x, const T* w, T* out, int m, int n, int k, int sb) {     \
        dense_gemm<T, T, false, BN, BM, WN, WM, ST>(x, w, out, m, n, k, sb);                       \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__((BN / WN) * (BM / WM) * 32, MINB)                 \
        dense_gemm_t##I##_##SUF##_f32(const T* x, const T* w, float* out, int m, int n, int k,     \
                                      int sb) {                                                    \
        dense_gemm<T, float, false, BN, BM, WN, WM, ST>(x, w, out, m, n, k, sb);                   \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__((BN / WN) * (BM / WM) * 32, MINB)                 \
        dense_gemm_t##I##_swiglu_##SUF(const T* x, const T* w, T* out, int m, int n, int k,        \
                                       int sb) {                                                   \
        dense_gemm<T, T, true, BN, BM, WN, WM, ST>(x, w, out, m, n, k, sb);                        \
    }
#define DENSE_GEMM(SUF, T)                                                                         \
    DENSE_GEMM_TILE(SUF, T, 0, 128, 128, 64, 32, 4, 1)                                             \
    DENSE_GEMM_TILE(SUF, T, 1, 64, 64, 32, 32, 4, 3)                                               \
    DENSE_GEMM_TILE(SUF, T, 2, 128, 64, 64, 32, 4, 2)                                              \
    DENSE_GEMM_TILE(SUF, T, 3, 64, 32, 32, 16, 4, 4)                                               \
    DENSE_GEMM_TILE(SUF, T, 4, 128, 192, 64, 48, 4, 1)                                             \
    DENSE_GEMM_TILE(SUF, T, 5, 128, 96, 64, 48, 3, 2)
DENSE_GEMM(f16, __half)
DENSE_GEMM(bf16, bf16_t)
