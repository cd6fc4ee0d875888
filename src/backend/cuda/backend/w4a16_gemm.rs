//! The sm_90 tensor-core GEMMs on packed 4-bit weights (`kernels/w4a16_gemm.cu`), for steps of
//! more than [`super::GEMV_MAX_ROWS`] rows, picked by the step's shape ([`WideKind::for_rows`]):
//! - [`WideKind::Split`] (`w4g_split_*`): 64 × 128 block tiles, the 8 K slices of a tile in 8
//!   CTAs of one thread-block cluster, summed in slice order through distributed shared memory
//!   (steps of at most [`SPLIT_MAX_TILES`] tiles, weights with 8 slices): 8× the blocks of a
//!   one-CTA tile, which a 64-row step needs (N = 5120 gives 40 tiles of 128 outputs for 132
//!   SMs);
//! - [`WideKind::Tile`] (`w4g_tile_*`): the same 64 × 128 tile, one CTA over the whole K, two
//!   CTAs per SM (more tiles, up to [`TILE_MAX_ROWS`] rows; and the split's steps on weights
//!   of other slice counts);
//! - [`WideKind::Wide`] (`w4g_gemm_*`): 128 × 256 block tiles, warp tiles of 64 × 64, the
//!   K-slice totals in shared memory (224 KB per block), for larger steps;
//! - [`WideKind::Wgmma`] (`w4g_wgmma_*` of `kernels/w4a16_wgmma.cu`, sm_90 only: that module is
//!   compiled for `sm_90a`;
//!   steps of more than [`WGMMA_MIN_ROWS`] rows there):
//!   256 outputs × 128 rows per block, two warpgroups of warpgroup MMAs (`wgmma` m64n128k16, the
//!   decoded weights as register A operands, x from shared memory), the slice totals in shared
//!   memory (225 KB per block); the same bits (tests/cuda_wgmma_probe.rs);
//! - [`WideKind::Ws`] (`w4g_ws_*` of `kernels/w4a16_wgmma.cu`, sm_90 only): the same tile and
//!   arithmetic, warp-specialised: a producer warpgroup stages x by `cp.async` into a 3-stage
//!   ring of mbarriers, two consumer warpgroups decode and issue wgmma without a block barrier
//!   (384 threads, 225 KB); picked in place of [`WideKind::Wgmma`] (steps of more than
//!   [`WGMMA_MIN_ROWS`] rows, and of [`WS_MIN_ROWS`] rows on grids of ≥ [`WS_MIN_CTAS`] blocks)
//!   unless `KILN_W4G_WS=0`.
//!
//! The ranges are the H200 measurements of docs/benchmarks.md (branch `gemm`). A child module of
//! `w4a16.rs` (it reads the private [`CudaPackedParts`]). They run where
//! [`CudaBackend::w4g_gemm_ok`] holds (sm_90 / sm_100, 16-bit compute dtype, integer nibbles, no
//! act-order perm, k % 128 == 0, groups of ≥ 32 columns); `kernels/w4a16.cu` runs everything
//! else. Same arithmetic per output element as every other sm_80+ kernel of the w4 tiles (the
//! kernel file's header), so GEMV = GEMM bit for bit holds whichever runs, and a row's result
//! does not depend on its batch. Nothing allocates; every launch takes fixed pointers
//! (graph-capturable).

use std::collections::HashMap;

use cudarc::driver::{CudaFunction, DevicePtr, LaunchConfig, PushKernelArg};

use super::super::{dev_err, CudaBackend, CudaWeight};
use super::CudaPackedParts;
use crate::backend::BackendError;
use crate::tensor::packed_tiles::{W4Values, TILE_N};

/// Most 64 × 128 tiles a step may have for [`WideKind::Split`] to run it (else
/// [`WideKind::Tile`]): the one-CTA tile runs two CTAs per SM, so below ~2.5 waves of them on
/// the 132-SM H200 it starves or ends on a thin last wave, and the split's 8× more, shorter CTAs
/// win. Measured on the 27B shapes (docs/benchmarks.md, branch `gemm`): the split was faster at
/// 160–320 tiles (e.g. 5120 × 17408 at 512 rows: 411 against 498 µs), the tile at 384 and more
/// (17408 × 5120 at 256 rows, 544 tiles: 239 against 247 µs).
pub(super) const SPLIT_MAX_TILES: usize = 320;

