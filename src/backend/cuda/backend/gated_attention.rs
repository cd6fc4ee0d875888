//! The fused pre-attention kernel of Qwen3.5's gated attention on CUDA
//! (`kernels/gated_attention.cu`): [`HybridBackend::gated_qkv_rope_write`] in one launch instead
//! of the five of its unfused form ([`gated_qkv_rope_write_unfused`], the CPU twin), with the same
//! roundings. The sigmoid output gate is fused into the attention kernels' epilogue instead
//! (`HybridBackend::gated_paged_attention`; `CudaBackend::paged_attention_gated` in
//! `attention.rs`).
//!
//! [`gated_qkv_rope_write_unfused`]: crate::backend::hybrid::gated_qkv_rope_write_unfused
//! [`HybridBackend::gated_qkv_rope_write`]: crate::backend::hybrid::HybridBackend::gated_qkv_rope_write

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::{check_len, dev_err, CudaBackend, CudaKvCache, CudaRope, CudaStep};
use crate::backend::hybrid::{GatedQkv, GatedQkvOut};
use crate::backend::BackendError;

/// Threads per block (`GQ_WARPS * 32`).
const THREADS: u32 = 4 * 32;
/// Largest head the kernel's shared row holds (`GQ_MAX_DIM`).
const MAX_HEAD_DIM: usize = 256;

impl CudaBackend {
    /// The fused form of `gated_qkv_rope_write` (see the module docs).
    pub(super) fn gated_qkv_fused(
        &self,
        x: &GatedQkv<'_, CudaBackend>,
        rope: &CudaRope,
        cache: &mut CudaKvCache,
        layer: usize,
        step: &CudaStep,
        out: GatedQkvOut<'_, CudaBackend>,
    ) -> Result<(), BackendError> {
        let _t = self.prof.op(&self.stream, "gated_qkv_rope_write");
        let spec = cache.spec;
        let (t, nh, nkv, hd) = (x.tokens, x.num_heads, x.num_kv_heads, x.head_dim);
        if layer >= spec.num_layers || spec.num_kv_heads != nkv || spec.head_dim != hd {
            return Err(BackendError::InvalidArgument(format!(
                "gated_qkv_rope_write: layer {layer}, {nkv} KV heads of {hd} against the cache {spec:?}"
            )));
        }
        if t != step.num_tokens {
            return Err(BackendError::InvalidArgument(format!(
                "gated_qkv_rope_write: {t} tokens in a step of {}",
                step.num_tokens
            )));
        }
        check_len("gated_qkv_rope_write qg", x.qg.len, t * nh * 2 * hd)?;
        check_len("gated_qkv_rope_write k", x.k.len, t * nkv * hd)?;
        check_len("gated_qkv_rope_write v", x.v.len, t * nkv * hd)?;
        check_len("gated_qkv_rope_write q_norm", x.q_norm.len, hd)?;
        check_len("gated_qkv_rope_write k_norm", x.k_norm.len, hd)?;
        check_len("gated_qkv_rope_write q", out.q.len, t * nh * hd)?;
        check_len("gated_qkv_rope_write gate", out.gate.len, t * nh * hd)?;
        for (what, b) in [
            ("qg", x.qg),
            ("k", x.k),
            ("v", x.v),
            ("q_norm", x.q_norm),
            ("k_norm", x.k_norm),
            ("q", &*out.q),
            ("gate", &*out.gate),
        ] {
            self.expect_compute(&format!("gated_qkv_rope_write {what}"), b)?;
        }
        if hd > MAX_HEAD_DIM || rope.spec.rotary_dim > hd {
            return Err(BackendError::InvalidArgument(format!(
                "gated_qkv_rope_write: head_dim {hd} (at most {MAX_HEAD_DIM}), rotary_dim {}",
                rope.spec.rotary_dim
            )));
        }
        if step.max_context > rope.spec.max_positions {
            return Err(BackendError::InvalidArgument(format!(
                "position {} past the RoPE table ({})",
                step.max_context, rope.spec.max_positions
            )));
        }
        if t == 0 {
            return Ok(());
        }
        let positions = step.positions();
        let slots = step.slot_mapping();
        let (nhi, nkvi, hdi, half) = (
            nh as i32,
            nkv as i32,
            hd as i32,
            (rope.spec.rotary_dim / 2) as i32,
        );
        let (kc, vc) = (&mut cache.k[layer], &mut cache.v[layer]);
        let mut b = self.stream.launch_builder(&self.k.gated_qkv);
        b.arg(&x.qg.data)
            .arg(&x.k.data)
            .arg(&x.v.data)
            .arg(&mut out.q.data)
            .arg(&mut out.gate.data)
            .arg(kc)
            .arg(vc)
            .arg(&positions)
            .arg(&slots)
            .arg(&rope.cos)
            .arg(&rope.sin)
            .arg(&x.q_norm.data)
            .arg(&x.k_norm.data);
        b.arg(&nhi).arg(&nkvi).arg(&hdi).arg(&half).arg(&x.eps);
        // One warp per head: a token's q, k and v heads spread over ⌈heads / warps⌉ blocks
        // (the 27B's 24 + 4 + 4 heads: 8 blocks), not walked by one block's 4 warps in turn.
        let heads_per_token = nh + 2 * nkv;
        let cfg = LaunchConfig {
            grid_dim: (
                t as u32,
                heads_per_token.div_ceil(THREADS as usize / 32) as u32,
                1,
            ),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: qg holds t rows of heads × 2 head_dim, k/v t rows of kv_heads × head_dim, q and
        // gate t rows of heads × head_dim, the norms head_dim (all checked, compute dtype);
        // head_dim ≤ GQ_MAX_DIM; positions are below the RoPE table (checked via max_context);
        // slots come from the checked StepInput, so each indexes inside the layer's cache, whose
        // KV heads and head width are these (checked).
        unsafe { b.launch(cfg) }.map_err(dev_err)?;
        Ok(())
    }
}
