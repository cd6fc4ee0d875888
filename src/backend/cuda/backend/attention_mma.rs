//! The tensor-core decode attention kernels (`kernels/attention_decode_mma.cu`, sm_80+, 16-bit
//! compute): which shapes they take, their block size and dynamic shared memory (mirrors of
//! `DmmaShape` in the .cu file), and their handles. They take the same arguments, rows, split of
//! the keys and partials as the decode kernel of `attention_decode.cu`, so `launch_decode` only
//! swaps the function, the block size and the shared memory (see [`CudaBackend::decode_mma`]).
//!
//! Some launches take the `_p2` entry points: each warp's work split between two warps by 32-dim
//! blocks (the kernel's header, "Pairs"), twice the threads, the same shared memory and the same
//! bits. Which ones is [`pair_by_default`] (head width, KV bytes, the launch's row count: fixed
//! per graph bucket), or every launch of at most `KILN_DMMA_PAIR_ROWS` rows when that is set
//! (read when a backend is created; `0`: never, the kernels before branch `lctx5`).
//!
//! `KILN_DECODE_MMA=0` (read when a backend is created) keeps the older decode kernel for every
//! shape, e.g. to compare the two in one process; `KILN_DECODE_MMA=128` keeps it for head width
//! 64 only (the default before branch `smol2`, for A/B: SmolLM2's 9/3 × 64 heads measured
//! 1.2–2.5× faster here in every cell, docs/benchmarks.md, `lctx2` and `smol2` sections).

use std::collections::HashMap;

use cudarc::driver::CudaFunction;

use super::CudaBackend;
use crate::backend::cuda::device::CudaError;

/// Head widths the kernels are compiled for (`d64 | d128 | d256`); head_dim must equal one.
pub const DECODE_MMA_DIMS: [usize; 3] = [64, 128, 256];
/// Largest GQA group (query heads per KV head): the mma's n = 8.
pub const DECODE_MMA_MAX_GROUP: usize = 8;
/// Keys per warp step (`DMMA_CHUNK`).
const CHUNK: usize = 16;
/// Dims of one head a block of `attention_decode_mma_combine_*` merges (`DMMA_MERGE_DIMS`): its
/// grid is (heads, rows, head_dim / this).
pub const DECODE_MMA_MERGE_DIMS: usize = 64;
/// Threads per block of the combine (`DMMA_MERGE_THREADS`: 16 part groups × 16 float4 columns).
pub const DECODE_MMA_MERGE_THREADS: u32 = 256;
/// Shared memory the stage ring of a block aims for (`DMMA_STAGE_BUDGET`) unless
/// `KILN_DMMA_STAGE_BUDGET` says otherwise (71 000: measured against 106 496 in
/// docs/benchmarks.md, seventh session).
const STAGE_BUDGET: usize = 71_000;

/// The stage budget set by `KILN_DMMA_STAGE_BUDGET` (bytes, 16 KiB..=220 KiB, read once per
/// process; to measure fewer stages per warp against more blocks per SM), `None` when unset: the
/// kernels then use [`STAGE_BUDGET`], the `DMMA_STAGE_BUDGET` default of the source, and the
/// kernel gets `-DDMMA_STAGE_BUDGET` only when the variable is set (so the default build keeps one
/// cache entry). A value that is not a number in that range is ignored with a warning naming it.
/// Never changes a result's bits: the stages are a ring of copies, the chunks a warp takes depend
/// on the warp count alone.
pub fn decode_mma_stage_budget() -> Option<usize> {
    static BUDGET: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    *BUDGET.get_or_init(|| {
        let v = std::env::var("KILN_DMMA_STAGE_BUDGET").ok()?;
        let budget = v
            .parse::<usize>()
            .ok()
            .filter(|b| (16_384..=225_280).contains(b));
        if budget.is_none() {
            tracing::warn!(
                value = %v,
                default = STAGE_BUDGET,
                "KILN_DMMA_STAGE_BUDGET is not a byte count in 16384..=225280; using the default"
            );
        }
        budget
    })
}

