//! The bulk-copy W4A16 GEMV (`kernels/w4a16_bulk.cu` `w4b_gemv_{f16,bf16}`, sm_90+): steps of
//! 1–8 rows on the fast layouts, the numerics of `w4_gemv` (same bits), with each warp's
//! weights streamed into a shared-memory ring by the TMA engine instead of a register ring.
//!
//! Launch: grid (Np / 16, ceil(rows / 8)), 32 × ks threads (one warp per K slice, as `w4_gemv`),
//! dynamic shared memory [`smem_bytes`]: per warp `stages` ring stages of `sk` k blocks of its
//! two n8 tiles (1 KB per k block) and one mbarrier per stage, and the slice's scale (and
//! zero-point) table.
//!
//! Switches, read when the backend is created ([`BulkGemv::resolve`]); tests and benchmarks
//! change them in one process with `CudaBackend::set_w4_bulk`:
//! - `KILN_W4_BULK` (on / off; unset: [`BULK_DEFAULT`]): whether [`W4Kernel::Gemv`] steps of 1–8
//!   rows run it where it applies (else `w4_gemv`). [`W4Kernel::GemvBulk`] forces it.
//! - `KILN_W4_BULK_STAGES` (1–16; unset: [`DEFAULT_STAGES`]): the ring depth per warp.
//! - `KILN_W4_BULK_SK` (1, 2 or 4; unset: [`DEFAULT_SK`]): k blocks per ring stage (one barrier
//!   wait and one pair of bulk copies per stage).
//! - `KILN_W4_BULK_HINT` (on / off; unset: off): the weight copies with the L2 evict-first policy.
//! - `KILN_W4_BULK_CLUSTER` (on / off; unset: off): the cluster form `w4b_gemvc` (one warp per
//!   CTA, grid z = the 8 K slices of a tile as one thread-block cluster, the slice sums added in
//!   order through distributed shared memory: finer work units for the SMs) where the weight has
//!   8 K slices.
//! - `KILN_W4_BULK_PERSIST` (0..=8; unset: [`DEFAULT_PERSIST`]): the persistent block form
//!   `w4b_gemvp` on a grid of this many blocks per SM (capped by the occupancy the driver
//!   reports, and by the tile count); each block then runs tiles x, x + grid, ... with its
//!   warps' rings running on from one tile into the next. 0: `w4b_gemv`, one block per tile.

use std::collections::HashMap;

use cudarc::driver::{CudaFunction, DevicePtr, LaunchConfig};

use super::super::launch::{env_switch, KernelArgs};
use super::{dev_err, CudaBackend, CudaPackedParts, CudaWeight, W4Kernel, W4Values, GEMV8_ROWS};
use crate::backend::BackendError;
use crate::tensor::packed_tiles::TILE_N;

/// Whether `KILN_W4_BULK` is on when unset.
pub const BULK_DEFAULT: bool = false;

/// Ring stages per warp when `KILN_W4_BULK_STAGES` is unset.
pub const DEFAULT_STAGES: usize = 2;

/// Most ring stages per warp.
pub const MAX_STAGES: usize = 16;

/// k blocks per ring stage when `KILN_W4_BULK_SK` is unset.
pub const DEFAULT_SK: usize = 2;

/// Persistent blocks per SM when `KILN_W4_BULK_PERSIST` is unset (0: one block per tile).
pub const DEFAULT_PERSIST: usize = 0;

/// Most persistent blocks per SM.
pub const MAX_PERSIST: usize = 8;

/// Bytes of one k block in a ring stage: 128 columns of two n8 tiles (`W4B_KB_BYTES`).
const KB_BYTES: usize = 1024;

/// K slices of the cluster form (`W4B_CLUSTER_KS`: its cluster size).
const CLUSTER_KS: usize = 8;

/// Shared memory a block may use with the opt-in on sm_90 / sm_100.
const MAX_SMEM: usize = 227 * 1024;

