//! The fused decode-layer ops of the [`Backend`] trait on CUDA: the SwiGLU of a gate|up product,
//! the RMSNorm before a matmul, and a matmul with the residual add, each taken by the
//! batch-invariant fused kernels of `dense` (`mma_*`) where the weight and the row count allow
//! (`fused_takes`, [`MMA_SMALL_MAX_ROWS`]) and otherwise composed of the unfused ops, which give
//! the same bits. The [`Backend`] methods of the same names forward here.

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
    if !be.fused_takes(w) || w.swiglu_rows || rows > MMA_SMALL_MAX_ROWS {
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
    if !be.fused_takes(w) || !w.swiglu_rows || rows > MMA_SMALL_MAX_ROWS {
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