/// Whether a launch of `n_rows` rows at head width `dim` over `kv_bytes`-byte KV takes the paired
/// entry point by default: width 256 with fp8 KV up to 16 rows, with 16-bit KV 2–16 rows; width
/// 128 with 16-bit KV from 2 rows — where the H200 measured it faster (docs/benchmarks.md,
/// `lctx5`: the 27B's 24/4 × 256 fp8 one-row call at 8K 7–8%, 16 rows 1–2%; the Qwen3-like 32/8 ×
/// 128 bf16 at 16 / 64 rows 1–4%). Slower or not faster, so unpaired: one row in 16-bit KV, fp8 at
/// width 128, 64 rows at width 256.
pub fn pair_by_default(dim: usize, kv_bytes: usize, n_rows: usize) -> bool {
    match (dim, kv_bytes) {
        (256, 1) => n_rows <= 16,
        (256, 2) => (2..=16).contains(&n_rows),
        (128, 2) => n_rows >= 2,
        _ => false,
    }
}

/// Entry point name for compute dtype `t`, KV storage `c` and head width `dim`.
pub fn decode_mma_name(t: &str, c: &str, dim: usize) -> String {
    format!("attention_decode_mma_{t}_{c}_d{dim}")
}

/// The paired twin of [`decode_mma_name`] (two warps per warp of work, same bits; kernels.rs
/// lists the entry points with the same suffix).
fn decode_mma_pair_name(t: &str, c: &str, dim: usize) -> String {
    format!("{}_p2", decode_mma_name(t, c, dim))
}

/// Every tensor-core decode entry point for (`t`, `c`): the widths of [`DECODE_MMA_DIMS`], then
/// their paired twins (the combine is separate: [`decode_mma_combine_name`]).
fn decode_mma_names(t: &str, c: &str) -> Vec<String> {
    let one = DECODE_MMA_DIMS.iter().map(|&d| decode_mma_name(t, c, d));
    one.chain(
        DECODE_MMA_DIMS
            .iter()
            .map(|&d| decode_mma_pair_name(t, c, d)),
    )
    .collect()
}

/// The row bound of the paired launches set by `KILN_DMMA_PAIR_ROWS` (read at each backend's
/// creation, so one process can time both), `None` when unset or not a number (with a warning):
/// [`pair_by_default`] then decides.
fn decode_mma_pair_rows() -> Option<usize> {
    let v = std::env::var("KILN_DMMA_PAIR_ROWS").ok()?;
    let n = v.parse().ok();
    if n.is_none() {
        tracing::warn!(value = %v, "KILN_DMMA_PAIR_ROWS is not a row count; using the default");
    }
    n
}

/// Entry point name of the tensor-core kernel's combine for compute dtype `t`.
pub fn decode_mma_combine_name(t: &str) -> String {
    format!("attention_decode_mma_combine_{t}")
}

/// (threads per block, dynamic shared memory bytes) of the variant for head width `dim` and KV
/// element bytes `kv_bytes` (2 or 1): `DmmaShape<DV, CB>::NW * 32` and `::SMEM`.
pub fn decode_mma_geometry(dim: usize, kv_bytes: usize) -> (u32, u32) {
    decode_mma_geometry_for(
        dim,
        kv_bytes,
        decode_mma_stage_budget().unwrap_or(STAGE_BUDGET),
    )
}

/// [`decode_mma_geometry`] for stage budget `budget` bytes.
fn decode_mma_geometry_for(dim: usize, kv_bytes: usize, budget: usize) -> (u32, u32) {
    let warps = if dim == 256 { 2 } else { 4 };
    let rb = dim * kv_bytes;
    let ks = rb + if kv_bytes == 1 { 32 } else { 64 };
    let vs = rb + 16;
    let stage = CHUNK * (ks + vs);
    let nst = (budget / (warps * stage)).clamp(2, 4);
    // Merge rows of dim + 4 floats (`DMMA_RS`; dim + 2 with `KILN_DMMA_VEC_MERGE=0`: a bound).
    let red = (warps * 8 * (dim + 4) + 8) * 4;
    let smem = (warps * nst * stage).max(red);
    ((warps * 32) as u32, smem as u32)
}

