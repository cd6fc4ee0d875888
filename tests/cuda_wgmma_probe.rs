//! The wgmma bit probe (issue 10 item 7): does Hopper's warpgroup MMA (`wgmma.mma_async`
//! m64nNk16, f32 accumulators) give the same bits as the chain of `mma.sync` m16n8k16 that every
//! W4A16 kernel runs (kernels/w4a16.cu, "ONE NUMERIC PATH FOR EVERY ROW COUNT")? Only then may a
//! wgmma GEMM join the one numeric path.
//!
//! On the same 16-bit operands A (64 × 128, K-major), B (N × 128, K-major: B^T as the kernels hold
//! x) and start accumulators C (64 × N), two chains over k = 16, 32, …, 128 (8 steps of k16,
//! D ← A[:, k16] · B[k16, :] + D): (a) `mma.sync.m16n8k16` per 16 × 8 tile (4 warps × N / 8
//! tiles), (b) one `wgmma` m64nNk16 per step over the whole tile, for N = 8 … 256, with A from
//! registers (the m16n8k16 A fragment per warp) or from shared memory, B from shared memory in
//! the canonical no-swizzle layout (core matrices of 8 rows × 16 bytes; LBO = 128 B between the
//! k-adjacent ones, SBO = 2048 B between the row-adjacent ones, and the same with the two fields
//! swapped, in case the hardware reads them the other way) and in the 128-byte swizzle (8 rows ×
//! 128 B atoms, the descriptor advanced 32 B per k16 step): every accumulator after every step is
//! compared bit for bit. Both 16-bit types (bf16, f16). Operand cases chosen so that rounding
//! matters: uniform values, mixed magnitudes (2^±20), pairwise cancellation with a 1-ulp residue,
//! large C (2^20..2^24) absorbing small products, decoded 4-bit weights × activations with
//! outliers (the GEMM's real data, C = 0), and products at the f32 subnormal border. A layout
//! variant is "valid" when its result is within 1e-3 of the f64 reference (relative to Σ|a·b| +
//! |c|): a wrong layout is far off, a rounding difference is not; only valid variants are
//! compared (each printed line says which).
//!
//! Run on an sm_90 GPU (built with `cargo test --release --features cuda --no-run --test
//! cuda_wgmma_probe`; the probe compiles its own source with the NVRTC it finds, for `sm_90a`):
//! `cuda_wgmma_probe-<hash> --ignored --test-threads=1 --nocapture`
//! It prints `RESULT wgmma_probe ...` lines and fails when any valid variant differs in one bit,
//! or when no variant of a kind is valid. `probe_source_compiles` needs no GPU (NVRTC only:
//! `eval "$(scripts/nvrtc-setup)"`; skipped with a message without it).
#![cfg(feature = "cuda")]