/// The bulk GEMV's settings (`KILN_W4_BULK*`; [`CudaBackend::set_w4_bulk`] changes them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BulkSettings {
    /// Whether [`W4Kernel::Gemv`] steps of 1–8 rows run it where it applies.
    pub on: bool,
    /// Ring stages per warp (1..=[`MAX_STAGES`]).
    pub stages: usize,
    /// k blocks per stage: 1, 2 or 4 (others run as 2).
    pub sk: usize,
    /// The weight copies with the L2 evict-first policy.
    pub hint: bool,
    /// The cluster form `w4b_gemvc` (one warp per CTA, the slices of a tile one cluster) where
    /// the weight has 8 K slices; else one block of ks warps per tile (`w4b_gemv`).
    pub cluster: bool,
    /// The block form's persistent grid: blocks per SM (0: one block per tile).
    pub persist: usize,
    /// At most this many blocks in the block form's grid (0: no cap): tests make a block run
    /// several tiles on small weights with it.
    pub grid_cap: usize,
}

impl Default for BulkSettings {
    fn default() -> Self {
        BulkSettings {
            on: BULK_DEFAULT,
            stages: DEFAULT_STAGES,
            sk: DEFAULT_SK,
            hint: false,
            cluster: false,
            persist: DEFAULT_PERSIST,
            grid_cap: 0,
        }
    }
}

/// The resolved kernels and their settings.
#[derive(Debug, Clone)]
pub(crate) struct BulkGemv {
    f: CudaFunction,
    /// `w4b_gemvc_{t}`: the cluster form.
    fc: CudaFunction,
    /// `w4b_gemvp_{t}`: the persistent block form.
    fp: CudaFunction,
    set: BulkSettings,
}

impl BulkGemv {
    /// The kernels for compute dtype suffix `t` where their module was built (sm_90+; `None`
    /// otherwise or for f32), with the settings of the environment.
    pub(crate) fn resolve(
        all: &HashMap<String, CudaFunction>,
        t: &str,
    ) -> Result<Option<BulkGemv>, BackendError> {
        let [name, cname, pname] = crate::backend::cuda::kernels::w4_bulk_names(t);
        let (f, fc, fp) = match (all.get(&name), all.get(&cname), all.get(&pname)) {
            (Some(f), Some(fc), Some(fp)) => (f, fc, fp),
            (None, None, None) => return Ok(None),
            // The module was built but a form is missing: say so rather than run without it.
            _ => {
                return Err(BackendError::Unsupported(format!(
                    "w4a16_bulk.cu: {name} / {cname} / {pname}: not all three were loaded"
                )))
            }
        };
        let d = BulkSettings::default();
        let stages = match std::env::var("KILN_W4_BULK_STAGES") {
            Err(_) => d.stages,
            Ok(v) if v.trim().is_empty() => d.stages,
            Ok(v) => parse_stages(&v)?,
        };
        let sk = match std::env::var("KILN_W4_BULK_SK") {
            Err(_) => d.sk,
            Ok(v) if v.trim().is_empty() => d.sk,
            Ok(v) => match v.trim() {
                "1" => 1,
                "2" => 2,
                "4" => 4,
                _ => {
                    return Err(BackendError::InvalidArgument(format!(
                        "KILN_W4_BULK_SK={v:?}: expected 1, 2 or 4"
                    )))
                }
            },
        };
        let persist = match std::env::var("KILN_W4_BULK_PERSIST") {
            Err(_) => d.persist,
            Ok(v) if v.trim().is_empty() => d.persist,
            Ok(v) => match v.trim().parse::<usize>() {
                Ok(p) if p <= MAX_PERSIST => p,
                _ => {
                    return Err(BackendError::InvalidArgument(format!(
                        "KILN_W4_BULK_PERSIST={v:?}: expected 0..={MAX_PERSIST}"
                    )))
                }
            },
        };
        Ok(Some(BulkGemv {
            f: f.clone(),
            fc: fc.clone(),
            fp: fp.clone(),
            set: BulkSettings {
                on: env_switch("KILN_W4_BULK", d.on)?,
                stages,
                sk,
                hint: env_switch("KILN_W4_BULK_HINT", d.hint)?,
                cluster: env_switch("KILN_W4_BULK_CLUSTER", d.cluster)?,
                persist,
                grid_cap: 0,
            },
        }))
    }
}

