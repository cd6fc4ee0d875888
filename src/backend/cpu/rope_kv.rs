//! The CPU backend's attention-side ops: RoPE on q and k, the KV-cache write, paged attention,
//! and the fused q|k|v rows through the per-head norm, RoPE and the KV write (the reference for
//! the fused forms: the unfused ops on the split rows). Argument checks here, the arithmetic in
//! [`super::ops`] and [`super::attention`]; the [`Backend`] methods of the same names forward here.

// The CPU backend's buffers are `Vec<f32>` (`Backend::Buffer`): these take what the trait
// methods take and hand them on.
#![allow(clippy::ptr_arg)]

use super::{attention, check_len, ops, CpuBackend, CpuKvCache, CpuRope};
use crate::backend::{AttentionParams, Backend, BackendError, StepInput};

#[allow(clippy::too_many_arguments)]
pub(super) fn rope(
    be: &CpuBackend,
    q: &mut Vec<f32>,
    k: &mut Vec<f32>,
    rope: &CpuRope,
    step: &StepInput,
    num_heads: usize,
    num_kv_heads: usize,
    head_dim: usize,
) -> Result<(), BackendError> {
    let t = step.num_tokens();
    check_len("rope q", q.len(), t * num_heads * head_dim)?;
    check_len("rope k", k.len(), t * num_kv_heads * head_dim)?;
    if rope.spec.rotary_dim > head_dim {
        return Err(BackendError::InvalidArgument(format!(
            "rotary dim {} > head dim {head_dim}",
            rope.spec.rotary_dim
        )));
    }
    if let Some(&p) = step
        .positions
        .iter()
        .find(|&&p| p as usize >= rope.spec.max_positions)
    {
        return Err(BackendError::InvalidArgument(format!(
            "position {p} is past the RoPE table ({} positions)",
            rope.spec.max_positions
        )));
    }
    let half = rope.spec.rotary_dim / 2;
    be.pool.install(|| {
        let (pos, cos, sin) = (&step.positions, &rope.cos, &rope.sin);
        ops::rope(
            &mut q[..t * num_heads * head_dim],
            pos,
            cos,
            sin,
            num_heads,
            head_dim,
            half,
        );
        ops::rope(
            &mut k[..t * num_kv_heads * head_dim],
            pos,
            cos,
            sin,
            num_kv_heads,
            head_dim,
            half,
        );
    });
    Ok(())
}

pub(super) fn write_kv(
    cache: &mut CpuKvCache,
    layer: usize,
    k: &Vec<f32>,
    v: &Vec<f32>,
    step: &StepInput,
) -> Result<(), BackendError> {
    let spec = cache.spec;
    if layer >= spec.num_layers {
        return Err(BackendError::InvalidArgument(format!(
            "layer {layer} of {}",
            spec.num_layers
        )));
    }
    if step.block_size != spec.block_size {
        return Err(BackendError::InvalidArgument(format!(
            "step block size {} ≠ cache block size {}",
            step.block_size, spec.block_size
        )));
    }
    let slots = spec.num_blocks * spec.block_size;
    if let Some(&s) = step.slot_mapping.iter().find(|&&s| s as usize >= slots) {
        return Err(BackendError::InvalidArgument(format!(
            "KV slot {s} of {slots}"
        )));
    }
    let n = step.num_tokens() * spec.slot_elems();
    check_len("write_kv k", k.len(), n)?;
    check_len("write_kv v", v.len(), n)?;
    cache.write(layer, &k[..n], &v[..n], &step.slot_mapping);
    Ok(())
}

pub(super) fn paged_attention(
    be: &CpuBackend,
    q: &Vec<f32>,
    cache: &CpuKvCache,
    layer: usize,
    step: &StepInput,
    params: &AttentionParams,
    out: &mut Vec<f32>,
) -> Result<(), BackendError> {
    let spec = cache.spec;
    params.check_fits(&spec, layer)?;
    if let Some(s) = step
        .seqs
        .iter()
        .find(|s| s.block_table.iter().any(|&b| b as usize >= spec.num_blocks))
    {
        return Err(BackendError::InvalidArgument(format!(
            "block table {:?} out of range",
            s.block_table
        )));
    }
    let n = step.num_tokens() * params.num_heads * params.head_dim;
    check_len("attention q", q.len(), n)?;
    check_len("attention output", out.len(), n)?;
    be.pool
        .install(|| attention::paged_attention(cache, layer, step, params, &q[..n], &mut out[..n]));
    Ok(())
}

#[allow(clippy::too_many_arguments)]
pub(super) fn qkv_rope_write(
    be: &CpuBackend,
    qkv: &Vec<f32>,
    q_out: &mut Vec<f32>,
    cache: &mut CpuKvCache,
    layer: usize,
    rope: &CpuRope,
    step: &StepInput,
    params: &AttentionParams,
    qk_norm: Option<(&Vec<f32>, &Vec<f32>, f32)>,
) -> Result<(), BackendError> {
    // The reference: the unfused ops on the split rows, so both paths agree bit for bit.
    let (t, hd) = (step.num_tokens(), params.head_dim);
    let (qd, kvd) = (params.num_heads * hd, params.num_kv_heads * hd);
    let width = qd + 2 * kvd;
    check_len("qkv_rope_write qkv", qkv.len(), t * width)?;
    check_len("qkv_rope_write q_out", q_out.len(), t * qd)?;
    // Reused split rows (every element is written below before it is read).
    let mut scratch = be.qkv_scratch.lock().unwrap_or_else(|e| e.into_inner());
    let [q, k, v, kn_out] = &mut *scratch;
    for (buf, n) in [(&mut *q, t * qd), (&mut *k, t * kvd), (&mut *v, t * kvd)] {
        buf.resize(n, 0.0);
    }
    for (r, row) in qkv[..t * width].chunks_exact(width).enumerate() {
        q[r * qd..(r + 1) * qd].copy_from_slice(&row[..qd]);
        k[r * kvd..(r + 1) * kvd].copy_from_slice(&row[qd..qd + kvd]);
        v[r * kvd..(r + 1) * kvd].copy_from_slice(&row[qd + kvd..]);
    }
    let k = match qk_norm {
        Some((qn, kn, eps)) => {
            be.rms_norm(q, qn, q_out, t * params.num_heads, hd, eps)?;
            kn_out.resize(t * kvd, 0.0);
            be.rms_norm(k, kn, kn_out, t * params.num_kv_heads, hd, eps)?;
            kn_out
        }
        None => {
            q_out[..t * qd].copy_from_slice(q);
            k
        }
    };
    be.rope(
        q_out,
        k,
        rope,
        step,
        params.num_heads,
        params.num_kv_heads,
        hd,
    )?;
    be.write_kv(cache, layer, k, v, step)
}