/// Most rows [`WideKind::Split`] / [`WideKind::Tile`] run; larger steps run [`WideKind::Wide`]
/// (H200: the tile 8–26% faster than the wide one at 1024 rows, level at 2048, 1–8% slower at
/// 4096) where [`WideKind::Wgmma`] does not.
pub(super) const TILE_MAX_ROWS: usize = 2048;

/// Steps of more rows than this run the warpgroup-MMA GEMM on an sm_90 GPU: [`WideKind::Ws`]
/// (or [`WideKind::Wgmma`] with `KILN_W4G_WS=0`; docs/benchmarks.md, branches `wg`, `wg2`).
pub(super) const WGMMA_MIN_ROWS: usize = 1024;

/// Steps of at least [`WS_MIN_ROWS`] rows whose [`WideKind::Ws`] grid has at least
/// [`WS_MIN_CTAS`] blocks (more than a wave of the H200's 132 SMs) also run it. Measured at
/// 1024 rows (docs/benchmarks.md, branch `wg2`): `w4g_ws` beat the 64 × 128 tile on the six
/// 27B shapes of 160–544 blocks (e.g. 5120 × 17408: 705 against 780 µs) and lost on 1024 × 5120
/// (32 blocks: 113 against 60 µs).
pub(super) const WS_MIN_ROWS: usize = 1024;
/// See [`WS_MIN_ROWS`].
pub(super) const WS_MIN_CTAS: usize = 160;

/// Whether [`WideKind::Ws`] takes the place of [`WideKind::Wgmma`] in the pick: on unless
/// `KILN_W4G_WS=0` (a measurement switch, read once per process; an invalid value is reported
/// and ignored).
pub(super) fn ws_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(
        || match super::super::launch::env_switch("KILN_W4G_WS", true) {
            Ok(on) => on,
            Err(e) => {
                tracing::warn!(error = %e, "KILN_W4G_WS ignored");
                true
            }
        },
    )
}

/// K slices of [`WideKind::Split`] (`W4G_SPLIT_KS`: one CTA per slice, a cluster per output
/// tile); weights with another slice count run [`WideKind::Tile`] instead.
const SPLIT_KS: usize = 8;

/// Threads of a block (all kernels but [`WideKind::Ws`]).
const THREADS: u32 = 256;
/// Threads of a [`WideKind::Ws`] block: a producer warpgroup and two consumer warpgroups.
const WS_THREADS: u32 = 384;
/// Dynamic shared memory of a [`WideKind::Ws`] block: [`WGMMA_SMEM`] and 6 mbarriers (3 stages
/// × full / empty); `W4S_SMEM_BYTES`.
const WS_SMEM: usize = WGMMA_SMEM + 6 * 8;
const _: () = assert!(WS_SMEM <= 227 * 1024);

/// Rows × outputs of the narrow block tile (`W4G_TILE_CFG`: 8 warps of 64 rows × 16 outputs).
const TILE_ROWS: usize = 64;
const TILE_OUTS: usize = 128;
/// Dynamic shared memory of a narrow block: 3 stages × (64 × 256 B of x + 16 × 512 B of tiles);
/// `W4G_TILE_SMEM`.
const TILE_SMEM: usize = 3 * (64 * 256 + 16 * 512);

/// Rows × outputs of the wide block tile (2 × 4 warps of 64 × 64).
const WIDE_ROWS: usize = 128;
const WIDE_OUTS: usize = 256;
/// Dynamic shared memory of a wide block: 2 stages × (128 × 256 B of x + 32 × 512 B of tiles)
/// and the f32 totals (128 × 256 × 4 B); `W4G_SMEM_BYTES`.
const WIDE_SMEM: usize = 2 * (128 * 256 + 32 * 512) + 128 * 256 * 4;
// Within the 227 KB a block may opt in to on sm_90 / sm_100.
const _: () = assert!(WIDE_SMEM <= 227 * 1024);

/// Rows × outputs of the wgmma block tile (2 warpgroups of 2 m64 tiles × 128 rows).
const WGMMA_ROWS: usize = 128;
const WGMMA_OUTS: usize = 256;
/// Dynamic shared memory of a wgmma block: 1 KB of alignment slack, 3 stages × 128 × 256 B of
/// x, the f32 totals (128 × 256 × 4 B); `W4W_SMEM_BYTES`.
const WGMMA_SMEM: usize = 1024 + 3 * 128 * 256 + 128 * 256 * 4;
const _: () = assert!(WGMMA_SMEM <= 227 * 1024);