use cudarc::driver::{CudaContext, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;

/// The N (outputs of the wgmma tile = columns of B) probed.
const NS: [usize; 9] = [8, 16, 24, 32, 64, 96, 128, 192, 256];
/// k of the chain (8 steps of k16).
const K: usize = 128;
const STEPS: usize = K / 16;
/// Rows of A (one warpgroup's m64).
const M: usize = 64;

/// Shared-memory layouts of the wgmma operands (`mode`, `lbo`, `sbo` of the kernels).
#[derive(Clone, Copy, Debug)]
struct Layout {
    name: &'static str,
    mode: i32,
    lbo: i32,
    sbo: i32,
}
const LAYOUTS: [Layout; 3] = [
    Layout {
        name: "noswz",
        mode: 0,
        lbo: 128,
        sbo: 2048,
    },
    Layout {
        name: "noswz_swapped",
        mode: 0,
        lbo: 2048,
        sbo: 128,
    },
    Layout {
        name: "swz128",
        mode: 1,
        lbo: 16,
        sbo: 1024,
    },
];

/// The probe's CUDA source: fixed helpers and kernels, then one wgmma wrapper and two kernels
/// (A from registers `rs`, A from shared memory `ss`) per 16-bit type and N.
fn probe_source() -> String {
    let mut s = String::from(STATIC_SRC);
    for ty in ["bf16", "f16"] {
        for n in NS {
            s.push_str(&wgmma_wrappers(ty, n));
            for kind in ["rs", "ss"] {
                s.push_str(&format!(
                    "extern \"C\" __global__ void __launch_bounds__(128) probe_wg_{kind}_{ty}_{n}(\
                     const unsigned short* A, const unsigned short* Bt, const float* C, float* out,\
                     int mode, int lbo, int sbo) {{\n\
                     float d[{h}];\n\
                     probe_wg_body<{n}>(A, Bt, C, out, mode, lbo, sbo, d, {rs},\n\
                     [&](float* dd, const unsigned* a, unsigned long long da, unsigned long long db) \
                     {{ {call}; }});\n}}\n",
                    h = n / 2,
                    rs = kind == "rs",
                    call = if kind == "rs" {
                        format!("wg_rs_{ty}_{n}(dd, a, db)")
                    } else {
                        format!("wg_ss_{ty}_{n}(dd, da, db)")
                    },
                ));
            }
        }
    }
    s
}

/// `wg_ss_{ty}_{n}(d, desc_a, desc_b)` and `wg_rs_{ty}_{n}(d, a, desc_b)`: one
/// wgmma.mma_async m64nNk16 with f32 accumulators D += A · B (scale-d = 1).
fn wgmma_wrappers(ty: &str, n: usize) -> String {
    let h = n / 2;
    let dlist = (0..h)
        .map(|i| format!("%{i}"))
        .collect::<Vec<_>>()
        .join(", ");
    let douts = (0..h)
        .map(|i| format!("\"+f\"(d[{i}])"))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "__device__ __forceinline__ void wg_ss_{ty}_{n}(float* d, unsigned long long da, \
         unsigned long long db) {{\n\
         asm volatile(\"{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{p}, 0;\\n\
         wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ty}.{ty} {{{dlist}}}, %{a}, %{b}, p, 1, 1, 0, 0;\\n}}\\n\"\n\
         : {douts} : \"l\"(da), \"l\"(db), \"r\"(1) : \"memory\");\n}}\n\
         __device__ __forceinline__ void wg_rs_{ty}_{n}(float* d, const unsigned* a, \
         unsigned long long db) {{\n\
         asm volatile(\"{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{p2}, 0;\\n\
         wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ty}.{ty} {{{dlist}}}, {{%{a0}, %{a1}, %{a2}, %{a3}}}, %{b2}, p, 1, 1, 0;\\n}}\\n\"\n\
         : {douts} : \"r\"(a[0]), \"r\"(a[1]), \"r\"(a[2]), \"r\"(a[3]), \"l\"(db), \"r\"(1) : \"memory\");\n}}\n",
        a = h,
        b = h + 1,
        p = h + 2,
        a0 = h,
        a1 = h + 1,
        a2 = h + 2,
        a3 = h + 3,
        b2 = h + 4,
        p2 = h + 5,
    )
}

