//! The batch-invariant dense matmuls (`kernels/dense.cu`): `out = x · wᵀ` for dense 16-bit
//! weights with one fixed f32 reduction order per output element, whatever the number of rows,
//! so a token's logits do not depend on the batch it rides in. Two kernel families:
//! - `mma` (sm_80+, f16 / bf16): `dense_mma_small_rg{1,2,4,8}` (≤ 64 rows: warps over K slices,
//!   the slice partials summed in slice order through shared memory; tiles of 16 outputs × 8 /
//!   16 / 32 / 64 rows and the wide 32 × 64 rg8w, picked per launch by `dense/mid.rs`'s
//!   [`MidRows`] (`KILN_DENSE_MID`: a warp budget over the grid by default; the vocabulary-sized
//!   lm_head takes the GEMM from 17 rows) within the block size the function's registers allow
//!   (`dense/entry.rs`)) and, above 64 rows, the
//!   pipelined GEMM of `dense_gemm.cu` (`dense_gemm.rs`; `KILN_DENSE_GEMM=0`: `dense_mma_large`,
//!   128 × 64 tiles without staging), all `mma.sync.m16n8k16` over the same fragments and the
//!   same K slices (a function of K alone, [`slice_blocks`]), so they agree bit for bit;
//! - `fma`: `dense_xwt`, CUDA cores (every arch; what `mma` falls back to on sm_70 / sm_75).
//!
//! Chosen per backend at creation by `KILN_DENSE_MATMUL` ([`DenseMatmul::from_env`]), never per
//! step, so every step of a run has the same numerics. Unset, [`DenseMatmul::default_for`] picks
//! a batch-invariant kernel for a 16-bit compute dtype — `mma` on sm_80+, `fma` below — and
//! cuBLAS for f32.
//!
//! THE FUSED DECODE OPS (`norm_matmul`, `norm_gate_up_swiglu`, `matmul_residual`,
//! `norm_matmul_rope_write`: the small `mma` kernel with the RMSNorm prologue, the residual-add
//! epilogue or the RoPE / KV-write epilogue, see dense.cu; their launches are in `fused.rs` and
//! `dense_rope.rs`) run the llama layers of steps of at most
//! [`CudaBackend::fused_decode_limit`] tokens: `KILN_FUSED_DECODE_ROWS` ([`fused_rows_from_env`],
//! `0` = off, at most [`MMA_SMALL_MAX_ROWS`]). Under `mma` the default is
//! [`DEFAULT_FUSED_DECODE_ROWS_MMA`] and the whole path is batch-invariant: the fused ops compute
//! every value the unfused ones do with the same operations (the prologue's 1 / rms and
//! `rms_norm.cu`'s f32-stream norms share common.cuh's `rms_row_sumsq` / `rms_inv`; the epilogues'
//! residual add, SwiGLU and RoPE are the unfused ops' roundings), so a row's bits do not depend
//! on whether its step ran fused or not (`tests/cuda_fused_invariance.rs`). Under cuBLAS the
//! default is [`DEFAULT_FUSED_DECODE_ROWS`]: decode steps up to that size are batch-invariant
//! among themselves (one kernel, one reduction order per row) but larger steps (prefill, big
//! batches) take cuBLAS, whose kernel and order depend on the row count: NOT batch-invariant.
//! Under `fma` the default is 0 (the fused ops are `mma` kernels, the unfused ones `fma`: two
//! numeric paths), unless `KILN_FUSED_DECODE_ROWS` is set.
//!
//! PROGRAMMATIC DEPENDENT LAUNCH: on sm_90 kernels (`arch.major >= 9`) the small `mma` kernels are
//! launched with the programmatic-stream-serialization attribute (`cuLaunchKernelEx`), so each
//! one's weight loads and launch overlap the previous kernel's tail (dense.cu waits with
//! `griddepcontrol.wait` before touching activations). `KILN_PDL=0` turns it off. Shape rules: `k` a multiple of 8 and
//! 16-byte aligned operands (one 128-bit load per lane per step); a weight that breaks them (or
//! f32 compute) takes cuBLAS, a choice that depends on the weight only.

