// w4a16_wgmma.cu: the sm_90a warpgroup-MMA GEMMs on packed 4-bit integer weights for large steps
// (issue 10 item 7), out[r, n] = sum_k x[r, k] * W[n, k]: `w4g_wgmma` (all threads stage x and
// run wgmma, a block barrier per k block) and `w4g_ws`, the same tile and arithmetic
// warp-specialised (a producer warpgroup and mbarriers), which the host picks on sm_90 above
// `WGMMA_MIN_ROWS` rows and on large 1024-row grids (src/backend/cuda/backend/w4a16_gemm.rs;
// `KILN_W4G_WS=0` picks `w4g_wgmma` instead). Their own module because it is compiled for the
// arch-specific target `sm_90a` on an sm_90 GPU (`KernelModule::nvrtc_arch`) while
// kernels/w4a16_gemm.cu keeps the plain arch.
//
// Layout, scope and numerics: those of kernels/w4a16_gemm.cu (read its header and w4a16.cu's
// first). Compiled after w4a16.cu's helpers (`KernelModule::full_source`): the decode (`W4Dec`,
// `w4_decode2`, `w4_word`) and `W4_KB` are w4a16.cu's own.

// `w4g_wgmma`: the sm_90a warpgroup-MMA GEMM for large steps (issue 10 item 7). Same arithmetic
// as every kernel above: tests/cuda_wgmma_probe.rs showed on the H200 that one wgmma m64nNk16
// gives the bits of the mma.sync m16n8k16 it replaces (same 16 products at the same k
// positions, same f32 accumulator in, one result out), so a chain of them over the chunks of a K
// slice in order is the slice partial P_s of the one numeric path, and the slices are summed
// ((0 + P_0) + P_1) + ... in f32 as before.
//
// The transposed problem out^T = W x^T: the decoded weights are the wgmma A operand from
// registers (m64 = 64 outputs per instruction; warp w of the warpgroup holds outputs 16 w ..
// 16 w + 15 in exactly the m16n8k16 A fragment `w4_decode2` builds), x the B operand (k16 x 128
// rows) from shared memory. CTA: 256 threads = 2 warpgroups; CTA tile 256 outputs x 128 rows;
// warpgroup h covers outputs 128 h .. 128 h + 127 as two m64 tiles (accumulators 2 x 64 f32 per
// thread: wgmma m64n128k16). Per k block each warpgroup decodes its 16 n8 tiles' words (the
// lane's own 128-bit word per tile, loaded from global one k block ahead) chunk pair by chunk
// pair into two register buffers, issuing the 4 wgmma of a pair (2 chunks x 2 m64 tiles) while it
// decodes the next pair.
//
// x in shared memory: the B operand's k index kappa of chunk c must hold the column the mma.sync
// path gives it (w4a16.cu header: kappa = 2t + e (e = 0, 1) is column 32t + 4c + e, kappa = 8 + 2t
// + e is column 32t + 4c + 2 + e). So each chunk is its own K-major 128 x 16 operand (the 16-byte
// piece (c, kk, row n) holds its k 8kk .. 8kk + 7; placed by `w4w_off`: the 128-byte swizzle
// atoms by default, see W4W_SWZ), and 32-bit word t of piece (c, kk, n) is x[n, 32t + 4c + 2kk ..
// + 1]. A thread stages row n's
// 16-byte units u0, u0 + 4, u0 + 8, u0 + 12 (one per t) from global into registers and stores
// their 4 x 4 words transposed as the 4 rows (c = 2u0 + i / 2, kk = i % 2), i = 0..3: plain
// 16-byte loads and stores. Three stages of one k block (32 KB each), written one k block ahead
// of use; the running slice totals in shared memory (each thread's own 128 words, 128 KB), added
// at each slice end after the warpgroup's wgmma have all completed.
//
// Built for sm_90a only (the host compiles this module for `sm_90a` on an sm_90 GPU and runs this
// kernel there); for every other target the entry exists and traps.

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define W4W_ON 1
#else
#define W4W_ON 0
#endif