const STATIC_SRC: &str = r#"
// Element (r, k) of a K-major 16-bit operand of R rows x 128 k in shared memory. mode 0: no
// swizzle, core matrices (8 rows x 8 k, 128 contiguous bytes) at (r / 8) * 2048 + (k / 8) * 128;
// mode 1: 128-byte swizzle, atoms of 8 rows x 64 k (1024 B, 16-byte chunk c of row r at chunk
// c ^ (r % 8)), the k halves one after the other (each R x 128 B).
__device__ __forceinline__ int probe_off(int r, int k, int R, int mode) {
    if (mode == 0) return (r >> 3) * 2048 + (k >> 3) * 128 + (r & 7) * 16 + (k & 7) * 2;
    return (k >> 6) * R * 128 + r * 128 + ((((k & 63) >> 3) ^ (r & 7)) << 4) + (k & 7) * 2;
}
// The descriptor of k16 step s of an operand of R rows at shared address base.
__device__ __forceinline__ unsigned long long probe_desc(unsigned base, int s, int R, int mode,
                                                        int lbo, int sbo) {
    const unsigned a = mode == 0 ? base + s * 256 : base + (s >> 2) * R * 128 + (s & 3) * 32;
    return (unsigned long long)((a & 0x3FFFF) >> 4)
         | ((unsigned long long)((lbo >> 4) & 0x3FFF) << 16)
         | ((unsigned long long)((sbo >> 4) & 0x3FFF) << 32)
         | ((unsigned long long)(mode == 1 ? 1 : 0) << 62);
}
__device__ __forceinline__ unsigned probe_pack(const unsigned short* p) {
    return (unsigned)p[0] | ((unsigned)p[1] << 16);
}
// The m16n8k16 A fragment of rows r0 .. r0 + 15, k step s, lane (g, t) (also wgmma's A from
// registers, warp w of the warpgroup holding rows 16 w ..).
__device__ __forceinline__ void probe_afrag(const unsigned short* A, int r0, int s, int g, int t,
                                            unsigned* a) {
    const int k0 = 16 * s + 2 * t;
    a[0] = probe_pack(A + (r0 + g) * 128 + k0);
    a[1] = probe_pack(A + (r0 + g + 8) * 128 + k0);
    a[2] = probe_pack(A + (r0 + g) * 128 + k0 + 8);
    a[3] = probe_pack(A + (r0 + g + 8) * 128 + k0 + 8);
}
template <bool BF>
__device__ __forceinline__ void probe_mma(float* d, const unsigned* a, unsigned b0, unsigned b1) {
    if (BF) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                     "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                     "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
}
// (a): the mma.sync chain. 128 threads; warp w rows 16 w .. 16 w + 15, every n8 tile;
// out[s][r][n] = the accumulator after step s.
template <bool BF>
__device__ void probe_mma_body(const unsigned short* A, const unsigned short* Bt, const float* C,
                               float* out, int N) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int r0 = 16 * w;
    for (int nt = 0; nt < N / 8; ++nt) {
        float d[4];
        for (int e = 0; e < 4; ++e) d[e] = C[(r0 + g + (e >= 2 ? 8 : 0)) * N + 8 * nt + 2 * t + (e & 1)];
        for (int s = 0; s < 8; ++s) {
            unsigned a[4];
            probe_afrag(A, r0, s, g, t, a);
            const unsigned short* b = Bt + (8 * nt + g) * 128 + 16 * s + 2 * t;
            probe_mma<BF>(d, a, probe_pack(b), probe_pack(b + 8));
            for (int e = 0; e < 4; ++e)
                out[(size_t)s * 64 * N + (r0 + g + (e >= 2 ? 8 : 0)) * N + 8 * nt + 2 * t + (e & 1)] = d[e];
        }
    }
}
extern "C" __global__ void __launch_bounds__(128) probe_mma_bf16(const unsigned short* A,
        const unsigned short* Bt, const float* C, float* out, int N) {
    probe_mma_body<true>(A, Bt, C, out, N);
}
extern "C" __global__ void __launch_bounds__(128) probe_mma_f16(const unsigned short* A,
        const unsigned short* Bt, const float* C, float* out, int N) {
    probe_mma_body<false>(A, Bt, C, out, N);
}
// Keep the compiler from moving accumulator accesses across the asynchronous wgmma.
__device__ __forceinline__ void probe_fence_reg(float& r) { asm volatile("" : "+f"(r)::"memory"); }
// (b): the wgmma chain of one warpgroup (128 threads) over N columns. Shared memory: A (64 x 256 B)
// then B (N x 256 B), in layout `mode`, from a 1024-aligned base (dynamic size at least 1024 +
// (64 + N) * 256; the host gives every launch the same, larger size). d: N / 2 accumulators per thread, the wgmma D fragment: for n8 block j, d[4j + e] is row
// 16 w + g (+ 8 for e >= 2), column 8 j + 2 t + (e & 1).
template <int N, typename F>
__device__ __forceinline__ void probe_wg_body(const unsigned short* A, const unsigned short* Bt,
                                              const float* C, float* out, int mode, int lbo,
                                              int sbo, float* d, bool rs, F wg) {
    extern __shared__ unsigned char probe_smem[];
    const unsigned raw = (unsigned)__cvta_generic_to_shared(probe_smem);
    const unsigned base = (raw + 1023u) & ~1023u;
    unsigned char* sm = probe_smem + (base - raw);
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, t = lane & 3;
    for (int i = tid; i < 64 * 128; i += 128) {
        const int r = i / 128, k = i % 128;
        *reinterpret_cast<unsigned short*>(sm + probe_off(r, k, 64, mode)) = A[i];
    }
    for (int i = tid; i < N * 128; i += 128) {
        const int r = i / 128, k = i % 128;
        *reinterpret_cast<unsigned short*>(sm + 64 * 256 + probe_off(r, k, N, mode)) = Bt[i];
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
#pragma unroll
    for (int i = 0; i < N / 2; ++i)
        d[i] = C[(16 * w + g + ((i & 3) >= 2 ? 8 : 0)) * N + 8 * (i >> 2) + 2 * t + (i & 1)];
    for (int s = 0; s < 8; ++s) {
        unsigned a[4];
        probe_afrag(A, 16 * w, s, g, t, a);
        const unsigned long long da = probe_desc(base, s, 64, mode, lbo, sbo);
        const unsigned long long db = probe_desc(base + 64 * 256, s, N, mode, lbo, sbo);
#pragma unroll
        for (int i = 0; i < N / 2; ++i) probe_fence_reg(d[i]);
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
        wg(d, a, da, db);
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#pragma unroll
        for (int i = 0; i < N / 2; ++i) probe_fence_reg(d[i]);
#pragma unroll
        for (int i = 0; i < N / 2; ++i)
            out[(size_t)s * 64 * N + (16 * w + g + ((i & 3) >= 2 ? 8 : 0)) * N + 8 * (i >> 2) + 2 * t + (i & 1)] = d[i];
    }
    (void)rs;
}
"#;

/// The probe compiled by NVRTC for `sm_90a` (wgmma needs the arch-specific target) to a cubin
/// (so ptxas runs here too), and NVRTC's log (ptxas `-v`: registers, spills).
fn compile_probe() -> Result<(Ptx, String), String> {
    use cudarc::nvrtc::{result, sys};
    use std::ffi::{CStr, CString};
    kiln::backend::cuda::device::require_nvrtc().map_err(|e| format!("{e}"))?;
    let src = CString::new(probe_source()).expect("no NUL");
    let name = CString::new("wgmma_probe.cu").expect("no NUL");
    let options: Vec<String> = vec![
        "--gpu-architecture=sm_90a".into(),
        "-std=c++17".into(),
        "--fmad=true".into(),
        "-default-device".into(),
        "--ptxas-options=-v".into(),
    ];
    let prog = result::create_program(&src, Some(&name)).map_err(|e| format!("{e:?}"))?;
    // SAFETY: `prog` was created above and is destroyed once at the end; `src` and `name`
    // outlive it; the cubin buffer is sized by nvrtcGetCUBINSize.
    unsafe {
        let compiled = result::compile_program(prog, &options);
        let log = result::get_program_log(prog)
            .map(|l| CStr::from_ptr(l.as_ptr()).to_string_lossy().into_owned())
            .unwrap_or_default();
        let out = match compiled {
            Err(e) => Err(format!("{e:?}: {log}")),
            Ok(()) => {
                let mut size = 0usize;
                sys::nvrtcGetCUBINSize(prog, &mut size)
                    .result()
                    .and_then(|()| {
                        let mut buf = vec![0u8; size];
                        sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr().cast())
                            .result()
                            .map(|()| buf)
                    })
                    .map(|b| (Ptx::from_binary(b), log))
                    .map_err(|e| format!("{e:?}"))
            }
        };
        let _ = result::destroy_program(prog);
        out
    }
}

