// attention_decode_mma.cu: decode attention over the paged KV cache on tensor cores (sm_80+,
// 16-bit compute), for long contexts (issue 8 item 7). Entry points:
// attention_decode_mma_{f16,bf16}_{same,e5m2,e4m3}_d{64,128,256}[_p2]. Same arguments, same rows, same
// split of the keys into parts and the same partials (merged by attention_decode_combine_* of
// attention_decode.cu) as attention_decode.cu's kernel, which stays for sm_70 / sm_75, f32
// compute, head_dim other than 64 / 128 / 256 and GQA groups over 8.
//
// Shapes: q, out [n_q, n_heads, DV] (compute type T); caches [num_blocks, block_size, n_kv_heads,
// DV] (storage C); head_dim == DV exactly; group = n_heads / n_kv_heads ≤ 8. gate as in
// attention_decode.cu (may be null; out = attn · sigmoid(gate), sigmoid in f32).
//
// Split (dmma_part_len; the host's copy is attention_plan.rs `DecodeSplit::part_len`): a row of
// ctx ≤ single_keys keys is one part; otherwise part_len = max(min_part, round_up(ceil(ctx /
// max_parts), DMMA_PART_ALIGN)), n_active = ceil(ctx / part_len) ≤ max_parts ≤ DMMA_MAX_SLOTS.
// single_keys, min_part and max_parts are host constants (the same for every launch of a
// backend), so a row's split is a function of its context alone. (single_keys 0, min_part =
// max_parts = 128 is attention_decode.cu's rule before its single-pass bound, `DEC_*`.)
// Grid (n_kv_heads, n_rows, Z), block (h, y, z) takes parts z, z + Z, .. of row y for KV head h
// and the whole GQA group. A part's keys are cut into chunks of 16; warp w of
// the block's NW warps takes chunks w, w + NW, ... (a function of the part alone), with its own
// cp.async ring of NST chunk stages in dynamic shared memory (no block barrier inside a part).
//
// Per chunk, per warp (lane = 4 r + c):
//   S^T [16 keys × 8 heads] = K [16 × DV] · Q^T [DV × 8] by mma.sync m16n8k16 (row.col, f32
//     accumulate): K is the A operand (keys as m), the group's q the B operand (heads as n, padded
//     with zero heads to 8), held in registers for the whole block (2 · DV / 16 words). Within each
//     32-dim block, lane (r, c) reads dims 8c..8c+7 of keys r and r + 8 in one load; the mma's k
//     index 2c, 2c+1 / 2c+8, 2c+9 of step s is then dims 8c + 4s + {0,1} / {2,3}: the same
//     permutation in q's fragment, so the dot products are exact sums over all dims.
//   online softmax in f32 (base 2, q pre-scaled by scale · log2 e): lane holds keys r, r + 8 of
//     heads 2c, 2c + 1; chunk max by 3 shuffles; running max and correction per head; the running
//     sum l is a per-lane partial (reduced across lanes at the end of the part).
//   O^T [DV × 8] += V^T [DV × 16 keys] · P^T [16 × 8]: P^T's B fragment is the S^T accumulator
//     rounded to 16 bits and transposed by movmatrix; V^T is the A operand: ldmatrix.trans for
//     16-bit storage (m-tile j = dims 16j + r / + r + 8); for fp8, four 32-bit loads (keys 2c, 2c+1,
//     2c+8, 2c+9, dims 4r..4r+3 of a 32-dim block) regrouped by byte_perm, so m-tile (b, t) holds
//     dims 32b + 4r + 2t (rows r) and + 1 (rows r + 8).
//   The accumulators of heads 2c, 2c+1 are rescaled by this lane's own corrections (lazily: only
//     when a max grew).
// Pairs (the `_p2` entry points, 2 · NW warps per block; the host takes them for launches of few
// rows, `KILN_DMMA_PAIR_ROWS`): each warp above is a pair of physical warps; half hf = 0 / 1
// copies rows 8 hf .. 8 hf + 7 of each chunk (whole rows; a 64-thread named barrier after the
// wait makes both halves' copies visible to both) and reads and multiplies only the 32-dim
// blocks b ≡ hf mod 2 of K and V: half 0 runs the even S chain, half 1 the odd one, they swap the
// two through shared memory (a second pair barrier) and add them as above; both then run the
// same softmax (same m, l, P) and each accumulates O of its own dims. Every f32 operation of a row is the single warp's, in
// the same order: the same bits as the default entry point, with half the chain per warp.
// End of a part: the warps' (m, l, O) meet in shared memory (over the stages, after the ring is
// drained) and are merged in warp order: fixed order, so a row's bits depend only on its context
// and data (not on the batch, the grid's Z or a graph's pinned context). One part: out directly;
// else part_m / part_l / part_acc as attention_decode.cu ([n_rows, n_heads, n_slots] and
// [.., head_dim], by block row y), merged by attention_decode_mma_combine_* (below) or, for the
// launch before it, attention_decode.cu's combine.
//
// PROGRAMMATIC DEPENDENT LAUNCH (sm_90+; no-ops below), as attention_decode.cu: before
// griddepcontrol.wait a block reads only step metadata (q_index, q_pos, q_seq, the block table,
// pf_meta: uploaded by copies) and, when `pf_meta` (the step's per-sequence [token_start, len,
// cached_len, slot] rows) is not null and the keys of a warp's first NST - 1 chunks are all
// below its sequence's cached length (keys of earlier steps: this step's, written by the
// previous kernels, start there, whether the sequence has one new row or several, as in a
// speculative verification step), issues that warp's cp.async of those chunks into its own
// stages. q, the gate, out and the partials come after the wait (the previous grid has
// completed and its writes are visible then, so partials of the previous call are read before
// they are overwritten). Same bytes either way: same bits. Null pf_meta: nothing before the wait.
//
// attention_decode_mma_combine_{f16,bf16} (the merge of a row's parts, launched after the kernel
// with PDL) is in attention_decode_mma_merge.cuh, compiled after this file (kernels.rs,
// KernelModule::full_source): it uses the helpers above (dmma_part_len, dmma_pdl_*, dmma_gated).
//
// Types: the mma runs in bf16 for bf16 storage, else f16 (f16 storage, and fp8 widened to f16 in
// registers: e5m2 is the upper byte of an f16; e4m3 (sign << 15 | (byte & 0x7f) << 7) is an f16
// 2^8 below its value, the 2^8 applied to the f32 scores and to the output; or, with DMMA_FP8_CVT
// on sm_89+, its exact value by cvt.rn.f16x2.e4m3x2, see below). q is rounded to that
// type after scaling (|q · scale · log2 e| must stay under 65 504 for f16: true of any normed q);
// P is rounded to it before P·V (l sums the f32 p). fp8 NaN bytes are not handled (never written).
//
// Shared memory (dynamic, DmmaShape::SMEM bytes; checked against %dynamic_smem_size): per warp and
// stage a K chunk of 16 rows at stride KS and a V chunk at stride VS (padded so that the warp's
// loads hit distinct banks: K rows ≡ 64 B (16-bit) / 32 B (fp8) mod 128, V rows ≡ 16 B). Below
// sm_80 every entry point traps (the host never launches them there: `builds_for`).
#define DMMA_PART_ALIGN 64
#define DMMA_MAX_SLOTS 256     // most parts a row may have (max_parts ≤ this; the combine's registers)
#define DMMA_MERGE_PG 16       // combine: part groups
#define DMMA_MERGE_DIMS 64     // combine: dims per block
#define DMMA_MERGE_THREADS (DMMA_MERGE_PG * DMMA_MERGE_DIMS / 4)
#define DMMA_LOG2E 1.4426950408889634f
#define DMMA_CHUNK 16
// Stage ring bytes a block aims for; the host may pass -DDMMA_STAGE_BUDGET (KILN_DMMA_STAGE_BUDGET,
// attention_mma.rs) to trade stages per warp for blocks per SM. 71 000 (was 106 496): d256 bf16 2
// stages (6 warps per SM instead of 4), d256 / d128 fp8 3 stages (more blocks per SM); d128 bf16
// keeps its 2. On the H200 (seventh session) it put the 27B shape 24/4 x 256 at 72-86% of copy in
// bf16 and 51-79% in e5m2 at 8K/32K x 16/64 rows, against 66-88% / 44-62% with the old budget.
#ifndef DMMA_STAGE_BUDGET
#define DMMA_STAGE_BUDGET 71000
#endif
// A block of 4 warps (head widths 64 / 128) that takes several parts (rows enough for Z <
// n_active) issues the next part's first NST - 1 chunks before the end-of-part merge instead of
// after it, its merge rows moved into each warp's last stage (see `red_row`); -DDMMA_NO_XPART
// (`KILN_DMMA_XPART=0`, kernels.rs) keeps the ring drained at each part's end, as head width 256
// (2 warps) always does. Same chunks, same order, same bits. H200 (docs/benchmarks.md, `lctx2`):
// the Qwen3-like 32/8 x 128 with fp8 KV at 8K keys x 16 / 64 rows 5-8% faster; at head width 256
// it cost the fp8 kernels 3-8% (and a 4-byte register spill), so it is off there.
#ifdef DMMA_NO_XPART
#define DMMA_XPART 0
#else
#define DMMA_XPART 1
#endif
// End-of-part merge rows: DMMA_RS(DV) floats per (warp, head) row, read as float4 by the merge
// (4 dims per thread and step); -DDMMA_SCALAR_MERGE (`KILN_DMMA_VEC_MERGE=0`) keeps the earlier
// rows of DV + 2 floats read one dim per step. Same operations per dim: same bits.
#ifdef DMMA_SCALAR_MERGE
#define DMMA_RS(DV) ((DV) + 2)
#else
#define DMMA_RS(DV) ((DV) + 4)
#endif
// A chunk's copies when the cache blocks hold a multiple of 16 keys: one block-table read and a
// fixed step per row (-DDMMA_GENERIC_ISSUE, `KILN_DMMA_ISSUE=generic`: the per-row walk of the
// table that any block size takes, ~5x the instructions at head width 256). Same bytes, same bits.
#ifdef DMMA_GENERIC_ISSUE
#define DMMA_FAST_ISSUE 0
#else
#define DMMA_FAST_ISSUE 1
#endif

