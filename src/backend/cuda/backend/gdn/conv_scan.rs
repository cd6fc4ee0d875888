//! The two sequence ops of a Gated DeltaNet layer on CUDA, bodies of the [`HybridBackend`]
//! methods of the same names (`gdn.rs` forwards): the causal conv1d with its rolling state
//! (`gdn_conv1d`: vectorised for long prefills, one thread per channel and token otherwise) and
//! the delta-rule recurrence (`gdn_recurrence`: the chunked tensor-core form for long sequences,
//! `gdn_chunk.rs`, else the sequential scan of `kernels/gdn.cu`).
//!
//! [`HybridBackend`]: crate::backend::hybrid::HybridBackend

use cudarc::driver::LaunchConfig;

use super::super::launch::KernelArgs;
use super::super::{check_len, CudaBackend, CudaBuffer, CudaStep};
use super::{
    check_layer, check_slots, gdn_chunk, CudaStateCache, CONV_THREADS, MAX_GRID_Y, SCAN_LANES,
    SCAN_MAX_DK, SCAN_THREADS, VEC_CONV_KERNEL, VEC_CONV_MIN_TOKENS, VEC_CONV_RUN,
};
use crate::backend::hybrid::GdnParams;
use crate::backend::BackendError;

pub(super) fn gdn_conv1d(
    be: &CudaBackend,
    cache: &mut CudaStateCache,
    layer: usize,
    mixed: &CudaBuffer,
    weight: &CudaBuffer,
    step: &CudaStep,
    out: &mut CudaBuffer,
) -> Result<(), BackendError> {
    let _t = be.prof.op(&be.stream, "gdn_conv1d");
    let spec = cache.spec;
    check_layer(&spec, layer)?;
    check_slots(step, &spec)?;
    let (dim, kern, t) = (spec.conv_dim, spec.conv_kernel, step.num_tokens);
    check_len("gdn_conv1d input", mixed.len, t * dim)?;
    check_len("gdn_conv1d output", out.len, t * dim)?;
    check_len("gdn_conv1d weight", weight.len, dim * kern)?;
    for (what, b) in [("input", mixed), ("weight", weight), ("output", &*out)] {
        be.expect_compute(&format!("gdn_conv1d {what}"), b)?;
    }
    if t == 0 {
        return Ok(());
    }
    if t > MAX_GRID_Y || step.num_seqs > MAX_GRID_Y {
        return Err(BackendError::Unsupported(format!(
            "gdn_conv1d over {t} tokens (at most {MAX_GRID_Y} per step on CUDA)"
        )));
    }
    let (token_seq, meta) = (step.token_seq(), step.seq_meta());
    let (d, k, nl, l) = (
        dim as i32,
        kern as i32,
        spec.num_layers as i32,
        layer as i32,
    );
    let blocks = dim.div_ceil(CONV_THREADS) as u32;
    // Both kernels take these six buffers first, then their own integers.
    let st = &be.stream;
    let mut b = KernelArgs::new();
    b.buf(&mixed.data, st)
        .buf(&weight.data, st)
        .buf(&cache.conv, st)
        .buf(&token_seq, st)
        .buf(&meta, st)
        .buf(&out.data, st);
    if dim.is_multiple_of(8) && kern == VEC_CONV_KERNEL && t >= VEC_CONV_MIN_TOKENS {
        let tpt = VEC_CONV_RUN;
        let (nt, tpt_i) = (t as i32, tpt as i32);
        b.i32(d).i32(nl).i32(l).i32(nt).i32(tpt_i);
        let cfg = LaunchConfig {
            grid_dim: (
                (dim / 8).div_ceil(CONV_THREADS) as u32,
                t.div_ceil(tpt) as u32,
                1,
            ),
            block_dim: (CONV_THREADS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: as for gdn_conv1d below; in addition conv_dim is a multiple of 8 and every
        // buffer is its own allocation (256-byte aligned), so each 8-channel access of a
        // row (16-bit: 16 B, f32 state: 32 B) is aligned and inside the row; the kernel
        // guards channel < conv_dim and token < t, and a one-token sequence's 8 channels
        // are read and rewritten by one thread only. The kernel waits (PDL) before any access.
        unsafe { be.launch_args(&be.k.gdn.conv1d_vec, cfg, &mut b, be.pdl_packed()) }?;
    } else {
        b.i32(d).i32(k).i32(nl).i32(l);
        let cfg = LaunchConfig {
            grid_dim: (blocks, t as u32, 1),
            block_dim: (CONV_THREADS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: mixed/out hold t rows of conv_dim and weight conv_dim × kernel (checked);
        // token_seq/seq_meta come from the checked StepInput (every token's sequence has a
        // slot < num_slots, checked above), so every state row read lies in the slot's
        // layer block; a sequence with one token has one thread per channel, the only one
        // touching that channel of its (distinct) slot, which rewrites it after reading it.
        // The kernel waits (PDL) before any access.
        unsafe { be.launch_args(&be.k.gdn.conv1d, cfg, &mut b, be.pdl_packed()) }?;
    }
    if step.seq_slots.iter().all(|s| s.len <= 1) {
        return Ok(()); // decode only: gdn_conv1d updated every state
    }
    // The new conv state of the longer sequences, after every token has read the old one.
    let st = &be.stream;
    let mut b = KernelArgs::new();
    b.buf(&mixed.data, st).buf(&cache.conv, st).buf(&meta, st);
    b.i32(d).i32(k).i32(nl).i32(l);
    let cfg = LaunchConfig {
        grid_dim: (blocks, step.num_seqs.max(1) as u32, 1),
        block_dim: (CONV_THREADS as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: as above; each thread writes one channel of its sequence's slot (distinct
    // slots, checked), and a sequence with at most one token or without a slot returns.
    // The kernel waits (PDL) before any access.
    unsafe { be.launch_args(&be.k.gdn.conv_state, cfg, &mut b, be.pdl_packed()) }?;
    Ok(())
}

#[allow(clippy::too_many_arguments)]
pub(super) fn gdn_recurrence(
    be: &CudaBackend,
    cache: &mut CudaStateCache,
    layer: usize,
    qkv: &CudaBuffer,
    a: &CudaBuffer,
    b: &CudaBuffer,
    a_log: &CudaBuffer,
    dt_bias: &CudaBuffer,
    step: &CudaStep,
    params: &GdnParams,
    out: &mut CudaBuffer,
) -> Result<(), BackendError> {
    let _t = be.prof.op(&be.stream, "gdn_recurrence");
    params.check_fits(&cache.spec, layer)?;
    check_slots(step, &cache.spec)?;
    let (t, nv, dk, dv) = (
        step.num_tokens,
        params.num_value_heads,
        params.key_head_dim,
        params.value_head_dim,
    );
    check_len("gdn qkv", qkv.len, t * params.conv_dim())?;
    check_len("gdn a", a.len, t * nv)?;
    check_len("gdn b", b.len, t * nv)?;
    check_len("gdn A_log", a_log.len, nv)?;
    check_len("gdn dt_bias", dt_bias.len, nv)?;
    check_len("gdn output", out.len, t * params.value_dim())?;
    for (what, x) in [
        ("qkv", qkv),
        ("a", a),
        ("b", b),
        ("A_log", a_log),
        ("dt_bias", dt_bias),
        ("output", &*out),
    ] {
        be.expect_compute(&format!("gdn {what}"), x)?;
    }
    if !dk.is_multiple_of(SCAN_LANES) || dk > SCAN_MAX_DK {
        return Err(BackendError::Unsupported(format!(
            "GDN key head dim {dk} on CUDA (a multiple of {SCAN_LANES}, at most {SCAN_MAX_DK})"
        )));
    }
    if t == 0 {
        return Ok(());
    }
    // Sequences of at least `min_len` new tokens: the chunked form; the rest: the scan.
    let min_len = match (&be.k.gdn.chunk, cache.chunked_min_len) {
        (Some(_), Some(n)) if gdn_chunk::shapes_fit(params) => n,
        _ => usize::MAX,
    };
    if let Some(k) = &be.k.gdn.chunk {
        if min_len != usize::MAX {
            be.gdn_chunked(
                k,
                &mut cache.chunk_ws,
                &mut cache.rec,
                cache.spec.num_layers,
                layer,
                qkv,
                a,
                b,
                a_log,
                dt_bias,
                step,
                params,
                min_len,
                out,
            )?;
        }
    }
    if !step
        .seq_slots
        .iter()
        .any(|s| s.len > 0 && s.len < min_len && s.slot.is_some())
    {
        return Ok(());
    }
    let meta = step.seq_meta();
    let (nk, nvi, dki, dvi, nl, l) = (
        params.num_key_heads as i32,
        nv as i32,
        dk as i32,
        dv as i32,
        cache.spec.num_layers as i32,
        layer as i32,
    );
    let chunk_min = min_len.min(i32::MAX as usize) as i32;
    let cols = SCAN_THREADS / SCAN_LANES;
    // dk a multiple of 4 R: the 128-bit variant (same math, rows dealt in runs of 4).
    let scan = if dk.is_multiple_of(4 * SCAN_LANES) {
        &be.k.gdn.scan_v4
    } else {
        &be.k.gdn.scan
    };
    let st = &be.stream;
    let mut lb = KernelArgs::new();
    lb.buf(&qkv.data, st)
        .buf(&a.data, st)
        .buf(&b.data, st)
        .buf(&a_log.data, st)
        .buf(&dt_bias.data, st)
        .buf(&cache.rec, st)
        .buf(&meta, st)
        .buf(&out.data, st);
    lb.i32(nk).i32(nvi).i32(dki).i32(dvi).i32(nl).i32(l);
    lb.i32(chunk_min);
    let cfg = LaunchConfig {
        grid_dim: (
            step.num_seqs.max(1) as u32,
            nv as u32,
            dv.div_ceil(cols) as u32,
        ),
        block_dim: (SCAN_THREADS as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: qkv holds t rows of conv_dim, a/b t rows of value_heads, out t rows of
    // value_dim, A_log/dt_bias value_heads (all checked); dk is a multiple of the kernel's R and at
    // most GDN_MAX_DK (the kernel's register and shared arrays); each block reads and
    // writes the state of its own (slot, head) only, and slots are distinct (checked); it
    // skips the sequences the chunked kernels ran (len >= chunk_min). The kernel waits (PDL)
    // before any access.
    unsafe { be.launch_args(scan, cfg, &mut lb, be.pdl_packed()) }?;
    Ok(())
}
