//! The fused decode-layer ops of the [`Backend`] trait on CUDA: the SwiGLU of a gate|up product,
//! the RMSNorm before a matmul, and a matmul with the residual add, each taken by the
//! batch-invariant fused kernels of `dense` (`mma_*`) where the weight and the row count allow
//! (`fused_takes`, [`MMA_SMALL_MAX_ROWS`]) and otherwise composed of the unfused ops, which give
//! the same bits under `KILN_DENSE_MATMUL=mma` (the default on sm_80+ with a 16-bit dtype): the
//! NORM prologue and `rms_norm.cu`'s f32-stream norms share one order of the sum of squares
//! (common.cuh's `rms_row_sumsq` / `rms_inv`), the RES epilogue adds as `add_rms_norm` does, and
//! the SwiGLU epilogue is the unfused `mma` product's. Under cuBLAS the unfused product is
//! cuBLAS's, so only the roundings, not the sums, are shared. The [`Backend`] methods of the same names forward here; the second half holds
//! the rule (`fused_takes`, [`CudaBackend::fused_decode_limit`]) and the two fused launches
//! (`mma_norm_matmul`, `mma_matmul_residual`) through `dense.rs`'s `mma_matmul`.

use super::dense::{Epilogue, MmaKernel};
use super::{check_len, dense, CudaBackend, CudaBuffer, CudaWeight, MMA_SMALL_MAX_ROWS};
use crate::backend::{Backend, BackendError};

pub(super) fn gate_up_swiglu(
    be: &CudaBackend,
    x: &CudaBuffer,
    rows: usize,
    w: &CudaWeight,
    scratch: &mut CudaBuffer,
    out: &mut CudaBuffer,
    inter: usize,
) -> Result<(), BackendError> {
    if !w.swiglu_rows {
        be.matmul(x, rows, w, scratch)?;
        return be.swiglu(scratch, out, rows, inter);
    }
    if be.dense == dense::DenseMatmul::Mma {
        let _t = be.prof.op(&be.stream, "matmul_swiglu");
        return be.mma_swiglu(x, rows, w, out, inter);
    }
    // Interleaved for the fused decode ops, multiplied here by cuBLAS: the interleaved
    // product, then the SwiGLU that reads that layout.
    be.interleaved_gate_up_swiglu(x, rows, w, scratch, out, inter)
}

#[allow(clippy::too_many_arguments)]
pub(super) fn norm_matmul(
    be: &CudaBackend,
    x: &CudaBuffer,
    weight: &CudaBuffer,
    eps: f32,
    rows: usize,
    dim: usize,
    w: &CudaWeight,
    h: &mut CudaBuffer,
    out: &mut CudaBuffer,
) -> Result<(), BackendError> {
    if !be.fused_takes(w) || w.swiglu_rows || rows > be.mid.norm_rows {
        be.rms_norm(x, weight, h, rows, dim, eps)?;
        return be.matmul(h, rows, w, out);
    }
    check_len("norm_matmul dim", w.k, dim)?;
    let _t = be.prof.op(&be.stream, "norm_matmul");
    be.mma_norm_matmul(x, weight, eps, rows, w, out, false)
}

#[allow(clippy::too_many_arguments)]
pub(super) fn norm_gate_up_swiglu(
    be: &CudaBackend,
    x: &CudaBuffer,
    weight: &CudaBuffer,
    eps: f32,
    rows: usize,
    dim: usize,
    w: &CudaWeight,
    h: &mut CudaBuffer,
    scratch: &mut CudaBuffer,
    out: &mut CudaBuffer,
    inter: usize,
) -> Result<(), BackendError> {
    if !be.fused_takes(w) || !w.swiglu_rows || rows > be.mid.norm_rows {
        be.rms_norm(x, weight, h, rows, dim, eps)?;
        return be.gate_up_swiglu(h, rows, w, scratch, out, inter);
    }
    check_len("norm_gate_up_swiglu dim", w.k, dim)?;
    check_len("norm_gate_up_swiglu inter", w.n, 2 * inter)?;
    let _t = be.prof.op(&be.stream, "norm_matmul_swiglu");
    be.mma_norm_matmul(x, weight, eps, rows, w, out, true)
}

pub(super) fn matmul_residual(
    be: &CudaBackend,
    x: &CudaBuffer,
    rows: usize,
    w: &CudaWeight,
    delta: &mut CudaBuffer,
    residual: &mut CudaBuffer,
    n: usize,
) -> Result<(), BackendError> {
    let _ = delta;
    check_len("matmul_residual n", w.n, n)?;
    if !be.fused_takes(w) || w.swiglu_rows || rows > MMA_SMALL_MAX_ROWS {
        return Err(BackendError::Unsupported(format!(
            "matmul_residual on this weight or {rows} rows (see fused_decode_rows)"
        )));
    }
    let _t = be.prof.op(&be.stream, "matmul_residual");
    be.mma_matmul_residual(x, rows, w, residual)
}

