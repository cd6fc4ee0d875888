//! The cluster W4A16 GEMV for 17–64 rows (`kernels/w4a16_xr.cu`
//! `w4_gemvxr{nw}w{mt}t{rg}r{xs}s{b}b[hp{pf}]_{f16,bf16}`, sm_90+): the numerics of `w4_gemv_xs`
//! and `w4_gemv_xc` (same bits), with the 8 K slices of `nw · mt` m16 output tiles as one
//! thread-block cluster (1, 1, 8), each CTA holding 8 `rg` x rows (32 or 64) of its slice in a
//! shared-memory ring of `xs` k blocks, each warp decoding its `mt` tiles' weights once for all
//! of them.
//!
//! Launch: grid (Np / (16 nw mt), ceil(rows / (8 rg)), 8), 32 nw threads, dynamic shared memory
//! [`smem_bytes`]; only for weights of 8 K slices on the fast layouts ([`CudaBackend::w4_xr_runs`]).
//!
//! Switch, read when the backend is created ([`XrGemv::resolve`]); tests and benchmarks change it
//! in one process with [`CudaBackend::set_w4_xr`]: `KILN_W4_XR` = `off`, `on` (unset: on where
//! [`XR_DEFAULT_ON`]) or one build of `kernels.rs` `W4_XR_VARIANTS` by [`build_name`] (e.g.
//! `4w2t4r4s3b`, every step of its rows runs that build). `on` runs [`pick_build`]'s build for
//! [`W4Kernel::Gemv`] / [`W4Kernel::Gemm`] steps of [`XR_MIN_ROWS`]–[`XR_MAX_ROWS`] rows;
//! [`W4Kernel::GemvXr`] forces it at any row count (an error where it does not apply).

use std::collections::HashMap;

use cudarc::driver::{CudaFunction, DevicePtr, LaunchConfig};

use super::super::launch::KernelArgs;
use super::{dev_err, CudaBackend, CudaPackedParts, CudaWeight, W4Kernel, W4Values};
use crate::backend::cuda::kernels::{w4_xc_tail, w4_xr_names, W4_XR_VARIANTS};
use crate::backend::BackendError;
use crate::tensor::packed_tiles::TILE_N;

/// Whether the kernel runs when `KILN_W4_XR` is unset.
pub const XR_DEFAULT_ON: bool = false;

/// Fewest rows the switch gives it (16 and fewer: the 9–16-row cluster GEMV of `w4a16_xc.rs`).
pub const XR_MIN_ROWS: usize = 17;

/// Most rows the switch gives it (more: the GEMMs).
pub const XR_MAX_ROWS: usize = 64;

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
    let v = v.trim().to_ascii_lowercase();
    match v.as_str() {
        "" => Ok((XR_DEFAULT_ON, None)),
        "0" | "off" | "false" => Ok((false, None)),
        "1" | "on" | "true" => Ok((true, None)),
        other => W4_XR_VARIANTS
            .iter()
            .find(|&&b| build_name(b) == other)
            .map(|b| (true, Some(*b)))
            .ok_or_else(|| {
                let names: Vec<String> = W4_XR_VARIANTS.iter().map(|&b| build_name(b)).collect();
                BackendError::InvalidArgument(format!(
                    "KILN_W4_XR={v:?}: expected off, on or one of {names:?}"
                ))
            }),
    }
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
        let names = w4_xr_names(t);
        let found: Vec<_> = names.iter().filter_map(|n| all.get(n)).collect();
        if found.is_empty() {
            return Ok(None);
        }
        if found.len() != names.len() {
            return Err(BackendError::Unsupported(format!(
                "w4a16_xr.cu: only {} of {names:?} were loaded",
                found.len()
            )));
        }
        let (on, build) = match std::env::var("KILN_W4_XR") {
            Err(_) => (XR_DEFAULT_ON, None),
            Ok(v) => parse_xr(&v)?,
        };
        Ok(Some(XrGemv {
            f: W4_XR_VARIANTS
                .iter()
                .copied()
                .zip(found.into_iter().cloned())
                .collect(),
            set: XrSettings {
                on,
                build,
                rows: (XR_MIN_ROWS, XR_MAX_ROWS),
            },
        }))
    }
}

/// The pick's order for steps of up to 32 rows (one 32-row tile) and for more (64-row tiles
/// first): see docs/benchmarks.md (branch `mid7`).
const PICK_32: [XrBuild; 4] = [
    W4_XR_VARIANTS[0], // 4w2t4r4s3b
    W4_XR_VARIANTS[1], // 2w2t4r4s6b
    W4_XR_VARIANTS[6], // 8w1t4r4s2b
    W4_XR_VARIANTS[2], // 4w1t4r4s4b
];
const PICK_64: [XrBuild; 5] = [
    W4_XR_VARIANTS[4], // 4w2t8r3s2b
    W4_XR_VARIANTS[5], // 2w2t8r3s4b
    W4_XR_VARIANTS[7], // 4w1t8r3s3b
    W4_XR_VARIANTS[0],
    W4_XR_VARIANTS[1],
];

