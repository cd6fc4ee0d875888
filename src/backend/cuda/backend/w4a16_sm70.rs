//! The sm_70 / sm_75 (V100, T4) tensor-core path of the packed 4-bit matmuls: the launcher of
//! `kernels/w4a16_sm70.cu` (`mma.sync.m8n8k4`, fp16 in, f32 accumulation) over the same w4 tiles
//! ([`crate::tensor::packed_tiles`]) the sm_80+ kernels read, so the upload is shared.
//!
//! A child module of `w4a16.rs` (it reads the private [`CudaPackedParts`]); `w4a16.rs` routes
//! here when the backend has these kernels, i.e. its kernels are built for sm_70 / sm_75
//! (the device, or `KILN_CUDA_ARCH=compute_70`) and the compute dtype is fp16 (sm_70 has no
//! bf16: the backend refuses `engine.dtype = bf16` there; f32 compute keeps `w4_fma`).
//!
//! Kernel choice: [`W4Kernel::Gemv`] (`w4s70_gemv_f16`, blocks of 16 outputs × 16 rows, one warp
//! per K slice) for steps of 1..=[`GEMV_MAX_ROWS`] rows, [`W4Kernel::Gemm`] (`w4s70_gemm_f16`,
//! 64 × 64 block tiles, x staged in 32 KB of static shared memory) above. Both run every row
//! count and every layout (int4 sym / asym, any group, act-order, NVFP4) with the same
//! arithmetic per output element (the kernel file's header), so they agree bit for bit and a
//! row's result does not depend on its batch. Nothing allocates; fixed pointers per launch.

use std::collections::HashMap;

use cudarc::driver::{CudaFunction, DevicePtr, LaunchConfig, PushKernelArg};

use super::super::{dev_err, CudaBackend, CudaWeight};
use super::{CudaPackedParts, W4Kernel};
use crate::backend::BackendError;
use crate::tensor::packed_tiles::{W4Values, TILE_N};

/// Rows the sm_70 GEMV is picked for; larger steps run the GEMM (same numerics).
pub const GEMV_MAX_ROWS: usize = 16;

/// Rows of one GEMV block (`S70_GEMV_RG` × 8 in the kernel file).
const GEMV_BLOCK_ROWS: usize = 16;
/// Outputs of one GEMV block (`S70_NT` n8 tiles).
const GEMV_BLOCK_OUTS: usize = 2 * TILE_N;
/// Rows × outputs of one GEMM block (`S70_GEMM_ROWS`; 4 warps × 2 n8 tiles); N is padded to a
/// multiple of 64 by the tiles, so every block is whole along N.
const GEMM_BLOCK_ROWS: usize = 64;
const GEMM_BLOCK_OUTS: usize = 64;
/// Threads of a GEMM block.
const GEMM_THREADS: u32 = 256;

/// The two entry points, resolved once per backend.
#[derive(Debug, Clone)]
pub struct Sm70Kernels {
    gemv: CudaFunction,
    gemm: CudaFunction,
}

impl Sm70Kernels {
    /// Both entry points for compute dtype suffix `t`, or `None` when the module was not built
    /// (not sm_70 / sm_75) or `t` is not f16.
    pub fn resolve(all: &HashMap<String, CudaFunction>, t: &str) -> Option<Sm70Kernels> {
        Some(Sm70Kernels {
            gemv: all.get(&format!("w4s70_gemv_{t}"))?.clone(),
            gemm: all.get(&format!("w4s70_gemm_{t}"))?.clone(),
        })
    }
}

/// The sm_70 kernel for a step of `rows` rows.
pub fn kernel_for(rows: usize) -> W4Kernel {
    if rows <= GEMV_MAX_ROWS {
        W4Kernel::Gemv
    } else {
        W4Kernel::Gemm
    }
}

/// Grid and block of `kernel` (Gemv or Gemm) for `rows` rows, `n_pad` padded outputs and
/// `k_slices` K slices.
fn launch_dims(kernel: W4Kernel, rows: usize, n_pad: usize, k_slices: usize) -> ((u32, u32), u32) {
    match kernel {
        W4Kernel::Gemm => (
            (
                (n_pad / GEMM_BLOCK_OUTS) as u32,
                rows.div_ceil(GEMM_BLOCK_ROWS) as u32,
            ),
            GEMM_THREADS,
        ),
        _ => (
            (
                (n_pad / GEMV_BLOCK_OUTS) as u32,
                rows.div_ceil(GEMV_BLOCK_ROWS) as u32,
            ),
            32 * k_slices as u32,
        ),
    }
}