fn parse_stages(v: &str) -> Result<usize, BackendError> {
    match v.trim().parse::<usize>() {
        Ok(s) if (1..=MAX_STAGES).contains(&s) => Ok(s),
        _ => Err(BackendError::InvalidArgument(format!(
            "KILN_W4_BULK_STAGES={v:?}: expected 1..={MAX_STAGES}"
        ))),
    }
}

/// Groups of the scale table one K slice of `per` k blocks may span (groups of 16 << gshift
/// columns; a slice starts on a k block, so it spans at most this many).
pub fn slice_groups(per: usize, gshift: u32) -> usize {
    ((per * 8 - 1) >> gshift) + 2
}

/// Dynamic shared memory of a block: `ks` warps × (`stages` stages of `sk` × [`KB_BYTES`] and
/// an 8-byte mbarrier each, and 2 tiles × `ngs` groups × 16 bytes of scales, + 8 of zero
/// points); the persistent form (`persistent`) adds a 512-byte slice sum and a second table
/// buffer per warp.
pub fn smem_bytes(
    ks: usize,
    stages: usize,
    sk: usize,
    ngs: usize,
    zero_points: bool,
    persistent: bool,
) -> usize {
    let table = 2 * ngs * if zero_points { 24 } else { 16 };
    let extra = if persistent { 512 + table } else { 0 };
    ks * (stages * (sk * KB_BYTES + 8) + table + extra)
}

impl CudaBackend {
    /// Set the bulk GEMV's settings (benchmarks and tests compare them in one process): the
    /// default choice `on`, `stages` ring stages (clamped to 1..=[`MAX_STAGES`]) of `sk` k
    /// blocks (1, 2 or 4; others run as 2), the L2 `hint`, the `cluster` form (see
    /// `KILN_W4_BULK_CLUSTER`); returns whether the kernels exist here (sm_90+, 16-bit dtype).
    pub fn set_w4_bulk(
        &mut self,
        on: bool,
        stages: usize,
        sk: usize,
        hint: bool,
        cluster: bool,
    ) -> bool {
        match self.k.w4_bulk.as_mut() {
            Some(b) => {
                b.set = BulkSettings {
                    on,
                    stages: stages.clamp(1, MAX_STAGES),
                    sk: if matches!(sk, 1 | 4) { sk } else { 2 },
                    hint,
                    cluster,
                    ..b.set
                };
                true
            }
            None => false,
        }
    }

    /// Back to the built-in settings ([`BulkSettings::default`]) with the default choice `on`
    /// (tests check the default pick); returns whether the kernels exist.
    pub fn reset_w4_bulk(&mut self, on: bool) -> bool {
        match self.k.w4_bulk.as_mut() {
            Some(b) => {
                b.set = BulkSettings {
                    on,
                    ..BulkSettings::default()
                };
                true
            }
            None => false,
        }
    }

    /// Set the block form's persistent grid (`persist` blocks per SM, clamped to
    /// [`MAX_PERSIST`]; 0: one block per tile) and a cap on its block count (`grid_cap`, 0:
    /// none; tests use it to make a block run several tiles); returns whether the kernels exist.
    pub fn set_w4_bulk_grid(&mut self, persist: usize, grid_cap: usize) -> bool {
        match self.k.w4_bulk.as_mut() {
            Some(b) => {
                b.set.persist = persist.min(MAX_PERSIST);
                b.set.grid_cap = grid_cap;
                true
            }
            None => false,
        }
    }