/// The loaded tensor-core decode kernels of one backend, in the order of [`DECODE_MMA_DIMS`].
#[derive(Debug, Clone)]
pub(crate) struct DecodeMmaKernels {
    funcs: Vec<CudaFunction>,
    /// Their paired twins (`_p2`), same order.
    pairs: Vec<CudaFunction>,
    /// `KILN_DMMA_PAIR_ROWS`: launches of at most this many rows take `pairs` (else
    /// [`pair_by_default`]).
    pair_rows: Option<usize>,
    /// `attention_decode_mma_combine_{t}`.
    combine: CudaFunction,
    kv_bytes: usize,
    /// Narrowest head that takes these kernels (64, or 128 with `KILN_DECODE_MMA=128`).
    min_dim: usize,
}

impl DecodeMmaKernels {
    /// The kernels for (`t`, `c`) when the module was built (sm_80+) for a 16-bit `t` and
    /// `KILN_DECODE_MMA` is not `0`; each gets its dynamic shared memory limit raised.
    pub fn resolve(
        all: &HashMap<String, CudaFunction>,
        t: &str,
        c: &str,
        kv_bytes: usize,
    ) -> Result<Option<DecodeMmaKernels>, CudaError> {
        if std::env::var("KILN_DECODE_MMA").is_ok_and(|v| v == "0") {
            return Ok(None);
        }
        let Some(mut funcs) = decode_mma_names(t, c)
            .iter()
            .map(|n| all.get(n).cloned())
            .collect::<Option<Vec<_>>>()
        else {
            return Ok(None);
        };
        let pairs = funcs.split_off(DECODE_MMA_DIMS.len());
        let Some(combine) = all.get(&decode_mma_combine_name(t)).cloned() else {
            return Ok(None);
        };
        for (f, &d) in funcs
            .iter()
            .chain(&pairs)
            .zip(DECODE_MMA_DIMS.iter().cycle())
        {
            let (_, smem) = decode_mma_geometry(d, kv_bytes);
            f.set_attribute(
                cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                smem as i32,
            )?;
        }
        // Every width by default: SmolLM2's 9/3 x 64 measured 1.2-2.5x faster here than on
        // attention_decode.cu, short rows included (docs/benchmarks.md, `lctx2`). `128` keeps
        // width 64 on attention_decode.cu (the earlier default, for A/B); `all` is the default.
        let min_dim = if std::env::var("KILN_DECODE_MMA").is_ok_and(|v| v == "128") {
            128
        } else {
            64
        };
        tracing::debug!(
            t,
            c,
            min_dim,
            "Tensor-core decode attention kernels loaded."
        );
        Ok(Some(DecodeMmaKernels {
            funcs,
            pairs,
            pair_rows: decode_mma_pair_rows(),
            combine,
            kv_bytes,
            min_dim,
        }))
    }
}

/// A tensor-core decode launch: the function, threads per block and dynamic shared memory.
pub(crate) struct DecodeMmaLaunch<'a> {
    pub func: &'a CudaFunction,
    /// The merge of the parts (`attention_decode_mma_combine_{t}`).
    pub combine: &'a CudaFunction,
    /// Bytes of a KV element (2, or 1 for fp8).
    pub kv_bytes: usize,
    pub threads: u32,
    pub smem: u32,
}