impl CudaBackend {
    /// Launch the sm_70 GEMV or GEMM (`kernel`: Gemv or Gemm; Fma is not routed here).
    ///
    /// # Safety
    /// As [`CudaBackend::packed_matmul`]: `xp` points to `rows × w.k` fp16 elements and `op` to
    /// `rows × w.n` fp16 (or f32 when `out_f32`) elements, live on this stream.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn packed_matmul_sm70(
        &self,
        ks70: &Sm70Kernels,
        w: &CudaWeight,
        parts: &CudaPackedParts,
        rows: usize,
        xp: u64,
        op: u64,
        out_f32: bool,
        kernel: W4Kernel,
    ) -> Result<(), BackendError> {
        let f = match kernel {
            W4Kernel::Gemm
            | W4Kernel::GemmBase
            | W4Kernel::GemmWide
            | W4Kernel::GemmTile
            | W4Kernel::GemmSplit
            | W4Kernel::GemmWgmma
            | W4Kernel::GemmWs => &ks70.gemm,
            W4Kernel::Gemv => &ks70.gemv,
            W4Kernel::Fma | W4Kernel::GemvBulk | W4Kernel::GemvXr => {
                return Err(BackendError::InvalidArgument(
                    "packed_matmul_sm70: the FMA and bulk kernels are launched by w4a16.rs".into(),
                ))
            }
        };
        debug_assert_eq!(parts.n_pad % GEMM_BLOCK_OUTS, 0);
        let ((gx, gy), block) = launch_dims(kernel, rows, parts.n_pad, parts.k_slices);
        let (qp, _q) = w.data.device_ptr(&self.stream);
        let (sp, _s) = parts.scales.device_ptr(&self.stream);
        let zg = parts.zeros.as_ref().map(|z| z.device_ptr(&self.stream));
        let pg = parts.perm.as_ref().map(|p| p.device_ptr(&self.stream));
        let zp: u64 = zg.as_ref().map_or(0, |(p, _)| *p);
        let pp: u64 = pg.as_ref().map_or(0, |(p, _)| *p);
        let (m, k, n) = (rows as i32, w.k as i32, w.n as i32);
        let (kb, ks, gc, gs) = (
            parts.k_blocks as i32,
            parts.k_slices as i32,
            parts.group_shift as i32,
            parts.groups as i32,
        );
        let of32 = i32::from(out_f32);
        let fp4 = i32::from(parts.values == W4Values::E2m1);
        let mut b = self.stream.launch_builder(f);
        b.arg(&xp)
            .arg(&m)
            .arg(&k)
            .arg(&qp)
            .arg(&sp)
            .arg(&zp)
            .arg(&pp);
        b.arg(&kb)
            .arg(&ks)
            .arg(&gc)
            .arg(&gs)
            .arg(&n)
            .arg(&op)
            .arg(&of32)
            .arg(&fp4);
        let cfg = LaunchConfig {
            grid_dim: (gx, gy, 1),
            block_dim: (block, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the parts were built by W4Tiles for this weight (n_pad / 8 tiles of k_blocks
        // blocks, `groups` stored groups, perm of k entries, k_slices dividing k_blocks, at most
        // 8); the grid covers n_pad outputs and ceil(rows / block rows) row tiles; the kernels
        // read x only below (rows, k) and write out only below (rows, n) — the caller vouches
        // for x and out.
        unsafe { b.launch(cfg) }.map_err(dev_err)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_steps_take_the_gemv_and_prefills_the_gemm() {
        assert_eq!(kernel_for(1), W4Kernel::Gemv);
        assert_eq!(kernel_for(16), W4Kernel::Gemv);
        assert_eq!(kernel_for(17), W4Kernel::Gemm);
        assert_eq!(kernel_for(4096), W4Kernel::Gemm);
    }

    #[test]
    fn the_grids_cover_every_output_and_row() {
        // N = 48 pads to 64; 257 rows; K = 5120 has 40 blocks, 8 slices.
        assert_eq!(launch_dims(W4Kernel::Gemv, 1, 64, 8), ((4, 1), 256));
        assert_eq!(launch_dims(W4Kernel::Gemv, 16, 64, 8), ((4, 1), 256));
        assert_eq!(launch_dims(W4Kernel::Gemv, 17, 5120, 1), ((320, 2), 32));
        assert_eq!(
            launch_dims(W4Kernel::Gemm, 257, 248_320, 8),
            ((3880, 5), 256)
        );
    }
}
