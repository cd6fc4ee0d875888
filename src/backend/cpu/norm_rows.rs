//! The checked bodies of the CPU backend's row norms: [`Backend::rms_norm`] /
//! [`Backend::add_rms_norm`] and Qwen3.5's `(1 + w)` forms (`rms_norm_1p`, `add_rms_norm_1p`)
//! differ only in the per-row op; the length checks and the run on the backend's thread pool are
//! here, once.
//!
//! [`Backend::rms_norm`]: crate::backend::Backend::rms_norm
//! [`Backend::add_rms_norm`]: crate::backend::Backend::add_rms_norm

use super::{check_len, CpuBackend};
use crate::backend::BackendError;

impl CpuBackend {
    /// A row norm `op(x, weight, out)` over the first `rows × dim` elements of `x` and `out`,
    /// on the backend's threads, after the length checks (errors name `name`: its input, output
    /// and weight). The body of [`Backend::rms_norm`] and `rms_norm_1p`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn norm_rows(
        &self,
        name: &str,
        x: &[f32],
        weight: &[f32],
        out: &mut [f32],
        rows: usize,
        dim: usize,
        op: impl Fn(&[f32], &[f32], &mut [f32]) + Send + Sync,
    ) -> Result<(), BackendError> {
        let n = rows * dim;
        check_len(format_args!("{name} input"), x.len(), n)?;
        check_len(format_args!("{name} output"), out.len(), n)?;
        check_len(format_args!("{name} weight"), weight.len(), dim)?;
        self.pool.install(|| op(&x[..n], weight, &mut out[..n]));
        Ok(())
    }

    /// A residual add fused with the next row norm, `op(residual, delta, weight, out)` over the
    /// first `rows × dim` elements, on the backend's threads, after the length checks (errors name
    /// `name`). The body of [`Backend::add_rms_norm`] and `add_rms_norm_1p`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn add_norm_rows(
        &self,
        name: &str,
        residual: &mut [f32],
        delta: &[f32],
        weight: &[f32],
        out: &mut [f32],
        rows: usize,
        dim: usize,
        op: impl Fn(&mut [f32], &[f32], &[f32], &mut [f32]) + Send + Sync,
    ) -> Result<(), BackendError> {
        let n = rows * dim;
        check_len(format_args!("{name} residual"), residual.len(), n)?;
        check_len(format_args!("{name} delta"), delta.len(), n)?;
        check_len(format_args!("{name} output"), out.len(), n)?;
        check_len(format_args!("{name} weight"), weight.len(), dim)?;
        self.pool
            .install(|| op(&mut residual[..n], &delta[..n], weight, &mut out[..n]));
        Ok(())
    }
}