    /// Whether the cluster form runs a weight of `ks` K slices.
    fn w4_bulk_cluster(set: &BulkSettings, ks: usize) -> bool {
        set.cluster && ks == CLUSTER_KS
    }

    /// Whether the persistent block form runs (not the cluster form, `persist` or a grid cap
    /// set).
    fn w4_bulk_persistent(set: &BulkSettings, ks: usize) -> bool {
        !Self::w4_bulk_cluster(set, ks) && (set.persist > 0 || set.grid_cap > 0)
    }

    /// Whether a step of `rows` rows of `kernel` on this layout runs the bulk GEMV.
    pub(super) fn w4_bulk_runs(
        &self,
        kernel: W4Kernel,
        parts: &CudaPackedParts,
        k: usize,
        rows: usize,
    ) -> bool {
        let Some(b) = self.k.w4_bulk.as_ref() else {
            return false;
        };
        let forced = kernel == W4Kernel::GemvBulk;
        let warps = if Self::w4_bulk_cluster(&b.set, parts.k_slices) {
            1
        } else {
            parts.k_slices
        };
        (forced || (kernel == W4Kernel::Gemv && b.set.on))
            && self.w4_tensor_cores()
            && self.k.w4_sm70.is_none()
            && parts.gemv_fast_ok(k)
            && rows <= GEMV8_ROWS
            && smem_bytes(
                warps,
                b.set.stages,
                b.set.sk,
                slice_groups(parts.k_blocks / parts.k_slices, parts.group_shift),
                parts.zeros.is_some(),
                Self::w4_bulk_persistent(&b.set, parts.k_slices),
            ) <= MAX_SMEM
    }

