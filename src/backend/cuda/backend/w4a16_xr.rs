//! The cluster W4A16 GEMV for 17–64 rows (`kernels/w4a16_xr.cu`
//! `w4_gemvxr{nw}w{mt}t{rg}r{xs}s{b}b[hp{pf}]_{f16,bf16}`, sm_90+): the numerics of `w4_gemv_xs`
//! and `w4_gemv_xc` (same bits), with the 8 K slices of `nw · mt` m16 output tiles as one
//! thread-block cluster (1, 1, 8), each CTA holding 8 `rg` x rows (32, or 64 in the one
//! comparison build) of its slice in a shared-memory ring of `xs` k blocks, each warp decoding
//! its `mt` tiles' weights once for all of them.
//!
//! Launch: grid (Np / (16 nw mt), ceil(rows / (8 rg)), 8), 32 nw threads, dynamic shared memory
//! [`smem_bytes`]; only for weights of 8 K slices on the fast layouts ([`CudaBackend::w4_mid_runs`]).
//!
//! The rule for [`W4Kernel::Gemv`] / [`W4Kernel::Gemm`] steps of [`XR_MIN_ROWS`]–[`XR_MAX_ROWS`]
//! rows where the switch is on ([`MidKernel`], from the H200 sweep of `tests/cuda_w4a16_xr.rs`,
//! docs/benchmarks.md "branch `mid7`"): 17–32 and 49–64 rows this kernel ([`pick_build`]: one
//! or two 32-row tiles), 33–48 rows ([`XC_BAND`]) the 9–16-row cluster GEMV of `w4a16_xc.rs`
//! with ⌈rows / 16⌉ = 3 row tiles (there 3 × 16 rows beat 2 × 32 on six of the seven 27B
//! shapes: 15.4 against 16.8 ms per decode step's linears at 48 rows).
//!
//! Switch, read when the backend is created ([`XrGemv::resolve`]); tests and benchmarks change it
//! in one process with [`CudaBackend::set_w4_xr`]: `KILN_W4_XR` = `off` (the GEMVs and GEMMs as
//! before: `w4_gemvx1` / `w4_gemvx2` to 32 rows, `w4g_split` / `w4g_tile` above), `on` (unset: on
//! where [`XR_DEFAULT_ON`]) or one build of `kernels.rs` `W4_XR_VARIANTS` by [`build_name`]
//! (e.g. `4w2t4r4s3b`: every step of 17–64 rows runs that build). [`W4Kernel::GemvXr`] forces
//! the kernel at any row count (an error where it does not apply).

use std::collections::HashMap;

use cudarc::driver::CudaFunction;

use super::xc::{parse_build_switch, resolve_all, XcBuild};
use super::{CudaBackend, CudaPackedParts, CudaWeight, W4Kernel};
use crate::backend::cuda::kernels::{w4_xc_tail, w4_xr_names, W4_XR_VARIANTS};
use crate::backend::BackendError;
use crate::tensor::packed_tiles::TILE_N;

/// Whether the kernel runs when `KILN_W4_XR` is unset.
pub const XR_DEFAULT_ON: bool = true;

/// Fewest rows the switch gives it (16 and fewer: the 9–16-row cluster GEMV of `w4a16_xc.rs`).
pub const XR_MIN_ROWS: usize = 17;

/// Most rows the switch gives it (more: the GEMMs).
pub const XR_MAX_ROWS: usize = 64;

/// Rows the switch gives the 9–16-row cluster GEMV instead (3 row tiles of 16), where it applies.
pub const XC_BAND: (usize, usize) = (33, 48);

/// A build: (warps per CTA, m16 tiles per warp, row groups of 8 x rows per CTA, x ring stages,
/// CTAs per SM of the register cap, L2 prefetch distance in k blocks (0: no hints)).
pub type XrBuild = (usize, usize, usize, usize, usize, usize);

/// K slices the kernel runs (its cluster size, `W4XR_KS`).
const XR_KS: usize = 8;

/// Shared memory a block may use with the opt-in on sm_90 / sm_100.
const MAX_SMEM: usize = 227 * 1024;