/// A deterministic generator (splitmix64).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// An integer in lo..=hi.
    fn range(&mut self, lo: i32, hi: i32) -> i32 {
        lo + self.below((hi - lo + 1) as u64) as i32
    }
}

/// A 16-bit float type: its bits from (sign, unbiased exponent, mantissa bits) and back to f64.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Ty {
    Bf16,
    F16,
}
impl Ty {
    fn name(self) -> &'static str {
        match self {
            Ty::Bf16 => "bf16",
            Ty::F16 => "f16",
        }
    }
    /// (mantissa bits, exponent bias, largest biased exponent of a finite value).
    fn params(self) -> (u32, i32, i32) {
        match self {
            Ty::Bf16 => (7, 127, 254),
            Ty::F16 => (10, 15, 30),
        }
    }
    /// A value with unbiased exponent `e` (clamped to the normal range; `e` below it gives a
    /// subnormal), random mantissa and sign.
    fn random(self, rng: &mut Rng, e: i32) -> u16 {
        let (mb, bias, emax) = self.params();
        let sign = (rng.below(2) as u16) << 15;
        let man = rng.below(1 << mb) as u16;
        let be = (e + bias).clamp(0, emax) as u16;
        sign | (be << mb) | man
    }
    fn to_f64(self, v: u16) -> f64 {
        let (mb, bias, _) = self.params();
        let sign = if v >> 15 == 1 { -1.0 } else { 1.0 };
        let be = i32::from((v >> mb) & ((1 << (15 - mb)) - 1));
        let man = f64::from(v & ((1 << mb) - 1));
        let frac = man / f64::from(1u32 << mb);
        if be == 0 {
            sign * frac * 2f64.powi(1 - bias)
        } else {
            sign * (1.0 + frac) * 2f64.powi(be - bias)
        }
    }
    /// `x` rounded to the type's precision (the callers pass values it holds exactly: 4-bit
    /// integers times scales with 4 significant bits).
    fn exact(self, x: f64) -> u16 {
        let (mb, bias, _) = self.params();
        if x == 0.0 {
            return 0;
        }
        let sign = if x < 0.0 { 1u16 << 15 } else { 0 };
        let e = x.abs().log2().floor() as i32;
        let frac = (x.abs() / 2f64.powi(e) - 1.0) * f64::from(1u32 << mb);
        let man = (frac.round() as u16).min((1 << mb) - 1);
        let v = sign | (((e + bias) as u16) << mb) | man;
        assert_eq!(self.to_f64(v), x, "not exact in {}", self.name());
        v
    }
}

