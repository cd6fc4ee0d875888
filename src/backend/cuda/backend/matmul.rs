//! The one place a linear layer's product is dispatched: a packed 4-bit weight to the fused
//! dequantizing kernels (`w4a16`), a GGUF weight kept quantized to `gguf`'s, a dense weight to the
//! batch-invariant kernels of `dense` where they are chosen, and otherwise to cuBLAS.

use std::ffi::c_void;

use cudarc::cublas::sys as cublas_sys;
use cudarc::driver::{DevicePtr, DevicePtrMut};

use super::{check_len, dev_err, ComputeDType, CudaBackend, CudaBuffer, CudaWeight};
use crate::backend::BackendError;

impl CudaBackend {
    /// `out[rows, w.n] = x[rows, w.k] · wᵀ` in the compute dtype, after checking both buffers'
    /// lengths and dtypes (`what`: the names the errors give x and out); nothing runs for 0 rows.
    pub(super) fn matmul_checked(
        &self,
        what: [&str; 2],
        x: &CudaBuffer,
        rows: usize,
        w: &CudaWeight,
        out: &mut CudaBuffer,
    ) -> Result<(), BackendError> {
        self.with_matmul_ptrs(what, x, rows, w, out, |xp, op| {
            // SAFETY: w, x and out are live device allocations holding n × k, rows × k and
            // rows × n elements of the compute dtype (checked by with_matmul_ptrs), in use on
            // this stream for the call.
            unsafe { self.gemm_xwt(w, rows, xp, op, self.dtype.cuda_type()) }
        })
    }

    /// The checks of a product `out[rows, w.n] = x[rows, w.k] · wᵀ` in the compute dtype (both
    /// buffers' lengths, then their dtypes; `what`: the names the errors give x and out), then
    /// `launch(xp, op)` with their device pointers, held (sync guards) for the call; nothing
    /// runs for 0 rows. Shared by [`CudaBackend::matmul_checked`] and the `matmul_*_with` hooks
    /// that pick the kernel.
    pub(super) fn with_matmul_ptrs(
        &self,
        what: [&str; 2],
        x: &CudaBuffer,
        rows: usize,
        w: &CudaWeight,
        out: &mut CudaBuffer,
        launch: impl FnOnce(u64, u64) -> Result<(), BackendError>,
    ) -> Result<(), BackendError> {
        check_len(what[0], x.len, rows * w.k)?;
        check_len(what[1], out.len, rows * w.n)?;
        self.expect_compute(what[0], x)?;
        self.expect_compute(what[1], out)?;
        if rows == 0 {
            return Ok(());
        }
        let (xp, _x_sync) = x.data.device_ptr(&self.stream);
        let (op, _o_sync) = out.data.device_ptr_mut(&self.stream);
        launch(xp, op)
    }

    /// Row-major `out[rows, w.n] = x[rows, w.k] · wᵀ` with cuBLAS, f32 accumulation (pedantic
    /// f32 for an f32 compute dtype); x and w in the compute dtype, out in `out_type` (the
    /// compute dtype, or f32 for logits). As column-major: outᵀ (n × rows) = op(W)(n × k) · xᵀ
    /// (k × rows), with W seen column-major as k × n and transposed.
    ///
    /// # Safety
    /// `xp` and `op` point to live device memory on this stream holding rows × k elements of
    /// the compute dtype and rows × n elements of `out_type`.
    pub(super) unsafe fn gemm_xwt(
        &self,
        w: &CudaWeight,
        rows: usize,
        xp: u64,
        op: u64,
        out_type: cublas_sys::cudaDataType,
    ) -> Result<(), BackendError> {
        if let Some(parts) = &w.packed {
            let out_f32 = out_type == cublas_sys::cudaDataType::CUDA_R_32F;
            let kernel = self.w4_kernel_for(rows);
            // SAFETY: as this function's contract.
            return unsafe { self.packed_matmul(w, parts, rows, xp, op, out_f32, kernel) };
        }
        if let Some(parts) = &w.gguf {
            let out_f32 = out_type == cublas_sys::cudaDataType::CUDA_R_32F;
            let kernel = self.gguf_kernel_for(rows);
            // SAFETY: as this function's contract.
            return unsafe { self.gguf_matmul(w, parts, rows, xp, op, out_f32, kernel) };
        }
        if self.dense_takes(w) {
            let out_f32 = out_type == cublas_sys::cudaDataType::CUDA_R_32F;
            // SAFETY: as this function's contract.
            return unsafe { self.dense_matmul(w, rows, xp, op, out_f32) };
        }
        let (alpha, beta) = (1.0f32, 0.0f32);
        let ty = self.dtype.cuda_type();
        let compute = if self.dtype == ComputeDType::F32 {
            cublas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_PEDANTIC
        } else {
            cublas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F
        };
        let (wp, _w_sync) = w.data.device_ptr(&self.stream);
        // SAFETY: w is a live n × k allocation (held by `_w_sync` for the call), x and out as
        // the caller promises; alpha/beta are host f32 as CUBLAS_COMPUTE_32F expects.
        unsafe {
            cudarc::cublas::result::gemm_ex(
                *self.blas.handle(),
                cublas_sys::cublasOperation_t::CUBLAS_OP_T,
                cublas_sys::cublasOperation_t::CUBLAS_OP_N,
                w.n as i32,
                rows as i32,
                w.k as i32,
                &alpha as *const f32 as *const c_void,
                wp as *const c_void,
                ty,
                w.k as i32,
                xp as *const c_void,
                ty,
                w.k as i32,
                &beta as *const f32 as *const c_void,
                op as *mut c_void,
                out_type,
                w.n as i32,
                compute,
                cublas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(dev_err)
    }
}