/// A build's name in `KILN_W4_XR` and test output: `4w2t4r4s3b`, `4w2t4r4s3bhp3` (L2 hints).
pub fn build_name((nw, mt, rg, xs, b, pf): XrBuild) -> String {
    format!("{nw}w{mt}t{rg}r{xs}s{b}b{}", w4_xc_tail(pf))
}

/// Parse a `KILN_W4_XR` value: (on, fixed build).
fn parse_xr(v: &str) -> Result<(bool, Option<XrBuild>), BackendError> {
    parse_build_switch(
        "KILN_W4_XR",
        "",
        v,
        XR_DEFAULT_ON,
        &W4_XR_VARIANTS,
        build_name,
    )
}

/// The kernel's settings (`KILN_W4_XR`; [`CudaBackend::set_w4_xr`] changes them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct XrSettings {
    /// Whether [`W4Kernel::Gemv`] / [`W4Kernel::Gemm`] steps of its rows run it.
    pub on: bool,
    /// One build for every launch, or `None`: [`pick_build`] per launch.
    pub build: Option<XrBuild>,
    /// Fewest and most rows the switch gives it.
    pub rows: (usize, usize),
}

/// The resolved kernels (one per build) and the settings.
#[derive(Debug, Clone)]
pub(crate) struct XrGemv {
    f: Vec<(XrBuild, CudaFunction)>,
    set: XrSettings,
}

impl XrGemv {
    /// The kernels for compute dtype suffix `t` where their module was built (sm_90+; `None`
    /// otherwise or for f32), with the setting of the environment. An error if only some of the
    /// builds were loaded.
    pub(crate) fn resolve(
        all: &HashMap<String, CudaFunction>,
        t: &str,
    ) -> Result<Option<XrGemv>, BackendError> {
        let Some(found) = resolve_all(all, &w4_xr_names(t), "w4a16_xr.cu")? else {
            return Ok(None);
        };
        let (on, build) = match std::env::var("KILN_W4_XR") {
            Err(_) => (XR_DEFAULT_ON, None),
            Ok(v) => parse_xr(&v)?,
        };
        Ok(Some(XrGemv {
            f: W4_XR_VARIANTS.iter().copied().zip(found).collect(),
            set: XrSettings {
                on,
                build,
                rows: (XR_MIN_ROWS, XR_MAX_ROWS),
            },
        }))
    }
}

/// The pick's order: the 32-row builds, the one with the L2 hints first (the fastest on every
/// 27B shape at 17–64 rows in the H200 sweep but 6144×5120 and 1024×5120, within 3–4% there),
/// then 4-tile CTAs for weights of 4 (mod 8) m16 tiles.
const PICK: [XrBuild; 4] = [
    W4_XR_VARIANTS[0], // 4w2t4r4s3bhp3
    W4_XR_VARIANTS[1], // 4w2t4r4s3b
    W4_XR_VARIANTS[2], // 2w2t4r4s6b
    W4_XR_VARIANTS[3], // 4w1t4r4s4b
];

/// The build for a weight of `tiles` m16 output tiles: the first of [`PICK`] that applies.
pub fn pick_build(tiles: usize) -> Option<XrBuild> {
    PICK.iter().copied().find(|&b| build_applies(b, tiles))
}

/// What a packed step of 17–64 rows runs where [`CudaBackend::w4_mid_runs`] takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MidKernel {
    /// This kernel, the build.
    Xr(XrBuild),
    /// The 9–16-row cluster GEMV at ⌈rows / 16⌉ row tiles, its build.
    Xc(XcBuild),
}

/// Whether `build` runs a weight of `tiles` m16 tiles: whole CTAs of tiles, shared memory within
/// a block's opt-in.
fn build_applies(build: XrBuild, tiles: usize) -> bool {
    tiles.is_multiple_of(build.0 * build.1) && smem_bytes(build) <= MAX_SMEM
}

