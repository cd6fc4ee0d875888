//! The chunked gated delta rule on CUDA (`kernels/gdn_chunk.cu`): the prefill form of
//! [`HybridBackend::gdn_recurrence`](crate::backend::hybrid::HybridBackend::gdn_recurrence) for
//! the 16-bit compute dtypes, with tensor cores: mma m16n8k16 on sm_80+, m8n8k4 (fp16) on sm_70 /
//! sm_75, where `KILN_GDN_CHUNK_TILES=fma` (read when the kernels are compiled) runs the same tiles
//! in f32 FMAs instead (bf16 below sm_80 always does).
//!
//! Which path a sequence takes depends on its own new-token count only (so a row's result does
//! not depend on its batch): at least [`CudaStateCache::chunked_min_len`] tokens → chunked,
//! fewer → the sequential scan (`gdn.cu`), which is also the oracle the chunked form is checked
//! against. Both read and leave the same f32 state.
//!
//! The chunked path needs a workspace (per chunk of 64 tokens and value head: `W`, `Qg` `[64,
//! dk]`, `Kdᵀ` `[dk, 64]`, `U` `[64, dv]`, `P` `[64, 64]` in the compute dtype, and one f32; sized
//! by [`GdnParams::chunk_workspace`]): for the 27B's GDN shapes 3.4 MiB per chunk id, ids for
//! `max_num_batched_tokens / 64 + max_num_seqs + 1` chunks. The GPU runner makes it once at load
//! ([`HybridBackend::reserve_prefill_workspace`]) from `engine.max_num_batched_tokens` and
//! `max_num_seqs`, and the memory planner counts it
//! ([`HybridBackend::prefill_workspace_bytes`]); a step past those limits (tests, benches) grows
//! it, with a warning when it had been reserved.

use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig, PushKernelArg};

use super::{dev_err, CudaBackend, CudaBuffer, CudaStep};
use crate::backend::cuda::device::CudaError;
use crate::backend::hybrid::{GdnParams, GDN_CHUNK};
use crate::backend::BackendError;

/// The op stems of `gdn_chunk.cu`; each exists as `{op}_{f16,bf16}`.
pub const GDN_CHUNK_OPS: [&str; 2] = ["gdn_chunk_prep", "gdn_chunk_scan"];

/// Tokens per chunk (`GC_C`).
const CHUNK: usize = GDN_CHUNK;
/// Threads per block of both kernels (`GC_THREADS`).
const THREADS: u32 = 128;
/// Value columns per block of the state pass (`GC_DVS`).
const COLS: usize = 16;
/// Padding of the shared rows of mma operands, elements (`GC_PAD`).
const PAD: usize = 8;
/// Largest key / value head the kernels' shared memory is laid out for.
const MAX_DK: usize = 128;
const MAX_DV: usize = 128;

/// New tokens from which a sequence takes the chunked path by default. Below it the sequential
/// scan is cheaper (about 2 µs per token against a fixed cost of a few chunk passes).
pub const DEFAULT_CHUNKED_MIN_LEN: usize = 16;

/// Dynamic shared bytes of `gdn_chunk_prep`: in 16 bits, rows padded, q `[64][dk]` (later Kᵀ
/// `[dk][64]`, whichever is larger), k `[64][dk]`, vᵀ `[dv][64]`; in f32 A `[64][64]` (later
/// the scaled (I + A)⁻¹ in 16 bits), (I + A)⁻¹ `[64][65]` and four per-row vectors.
fn prep_shared(dk: usize, dv: usize) -> usize {
    let (ldk, ldc) = (dk + PAD, CHUNK + PAD);
    ((CHUNK * ldk).max(dk * ldc) + CHUNK * ldk + dv * ldc) * 2
        + (CHUNK * CHUNK + CHUNK * (CHUNK + 1) + 4 * CHUNK) * 4
}

/// Dynamic shared bytes of `gdn_chunk_scan`, all 16-bit, rows padded: W and Qg `[64][dk]`, Kdᵀ
/// `[dk][64]`, P `[64][64]`, this block's U columns `[64][16]`, Vnᵀ `[16][64]`, Sᵀ `[16][dk]`.
fn scan_shared(dk: usize) -> usize {
    let (ldk, ldc) = (dk + PAD, CHUNK + PAD);
    (2 * CHUNK * ldk + dk * ldc + CHUNK * ldc + CHUNK * COLS + COLS * ldc + COLS * ldk) * 2
}