#define W4W_ROWS 128                                    // x rows of a CTA (the wgmma N)
#define W4W_OUTS 256                                    // outputs of a CTA
#define W4W_STAGE_BYTES (W4W_ROWS * 256)                // one k block of x (8 chunks x 4 KB)
#define W4W_STAGES 3
#define W4W_TOT_BYTES (128 * 256 * 4)                   // f32 slice totals
#define W4W_SMEM_BYTES (1024 + W4W_STAGES * W4W_STAGE_BYTES + W4W_TOT_BYTES)  // 225 KB
// x layout in a stage: W4W_SWZ 1 (default): 128-byte swizzle, chunks 0..3 and 4..7 in two 16 KB
// atom columns (128 rows x 128 B; row n at (n / 8) * 1024 + (n % 8) * 128, its 16-byte piece p at
// p ^ (n % 8)), chunk c the 32 bytes at (c % 4) * 32 of each row: the descriptor of chunk c starts
// there (128B-swizzle mode, SBO 1024 between 8-row groups). W4W_SWZ 0: no swizzle, chunk c the
// 4 KB at c * 4096, core matrices of 8 rows x 16 B at (n / 8) * 256 + kk * 128 (LBO 128, SBO 256).
#ifndef W4W_SWZ
#define W4W_SWZ 1
#endif

