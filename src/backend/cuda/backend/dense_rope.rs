//! The q|k|v projection of the fused decode layer with RoPE and the KV-cache write in its
//! epilogue (`dense_mma_small_rg*_norm_rope_{t}_{c}`, dense.cu's NORM_ROPE mode): one kernel for
//! what `norm_matmul` + `qkv_rope_write` do in two, so a SmolLM2 decode step has 30 launches
//! fewer. Only for layers without per-head q/k norms (the fused decode layer's models), with full
//! rotary (`rotary_dim = head_dim`) and `head_dim / 2` a multiple of 8: the kernel maps each
//! 16-output tile to dims `8p .. 8p + 8` and `head_dim / 2 + 8p ..` of one head, so every lane
//! holds both values of a rotated pair. Any other shape (and f32 compute, no tensor cores, more
//! than [`MMA_SMALL_MAX_ROWS`] rows) takes the unfused pair, the trait's default.
//!
//! Numerics: each q|k|v output is the same dot product, in the same K order, as the NORM kernel's
//! (`norm_matmul`), rounded to the compute dtype; the rotation uses explicitly rounded products
//! as `qkv_rope_write` does, so q, k and v equal `norm_matmul` + `qkv_rope_write` bit for bit
//! (`tests/cuda_dense.rs`).

use std::ffi::c_void;

use cudarc::driver::{DevicePtr, DevicePtrMut, LaunchConfig};

use super::dense::{fitting_tile, slice_blocks, small_shared_bytes, MMA_SMALL_MAX_ROWS};
use super::{check_len, CudaBackend, CudaBuffer, CudaKvCache, CudaRope, CudaStep, CudaWeight};
use crate::backend::{AttentionParams, Backend, BackendError};

impl CudaBackend {
    /// Whether [`CudaBackend::mma_norm_rope_write`] takes this call (else the unfused pair runs).
    pub(super) fn norm_rope_takes(
        &self,
        w: &CudaWeight,
        rows: usize,
        rope: &CudaRope,
        params: &AttentionParams,
    ) -> bool {
        let hd = params.head_dim;
        self.k.dense_rope.is_some()
            && self.fused_takes(w)
            && !w.swiglu_rows
            && rows <= MMA_SMALL_MAX_ROWS
            && rows <= self.mid.norm_rows
            && rope.spec.rotary_dim == hd
            && hd.is_multiple_of(16)
            && w.n == (params.num_heads + 2 * params.num_kv_heads) * hd
    }