/// The build for a step of `rows` rows on a weight of `tiles` m16 output tiles: the first of
/// the order for its rows that applies.
pub fn pick_build(rows: usize, tiles: usize) -> Option<XrBuild> {
    let order: &[XrBuild] = if rows <= 32 { &PICK_32 } else { &PICK_64 };
    order.iter().copied().find(|&b| build_applies(b, tiles))
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

    /// The build a step of `rows` rows on packed `w` runs now with `kernel`, if the 17–64-row
    /// cluster GEMV takes it (tests check that it ran).
    pub fn w4_xr_build_for(
        &self,
        w: &CudaWeight,
        rows: usize,
        kernel: W4Kernel,
    ) -> Option<XrBuild> {
        self.w4_xr_runs(w.packed.as_deref()?, w.k, rows, kernel)
    }

    /// The build that runs a step of `rows` rows on this layout with `kernel`, if the 17–64-row
    /// cluster GEMV takes it: [`W4Kernel::GemvXr`] always where it applies, [`W4Kernel::Gemv`] /
    /// [`W4Kernel::Gemm`] where it is on and `rows` is in its range.
    pub(super) fn w4_xr_runs(
        &self,
        parts: &CudaPackedParts,
        k: usize,
        rows: usize,
        kernel: W4Kernel,
    ) -> Option<XrBuild> {
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
        match x.set.build {
            Some(b) => build_applies(b, tiles).then_some(b),
            None => pick_build(rows, tiles),
        }
    }

    /// Launch `w4_gemvxr*` for a step of `rows` rows ([`Self::w4_xr_runs`] gave the build).
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
        let shared = smem_bytes(build);
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
            grid_dim: (
                (parts.n_pad / (2 * TILE_N * nw * mt)) as u32,
                rows.div_ceil(8 * rg) as u32,
                XR_KS as u32,
            ),
            block_dim: ((32 * nw) as u32, 1, 1),
            shared_mem_bytes: shared as u32,
        };
        // SAFETY: the parts were built by W4Tiles for this weight (a fast layout: no perm,
        // k % 128 == 0, n_pad / 8 tiles of k_blocks blocks, `groups` stored groups, 8 K slices:
        // w4_xr_runs checked it, and that n_pad / 16 is a multiple of nw · mt); the grid covers
        // n_pad outputs in m16 tiles, ceil(rows / (8 rg)) row tiles and the 8 slices (z, the
        // compiled-in cluster (1, 1, 8)); x is read only below (rows, k) and out written only
        // below (rows, n) (the caller vouches for both); shared memory is sized by `smem_bytes`
        // for the kernel's layout. The kernel reads only weights, scales and zeros before its
        // griddepcontrol.wait, which makes the PDL attribute allowed.
        unsafe { self.launch_args(f, cfg, &mut a, self.pdl_packed()) }
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
        assert!(parse_xr("4w2t4r4s3bhp9").is_err());
        for b in W4_XR_VARIANTS {
            assert_eq!(parse_xr(&build_name(b)).unwrap().1, Some(b));
        }
        assert!(w4_xr_names("bf16").contains(&"w4_gemvxr4w2t4r4s3bhp3_bf16".to_string()));
    }

    #[test]
    fn shared_memory_and_the_pick_on_the_27b_shapes() {
        // 32 rows, 4 stages: 32 KB; 64 rows, 3 stages: 48 KB (the slice sums fit in the ring).
        assert_eq!(smem_bytes((4, 2, 4, 4, 3, 0)), 32 * 1024);
        assert_eq!(smem_bytes((4, 2, 8, 3, 2, 0)), 48 * 1024);
        // N = 5120: 320 m16 tiles; N = 1024: 64; a weight of 4 tiles only takes 4-tile CTAs.
        assert_eq!(pick_build(32, 320), Some((4, 2, 4, 4, 3, 0)));
        assert_eq!(pick_build(17, 64), Some((4, 2, 4, 4, 3, 0)));
        assert_eq!(pick_build(64, 320), Some((4, 2, 8, 3, 2, 0)));
        assert_eq!(pick_build(33, 4), Some((2, 2, 8, 3, 4, 0)));
        assert_eq!(pick_build(32, 4), Some((2, 2, 4, 4, 6, 0)));
        assert_eq!(pick_build(32, 2), None);
        for b in PICK_32.iter().chain(&PICK_64) {
            assert!(W4_XR_VARIANTS.contains(b));
            assert!(smem_bytes(*b) <= MAX_SMEM);
        }
    }
}
