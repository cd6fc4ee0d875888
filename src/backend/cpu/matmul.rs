//! Matrix products with stored weights: `out[m, n] = x[m, k] · W[n, k]ᵀ`, where `x` holds f32
//! activations and `W` is a checkpoint tensor in its stored encoding (F32, F16, BF16, Q8_0,
//! Q4_0, Q4_1, Q4_K, Q6_K), read straight from its blocks: no f32 copy of a weight matrix is
//! ever made, only of a few rows at a time.
//!
//! Two modes ([`MatmulMode`]):
//! - **Exact** (the default, and what `kiln probe` uses): every weight is dequantized exactly as
//!   ggml's reference does (the same f32 operations, bit for bit) and multiplied with the f32
//!   activations; sums in f32.
//! - **Fast**: llama.cpp's trick. Each activation row is quantized to 8-bit blocks of 32 with an
//!   f32 scale ([`fast`]), and the Q8_0 / Q4_0 / Q4_1 blocks are dotted with it in integers
//!   (AVX-512 VNNI `vpdpbusd`, AVX2 `vpmaddubsw`). The results differ from exact by the
//!   activation rounding (up to half a step of 1/127 of each block's largest value). Other
//!   dtypes run exact.
//!
//! Kernels per instruction set ([`Isa`], picked once at run time): AVX-512 (F + BW, + VNNI for
//! the fast mode), AVX2 + FMA + F16C, and portable scalar code. Shapes:
//! - batch 1 (GEMV, memory bound): a fused dequantize-and-dot per weight row, several rows at
//!   once so one activation load feeds several rows;
//! - batch m > 1: the weight rows of a task are dequantized once into an f32 panel, and a
//!   register-tiled micro-kernel (`MR` activation rows × `NR` weight rows) reuses it for all
//!   `m` activation rows, in blocks of `MC` rows so the activations stay in cache.
//!
//! Threads: rayon over groups of weight rows (output columns), on the current pool — the
//! global one, or the caller's through [`matmul_in`] / `ThreadPool::install`.
//!
//! **Batch invariance.** Each output element is one dot product whose summation order depends
//! only on `k` and the ISA: one vector accumulator of `LANES` f32 lanes per dot, fed in `k`
//! order, then a fixed horizontal reduction. The GEMV and the tiled path, every tile position
//! and every thread split compute the same bits, so a row's result does not depend on `m` or on
//! the other rows of the batch (tested below).

/// `match (mr, nr)` over every pair of the literal lists, calling `$f::<M, N>(args…)`: turns
/// run-time tile edges into const-generic kernel instances.
macro_rules! tile_dispatch {
    ($f:ident, $mr:expr, $nr:expr, $args:tt, [$($m:literal),*], $ns:tt) => {
        match $mr {
            $($m => tile_dispatch!(@n $f, $m, $nr, $args, $ns),)*
            _ => unreachable!("tile rows"),
        }
    };
    (@n $f:ident, $m:literal, $nr:expr, $args:tt, [$($n:literal),*]) => {
        match $nr {
            $($n => $f::<$m, $n> $args,)*
            _ => unreachable!("tile columns"),
        }
    };
}

mod fast;
mod hugepages;
mod layout;
pub mod packed;
mod scalar;
#[cfg(target_arch = "x86_64")]
mod x86_avx2;
#[cfg(target_arch = "x86_64")]
mod x86_avx2_fast;
#[cfg(target_arch = "x86_64")]
mod x86_avx512;
#[cfg(target_arch = "x86_64")]
mod x86_avx512_fast;

#[cfg(test)]
mod tests;

use std::cell::RefCell;
use std::sync::OnceLock;

use rayon::prelude::*;

use crate::tensor::{TensorView, WeightDType};

pub use hugepages::HugePageBytes;

/// How activations meet the weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum MatmulMode {
    /// f32 activations × exactly dequantized weights, f32 sums.
    #[default]
    Exact,
    /// Activations quantized to 8-bit blocks, integer dots for Q8_0 / Q4_0 / Q4_1 weights
    /// (exact for the other dtypes).
    Fast,
}

/// A CPU instruction set the kernels are written for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Isa {
    /// Portable Rust, no intrinsics.
    Scalar,
    /// x86-64 AVX2 + FMA + F16C (256-bit).
    Avx2,
    /// x86-64 AVX-512 F + BW (512-bit); VNNI, when present, for the fast mode.
    Avx512,
}