/// One operand case: A (64 × 128), B^T (N × 128) as bits, C (64 × N) f32.
struct Case {
    name: &'static str,
    a: Vec<u16>,
    bt: Vec<u16>,
    c: Vec<f32>,
}

fn random_f32(rng: &mut Rng, e: i32) -> f32 {
    let sign = (rng.below(2) as u32) << 31;
    let man = rng.below(1 << 23) as u32;
    let be = (e + 127).clamp(1, 254) as u32;
    f32::from_bits(sign | (be << 23) | man)
}

fn make_case(ty: Ty, name: &'static str, n: usize, seed: u64) -> Case {
    let mut rng = Rng(seed);
    let wide = ty == Ty::Bf16;
    let (mut a, mut bt) = (vec![0u16; M * K], vec![0u16; n * K]);
    let mut c = vec![0f32; M * n];
    match name {
        "uniform" => {
            a.iter_mut()
                .for_each(|v| *v = ty.random(&mut rng, rng_e(-4, 0)));
            bt.iter_mut()
                .for_each(|v| *v = ty.random(&mut rng, rng_e(-4, 0)));
        }
        "mixed" => {
            let r = if wide { 20 } else { 7 };
            for v in a.iter_mut().chain(bt.iter_mut()) {
                let e = Rng(rng.next()).range(-r, r);
                *v = ty.random(&mut rng, e);
            }
            let rc = if wide { 30 } else { 12 };
            for v in c.iter_mut() {
                let e = Rng(rng.next()).range(-rc, rc);
                *v = random_f32(&mut rng, e);
            }
        }
        "cancel" => {
            // Pairs (2j, 2j + 1): A equal, B opposite with the odd one's last mantissa bit
            // flipped at random, so each pair of products leaves a residue of ~1 ulp.
            for r in 0..M {
                for j in 0..K / 2 {
                    let e = rng.range(-3, 3);
                    let v = ty.random(&mut rng, e);
                    a[r * K + 2 * j] = v;
                    a[r * K + 2 * j + 1] = v;
                }
            }
            for r in 0..n {
                for j in 0..K / 2 {
                    let e = rng.range(-3, 3);
                    let v = ty.random(&mut rng, e);
                    bt[r * K + 2 * j] = v;
                    bt[r * K + 2 * j + 1] = (v ^ 0x8000) ^ (rng.below(2) as u16);
                }
            }
            for v in c.iter_mut() {
                let e = rng.range(-8, 8);
                *v = if rng.below(3) == 0 {
                    0.0
                } else {
                    random_f32(&mut rng, e)
                };
            }
        }
        "bigC" => {
            a.iter_mut()
                .for_each(|v| *v = ty.random(&mut rng, rng_e(-2, 2)));
            bt.iter_mut()
                .for_each(|v| *v = ty.random(&mut rng, rng_e(-2, 2)));
            for v in c.iter_mut() {
                let e = rng.range(20, 24);
                *v = random_f32(&mut rng, e);
            }
        }
        "w4" => {
            // Decoded 4-bit weights (q - 8) · s, s with a 3-bit mantissa (exact in 16 bits),
            // one scale per 32 k; activations ~2^-6..2^2 with 1% outliers ~2^6..2^8.
            for r in 0..M {
                for g in 0..K / 32 {
                    let s =
                        ty.exact(2f64.powi(rng.range(-9, -5)) * (1.0 + rng.below(8) as f64 / 8.0));
                    let sv = ty.to_f64(s);
                    for k in 0..32 {
                        let q = rng.range(0, 15) - 8;
                        a[r * K + g * 32 + k] = ty.exact(f64::from(q) * sv);
                    }
                }
            }
            for v in bt.iter_mut() {
                let e = if rng.below(100) == 0 {
                    rng.range(6, 8)
                } else {
                    rng.range(-6, 2)
                };
                *v = ty.random(&mut rng, e);
            }
        }
        "tiny" => {
            // Products near the f32 subnormal border (bf16) / f16 subnormal operands.
            let (lo, hi) = if wide { (-76, -60) } else { (-24, -10) };
            for v in a.iter_mut().chain(bt.iter_mut()) {
                let e = Rng(rng.next()).range(lo, hi);
                *v = ty.random(&mut rng, e);
            }
            if !wide {
                for v in c.iter_mut() {
                    let e = rng.range(-40, -20);
                    *v = random_f32(&mut rng, e);
                }
            }
        }
        _ => unreachable!("unknown case {name}"),
    }
    Case { name, a, bt, c }
}

