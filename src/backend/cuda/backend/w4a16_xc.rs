//! The cluster W4A16 GEMV for 9–16 rows (`kernels/w4a16_xs.cu` `w4_gemvxc{tpc}{d|p}{d}b{b}_{f16,bf16}`,
//! sm_90+): the numerics of `w4_gemv_xs` (same bits), with the 8 K slices of `tpc` m16 output
//! tiles as one thread-block cluster (1, 1, 8), each CTA holding its slice's 16 x rows in shared
//! memory once for all its tiles, the slice sums added in order through distributed shared memory
//! (read after a cluster barrier, or pushed into their owner CTA: the `p` builds).
//!
//! Launch: grid (Np / (16 tpc), ceil(rows / 16), 8), 32 tpc threads, dynamic shared memory
//! [`smem_bytes`]; only for weights of 8 K slices on the fast layouts
//! ([`CudaBackend::w4_xc_runs`]).
//!
//! Switch, read when the backend is created ([`XcGemv::resolve`]); tests and benchmarks change it
//! in one process with [`CudaBackend::set_w4_xc`] / [`CudaBackend::set_w4_xc_base_pick`]:
//! `KILN_W4_XC` = `off`, `on` (unset: on where [`XC_DEFAULT_ON`]), `base` (on, the pick among the
//! builds without L2 hints, as before they existed) or one build of `kernels.rs` `W4_XC_VARIANTS`
//! by [`build_name`] (e.g. `8x2b4`, `8p2b4`, `4x2b8hp2`). `on` runs the first build of
//! [`pick_build`]'s order that applies to the weight.
//! [`W4Kernel::Gemv`] steps of [`XcSettings::min_rows`]–[`XcSettings::max_rows`] rows (by
//! default 9–16, and 7–16 on K = 17408's long slices: [`default_min_rows`];
//! `KILN_W4_XC_MIN_ROWS` sets the first for every weight) run it where it applies, else
//! `w4_gemvx1` / `w4_gemvx2` (the 1–8-row GEMV below).

use std::collections::HashMap;

use cudarc::driver::{CudaFunction, DevicePtr, LaunchConfig};

use super::super::launch::KernelArgs;
use super::{dev_err, CudaBackend, CudaPackedParts, CudaWeight, W4Values, GEMV8_ROWS};
use crate::backend::cuda::kernels::{w4_xc_names, w4_xc_tail, W4_XC_VARIANTS};
use crate::backend::BackendError;
use crate::tensor::packed_tiles::TILE_N;

/// Whether the kernel runs when `KILN_W4_XC` is unset.
pub const XC_DEFAULT_ON: bool = true;

/// A build: (m16 tiles per CTA, weight ring depth, CTAs per SM its register cap allows, whether
/// the slice sums are pushed into their owner CTA (`st.async`, the `TPCpDbB` builds) instead of
/// read through two cluster barriers (`TPCxDbB`), the L2 prefetch distance in k blocks (0: no L2
/// hints; else `kernels/w4a16_hints.cuh`'s evict-first weight loads and a prefetch that far
/// ahead: `hp{pf}`)).
pub type XcBuild = (usize, usize, usize, bool, usize);

/// A build's name in `KILN_W4_XC` and test output: `8x2b4`, `8p2b4` (pushed slice sums),
/// `4x2b8hp3` (L2 hints, prefetch 3 k blocks ahead).
pub fn build_name((tpc, d, b, push, pf): XcBuild) -> String {
    format!(
        "{tpc}{}{d}b{b}{}",
        if push { 'p' } else { 'x' },
        w4_xc_tail(pf)
    )
}

/// K slices the kernel runs (its cluster size, `W4XC_KS`).
const XC_KS: usize = 8;

/// Rows of one CTA's x (`RG` = 2 row groups of 8).
const XC_ROWS: usize = 16;

/// Bytes of one k block of x in shared memory (`W4XC_KB_BYTES`: 16 rows × 256 bytes).
const XC_KB_BYTES: usize = XC_ROWS * 256;

