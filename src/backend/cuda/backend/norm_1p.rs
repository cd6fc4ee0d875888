//! The zero-centred `(1 + w)` RMSNorm of Qwen3.5 on CUDA (`rms_norm_1p_*` in `kernels/gdn.cu`):
//! the weight is the checkpoint's `w` as stored and `1 + w` is formed in f32 in the kernel, as
//! transformers does. (Uploading `1 + w` in bf16 rounded every such norm to 2⁻⁸ relative: the
//! main cause of the bf16 whole-model gap recorded in docs/gpu-validation.md.) The bodies of
//! [`HybridBackend::rms_norm_1p`] and [`HybridBackend::add_rms_norm_1p`].
//!
//! The kernel waits (`griddepcontrol.wait`) before touching memory, so it is launched with the
//! programmatic-dependent-launch attribute where the backend has PDL (`CudaBackend::pdl`),
//! through the one RMSNorm launch of `rowwise.rs` (`launch_rms_norm`).
//!
//! [`HybridBackend::rms_norm_1p`]: crate::backend::hybrid::HybridBackend::rms_norm_1p
//! [`HybridBackend::add_rms_norm_1p`]: crate::backend::hybrid::HybridBackend::add_rms_norm_1p

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
            None => self.launch_rms_norm(
                (&g.rms_norm_1p, g.rms_norm_1p_xf32.as_ref()),
                "rms_norm_1p input",
                x,
                None,
                weight,
                out,
                rows,
                dim,
                eps,
                self.pdl_packed(),
            ),
            Some(r) => {
                check_len("add_rms_norm_1p residual", r.len, rows * dim)?;
                self.expect_compute("add_rms_norm_1p delta", x)?;
                self.launch_rms_norm(
                    (&g.rms_norm_1p, g.rms_norm_1p_rf32.as_ref()),
                    "add_rms_norm_1p residual",
                    x,
                    Some(r),
                    weight,
                    out,
                    rows,
                    dim,
                    eps,
                    self.pdl_packed(),
                )
            }
        }
    }
}