/// A fixed exponent draw helper for the iterator closures above (a fresh generator per call
/// would repeat; use a thread-local counter instead).
fn rng_e(lo: i32, hi: i32) -> i32 {
    use std::cell::Cell;
    thread_local!(static S: Cell<u64> = const { Cell::new(12345) });
    S.with(|s| {
        let mut r = Rng(s.get());
        let v = r.range(lo, hi);
        s.set(r.0);
        v
    })
}

const CASES: [&str; 6] = ["uniform", "mixed", "cancel", "bigC", "w4", "tiny"];

/// max over the outputs after each step of |got - ref| / (Σ|a·b| + |c|) (f64 reference).
fn max_norm_err(ty: Ty, cs: &Case, n: usize, got: &[f32]) -> f64 {
    let af: Vec<f64> = cs.a.iter().map(|&v| ty.to_f64(v)).collect();
    let bf: Vec<f64> = cs.bt.iter().map(|&v| ty.to_f64(v)).collect();
    let mut worst = 0f64;
    for r in 0..M {
        for col in 0..n {
            let c = f64::from(cs.c[r * n + col]);
            let (mut acc, mut mag) = (c, c.abs());
            for s in 0..STEPS {
                for k in 16 * s..16 * s + 16 {
                    let p = af[r * K + k] * bf[col * K + k];
                    acc += p;
                    mag += p.abs();
                }
                let g = f64::from(got[s * M * n + r * n + col]);
                let err = if mag > 0.0 {
                    (g - acc).abs() / mag
                } else if g == 0.0 {
                    0.0
                } else {
                    f64::INFINITY
                };
                if !err.is_nan() {
                    worst = worst.max(err);
                } else {
                    worst = f64::INFINITY;
                }
            }
        }
    }
    worst
}