/// Shared memory a block may use with the opt-in on sm_90 / sm_100.
const MAX_SMEM: usize = 227 * 1024;

/// Shared memory of an SM on sm_90 (228 KB), of which the driver keeps 1 KB per CTA.
const SM_SMEM: usize = 228 * 1024;

/// The kernel's settings (`KILN_W4_XC`; [`CudaBackend::set_w4_xc`] changes them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct XcSettings {
    /// Whether it runs.
    pub on: bool,
    /// One build for every launch, or `None`: [`pick_build`] per launch.
    pub build: Option<XcBuild>,
    /// [`pick_build`] among the builds without L2 hints only (`KILN_W4_XC=base`).
    pub base_pick: bool,
    /// Most rows it runs (16; benchmarks may try 32: ceil(rows / 16) row tiles).
    pub max_rows: usize,
    /// Fewest rows it runs (`KILN_W4_XC_MIN_ROWS`, benchmarks may try others; `None`:
    /// [`default_min_rows`] of the weight's slice length): steps of fewer rows run the 1–8-row
    /// GEMV.
    pub min_rows: Option<usize>,
}

/// The resolved kernels (one per build) and the settings.
#[derive(Debug, Clone)]
pub(crate) struct XcGemv {
    f: Vec<(XcBuild, CudaFunction)>,
    set: XcSettings,
}

/// Parse a `KILN_W4_XC` value: (on, fixed build, base pick).
fn parse_xc(v: &str) -> Result<(bool, Option<XcBuild>, bool), BackendError> {
    if v.trim().eq_ignore_ascii_case("base") {
        return Ok((true, None, true));
    }
    let (on, build) = parse_build_switch(
        "KILN_W4_XC",
        ", base",
        v,
        XC_DEFAULT_ON,
        &W4_XC_VARIANTS,
        build_name,
    )?;
    Ok((on, build, false))
}

/// Parse the value `v` of a cluster GEMV's switch `var` (`KILN_W4_XC`, `KILN_W4_XR`): `off`,
/// `on`, empty (`default_on`) or one of `builds` by `name`, as (on, fixed build); `also` names
/// the caller's other values in the error (`, base`).
pub(super) fn parse_build_switch<B: Copy>(
    var: &str,
    also: &str,
    v: &str,
    default_on: bool,
    builds: &[B],
    name: fn(B) -> String,
) -> Result<(bool, Option<B>), BackendError> {
    let v = v.trim().to_ascii_lowercase();
    match v.as_str() {
        "" => Ok((default_on, None)),
        "0" | "off" | "false" => Ok((false, None)),
        "1" | "on" | "true" => Ok((true, None)),
        other => builds
            .iter()
            .find(|&&b| name(b) == other)
            .map(|b| (true, Some(*b)))
            .ok_or_else(|| {
                let names: Vec<String> = builds.iter().map(|&b| name(b)).collect();
                BackendError::InvalidArgument(format!(
                    "{var}={v:?}: expected off, on{also} or one of {names:?}"
                ))
            }),
    }
}

/// The kernels named `names` from the loaded ones: all of them, none (`None`: the module was not
/// built here), or an error naming `file` if only some were loaded.
pub(super) fn resolve_all(
    all: &HashMap<String, CudaFunction>,
    names: &[String],
    file: &str,
) -> Result<Option<Vec<CudaFunction>>, BackendError> {
    let found: Vec<CudaFunction> = names.iter().filter_map(|n| all.get(n)).cloned().collect();
    if found.is_empty() {
        return Ok(None);
    }
    if found.len() != names.len() {
        return Err(BackendError::Unsupported(format!(
            "{file}: only {} of {names:?} were loaded",
            found.len()
        )));
    }
    Ok(Some(found))
}

/// The fewest rows the kernel runs by default on slices of up to [`MID_SLICE`] k blocks (K ≤
/// 6144): the 1–8-row GEMV below.
pub const XC_MIN_ROWS: usize = GEMV8_ROWS + 1;

