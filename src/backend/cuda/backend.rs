//! [`CudaBackend`]: the [`Backend`] trait on one NVIDIA GPU.
//!
//! Activations live in the compute dtype (bf16 on sm_80+, fp16 on sm_70/sm_75, or f32 for
//! parity tests) as untyped device bytes; every kernel variant `{op}_{dtype}` the backend launches
//! is resolved once, at creation, into a typed handle ([`handles::Kernels`]). Dense weights are
//! dequantized to the compute dtype at load (GGUF K-quants and other encodings on the host) and
//! multiplied with cuBLAS (f32 accumulation) or the batch-invariant kernels of `dense`; packed
//! int4 and GGUF Q4/Q8 linears stay quantized on the device and run through the fused kernels of
//! `w4a16` / `gguf`. The KV cache is stored in the compute dtype or fp8 (e5m2 / e4m3). All work is queued on one stream; a step's
//! integer metadata is packed into one buffer and copied from pinned host memory in one copy
//! (`step`, `staging`); scratch the ops need (split-K partials, sampler buffers) is kept by
//! the backend and reused, so a step allocates nothing once it has run at its largest size.
//!
//! This file holds the types and the [`Backend`] impl; most methods forward to a child module:
//! `init` ([`CudaBackend::new`]: kernels, cuBLAS, launch settings), `matmul` (the one dispatch of
//! a linear's product by weight format), `rowwise` (embedding, gathers, RMSNorm, SwiGLU and the
//! element-wise ops), `rope_kv` (RoPE and the KV-cache writes), `dtype` ([`ComputeDType`]),
//! `graph` (stream capture into CUDA graphs), `handles` (the typed kernel handles), `launch`
//! (launch arguments, PDL), `step` ([`CudaStep`]), `staging` (pinned host → device buffers),
//! `load` (host data and stored tensors onto the device), `attention` / `attention_mma` (the tiled
//! prefill, split-K and tensor-core decode launches), `dense*` / `norm_1p` (the batch-invariant
//! dense kernels and the fused decode layer), `w4a16` / `gguf` (quantized weights kept
//! quantized), `sampling` (f32 logits and the GPU sampler, with its greedy fast path), `gdn` /
//! `gdn_chunk` / `gated_attention` (the hybrid models' state slots and ops:
//! [`crate::backend::hybrid::HybridBackend`]), `profile` (`KILN_PROFILE_OPS`).

use std::sync::{Arc, Mutex};

use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream};

use super::attention_plan::PrefillVariant;

mod attention;
mod attention_mma;
mod dense;
mod dense_rope;
pub(crate) use dense::MmaKernels;
pub use dense::{DenseMatmul, MmaKernel, DEFAULT_FUSED_DECODE_ROWS, MMA_SMALL_MAX_ROWS};
mod dtype;
mod gated_attention;
mod gdn;
mod gdn_chunk;
mod gguf;
mod graph;
mod handles;
mod init;
mod launch;
mod load;
mod matmul;
mod norm_1p;
mod profile;
mod rope_kv;
mod rowwise;
mod sampling;
mod staging;
mod step;
mod w4a16;

pub use attention::OutputGate;
pub(crate) use attention_mma::DecodeMmaKernels;
pub use attention_mma::{
    decode_mma_combine_name, decode_mma_geometry, decode_mma_name, decode_mma_stage_budget,
    DECODE_MMA_DIMS,
};
pub use dtype::ComputeDType;
pub use gdn::{CudaStateCache, GDN_OPS};
pub use gdn_chunk::{DEFAULT_CHUNKED_MIN_LEN, GDN_CHUNK_OPS};
pub use gguf::{GgufKernel, GEMV_MAX_ROWS as GGUF_GEMV_MAX_ROWS};
pub use init::CUBLAS_WORKSPACE_BYTES;
pub use sampling::{CudaLogits, CudaPendingSamples};
pub use step::CudaStep;
pub use w4a16::{W4Kernel, GEMV_MAX_ROWS as W4_GEMV_MAX_ROWS};

use handles::Kernels;

use super::device::CudaError;
use super::nvrtc::Arch;
use crate::backend::rope::{cos_sin_table, RopeSpec};
use crate::backend::{
    AttentionParams, Backend, BackendError, KvCacheSpec, PinnedShape, StepGraph, StepInput,
};
use crate::sampling::{SampleError, Sampled, SamplingRow};
use crate::tensor::TensorView;

