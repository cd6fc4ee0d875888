// w4a16_sm70.cu: the sm_70 / sm_75 (V100, T4) tensor-core matmuls on 4-bit weights kept packed
// (issue 10 item 4): out[r, n] = sum_k x[r, k] * W[n, k], fp16 compute (sm_70 has no bf16),
// f32 accumulation, through mma.sync.aligned.m8n8k4 (HMMA.884). No cp.async, no ldmatrix.
//
// The weights are the w4 tiles of src/tensor/packed_tiles.rs (the same upload as the sm_80+
// kernels of w4a16.cu; see that file's header): qw uint4 [Np/8][KB][32], tile lane l = 4g + t
// holding output 8nt + g at the 32 columns 32t .. 32t + 32 of a 128-column block, word q the
// columns 32t + 8q + o at bit 16(o & 1) + 4(o >> 1); scales f16 / zeros u8 [Np/8][GS][8] (zero
// point nullptr: 8), perm i32 [Kp] (act-order) or nullptr. W[n, j] = (u - z) * s (int4) or
// e2m1(u) * s (NVFP4, `fp4`), rounded once to f16.
//
// FRAGMENTS. An m8n8k4 is four independent 8x8x4 products, one per quad pair (QP: lanes
// 4i..4i+3 and 4i+16..4i+19). Lane L has position p = (L & 3) + 4 (L >> 4) in its QP (its A row
// and its B column) and QP index seg = (L >> 2) & 3. We compute out^T: A = W (row p = output
// 8nt + p of an n8 tile), B = x^T (column p = row p of an 8-row group). Lane L reads the tile word
// of tile lane 4p + seg, so QP seg holds all 8 outputs of the tile for the K segment
// 32 seg .. 32 seg + 32 of every block: no repack, no shuffle, one 128-bit load per lane and
// tile per block, decoded in registers straight into A fragments: word q gives the A fragments of
// k-steps 2q (columns 8q .. 8q+3 of the segment) and 2q + 1 (8q+4 .. 8q+7) with one mask, OR,
// subtract and multiply per half2 (the 1024-magic decode of w4a16.cu). The lane's x words of the
// same columns (four 128-bit loads per row group and block) are its B fragments as loaded:
// k-step 2q = (.x, .y), 2q + 1 = (.z, .w). D: lane L holds (output (L & 1) + (i & 2) + 4 (L >> 4),
// row (i & 4) + (L & 2) + (i & 1)) in element i of 8.
//
// ONE NUMERIC PATH (K ORDER). For every output element: K is cut into `ks` slices (chosen from K
// alone by the host, W4Tiles::k_slices); in slice s each segment seg accumulates, from zero, the
// mma of its k-steps 0..7 of each block in ascending block order (P_{s,seg}); the slice's sum is
// (P_{s,0} + P_{s,1}) + (P_{s,2} + P_{s,3}) (xor-4 then xor-8 shuffles; f32 addition commutes, so
// every lane of the four gets the same bits); the result is ((0 + P_0) + P_1) + ... in f32, then
// one rounding to the output type. `w4s70_gemv` (rows in groups of 16 per block, one warp per
// slice, slice sums through shared memory) and `w4s70_gemm` (64 x 64 block tiles, x staged in
// shared memory, the slices one after another) perform exactly these operations per element, so
// the two agree bit for bit and a row's result does not depend on the rows beside it (an mma's
// D[i][j] reads only A row i, B column j and C[i][j]). These bits need not equal sm_80+'s.
// Nothing allocates; fixed pointers per launch (graph-capturable).

#define S70_KB 128      // columns per tile block
#define S70_MAX_KS 8    // K slices at most
#define S70_NT 2        // n8 tiles per warp (GEMV and GEMM)
#define S70_GEMV_RG 2   // 8-row groups per GEMV block (16 rows)
#define S70_GEMM_RG 4   // 8-row groups per GEMM warp (32 rows); 2 x 4 warps: 64 rows x 64 outputs
#define S70_GEMM_ROWS 64

