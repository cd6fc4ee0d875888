//! The wide tensor-core GEMM on packed 4-bit weights (`kernels/w4a16_gemm.cu`, `w4g_gemm_*`):
//! CTA tiles of 128 rows × 256 outputs, warp tiles of 64 × 64, the K-slice totals in shared
//! memory (224 KB per block), for steps of more than [`super::GEMV_MAX_ROWS`] rows.
//!
//! A child module of `w4a16.rs` (it reads the private [`CudaPackedParts`]).
//! [`super::W4Kernel::GemmWide`] (and [`super::W4Kernel::Gemm`], the backend's choice above 32
//! rows, once [`WIDE_BY_DEFAULT`] is set) runs this kernel where [`CudaBackend::w4g_gemm_ok`] holds (sm_90 / sm_100, 16-bit compute
//! dtype, integer nibbles, no act-order perm, k % 128 == 0, groups of ≥ 32 columns) and
//! `kernels/w4a16.cu`'s `w4_gemm` elsewhere; [`super::W4Kernel::GemmBase`] forces the latter (tests and
//! benchmarks compare the two). Same arithmetic per output element as every other sm_80+
//! kernel of the w4 tiles (the kernel file's header), so GEMV = GEMM bit for bit still holds.
//! Nothing allocates; every launch takes fixed pointers (graph-capturable).

use std::collections::HashMap;

use cudarc::driver::{CudaFunction, DevicePtr, LaunchConfig, PushKernelArg};

use super::super::{dev_err, CudaBackend, CudaWeight};
use super::CudaPackedParts;
use crate::backend::BackendError;
use crate::tensor::packed_tiles::{W4Values, TILE_N};

/// Whether [`super::W4Kernel::Gemm`] (the backend's choice above 32 rows) runs this kernel where
/// it applies. `false` until it has been run on a GPU: written and compiled (NVRTC 12.9, sm_90:
/// 255 registers, 32 bytes of spill) but not yet validated or timed there —
/// `cuda_w4a16 wide_gemm_equals_the_base_gemm_bit_for_bit` and `cuda_w4a16_bench
/// w4a16_wide_gemm_speed` are the runs that decide it.
pub(super) const WIDE_BY_DEFAULT: bool = false;

/// K slices of the cluster split-K kernels (`W4G_SPLIT_KS`: one CTA per slice, a cluster per
/// output tile); they run only weights with exactly this many slices.
pub(super) const SPLIT_KS: usize = 8;

/// Whether variant `v` is a cluster split-K kernel.
pub(super) fn is_split(v: u8) -> bool {
    (8..=10).contains(&v)
}

/// Rows of one block tile (`kernels/w4a16_gemm.cu`: 2 warps × 64).
const BLOCK_ROWS: usize = 128;
/// Outputs of one block tile (4 warps × 8 n8 tiles).
const BLOCK_OUTS: usize = 256;
/// Threads of a block.
const THREADS: u32 = 256;
/// Dynamic shared memory of a block: 2 stages × (128 × 256 B of x + 32 × 512 B of tiles) and
/// the f32 totals (128 × 256 × 4 B); `W4G_SMEM_BYTES`.
pub(super) const SMEM_BYTES: usize = 2 * (128 * 256 + 32 * 512) + 128 * 256 * 4;
// Within the 227 KB a block may opt in to on sm_90 / sm_100.
const _: () = assert!(SMEM_BYTES <= 227 * 1024);

/// The entry points of `kernels/w4a16_gemm.cu` for one compute dtype: the wide GEMM and the
/// experimental tile shapes of `W4Kernel::Experimental` (1 tall, 2 mid, 3 midn, 4 tall2, 5 mids).
#[derive(Debug, Clone)]
pub(crate) struct WideKernels {
    wide: CudaFunction,
    tall: CudaFunction,
    mid: CudaFunction,
    midn: CudaFunction,
    tall2: CudaFunction,
    mids: CudaFunction,
    tall_e: CudaFunction,
    tall2_e: CudaFunction,
    split: CudaFunction,
    split_w: CudaFunction,
    split128: CudaFunction,
}

impl WideKernels {
    /// The entry points for compute dtype suffix `t`, or `None` where the module was not built
    /// (below sm_90) or `t` is f32.
    pub(crate) fn resolve(all: &HashMap<String, CudaFunction>, t: &str) -> Option<WideKernels> {
        Some(WideKernels {
            wide: all.get(&format!("w4g_gemm_{t}"))?.clone(),
            tall: all.get(&format!("w4g_tall_{t}"))?.clone(),
            mid: all.get(&format!("w4g_mid_{t}"))?.clone(),
            midn: all.get(&format!("w4g_midn_{t}"))?.clone(),
            tall2: all.get(&format!("w4g_tall2_{t}"))?.clone(),
            mids: all.get(&format!("w4g_mids_{t}"))?.clone(),
            tall_e: all.get(&format!("w4g_tallE_{t}"))?.clone(),
            tall2_e: all.get(&format!("w4g_tall2E_{t}"))?.clone(),
            split: all.get(&format!("w4g_split_{t}"))?.clone(),
            split_w: all.get(&format!("w4g_splitw_{t}"))?.clone(),
            split128: all.get(&format!("w4g_split128_{t}"))?.clone(),
        })
    }

