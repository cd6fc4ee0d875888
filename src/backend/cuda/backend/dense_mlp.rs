//! The MLP sub-block of the fused decode layer in one kernel (`dense_mlp_{t}`, dense.cu): the
//! post-attention RMSNorm, the interleaved gate|up matmul with its SwiGLU and the down matmul
//! adding into the f32 residual stream, where the fused decode layer otherwise launches
//! `norm_gate_up_swiglu` then `matmul_residual` (one launch per layer fewer: 30 for SmolLM2);
//! `dense_mlp_oproj_{t}` also runs the attention's o_proj (+ residual) before it, behind a grid
//! barrier (two launches per layer fewer).
//!
//! Layout: thread-block clusters of 8 (sm_90+), one cluster per 128-feature K slice of the down
//! matmul; each block computes 16 SwiGLU features, the cluster shares them through distributed
//! shared memory, each block multiplies them into partial sums of its down output tiles, and a
//! per-tile ticket lets the last block of a tile add the slices' partials in slice order (see
//! dense.cu). The partials and tickets live in the runner's scratch
//! ([`Backend::fused_mlp_scratch_len`]): `[inter / 128][hidden / 16][128]` f32, then one u32
//! ticket per output tile and the grid barrier's two counters, zero when allocated and left zero
//! by every launch.
//!
//! Numerics: every value is computed by the same operations in the same order as the small
//! `mma` kernels of the pair it replaces (the NORM + SWIGLU one, then the RES one), so x ends
//! bit-identical to `norm_gate_up_swiglu` + `matmul_residual` (`tests/cuda_dense.rs`), and the
//! fused decode layer stays batch-invariant. Taken for 1..8 rows (one 8-row tile), 16-bit
//! weights the fused decode ops take, `hidden` a multiple of 16 and `inter` a multiple of 128
//! up to 2048 (the down matmul's K slices are then 128 features); the o_proj too when its output
//! tiles (`hidden / 16`) are no more than the grid's blocks (`inter / 16`) and its K slices no
//! more than a block's warps. Otherwise the separate ops run. `KILN_FUSED_MLP` ([`FusedMlp`]):
//! `oproj`, `mlp` (o_proj separate), `0` (the separate ops; the same bits); unset:
//! [`DEFAULT_FUSED_MLP`].

use std::ffi::c_void;

use cudarc::driver::{sys, CudaFunction, DevicePtr, DevicePtrMut, LaunchConfig};

use super::dense::slice_blocks;
use super::{check_len, CudaBackend, CudaBuffer, CudaWeight};
use crate::backend::{Backend, BackendError};

/// Blocks per cluster (`DMLP_CLUSTER` in dense.cu): 8 blocks of 16 features per 128-feature slice.
const CLUSTER: usize = 8;

/// Rows the kernel takes (one 8-row tile of the small kernels, row group 1).
const MAX_ROWS: usize = 8;

/// The entry point for compute dtype suffix `t`, with the o_proj phase or without.
pub(super) fn kernel_name(t: &str, oproj: bool) -> String {
    if oproj {
        format!("dense_mlp_oproj_{t}")
    } else {
        format!("dense_mlp_{t}")
    }
}

/// How much of the decode layer's second half runs as one kernel (`KILN_FUSED_MLP`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FusedMlp {
    /// `0` / `false` / `off`: `matmul_residual`, `norm_gate_up_swiglu`, `matmul_residual`.
    Off,
    /// `mlp` / `1`: `matmul_residual` for o_proj, then `dense_mlp`.
    Mlp,
    /// `oproj` / `2`: `dense_mlp_oproj`.
    Oproj,
}

/// What an unset `KILN_FUSED_MLP` means.
const DEFAULT_FUSED_MLP: FusedMlp = FusedMlp::Off;

impl FusedMlp {
    /// The choice of `KILN_FUSED_MLP` (unset or empty: [`DEFAULT_FUSED_MLP`]).
    pub fn from_env() -> Result<FusedMlp, BackendError> {
        match std::env::var("KILN_FUSED_MLP") {
            Err(_) => Ok(DEFAULT_FUSED_MLP),
            Ok(v) => Self::parse(&v),
        }
    }

    fn parse(v: &str) -> Result<FusedMlp, BackendError> {
        match v.trim().to_ascii_lowercase().as_str() {
            "" => Ok(DEFAULT_FUSED_MLP),
            "2" | "oproj" => Ok(FusedMlp::Oproj),
            "1" | "mlp" => Ok(FusedMlp::Mlp),
            "0" | "false" | "off" => Ok(FusedMlp::Off),
            other => Err(BackendError::InvalidArgument(format!(
                "KILN_FUSED_MLP={other:?}: expected oproj, mlp or 0"
            ))),
        }
    }