// D += A * B for the four 8x8x4 products of a warp (fragments as the PTX ISA lays them out).
__device__ __forceinline__ void s70_mma(float* d, unsigned a0, unsigned a1, unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m8n8k4.row.col.f32.f16.f16.f32 {%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%11}, {%0,%1,%2,%3,%4,%5,%6,%7};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7])
        : "r"(a0), "r"(a1), "r"(b0), "r"(b1));
}

// (a & b) | c in one LOP3.
__device__ __forceinline__ unsigned s70_and_or(unsigned a, unsigned b, unsigned c) {
    unsigned r;
    asm("lop3.b32 %0, %1, %2, %3, 0xea;\n" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}

__device__ __forceinline__ unsigned s70_hmul2(unsigned a, unsigned b) {
    const __half2 r = __hmul2(*reinterpret_cast<const __half2*>(&a), *reinterpret_cast<const __half2*>(&b));
    return *reinterpret_cast<const unsigned*>(&r);
}

// Int4: nibbles OR-ed into the mantissa of 1024 are the exact f16 1024 + u; minus 1024 + z is the
// exact u - z; times the scale rounds once (bit for bit the f32 (u - z) * s rounded to f16).
__device__ __forceinline__ unsigned s70_int4_pair(unsigned w, unsigned zb, unsigned s2) {
    const unsigned q = s70_and_or(w, 0x000f000fu, 0x64006400u);
    const __half2 d = __hsub2(*reinterpret_cast<const __half2*>(&q), *reinterpret_cast<const __half2*>(&zb));
    return s70_hmul2(*reinterpret_cast<const unsigned*>(&d), s2);
}

// NVFP4: e2m1 codes at bits 0..3 and 16..19 of `w` as an exact f16 pair (two byte lookups: the
// high bytes of 0, .5, 1, 1.5, 2, 3, 4, 6; the low bytes are 0), the sign OR-ed in; times s.
__device__ __forceinline__ unsigned s70_fp4_pair(unsigned w, unsigned s2) {
    const unsigned em = w & 0x00070007u;
    const unsigned sel = __byte_perm(em * 0x11u, 0u, 0x4420);
    const unsigned hi = __byte_perm(0x3E3C3800u, 0x46444240u, sel);
    return s70_hmul2((hi & 0xff00ff00u) | ((w & 0x00080008u) << 12), s2);
}

// The A fragments of word w: k-step 2q = (a[0], a[1]), k-step 2q + 1 = (a[2], a[3]).
template <bool FP4>
__device__ __forceinline__ void s70_decode(unsigned w, unsigned sz, unsigned* a) {
    const unsigned s2 = __byte_perm(sz, 0u, 0x1010);
    const unsigned zb = (0x6400u + (sz >> 16)) * 0x10001u;
#pragma unroll
    for (int h = 0; h < 4; ++h) a[h] = FP4 ? s70_fp4_pair(w >> (4 * h), s2) : s70_int4_pair(w >> (4 * h), zb, s2);
}

// The (scale, zero) word (scale's 16 bits | zero << 16) of output 8 nt + p in stored group gi.
__device__ __forceinline__ unsigned s70_sz(const unsigned short* __restrict__ scales,
                                           const unsigned char* __restrict__ zeros, int nt, int gi,
                                           int gstore, int p) {
    const size_t i = ((size_t)nt * gstore + gi) * 8 + p;
    return (unsigned)__ldg(scales + i) | ((zeros ? (unsigned)__ldg(zeros + i) : 8u) << 16);
}

// x[row, col .. col + 8) as one 128-bit word (f16 pairs in column order); 0 past row m or column
// k. `col` is a tile column; with `perm` the input column is perm[col]. fast: k % 8 == 0 and no
// perm (one aligned load, whole word in or out).
__device__ __forceinline__ uint4 s70_x8(const unsigned short* __restrict__ x, int row, int m,
                                        int col, int k, const int* __restrict__ perm, bool fast) {
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (row >= m || col >= k) return v;
    const unsigned short* xr = x + (size_t)row * k;
    if (fast) return __ldg(reinterpret_cast<const uint4*>(xr + col));
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

__device__ __forceinline__ unsigned s70_word(const uint4& w, int q) {
    return q == 0 ? w.x : q == 1 ? w.y : q == 2 ? w.z : w.w;
}

// Output row (within an n8 tile) and batch row (within an 8-row group) of D element i of lane L.
__device__ __forceinline__ int s70_drow(int lane, int i) { return (lane & 1) + (i & 2) + 4 * (lane >> 4); }
__device__ __forceinline__ int s70_dcol(int lane, int i) { return (i & 4) + (lane & 2) + (i & 1); }

// One block of k for NT tiles x RG row groups (only the first nrg, uniform per warp): the lane's
// words w[j], (scale, zero) words lo (words 0, 1) / hi (words 2, 3), its x words xq(r, q).
template <bool FP4, int RG, typename XQ>
__device__ __forceinline__ void s70_block(float (*acc)[RG][8], const uint4* w, const unsigned* lo,
                                          const unsigned* hi, int nrg, XQ xq) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        unsigned a[S70_NT][4];
#pragma unroll
        for (int j = 0; j < S70_NT; ++j) s70_decode<FP4>(s70_word(w[j], q), q < 2 ? lo[j] : hi[j], a[j]);
#pragma unroll
        for (int r = 0; r < RG; ++r) {
            if (r == 0 || r < nrg) {
                const uint4 xw = xq(r, q);
#pragma unroll
                for (int j = 0; j < S70_NT; ++j) {
                    s70_mma(acc[j][r], a[j][0], a[j][1], xw.x, xw.y);
                    s70_mma(acc[j][r], a[j][2], a[j][3], xw.z, xw.w);
                }
            }
        }
    }
}