impl MatmulMode {
    /// The mode [`matmul`] uses: [`MatmulMode::Exact`], unless the environment variable
    /// `KILN_CPU_MATMUL` is `fast` (read once; for benchmarks until the engine config carries
    /// it). Unset, everything (`kiln probe` included) is exact.
    pub fn from_env() -> MatmulMode {
        static MODE: OnceLock<MatmulMode> = OnceLock::new();
        *MODE.get_or_init(|| match std::env::var("KILN_CPU_MATMUL").as_deref() {
            Ok("fast") => MatmulMode::Fast,
            _ => MatmulMode::Exact,
        })
    }
}

impl Isa {
    /// Stable lowercase name (`scalar`, `avx2`, `avx512`).
    pub fn as_str(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }

    /// Every instruction set this CPU runs, slowest first.
    pub fn available() -> Vec<Isa> {
        [Isa::Scalar, Isa::Avx2, Isa::Avx512]
            .into_iter()
            .filter(|isa| isa.is_supported())
            .collect()
    }

    /// Whether this CPU runs `self`.
    pub fn is_supported(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => x86_avx2::Avx2::detect().is_some(),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => x86_avx512::Avx512::detect().is_some(),
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Avx2 | Isa::Avx512 => false,
        }
    }

    /// The fastest instruction set of this CPU (detected once). The environment variable
    /// `KILN_CPU_ISA` (`scalar`, `avx2`, `avx512`) caps it, for benchmarks and debugging.
    pub fn best() -> Isa {
        static BEST: OnceLock<Isa> = OnceLock::new();
        *BEST.get_or_init(|| {
            let best = *Isa::available().last().unwrap_or(&Isa::Scalar);
            let cap = std::env::var("KILN_CPU_ISA")
                .ok()
                .and_then(|v| v.parse::<Isa>().ok());
            match cap {
                Some(cap) if cap < best => cap,
                _ => best,
            }
        })
    }
}

impl std::str::FromStr for Isa {
    type Err = String;
    fn from_str(s: &str) -> Result<Isa, String> {
        match s {
            "scalar" => Ok(Isa::Scalar),
            "avx2" => Ok(Isa::Avx2),
            "avx512" => Ok(Isa::Avx512),
            other => Err(format!(
                "unknown instruction set `{other}` (expected scalar, avx2 or avx512)"
            )),
        }
    }
}