    /// `norm_matmul_rope_write` in one kernel: `x` the f32 residual `[rows, k]`, `norm` `[k]`,
    /// `w` the q|k|v weight `[(heads + 2 kv_heads) · head_dim, k]`, `q_out` `[rows, heads,
    /// head_dim]`, k / v into layer `layer` of `cache` at the step's slots. The caller checked
    /// [`CudaBackend::norm_rope_takes`].
    #[allow(clippy::too_many_arguments)]
    pub(super) fn mma_norm_rope_write(
        &self,
        x: &CudaBuffer,
        norm: &CudaBuffer,
        eps: f32,
        rows: usize,
        w: &CudaWeight,
        q_out: &mut CudaBuffer,
        cache: &mut CudaKvCache,
        layer: usize,
        rope: &CudaRope,
        step: &CudaStep,
        params: &AttentionParams,
    ) -> Result<(), BackendError> {
        let Some(fs) = self.k.dense_rope.as_ref() else {
            return Err(BackendError::Unsupported(
                "the fused q|k|v RoPE kernel needs a 16-bit compute dtype".into(),
            ));
        };
        let spec = cache.spec;
        params.check_fits(&spec, layer)?;
        let (hd, nh, nkv) = (params.head_dim, params.num_heads, params.num_kv_heads);
        if x.dtype != super::ComputeDType::F32 {
            return Err(super::mixed(
                "fused q|k|v rope input",
                x.dtype,
                super::ComputeDType::F32,
            ));
        }
        check_len("fused q|k|v rope tokens", step.num_tokens, rows)?;
        check_len("fused q|k|v rope input", x.len, rows * w.k)?;
        check_len("fused q|k|v rope norm weight", norm.len, w.k)?;
        check_len("fused q|k|v rope q_out", q_out.len, rows * nh * hd)?;
        check_len("fused q|k|v rope weight rows", w.n, (nh + 2 * nkv) * hd)?;
        self.expect_compute("fused q|k|v rope norm weight", norm)?;
        self.expect_compute("fused q|k|v rope q_out", q_out)?;
        if rope.spec.rotary_dim != hd || !hd.is_multiple_of(16) || !w.k.is_multiple_of(8) {
            return Err(BackendError::InvalidArgument(format!(
                "fused q|k|v rope: head_dim {hd} (a multiple of 16), rotary_dim {} (= head_dim), \
                 k {} (a multiple of 8)",
                rope.spec.rotary_dim, w.k
            )));
        }
        if step.max_context > rope.spec.max_positions {
            return Err(BackendError::InvalidArgument(format!(
                "position {} past the RoPE table ({})",
                step.max_context, rope.spec.max_positions
            )));
        }
        if rows == 0 {
            return Ok(());
        }
        let sb = slice_blocks(w.k);
        let slices = w.k.div_ceil(32).div_ceil(sb);
        let threads = 32 * slices;
        let rg = self.mid.row_groups(rows, w.n, slices, true);
        let Some((sf, rg, _)) = fitting_tile(rg, 1, threads, &|i| fs.get(i)) else {
            return Err(BackendError::Unsupported(format!(
                "no fused q|k|v rope tile takes a block of {threads} threads (k = {})",
                w.k
            )));
        };
        let f = &sf.f;
        let (xp, _s0) = x.data.device_ptr(&self.stream);
        let (np, _s1) = norm.data.device_ptr(&self.stream);
        let (qp, _s2) = q_out.data.device_ptr_mut(&self.stream);
        let (wp, _s3) = w.data.device_ptr(&self.stream);
        if !xp.is_multiple_of(16) || !np.is_multiple_of(16) || !wp.is_multiple_of(16) {
            return Err(BackendError::InvalidArgument(
                "fused q|k|v rope: input, norm or weight not 16-byte aligned".into(),
            ));
        }
        let positions = step.positions();
        let slots = step.slot_mapping();
        let (kc, vc) = (&mut cache.k[layer], &mut cache.v[layer]);
        let (kc_p, _s4) = kc.device_ptr_mut(&self.stream);
        let (vc_p, _s5) = vc.device_ptr_mut(&self.stream);
        let (pos_p, _s6) = positions.device_ptr(&self.stream);
        let (slot_p, _s7) = slots.device_ptr(&self.stream);
        let (cos_p, _s8) = rope.cos.device_ptr(&self.stream);
        let (sin_p, _s9) = rope.sin.device_ptr(&self.stream);
        let (m, n, k, sbi) = (rows as i32, w.n as i32, w.k as i32, sb as i32);
        let (nhi, nkvi, hdi, half) = (nh as i32, nkv as i32, hd as i32, (hd / 2) as i32);
        let mut p = [
            &xp as *const u64 as *mut c_void,
            &wp as *const u64 as *mut c_void,
            &qp as *const u64 as *mut c_void,
            &m as *const i32 as *mut c_void,
            &n as *const i32 as *mut c_void,
            &k as *const i32 as *mut c_void,
            &sbi as *const i32 as *mut c_void,
            &np as *const u64 as *mut c_void,
            &eps as *const f32 as *mut c_void,
            &kc_p as *const u64 as *mut c_void,
            &vc_p as *const u64 as *mut c_void,
            &pos_p as *const u64 as *mut c_void,
            &slot_p as *const u64 as *mut c_void,
            &cos_p as *const u64 as *mut c_void,
            &sin_p as *const u64 as *mut c_void,
            &nhi as *const i32 as *mut c_void,
            &nkvi as *const i32 as *mut c_void,
            &hdi as *const i32 as *mut c_void,
            &half as *const i32 as *mut c_void,
        ];
        let cfg = LaunchConfig {
            // One block per 16 outputs (n / 16 tiles: head_dim is a multiple of 16) and 8·rg rows.
            grid_dim: ((w.n / 16) as u32, (rows as u32).div_ceil(8 * rg as u32), 1),
            block_dim: (threads as u32, 1, 1),
            shared_mem_bytes: small_shared_bytes(slices, rg) as u32,
        };
        // SAFETY: the parameters match the NORM_ROPE entry point's (x, w, q_out, m, n, k, sb, nw,
        // eps, kc, vc, positions, slots, cos, sin, n_heads, n_kv_heads, head_dim, rot_half)
        // signature, in order, and outlive the call (the sync guards keep every buffer in use on
        // this stream); x holds rows × k f32, norm k, w n × k and q_out rows × heads × head_dim
        // elements (checked); the kernel reads rows < m only, positions below the RoPE table
        // (checked via max_context) and slots from ForwardBatch::step_input (each inside the
        // layer's cache, or -1: skipped); the tiles map to weight rows < n (n = heads · head_dim,
        // head_dim / 2 a multiple of 8); the cache type is the backend's own (the handles were
        // resolved for it); shared memory is exactly slices × rg × 128 floats (≤ 64 KiB, what the rg8
        // functions are allowed at load; ≤ 32 KiB for the others). The
        // kernel waits (griddepcontrol) before touching activations, so it may use PDL.
        unsafe { self.launch_kernel(f, cfg, &mut p, self.pdl) }
    }
}

/// The trait method: the fused kernel where it applies, else the unfused pair.
#[allow(clippy::too_many_arguments)]
pub(super) fn norm_matmul_rope_write(
    b: &CudaBackend,
    x: &CudaBuffer,
    weight: &CudaBuffer,
    eps: f32,
    rows: usize,
    dim: usize,
    w: &CudaWeight,
    h: &mut CudaBuffer,
    qkv: &mut CudaBuffer,
    q_out: &mut CudaBuffer,
    cache: &mut CudaKvCache,
    layer: usize,
    rope: &CudaRope,
    step: &CudaStep,
    params: &AttentionParams,
) -> Result<(), BackendError> {
    if !b.norm_rope_takes(w, rows, rope, params) {
        b.norm_matmul(x, weight, eps, rows, dim, w, h, qkv)?;
        return b.qkv_rope_write(qkv, q_out, cache, layer, rope, step, params, None);
    }
    check_len("norm_matmul_rope_write dim", w.k, dim)?;
    let _t = b.prof.op(&b.stream, "norm_matmul_rope_write");
    b.mma_norm_rope_write(
        x, weight, eps, rows, w, q_out, cache, layer, rope, step, params,
    )
}