// The four segments' sum of a D element: (P0 + P1) + (P2 + P3), the same bits on all four lanes.
__device__ __forceinline__ float s70_seg_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 4);
    v += __shfl_xor_sync(0xffffffffu, v, 8);
    return v;
}

__device__ __forceinline__ void s70_store(void* out, int out_f32, int row, int n, int col, float v) {
    const size_t i = (size_t)row * n + col;
    if (out_f32) static_cast<float*>(out)[i] = v;
    else static_cast<__half*>(out)[i] = __float2half_rn(v);
}

#define S70_ARGS                                                                                \
    const __half *x, int m, int k, const uint4 *qw, const __half *scales,                      \
        const unsigned char *zeros, const int *perm, int kblocks, int ks, int gshift,          \
        int gstore, int n, void *out, int out_f32, int fp4
#define S70_PASS x, m, k, qw, scales, zeros, perm, kblocks, ks, gshift, gstore, n, out, out_f32

// GEMV: grid (Np / 16, ceil(m / 16)), block 32 ks threads; warp s = K slice s of the block's two
// n8 tiles (2 blockIdx.x, + 1) and 16 rows (r0 = 16 blockIdx.y). Weights and (scale, zero) words
// two blocks ahead in a register ring; x through the L1. `part` [ks][256] f32: slice sums.
template <bool FP4>
__device__ __forceinline__ void s70_gemv_impl(const __half* x, int m, int k, const uint4* __restrict__ qw,
                                              const __half* scales, const unsigned char* zeros,
                                              const int* perm, int kblocks, int ks, int gshift,
                                              int gstore, int n, void* out, int out_f32, float* part) {
    constexpr int RG = S70_GEMV_RG, NT = S70_NT;
    const int lane = threadIdx.x & 31, s = threadIdx.x >> 5;
    const int p = (lane & 3) | ((lane >> 4) << 2), seg = (lane >> 2) & 3;
    const int nt0 = blockIdx.x * NT, r0 = blockIdx.y * 8 * RG;
    const int nrg = min(RG, (m - r0 + 7) >> 3);
    const unsigned short* xs = reinterpret_cast<const unsigned short*>(x);
    const unsigned short* sc = reinterpret_cast<const unsigned short*>(scales);
    const bool fast = perm == nullptr && (k & 7) == 0;
    const int per = kblocks / ks, kb0 = s * per, kend = kb0 + per;
    const uint4* wp = qw + (size_t)nt0 * kblocks * 32 + 4 * p + seg;
    float acc[NT][RG][8];
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int r = 0; r < RG; ++r)
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[j][r][i] = 0.0f;
    uint4 wr[2][NT];
    unsigned lo[2][NT], hi[2][NT];
    auto fill = [&](int d, int kb) {
        const int glo = (kb * 8 + 2 * seg) >> gshift, ghi = (kb * 8 + 2 * seg + 1) >> gshift;
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            wr[d][j] = __ldg(wp + (size_t)j * kblocks * 32 + kb * 32);
            lo[d][j] = s70_sz(sc, zeros, nt0 + j, glo, gstore, p);
            hi[d][j] = ghi == glo ? lo[d][j] : s70_sz(sc, zeros, nt0 + j, ghi, gstore, p);
        }
    };
    if (kb0 < kend) fill(0, kb0);
    if (kb0 + 1 < kend) fill(1, kb0 + 1);
    for (int kb = kb0; kb < kend; kb += 2) {
#pragma unroll
        for (int d = 0; d < 2; ++d) {
            const int kc = kb + d;
            if (kc < kend) {
                auto xq = [&](int r, int q) -> uint4 {
                    return s70_x8(xs, r0 + 8 * r + p, m, kc * S70_KB + 32 * seg + 8 * q, k, perm, fast);
                };
                s70_block<FP4, RG>(acc, wr[d], lo[d], hi[d], nrg, xq);
                if (kc + 2 < kend) fill(d, kc + 2);
            }
        }
    }
    // Segment sums; lane (p, seg) writes elements 2 seg, 2 seg + 1 of each (tile, group).
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int r = 0; r < RG; ++r)
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                const float v = s70_seg_sum(acc[j][r][i]);
                if ((i >> 1) == seg) part[s * 256 + ((j * RG + r) * 8 + i) * 8 + p] = v;
            }
    __syncthreads();
    for (int e = threadIdx.x; e < NT * RG * 64; e += blockDim.x) {
        const int pe = e & 7, i = (e >> 3) & 7, r = (e >> 6) % RG, j = (e >> 6) / RG;
        const int le = (pe & 3) | ((pe >> 2) << 4);  // a lane of position pe
        const int row = r0 + 8 * r + s70_dcol(le, i);
        const int col = (nt0 + j) * 8 + s70_drow(le, i);
        float total = 0.0f;
        for (int q = 0; q < ks; ++q) total += part[q * 256 + e];
        if (row < m && col < n) s70_store(out, out_f32, row, n, col, total);
    }
}