/// Whether the chunked kernels take these head shapes.
pub(crate) fn shapes_fit(p: &GdnParams) -> bool {
    let (dk, dv) = (p.key_head_dim, p.value_head_dim);
    dk.is_multiple_of(16) && dk <= MAX_DK && dv.is_multiple_of(8) && dv <= MAX_DV && dv > 0
}

/// The `gdn_chunk.cu` entry points for one 16-bit compute dtype.
#[derive(Debug, Clone)]
pub(crate) struct ChunkKernels {
    prep: CudaFunction,
    scan: CudaFunction,
}

impl ChunkKernels {
    /// The entry points for dtype suffix `t`, or `None` for f32 (which keeps the scan).
    pub(crate) fn resolve(
        get: &impl Fn(String) -> Result<CudaFunction, CudaError>,
        t: &str,
    ) -> Result<Option<ChunkKernels>, CudaError> {
        if t == "f32" {
            return Ok(None);
        }
        let prep = get(format!("gdn_chunk_prep_{t}"))?;
        let scan = get(format!("gdn_chunk_scan_{t}"))?;
        let attr =
            cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
        // Both stay within the V100's 96 KB (checked by the unit test below); a device that
        // allows less (sm_75: 64 KB) keeps the sequential scan for every prefill.
        let (p_bytes, s_bytes) = (prep_shared(MAX_DK, MAX_DV), scan_shared(MAX_DK));
        if let Err(e) = prep
            .set_attribute(attr, p_bytes as i32)
            .and_then(|()| scan.set_attribute(attr, s_bytes as i32))
        {
            tracing::warn!(
                shared_bytes = p_bytes.max(s_bytes),
                error = %e,
                "The chunked GDN prefill needs more shared memory than this device allows per block: prefills use the sequential scan."
            );
            return Ok(None);
        }
        Ok(Some(ChunkKernels { prep, scan }))
    }
}

/// The chunked path's device workspace (see the module docs): reserved once, or grown on demand.
#[derive(Debug, Default)]
pub(crate) struct ChunkWorkspace {
    /// Records of 16-bit elements.
    records: Option<CudaSlice<u16>>,
    /// `exp(gc_last)` per (chunk, value head).
    decay: Option<CudaSlice<f32>>,
    /// Made by [`CudaBackend::reserve_chunk_workspace`]: growing it is then worth a warning.
    reserved: bool,
}

impl CudaBackend {
    /// Make `ws` hold at least `records` 16-bit and `decay` f32 elements (an allocation only
    /// when it holds fewer; the old buffer is freed first).
    fn grow_chunk_workspace(
        &self,
        ws: &mut ChunkWorkspace,
        records: usize,
        decay: usize,
    ) -> Result<(), BackendError> {
        let short_r = ws.records.as_ref().is_none_or(|r| r.len() < records);
        let short_d = ws.decay.as_ref().is_none_or(|r| r.len() < decay);
        if (short_r || short_d) && ws.reserved {
            tracing::warn!(
                records,
                decay,
                "A step needs more chunked-prefill workspace than was reserved for \
                 `engine.max_num_batched_tokens`: growing it (device memory the planner did not count)."
            );
        }
        if short_r {
            ws.records = None; // free the old one first
            ws.records = Some(self.stream.alloc_zeros::<u16>(records).map_err(dev_err)?);
        }
        if short_d {
            ws.decay = None;
            ws.decay = Some(self.stream.alloc_zeros::<f32>(decay).map_err(dev_err)?);
        }
        Ok(())
    }

    /// Whether this backend runs the chunked prefill for layers shaped `p` (16-bit compute,
    /// kernels resolved, shapes the kernels take).
    pub(super) fn has_chunked_prefill(&self, p: &GdnParams) -> bool {
        self.k.gdn.chunk.is_some() && shapes_fit(p)
    }

    /// Reserve the chunked prefill's workspace of `cache` for steps of up to `max_tokens`
    /// tokens over `max_seqs` sequences (nothing when the chunked path is off for `p`).
    /// Returns the bytes it holds.
    pub(super) fn reserve_chunk_workspace(
        &self,
        ws: &mut ChunkWorkspace,
        p: &GdnParams,
        max_tokens: usize,
        max_seqs: usize,
    ) -> Result<usize, BackendError> {
        if !self.has_chunked_prefill(p) || max_tokens == 0 {
            return Ok(0);
        }
        let size = p.chunk_workspace(max_tokens, max_seqs.max(1));
        self.grow_chunk_workspace(ws, size.records, size.decay)?;
        ws.reserved = true;
        Ok(size.bytes())
    }