/// The same on longer slices (K = 17408): there the 1–8-row GEMV grows with the rows faster than
/// the cluster kernel (H200, lead's merged-main validation of the fifteenth session, 5120×17408,
/// PDL on: the GEMV 1.28× the one-row time at 6 rows and 1.43–1.46× at 8, the cluster pick
/// 1.23–1.24× at 2–9 rows; 17408×5120 and 10240×5120, K = 5120, keep the GEMV to 8 rows, where it
/// is the faster one or within 1.3×), so it takes 7 and 8 rows too.
pub const XC_MIN_ROWS_LONG: usize = 7;

/// The fewest rows the kernel runs when `KILN_W4_XC_MIN_ROWS` is unset, for slices of `per` k
/// blocks: [`XC_MIN_ROWS_LONG`] above [`MID_SLICE`], else [`XC_MIN_ROWS`].
pub fn default_min_rows(per: usize) -> usize {
    if per > MID_SLICE {
        XC_MIN_ROWS_LONG
    } else {
        XC_MIN_ROWS
    }
}

/// `KILN_W4_XC_MIN_ROWS` (2–[`XC_ROWS`]), else `None` ([`default_min_rows`]).
fn min_rows_env() -> Result<Option<usize>, BackendError> {
    match std::env::var("KILN_W4_XC_MIN_ROWS") {
        Err(_) => Ok(None),
        Ok(v) => v
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|r| (2..=XC_ROWS).contains(r))
            .map(Some)
            .ok_or_else(|| {
                BackendError::InvalidArgument(format!(
                    "KILN_W4_XC_MIN_ROWS={v:?}: expected 2..={XC_ROWS}"
                ))
            }),
    }
}

impl XcGemv {
    /// The kernels for compute dtype suffix `t` where their module was built (sm_90+; `None`
    /// otherwise or for f32), with the setting of the environment. An error if only some of the
    /// builds were loaded.
    pub(crate) fn resolve(
        all: &HashMap<String, CudaFunction>,
        t: &str,
    ) -> Result<Option<XcGemv>, BackendError> {
        let Some(found) = resolve_all(all, &w4_xc_names(t), "w4a16_xs.cu")? else {
            return Ok(None);
        };
        let (on, build, base_pick) = match std::env::var("KILN_W4_XC") {
            Err(_) => (XC_DEFAULT_ON, None, false),
            Ok(v) => parse_xc(&v)?,
        };
        Ok(Some(XcGemv {
            f: W4_XC_VARIANTS.iter().copied().zip(found).collect(),
            set: XcSettings {
                on,
                build,
                base_pick,
                max_rows: XC_ROWS,
                min_rows: min_rows_env()?,
            },
        }))
    }
}

/// Slices of at most this many k blocks (K = 5120: 5) prefer 4 tiles per CTA ([`PICK_SHORT`]).
const SHORT_SLICE: usize = 5;

/// Slices of at most this many k blocks (K = 6144: 6) take [`PICK_MID`]; longer ones
/// [`PICK_LONG`] (K = 17408: 17).
const MID_SLICE: usize = 8;

/// The builds without L2 hints (`KILN_W4_XC=base`), in order of preference for slices of at most
/// [`SHORT_SLICE`] k blocks, and for longer ones (H200, docs/benchmarks.md "the cluster GEMV: x
/// copied per piece, pushed slice sums", runs 2 and 3, same process: at K = 5120 the 4-tile
/// barrier build was the fastest or within noise of it on every shape at 9–16 rows (1–3% over
/// `8p2b4` on 12288×5120 and 6144×5120, equal on 17408×5120), at K = 6144 `8p2b4` by 5% over it;
/// at K = 17408 only the 8-tile barrier build keeps 3 CTAs per SM). Builds of 48 or 56 registers
/// (40 / 36 warps per SM) lost 10–35% (run 3 there, rows4 run 2).
const BASE_SHORT: [XcBuild; 5] = [
    (4, 2, 8, false, 0),
    (8, 2, 4, true, 0),
    (8, 2, 4, false, 0),
    (4, 2, 8, true, 0),
    (16, 2, 2, false, 0),
];
const BASE_LONG: [XcBuild; 5] = [
    (8, 2, 4, true, 0),
    (8, 2, 4, false, 0),
    (4, 2, 8, true, 0),
    (4, 2, 8, false, 0),
    (16, 2, 2, false, 0),
];

