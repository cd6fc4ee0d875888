//! The 1–8-row W4A16 GEMV on the fast layouts (`kernels/w4a16_gemv.cu` `w4_gemv{V}_{f16,bf16}`)
//! and the choice among its builds. Every build has the same numerics (the same fragments, k
//! order and slice sum: bit-identical outputs) and the same launch (grid (Np / 16, ceil(rows /
//! 8)), 32 × ks threads, the parameters of `W4V_ARGS`); they differ in how the weights are
//! fetched: the L2 evict-first policy (`h`), an L2 prefetch PF k blocks ahead (`pPF`), the
//! register ring depth and blocks per SM (`dDbB`), a cp.async ring of A stages per warp in shared
//! memory instead of registers (`aA`, int4 with groups of >= 128 columns). `rd` / `hrd` are the read ceiling (the same
//! loads without the decode: not a product, for benchmarks only).
//!
//! Switch, read when the backend is created ([`GemvFast::resolve`]); tests and benchmarks change
//! it in one process with [`CudaBackend::set_w4_gemv`]: `KILN_W4_GEMV` = one name of
//! [`W4_GEMV_VARIANTS`] (`base` for the plain build) for every launch, or `MANY/FEW`: build MANY
//! for grids of more than [`FEW_MAX_BLOCKS_PER_SM`] blocks per SM, FEW for the others (under one
//! wave: few warps in flight); unset: [`DEFAULT_VARIANT`].

use std::collections::HashMap;
use std::sync::OnceLock;

use cudarc::driver::CudaFunction;

use super::CudaBackend;
use crate::backend::BackendError;
use crate::tensor::packed_tiles::TILE_N;

/// The builds of `kernels/w4a16_gemv.cu` (`W4V_ENTRIES`, same order): entry `w4_gemv{V}_{t}`
/// for suffix V; "" is the plain build (depth 1, 5 blocks per SM, plain loads).
pub const W4_GEMV_VARIANTS: [&str; 13] = [
    "", "h", "p2", "hp2", "hp4", "d3b3", "hd3b3", "hd2b4", "rd", "hrd", "a3", "a4", "a5",
];

/// The build(s) when `KILN_W4_GEMV` is unset: `hp2` (weights loaded with the L2 evict-first
/// policy, each warp's k block 2 ahead asked of the L2). On the H200 (docs/benchmarks.md, "the
/// W4A16 GEMV's builds") it was the fastest or within 1% of it at 1 row on 17408×5120,
/// 5120×17408, 10240×5120 and 5120×6144 with and without PDL (e.g. 5120×17408 with PDL 20.44 →
/// 17.91 µs), never more than 1% slower than the plain build at 1–8 rows, and bit-identical.
pub const DEFAULT_VARIANT: &str = "hp2";

/// Grids of at most this many blocks per SM run the FEW build of `KILN_W4_GEMV=MANY/FEW`.
pub const FEW_MAX_BLOCKS_PER_SM: usize = 3;

/// The read-ceiling builds (no decode: their output is not the product).
const READ_ONLY: [&str; 2] = ["rd", "hrd"];

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

/// The resolved builds and the ones that run.
#[derive(Debug, Clone)]
pub(crate) struct GemvFast {
    f: Vec<CudaFunction>,
    /// (build for grids of many blocks, build for grids of at most FEW_MAX_BLOCKS_PER_SM per SM).
    pick: (usize, usize),
    /// The GPU's SM count (read at the first launch that needs it).
    sms: OnceLock<usize>,
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
        Ok(Some(GemvFast { f, pick, sms }))
    }
}

impl CudaBackend {
    /// Run build `name` of [`W4_GEMV_VARIANTS`] (`base` or "": the plain one) for the 1–8-row
    /// GEMV from now on; false (nothing changed) where the module is not loaded or the name is
    /// unknown. `rd` / `hrd` (the read ceiling) give no product: benchmarks only.
    pub fn set_w4_gemv(&mut self, name: &str) -> bool {
        match (self.k.w4_gemv.as_mut(), parse_pick(name)) {
            (Some(g), Some(p)) => {
                g.pick = p;
                true
            }
            _ => false,
        }
    }

    /// The build a 1–8-row step on a weight of `n_pad` outputs runs (grid Np / 16 blocks).
    pub(super) fn w4_gemv_function(&self, n_pad: usize) -> Option<&CudaFunction> {
        let g = self.k.w4_gemv.as_ref()?;
        if g.pick.0 == g.pick.1 {
            return Some(&g.f[g.pick.0]);
        }
        let sms = *g.sms.get_or_init(|| {
            let a =
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT;
            self.ctx.attribute(a).map_or(1, |v| v.max(1) as usize)
        });
        let few = n_pad / (2 * TILE_N) <= FEW_MAX_BLOCKS_PER_SM * sms;
        Some(&g.f[if few { g.pick.1 } else { g.pick.0 }])
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
