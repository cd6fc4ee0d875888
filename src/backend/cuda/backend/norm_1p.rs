//! The zero-centred `(1 + w)` RMSNorm of Qwen3.5 on CUDA (`rms_norm_1p_*` in `kernels/gdn.cu`):
//! the weight is the checkpoint's `w` as stored and `1 + w` is formed in f32 in the kernel, as
//! transformers does. (Uploading `1 + w` in bf16 rounded every such norm to 2⁻⁸ relative: the
//! main cause of the bf16 whole-model gap recorded in docs/gpu-validation.md.) The bodies of
//! [`HybridBackend::rms_norm_1p`] and [`HybridBackend::add_rms_norm_1p`].
//!
//! The kernel waits (`griddepcontrol.wait`) before touching memory, so it is launched with the
//! programmatic-dependent-launch attribute where the backend has PDL (`CudaBackend::pdl`).
//!
//! [`HybridBackend::rms_norm_1p`]: crate::backend::hybrid::HybridBackend::rms_norm_1p
//! [`HybridBackend::add_rms_norm_1p`]: crate::backend::hybrid::HybridBackend::add_rms_norm_1p

use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig};

use super::launch::KernelArgs;
use super::{check_len, CudaBackend, CudaBuffer};
use crate::backend::BackendError;

impl CudaBackend {
    /// `out = (1 + weight) · h / rms(h)` per row, `h = x` or (with `residual`) `residual += x`
    /// first. `x` (without a residual) or `residual` may be f32 buffers; the rest are in the
    /// compute dtype.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn norm_1p(
        &self,
        x: &CudaBuffer,
        residual: Option<&mut CudaBuffer>,
        weight: &CudaBuffer,
        out: &mut CudaBuffer,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<(), BackendError> {
        let _t = self.prof.op(&self.stream, "rms_norm_1p");
        check_len("rms_norm_1p input", x.len, rows * dim)?;
        check_len("rms_norm_1p output", out.len, rows * dim)?;
        check_len("rms_norm_1p weight", weight.len, dim)?;
        self.expect_compute("rms_norm_1p output", out)?;
        self.expect_compute("rms_norm_1p weight", weight)?;
        let g = &self.k.gdn;
        match residual {
            None => {
                let kernel = self.for_dtype(
                    "rms_norm_1p input",
                    x.dtype,
                    &g.rms_norm_1p,
                    g.rms_norm_1p_xf32.as_ref(),
                )?;
                self.launch_norm_1p(
                    kernel,
                    &x.data,
                    None,
                    &weight.data,
                    &mut out.data,
                    rows,
                    dim,
                    eps,
                )
            }
            Some(r) => {
                check_len("add_rms_norm_1p residual", r.len, rows * dim)?;
                self.expect_compute("add_rms_norm_1p delta", x)?;
                let kernel = self.for_dtype(
                    "add_rms_norm_1p residual",
                    r.dtype,
                    &g.rms_norm_1p,
                    g.rms_norm_1p_rf32.as_ref(),
                )?;
                self.launch_norm_1p(
                    kernel,
                    &x.data,
                    Some(&mut r.data),
                    &weight.data,
                    &mut out.data,
                    rows,
                    dim,
                    eps,
                )
            }
        }
    }

    /// Launch an `rms_norm_1p*` kernel: one block per row (`residual` None = the unfused form).
    #[allow(clippy::too_many_arguments)]
    fn launch_norm_1p(
        &self,
        f: &CudaFunction,
        x: &CudaSlice<u8>,
        residual: Option<&mut CudaSlice<u8>>,
        weight: &CudaSlice<u8>,
        out: &mut CudaSlice<u8>,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<(), BackendError> {
        if rows == 0 {
            return Ok(());
        }
        let st = &self.stream;
        let mut b = KernelArgs::new();
        b.buf(x, st);
        match residual {
            Some(r) => b.buf(&*r, st),
            None => b.ptr(0),
        };
        b.buf(weight, st).buf(&*out, st).i32(dim as i32).f32(eps);
        let threads = if dim >= 1024 {
            1024
        } else {
            (dim.div_ceil(32) * 32) as u32
        };
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: x, residual and out hold rows × dim elements and weight dim (checked by
        // `norm_1p`); a null residual selects the unfused path; the kernel waits (PDL) before it
        // touches memory, so the attribute is allowed.
        unsafe { self.launch_args(f, cfg, &mut b, self.pdl_packed()) }
    }
}