// One wgmma m64n128k16, f32 accumulators d (64 per thread), A from registers a[4], B by
// descriptor; d += A * B.
template <typename T>
__device__ __forceinline__ void w4w_mma(float* d, const unsigned* a, unsigned long long db);
#define W4W_D8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), \
    "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define W4W_MMA_ASM(TY)                                                                          \
    asm volatile(                                                                                \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                             \
        "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " "                             \
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                \
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "       \
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "       \
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "      \
        "{%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"                                            \
        : W4W_D8(0), W4W_D8(8), W4W_D8(16), W4W_D8(24), W4W_D8(32), W4W_D8(40), W4W_D8(48),     \
          W4W_D8(56)                                                                             \
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1)                            \
        : "memory")
template <>
__device__ __forceinline__ void w4w_mma<bf16_t>(float* d, const unsigned* a, unsigned long long db) {
#if W4W_ON
    W4W_MMA_ASM("bf16");
#else
    __trap();
#endif
}
template <>
__device__ __forceinline__ void w4w_mma<__half>(float* d, const unsigned* a, unsigned long long db) {
#if W4W_ON
    W4W_MMA_ASM("f16");
#else
    __trap();
#endif
}

__device__ __forceinline__ void w4w_fence() {
#if W4W_ON
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void w4w_commit() {
#if W4W_ON
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void w4w_wait() {
#if W4W_ON
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// Generic-proxy shared-memory writes made visible to the async proxy (wgmma operand reads).
__device__ __forceinline__ void w4w_proxy_fence() {
#if W4W_ON
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
// Keep the compiler from moving accesses of accumulator r across the asynchronous wgmma.
__device__ __forceinline__ void w4w_reg(float& r) { asm volatile("" : "+f"(r)::"memory"); }

// Byte offset in a stage of the 16-byte piece (chunk c, k half kk, row n) and the descriptor of
// chunk c of the stage at shared address `stage` (W4W_SWZ above).
__device__ __forceinline__ int w4w_off(int c, int kk, int n) {
#if W4W_SWZ
    return (c >> 2) * 16384 + (n >> 3) * 1024 + (n & 7) * 128 + ((((c & 3) * 2 + kk) ^ (n & 7)) << 4);
#else
    return c * 4096 + (n >> 3) * 256 + kk * 128 + (n & 7) * 16;
#endif
}
__device__ __forceinline__ unsigned long long w4w_desc(unsigned stage, int c) {
#if W4W_SWZ
    const unsigned addr = stage + (c >> 2) * 16384 + (c & 3) * 32;
    return (unsigned long long)((addr & 0x3FFFF) >> 4) | (1ull << 16) |
           ((unsigned long long)(1024 >> 4) << 32) | (1ull << 62);
#else
    const unsigned addr = stage + c * 4096;
    return (unsigned long long)((addr & 0x3FFFF) >> 4) | ((unsigned long long)(128 >> 4) << 16) |
           ((unsigned long long)(256 >> 4) << 32);
#endif
}

// The 8 global 16-byte units of x a thread stages per k block: items id = tid + 256 h (h = 0, 1),
// row n = (id & 7) + 8 (id >> 5), u0 = (id >> 3) & 3; unit u0 + 4t for t = 0..3.
__device__ __forceinline__ void w4w_load_x(uint4* v, const unsigned short* xs, int m, int k,
                                           int r0, int kb) {
    const int tid = threadIdx.x;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int id = tid + 256 * h, n = (id & 7) + 8 * (id >> 5), u0 = (id >> 3) & 3;
        const int r = r0 + n;
#pragma unroll
        for (int t = 0; t < 4; ++t) {
            v[4 * h + t] = r < m ? __ldg(reinterpret_cast<const uint4*>(
                                       xs + (size_t)r * k + kb * W4_KB + 8 * (u0 + 4 * t)))
                                 : make_uint4(0u, 0u, 0u, 0u);
        }
    }
}
__device__ __forceinline__ void w4w_store_x(unsigned char* st, const uint4* v) {
    const int tid = threadIdx.x;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int id = tid + 256 * h, n = (id & 7) + 8 * (id >> 5), u0 = (id >> 3) & 3;
        const uint4* u = v + 4 * h;
        // Row (c = 2u0 + i / 2, kk = i % 2): word t = word i of unit t.
        *reinterpret_cast<uint4*>(st + w4w_off(2 * u0, 0, n)) = make_uint4(u[0].x, u[1].x, u[2].x, u[3].x);
        *reinterpret_cast<uint4*>(st + w4w_off(2 * u0, 1, n)) = make_uint4(u[0].y, u[1].y, u[2].y, u[3].y);
        *reinterpret_cast<uint4*>(st + w4w_off(2 * u0 + 1, 0, n)) = make_uint4(u[0].z, u[1].z, u[2].z, u[3].z);
        *reinterpret_cast<uint4*>(st + w4w_off(2 * u0 + 1, 1, n)) = make_uint4(u[0].w, u[1].w, u[2].w, u[3].w);
    }
}

// The lane's weight words and packed (scale | zero << 16) words of k block kb for its 4 n8 tiles
// (lane = 4 g + t; q = 0..3: tile ntw + 8 (q / 2) + q % 2, clamped to the last tile: an m64 tile past the
// outputs runs on those and is not stored); both kernels load them one k block ahead.
__device__ __forceinline__ void w4w_load_w(uint4* wq, unsigned* szc, const uint4* __restrict__ qw,
                                           const unsigned short* sp, const unsigned char* zeros,
                                           int ntw, int tiles, int kblocks, int sstride,
                                           int gshift, int g, int t, int lane, int kb) {
    const int gi = (kb * 8 + 2 * t) >> gshift;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        const int nt = min(ntw + 8 * (q >> 1) + (q & 1), tiles - 1);
        wq[q] = __ldg(qw + ((size_t)nt * kblocks + kb) * 32 + lane);
        const size_t i = (size_t)nt * sstride + g + (size_t)gi * 8;
        szc[q] = (unsigned)__ldg(sp + i) | ((zeros ? (unsigned)__ldg(zeros + i) : 8u) << 16);
    }
}

// Store the thread's slice totals: `tot(j, i)` is accumulator i of m64 tile j (D fragment: n8
// block i / 4 of x rows, e = i % 4); a tile past the outputs (act0 / act1 false) and elements
// past row m or column n are skipped. out is [m, n] row-major, f32 when `out_f32`, else T.
template <typename T, typename Tot>
__device__ __forceinline__ void w4w_store_out(void* out, int out_f32, int m, int n, int r0, int ntw,
                                              bool act0, bool act1, int g, int t, Tot tot) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        if (j == 0 ? !act0 : !act1) continue;
#pragma unroll
        for (int i = 0; i < 64; ++i) {
            const int e = i & 3;
            const int row = r0 + 8 * (i >> 2) + 2 * t + (e & 1);
            const int col = (ntw + 8 * j) * 8 + g + (e >= 2 ? 8 : 0);
            if (row < m && col < n) {
                const float v = tot(j, i);
                const size_t o = (size_t)row * n + col;
                if (out_f32) {
                    static_cast<float*>(out)[o] = v;
                } else {
                    Io<T>::store(static_cast<T*>(out), (long)o, v);
                }
            }
        }
    }
}