/// Which kernel of `kernels/w4a16_gemm.cu` (or `kernels/w4a16_wgmma.cu`) runs a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum WideKind {
    /// `w4g_split_*`: cluster split-K over 64 × 128 tiles (weights with [`SPLIT_KS`] slices).
    Split,
    /// `w4g_tile_*`: 64 × 128 tiles, one CTA over the whole K.
    Tile,
    /// `w4g_gemm_*`: 128 × 256 tiles.
    Wide,
    /// `w4g_wgmma_*`: 256 × 128 tiles of warpgroup MMAs (sm_90 only; elsewhere [`WideKind::Wide`]
    /// runs in its place).
    Wgmma,
    /// `w4g_ws_*`: the same tiles, warp-specialised (sm_90 only; elsewhere [`WideKind::Wide`]).
    Ws,
}

impl WideKind {
    /// The kernel for a step of `rows` rows on a weight of `n_pad` padded outputs and `k_slices`
    /// K slices, where `wgmma` says whether the warpgroup-MMA kernels run here and `ws` whether
    /// [`WideKind::Ws`] is picked in place of [`WideKind::Wgmma`] ([`ws_enabled`]).
    pub(super) fn for_rows(
        rows: usize,
        n_pad: usize,
        k_slices: usize,
        wgmma: bool,
        ws: bool,
    ) -> WideKind {
        let tiles = n_pad.div_ceil(TILE_OUTS) * rows.div_ceil(TILE_ROWS);
        let ws_ctas = n_pad.div_ceil(WGMMA_OUTS) * rows.div_ceil(WGMMA_ROWS);
        if wgmma && ws && (rows > WGMMA_MIN_ROWS || (rows >= WS_MIN_ROWS && ws_ctas >= WS_MIN_CTAS))
        {
            WideKind::Ws
        } else if wgmma && rows > WGMMA_MIN_ROWS {
            WideKind::Wgmma
        } else if rows > TILE_MAX_ROWS {
            WideKind::Wide
        } else if tiles <= SPLIT_MAX_TILES {
            WideKind::Split.or_tile(k_slices)
        } else {
            WideKind::Tile
        }
    }

    /// `self`, or [`WideKind::Tile`] in place of a split the slice count does not allow.
    pub(super) fn or_tile(self, k_slices: usize) -> WideKind {
        if self == WideKind::Split && k_slices != SPLIT_KS {
            WideKind::Tile
        } else {
            self
        }
    }

    /// Block rows, block outputs, grid.z and dynamic shared memory of a launch.
    fn dims(self) -> (usize, usize, u32, usize) {
        match self {
            WideKind::Split => (TILE_ROWS, TILE_OUTS, SPLIT_KS as u32, TILE_SMEM),
            WideKind::Tile => (TILE_ROWS, TILE_OUTS, 1, TILE_SMEM),
            WideKind::Wide => (WIDE_ROWS, WIDE_OUTS, 1, WIDE_SMEM),
            WideKind::Wgmma => (WGMMA_ROWS, WGMMA_OUTS, 1, WGMMA_SMEM),
            WideKind::Ws => (WGMMA_ROWS, WGMMA_OUTS, 1, WS_SMEM),
        }
    }

    /// Threads of a block.
    fn threads(self) -> u32 {
        if self == WideKind::Ws {
            WS_THREADS
        } else {
            THREADS
        }
    }

    /// Grid of a launch over `rows` rows and `n_pad` padded outputs.
    fn grid(self, rows: usize, n_pad: usize) -> (u32, u32, u32) {
        let (br, bo, gz, _) = self.dims();
        (n_pad.div_ceil(bo) as u32, rows.div_ceil(br) as u32, gz)
    }
}

/// The entry points of `kernels/w4a16_gemm.cu` and `kernels/w4a16_wgmma.cu` for one compute
/// dtype.
#[derive(Debug, Clone)]
pub(crate) struct WideKernels {
    wide: CudaFunction,
    tile: CudaFunction,
    split: CudaFunction,
    wgmma: CudaFunction,
    ws: CudaFunction,
}

