//! Rotary embedding and the paged KV cache's writes: `rope`, `write_kv`, the fused
//! `qkv_rope_write` (per-head q/k RMSNorm, RoPE, q out and K/V into their cache slots in one
//! kernel) and `copy_block` (copy-on-write of a shared prefix block). The [`Backend`] methods of
//! the same names forward here.
//!
//! Numerics: `rope` (rope.cu), `qkv_rope_write` (kv_cache.cu) and the fused q|k|v epilogue
//! (dense.cu's NORM_ROPE, `dense_rope.rs`) rotate a pair with the same explicitly rounded
//! products (`__fmul_rn`, then `__fsub_rn` / `__fadd_rn`; no FMA contraction), so a head's rotated
//! bits do not depend on which of them ran (part of the batch invariance across the fused /
//! unfused layer, docs/architecture.md).
//!
//! [`Backend`]: crate::backend::Backend

use std::ffi::c_void;

use cudarc::driver::{DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};

use super::{check_len, dev_err, CudaBackend, CudaBuffer, CudaKvCache, CudaRope, CudaStep};
use crate::backend::{AttentionParams, BackendError};

/// Threads per block of `qkv_rope_write` (`QKV_WARPS * 32` in kv_cache.cu).
const QKV_THREADS: u32 = 4 * 32;
/// Largest head_dim `qkv_rope_write` holds (`QKV_MAX_DIM`).
const QKV_MAX_HEAD_DIM: usize = 256;

/// `Err(InvalidArgument)` when a position of the step lies past the RoPE table.
pub(super) fn check_positions(rope: &CudaRope, step: &CudaStep) -> Result<(), BackendError> {
    if step.max_context > rope.spec.max_positions {
        return Err(BackendError::InvalidArgument(format!(
            "position {} past the RoPE table ({})",
            step.max_context, rope.spec.max_positions
        )));
    }
    Ok(())
}