impl CudaBackend {
    /// The tensor-core decode kernel for these shapes, when this backend has them (sm_80+, 16-bit
    /// compute, not disabled) and head_dim is 64, 128 or 256 (not 64 with `KILN_DECODE_MMA=128`)
    /// with at most 8 query heads per KV head; `None` keeps attention_decode.cu's kernel. A
    /// function of the shapes only (never of the data), so a captured graph and an eager step run
    /// the same kernel; the paired twin (same bits) by [`pair_by_default`] of the width, the KV
    /// bytes and `n_rows`, or up to `KILN_DMMA_PAIR_ROWS` rows.
    pub(crate) fn decode_mma(
        &self,
        head_dim: usize,
        group: usize,
        n_rows: usize,
    ) -> Option<DecodeMmaLaunch<'_>> {
        let k = self.k.attention_decode_mma.as_ref()?;
        if group == 0 || group > DECODE_MMA_MAX_GROUP || head_dim < k.min_dim {
            return None;
        }
        let i = DECODE_MMA_DIMS.iter().position(|&d| d == head_dim)?;
        let (threads, smem) = decode_mma_geometry(head_dim, k.kv_bytes);
        let pair = k
            .pair_rows
            .map_or(pair_by_default(head_dim, k.kv_bytes, n_rows), |n| {
                n_rows <= n
            });
        Some(DecodeMmaLaunch {
            func: if pair { &k.pairs[i] } else { &k.funcs[i] },
            combine: &k.combine,
            kv_bytes: k.kv_bytes,
            threads: if pair { 2 * threads } else { threads },
            smem,
        })
    }

    /// Whether decode attention of these shapes runs on the tensor-core kernel (for tests and
    /// benchmarks that report which kernel they measured).
    pub fn uses_decode_mma(&self, head_dim: usize, group: usize) -> bool {
        self.decode_mma(head_dim, group, 1).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_matches_the_kernel_and_fits_the_sm() {
        // The byte counts DmmaShape gives (attention_decode_mma.cu), per (dim, kv bytes), at the
        // default budget and at the earlier 106 496 (which KILN_DMMA_STAGE_BUDGET can still set).
        let shapes = [(64, 2), (128, 2), (256, 2), (64, 1), (128, 1), (256, 1)];
        let at = |budget| -> Vec<(u32, u32)> {
            shapes
                .iter()
                .map(|&(d, b)| decode_mma_geometry_for(d, b, budget))
                .collect()
        };
        assert_eq!(STAGE_BUDGET, 71_000);
        let got = at(STAGE_BUDGET);
        assert_eq!(
            got,
            vec![
                (128, 64_512),
                (128, 75_776),
                (64, 70_656),
                (128, 45_056),
                (128, 58_368),
                (64, 53_760)
            ]
        );
        let old = at(106_496);
        assert_eq!(
            old,
            vec![
                (128, 86_016),
                (128, 75_776),
                (64, 105_984),
                (128, 45_056),
                (128, 77_824),
                (64, 71_680)
            ]
        );
        // At least two blocks per SM within an H100 / H200's 228 KB (1 KB reserved per block),
        // and under the 227 KB one block may have.
        for (_, smem) in got.into_iter().chain(old) {
            assert!(2 * (smem as usize + 1024) <= 228 * 1024);
        }
        assert_eq!(
            decode_mma_name("bf16", "e5m2", 256),
            "attention_decode_mma_bf16_e5m2_d256"
        );
        assert_eq!(
            decode_mma_names("bf16", "e5m2")[5],
            "attention_decode_mma_bf16_e5m2_d256_p2"
        );
        // The paired twins by default (width 256: fp8 ≤ 16 rows, 16-bit 2..=16; width 128:
        // 16-bit from 2 rows).
        assert!(pair_by_default(256, 1, 1) && pair_by_default(256, 1, 16));
        assert!(pair_by_default(256, 2, 2) && pair_by_default(256, 2, 16));
        assert!(!pair_by_default(256, 2, 1) && !pair_by_default(256, 1, 17));
        assert!(!pair_by_default(256, 2, 64) && !pair_by_default(128, 2, 1));
        assert!(pair_by_default(128, 2, 2) && pair_by_default(128, 2, 64));
        assert!(!pair_by_default(128, 1, 16) && !pair_by_default(64, 2, 16));
    }
}