/// How the KV cache is stored (shared with the CPU backend, which rounds the same way).
pub use crate::backend::KvCacheDType as KvStorage;

/// Resolve `engine.kv_cache_dtype`.
fn resolve_kv(setting: &str) -> Result<KvStorage, CudaError> {
    KvStorage::parse(setting)
        .ok_or_else(|| CudaError::Nvrtc(format!("unknown engine.kv_cache_dtype `{setting}`")))
}

/// A device buffer of `len` elements of `dtype`: the compute dtype, or f32 for the residual
/// stream ([`Backend::alloc_f32`]).
#[derive(Debug)]
pub struct CudaBuffer {
    data: CudaSlice<u8>,
    len: usize,
    dtype: ComputeDType,
}

/// A weight `[n, k]` in the compute dtype, or a packed 4-bit one (`data` its tile words).
#[derive(Debug)]
pub struct CudaWeight {
    data: CudaSlice<u8>,
    n: usize,
    k: usize,
    /// The other parts of a packed 4-bit weight (`w4a16`); `None` for a dense one.
    packed: Option<Box<w4a16::CudaPackedParts>>,
    /// The other parts of a GGUF weight kept quantized (`gguf`); `None` for any other.
    gguf: Option<Box<gguf::CudaGgufParts>>,
    /// A gate|up weight with its rows interleaved in 8-row chunks for the SwiGLU epilogue of
    /// the `mma` kernels (`dense.rs`): only [`Backend::gate_up_swiglu`] takes it.
    swiglu_rows: bool,
}

/// K and V of every layer, `[num_blocks, block_size, num_kv_heads, head_dim]` each.
#[derive(Debug)]
pub struct CudaKvCache {
    spec: KvCacheSpec,
    k: Vec<CudaSlice<u8>>,
    v: Vec<CudaSlice<u8>>,
}

/// The RoPE table on the device, `[max_positions, rotary_dim / 2]` f32 each.
#[derive(Debug)]
pub struct CudaRope {
    spec: RopeSpec,
    cos: CudaSlice<f32>,
    sin: CudaSlice<f32>,
}

/// The CUDA backend on one device.
pub struct CudaBackend {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    /// cuBLAS's workspace (set on `blas`; declared after it, so dropped after it).
    _blas_workspace: CudaSlice<u8>,
    /// Per-op CUDA-event timing (`KILN_PROFILE_OPS=1`), see `profile`.
    prof: Arc<profile::Profiler>,
    k: Kernels,
    /// Reused scratch of the ops (see [`Scratch`]).
    scratch: Mutex<Scratch>,
    /// The kernel of the dense 16-bit matmuls: cuBLAS or a batch-invariant one
    /// (`KILN_DENSE_MATMUL`; see `dense.rs`).
    dense: dense::DenseMatmul,
    /// Largest step whose llama layers take the fused decode ops (`KILN_FUSED_DECODE_ROWS`;
    /// 0 where there are no tensor-core kernels; see `dense.rs`).
    fused_rows: usize,
    /// Launch the small `mma` kernels with programmatic dependent launch (`KILN_PDL`, sm_90+
    /// kernels only; see `launch.rs`).
    pdl: bool,
    /// With `pdl`, also the packed GEMVs and the Qwen3.5 norm / GDN kernels and `silu_mul`
    /// (`KILN_PDL_PACKED`; see `w4a16.rs`).
    pdl_packed: bool,
    /// The fast packed GEMVs trigger the next launch after their main loop rather than first
    /// (`KILN_PDL_GEMV_TRIGGER`; see `w4a16.rs`).
    w4_trigger_late: bool,
    arch: Arch,
    dtype: ComputeDType,
    kv: KvStorage,
    device_name: String,
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        // The per-op tables of a `KILN_PROFILE_OPS=1` run, on stdout beside the bench's own.
        if let Some(report) = self.prof.report() {
            println!("{report}");
        }
    }
}