    /// Function, block rows, block outputs, threads and dynamic shared memory of variant `v`
    /// (0 the wide GEMM; 8..=10 the cluster split-K kernels, grid.z = [`SPLIT_KS`]).
    fn pick(&self, v: u8) -> (&CudaFunction, usize, usize, u32, usize) {
        let stage = |rows: usize, tiles: usize| rows * 256 + tiles * 512;
        match v {
            1 => (
                &self.tall,
                128,
                256,
                256,
                2 * stage(128, 32) + 128 * 256 * 4,
            ),
            2 => (&self.mid, 64, 256, 256, 4 * stage(64, 32)),
            3 => (&self.midn, 64, 128, 256, 3 * stage(64, 16)),
            4 => (&self.tall2, 128, 128, 256, 4 * stage(128, 16)),
            5 => (&self.mids, 64, 64, 128, 4 * stage(64, 8)),
            6 => (
                &self.tall_e,
                128,
                256,
                256,
                2 * stage(128, 32) + 128 * 256 * 4,
            ),
            7 => (&self.tall2_e, 128, 128, 256, 4 * stage(128, 16)),
            8 => (&self.split, 64, 128, 256, 3 * stage(64, 16)),
            9 => (&self.split_w, 64, 256, 256, 3 * stage(64, 32)),
            10 => (&self.split128, 128, 128, 256, 3 * stage(128, 16)),
            _ => (&self.wide, BLOCK_ROWS, BLOCK_OUTS, THREADS, SMEM_BYTES),
        }
    }
}

impl CudaBackend {
    /// Whether [`super::W4Kernel::GemmWide`] runs the wide GEMM for packed weight `w` here (tests check
    /// that they exercise it); `false` for a dense weight.
    pub fn w4_wide_gemm_applies(&self, w: &CudaWeight) -> bool {
        w.packed.as_ref().is_some_and(|p| self.w4g_gemm_ok(p, w.k))
    }

    /// Whether the wide GEMM runs this weight here: the kernel exists (16-bit dtype), the GPU
    /// gives a block ≥ 224 KB of shared memory (sm_90, sm_100), and the layout is the common one.
    pub(super) fn w4g_gemm_ok(&self, parts: &CudaPackedParts, k: usize) -> bool {
        self.k.w4g_gemm.is_some()
            && self.k.w4_sm70.is_none()
            && matches!((self.arch.major, self.arch.minor), (9, 0) | (10, 0))
            && parts.values == W4Values::Int4
            && parts.perm.is_none()
            && k.is_multiple_of(128)
            && parts.group_shift > 0
    }

    /// Launch `w4g_gemm_*` (the caller checked [`Self::w4g_gemm_ok`]).
    ///
    /// # Safety
    /// `xp` points to `rows × w.k` compute-dtype elements and `op` to `rows × w.n` elements of
    /// the compute dtype (or f32 when `out_f32`), live on this stream.
    pub(super) unsafe fn packed_gemm_wide(
        &self,
        w: &CudaWeight,
        parts: &CudaPackedParts,
        rows: usize,
        xp: u64,
        op: u64,
        out_f32: bool,
        variant: u8,
    ) -> Result<(), BackendError> {
        let ks = self.k.w4g_gemm.as_ref().ok_or_else(|| {
            BackendError::Unsupported("w4g_gemm needs a 16-bit compute dtype".into())
        })?;
        let (f, block_rows, block_outs, threads, smem) = ks.pick(variant);
        // Above the default 48 KB a kernel must opt in; idempotent and cheap (a driver
        // attribute, no stream work, so graph capture is unaffected).
        f.set_attribute(
            cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            smem as i32,
        )
        .map_err(dev_err)?;
        let (gx, gy) = (
            parts.n_pad.div_ceil(block_outs) as u32,
            rows.div_ceil(block_rows) as u32,
        );
        let gz = if is_split(variant) {
            debug_assert_eq!(parts.k_slices, SPLIT_KS);
            SPLIT_KS as u32
        } else {
            1
        };
        let (qp, _q) = w.data.device_ptr(&self.stream);
        let (sp, _s) = parts.scales.device_ptr(&self.stream);
        let zg = parts.zeros.as_ref().map(|z| z.device_ptr(&self.stream));
        let zp: u64 = zg.as_ref().map_or(0, |(p, _)| *p);
        let (m, k, n) = (rows as i32, w.k as i32, w.n as i32);
        let (kb, ks, gc, gs) = (
            parts.k_blocks as i32,
            parts.k_slices as i32,
            parts.group_shift as i32,
            parts.groups as i32,
        );
        let of32 = i32::from(out_f32);
        let tiles = (parts.n_pad / TILE_N) as i32;
        let mut b = self.stream.launch_builder(f);
        b.arg(&xp).arg(&m).arg(&k).arg(&qp).arg(&sp).arg(&zp);
        b.arg(&kb)
            .arg(&ks)
            .arg(&gc)
            .arg(&gs)
            .arg(&n)
            .arg(&op)
            .arg(&of32)
            .arg(&tiles);
        let cfg = LaunchConfig {
            grid_dim: (gx, gy, gz),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        tracing::trace!(rows, n = w.n, k = w.k, gx, gy, "w4g_gemm launch");
        // SAFETY: the parts were built by W4Tiles for this weight (n_pad / 8 tiles of k_blocks
        // blocks, `groups` stored groups, k_slices dividing k_blocks); w4g_gemm_ok held (no perm,
        // k % 128 == 0, int nibbles, gshift ≥ 1); the grid covers n_pad outputs and
        // ceil(rows / 128) row tiles; the kernel reads x only below (rows, k) and writes out
        // only below (rows, n) — the caller vouches for x and out.
        unsafe { b.launch(cfg) }.map_err(dev_err)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grid_covers_rows_and_padded_outputs() {
        assert_eq!(SMEM_BYTES, 229_376);
    }
}