/// The default order (`on`): the builds with the L2 hints of `kernels/w4a16_hints.cuh` first,
/// then the base order: slices of ≤ [`SHORT_SLICE`] k blocks (K = 5120) `4x2b8hp3`, ≤
/// [`MID_SLICE`] (K = 6144) `8p2b4hp3`, longer (K = 17408) `8x2b4hp3`: on the H200 the fastest
/// build of each at 9–16 rows (rows6 run 1, docs/benchmarks.md "rows 9–16 with the L2 hints":
/// prefetch distance 3 beat 2 on every shape of 5120 and more outputs).
const PICK_SHORT: [XcBuild; 7] = [
    (4, 2, 8, false, 3),
    (8, 2, 4, false, 3),
    BASE_SHORT[0],
    BASE_SHORT[1],
    BASE_SHORT[2],
    BASE_SHORT[3],
    BASE_SHORT[4],
];
const PICK_MID: [XcBuild; 8] = [
    (8, 2, 4, true, 3),
    (4, 2, 8, false, 3),
    (8, 2, 4, false, 3),
    BASE_LONG[0],
    BASE_LONG[1],
    BASE_LONG[2],
    BASE_LONG[3],
    BASE_LONG[4],
];
const PICK_LONG: [XcBuild; 7] = [
    (8, 2, 4, false, 3),
    (4, 2, 8, false, 3),
    BASE_LONG[0],
    BASE_LONG[1],
    BASE_LONG[2],
    BASE_LONG[3],
    BASE_LONG[4],
];

/// The build for a weight of `tiles` m16 output tiles and `per` k blocks per slice: the first of
/// the order for `per` that applies ([`PICK_SHORT`] / [`PICK_MID`] / [`PICK_LONG`], or with
/// `base` [`BASE_SHORT`] / [`BASE_LONG`]).
pub fn pick_build(tiles: usize, per: usize, base: bool) -> Option<XcBuild> {
    let order: &[XcBuild] = match (base, per) {
        (true, p) if p <= SHORT_SLICE => &BASE_SHORT,
        (true, _) => &BASE_LONG,
        (false, p) if p <= SHORT_SLICE => &PICK_SHORT,
        (false, p) if p <= MID_SLICE => &PICK_MID,
        (false, _) => &PICK_LONG,
    };
    order
        .iter()
        .copied()
        .find(|&v| build_applies(v, tiles, per))
}

/// Whether `build` runs a weight of `tiles` m16 tiles and `per` k blocks per slice. A push
/// build needs more shared memory than its barrier twin, so it runs only where that still
/// leaves room for its `b` CTAs per SM (not on K = 17408: 68 KB of x).
fn build_applies(build: XcBuild, tiles: usize, per: usize) -> bool {
    let smem = smem_bytes(per, build);
    tiles.is_multiple_of(build.0)
        && smem <= MAX_SMEM
        && (!build.3 || (smem + 1024) * build.2 <= SM_SMEM)
}

/// Dynamic shared memory of a CTA: the slice's x (`per` k blocks × [`XC_KB_BYTES`]); the
/// barrier builds reuse it for the slice sums ([`XC_ROWS`] × 16 outputs × 4 bytes per tile), the
/// push builds add the 8 slices' sums they own (`tpc` KB) and their mbarrier (16 bytes).
pub fn smem_bytes(per: usize, (tpc, _, _, push, _): XcBuild) -> usize {
    if push {
        per * XC_KB_BYTES + tpc * 1024 + 16
    } else {
        (per * XC_KB_BYTES).max(tpc * XC_ROWS * 16 * 4)
    }
}