template <typename T>
__device__ __forceinline__ void w4g_wgmma(const T* x, int m, int k, const uint4* __restrict__ qw,
                                          const T* scales, const unsigned char* zeros,
                                          int kblocks, int ks, int gshift, int gstore, int n,
                                          void* out, int out_f32, int tiles) {
    extern __shared__ unsigned char w4w_raw[];
    const unsigned raw = (unsigned)__cvta_generic_to_shared(w4w_raw);
    unsigned char* smem = w4w_raw + (((raw + 1023u) & ~1023u) - raw);
    const unsigned sbase = (unsigned)__cvta_generic_to_shared(smem);
    float* tot = reinterpret_cast<float*>(smem + W4W_STAGES * W4W_STAGE_BYTES);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int wg = warp >> 2, w = warp & 3;  // warpgroup, warp in it
    const int r0 = blockIdx.y * W4W_ROWS;
    // n8 tiles of the thread: m64 tile j (0, 1), half e (0, 1): tile nt(j, e) = ntw + 8 j + e.
    const int ntw = blockIdx.x * (W4W_OUTS / 8) + wg * 16 + 2 * w;
    const bool act0 = ntw < tiles, act1 = ntw + 8 < tiles;  // tiles % 8 == 0: whole m64 tiles
    const unsigned short* xs = reinterpret_cast<const unsigned short*>(x);
    const int per = kblocks / ks;
    const int sstride = gstore * 8;
    const unsigned short* sp = reinterpret_cast<const unsigned short*>(scales);
    float acc[2][64];
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int i = 0; i < 64; ++i) acc[j][i] = 0.0f;
    for (int i = tid; i < 128 * 256; i += 256) tot[i] = 0.0f;
    // The lane's weight words (4 tiles) and packed (scale | zero << 16) for a k block.
    uint4 wq[4];
    unsigned szc[4];
    auto load_w = [&](int kb) {
        w4w_load_w(wq, szc, qw, sp, zeros, ntw, tiles, kblocks, sstride, gshift, g, t, lane, kb);
    };
    uint4 xv[8];
    w4w_load_x(xv, xs, m, k, r0, 0);
    w4w_store_x(smem, xv);
    if (kblocks > 1) w4w_load_x(xv, xs, m, k, r0, 1);
    w4w_proxy_fence();
    load_w(0);
    // Two A-fragment buffers [m64 tile j][chunk parity][4].
    unsigned fa[2][2][2][4];
    for (int kb = 0; kb < kblocks; ++kb) {
        __syncthreads();  // stage kb visible to all; stage (kb + 1) % 3 free (read by kb - 2)
        // x of k block kb + 1 (loaded one k block ago) into its stage, then k block kb + 2's
        // loads; visible to every warpgroup's wgmma after the next barrier.
        if (kb + 1 < kblocks) {
            w4w_store_x(smem + ((kb + 1) % W4W_STAGES) * W4W_STAGE_BYTES, xv);
            w4w_proxy_fence();
        }
        if (kb + 2 < kblocks) w4w_load_x(xv, xs, m, k, r0, kb + 2);
        const uint4 cw[4] = {wq[0], wq[1], wq[2], wq[3]};
        const unsigned csz[4] = {szc[0], szc[1], szc[2], szc[3]};
        if (kb + 1 < kblocks) load_w(kb + 1);
        const unsigned stage = sbase + (kb % W4W_STAGES) * W4W_STAGE_BYTES;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            // Decode word q of the 4 tiles into buffer q & 1: chunks 2q, 2q + 1.
            w4w_wait<1>();  // the group that read buffer q & 1 is done (none pending at the start)
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                unsigned d0[4], d1[4];
                const unsigned s0 = csz[2 * j], s1 = csz[2 * j + 1];
                const uint4& c0 = cw[2 * j];
                const uint4& c1 = cw[2 * j + 1];
                const unsigned w0 = w4_word(c0, q);
                const unsigned w1 = w4_word(c1, q);
                w4_decode2<T>(w0, __byte_perm(s0, 0u, 0x1010), W4Dec<T>::bias((int)(s0 >> 16)), d0);
                w4_decode2<T>(w1, __byte_perm(s1, 0u, 0x1010), W4Dec<T>::bias((int)(s1 >> 16)), d1);
                unsigned* f0 = fa[q & 1][j][0];
                unsigned* f1 = fa[q & 1][j][1];
                f0[0] = d0[0]; f0[1] = d1[0]; f0[2] = d0[1]; f0[3] = d1[1];
                f1[0] = d0[2]; f1[1] = d1[2]; f1[2] = d0[3]; f1[3] = d1[3];
            }
#pragma unroll
            for (int j = 0; j < 2; ++j)
#pragma unroll
                for (int i = 0; i < 64; ++i) w4w_reg(acc[j][i]);
            w4w_fence();
