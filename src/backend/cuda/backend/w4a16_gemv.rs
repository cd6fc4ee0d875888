//! The 1–8-row W4A16 GEMV on the fast layouts (`kernels/w4a16_gemv.cu` `w4_gemv{V}_{f16,bf16}`)
//! and the choice among its builds. Every build has the same numerics (the same fragments, k
//! order and slice sum: bit-identical outputs) and the same launch (grid (Np / 16, ceil(rows /
//! 8)), 32 × ks threads, the parameters of `W4V_ARGS`; the persistent `qD` builds: grid
//! [`persistent_grid`]); they differ in how the weights are
//! fetched: the L2 evict-first policy (`h`), an L2 prefetch PF k blocks ahead (`pPF`), the
//! register ring depth and blocks per SM (`dDbB`), a cp.async ring of A stages per warp in shared
//! memory instead of registers (`aA`, int4 with groups of >= 128 columns), a persistent grid
//! whose warps stream tile pair after tile pair through one ring of D k blocks (`qD`, measured
//! slower: docs/benchmarks.md, branch `gemv6`). `rd` / `hrd` / `qDrd` are the read ceilings (the
//! same loads without the decode: not a product, for benchmarks only).
//!
//! Cold start: a backend compiles only the build(s) it can run ([`compiled_builds`]: the default
//! or what `KILN_W4_GEMV` names, its own dtype), the others are trap stubs;
//! `KILN_W4_GEMV_BUILDS=all` compiles every build (the benchmarks and bit tests set it).
//!
//! Switch, read when the backend is created ([`GemvFast::resolve`]); tests and benchmarks change
//! it in one process with [`CudaBackend::set_w4_gemv`]: `KILN_W4_GEMV` = one name of
//! [`W4_GEMV_VARIANTS`] (`base` for the plain build) for every launch, or `MANY/FEW`: build MANY
//! for grids of more than [`FEW_MAX_BLOCKS_PER_SM`] blocks per SM, FEW for the others (under one
//! wave: few warps in flight); unset: [`DEFAULT_VARIANT`].

use std::collections::HashMap;
use std::sync::OnceLock;

use cudarc::driver::CudaFunction;

use super::{CudaBackend, CudaPackedParts};
use crate::backend::BackendError;
use crate::tensor::packed_tiles::TILE_N;

/// The builds of `kernels/w4a16_gemv.cu` (`W4V_ENTRIES`, same order): entry `w4_gemv{V}_{t}`
/// for suffix V; "" is the plain build (depth 1, 5 blocks per SM, plain loads).
pub const W4_GEMV_VARIANTS: [&str; 19] = [
    "", "h", "p2", "hp2", "hp4", "d3b3", "hd3b3", "hd2b4", "rd", "hrd", "a3", "a4", "a5", "q1",
    "q2", "q4", "q1rd", "q2rd", "q4rd",
];

/// The persistent builds (`qD`, `qDrd`: `w4_gemv_pers`) and their resident blocks per SM (the
/// `__launch_bounds__` of `W4V_PERS_ENTRY`): the grid is [`persistent_grid`], not Np / 16.
const PERSISTENT: [(&str, usize); 6] = [
    ("q1", 5),
    ("q2", 4),
    ("q4", 3),
    ("q1rd", 5),
    ("q2rd", 4),
    ("q4rd", 3),
];

/// The grid of a persistent build for `tps` tile pairs (Np / 16) on `sms` SMs at `b` blocks per
/// SM: the fewest rounds of at most `sms * b` blocks, and the tile pairs spread evenly over them
/// (every block runs `rounds` or `rounds - 1` tile pairs).
pub(crate) fn persistent_grid(tps: usize, sms: usize, b: usize) -> usize {
    let rounds = tps.div_ceil((sms * b).max(1)).max(1);
    tps.div_ceil(rounds)
}

/// The build(s) when `KILN_W4_GEMV` is unset: `hp2` (weights loaded with the L2 evict-first
/// policy, each warp's k block 2 ahead asked of the L2). On the H200 (docs/benchmarks.md, "the
/// W4A16 GEMV's builds") it was the fastest or within 1% of it at 1 row on 17408×5120,
/// 5120×17408, 10240×5120 and 5120×6144 with and without PDL (e.g. 5120×17408 with PDL 20.44 →
/// 17.91 µs), never more than 1% slower than the plain build at 1–8 rows, and bit-identical.
pub const DEFAULT_VARIANT: &str = "hp2";

/// Grids of at most this many blocks per SM run the FEW build of `KILN_W4_GEMV=MANY/FEW`.
pub const FEW_MAX_BLOCKS_PER_SM: usize = 3;

