//! The MLP sub-block of the fused decode layer in one kernel (`dense_mlp_{t}`, dense.cu): the
//! post-attention RMSNorm, the interleaved gate|up matmul with its SwiGLU and the down matmul
//! adding into the f32 residual stream, where the fused decode layer otherwise launches
//! `norm_gate_up_swiglu` then `matmul_residual` (one launch per layer fewer: 30 for SmolLM2).
//!
//! Layout: thread-block clusters of 8 (sm_90+), one cluster per 128-feature K slice of the down
//! matmul; each block computes 16 SwiGLU features, the cluster shares them through distributed
//! shared memory, each block multiplies them into partial sums of its down output tiles, and a
//! per-tile ticket lets the last block of a tile add the slices' partials in slice order (see
//! dense.cu). The partials and tickets live in the runner's scratch
//! ([`Backend::fused_mlp_scratch_len`]): `[inter / 128][hidden / 16][128]` f32, then one u32
//! ticket per output tile, zero when allocated and left zero by every launch.
//!
//! Numerics: every value is computed by the same operations in the same order as the small
//! `mma` kernels of the pair it replaces (the NORM + SWIGLU one, then the RES one), so x ends
//! bit-identical to `norm_gate_up_swiglu` + `matmul_residual` (`tests/cuda_dense.rs`), and the
//! fused decode layer stays batch-invariant. Taken for 1..8 rows (one 8-row tile), 16-bit
//! weights the fused decode ops take, `hidden` a multiple of 16 and `inter` a multiple of 128
//! up to 2048 (the down matmul's K slices are then 128 features); otherwise, and with
//! `KILN_FUSED_MLP=0`, the pair runs.

use std::ffi::c_void;

use cudarc::driver::{DevicePtr, DevicePtrMut, LaunchConfig};

use super::dense::slice_blocks;
use super::{check_len, CudaBackend, CudaBuffer, CudaWeight};
use crate::backend::{Backend, BackendError};

/// Blocks per cluster (`DMLP_CLUSTER` in dense.cu): 8 blocks of 16 features per 128-feature slice.
const CLUSTER: usize = 8;

/// Rows the kernel takes (one 8-row tile of the small kernels, row group 1).
const MAX_ROWS: usize = 8;

/// The entry point for compute dtype suffix `t`.
pub(super) fn kernel_name(t: &str) -> String {
    format!("dense_mlp_{t}")
}

/// `KILN_FUSED_MLP`: the one-kernel MLP on (unset, `1`, `true`, `on`) or off (`0`, `false`,
/// `off`: `norm_gate_up_swiglu` + `matmul_residual`, the same bits).
pub(super) fn fused_mlp_from_env() -> Result<bool, BackendError> {
    match std::env::var("KILN_FUSED_MLP") {
        Err(_) => Ok(true),
        Ok(v) => parse_switch(&v),
    }
}

fn parse_switch(v: &str) -> Result<bool, BackendError> {
    match v.trim().to_ascii_lowercase().as_str() {
        "" | "1" | "true" | "on" => Ok(true),
        "0" | "false" | "off" => Ok(false),
        other => Err(BackendError::InvalidArgument(format!(
            "KILN_FUSED_MLP={other:?}: expected 0 or 1"
        ))),
    }
}

/// Scratch elements (f32-sized) for a model of these sizes: the partials, then the tickets.
fn scratch_len(hidden: usize, inter: usize) -> usize {
    let tiles = hidden / 16;
    (inter / 128) * tiles * 128 + tiles
}

/// Whether the shapes fit the kernel (see the module header).
fn shape_fits(rows: usize, hidden: usize, inter: usize) -> bool {
    (1..=MAX_ROWS).contains(&rows)
        && hidden > 0
        && hidden.is_multiple_of(16)
        && inter > 0
        && inter.is_multiple_of(128)
        && inter <= 2048
        && slice_blocks(inter) == 4
        && 2 * hidden.div_ceil(32).div_ceil(slice_blocks(hidden)) <= 32
}

impl CudaBackend {
    /// [`Backend::fused_mlp_scratch_len`]: the kernel's scratch where it can run.
    pub(super) fn mlp_scratch_len(&self, hidden: usize, inter: usize) -> usize {
        if self.fused_mlp && shape_fits(1, hidden, inter) {
            scratch_len(hidden, inter)
        } else {
            0
        }
    }

    /// Whether the fused MLP takes this call.
    fn mlp_takes(
        &self,
        rows: usize,
        hidden: usize,
        inter: usize,
        gate_up: &CudaWeight,
        down: &CudaWeight,
        part: &CudaBuffer,
    ) -> bool {
        self.fused_mlp
            && self.k.dense_mlp.is_some()
            && self.arch.major >= 9
            && shape_fits(rows, hidden, inter)
            && self.fused_takes(gate_up)
            && gate_up.swiglu_rows
            && gate_up.n == 2 * inter
            && gate_up.k == hidden
            && self.fused_takes(down)
            && !down.swiglu_rows
            && down.n == hidden
            && down.k == inter
            && part.dtype == super::ComputeDType::F32
            && part.len >= scratch_len(hidden, inter)
    }