pub(super) fn rope(
    be: &CudaBackend,
    q: &mut CudaBuffer,
    k: &mut CudaBuffer,
    rope: &CudaRope,
    step: &CudaStep,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
) -> Result<(), BackendError> {
    let _t = be.prof.op(&be.stream, "rope");
    check_len("rope q", q.len, step.num_tokens * num_heads * head_dim)?;
    check_len("rope k", k.len, step.num_tokens * num_kv_heads * head_dim)?;
    if rope.spec.rotary_dim > head_dim {
        return Err(BackendError::InvalidArgument(format!(
            "rotary_dim {} > head_dim {head_dim}",
            rope.spec.rotary_dim
        )));
    }
    check_positions(rope, step)?;
    if step.num_tokens == 0 {
        return Ok(());
    }
    let f = &be.k.rope;
    let positions = step.positions();
    let (nh, nkv, hd, half) = (
        num_heads as i32,
        num_kv_heads as i32,
        head_dim as i32,
        (rope.spec.rotary_dim / 2) as i32,
    );
    let mut b = be.stream.launch_builder(f);
    b.arg(&mut q.data)
        .arg(&mut k.data)
        .arg(&positions)
        .arg(&rope.cos)
        .arg(&rope.sin);
    b.arg(&nh).arg(&nkv).arg(&hd).arg(&half);
    let cfg = LaunchConfig {
        grid_dim: (step.num_tokens as u32, 1, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: q and k hold num_tokens rows of their head counts (checked); positions are
    // below the table length (checked via max_context).
    unsafe { b.launch(cfg) }.map_err(dev_err)?;
    Ok(())
}

pub(super) fn write_kv(
    be: &CudaBackend,
    cache: &mut CudaKvCache,
    layer: usize,
    k: &CudaBuffer,
    v: &CudaBuffer,
    step: &CudaStep,
) -> Result<(), BackendError> {
    let _t = be.prof.op(&be.stream, "write_kv");
    let spec = cache.spec;
    if layer >= spec.num_layers {
        return Err(BackendError::InvalidArgument(format!(
            "layer {layer} of {}",
            spec.num_layers
        )));
    }
    let row = spec.slot_elems();
    check_len("write_kv k", k.len, step.num_tokens * row)?;
    check_len("write_kv v", v.len, step.num_tokens * row)?;
    if step.num_tokens == 0 {
        return Ok(());
    }
    let f = &be.k.kv_write;
    let slots = step.slot_mapping();
    let row_elems = row as i32;
    let (kc, vc) = (&mut cache.k[layer], &mut cache.v[layer]);
    let mut b = be.stream.launch_builder(f);
    b.arg(&k.data)
        .arg(&v.data)
        .arg(kc)
        .arg(vc)
        .arg(&slots)
        .arg(&row_elems);
    let cfg = LaunchConfig {
        grid_dim: (step.num_tokens as u32, 1, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: slots come from ForwardBatch::step_input, which checked every block id against
    // num_blocks, so each slot indexes inside the layer's cache.
    unsafe { b.launch(cfg) }.map_err(dev_err)?;
    Ok(())
}

pub(super) fn qkv_rope_write(
    be: &CudaBackend,
    qkv: &CudaBuffer,
    q_out: &mut CudaBuffer,
    cache: &mut CudaKvCache,
    layer: usize,
    rope: &CudaRope,
    step: &CudaStep,
    params: &AttentionParams,
    qk_norm: Option<(&CudaBuffer, &CudaBuffer, f32)>,
) -> Result<(), BackendError> {
    let _t = be.prof.op(&be.stream, "qkv_rope_write");
    let spec = cache.spec;
    params.check_fits(&spec, layer)?;
    let (t, hd) = (step.num_tokens, params.head_dim);
    let width = (params.num_heads + 2 * params.num_kv_heads) * hd;
    check_len("qkv_rope_write qkv", qkv.len, t * width)?;
    check_len("qkv_rope_write q_out", q_out.len, t * params.num_heads * hd)?;
    be.expect_compute("qkv_rope_write qkv", qkv)?;
    be.expect_compute("qkv_rope_write q_out", q_out)?;
    if hd > QKV_MAX_HEAD_DIM || rope.spec.rotary_dim > hd {
        return Err(BackendError::InvalidArgument(format!(
            "qkv_rope_write: head_dim {hd} (at most {QKV_MAX_HEAD_DIM}), rotary_dim {}",
            rope.spec.rotary_dim
        )));
    }
    check_positions(rope, step)?;
    if let Some((qn, kn, _)) = qk_norm {
        check_len("qkv_rope_write q_norm", qn.len, hd)?;
        check_len("qkv_rope_write k_norm", kn.len, hd)?;
        be.expect_compute("qkv_rope_write q_norm", qn)?;
        be.expect_compute("qkv_rope_write k_norm", kn)?;
    }
    if t == 0 {
        return Ok(());
    }
    let positions = step.positions();
    let slots = step.slot_mapping();
    let null: u64 = 0;
    let (nh, nkv, hdi, half) = (
        params.num_heads as i32,
        params.num_kv_heads as i32,
        hd as i32,
        (rope.spec.rotary_dim / 2) as i32,
    );
    let eps = qk_norm.map_or(0.0, |(_, _, e)| e);
    let (kc, vc) = (&mut cache.k[layer], &mut cache.v[layer]);
    let (qkv_p, _s0) = qkv.data.device_ptr(&be.stream);
    let (q_p, _s1) = q_out.data.device_ptr_mut(&be.stream);
    let (kc_p, _s2) = kc.device_ptr_mut(&be.stream);
    let (vc_p, _s3) = vc.device_ptr_mut(&be.stream);
    let (pos_p, _s4) = positions.device_ptr(&be.stream);
    let (slot_p, _s5) = slots.device_ptr(&be.stream);
    let (cos_p, _s6) = rope.cos.device_ptr(&be.stream);
    let (sin_p, _s7) = rope.sin.device_ptr(&be.stream);
    let (qn_p, kn_p) = match qk_norm {
        Some((qn, kn, _)) => (
            qn.data.device_ptr(&be.stream).0,
            kn.data.device_ptr(&be.stream).0,
        ),
        None => (null, null),
    };
    let mut params = [
        &qkv_p as *const u64 as *mut c_void,
        &q_p as *const u64 as *mut c_void,
        &kc_p as *const u64 as *mut c_void,
        &vc_p as *const u64 as *mut c_void,
        &pos_p as *const u64 as *mut c_void,
        &slot_p as *const u64 as *mut c_void,
        &cos_p as *const u64 as *mut c_void,
        &sin_p as *const u64 as *mut c_void,
        &qn_p as *const u64 as *mut c_void,
        &kn_p as *const u64 as *mut c_void,
        &nh as *const i32 as *mut c_void,
        &nkv as *const i32 as *mut c_void,
        &hdi as *const i32 as *mut c_void,
        &half as *const i32 as *mut c_void,
        &eps as *const f32 as *mut c_void,
    ];
    let cfg = LaunchConfig {
        grid_dim: (t as u32, 1, 1),
        block_dim: (QKV_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: the parameters match the kernel's signature, in order, and outlive the call
    // (the sync guards keep every buffer in use on this stream); qkv holds t rows of (heads
    // + 2 kv_heads) × head_dim and q_out t rows of heads × head_dim (checked); head_dim ≤
    // QKV_MAX_DIM (the kernel's shared row); positions are below the RoPE table (checked
    // via max_context); slots come from ForwardBatch::step_input, which checked every block
    // id, so each indexes inside the layer's cache; the norm weights hold head_dim elements
    // or are null (skipping the norm). The kernel waits (griddepcontrol) before reading, so
    // it may be launched with PDL.
    unsafe { be.launch_kernel(&be.k.qkv_rope_write, cfg, &mut params, be.pdl) }
}

pub(super) fn copy_block(
    be: &CudaBackend,
    cache: &mut CudaKvCache,
    src: u32,
    dst: u32,
) -> Result<(), BackendError> {
    let spec = cache.spec;
    if src as usize >= spec.num_blocks || dst as usize >= spec.num_blocks {
        return Err(BackendError::InvalidArgument(format!(
            "copy_block {src} → {dst} of {} blocks",
            spec.num_blocks
        )));
    }
    let f = &be.k.kv_copy_block;
    let block_elems = (spec.block_size * spec.slot_elems()) as i64;
    let (s, d) = (src as i64, dst as i64);
    for layer in 0..spec.num_layers {
        for part in [&mut cache.k[layer], &mut cache.v[layer]] {
            let mut b = be.stream.launch_builder(f);
            b.arg(part).arg(&s).arg(&d).arg(&block_elems);
            // SAFETY: src and dst are < num_blocks (checked); each block holds block_elems
            // elements of `elem` bytes, matching the kernel variant.
            unsafe { b.launch(LaunchConfig::for_num_elems(block_elems as u32)) }
                .map_err(dev_err)?;
        }
    }
    Ok(())
}