/// Dynamic shared memory of a CTA: the x ring (`xs` stages of 8 `rg` rows × 256 bytes), reused
/// for the slice sums (`nw` × `mt` × `rg` × 512 bytes) when those are smaller.
pub fn smem_bytes((nw, mt, rg, xs, _, _): XrBuild) -> usize {
    (xs * rg * 2048).max(nw * mt * rg * 512)
}

impl CudaBackend {
    /// Set the 17–64-row cluster GEMV: `on`, one `build` for every launch (an entry of
    /// `W4_XR_VARIANTS`) or `None` ([`pick_build`] per launch), the fewest and most rows the
    /// switch gives it (benchmarks and tests compare them in one process); returns whether the
    /// kernels exist here (sm_90+, 16-bit dtype) and the build is known.
    pub fn set_w4_xr(&mut self, on: bool, build: Option<XrBuild>, rows: (usize, usize)) -> bool {
        match self.k.w4_xr.as_mut() {
            Some(x) if build.is_none_or(|b| W4_XR_VARIANTS.contains(&b)) => {
                x.set = XrSettings { on, build, rows };
                true
            }
            _ => false,
        }
    }

    /// What a step of `rows` rows on packed `w` runs now with `kernel`, if the 17–64-row rule
    /// takes it (tests check that it ran).
    pub fn w4_mid_kernel_for(
        &self,
        w: &CudaWeight,
        rows: usize,
        kernel: W4Kernel,
    ) -> Option<MidKernel> {
        self.w4_mid_runs(w.packed.as_deref()?, w.k, rows, kernel)
    }

    /// What runs a step of `rows` rows on this layout with `kernel`, if the 17–64-row rule takes
    /// it: [`W4Kernel::GemvXr`] this kernel always where it applies; [`W4Kernel::Gemv`] /
    /// [`W4Kernel::Gemm`] where the switch is on and `rows` is in its range, by the module
    /// header's rule (a fixed build: that build at every row count of the range).
    pub(super) fn w4_mid_runs(
        &self,
        parts: &CudaPackedParts,
        k: usize,
        rows: usize,
        kernel: W4Kernel,
    ) -> Option<MidKernel> {
        let x = self.k.w4_xr.as_ref()?;
        let by_switch = matches!(kernel, W4Kernel::Gemv | W4Kernel::Gemm)
            && x.set.on
            && (x.set.rows.0..=x.set.rows.1).contains(&rows);
        let ok = (kernel == W4Kernel::GemvXr || by_switch)
            && self.w4_tensor_cores()
            && self.k.w4_sm70.is_none()
            && parts.gemv_fast_ok(k)
            && parts.k_slices == XR_KS;
        if !ok {
            return None;
        }
        let tiles = parts.n_pad / (2 * TILE_N);
        if let Some(b) = x.set.build {
            return build_applies(b, tiles).then_some(MidKernel::Xr(b));
        }
        let xc = (kernel != W4Kernel::GemvXr && (XC_BAND.0..=XC_BAND.1).contains(&rows))
            .then(|| self.w4_xc_layout_build(parts, k))
            .flatten();
        match xc {
            Some(b) => Some(MidKernel::Xc(b)),
            None => pick_build(tiles).map(MidKernel::Xr),
        }
    }

    /// Launch what [`Self::w4_mid_runs`] chose for a step of `rows` rows.
    ///
    /// # Safety
    /// As [`Self::packed_matmul`].
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn packed_mid(
        &self,
        w: &CudaWeight,
        parts: &CudaPackedParts,
        rows: usize,
        xp: u64,
        op: u64,
        out_f32: bool,
        mid: MidKernel,
    ) -> Result<(), BackendError> {
        match mid {
            // SAFETY: the caller's guarantees, passed on unchanged.
            MidKernel::Xr(b) => unsafe { self.packed_gemv_xr(w, parts, rows, xp, op, out_f32, b) },
            // SAFETY: the caller's guarantees, passed on unchanged (the build applies to this
            // layout: w4_xc_layout_build checked it; the launch covers ⌈rows / 16⌉ row tiles).
            MidKernel::Xc(b) => unsafe { self.packed_gemv_xc(w, parts, rows, xp, op, out_f32, b) },
        }
    }