impl CudaBackend {
    /// Set the cluster GEMV: `on`, one `build` for every launch (an entry of `W4_XC_VARIANTS`)
    /// or `None` ([`pick_build`] per launch), the most rows it runs (benchmarks and tests
    /// compare them in one process); returns whether the kernels exist here (sm_90+, 16-bit
    /// dtype) and the build is known.
    pub fn set_w4_xc(&mut self, on: bool, build: Option<XcBuild>, max_rows: usize) -> bool {
        match self.k.w4_xc.as_mut() {
            Some(x) if build.is_none_or(|v| W4_XC_VARIANTS.contains(&v)) => {
                x.set = XcSettings {
                    on,
                    build,
                    base_pick: x.set.base_pick,
                    max_rows,
                    min_rows: x.set.min_rows,
                };
                true
            }
            _ => false,
        }
    }

    /// The fewest rows the kernel runs (2–16 for every weight; `None`: [`default_min_rows`] by
    /// slice length, the default): benchmarks compare it with the 1–8-row GEMV at 2–8 rows.
    /// Returns whether the kernels exist here and `rows` is in range.
    pub fn set_w4_xc_min_rows(&mut self, rows: Option<usize>) -> bool {
        match self.k.w4_xc.as_mut() {
            Some(x) if rows.is_none_or(|r| (2..=XC_ROWS).contains(&r)) => {
                x.set.min_rows = rows;
                true
            }
            _ => false,
        }
    }

    /// Whether [`pick_build`] chooses among the builds without L2 hints only (`KILN_W4_XC=base`)
    /// or among all (the default); returns whether the kernels exist here.
    pub fn set_w4_xc_base_pick(&mut self, base: bool) -> bool {
        match self.k.w4_xc.as_mut() {
            Some(x) => {
                x.set.base_pick = base;
                true
            }
            None => false,
        }
    }

    /// The build a [`super::W4Kernel::Gemv`] step of `rows` rows on packed `w` runs now, if the
    /// cluster GEMV applies (tests check that it ran).
    pub fn w4_xc_build_for(&self, w: &CudaWeight, rows: usize) -> Option<XcBuild> {
        self.w4_xc_runs(w.packed.as_deref()?, w.k, rows)
    }

    /// The build that runs a [`super::W4Kernel::Gemv`] step of `rows` rows on this layout, if
    /// the cluster GEMV applies.
    pub(super) fn w4_xc_runs(
        &self,
        parts: &CudaPackedParts,
        k: usize,
        rows: usize,
    ) -> Option<XcBuild> {
        let x = self.k.w4_xc.as_ref()?;
        let per = parts.k_blocks / XC_KS;
        let in_range = rows <= x.set.max_rows
            && rows >= x.set.min_rows.unwrap_or_else(|| default_min_rows(per));
        in_range
            .then(|| self.w4_xc_layout_build(parts, k))
            .flatten()
    }

    /// The build the cluster GEMV runs on this layout at any row count (`grid.y` = ⌈rows / 16⌉)
    /// where it is on and applies: for [`Self::w4_xc_runs`] and the 17–64-row rule of
    /// `w4a16_xr.rs` (33–48 rows).
    pub(super) fn w4_xc_layout_build(&self, parts: &CudaPackedParts, k: usize) -> Option<XcBuild> {
        let x = self.k.w4_xc.as_ref()?;
        let ok = x.set.on
            && self.w4_tensor_cores()
            && self.k.w4_sm70.is_none()
            && parts.gemv_fast_ok(k)
            && parts.k_slices == XC_KS;
        if !ok {
            return None;
        }
        let (tiles, per) = (parts.n_pad / (2 * TILE_N), parts.k_blocks / XC_KS);
        match x.set.build {
            Some(v) => build_applies(v, tiles, per).then_some(v),
            None => pick_build(tiles, per, x.set.base_pick),
        }
    }

