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
//! This file holds the types; `trait_impl` the [`Backend`] impl, whose methods mostly forward to
//! a child module:
//! `init` ([`CudaBackend::new`]: kernels, cuBLAS, launch settings), `matmul` (the one dispatch of
//! a linear's product by weight format), `rowwise` (embedding, gathers, RMSNorm, SwiGLU and the
//! element-wise ops), `rope_kv` (RoPE and the KV-cache writes), `dtype` ([`ComputeDType`]),
//! `graph` (stream capture into CUDA graphs), `fused` (the fused decode-layer ops), `handles` (the typed kernel handles), `launch`
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
mod attention_decode;
mod attention_mma;
mod dense;
mod dense_gemm;
mod dense_rope;
pub(crate) use dense::MmaKernels;
pub use dense::{DenseMatmul, MmaKernel, DEFAULT_FUSED_DECODE_ROWS, MMA_SMALL_MAX_ROWS};
pub(crate) use dense_gemm::GemmKernels;
pub use dense_gemm::{GemmChoice, GemmTile, MmaOut, MmaProbeOut};
mod dtype;
mod fused;
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
mod trait_impl;
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
pub(crate) use w4a16::{w4_gemv_defines, w4_gemv_names};
pub use w4a16::{W4Kernel, GEMV_MAX_ROWS as W4_GEMV_MAX_ROWS, W4_GEMV_VARIANTS};

use handles::Kernels;

use super::device::CudaError;
use super::nvrtc::Arch;
use crate::backend::rope::RopeSpec;
use crate::backend::{Backend, BackendError, KvCacheSpec, StepInput};

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
    /// Which `mma` kernel takes 33–64-row steps (`KILN_DENSE_MID`; see `dense/options.rs`).
    mid: dense::MidRows,
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