    /// The chunked gated delta rule for the sequences of `step` with at least `min_len` new
    /// tokens (the caller checked buffers, slots and shapes; `shapes_fit(p)` holds).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn gdn_chunked(
        &self,
        k: &ChunkKernels,
        ws: &mut ChunkWorkspace,
        rec: &mut CudaSlice<f32>,
        num_layers: usize,
        layer: usize,
        qkv: &CudaBuffer,
        a: &CudaBuffer,
        b: &CudaBuffer,
        a_log: &CudaBuffer,
        dt_bias: &CudaBuffer,
        step: &CudaStep,
        p: &GdnParams,
        min_len: usize,
        out: &mut CudaBuffer,
    ) -> Result<(), BackendError> {
        let max_len = step
            .seq_slots
            .iter()
            .filter(|s| s.len >= min_len && s.slot.is_some())
            .map(|s| s.len)
            .max()
            .unwrap_or(0);
        if max_len == 0 {
            return Ok(());
        }
        let (nv, dk, dv) = (p.num_value_heads, p.key_head_dim, p.value_head_dim);
        // Chunk ids are token_start / 64 + seq + c (see gdn_chunk.cu).
        let size = p.chunk_workspace(step.num_tokens, step.num_seqs);
        self.grow_chunk_workspace(ws, size.records, size.decay)?;
        let (Some(records), Some(decay)) = (ws.records.as_mut(), ws.decay.as_mut()) else {
            unreachable!("allocated above")
        };
        let meta = step.seq_meta();
        let (nk, nvi, dki, dvi, ml) = (
            p.num_key_heads as i32,
            nv as i32,
            dk as i32,
            dv as i32,
            min_len as i32,
        );
        let seqs = step.num_seqs.max(1) as u32;
        let mut lb = self.stream.launch_builder(&k.prep);
        lb.arg(&qkv.data)
            .arg(&a.data)
            .arg(&b.data)
            .arg(&a_log.data)
            .arg(&dt_bias.data)
            .arg(&meta)
            .arg(&mut *records)
            .arg(&mut *decay);
        lb.arg(&nk).arg(&nvi).arg(&dki).arg(&dvi).arg(&ml);
        let cfg = LaunchConfig {
            grid_dim: (seqs, nv as u32, max_len.div_ceil(CHUNK) as u32),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: prep_shared(dk, dv) as u32,
        };
        // SAFETY: the caller checked qkv (tokens × conv_dim), a/b (tokens × value heads),
        // A_log/dt_bias (value heads), all in the 16-bit compute dtype, and the slots; every
        // chunk id is below `chunks` (token_start / 64 + seq + c ≤ tokens / 64 + seqs), so each
        // block writes its own record inside `records` / `decay`; dk ≤ 128, dv ≤ 128 and the
        // shared size is the one the kernel lays out (attribute set at load for the largest).
        unsafe { lb.launch(cfg) }.map_err(dev_err)?;

        let (nl, l) = (num_layers as i32, layer as i32);
        let mut lb = self.stream.launch_builder(&k.scan);
        lb.arg(&*records)
            .arg(&*decay)
            .arg(&mut *rec)
            .arg(&meta)
            .arg(&mut out.data);
        lb.arg(&nvi).arg(&dki).arg(&dvi).arg(&nl).arg(&l).arg(&ml);
        let cfg = LaunchConfig {
            grid_dim: (seqs, nv as u32, dv.div_ceil(COLS) as u32),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: scan_shared(dk) as u32,
        };
        // SAFETY: as above; each block reads the records the prep wrote for its sequence and
        // head, and reads/writes only the state columns of its own (slot, layer, head, column
        // slice); slots of one step are distinct (checked by the caller); out holds tokens ×
        // value_dim elements (checked).
        unsafe { lb.launch(cfg) }.map_err(dev_err)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_memory_fits_the_v100() {
        // sm_70 allows 96 KB of dynamic shared memory per block (opt-in).
        assert!(prep_shared(MAX_DK, MAX_DV) <= 96 * 1024);
        assert!(scan_shared(MAX_DK) <= 96 * 1024);
    }

    #[test]
    fn records_stay_16_byte_aligned() {
        // The state pass copies records with 16-byte loads.
        for (dk, dv) in [(16, 8), (32, 40), (128, 128), (64, 24)] {
            let p = GdnParams {
                num_key_heads: 1,
                num_value_heads: 1,
                key_head_dim: dk,
                value_head_dim: dv,
            };
            assert_eq!(p.chunk_record_elems() % 8, 0, "{dk} {dv}");
        }
    }
}