#pragma unroll
            for (int cc = 0; cc < 2; ++cc) {
                const unsigned long long db = w4w_desc(stage, 2 * q + cc);
                // Both m64 tiles always (no divergent wgmma: an m64 tile past the outputs runs
                // on clamped weights and is not stored).
                w4w_mma<T>(acc[0], fa[q & 1][0][cc], db);
                w4w_mma<T>(acc[1], fa[q & 1][1][cc], db);
            }
            w4w_commit();
        }
        if ((kb + 1) % per == 0) {
            // Slice end: every group done, total += P_s (f32, slices in order), P from zero.
            w4w_wait<0>();
#pragma unroll
            for (int j = 0; j < 2; ++j)
#pragma unroll
                for (int i = 0; i < 64; ++i) {
                    w4w_reg(acc[j][i]);
                    tot[(j * 64 + i) * 256 + tid] += acc[j][i];
                    acc[j][i] = 0.0f;
                }
        }
    }
    w4w_wait<0>();
    w4w_store_out<T>(out, out_f32, m, n, r0, ntw, act0, act1, g, t,
                     [&](int j, int i) { return tot[(j * 64 + i) * 256 + tid]; });
}

// `w4g_wgmma_{f16,bf16}`: grid (ceil(Np / 256), ceil(m / 128)), 256 threads, W4W_SMEM_BYTES of
// dynamic shared memory; `tiles` = Np / 8. sm_90a only (traps elsewhere).
#define W4W_ENTRY(SUF, T)                                                                        \
    extern "C" __global__ void __launch_bounds__(256, 1) w4g_wgmma_##SUF(                         \
        const T* x, int m, int k, const uint4* qw, const T* scales, const unsigned char* zeros,   \
        int kblocks, int ks, int gshift, int gstore, int n, void* out, int out_f32, int tiles) {  \
        w4g_wgmma<T>(x, m, k, qw, scales, zeros, kblocks, ks, gshift, gstore, n, out, out_f32,  \
                     tiles);                                                                     \
    }
W4W_ENTRY(f16, __half)
W4W_ENTRY(bf16, bf16_t)

// ---------------------------------------------------------------------------------------------
// `w4g_ws`: the warp-specialised wgmma GEMM (issue 10 item 7). The arithmetic, CTA tile (256
// outputs x 128 rows), accumulators, x layout in a stage (W4W_SWZ) and slice totals of `w4g_wgmma`
// above; what changes is the schedule:
// - 384 threads = 3 warpgroups. Warpgroup 0 is the producer (`setmaxnreg` down to W4S_PREG): it
//   stages x k block by k block into a ring of W4S_STAGES stages with 4-byte `cp.async`, each
//   32-bit word of x straight to its place in the permuted K-major operand (no registers, no
//   transpose pass), and each thread hands its copies to the stage's "full" mbarrier
//   (`cp.async.mbarrier.arrive.noinc`: the barrier completes when every copy has landed).
// - Warpgroups 1 and 2 are the consumers (`setmaxnreg` up to W4S_CREG), each the two m64 tiles of
//   `w4g_wgmma`'s warpgroup. A consumer waits on the stage's full barrier, decodes chunk by chunk
//   (one chunk = its two m64 tiles' A fragments, 8 registers) into a ring of W4S_RING buffers and
//   issues the chunk's 2 wgmma as one group, keeping W4S_RING - 1 groups in flight
//   (`wgmma.wait_group W4S_RING - 1` before reusing a buffer). The slice totals are 128-bit
//   accesses (each thread's own 32 float4). Once every group of k block kb - 1
//   has completed (chunk W4S_RING - 1 of kb), its 256 threads arrive on that stage's "empty"
//   mbarrier, which the producer waits on before refilling it. No block-wide barrier in the loop.
// - The weight words and (scale, zero) of a k block come from global into the consumer's
//   registers one k block ahead, as in `w4g_wgmma`.
// Producer copy mapping: warp pw copies rows pw + 4i (i = 0..31); per row two instructions (h =
// 0, 1: chunks 4h .. 4h + 3), lane (t = lane / 8, l7 = lane % 8) the 32-bit word j = 16t + 8h + l7
// of the row's k block (columns 2j, 2j + 1), which is word t of the piece (c = 4h + l7 / 2, kk =
// l7 % 2): 4 full 32-byte sectors from global, 32 distinct banks in shared memory.

#define W4S_STAGES 3
#define W4S_BAR_OFF (W4S_STAGES * W4W_STAGE_BYTES + W4W_TOT_BYTES)  // mbarriers after the totals
#define W4S_SMEM_BYTES (1024 + W4S_BAR_OFF + 16 * W4S_STAGES)       // 225 KB + 48 B
#ifndef W4S_RING
#define W4S_RING 2  // A-fragment buffers of a consumer (2 or 4; 4 measured 0-3% slower on the H200)
#endif
#ifndef W4S_GROUP_M
#define W4S_GROUP_M 0  // > 0: blocks launched in groups of this many row tiles (L2 reuse), 0: grid order
#endif
#ifndef W4S_PREG
#define W4S_PREG 40  // registers of a producer thread
#endif
#ifndef W4S_CREG
#define W4S_CREG 224  // registers of a consumer thread (2 x 128 x 224 + 128 x 40 <= 64 K; 232 spills)
#endif