    /// [`Backend::norm_mlp_residual`]: the fused kernel where it applies, else the pair.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn mlp_residual(
        &self,
        x: &mut CudaBuffer,
        weight: &CudaBuffer,
        eps: f32,
        rows: usize,
        dim: usize,
        gate_up: &CudaWeight,
        down: &CudaWeight,
        h: &mut CudaBuffer,
        scratch: &mut CudaBuffer,
        act: &mut CudaBuffer,
        delta: &mut CudaBuffer,
        inter: usize,
        part: &mut CudaBuffer,
    ) -> Result<(), BackendError> {
        if !self.mlp_takes(rows, dim, inter, gate_up, down, part) {
            self.norm_gate_up_swiglu(x, weight, eps, rows, dim, gate_up, h, scratch, act, inter)?;
            return self.matmul_residual(act, rows, down, delta, x, dim);
        }
        let Some(f) = self.k.dense_mlp.as_ref() else {
            return Err(BackendError::Unsupported("the fused MLP kernel".into()));
        };
        if x.dtype != super::ComputeDType::F32 {
            return Err(super::mixed(
                "fused MLP residual",
                x.dtype,
                super::ComputeDType::F32,
            ));
        }
        check_len("fused MLP residual", x.len, rows * dim)?;
        check_len("fused MLP norm weight", weight.len, dim)?;
        self.expect_compute("fused MLP norm weight", weight)?;
        let _t = self.prof.op(&self.stream, "norm_mlp_residual");
        let sbh = slice_blocks(dim);
        let slices_h = dim.div_ceil(32).div_ceil(sbh);
        let tiles = dim / 16;
        let parts = (inter / 128) * tiles * 128;
        let (xp, _s0) = x.data.device_ptr_mut(&self.stream);
        let (np, _s1) = weight.data.device_ptr(&self.stream);
        let (gp, _s2) = gate_up.data.device_ptr(&self.stream);
        let (dp, _s3) = down.data.device_ptr(&self.stream);
        let (pp, _s4) = part.data.device_ptr_mut(&self.stream);
        let cp = pp + (parts * 4) as u64;
        if !xp.is_multiple_of(16) || !np.is_multiple_of(16) {
            return Err(BackendError::InvalidArgument(
                "fused MLP: residual or norm weight not 16-byte aligned".into(),
            ));
        }
        let (m, hi, ii, sbi) = (rows as i32, dim as i32, inter as i32, sbh as i32);
        let mut p = [
            &xp as *const u64 as *mut c_void,
            &gp as *const u64 as *mut c_void,
            &dp as *const u64 as *mut c_void,
            &np as *const u64 as *mut c_void,
            &eps as *const f32 as *mut c_void,
            &m as *const i32 as *mut c_void,
            &hi as *const i32 as *mut c_void,
            &ii as *const i32 as *mut c_void,
            &sbi as *const i32 as *mut c_void,
            &pp as *const u64 as *mut c_void,
            &cp as *const u64 as *mut c_void,
        ];
        let cfg = LaunchConfig {
            // inter / 16 blocks (a multiple of the cluster size 8: inter % 128 == 0).
            grid_dim: ((inter / 16) as u32, 1, 1),
            block_dim: (64 * slices_h as u32, 1, 1),
            shared_mem_bytes: (2 * slices_h * 128 * 4) as u32,
        };
        debug_assert!((inter / 16).is_multiple_of(CLUSTER));
        // SAFETY: the parameters match dense_mlp's (x, wgu, wd, nw, eps, m, hidden, inter, sbh,
        // part, cnt) signature, in order, and outlive the call (the sync guards keep every buffer
        // in use on this stream); x holds rows × dim f32 (checked), nw dim elements, the weights
        // are the interleaved [2 inter, dim] gate|up and the [dim, inter] down (mlp_takes), part
        // holds the partials then the tickets (scratch_len, checked in mlp_takes; zero-filled at
        // allocation and reset by the kernel), rows ≤ 8 (one tile); the grid is a multiple of the
        // kernel's compile-time cluster (8) and its block 2 × slices_h ≤ 32 warps with exactly
        // 2 × slices_h × 128 floats of shared memory; the kernel waits (griddepcontrol) before
        // touching activations, so it may use PDL.
        unsafe { self.launch_kernel(f, cfg, &mut p, self.pdl) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smollm2_fits_and_other_shapes_fall_back() {
        assert!(shape_fits(1, 576, 1536));
        assert!(shape_fits(8, 576, 1536));
        assert!(!shape_fits(9, 576, 1536));
        assert!(!shape_fits(0, 576, 1536));
        assert!(!shape_fits(1, 576, 1500));
        assert!(!shape_fits(1, 576, 4096));
        assert!(!shape_fits(1, 584, 1536));
        assert_eq!(scratch_len(576, 1536), 12 * 36 * 128 + 36);
    }

    #[test]
    fn the_switch_parses_its_documented_values_and_refuses_others() {
        assert!(parse_switch("").unwrap());
        assert!(parse_switch("1").unwrap());
        assert!(!parse_switch("0").unwrap());
        assert!(!parse_switch("OFF").unwrap());
        assert!(parse_switch("maybe").is_err());
    }
}