use std::ffi::c_void;

use cudarc::driver::{CudaFunction, LaunchConfig, PushKernelArg};

use super::{dev_err, CudaBackend, CudaBuffer, CudaWeight};
use crate::backend::BackendError;

/// Rows per block tile and warps (output columns) per block of `dense_xwt`; must equal
/// `DENSE_ROWS` / `DENSE_WARPS` in dense.cu.
const DENSE_ROWS: u32 = 8;
const DENSE_WARPS: u32 = 4;

mod entry;
mod mid;
mod options;
pub(crate) use entry::{fitting_tile, MmaKernels, SmallFn};
pub use entry::{small_shared_bytes, MMA_ROW_GROUPS, MMA_SMALL_MAX_SHARED};
pub use mid::MidRows;
pub use options::{
    fused_rows_from_env, pdl_from_env, DenseMatmul, DEFAULT_FUSED_DECODE_ROWS, MMA_SMALL_MAX_ROWS,
};

/// A kernel of the `mma` family, for tests and benchmarks that compare them
/// ([`CudaBackend::matmul_dense_mma_with`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MmaKernel {
    /// `dense_mma_small_rg{1,2,4,8}` (the row group by the row count and [`MidRows`]).
    Small,
    /// `dense_mma_small_rg{N}` with this row group (1, 2, 4 or 8) at any row count.
    SmallRg(usize),
    /// `dense_mma_small_rg8w`: the 64-row tile over 32 outputs per block (K ≤ 1024).
    SmallWide,
    /// `dense_mma_large`.
    Large,
    /// The pipelined GEMM of `dense_gemm.cu`, tile by `GemmTile::auto` (dense_gemm.rs).
    Gemm,
    /// The same with this tile.
    GemmTile(super::dense_gemm::GemmTile),
}

/// K blocks (of 32 columns) per K slice of the `mma` kernels: at least 4, and at most 16 slices;
/// a function of `k` alone (the batch invariance rests on it). k = 576: 4 (5 slices), 1 536: 4
/// (12 slices), 8 192: 16 (16 slices).
pub fn slice_blocks(k: usize) -> usize {
    let kb = k.div_ceil(32);
    kb.div_ceil(16).max(4)
}

impl CudaBackend {
    /// The dense kernel family this backend runs (what `KILN_DENSE_MATMUL` asked for, `mma`
    /// made `fma` where there are no tensor-core kernels).
    pub fn dense_matmul_kind(&self) -> DenseMatmul {
        self.dense
    }

    /// Whether a dense kernel (not cuBLAS) takes `w` (see the module header).
    pub(super) fn dense_takes(&self, w: &CudaWeight) -> bool {
        self.dense != DenseMatmul::Cublas
            && self.k.dense_xwt.is_some()
            && w.packed.is_none()
            && w.gguf.is_none()
            && w.k.is_multiple_of(8)
    }