__device__ __forceinline__ void w4s_bar_init(unsigned a, unsigned count) {
#if W4W_ON
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(a), "r"(count) : "memory");
#endif
}
__device__ __forceinline__ void w4s_arrive(unsigned a) {
#if W4W_ON
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(a)
                 : "memory");
#endif
}
// Block until the phase of parity `parity` of the mbarrier at `a` has completed.
__device__ __forceinline__ void w4s_wait(unsigned a, unsigned parity) {
#if W4W_ON
    asm volatile(
        "{\n.reg .pred p;\nW4S_WAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
        "@!p bra W4S_WAIT;\n}\n" ::"r"(a),
        "r"(parity)
        : "memory");
#endif
}
// 4 bytes global -> shared (zero fill when bytes == 0).
__device__ __forceinline__ void w4s_cp4(unsigned dst, const void* src, int bytes) {
#if W4W_ON
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(bytes)
                 : "memory");
#endif
}
// The mbarrier at `a` gets one arrival when all of this thread's earlier cp.async have landed.
__device__ __forceinline__ void w4s_cp_arrive(unsigned a) {
#if W4W_ON
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(a) : "memory");
#endif
}

// The (output tile, row tile) of this block: the grid's own (x, y), or with W4S_GROUP_M > 0 the
// launch order regrouped so that consecutive blocks walk the output tiles of W4S_GROUP_M row tiles
// together (the blocks resident at a time then share fewer weight columns and x rows in L2).
// Either way every tile is computed once, by the same arithmetic.
__device__ __forceinline__ void w4s_tile(int& bx, int& by) {
#if W4S_GROUP_M > 0
    const int gx = (int)gridDim.x, gy = (int)gridDim.y;
    const int lin = (int)blockIdx.y * gx + (int)blockIdx.x;
    const int span = W4S_GROUP_M * gx, first = (lin / span) * W4S_GROUP_M;
    const int rows = min(W4S_GROUP_M, gy - first), in = lin % span;
    by = first + in % rows;
    bx = in / rows;
#else
    bx = (int)blockIdx.x;
    by = (int)blockIdx.y;
#endif
}

// The two A-fragment halves of chunk 2q + hf from word q (`w4_decode2`'s b[2 hf], b[2 hf + 1]:
// the same operations on the same nibbles).
template <typename T>
__device__ __forceinline__ void w4s_decode1(unsigned w, unsigned s2, unsigned zb, int hf,
                                            unsigned* b) {
    const unsigned M = 0x000f000fu, X = W4Dec<T>::MAGIC;
    const unsigned v = w >> (8 * hf);
    b[0] = W4Dec<T>::apply(w4_and_or(v, M, X), zb, s2);
    b[1] = W4Dec<T>::apply(w4_and_or(v >> 4, M, X), zb, s2);
}