__device__ __forceinline__ int dmma_part_len(int ctx, int single_keys, int min_part, int max_parts) {
    if (ctx <= single_keys) return max(ctx, 1);  // one part
    int per = (ctx + max_parts - 1) / max_parts;
    per = (per + DMMA_PART_ALIGN - 1) / DMMA_PART_ALIGN * DMMA_PART_ALIGN;
    return max(min_part, per);
}

__device__ __forceinline__ void dmma_pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void dmma_pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Geometry of one (DV, storage bytes CB) class; attention_mma.rs mirrors NW and SMEM.
template <int DV, int CB> struct DmmaShape {
    static constexpr int NW = DV == 256 ? 2 : 4;                 // warps per block
    static constexpr int RB = DV * CB;                           // bytes of a K or V row
    static constexpr int KS = RB + (CB == 1 ? 32 : 64);          // K row stride in a stage
    static constexpr int VS = RB + 16;                           // V row stride in a stage
    static constexpr int SB = DMMA_CHUNK * (KS + VS);            // one stage (K + V chunk)
    static constexpr int NST_RAW = DMMA_STAGE_BUDGET / (NW * SB);
    static constexpr int NST = NST_RAW < 2 ? 2 : (NST_RAW > 4 ? 4 : NST_RAW);  // stages per warp
    static constexpr int UPR = RB / 16;                          // 16-byte units per row
    static constexpr int UPL = DMMA_CHUNK * UPR / WARP_SIZE;     // units per lane, K or V
    static constexpr int RED = (NW * 8 * DMMA_RS(DV) + 8) * 4;    // end-of-part merge buffer
    static constexpr int STAGES = NW * NST * SB;
    static constexpr int SMEM = STAGES > RED ? STAGES : RED;
    static constexpr int NKB = DV / 32;                          // 32-dim blocks
};

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800