    /// `out = x · wᵀ` for `rows` rows through the backend's dense kernel (`out_f32`: the
    /// f32-output variant).
    ///
    /// # Safety
    /// `xp` holds `rows × w.k` compute-dtype elements and `op` `rows × w.n` elements of the
    /// output type, both live device allocations on this stream.
    pub(super) unsafe fn dense_matmul(
        &self,
        w: &CudaWeight,
        rows: usize,
        xp: u64,
        op: u64,
        out_f32: bool,
    ) -> Result<(), BackendError> {
        if self.dense == DenseMatmul::Mma {
            let kernel = self.mma_unfused_kernel(rows, w.n);
            let out = if out_f32 {
                Epilogue::F32
            } else {
                Epilogue::Same
            };
            // SAFETY: as this function's contract.
            return unsafe { self.mma_matmul(w, rows, xp, op, out, kernel, None) };
        }
        let Some((f16_out, f32_out)) = &self.k.dense_xwt else {
            return Err(BackendError::Unsupported(
                "the dense matmul kernel for f32 compute".into(),
            ));
        };
        check_aligned(xp, op)?;
        if rows == 0 || w.n == 0 {
            return Ok(());
        }
        let (m, n, k) = (rows as i32, w.n as i32, w.k as i32);
        let wp = {
            use cudarc::driver::DevicePtr;
            w.data.device_ptr(&self.stream).0
        };
        let f = if out_f32 { f32_out } else { f16_out };
        let mut b = self.stream.launch_builder(f);
        b.arg(&xp).arg(&wp).arg(&op).arg(&m).arg(&n).arg(&k);
        let cfg = LaunchConfig {
            grid_dim: (
                (w.n as u32).div_ceil(DENSE_WARPS),
                (rows as u32).div_ceil(DENSE_ROWS),
                1,
            ),
            block_dim: (DENSE_WARPS * 32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: as this function's contract: x holds rows × k and out rows × n elements; w is
        // a live n × k allocation (256-byte aligned, k a multiple of 8: every 128-bit load is
        // aligned and in bounds); the kernel guards col < n and row < rows.
        unsafe { b.launch(cfg) }.map_err(dev_err)?;
        Ok(())
    }

    /// `out = x · wᵀ` through one `mma` kernel (with `Epilogue::Swiglu`: `w` has interleaved
    /// gate|up rows and `out` holds `rows × w.n / 2` elements; with `Epilogue::Residual` `out` is
    /// the f32 residual stream, added to). `norm = Some((weight, eps))`: `x` is the f32 residual
    /// stream and the small kernel RMS-normalizes its rows first (dense.cu's NORM prologue).
    ///
    /// # Safety
    /// As [`CudaBackend::dense_matmul`], with the output size of the epilogue; `norm`'s pointer a
    /// live `[k]` compute-dtype buffer.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn mma_matmul(
        &self,
        w: &CudaWeight,
        rows: usize,
        xp: u64,
        op: u64,
        epilogue: Epilogue,
        kernel: MmaKernel,
        norm: Option<(u64, f32)>,
    ) -> Result<(), BackendError> {
        let Some(mk) = self.k.dense_mma.as_ref().filter(|_| self.arch.major >= 8) else {
            return Err(BackendError::Unsupported(format!(
                "the tensor-core dense matmul needs sm_80+ and a 16-bit dtype ({})",
                self.device_name
            )));
        };
        if !w.k.is_multiple_of(8) {
            return Err(BackendError::InvalidArgument(format!(
                "dense mma matmul: k = {} is not a multiple of 8",
                w.k
            )));
        }
        check_aligned(xp, op)?;
        if rows == 0 || w.n == 0 {
            return Ok(());
        }
        let sb = slice_blocks(w.k);
        let slices = w.k.div_ceil(32).div_ceil(sb);
        let (f, cfg) = match kernel {
            MmaKernel::Small | MmaKernel::SmallRg(_) | MmaKernel::SmallWide => {
                // (row groups, 16-output tiles) per block wanted.
                let wide_fits = small_shared_bytes(slices, 16) <= MMA_SMALL_MAX_SHARED;
                let (rg, nt) = match kernel {
                    MmaKernel::SmallRg(rg) if MMA_ROW_GROUPS.contains(&rg) => (rg, 1),
                    MmaKernel::SmallRg(rg) => {
                        return Err(BackendError::InvalidArgument(format!(
                            "the small mma kernel has no row group {rg}"
                        )))
                    }
                    MmaKernel::SmallWide if wide_fits => (8, 2),
                    MmaKernel::SmallWide => {
                        return Err(BackendError::InvalidArgument(format!(
                            "the wide 64-row mma tile takes K ≤ 1024 (k = {})",
                            w.k
                        )))
                    }
                    _ => match self.mid.row_groups(rows, w.n, slices, norm.is_some()) {
                        8 if wide_fits && w.n >= self.mid.wide_min_n => (8, 2),
                        rg => (rg, 1),
                    },
                };
                let pick = |i: usize| -> Option<&SmallFn> {
                    match (epilogue, norm.is_some()) {
                        (Epilogue::Same, false) => Some(&mk.small[i]),
                        (Epilogue::F32, false) => Some(&mk.small_f32[i]),
                        (Epilogue::Swiglu, false) => Some(&mk.small_swiglu[i]),
                        (Epilogue::Residual, false) => Some(&mk.small_res[i]),
                        (Epilogue::Same, true) => Some(&mk.small_norm[i]),
                        (Epilogue::Swiglu, true) => Some(&mk.small_norm_swiglu[i]),
                        (_, true) => None,
                    }
                };
                if pick(0).is_none() {
                    return Err(BackendError::Unsupported(format!(
                        "the mma norm prologue with the {epilogue:?} epilogue"
                    )));
                }
                let threads = 32 * slices;
                let Some((sf, rg, nt)) = fitting_tile(rg, nt, threads, &pick) else {
                    return Err(BackendError::Unsupported(format!(
                        "no small mma tile takes a block of {threads} threads (k = {})",
                        w.k
                    )));
                };
                let f = &sf.f;
                let cfg = LaunchConfig {
                    grid_dim: (
                        (w.n as u32).div_ceil(16 * nt as u32),
                        (rows as u32).div_ceil(8 * rg as u32),
                        1,
                    ),
                    block_dim: (threads as u32, 1, 1),
                    shared_mem_bytes: small_shared_bytes(slices, rg * nt) as u32,
                };
                let (m, n, k, sbi) = (rows as i32, w.n as i32, w.k as i32, sb as i32);
                let (nwp, eps) = norm.unwrap_or((0, 0.0));
                let wp = {
                    use cudarc::driver::DevicePtr;
                    w.data.device_ptr(&self.stream).0
                };
                let mut params = [
                    &xp as *const u64 as *mut c_void,
                    &wp as *const u64 as *mut c_void,
                    &op as *const u64 as *mut c_void,
                    &m as *const i32 as *mut c_void,
                    &n as *const i32 as *mut c_void,
                    &k as *const i32 as *mut c_void,
                    &sbi as *const i32 as *mut c_void,
                    &nwp as *const u64 as *mut c_void,
                    &eps as *const f32 as *mut c_void,
                ];
                // SAFETY: the parameters match the small kernels' (x, w, out, m, n, k, sb, nw,
                // eps) signature and outlive the call; buffer sizes as this function's contract
                // (the NORM prologue reads rows × k f32 and nw's k elements, the RES epilogue
                // reads and writes rows × n f32); the shared memory is exactly slices × rg × 128
                // × tiles floats (≤ 64 KiB: slices ≤ 16 with rg ≤ 8, slices ≤ 8 with rg8w; the
                // rg8 / rg8w functions are allowed 64 KiB at load, the others need ≤ 32 KiB).
                return unsafe { self.launch_kernel(f, cfg, &mut params, self.pdl) };
            }
            MmaKernel::Large => {
                let f = match (epilogue, norm) {
                    (Epilogue::Same, None) => &mk.large,
                    (Epilogue::F32, None) => &mk.large_f32,
                    (Epilogue::Swiglu, None) => &mk.large_swiglu,
                    (e, n) => {
                        return Err(BackendError::Unsupported(format!(
                            "the large mma kernel with the {e:?} epilogue (norm prologue: {})",
                            n.is_some()
                        )))
                    }
                };
                let cfg = LaunchConfig {
                    grid_dim: ((w.n as u32).div_ceil(128), (rows as u32).div_ceil(64), 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                };
                (f, cfg)
            }
            MmaKernel::Gemm | MmaKernel::GemmTile(_) => {
                if norm.is_some() {
                    return Err(BackendError::Unsupported(
                        "the dense GEMM with the norm prologue".into(),
                    ));
                }
                let tile = match kernel {
                    MmaKernel::GemmTile(t) => Some(t),
                    _ => None,
                };
                // SAFETY: as this function's contract (the GEMM's is the same).
                return unsafe { self.gemm_launch(w, rows, xp, op, epilogue, tile) };
            }
        };
        // SAFETY: as this function's contract: x holds rows × k and out rows × n elements; w is
        // a live n × k allocation (256-byte aligned, k a multiple of 8: every 128-bit load is
        // aligned and in bounds, the kernels read nothing at or past column k, row m or output
        // n); the large kernels take (x, w, out, m, n, k, sb).
        unsafe { self.launch_mma_xw(f, cfg, w, rows, xp, op) }
    }

    /// Launch `f` with the parameters every unfused `mma` kernel takes (the large kernel and the
    /// pipelined GEMM): `(x, w, out, m = rows, n, k, sb = slice_blocks(k))`.
    ///
    /// # Safety
    /// `f` takes exactly those parameters and `cfg` is a valid launch of it; `xp` / `op` and `w`
    /// satisfy the buffer contract of the caller ([`CudaBackend::mma_matmul`] or
    /// `gemm_launch`) for `rows` rows.
    pub(super) unsafe fn launch_mma_xw(
        &self,
        f: &CudaFunction,
        cfg: LaunchConfig,
        w: &CudaWeight,
        rows: usize,
        xp: u64,
        op: u64,
    ) -> Result<(), BackendError> {
        let (m, n, k, sb) = (
            rows as i32,
            w.n as i32,
            w.k as i32,
            slice_blocks(w.k) as i32,
        );
        let wp = {
            use cudarc::driver::DevicePtr;
            w.data.device_ptr(&self.stream).0
        };
        let mut b = self.stream.launch_builder(f);
        b.arg(&xp)
            .arg(&wp)
            .arg(&op)
            .arg(&m)
            .arg(&n)
            .arg(&k)
            .arg(&sb);
        // SAFETY: the parameters match `f`'s (x, w, out, m, n, k, sb) list and outlive the call;
        // the buffers are as this function's contract.
        unsafe { b.launch(cfg) }.map_err(dev_err)?;
        Ok(())
    }

    /// `out = x · wᵀ` for a dense 16-bit `w` through the given `mma` kernel, whatever the
    /// backend's `KILN_DENSE_MATMUL` choice: for the tests that compare the two kernels
    /// (`tests/cuda_dense.rs`); output in the compute dtype (the f32-output twins run through
    /// [`crate::backend::Backend::logits`]).
    pub fn matmul_dense_mma_with(
        &self,
        x: &CudaBuffer,
        rows: usize,
        w: &CudaWeight,
        out: &mut CudaBuffer,
        kernel: MmaKernel,
    ) -> Result<(), BackendError> {
        use cudarc::driver::{DevicePtr, DevicePtrMut};
        super::check_len("matmul input", x.len, rows * w.k)?;
        super::check_len("matmul output", out.len, rows * w.n)?;
        self.expect_compute("matmul input", x)?;
        if w.packed.is_some() || w.gguf.is_some() {
            return Err(BackendError::InvalidArgument(
                "matmul_dense_mma_with takes dense weights only".into(),
            ));
        }
        self.expect_compute("matmul output", out)?;
        let (xp, _x_sync) = x.data.device_ptr(&self.stream);
        let (op, _o_sync) = out.data.device_ptr_mut(&self.stream);
        // SAFETY: x holds rows × k compute-dtype elements and out rows × n elements of the
        // output type (checked above); the sync guards keep both in use for the call.
        unsafe { self.mma_matmul(w, rows, xp, op, Epilogue::Same, kernel, None) }
    }

    /// The `mma` kernel of an unfused matmul of `rows` rows on `n` outputs: the small kernel up
    /// to [`MMA_SMALL_MAX_ROWS`] rows (except where [`MidRows::gemm_takes`]), else the GEMM.
    fn mma_unfused_kernel(&self, rows: usize, n: usize) -> MmaKernel {
        if rows <= MMA_SMALL_MAX_ROWS && !self.mid.gemm_takes(rows, n) {
            MmaKernel::Small
        } else {
            self.mma_big_kernel()
        }
    }

    /// Whether [`CudaBackend::interleave_gate_up`] reorders a gate|up weight of this backend:
    /// the `mma` kernels run here, the weight is dense and `inter` (= n / 2) is a multiple of 8.
    fn swiglu_fusable(&self, w: &CudaWeight) -> bool {
        (self.dense == DenseMatmul::Mma || self.fused_rows > 0)
            && self.k.dense_mma.is_some()
            && self.arch.major >= 8
            && w.packed.is_none()
            && w.gguf.is_none()
            && w.k.is_multiple_of(8)
            && w.n.is_multiple_of(16)
            && !w.swiglu_rows
    }

    /// A stacked gate|up weight (gate rows, then up rows) with its rows reordered for the
    /// SwiGLU epilogue when [`CudaBackend::swiglu_fusable`]: 16-row tile i holds gate rows
    /// 8i .. 8i + 8 then up rows 8i .. 8i + 8 (one device copy per 8-row chunk, at load).
    /// Otherwise `w` as it is (the unfused form runs).
    pub(super) fn interleave_gate_up(&self, w: CudaWeight) -> Result<CudaWeight, BackendError> {
        if !self.swiglu_fusable(&w) {
            return Ok(w);
        }
        let inter = w.n / 2;
        let chunk = 8 * w.k * self.dtype.size();
        let mut data = self.alloc_bytes(w.data.len())?;
        for i in 0..inter / 8 {
            for (half, src_row) in [(0, 8 * i), (1, inter + 8 * i)] {
                let from = w.data.slice(src_row * w.k * self.dtype.size()..);
                let from = from.slice(..chunk);
                let dst = (2 * i + half) * chunk;
                let mut to = data.slice_mut(dst..dst + chunk);
                self.stream.memcpy_dtod(&from, &mut to).map_err(dev_err)?;
            }
        }
        Ok(CudaWeight {
            data,
            swiglu_rows: true,
            ..w
        })
    }

    /// `out = swiglu(x · wᵀ)` for an interleaved gate|up `w` through the `mma` kernel with the
    /// SwiGLU epilogue (the small one up to [`MMA_SMALL_MAX_ROWS`] rows).
    pub(super) fn mma_swiglu(
        &self,
        x: &CudaBuffer,
        rows: usize,
        w: &CudaWeight,
        out: &mut CudaBuffer,
        inter: usize,
    ) -> Result<(), BackendError> {
        use cudarc::driver::{DevicePtr, DevicePtrMut};
        if w.n != 2 * inter {
            return Err(BackendError::InvalidArgument(format!(
                "gate_up_swiglu: weight of {} rows for inter {inter}",
                w.n
            )));
        }
        super::check_len("gate_up_swiglu input", x.len, rows * w.k)?;
        super::check_len("gate_up_swiglu output", out.len, rows * inter)?;
        self.expect_compute("gate_up_swiglu input", x)?;
        self.expect_compute("gate_up_swiglu output", out)?;
        let kernel = self.mma_unfused_kernel(rows, w.n);
        let (xp, _x_sync) = x.data.device_ptr(&self.stream);
        let (op, _o_sync) = out.data.device_ptr_mut(&self.stream);
        // SAFETY: x holds rows × k compute-dtype elements and out rows × inter (checked above);
        // the sync guards keep both in use for the call.
        unsafe { self.mma_matmul(w, rows, xp, op, Epilogue::Swiglu, kernel, None) }
    }
}

/// What the `mma` kernel writes: the product in the compute dtype, in f32, SwiGLU of the
/// interleaved gate|up product in the compute dtype, or the product rounded to the compute dtype
/// added into an f32 residual stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Epilogue {
    Same,
    F32,
    Swiglu,
    Residual,
}

/// The 128-bit loads need a 16-byte aligned input, the stores a 4-byte aligned output.
fn check_aligned(xp: u64, op: u64) -> Result<(), BackendError> {
    if !xp.is_multiple_of(16) || !op.is_multiple_of(4) {
        return Err(BackendError::InvalidArgument(format!(
            "dense matmul operands at {xp:#x} / {op:#x} are not aligned"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