impl WideKernels {
    /// The entry points for compute dtype suffix `t`, or `None` where the modules were not built
    /// (below sm_90) or `t` is f32.
    pub(crate) fn resolve(all: &HashMap<String, CudaFunction>, t: &str) -> Option<WideKernels> {
        Some(WideKernels {
            wide: all.get(&format!("w4g_gemm_{t}"))?.clone(),
            tile: all.get(&format!("w4g_tile_{t}"))?.clone(),
            split: all.get(&format!("w4g_split_{t}"))?.clone(),
            wgmma: all.get(&format!("w4g_wgmma_{t}"))?.clone(),
            ws: all.get(&format!("w4g_ws_{t}"))?.clone(),
        })
    }

    fn function(&self, kind: WideKind) -> &CudaFunction {
        match kind {
            WideKind::Split => &self.split,
            WideKind::Tile => &self.tile,
            WideKind::Wide => &self.wide,
            WideKind::Wgmma => &self.wgmma,
            WideKind::Ws => &self.ws,
        }
    }
}

impl CudaBackend {
    /// Whether the sm_90 GEMMs of this module run packed weight `w` here (tests check that they
    /// exercise them); `false` for a dense weight.
    pub fn w4_wide_gemm_applies(&self, w: &CudaWeight) -> bool {
        w.packed.as_ref().is_some_and(|p| self.w4g_gemm_ok(p, w.k))
    }

    /// Whether the sm_90 GEMMs run this weight here: the kernels exist (16-bit dtype), the GPU
    /// gives a block ≥ 224 KB of shared memory and clusters (sm_90, sm_100), and the layout is
    /// the common one.
    pub(super) fn w4g_gemm_ok(&self, parts: &CudaPackedParts, k: usize) -> bool {
        self.k.w4g_gemm.is_some()
            && self.k.w4_sm70.is_none()
            && matches!((self.arch.major, self.arch.minor), (9, 0) | (10, 0))
            && parts.values == W4Values::Int4
            && parts.perm.is_none()
            && k.is_multiple_of(128)
            && parts.group_shift > 0
    }

    /// Whether `w4g_wgmma` runs here: an sm_90 GPU (the module was compiled for `sm_90a`; the
    /// kernel traps on every other target).
    pub(super) fn w4g_wgmma_ok(&self) -> bool {
        (self.arch.major, self.arch.minor) == (9, 0)
    }