// The mma (common.cuh's mma_m16n8k16: f32 accumulate, A row, B col) and the f32 → 16-bit pair
// rounding for the mma element type MT (bf16_t or __half).
template <typename MT> struct DmmaOp {
    static __device__ __forceinline__ void mma(float* d, unsigned a0, unsigned a1, unsigned a2,
                                               unsigned a3, unsigned b0, unsigned b1) {
        const unsigned a[4] = {a0, a1, a2, a3};
        mma_m16n8k16<MT>(d, a, b0, b1);
    }
    static __device__ __forceinline__ unsigned pack(float lo, float hi);
};
template <> __device__ __forceinline__ unsigned DmmaOp<bf16_t>::pack(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
template <> __device__ __forceinline__ unsigned DmmaOp<__half>::pack(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// The mma element type for storage C: bf16 for bf16, f16 otherwise (fp8 widens to f16).
template <typename C> struct DmmaType { typedef __half T; };
template <> struct DmmaType<bf16_t> { typedef bf16_t T; };

// e4m3 widened by the hardware conversion (sm_89+, `cvt.rn.f16x2.e4m3x2`: one instruction per
// pair instead of a byte_perm and the 2-op fix-up) when the host passes -DDMMA_FP8_CVT
// (`KILN_DMMA_FP8_CVT=1`, attention_mma.rs): exact values, no 2^8 factor. Same values either way
// (e4m3 is exact in f16 both ways; the 2^8 is a power of two), so the same bits.
#if defined(DMMA_FP8_CVT) && __CUDA_ARCH__ >= 890
#define DMMA_E4M3_CVT 1
#else
#define DMMA_E4M3_CVT 0
#endif

// fp8 → f16 scaling factor of the widened values (see the header).
template <typename C> struct DmmaScale { static constexpr float k = 1.0f; };
template <> struct DmmaScale<E4M3> { static constexpr float k = DMMA_E4M3_CVT ? 1.0f : 256.0f; };

// Two fp8 bytes (bits 0-7 and 16-23 after the byte_perm below: [0, x0, 0, x1]) as an f16 pair.
template <typename C> __device__ __forceinline__ unsigned dmma_fp8_fix(unsigned w) { return w; }
template <> __device__ __forceinline__ unsigned dmma_fp8_fix<E4M3>(unsigned w) {
    return (w & 0x80008000u) | ((w & 0x7f007f00u) >> 1);
}
// Bytes 0, 1 (lo) or 2, 3 (hi) of w as an f16x2 word (low half = the lower byte).
template <typename C> __device__ __forceinline__ unsigned dmma_w8_lo(unsigned w) {
    return dmma_fp8_fix<C>(__byte_perm(w, 0u, 0x1404));
}
template <typename C> __device__ __forceinline__ unsigned dmma_w8_hi(unsigned w) {
    return dmma_fp8_fix<C>(__byte_perm(w, 0u, 0x3424));
}
#if DMMA_E4M3_CVT
// Bytes 0, 1 (2, 3) of w as an f16x2 of their values: a[7:0] to the low half.
__device__ __forceinline__ unsigned dmma_cvt_e4m3x2(unsigned short v) {
    unsigned r;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(r) : "h"(v));
    return r;
}
template <> __device__ __forceinline__ unsigned dmma_w8_lo<E4M3>(unsigned w) {
    return dmma_cvt_e4m3x2((unsigned short)(w & 0xffffu));
}
template <> __device__ __forceinline__ unsigned dmma_w8_hi<E4M3>(unsigned w) {
    return dmma_cvt_e4m3x2((unsigned short)(w >> 16));
}
#endif

__device__ __forceinline__ unsigned dmma_trans(unsigned x) {
    unsigned r;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(r) : "r"(x));
    return r;
}

__device__ __forceinline__ void dmma_ldsm_x4_trans(unsigned addr, unsigned& a0, unsigned& a1,
                                                   unsigned& a2, unsigned& a3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(a0), "=r"(a1), "=r"(a2), "=r"(a3)
                 : "r"(addr));
}

// The two warps of pair `w` (paired entry points): named barrier 1 + w over their 64 threads.
__device__ __forceinline__ void dmma_pair_sync(int w) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(1 + w), "n"(2 * WARP_SIZE) : "memory");
}

__device__ __forceinline__ void dmma_cp16(unsigned dst, const unsigned char* src, bool ok) {
    const int n = ok ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}

template <typename T>
__device__ __forceinline__ float dmma_gated(float v, const T* gate, long t, int head, int d,
                                            int gate_row, int gate_head) {
    if (!gate) return v;
    const float g = Io<T>::load(gate, t * (long)gate_row + (long)head * gate_head + d);
    return v * (1.0f / (1.0f + expf(-g)));
}