    /// Launch `w4b_gemv` for a step of 1..=8 rows ([`Self::w4_bulk_runs`] holds).
    ///
    /// # Safety
    /// As [`Self::packed_matmul`].
    pub(super) unsafe fn packed_gemv_bulk(
        &self,
        w: &CudaWeight,
        parts: &CudaPackedParts,
        rows: usize,
        xp: u64,
        op: u64,
        out_f32: bool,
    ) -> Result<(), BackendError> {
        let b = self.k.w4_bulk.as_ref().ok_or_else(|| {
            BackendError::Unsupported("the bulk GEMV needs sm_90+ and a 16-bit dtype".into())
        })?;
        let set = b.set;
        let ks = parts.k_slices;
        let cluster = Self::w4_bulk_cluster(&set, ks);
        let persistent = Self::w4_bulk_persistent(&set, ks);
        let (f, warps) = if cluster {
            (&b.fc, 1)
        } else if persistent {
            (&b.fp, ks)
        } else {
            (&b.f, ks)
        };
        let ngs = slice_groups(parts.k_blocks / ks, parts.group_shift);
        let shared = smem_bytes(
            warps,
            set.stages,
            set.sk,
            ngs,
            parts.zeros.is_some(),
            persistent,
        );
        // Above the default 48 KB a kernel must opt in; idempotent and cheap (a driver
        // attribute, no stream work, so graph capture is unaffected).
        f.set_attribute(
            cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            shared as i32,
        )
        .map_err(dev_err)?;
        let (qp, _q) = w.data.device_ptr(&self.stream);
        let (sp, _s) = parts.scales.device_ptr(&self.stream);
        let zg = parts.zeros.as_ref().map(|z| z.device_ptr(&self.stream));
        let zp: u64 = zg.as_ref().map_or(0, |(p, _)| *p);
        let mut a = KernelArgs::new();
        a.ptr(xp)
            .i32(rows as i32)
            .i32(w.k as i32)
            .ptr(qp)
            .ptr(sp)
            .ptr(zp);
        a.i32(parts.k_blocks as i32)
            .i32(ks as i32)
            .i32(parts.group_shift as i32)
            .i32(parts.groups as i32)
            .i32(w.n as i32)
            .ptr(op)
            .i32(i32::from(out_f32))
            .i32(i32::from(parts.values == W4Values::E2m1))
            .i32(i32::from(self.w4_trigger_late))
            .i32(set.stages as i32)
            .i32(ngs as i32)
            .i32(i32::from(set.hint))
            .i32(set.sk as i32);
        let tiles = parts.n_pad / (2 * TILE_N);
        let mut grid = tiles;
        if persistent && set.persist > 0 {
            // The occupancy the driver reports for this block size and shared memory, at most
            // `persist` blocks per SM, on every SM; never more blocks than tiles.
            let occ = f
                .occupancy_max_active_blocks_per_multiprocessor((32 * warps) as u32, shared, None)
                .map_err(dev_err)? as usize;
            let sms = self
                .ctx
                .attribute(
                    cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                )
                .map_err(dev_err)? as usize;
            grid = grid.min(set.persist.min(occ.max(1)) * sms);
        }
        if persistent && set.grid_cap > 0 {
            grid = grid.min(set.grid_cap);
        }
        a.i32(tiles as i32);
        let cfg = LaunchConfig {
            grid_dim: (
                grid as u32,
                rows.div_ceil(GEMV8_ROWS) as u32,
                if cluster { ks as u32 } else { 1 },
            ),
            block_dim: ((32 * warps) as u32, 1, 1),
            shared_mem_bytes: shared as u32,
        };
        // SAFETY: the parts were built by W4Tiles for this weight (a fast layout: no perm,
        // k % 128 == 0, n_pad / 8 tiles of k_blocks blocks, `groups` stored groups); the grid's
        // blocks (x < `tiles`, each running tiles x, x + grid, ... < `tiles`) cover n_pad outputs
        // in m16 tiles and ceil(rows / 8) row blocks of <= 8 rows; the bulk
        // copies read whole 512-byte tile blocks inside the words, the table loads whole
        // (tile, group) units inside scales / zeros; x is read only below (rows, k) and out
        // written only below (rows, n) (the caller vouches for both); shared memory is sized by
        // `smem_bytes` for the kernel's layout. The kernel reads only weights, scales and zeros
        // before its griddepcontrol.wait, which makes the PDL attribute allowed.
        // The cluster form's cluster (1, 1, 8) is compiled in (`__cluster_dims__`), and its grid's
        // z is ks == 8.
        unsafe { self.launch_args(f, cfg, &mut a, self.pdl_packed()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slice_groups_bound_every_slice_span() {
        for gshift in 0..6u32 {
            for per in 1..40usize {
                for s in 0..8usize {
                    let kb0 = s * per;
                    let first = (kb0 * 8) >> gshift;
                    let last = ((kb0 + per) * 8 - 1) >> gshift;
                    assert!(last - first < slice_groups(per, gshift));
                }
            }
        }
    }

    #[test]
    fn shared_memory_of_the_27b_shapes_fits_four_blocks_at_two_stages_of_two() {
        // K = 5120 (40 k blocks, 8 slices of 5) and 17408 (136, 8 of 17), group 128.
        for per in [5usize, 17] {
            let s = smem_bytes(8, 2, 2, slice_groups(per, 3), true, false);
            assert!(4 * (s + 1024) <= 228 * 1024, "{s}");
            // The persistent form (3 blocks per SM by its registers).
            let s = smem_bytes(8, 2, 2, slice_groups(per, 3), true, true);
            assert!(3 * (s + 1024) <= 228 * 1024, "{s}");
        }
        assert_eq!(smem_bytes(1, 1, 1, 1, false, false), 1024 + 8 + 32);
        assert_eq!(
            smem_bytes(2, 3, 4, 1, false, false),
            2 * (3 * (4096 + 8) + 32)
        );
        assert_eq!(
            smem_bytes(2, 3, 4, 1, true, true),
            2 * (3 * (4096 + 8) + 48 + 512 + 48)
        );
        assert!(parse_stages("0").is_err());
        assert!(parse_stages("17").is_err());
        assert_eq!(parse_stages(" 6 ").unwrap(), 6);
    }
}