    /// Launch `w4_gemvxc{tpc}d{d}b{b}` for a step of `rows` rows ([`Self::w4_xc_runs`] gave the build).
    ///
    /// # Safety
    /// As [`Self::packed_matmul`].
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn packed_gemv_xc(
        &self,
        w: &CudaWeight,
        parts: &CudaPackedParts,
        rows: usize,
        xp: u64,
        op: u64,
        out_f32: bool,
        build: XcBuild,
    ) -> Result<(), BackendError> {
        let x = self.k.w4_xc.as_ref().ok_or_else(|| {
            BackendError::Unsupported("the cluster GEMV needs sm_90+ and a 16-bit dtype".into())
        })?;
        let f = x
            .f
            .iter()
            .find(|(v, _)| *v == build)
            .map(|(_, f)| f)
            .ok_or_else(|| BackendError::Unsupported(format!("no w4_gemvxc build {build:?}")))?;
        let tpc = build.0;
        let grid = (
            (parts.n_pad / (2 * TILE_N * tpc)) as u32,
            rows.div_ceil(XC_ROWS) as u32,
            XC_KS as u32,
        );
        let shared = smem_bytes(parts.k_blocks / XC_KS, build);
        // SAFETY: w4_xc_runs checked the layout (8 K slices, n_pad / 16 a multiple of tpc); the
        // grid covers n_pad outputs in m16 tiles of tpc per CTA and ceil(rows / 16) row tiles,
        // shared memory is sized by `smem_bytes` for the kernel's layout; the caller's
        // guarantees otherwise.
        unsafe {
            self.launch_cluster_gemv(f, w, parts, rows, xp, op, out_f32, grid, 32 * tpc, shared)
        }
    }