template <typename T, typename C, int DV, int PR>
__device__ void attention_decode_mma(const T* q, const C* k_cache, const C* v_cache,
                                     const int* block_tables, const int* q_seq, const int* q_pos,
                                     const int* q_index, T* out, float* part_m, float* part_l,
                                     float* part_acc, int n_heads, int n_kv_heads, int head_dim,
                                     int block_size, int max_blocks, int n_slots, int single_keys,
                                     int min_part, int max_parts, const int* pf_meta, float scale,
                                     const T* gate, int gate_row, int gate_head) {
    constexpr int CB = (int)sizeof(C);
    typedef DmmaShape<DV, CB> Sh;
    typedef typename DmmaType<C>::T MT;
    typedef DmmaOp<MT> Op;
    constexpr int NW = Sh::NW, NST = Sh::NST, NKB = Sh::NKB;
    // Physical warps per logical warp (DMMA_PAIR, see the header): half `hf` of a pair takes the
    // 32-dim blocks b ≡ hf mod PR (of K for S, of V for O).
    static_assert(PR == 1 || (PR == 2 && NKB % 2 == 0), "pairs split the 32-dim blocks");
    constexpr int NKH = NKB / PR;  // 32-dim blocks per physical warp
    extern __shared__ __align__(16) unsigned char dmma_sm[];

    {
        unsigned dyn;
        asm("mov.u32 %0, %%dynamic_smem_size;\n" : "=r"(dyn));
        if (dyn < (unsigned)Sh::SMEM || head_dim != DV) __trap();  // a host/kernel mismatch
    }
    const int kv_head = blockIdx.x;
    const long row_y = blockIdx.y;
    const long t = q_index ? q_index[row_y] : row_y;
    const int ctx = q_pos[t] + 1;
    const int part_len = dmma_part_len(ctx, single_keys, min_part, max_parts);
    const int n_active = (ctx + part_len - 1) / part_len;
    if ((int)blockIdx.z >= n_active) return;  // block-uniform: before any barrier

    const int tid = threadIdx.x, lane = tid % WARP_SIZE;
    const int warp = tid / WARP_SIZE / PR, hf = tid / WARP_SIZE % PR;  // logical warp, half
    const int r = lane >> 2, c = lane & 3;
    const int group = n_heads / n_kv_heads;
    const int* table = block_tables + (long)q_seq[t] * max_blocks;
    const long kv_row = (long)n_kv_heads * DV;
    const long head_off = (long)kv_head * DV;
    const unsigned char* kc = reinterpret_cast<const unsigned char*>(k_cache);
    const unsigned char* vc = reinterpret_cast<const unsigned char*>(v_cache);
    const float kscale = DmmaScale<C>::k;

    const unsigned sm_base = (unsigned)__cvta_generic_to_shared(dmma_sm);
    const unsigned warp_base = sm_base + warp * NST * Sh::SB;
    // Lane's staging units: column u (fixed), rows row0 + k · (32 / UPR) of the chunk's 16 (with
    // pairs: half hf copies whole rows 8 hf .. 8 hf + 7, made visible to the other half by the
    // pair barrier after the wait).
    constexpr int RSTEP = WARP_SIZE / Sh::UPR, UPL = DMMA_CHUNK / PR * Sh::UPR / WARP_SIZE;
    const int u_col = lane % Sh::UPR, row0 = DMMA_CHUNK / PR * hf + lane / Sh::UPR;

    // Issue chunk `ci` of the part [start, end) into stage `st` (zeros past `end`), one commit
    // group (empty when ci is past the part, so the group count stays uniform).
    auto issue = [&](int ci, int start, int end, int st) {
        const int k0 = start + ci * DMMA_CHUNK;
        if (k0 < end) {
            const unsigned sk = warp_base + st * Sh::SB;
            const unsigned sv = sk + DMMA_CHUNK * Sh::KS;
            if (DMMA_FAST_ISSUE && block_size % DMMA_CHUNK == 0) {
                // k0 is a multiple of 16 (parts start at multiples of DMMA_PART_ALIGN), so the
                // chunk's keys are rows k0 % block_size .. + 15 of one cache block: one table
                // read, then a fixed byte step per row (rows past `end` are still in the block:
                // valid addresses, copied as zeros).
                const int blk = k0 / block_size;
                const long step = kv_row * CB;
                const long off = (((long)table[blk] * block_size + (k0 - blk * block_size) + row0) * kv_row +
                                  head_off) * CB + u_col * 16;
                const unsigned char* kp = kc + off;
                const unsigned char* vp = vc + off;
                const int n_ok = end - k0;
#pragma unroll
                for (int i = 0; i < UPL; ++i) {
                    const int row = row0 + i * RSTEP;
                    const bool ok = row < n_ok;
                    dmma_cp16(sk + row * Sh::KS + u_col * 16, kp, ok);
                    dmma_cp16(sv + row * Sh::VS + u_col * 16, vp, ok);
                    kp += RSTEP * step;
                    vp += RSTEP * step;
                }
                asm volatile("cp.async.commit_group;\n" ::);
                return;
            }
            // One division per chunk: key k0 + row is `slot` keys into block `blk` (stepped on,
            // once per row at most for blocks of ≥ RSTEP keys).
            int blk = k0 / block_size, slot = k0 - blk * block_size + row0;
            while (slot >= block_size) { slot -= block_size; ++blk; }
#pragma unroll
            for (int i = 0; i < UPL; ++i) {
                const int row = row0 + i * RSTEP;
                const int j = k0 + row;
                const bool ok = j < end;
                long off = 0;
                if (ok) off = (((long)table[blk] * block_size + slot) * kv_row + head_off) * CB + u_col * 16;
                slot += RSTEP;
                while (slot >= block_size) { slot -= block_size; ++blk; }
                dmma_cp16(sk + row * Sh::KS + u_col * 16, kc + off, ok);
                dmma_cp16(sv + row * Sh::VS + u_col * 16, vc + off, ok);
            }
        }
        asm volatile("cp.async.commit_group;\n" ::);
    };

    // End-of-part merge buffer: per warp w and head g a row of RS floats (O, then m, l), and
    // the 8 per-head maxima. With DMMA_XPART warp w's rows are in its own last stage (NST - 1)
    // and the maxima after warp 0's rows there, so the next part's first NST - 1 chunks (stages
    // 0 .. NST - 2) can be in flight during the merge; else everything from the ring's start.
    constexpr bool XP = DMMA_XPART && NW == 4;
    constexpr int RS = DMMA_RS(DV);
    static_assert(!XP || 8 * RS * 4 + 8 * 4 <= Sh::SB, "merge rows fit a stage");
    auto red_row = [&](int w, int g) {
        if constexpr (XP) {
            return reinterpret_cast<float*>(dmma_sm + (w * NST + NST - 1) * Sh::SB) + g * RS;
        } else {
            return reinterpret_cast<float*>(dmma_sm) + (w * 8 + g) * RS;
        }
    };
    float* const red_max = XP ? reinterpret_cast<float*>(dmma_sm + (NST - 1) * Sh::SB) + 8 * RS
                              : reinterpret_cast<float*>(dmma_sm) + NW * 8 * RS;

    // This warp's first NST - 1 chunks of the block's first part before the wait when they hold
    // only earlier steps' keys: below the sequence's cached length (its first position in this
    // step; pf_meta row q_seq[t], field 2), never its own ctx - 1 (see the header); warp-uniform.
    const int first_start = (int)blockIdx.z * part_len;
    const int first_end = min(ctx, first_start + part_len);
    const int pf_lim = pf_meta ? min(ctx - 1, pf_meta[4 * (long)q_seq[t] + 2]) : 0;
    const bool prefetched =
        min(first_end, first_start + (warp + (NST - 2) * NW + 1) * DMMA_CHUNK) <= pf_lim;
    if (prefetched) {
#pragma unroll
        for (int i = 0; i < NST - 1; ++i) issue(warp + i * NW, first_start, first_end, i);
    }
    bool issued = prefetched;  // this warp's first NST - 1 chunks of the next part are in flight
    // Metadata and earlier steps' K/V only above; q, this step's key and every output below.
    dmma_pdl_wait();
    dmma_pdl_launch_dependents();

    // q of head r of the group as the B operand (k-step 2b + s: dims 32b + 8c + 4s + {0,1},
    // {2,3}), scaled by scale · log2 e; zero heads past the group.
    unsigned qf[2 * NKH][2];
    {
        const float qs = scale * DMMA_LOG2E;
        const bool live = r < group;
        const long qrow = (t * n_heads + (long)kv_head * group + r) * (long)DV;
#pragma unroll
        for (int bb = 0; bb < NKH; ++bb)
#pragma unroll
            for (int s = 0; s < 2; ++s)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int d = 32 * (bb * PR + hf) + 8 * c + 4 * s + 2 * h;
                    const float x0 = live ? Io<T>::load(q, qrow + d) * qs : 0.0f;
                    const float x1 = live ? Io<T>::load(q, qrow + d + 1) * qs : 0.0f;
                    qf[2 * bb + s][h] = Op::pack(x0, x1);
                }
    }

    for (int part = blockIdx.z; part < n_active; part += gridDim.z) {
        const int start = part * part_len;
        const int end = min(ctx, start + part_len);
        const int n_chunks = (end - start + DMMA_CHUNK - 1) / DMMA_CHUNK;
        // This warp's chunks: warp, warp + NW, ... < n_chunks (my_n of them).
        const int my_n = warp < n_chunks ? (n_chunks - warp + NW - 1) / NW : 0;

        float o[2 * NKH][4];  // m-tiles 2 b, 2 b + 1 of this warp's blocks b (local 2 bb, 2 bb + 1)
#pragma unroll
        for (int i = 0; i < 2 * NKH; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
        float m_a = KILN_NEG_INF, m_b = KILN_NEG_INF, l_a = 0.0f, l_b = 0.0f;

        __syncthreads();  // the last part's merge (over the same bytes) has been read
        if (!issued) {
#pragma unroll
            for (int i = 0; i < NST - 1; ++i) issue(warp + i * NW, start, end, i);
        }

        for (int i = 0; i < my_n; ++i) {
            // With pairs the next chunk is issued once both halves are done with the stage (the
            // pair barrier below: both have finished chunk i - 1, whose stage it refills).
            if constexpr (PR == 1) issue(warp + (i + NST - 1) * NW, start, end, (i + NST - 1) % NST);
            asm volatile("cp.async.wait_group %0;\n" ::"n"(PR == 1 ? NST - 1 : NST - 2));
            if constexpr (PR == 2) {
                dmma_pair_sync(warp);  // both halves' copies of chunk i are visible to both
                issue(warp + (i + NST - 1) * NW, start, end, (i + NST - 1) % NST);
            }
            __syncwarp();  // every lane's copies of chunk i are visible to the warp
            const int st = i % NST;
            const int k0 = start + (warp + i * NW) * DMMA_CHUNK;
            const unsigned char* sk = dmma_sm + warp * NST * Sh::SB + st * Sh::SB;
            const unsigned sv = warp_base + st * Sh::SB + DMMA_CHUNK * Sh::KS;

            // S^T = K · Q^T over the 32-dim blocks, even and odd blocks into two accumulators
            // (two chains of NKB mmas instead of one of 2 NKB), summed after.
            float s4[4] = {0.0f, 0.0f, 0.0f, 0.0f}, s4o[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int bb = 0; bb < NKH; ++bb) {
                const int b = bb * PR + hf;
                unsigned w0[4], w8[4];
                if constexpr (CB == 2) {
                    const uint4 x = *reinterpret_cast<const uint4*>(sk + r * Sh::KS + 64 * b + 16 * c);
                    const uint4 y = *reinterpret_cast<const uint4*>(sk + (r + 8) * Sh::KS + 64 * b + 16 * c);
                    w0[0] = x.x; w0[1] = x.y; w0[2] = x.z; w0[3] = x.w;
                    w8[0] = y.x; w8[1] = y.y; w8[2] = y.z; w8[3] = y.w;
                } else {
                    const uint2 x = *reinterpret_cast<const uint2*>(sk + r * Sh::KS + 32 * b + 8 * c);
                    const uint2 y = *reinterpret_cast<const uint2*>(sk + (r + 8) * Sh::KS + 32 * b + 8 * c);
                    w0[0] = dmma_w8_lo<C>(x.x); w0[1] = dmma_w8_hi<C>(x.x);
                    w0[2] = dmma_w8_lo<C>(x.y); w0[3] = dmma_w8_hi<C>(x.y);
                    w8[0] = dmma_w8_lo<C>(y.x); w8[1] = dmma_w8_hi<C>(y.x);
                    w8[2] = dmma_w8_lo<C>(y.y); w8[3] = dmma_w8_hi<C>(y.y);
                }
                float* acc = (PR == 1 && (b & 1)) ? s4o : s4;  // pairs: this half's chain in s4
#pragma unroll
                for (int s = 0; s < 2; ++s)
                    Op::mma(acc, w0[2 * s], w8[2 * s], w0[2 * s + 1], w8[2 * s + 1], qf[2 * bb + s][0],
                            qf[2 * bb + s][1]);
            }
            if constexpr (PR == 2) {
                // s4 holds this half's chain (even blocks for half 0, odd for 1): swap them through
                // 16 bytes per lane of K in this half's own blocks (read above by this warp only;
                // refilled only after the next chunk's first pair barrier).
                __syncwarp();
                constexpr int UPRH = Sh::UPR / 2, UPB = 2 * CB;  // units per row of a half, a block
                const int xu = lane % UPRH, xrow = lane / UPRH;
                const unsigned xo = xrow * Sh::KS + ((xu / UPB * 2 + hf) * UPB + xu % UPB) * 16;
                const unsigned xp = xrow * Sh::KS + ((xu / UPB * 2 + (hf ^ 1)) * UPB + xu % UPB) * 16;
                *reinterpret_cast<float4*>(const_cast<unsigned char*>(sk) + xo) =
                    make_float4(s4[0], s4[1], s4[2], s4[3]);
                dmma_pair_sync(warp);
                const float4 v = *reinterpret_cast<const float4*>(sk + xp);
                const float other[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
                for (int e = 0; e < 4; ++e) {  // even + odd, as below
                    s4o[e] = hf ? s4[e] : other[e];
                    s4[e] = hf ? other[e] : s4[e];
                }
            }
#pragma unroll
            for (int e = 0; e < 4; ++e) s4[e] += s4o[e];
            // Online softmax: keys k0 + r (s4[0], s4[1]) and k0 + r + 8 (s4[2], s4[3]) of heads 2c
            // (a) and 2c + 1 (b).
            const bool v0 = k0 + r < end, v8 = k0 + r + 8 < end;
            const float sa0 = v0 ? s4[0] * kscale : KILN_NEG_INF;
            const float sb0 = v0 ? s4[1] * kscale : KILN_NEG_INF;
            const float sa8 = v8 ? s4[2] * kscale : KILN_NEG_INF;
            const float sb8 = v8 ? s4[3] * kscale : KILN_NEG_INF;
            float ta = fmaxf(sa0, sa8), tb = fmaxf(sb0, sb8);
#pragma unroll
            for (int x = 4; x < 32; x <<= 1) {
                ta = fmaxf(ta, __shfl_xor_sync(0xffffffffu, ta, x));
                tb = fmaxf(tb, __shfl_xor_sync(0xffffffffu, tb, x));
            }
            const float na = fmaxf(m_a, ta), nb = fmaxf(m_b, tb);  // finite: key k0 < end
            const float ca = m_a == KILN_NEG_INF ? 0.0f : exp2f(m_a - na);
            const float cb = m_b == KILN_NEG_INF ? 0.0f : exp2f(m_b - nb);
            m_a = na;
            m_b = nb;
            const float pa0 = exp2f(sa0 - na), pb0 = exp2f(sb0 - nb);
            const float pa8 = exp2f(sa8 - na), pb8 = exp2f(sb8 - nb);
            l_a = fmaf(l_a, ca, pa0 + pa8);
            l_b = fmaf(l_b, cb, pb0 + pb8);
            const unsigned pb_0 = dmma_trans(Op::pack(pa0, pb0));  // P[head r][keys 2c, 2c+1]
            const unsigned pb_1 = dmma_trans(Op::pack(pa8, pb8));  // keys 2c+8, 2c+9
            if (ca != 1.0f || cb != 1.0f) {
#pragma unroll
                for (int mt = 0; mt < 2 * NKH; ++mt) {
                    o[mt][0] *= ca; o[mt][1] *= cb; o[mt][2] *= ca; o[mt][3] *= cb;
                }
            }
            // O^T += V^T · P^T.
            if constexpr (CB == 2) {
                // ldmatrix.trans: lane l gives row (l & 7) + 8 · (l >> 4) (key), dims + 8 · ((l >> 3) & 1).
                const int mi = lane >> 3;
                const unsigned vrow = sv + ((lane & 7) + 8 * (mi >> 1)) * Sh::VS + (mi & 1) * 16;
#pragma unroll
                for (int j = 0; j < 2 * NKH; ++j) {
                    const int mt = 2 * ((j / 2) * PR + hf) + j % 2;
                    unsigned a0, a1, a2, a3;
                    dmma_ldsm_x4_trans(vrow + mt * 32, a0, a1, a2, a3);
                    Op::mma(o[j], a0, a1, a2, a3, pb_0, pb_1);
                }
            } else {
                const unsigned char* svp = sk + DMMA_CHUNK * Sh::KS;
#pragma unroll
                for (int bb = 0; bb < NKH; ++bb) {
                    const int b = bb * PR + hf;
                    const unsigned char* base = svp + 32 * b + 4 * r;
                    const unsigned x0 = *reinterpret_cast<const unsigned*>(base + (2 * c) * Sh::VS);
                    const unsigned x1 = *reinterpret_cast<const unsigned*>(base + (2 * c + 1) * Sh::VS);
                    const unsigned y0 = *reinterpret_cast<const unsigned*>(base + (2 * c + 8) * Sh::VS);
                    const unsigned y1 = *reinterpret_cast<const unsigned*>(base + (2 * c + 9) * Sh::VS);
                    const unsigned x01 = __byte_perm(x0, x1, 0x5140), x23 = __byte_perm(x0, x1, 0x7362);
                    const unsigned y01 = __byte_perm(y0, y1, 0x5140), y23 = __byte_perm(y0, y1, 0x7362);
                    Op::mma(o[2 * bb], dmma_w8_lo<C>(x01), dmma_w8_hi<C>(x01), dmma_w8_lo<C>(y01),
                            dmma_w8_hi<C>(y01), pb_0, pb_1);
                    Op::mma(o[2 * bb + 1], dmma_w8_lo<C>(x23), dmma_w8_hi<C>(x23), dmma_w8_lo<C>(y23),
                            dmma_w8_hi<C>(y23), pb_0, pb_1);
                }
            }
            __syncwarp();  // stage st is read by every lane before it is refilled
        }

        // End of the part. Every copy of this warp's chunks has completed (the loop waited for
        // each; the groups still pending are empty).
        if constexpr (XP) {
            // The next part's first NST - 1 chunks into stages 0 .. NST - 2 (this warp's own,
            // read), in flight during the merge below (which uses the stages NST - 1); with pairs
            // once the partner has read this warp's last exchange (in its own K units).
            if constexpr (PR == 2) dmma_pair_sync(warp);
            const int next = part + (int)gridDim.z;
            issued = next < n_active;
            if (issued) {
                const int ns = next * part_len, ne = min(ctx, ns + part_len);
#pragma unroll
                for (int i = 0; i < NST - 1; ++i) issue(warp + i * NW, ns, ne, i);
            }
        } else {
            issued = false;
            asm volatile("cp.async.wait_group 0;\n" ::);
        }
        // The warps' (m, l, O) into shared memory.
        __syncthreads();
#pragma unroll
        for (int x = 4; x < 32; x <<= 1) {
            l_a += __shfl_xor_sync(0xffffffffu, l_a, x);
            l_b += __shfl_xor_sync(0xffffffffu, l_b, x);
        }
        float* mine = red_row(warp, 0);
#pragma unroll
        for (int j = 0; j < 2 * NKH; ++j) {
            const int mt = 2 * ((j / 2) * PR + hf) + j % 2;
            int d0, d8;
            if constexpr (CB == 2) {
                d0 = 16 * mt + r;
                d8 = d0 + 8;
            } else {
                d0 = 32 * (mt / 2) + 4 * r + 2 * (mt % 2);
                d8 = d0 + 1;
            }
            mine[(2 * c) * RS + d0] = o[j][0];
            mine[(2 * c + 1) * RS + d0] = o[j][1];
            mine[(2 * c) * RS + d8] = o[j][2];
            mine[(2 * c + 1) * RS + d8] = o[j][3];
        }
        if (r == 0 && hf == 0) {  // both halves hold the same m, l
            mine[(2 * c) * RS + DV] = m_a;
            mine[(2 * c) * RS + DV + 1] = l_a;
            mine[(2 * c + 1) * RS + DV] = m_b;
            mine[(2 * c + 1) * RS + DV + 1] = l_b;
        }
        __syncthreads();
        // Per head g: the part's max over the warps, each warp's weight exp2(m_w - max) in place
        // of its m, and the weighted l sum in warp 0's l (computed once, not per output dim).
        if (tid < group) {
            const int g = tid;
            float mx = KILN_NEG_INF;
#pragma unroll
            for (int w = 0; w < NW; ++w) mx = fmaxf(mx, red_row(w, g)[DV]);
            float lsum = 0.0f;
#pragma unroll
            for (int w = 0; w < NW; ++w) {
                float* rw = red_row(w, g);
                const float mw = rw[DV];
                const float wt = mw == KILN_NEG_INF ? 0.0f : exp2f(mw - mx);
                lsum = fmaf(rw[DV + 1], wt, lsum);
                rw[DV] = wt;
            }
            red_row(0, g)[DV + 1] = lsum;
            red_max[g] = mx;
        }
        __syncthreads();
#ifdef DMMA_SCALAR_MERGE
        constexpr int VW = 1;
#else
        constexpr int VW = 4;  // dims per thread and step (float4 rows: RS and DV multiples of 4)
#endif
        for (int idx = tid; idx < group * (DV / VW); idx += NW * PR * WARP_SIZE) {
            const int g = idx / (DV / VW), d = VW * (idx - g * (DV / VW));
            float acc[VW];
#pragma unroll
            for (int e = 0; e < VW; ++e) acc[e] = 0.0f;
#pragma unroll
            for (int w = 0; w < NW; ++w) {
                const float* rw = red_row(w, g);
                const float wt = rw[DV];
                float x[VW];
                if constexpr (VW == 4) {
                    const float4 v = *reinterpret_cast<const float4*>(rw + d);
                    x[0] = v.x; x[1] = v.y; x[2] = v.z; x[3] = v.w;
                } else {
                    x[0] = rw[d];
                }
#pragma unroll
                for (int e = 0; e < VW; ++e) acc[e] = fmaf(x[e], wt, acc[e]);
            }
            const float lsum = red_row(0, g)[DV + 1];
            const float mx = red_max[g];
#pragma unroll
            for (int e = 0; e < VW; ++e) acc[e] *= kscale;  // V widened 2^8 below its value for e4m3
            const int head = kv_head * group + g;
            if (n_active == 1) {
#pragma unroll
                for (int e = 0; e < VW; ++e) {
                    const float v = lsum > 0.0f ? acc[e] / lsum : 0.0f;
                    Io<T>::store(out, (t * n_heads + head) * (long)DV + d + e,
                                 dmma_gated<T>(v, gate, t, head, d + e, gate_row, gate_head));
                }
            } else {
                const long ph = (row_y * n_heads + head) * (long)n_slots + part;
                if constexpr (VW == 4) {
                    *reinterpret_cast<float4*>(part_acc + ph * DV + d) =
                        make_float4(acc[0], acc[1], acc[2], acc[3]);
                } else {
                    part_acc[ph * DV + d] = acc[0];
                }
                if (d == 0) {
                    part_m[ph] = mx;
                    part_l[ph] = lsum;
                }
            }
        }
        // The next part's first barrier orders these reads before its copies overwrite `red`.
    }
}

#define DMMA_BODY(T, C, DV, PR)                                                                     \
    attention_decode_mma<T, C, DV, PR>(q, kc, vc, bt, q_seq, q_pos, q_index, out, pm, pl, pacc,         \
                                   n_heads, n_kv_heads, head_dim, block_size, max_blocks, n_slots,  \
                                   single_keys, min_part, max_parts, pf_meta, scale, gate,          \
                                   gate_row, gate_head);
#else
#define DMMA_BODY(T, C, DV, PR) __trap();
#endif

#define ATTENTION_DECODE_MMA_ONE(SUF, T, CSUF, C, DV, PR, PSUF)                                     \
    extern "C" __global__ void __launch_bounds__(DmmaShape<DV, (int)sizeof(C)>::NW * PR * WARP_SIZE) \
        attention_decode_mma_##SUF##_##CSUF##_d##DV##PSUF(                                          \
            const T* q, const C* kc, const C* vc, const int* bt, const int* q_seq,                  \
            const int* q_pos, const int* q_index, T* out, float* pm, float* pl, float* pacc,        \
            int n_heads, int n_kv_heads, int head_dim, int block_size, int max_blocks,             \
            int n_slots, int single_keys, int min_part, int max_parts, const int* pf_meta,         \
            float scale, const T* gate, int gate_row, int gate_head) {                              \
        DMMA_BODY(T, C, DV, PR)                                                                     \
    }
