// w4a16_hints.cuh: the L2 hints of the packed W4A16 GEMVs' weight stream, shared by the 1..8-row
// GEMV (w4a16_gemv.cu: POL and PF of its `hp2` default) and the 9..16-row cluster GEMV
// (w4a16_xs.cu: its `h` builds). Not a module: src/backend/cuda/kernels.rs
// `KernelModule::full_source` compiles it after w4a16.cu's helpers and before either file (no
// include path needed, one copy of the code).
//
// The hints change only where bytes are cached and when they are fetched, never which bytes are
// read or how they are combined: a build with them gives the same bits as one without.
// - POL 1: a weight word is loaded with the L2 evict-first policy (`createpolicy` once per
//   thread, `ld.global.nc.L1::no_allocate.L2::cache_hint`): weights are read once per step, so
//   they should not push x, the (scale, zero) words or the next kernel's data out of the L2; nor
//   are they kept in the L1 (no lane reads a weight word twice).
// - PF > 0 (the kernels' loops): each warp asks the L2 for the 128-byte line of a k block PF
//   ahead of the one it consumes (`prefetch.global.L2`: no register, nothing to wait for).
//
// Shapes and units: `p` points at one lane's 16-byte weight word in device memory (16-byte
// aligned); `pol` is the 64-bit policy word of `w4v_policy<POL>()` (0 for POL 0).

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define W4V_HINTS 1
#else
#define W4V_HINTS 0
#endif

// The L2 policy word of POL (0: none).
template <int POL>
__device__ __forceinline__ unsigned long long w4v_policy() {
    unsigned long long pol = 0ull;
#if W4V_HINTS
    if (POL == 1) asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
#endif
    return pol;
}

// One lane's 128-bit weight word: `__ldg`, or (POL 1) not allocated in the L1 and evict-first in
// the L2 (`pol` from w4v_policy<1>).
template <int POL>
__device__ __forceinline__ uint4 w4v_ldw(const uint4* p, unsigned long long pol) {
#if W4V_HINTS
    if (POL == 1) {
        uint4 v;
        asm("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
            : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
            : "l"(p), "l"(pol));
        return v;
    }
#endif
    (void)pol;
    return __ldg(p);
}

// Ask the L2 for the 128-byte line of `p` (no register, no completion to wait for).
__device__ __forceinline__ void w4v_prefetch_l2(const uint4* p) {
#if W4V_HINTS
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#endif
}
