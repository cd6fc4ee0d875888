// dense_common.cuh: the device helpers the batch-invariant tensor-core dense matmuls share
// (dense.cu's small / large kernels and dense_gemm.cu's pipelined GEMM), prepended after common.cuh
// to both modules (src/backend/cuda/kernels.rs `full_source`): the PDL wait, the one m16n8k16 of a
// k-block chunk with dense.cu's fragment <-> k-column assignment (see "MMA OPERANDS AND K ORDER"
// in dense.cu), a k block's two mmas in order, and the D-fragment store with its epilogues. Moved
// here verbatim from dense.cu so that every kernel of that family runs the same code.
#pragma once

// PROGRAMMATIC DEPENDENT LAUNCH (sm_90+; no-ops below). A kernel the host launches with the
// programmatic-stream-serialization attribute (dense.rs, `launch.rs`) may start while the previous
// kernel of the stream still runs: it must not read what that kernel writes, nor write what it
// reads, before pdl_wait() (griddepcontrol.wait: returns once the previous grid has completed and
// its memory is visible). pdl_launch_dependents() lets the next such kernel start early. Every
// kernel of dense.cu / dense_gemm.cu calls pdl_wait() before touching activations, so any of them may be launched
// either way; weights (never written by a step) may be read before it.
#ifndef KILN_PDL_HELPERS
#define KILN_PDL_HELPERS
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
#endif

// One m16n8k16 (common.cuh `mma_m16n8k16`) on chunk c of the k block: A from the 128-bit words
// a_lo (rows g) and a_hi (rows g + 8), B from b; chunk 0 the .x / .y words, chunk 1 .z / .w.
template <typename T>
__device__ __forceinline__ void dmma(float* d, uint4 a_lo, uint4 a_hi, uint4 b, int c) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned a[4] = {c ? a_lo.z : a_lo.x, c ? a_hi.z : a_hi.x, c ? a_lo.w : a_lo.y,
                           c ? a_hi.w : a_hi.y};
    mma_m16n8k16<T>(d, a, c ? b.z : b.x, c ? b.w : b.y);
#else
    __trap();  // the host launches the tensor-core kernels on sm_80+ only
#endif
}

// One k block of a 16-output x 8-row tile: two mmas, chunk 0 then 1.
template <typename T>
__device__ __forceinline__ void dmma_block(float* d, uint4 a_lo, uint4 a_hi, uint4 b) {
    dmma<T>(d, a_lo, a_hi, b, 0);
    dmma<T>(d, a_lo, a_hi, b, 1);
}

// Store D-fragment element i (0..3) of a 16-output tile at outputs n0.. and rows row0.. (an 8-row
// group): output n0 + g + 8 (i >> 1), row row0 + 2t + (i & 1). SWIGLU: called for i = 0, 1 with
// the gate in v and the up value in u (element i + 2); output column n0 / 2 + g of out [m, n / 2].
// RES (O = float, the f32 residual stream): out += v rounded to T, the same f32 sum the unfused
// matmul (output in T) + add_rms_norm (residual += delta) computes.
template <typename T, typename O, bool SWIGLU, bool RES = false>
__device__ __forceinline__ void dmma_store(O* __restrict__ out, int m, int n, int n0, int row0,
                                           int lane, int i, float v, float u) {
    const int g = lane >> 2, t = lane & 3;
    const int row = row0 + 2 * t + (i & 1);
    if (row >= m) return;
    if (SWIGLU) {
        const int col = n0 / 2 + g;
        if (col >= n / 2) return;
        const float gr = round_to<T>(v), ur = round_to<T>(u);
        Io<O>::store(out, (long)row * (n / 2) + col, gr / (1.0f + expf(-gr)) * ur);
    } else {
        const int col = n0 + g + 8 * (i >> 1);
        if (col >= n) return;
        const long at = (long)row * n + col;
        Io<O>::store(out, at, RES ? Io<O>::load(out, at) + round_to<T>(v) : v);
    }
}