/// Decode rows of a step for the profiler: its sequences when each adds one token, else 0.
fn profile_rows(step: &StepInput) -> usize {
    if !step.seqs.is_empty() && step.seqs.iter().all(|s| s.len == 1) {
        step.seqs.len()
    } else {
        0
    }
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

/// Device scratch the backend reuses across ops and steps; grown when an op needs more than any
/// before it, never shrunk. All of it is only touched by work on the backend's one stream. (The
/// split-K attention partials belong to each [`CudaStep`], so a graph's never move.)
#[derive(Debug, Default)]
struct Scratch {
    /// The sampler's buffers.
    sample: Option<sampling::SampleArena>,
    /// The pinned ring the sampler's answers are copied into, and the slot the next one takes.
    outs: Vec<sampling::OutSlot>,
    next_out: usize,
    /// `(token, output index)` pairs of the tokens fed to a step from the previous one's ids.
    feed: Option<staging::Staging<i32>>,
    /// Free device bytes when the current graph capture began (`graph::begin`).
    free_before_capture: usize,
}

fn dev_err(e: impl Into<CudaError>) -> BackendError {
    let e = e.into();
    if e.is_oom() {
        BackendError::OutOfMemory(e.to_string())
    } else {
        BackendError::Device(e.to_string())
    }
}

impl CudaBackend {
    /// The compute dtype.
    pub fn dtype(&self) -> ComputeDType {
        self.dtype
    }

    /// The architecture the kernels were compiled for.
    pub fn arch(&self) -> Arch {
        self.arch
    }

    /// (free, total) device memory in bytes.
    pub fn memory_info(&self) -> Result<(usize, usize), BackendError> {
        self.ctx.mem_get_info().map_err(dev_err)
    }

    /// The reused scratch, locked (a poisoned lock only means a panic elsewhere mid-op: the
    /// buffers themselves are still valid).
    fn scratch(&self) -> std::sync::MutexGuard<'_, Scratch> {
        self.scratch.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn alloc_bytes(&self, bytes: usize) -> Result<CudaSlice<u8>, BackendError> {
        self.stream.alloc_zeros::<u8>(bytes.max(1)).map_err(dev_err)
    }
}

/// A buffer of dtype `got` where `want` (the compute dtype) is needed.
fn mixed(what: &str, got: ComputeDType, want: ComputeDType) -> BackendError {
    BackendError::InvalidArgument(format!(
        "{what}: an {} buffer where {} is needed",
        got.suffix(),
        want.suffix()
    ))
}

fn check_len(what: &str, have: usize, need: usize) -> Result<(), BackendError> {
    if have < need {
        return Err(BackendError::InvalidArgument(format!(
            "{what}: buffer of {have} elements, {need} needed"
        )));
    }
    Ok(())
}

impl Backend for CudaBackend {
    type Buffer = CudaBuffer;
    type Weight = CudaWeight;
    type KvCache = CudaKvCache;
    type Rope = CudaRope;
    type Step = CudaStep;
    type Logits = CudaLogits;
    type PendingSamples = CudaPendingSamples;

    fn name(&self) -> String {
        self.device_name.clone()
    }

    fn alloc(&self, len: usize) -> Result<CudaBuffer, BackendError> {
        Ok(CudaBuffer {
            data: self.alloc_bytes(len * self.dtype.size())?,
            len,
            dtype: self.dtype,
        })
    }

    fn alloc_f32(&self, len: usize) -> Result<CudaBuffer, BackendError> {
        Ok(CudaBuffer {
            data: self.alloc_bytes(len * 4)?,
            len,
            dtype: ComputeDType::F32,
        })
    }

    fn upload(&self, data: &[f32]) -> Result<CudaBuffer, BackendError> {
        Ok(CudaBuffer {
            data: self.upload_host_f32(data)?,
            len: data.len(),
            dtype: self.dtype,
        })
    }

    fn download(&self, src: &CudaBuffer, dst: &mut [f32]) -> Result<(), BackendError> {
        if dst.len() != src.len {
            return Err(BackendError::InvalidArgument(format!(
                "download of {} elements into {}",
                src.len,
                dst.len()
            )));
        }
        if dst.is_empty() {
            return Ok(());
        }
        match src.dtype {
            ComputeDType::F32 => {
                let bytes: &mut [u8] = bytemuck::cast_slice_mut(dst);
                self.stream.memcpy_dtoh(&src.data, bytes).map_err(dev_err)?;
            }
            dt => {
                let mut host = vec![0u16; src.len];
                self.stream
                    .memcpy_dtoh(&src.data, bytemuck::cast_slice_mut::<u16, u8>(&mut host))
                    .map_err(dev_err)?;
                for (d, h) in dst.iter_mut().zip(host) {
                    *d = if dt == ComputeDType::F16 {
                        half::f16::from_bits(h).to_f32()
                    } else {
                        half::bf16::from_bits(h).to_f32()
                    };
                }
            }
        }
        self.stream.synchronize().map_err(dev_err)
    }

    fn weight_bytes(&self, w: &CudaWeight) -> usize {
        w.data.len()
            + w.packed.as_ref().map_or(0, |p| p.bytes())
            + w.gguf.as_ref().map_or(0, |p| p.bytes())
    }

    fn upload_linear(
        &self,
        name: &str,
        linear: &crate::tensor::LinearView<'_>,
    ) -> Result<CudaWeight, BackendError> {
        match linear {
            crate::tensor::LinearView::Dense(view) => self.upload_weight(name, view),
            crate::tensor::LinearView::Packed(p) => self.upload_packed(name, p),
        }
    }

    fn upload_weight(&self, name: &str, view: &TensorView<'_>) -> Result<CudaWeight, BackendError> {
        let &[n, k] = view.shape else {
            return Err(BackendError::InvalidArgument(format!(
                "`{name}`: expected a 2-D weight, found shape {:?}",
                view.shape
            )));
        };
        if let Some(w) = self.upload_gguf(name, view)? {
            return Ok(w);
        }
        Ok(CudaWeight {
            data: self.dequantize_to_device(name, view)?,
            n,
            k,
            packed: None,
            gguf: None,
            swiglu_rows: false,
        })
    }

    fn upload_gate_up(
        &self,
        name: &str,
        parts: &[TensorView<'_>; 2],
    ) -> Result<CudaWeight, BackendError> {
        let w = self.upload_weight_rows(name, parts)?;
        self.interleave_gate_up(w)
    }

    fn gate_up_swiglu(
        &self,
        x: &CudaBuffer,
        rows: usize,
        w: &CudaWeight,
        scratch: &mut CudaBuffer,
        out: &mut CudaBuffer,
        inter: usize,
    ) -> Result<(), BackendError> {
        if !w.swiglu_rows {
            self.matmul(x, rows, w, scratch)?;
            return self.swiglu(scratch, out, rows, inter);
        }
        if self.dense == dense::DenseMatmul::Mma {
            let _t = self.prof.op(&self.stream, "matmul_swiglu");
            return self.mma_swiglu(x, rows, w, out, inter);
        }
        // Interleaved for the fused decode ops, multiplied here by cuBLAS: the interleaved
        // product, then the SwiGLU that reads that layout.
        self.interleaved_gate_up_swiglu(x, rows, w, scratch, out, inter)
    }

    fn fused_decode_rows(&self, ws: &[&CudaWeight]) -> usize {
        if ws.iter().all(|w| self.fused_takes(w)) {
            self.fused_rows
        } else {
            0
        }
    }

    fn norm_matmul(
        &self,
        x: &CudaBuffer,
        weight: &CudaBuffer,
        eps: f32,
        rows: usize,
        dim: usize,
        w: &CudaWeight,
        h: &mut CudaBuffer,
        out: &mut CudaBuffer,
    ) -> Result<(), BackendError> {
        if !self.fused_takes(w) || w.swiglu_rows || rows > MMA_SMALL_MAX_ROWS {
            self.rms_norm(x, weight, h, rows, dim, eps)?;
            return self.matmul(h, rows, w, out);
        }
        check_len("norm_matmul dim", w.k, dim)?;
        let _t = self.prof.op(&self.stream, "norm_matmul");
        self.mma_norm_matmul(x, weight, eps, rows, w, out, false)
    }

    fn norm_matmul_rope_write(
        &self,
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
        dense_rope::norm_matmul_rope_write(
            self, x, weight, eps, rows, dim, w, h, qkv, q_out, cache, layer, rope, step, params,
        )
    }

    fn norm_gate_up_swiglu(
        &self,
        x: &CudaBuffer,
        weight: &CudaBuffer,
        eps: f32,
        rows: usize,
        dim: usize,
        w: &CudaWeight,
        h: &mut CudaBuffer,
        scratch: &mut CudaBuffer,
        out: &mut CudaBuffer,
        inter: usize,
    ) -> Result<(), BackendError> {
        if !self.fused_takes(w) || !w.swiglu_rows || rows > MMA_SMALL_MAX_ROWS {
            self.rms_norm(x, weight, h, rows, dim, eps)?;
            return self.gate_up_swiglu(h, rows, w, scratch, out, inter);
        }
        check_len("norm_gate_up_swiglu dim", w.k, dim)?;
        check_len("norm_gate_up_swiglu inter", w.n, 2 * inter)?;
        let _t = self.prof.op(&self.stream, "norm_matmul_swiglu");
        self.mma_norm_matmul(x, weight, eps, rows, w, out, true)
    }

    fn matmul_residual(
        &self,
        x: &CudaBuffer,
        rows: usize,
        w: &CudaWeight,
        delta: &mut CudaBuffer,
        residual: &mut CudaBuffer,
        n: usize,
    ) -> Result<(), BackendError> {
        let _ = delta;
        check_len("matmul_residual n", w.n, n)?;
        if !self.fused_takes(w) || w.swiglu_rows || rows > MMA_SMALL_MAX_ROWS {
            return Err(BackendError::Unsupported(format!(
                "matmul_residual on this weight or {rows} rows (see fused_decode_rows)"
            )));
        }
        let _t = self.prof.op(&self.stream, "matmul_residual");
        self.mma_matmul_residual(x, rows, w, residual)
    }

    fn upload_vector(&self, name: &str, view: &TensorView<'_>) -> Result<CudaBuffer, BackendError> {
        let &[n] = view.shape else {
            return Err(BackendError::InvalidArgument(format!(
                "`{name}`: expected a 1-D tensor, found shape {:?}",
                view.shape
            )));
        };
        Ok(CudaBuffer {
            data: self.dequantize_to_device(name, view)?,
            len: n,
            dtype: self.dtype,
        })
    }

    fn create_kv_cache(&self, spec: &KvCacheSpec) -> Result<CudaKvCache, BackendError> {
        let per_layer =
            spec.num_blocks * spec.block_size * spec.slot_elems() * self.kv_elem_bytes();
        let mut k = Vec::with_capacity(spec.num_layers);
        let mut v = Vec::with_capacity(spec.num_layers);
        for _ in 0..spec.num_layers {
            k.push(self.alloc_bytes(per_layer)?);
            v.push(self.alloc_bytes(per_layer)?);
        }
        Ok(CudaKvCache { spec: *spec, k, v })
    }

    fn kv_bytes_per_block(&self, spec: &KvCacheSpec) -> usize {
        spec.bytes_per_block(self.kv_elem_bytes())
    }

    fn create_rope(&self, spec: &RopeSpec) -> Result<CudaRope, BackendError> {
        let (cos, sin) = cos_sin_table(spec);
        Ok(CudaRope {
            spec: *spec,
            cos: self.stream.clone_htod(&cos).map_err(dev_err)?,
            sin: self.stream.clone_htod(&sin).map_err(dev_err)?,
        })
    }

    fn prepare_step(&self, step: &StepInput) -> Result<CudaStep, BackendError> {
        let mut st = CudaStep::with_capacity(&self.stream, CudaStep::len_for(step))?;
        st.fill(&self.stream, step)?;
        self.prof.note_step(profile_rows(step));
        Ok(st)
    }

    fn update_step(&self, st: &mut CudaStep, step: &StepInput) -> Result<(), BackendError> {
        st.fill(&self.stream, step)?;
        st.pinned_context = 0;
        self.prof.note_step(profile_rows(step));
        Ok(())
    }

    fn update_step_pinned(
        &self,
        st: &mut CudaStep,
        step: &StepInput,
        shape: &PinnedShape,
    ) -> Result<(), BackendError> {
        st.fill(&self.stream, step)?;
        if st.max_context > shape.max_context {
            return Err(BackendError::InvalidArgument(format!(
                "a step of context {} pinned to {}",
                st.max_context, shape.max_context
            )));
        }
        st.pinned_context = shape.max_context;
        self.prof.note_step(profile_rows(step));
        Ok(())
    }

    fn supports_graphs(&self) -> bool {
        true
    }

    fn begin_capture(&self) -> Result<(), BackendError> {
        graph::begin(self)?;
        self.prof.set_capturing(true);
        Ok(())
    }

    fn end_capture(&self) -> Result<Box<dyn StepGraph>, BackendError> {
        self.prof.set_capturing(false);
        graph::end(self)
    }

    fn synchronize(&self) -> Result<(), BackendError> {
        self.stream.synchronize().map_err(dev_err)
    }

    fn run_step<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        // cudarc binds the context before each call it makes; binding here as well keeps raw
        // driver calls made inside `f` on this device.
        if let Err(e) = self.ctx.bind_to_thread() {
            tracing::warn!(error = ?e, "Could not bind the CUDA context to the engine thread.");
        }
        if !self.prof.on() {
            return f();
        }
        self.prof.begin_step(&self.stream, &self.k.gpu_sleep);
        let r = f();
        self.prof.end_step(&self.stream);
        r
    }

    fn embedding(
        &self,
        table: &CudaWeight,
        step: &CudaStep,
        out: &mut CudaBuffer,
    ) -> Result<(), BackendError> {
        rowwise::embedding(self, table, step, out)
    }

    fn rms_norm(
        &self,
        x: &CudaBuffer,
        weight: &CudaBuffer,
        out: &mut CudaBuffer,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<(), BackendError> {
        rowwise::rms_norm(self, x, weight, out, rows, dim, eps)
    }

    fn add_rms_norm(
        &self,
        residual: &mut CudaBuffer,
        delta: &CudaBuffer,
        weight: &CudaBuffer,
        out: &mut CudaBuffer,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<(), BackendError> {
        rowwise::add_rms_norm(self, residual, delta, weight, out, rows, dim, eps)
    }

    fn matmul(
        &self,
        x: &CudaBuffer,
        rows: usize,
        w: &CudaWeight,
        out: &mut CudaBuffer,
    ) -> Result<(), BackendError> {
        let _t = self.prof.op(&self.stream, "matmul");
        if w.swiglu_rows {
            return Err(BackendError::InvalidArgument(
                "a gate|up weight from upload_gate_up is for gate_up_swiglu only".into(),
            ));
        }
        self.matmul_checked(["matmul input", "matmul output"], x, rows, w, out)
    }

    fn rope(
        &self,
        q: &mut CudaBuffer,
        k: &mut CudaBuffer,
        rope: &CudaRope,
        step: &CudaStep,
        num_heads: usize,
        num_kv_heads: usize,
        head_dim: usize,
    ) -> Result<(), BackendError> {
        rope_kv::rope(self, q, k, rope, step, num_heads, num_kv_heads, head_dim)
    }

    fn write_kv(
        &self,
        cache: &mut CudaKvCache,
        layer: usize,
        k: &CudaBuffer,
        v: &CudaBuffer,
        step: &CudaStep,
    ) -> Result<(), BackendError> {
        rope_kv::write_kv(self, cache, layer, k, v, step)
    }

    fn paged_attention(
        &self,
        q: &CudaBuffer,
        cache: &CudaKvCache,
        layer: usize,
        step: &CudaStep,
        params: &AttentionParams,
        out: &mut CudaBuffer,
    ) -> Result<(), BackendError> {
        let _t = self.prof.op(&self.stream, "paged_attention");
        self.check_attention(q, cache, layer, step, params, out)?;
        if step.num_tokens == 0 {
            return Ok(());
        }
        let variant = PrefillVariant::for_head_dim(params.head_dim);
        let Some(variant) = variant.filter(|_| step.prefill_tiles > 0) else {
            // Decode only, or a head_dim the tiled kernel lacks: split-K over every token.
            return self.launch_split_k(q, cache, layer, step, params, out, None, false, None);
        };
        self.launch_prefill(variant, q, cache, layer, step, params, out, None)?;
        if step.split_tokens > 0 {
            let index = step.split_index();
            self.launch_split_k(
                q,
                cache,
                layer,
                step,
                params,
                out,
                Some(&index),
                false,
                None,
            )?;
        }
        Ok(())
    }

    fn silu_mul(
        &self,
        gate: &CudaBuffer,
        up: &CudaBuffer,
        out: &mut CudaBuffer,
        len: usize,
    ) -> Result<(), BackendError> {
        rowwise::silu_mul(self, gate, up, out, len)
    }

    fn add(&self, x: &mut CudaBuffer, y: &CudaBuffer, len: usize) -> Result<(), BackendError> {
        rowwise::add(self, x, y, len)
    }

    fn gather_rows(
        &self,
        x: &CudaBuffer,
        step: &CudaStep,
        dim: usize,
        out: &mut CudaBuffer,
    ) -> Result<(), BackendError> {
        rowwise::gather_rows(self, x, step, dim, out)
    }

    fn logits(
        &self,
        x: &CudaBuffer,
        rows: usize,
        w: &CudaWeight,
    ) -> Result<CudaLogits, BackendError> {
        let mut out = self.alloc_logits_rows(rows, w.n)?;
        self.logits_f32_into(x, rows, w, &mut out)?;
        Ok(out)
    }

    fn alloc_logits(&self, rows: usize, vocab: usize) -> Result<CudaLogits, BackendError> {
        self.alloc_logits_rows(rows, vocab)
    }

    fn logits_into(
        &self,
        x: &CudaBuffer,
        rows: usize,
        w: &CudaWeight,
        out: &mut CudaLogits,
    ) -> Result<(), BackendError> {
        let _t = self.prof.op(&self.stream, "logits_into");
        self.logits_f32_into(x, rows, w, out)
    }

    fn qkv_rope_write(
        &self,
        qkv: &CudaBuffer,
        q_out: &mut CudaBuffer,
        cache: &mut CudaKvCache,
        layer: usize,
        rope: &CudaRope,
        step: &CudaStep,
        params: &AttentionParams,
        qk_norm: Option<(&CudaBuffer, &CudaBuffer, f32)>,
    ) -> Result<(), BackendError> {
        rope_kv::qkv_rope_write(self, qkv, q_out, cache, layer, rope, step, params, qk_norm)
    }

    fn swiglu(
        &self,
        gate_up: &CudaBuffer,
        out: &mut CudaBuffer,
        rows: usize,
        inter: usize,
    ) -> Result<(), BackendError> {
        rowwise::swiglu(self, gate_up, out, rows, inter)
    }

    fn download_logits(
        &self,
        logits: &CudaLogits,
        first_row: usize,
        dst: &mut [f32],
    ) -> Result<(), BackendError> {
        let _t = self.prof.op(&self.stream, "download_logits");
        self.download_logits_rows(logits, first_row, dst)
    }

    fn sample(
        &self,
        logits: &CudaLogits,
        rows: &[(usize, &SamplingRow)],
    ) -> Result<Vec<Result<Sampled, SampleError>>, BackendError> {
        let _t = self.prof.op(&self.stream, "sample");
        self.sample_rows(logits, rows)
    }

    fn sample_submit(
        &self,
        logits: &CudaLogits,
        rows: &[(usize, &SamplingRow)],
    ) -> Result<CudaPendingSamples, BackendError> {
        let _t = self.prof.op(&self.stream, "sample");
        self.queue_sample(logits, rows)
    }

    fn sample_collect(
        &self,
        pending: CudaPendingSamples,
    ) -> Result<Vec<Result<Sampled, SampleError>>, BackendError> {
        self.collect_sample(pending)
    }

    fn queues_steps(&self) -> bool {
        true
    }

    fn feed_tokens(
        &self,
        step: &mut CudaStep,
        from: &CudaPendingSamples,
        feeds: &[(u32, u32)],
    ) -> Result<(), BackendError> {
        let _t = self.prof.op(&self.stream, "feed_tokens");
        self.feed_step_tokens(step, from, feeds)
    }

    fn copy_block(&self, cache: &mut CudaKvCache, src: u32, dst: u32) -> Result<(), BackendError> {
        rope_kv::copy_block(self, cache, src, dst)
    }
}

impl CudaBackend {
    fn kv_elem_bytes(&self) -> usize {
        match self.kv {
            KvStorage::Same => self.dtype.size(),
            KvStorage::E5M2 | KvStorage::E4M3 => 1,
        }
    }

    /// The variant of a kernel for a buffer of dtype `got` (named `what` in the error): `same` for
    /// the compute dtype, `f32` (the f32-side variant, where the backend has one) for f32, else
    /// `Err(InvalidArgument)`.
    fn for_dtype<'k>(
        &self,
        what: &str,
        got: ComputeDType,
        same: &'k CudaFunction,
        f32: Option<&'k CudaFunction>,
    ) -> Result<&'k CudaFunction, BackendError> {
        match (got, f32) {
            (d, _) if d == self.dtype => Ok(same),
            (ComputeDType::F32, Some(f)) => Ok(f),
            (d, _) => Err(mixed(what, d, self.dtype)),
        }
    }

    /// `Err(InvalidArgument)` unless `b` holds the compute dtype.
    fn expect_compute(&self, what: &str, b: &CudaBuffer) -> Result<(), BackendError> {
        if b.dtype == self.dtype {
            Ok(())
        } else {
            Err(mixed(what, b.dtype, self.dtype))
        }
    }
}