    /// Launch kernel `kind` (the caller checked [`Self::w4g_gemm_ok`]; a split is run as a tile
    /// where the slice count does not allow it).
    ///
    /// # Safety
    /// `xp` points to `rows × w.k` compute-dtype elements and `op` to `rows × w.n` elements of
    /// the compute dtype (or f32 when `out_f32`), live on this stream.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn packed_gemm_wide(
        &self,
        w: &CudaWeight,
        parts: &CudaPackedParts,
        rows: usize,
        xp: u64,
        op: u64,
        out_f32: bool,
        kind: WideKind,
    ) -> Result<(), BackendError> {
        let ks = self.k.w4g_gemm.as_ref().ok_or_else(|| {
            BackendError::Unsupported("w4g_gemm needs a 16-bit compute dtype".into())
        })?;
        let mut kind = kind.or_tile(parts.k_slices);
        if matches!(kind, WideKind::Wgmma | WideKind::Ws) && !self.w4g_wgmma_ok() {
            kind = WideKind::Wide;
        }
        let f = ks.function(kind);
        let (_, _, _, smem) = kind.dims();
        // Above the default 48 KB a kernel must opt in; idempotent and cheap (a driver
        // attribute, no stream work, so graph capture is unaffected).
        f.set_attribute(
            cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            smem as i32,
        )
        .map_err(dev_err)?;
        let (gx, gy, gz) = kind.grid(rows, parts.n_pad);
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
            block_dim: (kind.threads(), 1, 1),
            shared_mem_bytes: smem as u32,
        };
        tracing::trace!(rows, n = w.n, k = w.k, ?kind, gx, gy, gz, "w4g launch");
        // SAFETY: the parts were built by W4Tiles for this weight (n_pad / 8 tiles of k_blocks
        // blocks, `groups` stored groups, k_slices dividing k_blocks, and equal to the split's
        // cluster size when `kind` is Split: `or_tile` above); w4g_gemm_ok held (no perm,
        // k % 128 == 0, int nibbles, gshift ≥ 1); the grid covers n_pad outputs, ceil(rows /
        // block rows) row tiles and (split) the 8 slices; the kernels read x only below (rows, k)
        // and write out only below (rows, n) — the caller vouches for x and out.
        unsafe { b.launch(cfg) }.map_err(dev_err)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_step_shape_picks_the_kernel() {
        // 17408 outputs: 136 tiles of 128 per 64 rows.
        assert_eq!(
            WideKind::for_rows(33, 17408, 8, true, true),
            WideKind::Split
        );
        assert_eq!(
            WideKind::for_rows(128, 17408, 8, false, true),
            WideKind::Split
        );
        assert_eq!(
            WideKind::for_rows(129, 17408, 8, false, true),
            WideKind::Tile
        );
        // 5120 outputs: 40 tiles per 64 rows, the split to 512 rows.
        assert_eq!(
            WideKind::for_rows(512, 5120, 8, false, true),
            WideKind::Split
        );
        assert_eq!(
            WideKind::for_rows(513, 5120, 8, false, true),
            WideKind::Tile
        );
        assert_eq!(WideKind::for_rows(64, 5120, 4, false, true), WideKind::Tile);
        assert_eq!(
            WideKind::for_rows(2048, 17408, 8, false, true),
            WideKind::Tile
        );
        assert_eq!(
            WideKind::for_rows(2049, 1024, 8, false, true),
            WideKind::Wide
        );
        // Where the warpgroup-MMA kernels run (sm_90): w4g_ws above WGMMA_MIN_ROWS whatever the
        // shape, and from WS_MIN_ROWS on grids of at least WS_MIN_CTAS blocks.
        assert_eq!(
            WideKind::for_rows(1023, 17408, 8, true, true),
            WideKind::Tile
        );
        assert_eq!(WideKind::for_rows(1024, 17408, 8, true, true), WideKind::Ws);
        assert_eq!(WideKind::for_rows(1024, 5120, 8, true, true), WideKind::Ws);
        assert_eq!(
            WideKind::for_rows(1024, 4096, 8, true, true),
            WideKind::Tile
        );
        assert_eq!(
            WideKind::for_rows(1024, 1024, 8, true, true),
            WideKind::Split
        );
        assert_eq!(WideKind::for_rows(1025, 17408, 8, true, true), WideKind::Ws);
        assert_eq!(WideKind::for_rows(4096, 1024, 1, true, true), WideKind::Ws);
        // KILN_W4G_WS=0: the earlier pick (w4g_wgmma above WGMMA_MIN_ROWS).
        assert_eq!(
            WideKind::for_rows(1024, 17408, 8, true, false),
            WideKind::Tile
        );
        assert_eq!(
            WideKind::for_rows(1025, 17408, 8, true, false),
            WideKind::Wgmma
        );
        assert_eq!(
            WideKind::for_rows(4096, 1024, 1, true, false),
            WideKind::Wgmma
        );
        assert_eq!(WideKind::Split.or_tile(1), WideKind::Tile);
        assert_eq!(WideKind::Wide.or_tile(1), WideKind::Wide);
    }

    #[test]
    fn grids_cover_rows_outputs_and_slices() {
        assert_eq!(WideKind::Wide.grid(4096, 17408), (68, 32, 1));
        assert_eq!(WideKind::Wgmma.grid(4096, 17408), (68, 32, 1));
        assert_eq!(WideKind::Wgmma.grid(129, 64), (1, 2, 1));
        assert_eq!(WGMMA_SMEM, 230_400);
        assert_eq!(WideKind::Ws.grid(4096, 17408), (68, 32, 1));
        assert_eq!(WS_SMEM, 230_448);
        assert_eq!(
            (WideKind::Ws.threads(), WideKind::Wgmma.threads()),
            (384, 256)
        );
        assert_eq!(WideKind::Tile.grid(257, 64), (1, 5, 1));
        assert_eq!(WideKind::Split.grid(64, 5120), (40, 1, 8));
        assert_eq!(WIDE_SMEM, 229_376);
        assert_eq!(TILE_SMEM, 73_728);
    }
}