impl CudaBackend {
    /// Largest step (tokens) whose layers take the fused decode ops on this backend
    /// (`KILN_FUSED_DECODE_ROWS`, 0 without tensor-core kernels).
    pub fn fused_decode_limit(&self) -> usize {
        self.fused_rows
    }

    /// Whether the fused decode ops take `w`: a dense 16-bit weight with `k` a multiple of 8 on
    /// a backend with the tensor-core kernels.
    pub(super) fn fused_takes(&self, w: &CudaWeight) -> bool {
        self.fused_rows > 0
            && self.k.dense_mma.is_some()
            && self.arch.major >= 8
            && w.packed.is_none()
            && w.gguf.is_none()
            && w.k.is_multiple_of(8)
    }

    /// `out = rms_norm(x) · w ᵀ` (`swiglu`: SwiGLU of the interleaved gate|up product, `out`
    /// `[rows, n / 2]`) in one small `mma` kernel with the NORM prologue.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn mma_norm_matmul(
        &self,
        x: &CudaBuffer,
        norm: &CudaBuffer,
        eps: f32,
        rows: usize,
        w: &CudaWeight,
        out: &mut CudaBuffer,
        swiglu: bool,
    ) -> Result<(), BackendError> {
        use cudarc::driver::{DevicePtr, DevicePtrMut};
        if rows > MMA_SMALL_MAX_ROWS {
            return Err(BackendError::InvalidArgument(format!(
                "fused norm matmul: {rows} rows (at most {MMA_SMALL_MAX_ROWS})"
            )));
        }
        if x.dtype != super::ComputeDType::F32 {
            return Err(super::mixed(
                "fused norm matmul input",
                x.dtype,
                super::ComputeDType::F32,
            ));
        }
        let n_out = if swiglu { w.n / 2 } else { w.n };
        super::check_len("fused norm matmul input", x.len, rows * w.k)?;
        super::check_len("fused norm matmul weight", norm.len, w.k)?;
        super::check_len("fused norm matmul output", out.len, rows * n_out)?;
        self.expect_compute("fused norm matmul norm weight", norm)?;
        self.expect_compute("fused norm matmul output", out)?;
        let (xp, _x_sync) = x.data.device_ptr(&self.stream);
        let (np, _n_sync) = norm.data.device_ptr(&self.stream);
        let (op, _o_sync) = out.data.device_ptr_mut(&self.stream);
        if !xp.is_multiple_of(16) || !np.is_multiple_of(16) {
            return Err(BackendError::InvalidArgument(
                "fused norm matmul: input or norm weight not 16-byte aligned".into(),
            ));
        }
        let epilogue = if swiglu {
            Epilogue::Swiglu
        } else {
            Epilogue::Same
        };
        // SAFETY: x holds rows × k f32, norm k and out rows × n_out compute-dtype elements
        // (checked above); the sync guards keep them in use for the call.
        unsafe { self.mma_matmul(w, rows, xp, op, epilogue, MmaKernel::Small, Some((np, eps))) }
    }

    /// `residual += T(x · wᵀ)` in one small `mma` kernel with the RES epilogue.
    pub(super) fn mma_matmul_residual(
        &self,
        x: &CudaBuffer,
        rows: usize,
        w: &CudaWeight,
        residual: &mut CudaBuffer,
    ) -> Result<(), BackendError> {
        use cudarc::driver::{DevicePtr, DevicePtrMut};
        if rows > MMA_SMALL_MAX_ROWS {
            return Err(BackendError::InvalidArgument(format!(
                "fused matmul residual: {rows} rows (at most {MMA_SMALL_MAX_ROWS})"
            )));
        }
        if residual.dtype != super::ComputeDType::F32 {
            return Err(super::mixed(
                "fused matmul residual",
                residual.dtype,
                super::ComputeDType::F32,
            ));
        }
        super::check_len("fused matmul residual input", x.len, rows * w.k)?;
        super::check_len("fused matmul residual", residual.len, rows * w.n)?;
        self.expect_compute("fused matmul residual input", x)?;
        let (xp, _x_sync) = x.data.device_ptr(&self.stream);
        let (rp, _r_sync) = residual.data.device_ptr_mut(&self.stream);
        // SAFETY: x holds rows × k compute-dtype elements and residual rows × n f32 (checked
        // above); the sync guards keep them in use for the call.
        unsafe { self.mma_matmul(w, rows, xp, rp, Epilogue::Residual, MmaKernel::Small, None) }
    }
}