    /// Launch a cluster GEMV of `kernels/w4a16_xs.cu` or `kernels/w4a16_xr.cu` (the same
    /// parameters, `W4XC_ARGS` = `W4XR_ARGS`): grid `grid` (z = the 8 K slices, the compiled-in
    /// cluster (1, 1, 8)), `block` threads, `shared` bytes of dynamic shared memory (opted in
    /// here), with PDL where the packed GEMVs take it.
    ///
    /// # Safety
    /// As [`Self::packed_matmul`]; besides, `f` is such a kernel, the layout is one it runs (a
    /// fast layout of 8 K slices, whole CTAs of output tiles), `grid` covers the weight's n_pad
    /// outputs and `rows` rows in the kernel's tiles, and `shared` is what its layout needs.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn launch_cluster_gemv(
        &self,
        f: &CudaFunction,
        w: &CudaWeight,
        parts: &CudaPackedParts,
        rows: usize,
        xp: u64,
        op: u64,
        out_f32: bool,
        grid: (u32, u32, u32),
        block: usize,
        shared: usize,
    ) -> Result<(), BackendError> {
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
            .i32(parts.group_shift as i32)
            .i32(parts.groups as i32)
            .i32(w.n as i32)
            .ptr(op)
            .i32(i32::from(out_f32))
            .i32(i32::from(parts.values == W4Values::E2m1))
            .i32(i32::from(self.w4_trigger_late));
        let cfg = LaunchConfig {
            grid_dim: grid,
            block_dim: (block as u32, 1, 1),
            shared_mem_bytes: shared as u32,
        };
        // SAFETY: the parts were built by W4Tiles for this weight (n_pad / 8 tiles of k_blocks
        // blocks, `groups` stored groups) and the parameters match W4XC_ARGS / W4XR_ARGS; the
        // caller vouches for the layout, the grid, the shared memory, x (rows × k) and out
        // (rows × n), which the kernel reads / writes only below those bounds. The kernels read
        // only weights, scales and zeros before their griddepcontrol.wait, which makes the PDL
        // attribute allowed.
        unsafe { self.launch_args(f, cfg, &mut a, self.pdl_packed()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xc_switch_parses_its_builds() {
        assert_eq!(parse_xc("off").unwrap(), (false, None, false));
        assert_eq!(parse_xc(" On ").unwrap(), (true, None, false));
        assert_eq!(parse_xc("base").unwrap(), (true, None, true));
        let fixed = |v: XcBuild| (true, Some(v), false);
        assert_eq!(parse_xc("16x2b2").unwrap(), fixed((16, 2, 2, false, 0)));
        assert_eq!(parse_xc("8p2b4").unwrap(), fixed((8, 2, 4, true, 0)));
        assert_eq!(parse_xc("4x2b8hp3").unwrap(), fixed((4, 2, 8, false, 3)));
        assert!(parse_xc("3x1b4").is_err());
        assert!(parse_xc("4x2b8hp7").is_err());
        // Every compiled build's name parses back to it, and names its kernel.
        for v in W4_XC_VARIANTS {
            assert_eq!(parse_xc(&build_name(v)).unwrap().1, Some(v));
        }
        let names = w4_xc_names("bf16");
        assert!(names.contains(&"w4_gemvxc4d2b8hp3_bf16".to_string()));
        assert!(names.contains(&"w4_gemvxc8p2b4_bf16".to_string()));
    }

    #[test]
    fn the_cluster_gemv_starts_at_7_rows_on_long_slices_only() {
        // K = 5120 (5 k blocks per slice), 6144 (6): from 9 rows; K = 17408 (17): from 7.
        assert_eq!(default_min_rows(5), 9);
        assert_eq!(default_min_rows(6), 9);
        assert_eq!(default_min_rows(MID_SLICE), 9);
        assert_eq!(default_min_rows(MID_SLICE + 1), 7);
        assert_eq!(default_min_rows(17), 7);
    }

    #[test]
    fn shared_memory_of_the_27b_shapes() {
        // K = 5120 (40 k blocks: 5 per slice) and 17408 (136: 17): 20 KB and 68 KB.
        assert_eq!(smem_bytes(5, (8, 2, 4, false, 0)), 20 * 1024);
        assert_eq!(smem_bytes(17, (8, 2, 4, false, 3)), 68 * 1024);
        assert_eq!(smem_bytes(1, (16, 2, 2, false, 0)), 16 * 1024);
        // x, then the 8 slices' sums of the 256 values a CTA owns, and the mbarrier.
        assert_eq!(smem_bytes(5, (8, 2, 4, true, 0)), 28 * 1024 + 16);
    }

    #[test]
    fn the_pick_is_the_first_build_of_its_order_that_applies() {
        // Hinted (default): K = 5120 `4x2b8hp3`, K = 6144 `8p2b4hp3`, K = 17408 `8x2b4hp3`.
        assert_eq!(pick_build(1088, 5, false), Some((4, 2, 8, false, 3)));
        assert_eq!(pick_build(320, 6, false), Some((8, 2, 4, true, 3)));
        assert_eq!(pick_build(320, 17, false), Some((8, 2, 4, false, 3)));
        // Base: K = 5120: 4 tiles per CTA; K = 6144: the push build; K = 17408 (68 KB of x): the
        // 8-tile barrier build, 3 CTAs per SM.
        assert_eq!(pick_build(1088, 5, true), Some((4, 2, 8, false, 0)));
        assert_eq!(pick_build(320, 6, true), Some((8, 2, 4, true, 0)));
        assert_eq!(pick_build(320, 17, true), Some((8, 2, 4, false, 0)));
        // 4 m16 tiles (N = 64): a 4-tile build.
        assert_eq!(pick_build(4, 4, true), Some((4, 2, 8, false, 0)));
        assert_eq!(pick_build(4, 6, true), Some((4, 2, 8, false, 0)));
        assert_eq!(pick_build(4, 17, true), Some((4, 2, 8, false, 0)));
        assert_eq!(pick_build(4, 6, false), Some((4, 2, 8, false, 3)));
        assert_eq!(pick_build(4, 17, false), Some((4, 2, 8, false, 3)));
        // Every build of every order is compiled, and the base orders have no hints.
        let all = [
            &BASE_SHORT[..],
            &BASE_LONG,
            &PICK_SHORT,
            &PICK_MID,
            &PICK_LONG,
        ];
        for v in all.concat() {
            assert!(W4_XC_VARIANTS.contains(&v), "{v:?}");
        }
        assert!(BASE_SHORT.iter().chain(&BASE_LONG).all(|v| v.4 == 0));
        for base in [false, true] {
            assert_eq!(pick_build(2, 5, base), None);
            // A slice's x above a block's shared memory: none.
            assert_eq!(pick_build(1088, 64, base), None);
        }
    }
}