template <typename T>
__device__ __forceinline__ void w4g_ws(const T* x, int m, int k, const uint4* __restrict__ qw,
                                       const T* scales, const unsigned char* zeros, int kblocks,
                                       int ks, int gshift, int gstore, int n, void* out,
                                       int out_f32, int tiles) {
#if W4W_ON
    extern __shared__ unsigned char w4s_raw[];
    const unsigned raw = (unsigned)__cvta_generic_to_shared(w4s_raw);
    unsigned char* smem = w4s_raw + (((raw + 1023u) & ~1023u) - raw);
    const unsigned sbase = (unsigned)__cvta_generic_to_shared(smem);
    float* tot = reinterpret_cast<float*>(smem + W4S_STAGES * W4W_STAGE_BYTES);
    const unsigned full = sbase + W4S_BAR_OFF;    // full[s] at full + 8 s: 128 arrivals
    const unsigned empty = full + 8 * W4S_STAGES;  // empty[s]: 256 arrivals
    const int tid = threadIdx.x;
    if (tid == 0) {
        for (int s = 0; s < W4S_STAGES; ++s) {
            w4s_bar_init(full + 8 * s, 128);
            w4s_bar_init(empty + 8 * s, 256);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    int bx, by;
    w4s_tile(bx, by);
    const int r0 = by * W4W_ROWS;
    const unsigned short* xs = reinterpret_cast<const unsigned short*>(x);
    const int lane = tid & 31;
    if (tid < 128) {
        // Producer.
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(W4S_PREG));
        const int pw = tid >> 5, t = lane >> 3, l7 = lane & 7;
        // Row nr = pw + 4 i (i = 0 .. 31) is 8 (i / 2) + pw + 4 (i % 2): its pieces sit at the
        // offset of row pw (+ 4 for odd i) plus i / 2 8-row groups (`w4w_off`, either layout).
        const int c0 = l7 >> 1, kk = l7 & 1;
        const unsigned grp = (unsigned)(w4w_off(c0, kk, 8) - w4w_off(c0, kk, 0));
        const unsigned dl[2][2] = {
            {(unsigned)w4w_off(c0, kk, pw) + 4 * t, (unsigned)w4w_off(4 + c0, kk, pw) + 4 * t},
            {(unsigned)w4w_off(c0, kk, pw + 4) + 4 * t,
             (unsigned)w4w_off(4 + c0, kk, pw + 4) + 4 * t}};
        // Rows of the tile below m: i < nin.
        const int nin = min(32, max(0, (m - r0 - pw + 3) >> 2));
        const size_t rstep = (size_t)4 * k;
        const unsigned short* row0 = xs + (size_t)(r0 + pw) * k + 2 * (16 * t + l7);
        for (int kb = 0; kb < kblocks; ++kb) {
            const int s = kb % W4S_STAGES;
            // Stage s free: the consumers finished k block kb - W4S_STAGES.
            if (kb >= W4S_STAGES) w4s_wait(empty + 8 * s, (unsigned)(kb / W4S_STAGES - 1) & 1u);
            const unsigned st = sbase + s * W4W_STAGE_BYTES;
            const unsigned short* src = row0 + kb * W4_KB;
#pragma unroll 8
            for (int i = 0; i < 32; ++i) {
                const bool in = i < nin;
                // Word t of the pieces (c = 4h + l7 / 2, kk = l7 % 2, row nr), h = 0, 1; a row
                // past m is zero-filled (nothing read: the address is within x's first row).
                const unsigned short* sp0 = in ? src : xs;
                const unsigned d = st + (i >> 1) * grp;
                w4s_cp4(d + dl[i & 1][0], sp0, in ? 4 : 0);
                w4s_cp4(d + dl[i & 1][1], sp0 + 16, in ? 4 : 0);
                src += rstep;
            }
            w4s_cp_arrive(full + 8 * s);
        }
        asm volatile("cp.async.wait_all;\n" ::: "memory");
        return;
    }
    // Consumers.
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(W4S_CREG));
    const int ct = tid - 128;  // 0 .. 255
    const int g = lane >> 2, t = lane & 3;
    const int cw = ct >> 7, w = (ct >> 5) & 3;  // consumer warpgroup, warp in it
    // n8 tiles of the thread: m64 tile j (0, 1), half e (0, 1): tile ntw + 8 j + e.
    const int ntw = bx * (W4W_OUTS / 8) + cw * 16 + 2 * w;
    const bool act0 = ntw < tiles, act1 = ntw + 8 < tiles;  // tiles % 8 == 0: whole m64 tiles
    const int per = kblocks / ks;
    const int sstride = gstore * 8;
    const unsigned short* sp = reinterpret_cast<const unsigned short*>(scales);
    float acc[2][64];
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int i = 0; i < 64; ++i) acc[j][i] = 0.0f;
    // Slice totals: element e = 64 j + i of the thread in float4 (e / 4) * 256 + ct, lane e % 4
    // (128-bit accesses, a warp's 512 contiguous bytes).
    float4* tot4 = reinterpret_cast<float4*>(tot);