#define ATTENTION_DECODE_MMA_STORAGE(SUF, T, CSUF, C)                                               \
    ATTENTION_DECODE_MMA_ONE(SUF, T, CSUF, C, 64, 1, )                                              \
    ATTENTION_DECODE_MMA_ONE(SUF, T, CSUF, C, 128, 1, )                                             \
    ATTENTION_DECODE_MMA_ONE(SUF, T, CSUF, C, 256, 1, )                                             \
    ATTENTION_DECODE_MMA_ONE(SUF, T, CSUF, C, 64, 2, _p2)                                           \
    ATTENTION_DECODE_MMA_ONE(SUF, T, CSUF, C, 128, 2, _p2)                                          \
    ATTENTION_DECODE_MMA_ONE(SUF, T, CSUF, C, 256, 2, _p2)

// Instantiations: all of them by default (the compile test, `kiln doctor`); a backend builds its
// own (compute dtype, KV storage) pair with -DKILN_DMMA_ONLY -DKILN_DMMA_T_<t> -DKILN_DMMA_C_<c>.
#if !defined(KILN_DMMA_ONLY) || (defined(KILN_DMMA_T_f16) && defined(KILN_DMMA_C_same))
ATTENTION_DECODE_MMA_STORAGE(f16, __half, same, __half)
#endif
#if !defined(KILN_DMMA_ONLY) || (defined(KILN_DMMA_T_f16) && defined(KILN_DMMA_C_e5m2))
ATTENTION_DECODE_MMA_STORAGE(f16, __half, e5m2, E5M2)
#endif
#if !defined(KILN_DMMA_ONLY) || (defined(KILN_DMMA_T_f16) && defined(KILN_DMMA_C_e4m3))
ATTENTION_DECODE_MMA_STORAGE(f16, __half, e4m3, E4M3)
#endif
#if !defined(KILN_DMMA_ONLY) || (defined(KILN_DMMA_T_bf16) && defined(KILN_DMMA_C_same))
ATTENTION_DECODE_MMA_STORAGE(bf16, bf16_t, same, bf16_t)
#endif
#if !defined(KILN_DMMA_ONLY) || (defined(KILN_DMMA_T_bf16) && defined(KILN_DMMA_C_e5m2))
ATTENTION_DECODE_MMA_STORAGE(bf16, bf16_t, e5m2, E5M2)
#endif
#if !defined(KILN_DMMA_ONLY) || (defined(KILN_DMMA_T_bf16) && defined(KILN_DMMA_C_e4m3))
ATTENTION_DECODE_MMA_STORAGE(bf16, bf16_t, e4m3, E4M3)
#endif
// An f32-compute backend builds this module with no instantiation (it keeps attention_decode.cu).