impl std::fmt::Display for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `out[i, j] = Σ_t x[i, t] · w[j, t]` in [`MatmulMode::from_env`] (exact unless
/// `KILN_CPU_MATMUL=fast`), fastest instruction set, current rayon pool.
///
/// `x`: `[m, k]` row-major f32; `w`: `shape = [n, k]` in any [`WeightDType`] (`k` a whole
/// number of its blocks); `out`: `[m, n]` row-major, overwritten.
///
/// # Panics
/// If the lengths do not match the shapes (a bug in the caller).
pub fn matmul(x: &[f32], m: usize, k: usize, w: &TensorView<'_>, out: &mut [f32]) {
    matmul_on(Isa::best(), MatmulMode::from_env(), x, m, k, w, out);
}

/// [`matmul`] in the given mode.
pub fn matmul_with(
    x: &[f32],
    m: usize,
    k: usize,
    w: &TensorView<'_>,
    out: &mut [f32],
    mode: MatmulMode,
) {
    matmul_on(Isa::best(), mode, x, m, k, w, out);
}

/// [`matmul_with`] on the threads of `pool`.
pub fn matmul_in(
    pool: &rayon::ThreadPool,
    x: &[f32],
    m: usize,
    k: usize,
    w: &TensorView<'_>,
    out: &mut [f32],
    mode: MatmulMode,
) {
    pool.install(|| matmul_with(x, m, k, w, out, mode));
}

/// [`matmul_with`] on a chosen instruction set (benchmarks and tests).
///
/// # Panics
/// If this CPU does not run `isa`, or the lengths do not match the shapes.
pub fn matmul_on(
    isa: Isa,
    mode: MatmulMode,
    x: &[f32],
    m: usize,
    k: usize,
    w: &TensorView<'_>,
    out: &mut [f32],
) {
    let shape = Shape::check(x, m, k, w, out);
    if shape.m == 0 || shape.n == 0 {
        return;
    }
    if shape.k == 0 {
        out.fill(0.0);
        return;
    }
    let fast_dtype = matches!(
        shape.dtype,
        WeightDType::Q8_0 | WeightDType::Q4_0 | WeightDType::Q4_1
    );
    if mode == MatmulMode::Fast && fast_dtype {
        match isa {
            Isa::Scalar => integer(fast::ScalarFast, &shape, x, w.data, out),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                let kern =
                    x86_avx2_fast::Avx2Fast::detect().expect("this CPU has no AVX2 + FMA + F16C");
                integer(kern, &shape, x, w.data, out)
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => match x86_avx512_fast::Avx512Fast::detect() {
                Some(kern) => integer(kern, &shape, x, w.data, out),
                // AVX-512 without VNNI: the AVX2 integer kernels.
                None => {
                    let kern = x86_avx2_fast::Avx2Fast::detect()
                        .expect("this CPU has no AVX2 + FMA + F16C");
                    integer(kern, &shape, x, w.data, out)
                }
            },
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Avx2 | Isa::Avx512 => panic!("{isa} kernels exist only on x86-64"),
        }
        return;
    }
    match isa {
        Isa::Scalar => exact(scalar::Scalar, &shape, x, w.data, out),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => {
            let kern = x86_avx2::Avx2::detect().expect("this CPU has no AVX2 + FMA + F16C");
            exact(kern, &shape, x, w.data, out)
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => {
            let kern = x86_avx512::Avx512::detect().expect("this CPU has no AVX-512 F + BW");
            exact(kern, &shape, x, w.data, out)
        }
        #[cfg(not(target_arch = "x86_64"))]
        Isa::Avx2 | Isa::Avx512 => panic!("{isa} kernels exist only on x86-64"),
    }
}

/// Checked dimensions of one product.
#[derive(Debug, Clone, Copy)]
struct Shape {
    /// Activation rows.
    m: usize,
    /// Weight rows (output columns).
    n: usize,
    /// Inner dimension.
    k: usize,
    /// Stored bytes of one weight row.
    row_bytes: usize,
    /// Weight encoding.
    dtype: WeightDType,
}

impl Shape {
    fn check(x: &[f32], m: usize, k: usize, w: &TensorView<'_>, out: &[f32]) -> Shape {
        assert_eq!(
            w.shape.len(),
            2,
            "matmul weight must be 2-D, got {:?}",
            w.shape
        );
        let (n, wk) = (w.shape[0], w.shape[1]);
        assert_eq!(wk, k, "matmul: x has k = {k}, weight shape {:?}", w.shape);
        let row_bytes = w.dtype.row_bytes(k).unwrap_or_else(|| {
            panic!(
                "matmul: k = {k} is not a whole number of {:?} blocks",
                w.dtype
            )
        });
        assert_eq!(x.len(), m * k, "matmul: x is not [{m}, {k}]");
        assert_eq!(out.len(), m * n, "matmul: out is not [{m}, {n}]");
        assert_eq!(
            w.data.len(),
            n * row_bytes,
            "matmul: weight bytes do not match {:?}",
            w.shape
        );
        Shape {
            m,
            n,
            k,
            row_bytes,
            dtype: w.dtype,
        }
    }
}

/// The exact kernels of one instruction set. Implementors are zero-sized tokens that can only
/// be made when the CPU runs the instructions, so the methods are safe to call.
///
/// Contract shared by every method: a dot product is summed in `LANES` f32 lanes (lane `l`
/// takes the terms `t ≡ l mod LANES` in increasing `t`, one multiply-add each, starting from
/// +0.0) and the lanes are then reduced in a fixed order, so `gemv` and `tile` agree bit for bit.
trait ExactKernels: Copy + Send + Sync {
    /// f32 lanes of one accumulator (panel rows are padded to a multiple of it).
    const LANES: usize;
    /// Activation rows of a register tile.
    const MR: usize;
    /// Weight rows of a register tile.
    const NR: usize;

    /// Exactly dequantize the stored row `row` into `out` (`out.len()` = k).
    fn dequant_row(self, dtype: WeightDType, row: &[u8], out: &mut [f32]);

    /// Whether [`ExactKernels::gemv`] has a fused kernel for `dtype`.
    fn has_gemv(self, dtype: WeightDType) -> bool;

    /// `out[r] = dot(x, W_r)` for the `out.len()` stored rows at `rows` (each `row_bytes`),
    /// dequantizing on the fly.
    ///
    /// # Panics
    /// If `!self.has_gemv(dtype)`.
    fn gemv(self, dtype: WeightDType, rows: &[u8], row_bytes: usize, x: &[f32], out: &mut [f32]);

    /// `out[i · nr + j] = dot(x_i, panel_j)` for `i < mr ≤ MR`, `j < nr ≤ NR`, where
    /// `x_i = x[i·k .. i·k + k]` and `panel_j = panel[j·kp .. j·kp + k]`, zero from `k` to `kp`.
    fn tile(
        self,
        x: &[f32],
        k: usize,
        mr: usize,
        panel: &[f32],
        kp: usize,
        nr: usize,
        out: &mut [f32],
    );
}

/// The fast mode's integer-dot kernels of one instruction set (tokens, as [`ExactKernels`]).
/// Each dot's result depends only on its two rows, never on the tile around it.
trait FastKernels: Copy + Send + Sync {
    /// Activation rows of a register tile.
    const MR: usize;
    /// Weight rows of a register tile.
    const NR: usize;

    /// Quantize the `m` rows of `x` (`[m, k]`); bit-identical to [`fast::QuantizedRows::new`].
    fn quantize(self, x: &[f32], m: usize, k: usize) -> fast::QuantizedRows {
        fast::QuantizedRows::new(x, m, k)
    }

    /// `out[i · nr + j] = dot(activation row i0 + i of a, stored row j of rows)` for
    /// `i < mr ≤ MR`, `j < nr ≤ NR`; `dtype` is Q8_0, Q4_0 or Q4_1, rows `rb` bytes apart.
    fn tile(
        self,
        dtype: WeightDType,
        rows: &[u8],
        rb: usize,
        nr: usize,
        a: &fast::QuantizedRows,
        i0: usize,
        mr: usize,
        out: &mut [f32],
    );
}

/// Minimum multiply-adds per parallel task; smaller products run on the calling thread.
const MIN_TASK_MACS: usize = 1 << 15;

/// Activation rows per cache block of the tiled path.
const MC: usize = 64;

/// Target f32 panel size per task (weight rows × padded k), so a task's panel stays in L2.
const PANEL_FLOATS: usize = 64 * 1024;

thread_local! {
    /// Per-thread scratch for dequantized weight panels (reused across calls).
    static PANEL: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Number of parallel tasks for `units` independent units of `macs_per_unit` each.
fn task_count(units: usize, macs_per_unit: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    if threads == 1 || units * macs_per_unit < 2 * MIN_TASK_MACS {
        return 1;
    }
    let by_size = (units * macs_per_unit / MIN_TASK_MACS).max(1);
    by_size.min(4 * threads).min(units)
}

/// Exact product on kernel set `K`.
fn exact<K: ExactKernels>(kern: K, s: &Shape, x: &[f32], w: &[u8], out: &mut [f32]) {
    if s.m == 1 && kern.has_gemv(s.dtype) {
        let rb = s.row_bytes;
        let tasks = task_count(s.n, s.k);
        if tasks == 1 {
            kern.gemv(s.dtype, w, rb, x, out);
        } else {
            let chunk = s.n.div_ceil(tasks).next_multiple_of(8);
            out.par_chunks_mut(chunk).enumerate().for_each(|(c, o)| {
                let j0 = c * chunk;
                kern.gemv(s.dtype, &w[j0 * rb..(j0 + o.len()) * rb], rb, x, o);
            });
        }
        return;
    }
    tiled(kern, s, x, w, out);
}

/// The panel path: tasks own groups of weight rows, dequantize them once, and run every
/// activation row against them.
fn tiled<K: ExactKernels>(kern: K, s: &Shape, x: &[f32], w: &[u8], out: &mut [f32]) {
    let kp = s.k.next_multiple_of(K::LANES);
    let groups = s.n.div_ceil(K::NR);
    let tasks = task_count(groups, K::NR * s.k * s.m);
    // Weight rows per task: a whole number of NR groups, at most about PANEL_FLOATS floats.
    let max_rows = (PANEL_FLOATS / kp).max(K::NR) / K::NR * K::NR;
    let rows_per_task = (groups.div_ceil(tasks) * K::NR).min(max_rows);
    let n_tasks = s.n.div_ceil(rows_per_task);
    let out_ptr = OutPtr(out.as_mut_ptr());
    let run = |t: usize| {
        let j0 = t * rows_per_task;
        let j1 = (j0 + rows_per_task).min(s.n);
        PANEL.with(|panel| {
            let mut panel = panel.borrow_mut();
            let need = (j1 - j0) * kp;
            if panel.len() < need {
                panel.resize(need, 0.0);
            }
            let panel = &mut panel[..need];
            for (r, prow) in panel.chunks_exact_mut(kp).enumerate() {
                let j = j0 + r;
                let (vals, pad) = prow.split_at_mut(s.k);
                kern.dequant_row(s.dtype, &w[j * s.row_bytes..(j + 1) * s.row_bytes], vals);
                pad.fill(0.0);
            }
            let mut res = [0.0f32; 64];
            for i0 in (0..s.m).step_by(MC) {
                let i1 = (i0 + MC).min(s.m);
                for jb in (j0..j1).step_by(K::NR) {
                    let nr = K::NR.min(j1 - jb);
                    let p = &panel[(jb - j0) * kp..];
                    for ib in (i0..i1).step_by(K::MR) {
                        let mr = K::MR.min(i1 - ib);
                        kern.tile(&x[ib * s.k..], s.k, mr, p, kp, nr, &mut res);
                        for i in 0..mr {
                            for j in 0..nr {
                                // SAFETY: (ib + i, jb + j) is inside [m, n], and column jb + j
                                // belongs to this task's rows j0..j1 only, so no two tasks write
                                // the same element; `out` outlives the parallel loop.
                                unsafe { out_ptr.write((ib + i) * s.n + jb + j, res[i * nr + j]) };
                            }
                        }
                    }
                }
            }
        });
    };
    if n_tasks == 1 {
        run(0);
    } else {
        (0..n_tasks).into_par_iter().for_each(run);
    }
}

/// Fast-mode product: tasks own groups of weight rows and run every quantized activation row
/// against them, straight from the stored blocks.
fn integer<K: FastKernels>(kern: K, s: &Shape, x: &[f32], w: &[u8], out: &mut [f32]) {
    let a = &kern.quantize(x, s.m, s.k);
    let groups = s.n.div_ceil(K::NR);
    let tasks = task_count(groups, K::NR * s.k * s.m);
    let rows_per_task = groups.div_ceil(tasks) * K::NR;
    let n_tasks = s.n.div_ceil(rows_per_task);
    let out_ptr = OutPtr(out.as_mut_ptr());
    let run = |t: usize| {
        let j0 = t * rows_per_task;
        let j1 = (j0 + rows_per_task).min(s.n);
        let mut res = [0.0f32; 64];
        for i0 in (0..s.m).step_by(MC) {
            let i1 = (i0 + MC).min(s.m);
            for jb in (j0..j1).step_by(K::NR) {
                let nr = K::NR.min(j1 - jb);
                let rows = &w[jb * s.row_bytes..(jb + nr) * s.row_bytes];
                for ib in (i0..i1).step_by(K::MR) {
                    let mr = K::MR.min(i1 - ib);
                    kern.tile(s.dtype, rows, s.row_bytes, nr, a, ib, mr, &mut res);
                    for i in 0..mr {
                        for j in 0..nr {
                            // SAFETY: as in `tiled`: in bounds, and column jb + j is this
                            // task's alone.
                            unsafe { out_ptr.write((ib + i) * s.n + jb + j, res[i * nr + j]) };
                        }
                    }
                }
            }
        }
    };
    if n_tasks == 1 {
        run(0);
    } else {
        (0..n_tasks).into_par_iter().for_each(run);
    }
}

/// The output buffer shared by tasks that write disjoint columns.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);

// SAFETY: tasks write disjoint elements (see `OutPtr::write` callers), and the buffer is a
// `&mut [f32]` borrowed for the whole parallel loop.
unsafe impl Send for OutPtr {}
// SAFETY: as above; the pointer is only written through, never read, and never to the same
// element from two tasks.
unsafe impl Sync for OutPtr {}

impl OutPtr {
    /// Store `v` at element `idx`.
    ///
    /// # Safety
    /// `idx` is in bounds of the borrowed buffer and no other task writes it.
    #[inline(always)]
    unsafe fn write(self, idx: usize, v: f32) {
        // SAFETY: guaranteed by the caller.
        unsafe { *self.0.add(idx) = v };
    }
}