/// Compiles the probe (no GPU): the source is valid PTX for sm_90a.
#[test]
fn probe_source_compiles() {
    if kiln::backend::cuda::device::require_nvrtc().is_err() {
        eprintln!("SKIPPED: NVRTC missing: run `eval \"$(scripts/nvrtc-setup)\"` first");
        return;
    }
    let (_, log) = compile_probe().expect("the probe compiles");
    println!("{log}");
}

#[test]
#[ignore = "needs an sm_90 GPU: see the header"]
fn wgmma_matches_mma_sync_bit_for_bit() {
    let ctx = CudaContext::new(0).expect("context");
    let cc = ctx.compute_capability().expect("cc");
    assert_eq!(cc, (9, 0), "wgmma (sm_90a) needs an sm_90 GPU");
    let t0 = std::time::Instant::now();
    let (ptx, _) = compile_probe().expect("compile");
    println!(
        "RESULT wgmma_probe compile_s={:.1}",
        t0.elapsed().as_secs_f64()
    );
    let module = ctx.load_module(ptx).expect("load");
    let stream = ctx.default_stream();
    let mut failures = Vec::new();
    let mut total_words = 0usize;
    for ty in [Ty::Bf16, Ty::F16] {
        let mma = module
            .load_function(&format!("probe_mma_{}", ty.name()))
            .expect("mma entry");
        // Validity of each (kind, layout) over every case and N: its worst error.
        let mut valid_worst = std::collections::BTreeMap::new();
        for (ci, case) in CASES.iter().enumerate() {
            for n in NS {
                let cs = make_case(ty, case, n, 1000 + 17 * ci as u64 + n as u64);
                let a = stream.clone_htod(&cs.a).expect("a");
                let bt = stream.clone_htod(&cs.bt).expect("b");
                let c = stream.clone_htod(&cs.c).expect("c");
                let words = STEPS * M * n;
                let mut ref_out = stream.alloc_zeros::<f32>(words).expect("out");
                let ni = n as i32;
                let cfg = LaunchConfig {
                    grid_dim: (1, 1, 1),
                    block_dim: (128, 1, 1),
                    shared_mem_bytes: 0,
                };
                let mut b = stream.launch_builder(&mma);
                b.arg(&a).arg(&bt).arg(&c).arg(&mut ref_out).arg(&ni);
                // SAFETY: A is 64 × 128, Bt n × 128, C 64 × n, out 8 × 64 × n elements, as the
                // kernel reads and writes them; one block of 128 threads.
                unsafe { b.launch(cfg) }.expect("mma launch");
                let want = stream.clone_dtoh(&ref_out).expect("copy");
                let mma_err = max_norm_err(ty, &cs, n, &want);
                for kind in ["rs", "ss"] {
                    let f = module
                        .load_function(&format!("probe_wg_{kind}_{}_{n}", ty.name()))
                        .expect("wg entry");
                    // The largest of any layout's reach (the swapped no-swizzle fields read up
                    // to ~2.3 KB past a small B), for every n: a wrong layout must read
                    // garbage, not fault.
                    let smem: usize = 1024 + (64 + 256) * 256 + 8192;
                    f.set_attribute(
                        cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        smem as i32,
                    )
                    .expect("smem attribute");
                    for l in LAYOUTS {
                        let mut out = stream.alloc_zeros::<f32>(words).expect("out");
                        let cfg = LaunchConfig {
                            grid_dim: (1, 1, 1),
                            block_dim: (128, 1, 1),
                            shared_mem_bytes: smem as u32,
                        };
                        let mut b = stream.launch_builder(&f);
                        b.arg(&a)
                            .arg(&bt)
                            .arg(&c)
                            .arg(&mut out)
                            .arg(&l.mode)
                            .arg(&l.lbo)
                            .arg(&l.sbo);
                        // SAFETY: as above; `smem` bytes of dynamic shared memory hold the
                        // 1024-aligned A (64 × 256 B) and B (n × 256 B) in either layout.
                        unsafe { b.launch(cfg) }.expect("wg launch");
                        let got = stream.clone_dtoh(&out).expect("copy");
                        let err = max_norm_err(ty, &cs, n, &got);
                        let key = (kind, l.name);
                        // "tiny": the tensor cores may flush subnormal products (then both
                        // chains are far from the f64 sum); valid there when as close as the
                        // mma chain and valid on every earlier case (tiny runs last).
                        let valid = if cs.name == "tiny" {
                            err <= f64::max(1e-3, 2.0 * mma_err)
                                && valid_worst.get(&key).is_some_and(|w| *w <= 1e-3)
                        } else {
                            // Valid on every earlier case too: a large C can hide a wrong
                            // layout's error ("bigC"; run 2 compared the swapped fields there).
                            let before = valid_worst.get(&key).copied();
                            let e = valid_worst.entry(key).or_insert(0f64);
                            *e = f64::max(*e, err);
                            err <= 1e-3 && before.is_none_or(|w| w <= 1e-3)
                        };
                        if !valid {
                            println!(
                                "RESULT wgmma_probe ty={} case={} n={n} kind={kind} layout={} \
                                 valid=no wg_err={err:.3e} mma_err={mma_err:.3e}",
                                ty.name(),
                                cs.name,
                                l.name
                            );
                            continue;
                        }
                        total_words += words;
                        let mut diff = 0usize;
                        let mut per_step = [0usize; STEPS];
                        let mut max_ulp = 0i64;
                        let mut examples = Vec::new();
                        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                            if g.to_bits() != w.to_bits() {
                                diff += 1;
                                per_step[i / (M * n)] += 1;
                                let ulp = (i64::from(g.to_bits() as i32)
                                    - i64::from(w.to_bits() as i32))
                                .abs();
                                max_ulp = max_ulp.max(ulp);
                                if examples.len() < 3 {
                                    let s = i / (M * n);
                                    let (r, col) = ((i % (M * n)) / n, i % n);
                                    examples.push(format!(
                                        "(k={} r={r} n={col} wg={g:e} mma={w:e})",
                                        16 * (s + 1)
                                    ));
                                }
                            }
                        }
                        println!(
                            "RESULT wgmma_probe ty={} case={} n={n} kind={kind} layout={} \
                             valid=yes words={words} differ={diff} max_ulp={max_ulp} \
                             per_k16_step={per_step:?} wg_err={err:.3e} mma_err={mma_err:.3e} {}",
                            ty.name(),
                            cs.name,
                            l.name,
                            examples.join(" ")
                        );
                        if diff > 0 {
                            failures.push(format!(
                                "{} {} n={n} {kind} {}: {diff} of {words} differ",
                                ty.name(),
                                cs.name,
                                l.name
                            ));
                        }
                    }
                }
            }
        }
        for ((kind, layout), worst) in &valid_worst {
            println!(
                "RESULT wgmma_probe_layout ty={} kind={kind} layout={layout} worst_err={worst:.3e} valid={}",
                ty.name(),
                if *worst <= 1e-3 { "yes" } else { "no" }
            );
        }
        for kind in ["rs", "ss"] {
            let any = LAYOUTS
                .iter()
                .any(|l| valid_worst.get(&(kind, l.name)).is_some_and(|w| *w <= 1e-3));
            if !any {
                failures.push(format!("{} {kind}: no layout gave the product", ty.name()));
            }
        }
    }
    println!(
        "RESULT wgmma_probe summary compared_words={total_words} failures={}",
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