    /// For the backend's name.
    pub fn label(self) -> &'static str {
        match self {
            FusedMlp::Off => "",
            FusedMlp::Mlp => ", mlp",
            FusedMlp::Oproj => ", o+mlp",
        }
    }
}

/// Scratch elements (f32-sized) for a model of these sizes: the partials, then the tickets and
/// the two barrier counters.
fn scratch_len(hidden: usize, inter: usize) -> usize {
    let tiles = hidden / 16;
    (inter / 128) * tiles * 128 + tiles + 2
}

/// Warps of the kernel's block for `hidden`: two per K slice of the gate|up matmul.
fn block_warps(hidden: usize) -> usize {
    2 * hidden.div_ceil(32).div_ceil(slice_blocks(hidden))
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
        && block_warps(hidden) <= 32
}

/// Whether the o_proj phase fits: `q_dim` (its K) a multiple of 8, its K slices no more than a
/// block's warps, its output tiles no more than the grid's blocks.
fn oproj_fits(hidden: usize, inter: usize, q_dim: usize) -> bool {
    q_dim > 0
        && q_dim.is_multiple_of(8)
        && q_dim.div_ceil(32).div_ceil(slice_blocks(q_dim)) <= block_warps(hidden)
        && hidden / 16 <= inter / 16
}