// GEMM: grid (Np / 64, ceil(m / 64)), block 256 = 2 (rows) x 4 (outputs) warps of 32 rows x 16
// outputs. Each 128-column block of the CTA's 64 x rows (16 KB) is staged in shared memory
// (two buffers, loaded into registers one block ahead: no cp.async on sm_70), 16-byte unit u of
// row r at u ^ (r & 3) (the lanes of a quarter warp read 8 distinct bank groups); the weights and
// (scale, zero) words straight from global memory one block ahead. The slices accumulate from
// zero into acc; at each slice's end the segment sum is added into `total`: the GEMV's arithmetic.
template <bool FP4>
__device__ __forceinline__ void s70_gemm_impl(const __half* x, int m, int k, const uint4* __restrict__ qw,
                                              const __half* scales, const unsigned char* zeros,
                                              const int* perm, int kblocks, int ks, int gshift,
                                              int gstore, int n, void* out, int out_f32,
                                              uint4 (*xt)[S70_GEMM_ROWS * 16]) {
    constexpr int RG = S70_GEMM_RG, NT = S70_NT;
    static_assert(NT == 2, "the block copies below name two tiles");
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int p = (lane & 3) | ((lane >> 4) << 2), seg = (lane >> 2) & 3;
    const int wn = warp & 3, wm = warp >> 2;
    const int nt0 = blockIdx.x * 8 + 2 * wn;  // Np is a multiple of 64: every warp has its tiles
    const int rb = blockIdx.y * S70_GEMM_ROWS;
    const unsigned short* xs = reinterpret_cast<const unsigned short*>(x);
    const unsigned short* sc = reinterpret_cast<const unsigned short*>(scales);
    const bool fast = perm == nullptr && (k & 7) == 0;
    const int per = kblocks / ks;
    const uint4* wp = qw + (size_t)nt0 * kblocks * 32 + 4 * p + seg;
    float acc[NT][RG][8], total[NT][RG][8];
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int r = 0; r < RG; ++r)
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                acc[j][r][i] = 0.0f;
                total[j][r][i] = 0.0f;
            }
    uint4 stage[4];
    auto gload = [&](int kb) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int id = tid + 256 * i, row = id >> 4, u = id & 15;
            stage[i] = s70_x8(xs, rb + row, m, kb * S70_KB + 8 * u, k, perm, fast);
        }
    };
    auto sstore = [&](int buf) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int id = tid + 256 * i, row = id >> 4, u = id & 15;
            xt[buf][row * 16 + (u ^ (row & 3))] = stage[i];
        }
    };
    uint4 w[NT];
    unsigned lo[NT], hi[NT];
    auto wload = [&](int kb) {
        const int glo = (kb * 8 + 2 * seg) >> gshift, ghi = (kb * 8 + 2 * seg + 1) >> gshift;
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            w[j] = __ldg(wp + (size_t)j * kblocks * 32 + kb * 32);
            lo[j] = s70_sz(sc, zeros, nt0 + j, glo, gstore, p);
            hi[j] = ghi == glo ? lo[j] : s70_sz(sc, zeros, nt0 + j, ghi, gstore, p);
        }
    };
    gload(0);
    sstore(0);
    wload(0);
    __syncthreads();
    for (int kb = 0; kb < kblocks; ++kb) {
        const int buf = kb & 1;
        const uint4 wc[NT] = {w[0], w[1]};
        const unsigned lc[NT] = {lo[0], lo[1]}, hc[NT] = {hi[0], hi[1]};
        if (kb + 1 < kblocks) {
            gload(kb + 1);
            wload(kb + 1);
        }
        const uint4* xb = xt[buf];
        auto xq = [&](int r, int q) -> uint4 {
            const int row = wm * 32 + 8 * r + p;
            return xb[row * 16 + ((4 * seg + q) ^ (row & 3))];
        };
        s70_block<FP4, RG>(acc, wc, lc, hc, RG, xq);
        if ((kb + 1) % per == 0) {
#pragma unroll
            for (int j = 0; j < NT; ++j)
#pragma unroll
                for (int r = 0; r < RG; ++r)
#pragma unroll
                    for (int i = 0; i < 8; ++i) {
                        total[j][r][i] += s70_seg_sum(acc[j][r][i]);
                        acc[j][r][i] = 0.0f;
                    }
        }
        if (kb + 1 < kblocks) sstore(buf ^ 1);
        __syncthreads();
    }
    // All four segments hold the same totals: lane (p, seg) stores elements 2 seg, 2 seg + 1.
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int r = 0; r < RG; ++r)
#pragma unroll
            for (int i = 0; i < 8; ++i) {
                if ((i >> 1) != seg) continue;
                const int row = rb + wm * 32 + 8 * r + s70_dcol(lane, i);
                const int col = (nt0 + j) * 8 + s70_drow(lane, i);
                if (row < m && col < n) s70_store(out, out_f32, row, n, col, total[j][r][i]);
            }
}

extern "C" __global__ void __launch_bounds__(256) w4s70_gemv_f16(S70_ARGS) {
    __shared__ float part[S70_MAX_KS * 256];
    if (fp4) s70_gemv_impl<true>(S70_PASS, part);
    else s70_gemv_impl<false>(S70_PASS, part);
}

extern "C" __global__ void __launch_bounds__(256, 1) w4s70_gemm_f16(S70_ARGS) {
    __shared__ uint4 xt[2][S70_GEMM_ROWS * 16];  // 32 KB: x of two k blocks
    if (fp4) s70_gemm_impl<true>(S70_PASS, xt);
    else s70_gemm_impl<false>(S70_PASS, xt);
}