/// The read-ceiling builds (no decode: their output is not the product).
const READ_ONLY: [&str; 5] = ["rd", "hrd", "q1rd", "q2rd", "q4rd"];

/// Entry points of the module for compute dtype suffix `t`, in [`W4_GEMV_VARIANTS`] order (none
/// for f32: tensor cores only).
pub(crate) fn w4_gemv_names(t: &str) -> Vec<String> {
    if t == "f32" {
        return Vec::new();
    }
    W4_GEMV_VARIANTS
        .iter()
        .map(|v| format!("w4_gemv{v}_{t}"))
        .collect()
}

/// The index of a variant name (`base` or "" for the plain build).
fn variant_index(name: &str) -> Option<usize> {
    let v = name.trim().to_ascii_lowercase();
    let v = if v == "base" { String::new() } else { v };
    W4_GEMV_VARIANTS.iter().position(|&n| n == v)
}

/// The (MANY, FEW) builds of a `KILN_W4_GEMV` value: `NAME` (both) or `MANY/FEW`.
fn parse_pick(v: &str) -> Option<(usize, usize)> {
    match v.split_once('/') {
        Some((a, b)) => Some((variant_index(a)?, variant_index(b)?)),
        None => variant_index(v).map(|i| (i, i)),
    }
}

/// The builds a backend compiles (bit i: build i of [`W4_GEMV_VARIANTS`]), read at its creation:
/// every one with `KILN_W4_GEMV_BUILDS=all` (benchmarks and bit tests that switch builds with
/// [`CudaBackend::set_w4_gemv`]), otherwise only the one(s) `KILN_W4_GEMV` names, or
/// [`DEFAULT_VARIANT`] (a cold start compiles one build per dtype, not all of them).
pub(crate) fn compiled_builds() -> u64 {
    if std::env::var("KILN_W4_GEMV_BUILDS").is_ok_and(|v| v.trim() == "all") {
        return (1u64 << W4_GEMV_VARIANTS.len()) - 1;
    }
    let pick = std::env::var("KILN_W4_GEMV")
        .ok()
        .and_then(|v| parse_pick(&v))
        .or_else(|| parse_pick(DEFAULT_VARIANT))
        .unwrap_or((0, 0));
    (1u64 << pick.0) | (1u64 << pick.1)
}

/// The NVRTC defines of `kernels/w4a16_gemv.cu` for a backend of compute dtype suffix `t`: the
/// builds of [`compiled_builds`] for `t`, none for the other dtype (the others trap if launched;
/// [`CudaBackend::set_w4_gemv`] refuses them).
pub(crate) fn w4_gemv_defines(t: &str) -> Vec<String> {
    let mask = compiled_builds();
    ["f16", "bf16"]
        .iter()
        .map(|d| format!("-DW4V_MASK_{d}={:#x}ull", if *d == t { mask } else { 0 }))
        .collect()
}

/// The resolved builds and the ones that run.
#[derive(Debug, Clone)]
pub(crate) struct GemvFast {
    f: Vec<CudaFunction>,
    /// (build for grids of many blocks, build for grids of at most FEW_MAX_BLOCKS_PER_SM per SM).
    pick: (usize, usize),
    /// The GPU's SM count (read at the first launch that needs it).
    sms: OnceLock<usize>,
    /// The compiled builds ([`compiled_builds`] at the module's compile).
    built: u64,
}

impl GemvFast {
    /// The builds for suffix `t` where the module was loaded (`None` for f32), with the pick of
    /// `KILN_W4_GEMV`.
    pub(crate) fn resolve(
        all: &HashMap<String, CudaFunction>,
        t: &str,
    ) -> Result<Option<GemvFast>, BackendError> {
        let f: Vec<_> = w4_gemv_names(t)
            .iter()
            .filter_map(|n| all.get(n).cloned())
            .collect();
        if f.is_empty() {
            return Ok(None);
        }
        if f.len() != W4_GEMV_VARIANTS.len() {
            return Err(BackendError::Unsupported(format!(
                "w4a16_gemv.cu: {} of {} builds loaded for {t}",
                f.len(),
                W4_GEMV_VARIANTS.len()
            )));
        }
        let name = std::env::var("KILN_W4_GEMV").unwrap_or_else(|_| DEFAULT_VARIANT.into());
        let pick = parse_pick(&name).ok_or_else(|| {
            BackendError::InvalidArgument(format!(
                "KILN_W4_GEMV={name:?}: expected NAME or MANY/FEW, names base or {W4_GEMV_VARIANTS:?}"
            ))
        })?;
        let sms = OnceLock::new();
        let built = compiled_builds();
        Ok(Some(GemvFast {
            f,
            pick,
            sms,
            built,
        }))
    }
}