impl CudaBackend {
    /// [`Backend::fused_mlp_scratch_len`]: the kernel's scratch where it can run.
    pub(super) fn mlp_scratch_len(&self, hidden: usize, inter: usize) -> usize {
        if self.fused_mlp != FusedMlp::Off && shape_fits(1, hidden, inter) {
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
        self.fused_mlp != FusedMlp::Off
            && !self.mlp_refused.load(std::sync::atomic::Ordering::Relaxed)
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

    /// Whether the whole grid of `dense_mlp_oproj` (`f`) for these sizes fits on the GPU at
    /// once (`cuOccupancyMaxActiveClusters`: clusters of 8 on GPCs), which its grid barrier
    /// needs; asked once per backend and grid size.
    fn mlp_grid_resident(&self, f: &CudaFunction, hidden: usize, inter: usize) -> bool {
        let grid = (inter / 16) as u32;
        let mut known = self.mlp_resident.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((g, ok)) = *known {
            if g == grid {
                return ok;
            }
        }
        let warps = block_warps(hidden) as u32;
        let config = sys::CUlaunchConfig {
            gridDimX: grid,
            gridDimY: 1,
            gridDimZ: 1,
            blockDimX: 32 * warps,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: warps * 128 * 4,
            hStream: self.stream.cu_stream(),
            attrs: std::ptr::null_mut(),
            numAttrs: 0,
        };
        let mut clusters: std::ffi::c_int = 0;
        let ok = self.ctx.bind_to_thread().is_ok()
            // SAFETY: `config` and `clusters` live for the call; the function belongs to a module
            // the backend keeps loaded; the call only reads them.
            && unsafe { sys::cuOccupancyMaxActiveClusters(&mut clusters, f.cu_function(), &config) }
                .result()
                .is_ok()
            && clusters as u32 * CLUSTER as u32 >= grid;
        tracing::debug!(grid, clusters, ok, "dense_mlp_oproj residency");
        *known = Some((grid, ok));
        ok
    }

    /// [`Backend::norm_mlp_residual`]: the fused kernel where it applies, else the pair.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn mlp_residual(
        &self,
        o: Option<(&CudaBuffer, &CudaWeight)>,
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
        let takes = self.mlp_takes(rows, dim, inter, gate_up, down, part);
        // The o_proj phase: its weight and input as the RES kernel takes them.
        let o_want = o.filter(|(a, w)| {
            takes
                && self.fused_mlp == FusedMlp::Oproj
                && self.fused_takes(w)
                && !w.swiglu_rows
                && w.n == dim
                && oproj_fits(dim, inter, w.k)
                && a.len >= rows * w.k
                && a.dtype == self.dtype
        });
        if !takes {
            if let Some((a, w)) = o {
                self.matmul_residual(a, rows, w, delta, x, dim)?;
            }
            self.norm_gate_up_swiglu(x, weight, eps, rows, dim, gate_up, h, scratch, act, inter)?;
            return self.matmul_residual(act, rows, down, delta, x, dim);
        }
        let Some(fs) = self.k.dense_mlp.as_ref() else {
            return Err(BackendError::Unsupported("the fused MLP kernel".into()));
        };
        // The o_proj phase's grid barrier needs every block resident at once.
        let o_in = o_want.filter(|_| self.mlp_grid_resident(&fs[1], dim, inter));
        if o_in.is_none() {
            if let Some((a, w)) = o {
                self.matmul_residual(a, rows, w, delta, x, dim)?;
            }
        }
        let f = &fs[usize::from(o_in.is_some())];
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
        let _t = self.prof.op(
            &self.stream,
            if o_in.is_some() {
                "o_proj_mlp_residual"
            } else {
                "norm_mlp_residual"
            },
        );
        let sbh = slice_blocks(dim);
        let slices_h = dim.div_ceil(32).div_ceil(sbh);
        let tiles = dim / 16;
        let parts = (inter / 128) * tiles * 128;
        // The device pointers' guards end with this block (the fallback below borrows again).
        let launched = {
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
            // The o_proj phase's input, weight, K and K slice (unused by dense_mlp).
            let (ap, op, qdim, sbo) = match o_in {
                Some((a, w)) => (
                    a.data.device_ptr(&self.stream).0,
                    w.data.device_ptr(&self.stream).0,
                    w.k as i32,
                    slice_blocks(w.k) as i32,
                ),
                None => (0, 0, 0, 4),
            };
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
                &ap as *const u64 as *mut c_void,
                &op as *const u64 as *mut c_void,
                &qdim as *const i32 as *mut c_void,
                &sbo as *const i32 as *mut c_void,
            ];
            let np_params = if o_in.is_some() { p.len() } else { 11 };
            let cfg = LaunchConfig {
                // inter / 16 blocks (a multiple of the cluster size 8: inter % 128 == 0).
                grid_dim: ((inter / 16) as u32, 1, 1),
                block_dim: (32 * block_warps(dim) as u32, 1, 1),
                shared_mem_bytes: (2 * slices_h * 128 * 4) as u32,
            };
            debug_assert!((inter / 16).is_multiple_of(CLUSTER));
            // SAFETY: the parameters match dense_mlp's (x, wgu, wd, nw, eps, m, hidden, inter, sbh,
            // part, cnt) signature, and dense_mlp_oproj's (the same, then a, wo, qdim, sbo), in
            // order, and outlive the call (the sync guards keep every buffer in use on this stream;
            // the o_proj pointers are read from buffers borrowed for this call); x holds rows × dim
            // f32 (checked), nw dim elements, the weights are the interleaved [2 inter, dim] gate|up
            // and the [dim, inter] down (mlp_takes), o_proj [dim, q_dim] with a holding rows × q_dim
            // compute-dtype elements (o_in); part holds the partials, the tickets and the barrier
            // counters (scratch_len, checked in mlp_takes; zero-filled at allocation and reset by the
            // kernel), rows ≤ 8 (one tile); the grid is a multiple of the kernel's compile-time
            // cluster (8), at most 128 blocks of one per SM (inter ≤ 2048), all resident together
            // (the o_proj phase's grid barrier), its block 2 × slices_h ≤ 32 warps with exactly
            // 2 × slices_h × 128 floats of shared memory (≥ the o_proj phase's slices × 128:
            // oproj_fits); the kernel waits (griddepcontrol) before touching activations, so it
            // may use PDL.
            unsafe { self.launch_kernel(f, cfg, &mut p[..np_params], self.pdl) }
        };
        if let Err(e) = launched {
            // A launch the driver refuses (a configuration error, reported at once, before
            // anything ran): the separate ops from now on, with a warning.
            tracing::warn!("the fused MLP kernel was refused ({e}); running the separate ops");
            self.mlp_refused
                .store(true, std::sync::atomic::Ordering::Relaxed);
            if let Some((a, w)) = o_in {
                self.matmul_residual(a, rows, w, delta, x, dim)?;
            }
            self.norm_gate_up_swiglu(x, weight, eps, rows, dim, gate_up, h, scratch, act, inter)?;
            return self.matmul_residual(act, rows, down, delta, x, dim);
        }
        Ok(())
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
        assert_eq!(scratch_len(576, 1536), 12 * 36 * 128 + 36 + 2);
    }

    #[test]
    fn the_switch_parses_its_documented_values_and_refuses_others() {
        assert_eq!(FusedMlp::parse("").unwrap(), DEFAULT_FUSED_MLP);
        assert_eq!(FusedMlp::parse("oproj").unwrap(), FusedMlp::Oproj);
        assert_eq!(FusedMlp::parse("MLP").unwrap(), FusedMlp::Mlp);
        assert_eq!(FusedMlp::parse("1").unwrap(), FusedMlp::Mlp);
        assert_eq!(FusedMlp::parse("0").unwrap(), FusedMlp::Off);
        assert_eq!(FusedMlp::parse("OFF").unwrap(), FusedMlp::Off);
        assert!(FusedMlp::parse("maybe").is_err());
    }

    #[test]
    fn the_oproj_phase_fits_smollm2() {
        assert!(oproj_fits(576, 1536, 576));
        assert_eq!(block_warps(576), 10);
        assert!(!oproj_fits(576, 1536, 0));
        assert!(!oproj_fits(2048, 1536, 576));
    }
}