#pragma unroll 8
    for (int v = 0; v < 32; ++v) tot4[v * 256 + ct] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    uint4 wq[4];
    unsigned szc[4];
    auto load_w = [&](int kb) {
        w4w_load_w(wq, szc, qw, sp, zeros, ntw, tiles, kblocks, sstride, gshift, g, t, lane, kb);
    };
    load_w(0);
    unsigned fa[W4S_RING][2][4];
    for (int kb = 0; kb < kblocks; ++kb) {
        const int s = kb % W4S_STAGES;
        w4s_wait(full + 8 * s, (unsigned)(kb / W4S_STAGES) & 1u);
        // The copies landed (generic proxy); order them before this thread's wgmma operand reads.
        w4w_proxy_fence();
        const uint4 cq[4] = {wq[0], wq[1], wq[2], wq[3]};
        const unsigned csz[4] = {szc[0], szc[1], szc[2], szc[3]};
        if (kb + 1 < kblocks) load_w(kb + 1);
        const unsigned stage = sbase + s * W4W_STAGE_BYTES;
#pragma unroll
        for (int c = 0; c < 8; ++c) {
            // Buffer c % W4S_RING is free once at most W4S_RING - 1 groups are pending.
            w4w_wait<W4S_RING - 1>();
            // At chunk W4S_RING - 1 every group of k block kb - 1 has completed: free its stage.
            if (c == W4S_RING - 1 && kb > 0) w4s_arrive(empty + 8 * ((kb - 1) % W4S_STAGES));
            const int q = c >> 1, hf = c & 1;
            unsigned* f = fa[c % W4S_RING][0];
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                unsigned d0[2], d1[2];
                const unsigned s0 = csz[2 * j], s1 = csz[2 * j + 1];
                const uint4& c0 = cq[2 * j];
                const uint4& c1 = cq[2 * j + 1];
                const unsigned w0 = w4_word(c0, q);
                const unsigned w1 = w4_word(c1, q);
                w4s_decode1<T>(w0, __byte_perm(s0, 0u, 0x1010), W4Dec<T>::bias((int)(s0 >> 16)), hf, d0);
                w4s_decode1<T>(w1, __byte_perm(s1, 0u, 0x1010), W4Dec<T>::bias((int)(s1 >> 16)), hf, d1);
                f[4 * j + 0] = d0[0];
                f[4 * j + 1] = d1[0];
                f[4 * j + 2] = d0[1];
                f[4 * j + 3] = d1[1];
            }
#pragma unroll
            for (int j = 0; j < 2; ++j)
#pragma unroll
                for (int i = 0; i < 64; ++i) w4w_reg(acc[j][i]);
            w4w_fence();
            const unsigned long long db = w4w_desc(stage, c);
            w4w_mma<T>(acc[0], fa[c % W4S_RING][0], db);
            w4w_mma<T>(acc[1], fa[c % W4S_RING][1], db);
            w4w_commit();
        }
        if ((kb + 1) % per == 0) {
            // Slice end: every group done, total += P_s (f32, slices in order), P from zero.
            w4w_wait<0>();
#pragma unroll
            for (int j = 0; j < 2; ++j)
#pragma unroll
                for (int i4 = 0; i4 < 16; ++i4) {
                    float* a = &acc[j][4 * i4];
                    w4w_reg(a[0]);
                    w4w_reg(a[1]);
                    w4w_reg(a[2]);
                    w4w_reg(a[3]);
                    float4 v = tot4[(j * 16 + i4) * 256 + ct];
                    v.x += a[0];
                    v.y += a[1];
                    v.z += a[2];
                    v.w += a[3];
                    tot4[(j * 16 + i4) * 256 + ct] = v;
                    a[0] = a[1] = a[2] = a[3] = 0.0f;
                }
        }
    }
    w4w_wait<0>();
    w4w_store_out<T>(out, out_f32, m, n, r0, ntw, act0, act1, g, t, [&](int j, int i) {
        const float4 v4 = tot4[(j * 16 + (i >> 2)) * 256 + ct];
        const int e = i & 3;
        return e == 0 ? v4.x : e == 1 ? v4.y : e == 2 ? v4.z : v4.w;
    });
#else
    __trap();
#endif
}

// `w4g_ws_{f16,bf16}`: grid (ceil(Np / 256), ceil(m / 128)), 384 threads, W4S_SMEM_BYTES of
// dynamic shared memory; `tiles` = Np / 8. sm_90a only (traps elsewhere).
#define W4S_ENTRY(SUF, T)                                                                        \
    extern "C" __global__ void __launch_bounds__(384, 1) w4g_ws_##SUF(                            \
        const T* x, int m, int k, const uint4* qw, const T* scales, const unsigned char* zeros,   \
        int kblocks, int ks, int gshift, int gstore, int n, void* out, int out_f32, int tiles) {  \
        w4g_ws<T>(x, m, k, qw, scales, zeros, kblocks, ks, gshift, gstore, n, out, out_f32,     \
                  tiles);                                                                        \
    }
W4S_ENTRY(f16, __half)
W4S_ENTRY(bf16, bf16_t)