impl CudaBackend {
    /// Run build `name` of [`W4_GEMV_VARIANTS`] (`base` or "": the plain one) for the 1–8-row
    /// GEMV from now on; false (nothing changed) where the module is not loaded, the name is
    /// unknown or the build was not compiled (see [`compiled_builds`]: `KILN_W4_GEMV_BUILDS=all`
    /// before the backend is created). The read ceilings (`rd`, `hrd`, `qDrd`) give no product:
    /// benchmarks only.
    pub fn set_w4_gemv(&mut self, name: &str) -> bool {
        match (self.k.w4_gemv.as_mut(), parse_pick(name)) {
            (Some(g), Some(p)) if (g.built >> p.0) & (g.built >> p.1) & 1 == 1 => {
                g.pick = p;
                true
            }
            _ => false,
        }
    }

    /// The build a 1–8-row step on a weight of `n_pad` outputs runs.
    pub(super) fn w4_gemv_function(&self, n_pad: usize) -> Option<&CudaFunction> {
        let g = self.k.w4_gemv.as_ref()?;
        Some(&g.f[self.w4_gemv_index(g, n_pad)])
    }

    /// The GPU's SM count (read once).
    fn w4_gemv_sms(&self, g: &GemvFast) -> usize {
        *g.sms.get_or_init(|| {
            let a =
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT;
            self.ctx.attribute(a).map_or(1, |v| v.max(1) as usize)
        })
    }

    /// The index in [`W4_GEMV_VARIANTS`] of the build that runs on `n_pad` outputs.
    fn w4_gemv_index(&self, g: &GemvFast, n_pad: usize) -> usize {
        if g.pick.0 == g.pick.1 {
            return g.pick.0;
        }
        let few = n_pad / (2 * TILE_N) <= FEW_MAX_BLOCKS_PER_SM * self.w4_gemv_sms(g);
        if few {
            g.pick.1
        } else {
            g.pick.0
        }
    }

    /// grid.x of a GEMV step in blocks of `gemv_rows` rows on a weight of `parts`: Np / 16, or
    /// for the 8-row GEMV's persistent builds [`persistent_grid`].
    pub(super) fn w4v_grid(&self, parts: &CudaPackedParts, gemv_rows: usize) -> usize {
        let n_pad = parts.n_pad;
        let tps = n_pad / (2 * TILE_N);
        let Some(g) = self.k.w4_gemv.as_ref().filter(|_| gemv_rows == 8) else {
            return tps;
        };
        let v = W4_GEMV_VARIANTS[self.w4_gemv_index(g, n_pad)];
        match PERSISTENT.iter().find(|p| p.0 == v) {
            Some(&(_, b)) => persistent_grid(tps, self.w4_gemv_sms(g), b),
            None => tps,
        }
    }

    /// Whether build `name` is a read ceiling (its output is not the product).
    pub fn w4_gemv_is_read_only(name: &str) -> bool {
        READ_ONLY.contains(&name.trim())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_variant_list_and_base_is_the_plain_build() {
        let n = w4_gemv_names("bf16");
        assert_eq!(n[0], "w4_gemv_bf16");
        assert_eq!(n[1], "w4_gemvh_bf16");
        assert_eq!(n.len(), W4_GEMV_VARIANTS.len());
        assert_eq!(variant_index("base"), Some(0));
        assert_eq!(variant_index(" HP2 "), Some(3));
        assert_eq!(variant_index("nope"), None);
        assert_eq!(parse_pick("h/a5"), Some((1, 12)));
        assert_eq!(persistent_grid(1088, 132, 5), 544);
        assert_eq!(persistent_grid(320, 132, 3), 320);
        assert_eq!(persistent_grid(1088, 132, 3), 363);
        assert!(PERSISTENT.iter().all(|p| variant_index(p.0).is_some()));
        let d = w4_gemv_defines("bf16");
        assert!(d[0] == "-DW4V_MASK_f16=0x0ull" && d[1].starts_with("-DW4V_MASK_bf16=0x"));
        assert_eq!(parse_pick("base"), Some((0, 0)));
        assert_eq!(parse_pick("h/x"), None);
        assert!(w4_gemv_names("f32").is_empty());
        let m = crate::backend::cuda::kernels::KernelModule::W4a16Gemv;
        let src = m.source();
        for v in W4_GEMV_VARIANTS {
            assert!(src.contains(&format!("w4_gemv{v}_##SUF")), "{v}");
        }
        // Compiled after w4a16.cu's helpers (one copy), not its entry points.
        let full = m.full_source();
        assert!(
            full.contains("struct W4Dec")
                && full.contains("__device__ __forceinline__ unsigned w4_szf")
        );
        assert!(!full.contains("W4_TC_ENTRIES(bf16") && !src.contains("struct W4Dec"));
        assert!(full.ends_with(src));
    }
}