    /// Launch `w4_gemvxr*` for a step of `rows` rows ([`Self::w4_mid_runs`] gave the build).
    ///
    /// # Safety
    /// As [`Self::packed_matmul`].
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn packed_gemv_xr(
        &self,
        w: &CudaWeight,
        parts: &CudaPackedParts,
        rows: usize,
        xp: u64,
        op: u64,
        out_f32: bool,
        build: XrBuild,
    ) -> Result<(), BackendError> {
        let x = self.k.w4_xr.as_ref().ok_or_else(|| {
            BackendError::Unsupported(
                "the 17–64-row cluster GEMV needs sm_90+ and a 16-bit dtype".into(),
            )
        })?;
        let f = x
            .f
            .iter()
            .find(|(b, _)| *b == build)
            .map(|(_, f)| f)
            .ok_or_else(|| BackendError::Unsupported(format!("no w4_gemvxr build {build:?}")))?;
        let (nw, mt, rg) = (build.0, build.1, build.2);
        let grid = (
            (parts.n_pad / (2 * TILE_N * nw * mt)) as u32,
            rows.div_ceil(8 * rg) as u32,
            XR_KS as u32,
        );
        // SAFETY: w4_mid_runs checked the layout (a fast layout of 8 K slices, n_pad / 16 a
        // multiple of nw · mt); the grid covers n_pad outputs in m16 tiles of nw · mt per CTA and
        // ceil(rows / (8 rg)) row tiles; shared memory is sized by `smem_bytes` for the kernel's
        // layout; the caller's guarantees otherwise.
        unsafe {
            self.launch_cluster_gemv(
                f,
                w,
                parts,
                rows,
                xp,
                op,
                out_f32,
                grid,
                32 * nw,
                smem_bytes(build),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xr_switch_parses_its_builds() {
        assert_eq!(parse_xr("off").unwrap(), (false, None));
        assert_eq!(parse_xr(" On ").unwrap(), (true, None));
        assert_eq!(parse_xr("").unwrap(), (XR_DEFAULT_ON, None));
        assert_eq!(
            parse_xr("4w2t4r4s3b").unwrap(),
            (true, Some((4, 2, 4, 4, 3, 0)))
        );
        assert_eq!(
            parse_xr("4w2t4r4s3bhp3").unwrap(),
            (true, Some((4, 2, 4, 4, 3, 3)))
        );
        assert!(parse_xr("4w2t4r4s3bhp9").is_err());
        for b in W4_XR_VARIANTS {
            assert_eq!(parse_xr(&build_name(b)).unwrap().1, Some(b));
        }
        assert!(w4_xr_names("bf16").contains(&"w4_gemvxr4w2t4r4s3bhp3_bf16".to_string()));
    }

    #[test]
    fn shared_memory_and_the_pick_on_the_27b_shapes() {
        // 32 rows, 4 stages: 32 KB; 64 rows, 3 stages: 48 KB (the slice sums fit in the ring).
        assert_eq!(smem_bytes((4, 2, 4, 4, 3, 3)), 32 * 1024);
        assert_eq!(smem_bytes((4, 1, 8, 3, 3, 0)), 48 * 1024);
        // N = 5120: 320 m16 tiles; N = 1024: 64: the hinted 8-tile build; a weight of 4 (mod 8)
        // tiles takes 4-tile CTAs, one of 2 none.
        assert_eq!(pick_build(320), Some((4, 2, 4, 4, 3, 3)));
        assert_eq!(pick_build(64), Some((4, 2, 4, 4, 3, 3)));
        assert_eq!(pick_build(12), Some((2, 2, 4, 4, 6, 0)));
        assert_eq!(pick_build(2), None);
        for b in PICK {
            assert!(W4_XR_VARIANTS.contains(&b));
            assert!(smem_bytes(b) <= MAX_SMEM);
            assert_eq!(b.2, 4, "the pick runs 32-row tiles");
        }
        assert!(XC_BAND.0 > 32 && XC_BAND.1 < XR_MAX_ROWS);
    }
}
