//! The batch-invariant dense matmul (`kernels/dense.cu`): `out = x · wᵀ` for dense 16-bit weights
//! with one fixed f32 reduction order per output element, whatever the number of rows, so a
//! token's logits do not depend on the batch it rides in. Chosen for every dense 16-bit matmul
//! (the projections and the lm_head) when `KILN_DENSE_MATMUL=1` at backend creation; off by
//! default: it reads the weights at (close to) memory speed for decode row counts, but it is a
//! CUDA-core kernel, far slower than cuBLAS's tensor cores for prefill (docs/benchmarks.md).
//! The choice is per backend, never per step, so every step of a run has the same numerics.
//!
//! Shape rules: `k` a multiple of 8 and 16-byte aligned operands (one 128-bit load per lane per
//! step); a weight that breaks them (or f32 compute) takes cuBLAS, a choice that depends on the
//! weight only.

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::{dev_err, CudaBackend, CudaWeight};
use crate::backend::BackendError;

/// Rows per block tile and warps (output columns) per block; must equal `DENSE_ROWS` /
/// `DENSE_WARPS` in dense.cu.
const DENSE_ROWS: u32 = 8;
const DENSE_WARPS: u32 = 4;

/// Whether `KILN_DENSE_MATMUL` asks for the dense kernel (`1` / `true`).
pub(super) fn wanted_from_env() -> bool {
    std::env::var("KILN_DENSE_MATMUL").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"))
}

impl CudaBackend {
    /// Whether the dense kernel takes `w` (see the module header).
    pub(super) fn dense_takes(&self, w: &CudaWeight) -> bool {
        self.dense && self.k.dense_xwt.is_some() && w.packed.is_none() && w.k.is_multiple_of(8)
    }

    /// `out = x · wᵀ` for `rows` rows through `dense_xwt_*` (`out_f32`: the f32-output variant).
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
        let Some((f16_out, f32_out)) = &self.k.dense_xwt else {
            return Err(BackendError::Unsupported(
                "the dense matmul kernel for f32 compute".into(),
            ));
        };
        if !xp.is_multiple_of(16) || !op.is_multiple_of(4) {
            return Err(BackendError::InvalidArgument(format!(
                "dense matmul operands at {xp:#x} / {op:#x} are not aligned"
            )));
        }
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
}
