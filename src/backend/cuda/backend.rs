//! [`CudaBackend`]: the [`Backend`] trait on one NVIDIA GPU.
//!
//! Activations live in the compute dtype (bf16 on sm_80+, fp16 on sm_70/sm_75, or f32 for
//! parity tests) as untyped device bytes; every kernel variant `{op}_{dtype}` the backend launches
//! is resolved once, at creation, into a typed handle ([`handles::Kernels`]). Weights are dequantized to the compute dtype at load (GGUF Q8_0/Q4_0/Q4_1 on the GPU,
//! other encodings on the host) and multiplied with cuBLAS (f32 accumulation); packed int4
//! linears stay 4-bit on the device and run through the fused kernels of `w4a16`. The KV cache is
//! stored in the compute dtype or fp8 (e5m2 / e4m3). All work is queued on one stream; a step's
//! integer metadata is packed into one buffer and copied from pinned host memory in one copy
//! (`step`, `staging`); scratch the ops need (split-K partials, sampler buffers) is kept by
//! the backend and reused, so a step allocates nothing once it has run at its largest size.
//!
//! Child modules: `dtype` ([`ComputeDType`]), `graph` (stream capture into CUDA graphs), `handles` (the typed kernel handles), `step`
//! ([`CudaStep`]), `staging` (pinned host → device buffers), `load` (host data and stored
//! tensors onto the device), `attention` (the tiled prefill and split-K launches), `sampling`
//! (f32 logits and the GPU sampler, with its greedy fast path), `gdn` (the hybrid models' state
//! slots and Gated DeltaNet ops: [`crate::backend::hybrid::HybridBackend`]).

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use cudarc::cublas::sys as cublas_sys;
use cudarc::cublas::CudaBlas;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, CudaView, DevicePtr, DevicePtrMut,
    LaunchConfig, PushKernelArg,
};

use super::attention_plan::{self, PrefillVariant};

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
mod launch;
mod load;
mod norm_1p;
mod profile;
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
pub use sampling::{CudaLogits, CudaPendingSamples};
pub use step::CudaStep;
pub use w4a16::{W4Kernel, GEMV_MAX_ROWS as W4_GEMV_MAX_ROWS};

use handles::Kernels;

use super::device::{self, CudaError};
use super::kernel_cache::KernelCache;
use super::kernels::KernelModule;
use super::nvrtc::{self, Arch};
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
    /// Open device `ordinal`, compile every kernel for it (or for `arch_override`, e.g.
    /// `compute_70` to run the V100 path through the driver's JIT) and load them.
    pub fn new(
        ordinal: usize,
        dtype: &str,
        kv_cache_dtype: &str,
        arch_override: Option<Arch>,
    ) -> Result<CudaBackend, CudaError> {
        device::require_driver()?;
        device::require_nvrtc()?;
        let ctx = CudaContext::new(ordinal)?;
        let (major, minor) = ctx.compute_capability()?;
        let device_arch = Arch::from_compute_capability(major as u32, minor as u32);
        let arch = arch_override.unwrap_or(device_arch);
        let dtype = ComputeDType::resolve(dtype, arch)?;
        let kv = resolve_kv(kv_cache_dtype)?;
        let include = nvrtc::find_include_dir(None)?;
        let cache = KernelCache::from_env();
        // All work of a backend is queued on this one stream (cuBLAS included), so cudarc's
        // cross-stream event tracking (two events created and destroyed per allocation) only
        // costs driver calls.
        // SAFETY: no other stream ever touches this context's allocations: the backend creates
        // only this one, and its slices never leave it.
        unsafe { ctx.disable_event_tracking() };
        // A created stream, not the legacy default one: only those can be captured into graphs.
        let stream = ctx.new_stream()?;
        let mut functions = HashMap::new();
        let t0 = std::time::Instant::now();
        // The modules compile in parallel (NVRTC programs are independent); each comes from the
        // kernel cache when a valid entry exists.
        let modules: Vec<KernelModule> = KernelModule::ALL
            .into_iter()
            .filter(|m| m.builds_for(arch))
            .collect();
        let images: Vec<_> = std::thread::scope(|s| {
            let jobs: Vec<_> = modules
                .iter()
                .map(|&m| {
                    let (include, cache) = (&include, cache.as_ref());
                    let defines = m.defines(dtype.suffix(), kv.suffix());
                    s.spawn(move || {
                        nvrtc::load_or_compile(m, arch, include, cache, false, &defines)
                    })
                })
                .collect();
            jobs.into_iter()
                .map(|j| j.join().expect("an NVRTC thread panicked"))
                .collect()
        });
        let mut sources = Vec::new();
        for (m, image) in modules.iter().copied().zip(images) {
            let (image, mut source) = image?;
            let module = match ctx.load_module(nvrtc::to_cudarc(image)) {
                Ok(module) => module,
                // A cached image the driver refuses (a driver change, a bad entry that passed the
                // checks): compile it afresh and replace the entry.
                Err(e) if source == nvrtc::Source::Cache => {
                    tracing::warn!(module = m.file_name(), error = ?e,
                        "Cached kernel image failed to load; recompiling it.");
                    let defines = m.defines(dtype.suffix(), kv.suffix());
                    let (image, s) =
                        nvrtc::load_or_compile(m, arch, &include, cache.as_ref(), true, &defines)?;
                    source = s;
                    ctx.load_module(nvrtc::to_cudarc(image))?
                }
                Err(e) => return Err(e.into()),
            };
            sources.push(source);
            for name in m.entry_points_for(dtype.suffix(), kv.suffix()) {
                let f = module
                    .load_function(&name)
                    .map_err(|_| CudaError::MissingKernel {
                        module: m.file_name(),
                        function: name.clone(),
                    })?;
                functions.insert(name, f);
            }
        }
        let cached = sources
            .iter()
            .filter(|s| **s == nvrtc::Source::Cache)
            .count();
        tracing::info!(
            arch = %arch,
            modules = sources.len(),
            from_cache = cached,
            cache = %cache.as_ref().map(|c| c.dir().display().to_string()).unwrap_or_else(|| "off".into()),
            seconds = t0.elapsed().as_secs_f64(),
            "Kernels ready."
        );
        // The largest prefill variant needs more than the default 48 KB of dynamic shared memory.
        for v in PrefillVariant::ALL {
            let bytes = v.shared_bytes(v.max_head_dim);
            if bytes <= attention_plan::DEFAULT_SHARED_BYTES {
                continue;
            }
            for (name, f) in &functions {
                if name.starts_with("attention_prefill_")
                    && name.ends_with(&format!("_{}", v.suffix))
                {
                    f.set_attribute(
                        cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                        bytes as i32,
                    )?;
                }
            }
        }
        let kv_bytes = match kv {
            KvStorage::Same => dtype.size(),
            KvStorage::E5M2 | KvStorage::E4M3 => 1,
        };
        let k = Kernels::resolve(&functions, dtype.suffix(), kv.suffix(), kv_bytes)?;
        let blas = CudaBlas::new(stream.clone())?;
        // cuBLAS gets a fixed workspace of its own, so it never allocates inside a graph capture
        // and picks its kernels with the same workspace eagerly and captured.
        let blas_workspace = stream.alloc_zeros::<u8>(CUBLAS_WORKSPACE_BYTES)?;
        {
            let (wp, _sync) = blas_workspace.device_ptr(&stream);
            // SAFETY: the workspace is a live allocation of CUBLAS_WORKSPACE_BYTES on the stream
            // the handle uses, kept in the backend (dropped after the handle: field order).
            let status = unsafe {
                cublas_sys::cublasSetWorkspace_v2(
                    *blas.handle(),
                    wp as *mut c_void,
                    CUBLAS_WORKSPACE_BYTES,
                )
            };
            if status != cublas_sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
                return Err(CudaError::Cublas(cudarc::cublas::result::CublasError(
                    status,
                )));
            }
        }
        let dense =
            match dense::DenseMatmul::from_env().map_err(|e| CudaError::Nvrtc(e.to_string()))? {
                // No tensor-core kernels below sm_80 or for f32: the CUDA-core one keeps the numerics
                // batch-invariant there.
                dense::DenseMatmul::Mma if arch.major < 8 || k.dense_mma.is_none() => {
                    dense::DenseMatmul::Fma
                }
                d => d,
            };
        let mma = arch.major >= 8 && k.dense_mma.is_some();
        let env_err = |e: BackendError| CudaError::Nvrtc(e.to_string());
        let fused_rows = if mma {
            dense::fused_rows_from_env(dense).map_err(env_err)?
        } else {
            0
        };
        let pdl = mma && arch.major >= 9 && dense::pdl_from_env().map_err(env_err)?;
        let device_name = format!("cuda:{ordinal} ({}, {device_arch}", ctx.name()?)
            + &if arch != device_arch {
                format!(", kernels for {arch}")
            } else {
                String::new()
            }
            + &format!(", {})", dtype.suffix())
            + match dense {
                dense::DenseMatmul::Cublas => "",
                dense::DenseMatmul::Fma => " [dense matmul: fma]",
                dense::DenseMatmul::Mma => " [dense matmul: mma]",
            }
            + &if fused_rows > 0 {
                format!(
                    " [fused decode <= {fused_rows} rows{}]",
                    if pdl { ", pdl" } else { "" }
                )
            } else {
                String::new()
            };
        Ok(CudaBackend {
            ctx,
            stream,
            blas,
            _blas_workspace: blas_workspace,
            prof: profile::Profiler::from_env(),
            k,
            scratch: Mutex::new(Scratch::default()),
            dense,
            fused_rows,
            pdl,
            pdl_packed: w4a16::pdl_packed_from_env().map_err(env_err)?,
            w4_trigger_late: w4a16::trigger_late_from_env().map_err(env_err)?,
            arch,
            dtype,
            kv,
            device_name,
        })
    }

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

/// Bytes of the workspace cuBLAS is given (NVIDIA's advice for Hopper; more than enough below).
pub const CUBLAS_WORKSPACE_BYTES: usize = 32 << 20;

/// Threads per block of `qkv_rope_write` (`QKV_WARPS * 32` in kv_cache.cu).
const QKV_THREADS: u32 = 4 * 32;
/// Largest head_dim `qkv_rope_write` holds (`QKV_MAX_DIM`).
const QKV_MAX_HEAD_DIM: usize = 256;

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
        let _t = self.prof.op(&self.stream, "embedding");
        check_len("embedding output", out.len, step.num_tokens * table.k)?;
        if table.packed.is_some() {
            return Err(BackendError::Unsupported(
                "embedding: a packed 4-bit table (embeddings load in 16 bits)".into(),
            ));
        }
        if step.num_tokens == 0 {
            return Ok(());
        }
        if let Some(parts) = &table.gguf {
            let ids = step.token_ids();
            // SAFETY: token ids were range-checked by ForwardBatch::step_input against the
            // vocabulary (the table's rows); `out` holds num_tokens rows of k (checked above).
            return unsafe {
                self.gguf_gather(
                    table,
                    parts,
                    &ids,
                    step.num_tokens,
                    &mut out.data,
                    out.dtype,
                )
            };
        }
        let f = match (out.dtype, &self.k.embedding_to_f32) {
            (d, _) if d == self.dtype => &self.k.embedding,
            (ComputeDType::F32, Some(f)) => f,
            (d, _) => return Err(mixed("embedding output", d, self.dtype)),
        };
        let ids = step.token_ids();
        // SAFETY: token ids were range-checked by ForwardBatch::step_input against the vocabulary
        // (the table's rows); `out` holds num_tokens rows of k (checked above).
        unsafe {
            self.launch_row_gather(
                f,
                &ids,
                step.num_tokens,
                &table.data,
                &mut out.data,
                table.k,
            )
        }
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
        let _t = self.prof.op(&self.stream, "rms_norm");
        check_len("rms_norm input", x.len, rows * dim)?;
        check_len("rms_norm output", out.len, rows * dim)?;
        check_len("rms_norm weight", weight.len, dim)?;
        self.expect_compute("rms_norm output", out)?;
        let kernel = match (x.dtype, &self.k.rms_norm_xf32) {
            (d, _) if d == self.dtype => &self.k.rms_norm,
            (ComputeDType::F32, Some(f)) => f,
            (d, _) => return Err(mixed("rms_norm input", d, self.dtype)),
        };
        self.launch_rms_norm(
            kernel,
            &x.data,
            None,
            &weight.data,
            &mut out.data,
            rows,
            dim,
            eps,
        )
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
        let _t = self.prof.op(&self.stream, "add_rms_norm");
        check_len("add_rms_norm residual", residual.len, rows * dim)?;
        check_len("add_rms_norm delta", delta.len, rows * dim)?;
        check_len("add_rms_norm output", out.len, rows * dim)?;
        self.expect_compute("add_rms_norm delta", delta)?;
        self.expect_compute("add_rms_norm output", out)?;
        let kernel = match (residual.dtype, &self.k.rms_norm_rf32) {
            (d, _) if d == self.dtype => &self.k.rms_norm,
            (ComputeDType::F32, Some(f)) => f,
            (d, _) => return Err(mixed("add_rms_norm residual", d, self.dtype)),
        };
        self.launch_rms_norm(
            kernel,
            &delta.data,
            Some(&mut residual.data),
            &weight.data,
            &mut out.data,
            rows,
            dim,
            eps,
        )
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
        check_len("matmul input", x.len, rows * w.k)?;
        check_len("matmul output", out.len, rows * w.n)?;
        self.expect_compute("matmul input", x)?;
        self.expect_compute("matmul output", out)?;
        if rows == 0 {
            return Ok(());
        }
        let (xp, _x_sync) = x.data.device_ptr(&self.stream);
        let (op, _o_sync) = out.data.device_ptr_mut(&self.stream);
        // SAFETY: w, x and out are live device allocations holding n × k, rows × k and rows × n
        // elements of the compute dtype (checked above); the sync guards keep them in use on
        // this stream for the call.
        unsafe { self.gemm_xwt(w, rows, xp, op, self.dtype.cuda_type()) }
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
        let _t = self.prof.op(&self.stream, "rope");
        check_len("rope q", q.len, step.num_tokens * num_heads * head_dim)?;
        check_len("rope k", k.len, step.num_tokens * num_kv_heads * head_dim)?;
        if rope.spec.rotary_dim > head_dim {
            return Err(BackendError::InvalidArgument(format!(
                "rotary_dim {} > head_dim {head_dim}",
                rope.spec.rotary_dim
            )));
        }
        if step.max_context > rope.spec.max_positions {
            return Err(BackendError::InvalidArgument(format!(
                "position {} past the RoPE table ({})",
                step.max_context, rope.spec.max_positions
            )));
        }
        if step.num_tokens == 0 {
            return Ok(());
        }
        let f = &self.k.rope;
        let positions = step.positions();
        let (nh, nkv, hd, half) = (
            num_heads as i32,
            num_kv_heads as i32,
            head_dim as i32,
            (rope.spec.rotary_dim / 2) as i32,
        );
        let mut b = self.stream.launch_builder(f);
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

    fn write_kv(
        &self,
        cache: &mut CudaKvCache,
        layer: usize,
        k: &CudaBuffer,
        v: &CudaBuffer,
        step: &CudaStep,
    ) -> Result<(), BackendError> {
        let _t = self.prof.op(&self.stream, "write_kv");
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
        let f = &self.k.kv_write;
        let slots = step.slot_mapping();
        let row_elems = row as i32;
        let (kc, vc) = (&mut cache.k[layer], &mut cache.v[layer]);
        let mut b = self.stream.launch_builder(f);
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
        let _t = self.prof.op(&self.stream, "silu_mul");
        check_len("silu_mul gate", gate.len, len)?;
        check_len("silu_mul up", up.len, len)?;
        check_len("silu_mul output", out.len, len)?;
        if len == 0 {
            return Ok(());
        }
        let st = &self.stream;
        let mut b = launch::KernelArgs::new();
        b.buf(&gate.data, st)
            .buf(&up.data, st)
            .buf(&out.data, st)
            .i64(len as i64);
        // SAFETY: all three buffers hold at least `len` elements; the kernel guards i < n and
        // waits (griddepcontrol.wait) before touching memory, so PDL is allowed.
        unsafe {
            self.launch_args(
                &self.k.silu_mul,
                LaunchConfig::for_num_elems(len as u32),
                &mut b,
                self.pdl_packed(),
            )
        }
    }

    fn add(&self, x: &mut CudaBuffer, y: &CudaBuffer, len: usize) -> Result<(), BackendError> {
        let _t = self.prof.op(&self.stream, "add");
        check_len("add x", x.len, len)?;
        check_len("add y", y.len, len)?;
        if len == 0 {
            return Ok(());
        }
        let f = &self.k.add;
        let n = len as i64;
        let mut b = self.stream.launch_builder(f);
        b.arg(&mut x.data).arg(&y.data).arg(&n);
        // SAFETY: both buffers hold at least `len` elements; the kernel guards i < n.
        unsafe { b.launch(LaunchConfig::for_num_elems(len as u32)) }.map_err(dev_err)?;
        Ok(())
    }

    fn gather_rows(
        &self,
        x: &CudaBuffer,
        step: &CudaStep,
        dim: usize,
        out: &mut CudaBuffer,
    ) -> Result<(), BackendError> {
        let _t = self.prof.op(&self.stream, "gather_rows");
        check_len("gather_rows input", x.len, step.num_tokens * dim)?;
        check_len("gather_rows output", out.len, step.num_logit_rows * dim)?;
        if step.num_logit_rows == 0 {
            return Ok(());
        }
        // The embedding kernel is a row gather: out[i] = x[logit_rows[i]].
        let f = &self.k.embedding;
        let rows = step.logit_rows();
        // SAFETY: logit rows are token indices < num_tokens (built by ForwardBatch::step_input) and
        // `x` holds num_tokens rows of dim, `out` num_logit_rows rows (checked above).
        unsafe {
            self.launch_row_gather(f, &rows, step.num_logit_rows, &x.data, &mut out.data, dim)
        }
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
        let _t = self.prof.op(&self.stream, "qkv_rope_write");
        let spec = cache.spec;
        params.check_fits(&spec, layer)?;
        let (t, hd) = (step.num_tokens, params.head_dim);
        let width = (params.num_heads + 2 * params.num_kv_heads) * hd;
        check_len("qkv_rope_write qkv", qkv.len, t * width)?;
        check_len("qkv_rope_write q_out", q_out.len, t * params.num_heads * hd)?;
        self.expect_compute("qkv_rope_write qkv", qkv)?;
        self.expect_compute("qkv_rope_write q_out", q_out)?;
        if hd > QKV_MAX_HEAD_DIM || rope.spec.rotary_dim > hd {
            return Err(BackendError::InvalidArgument(format!(
                "qkv_rope_write: head_dim {hd} (at most {QKV_MAX_HEAD_DIM}), rotary_dim {}",
                rope.spec.rotary_dim
            )));
        }
        if step.max_context > rope.spec.max_positions {
            return Err(BackendError::InvalidArgument(format!(
                "position {} past the RoPE table ({})",
                step.max_context, rope.spec.max_positions
            )));
        }
        if let Some((qn, kn, _)) = qk_norm {
            check_len("qkv_rope_write q_norm", qn.len, hd)?;
            check_len("qkv_rope_write k_norm", kn.len, hd)?;
            self.expect_compute("qkv_rope_write q_norm", qn)?;
            self.expect_compute("qkv_rope_write k_norm", kn)?;
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
        let (qkv_p, _s0) = qkv.data.device_ptr(&self.stream);
        let (q_p, _s1) = q_out.data.device_ptr_mut(&self.stream);
        let (kc_p, _s2) = kc.device_ptr_mut(&self.stream);
        let (vc_p, _s3) = vc.device_ptr_mut(&self.stream);
        let (pos_p, _s4) = positions.device_ptr(&self.stream);
        let (slot_p, _s5) = slots.device_ptr(&self.stream);
        let (cos_p, _s6) = rope.cos.device_ptr(&self.stream);
        let (sin_p, _s7) = rope.sin.device_ptr(&self.stream);
        let (qn_p, kn_p) = match qk_norm {
            Some((qn, kn, _)) => (
                qn.data.device_ptr(&self.stream).0,
                kn.data.device_ptr(&self.stream).0,
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
        unsafe { self.launch_kernel(&self.k.qkv_rope_write, cfg, &mut params, self.pdl) }
    }

    fn swiglu(
        &self,
        gate_up: &CudaBuffer,
        out: &mut CudaBuffer,
        rows: usize,
        inter: usize,
    ) -> Result<(), BackendError> {
        let _t = self.prof.op(&self.stream, "swiglu");
        check_len("swiglu gate_up", gate_up.len, rows * 2 * inter)?;
        check_len("swiglu output", out.len, rows * inter)?;
        self.expect_compute("swiglu gate_up", gate_up)?;
        self.expect_compute("swiglu output", out)?;
        let n = rows * inter;
        if n == 0 {
            return Ok(());
        }
        let (r, i) = (rows as i64, inter as i32);
        let mut b = self.stream.launch_builder(&self.k.swiglu);
        b.arg(&gate_up.data).arg(&mut out.data).arg(&r).arg(&i);
        // SAFETY: gate_up holds rows × 2·inter and out rows × inter elements (checked); the kernel
        // guards i < rows × inter.
        unsafe { b.launch(LaunchConfig::for_num_elems(n as u32)) }.map_err(dev_err)?;
        Ok(())
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
        let spec = cache.spec;
        if src as usize >= spec.num_blocks || dst as usize >= spec.num_blocks {
            return Err(BackendError::InvalidArgument(format!(
                "copy_block {src} → {dst} of {} blocks",
                spec.num_blocks
            )));
        }
        let f = &self.k.kv_copy_block;
        let block_elems = (spec.block_size * spec.slot_elems()) as i64;
        let (s, d) = (src as i64, dst as i64);
        for layer in 0..spec.num_layers {
            for part in [&mut cache.k[layer], &mut cache.v[layer]] {
                let mut b = self.stream.launch_builder(f);
                b.arg(part).arg(&s).arg(&d).arg(&block_elems);
                // SAFETY: src and dst are < num_blocks (checked); each block holds block_elems
                // elements of `elem` bytes, matching the kernel variant.
                unsafe { b.launch(LaunchConfig::for_num_elems(block_elems as u32)) }
                    .map_err(dev_err)?;
            }
        }
        Ok(())
    }
}

impl CudaBackend {
    fn kv_elem_bytes(&self) -> usize {
        match self.kv {
            KvStorage::Same => self.dtype.size(),
            KvStorage::E5M2 | KvStorage::E4M3 => 1,
        }
    }

    /// Row-major `out[rows, w.n] = x[rows, w.k] · wᵀ` with cuBLAS, f32 accumulation (pedantic
    /// f32 for an f32 compute dtype); x and w in the compute dtype, out in `out_type` (the
    /// compute dtype, or f32 for logits). As column-major: outᵀ (n × rows) = op(W)(n × k) · xᵀ
    /// (k × rows), with W seen column-major as k × n and transposed.
    ///
    /// # Safety
    /// `xp` and `op` point to live device memory on this stream holding rows × k elements of
    /// the compute dtype and rows × n elements of `out_type`.
    pub(super) unsafe fn gemm_xwt(
        &self,
        w: &CudaWeight,
        rows: usize,
        xp: u64,
        op: u64,
        out_type: cublas_sys::cudaDataType,
    ) -> Result<(), BackendError> {
        if let Some(parts) = &w.packed {
            let out_f32 = out_type == cublas_sys::cudaDataType::CUDA_R_32F;
            let kernel = self.w4_kernel_for(rows);
            // SAFETY: as this function's contract.
            return unsafe { self.packed_matmul(w, parts, rows, xp, op, out_f32, kernel) };
        }
        if let Some(parts) = &w.gguf {
            let out_f32 = out_type == cublas_sys::cudaDataType::CUDA_R_32F;
            let kernel = self.gguf_kernel_for(rows);
            // SAFETY: as this function's contract.
            return unsafe { self.gguf_matmul(w, parts, rows, xp, op, out_f32, kernel) };
        }
        if self.dense_takes(w) {
            let out_f32 = out_type == cublas_sys::cudaDataType::CUDA_R_32F;
            // SAFETY: as this function's contract.
            return unsafe { self.dense_matmul(w, rows, xp, op, out_f32) };
        }
        let (alpha, beta) = (1.0f32, 0.0f32);
        let ty = self.dtype.cuda_type();
        let compute = if self.dtype == ComputeDType::F32 {
            cublas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_PEDANTIC
        } else {
            cublas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F
        };
        let (wp, _w_sync) = w.data.device_ptr(&self.stream);
        // SAFETY: w is a live n × k allocation (held by `_w_sync` for the call), x and out as
        // the caller promises; alpha/beta are host f32 as CUBLAS_COMPUTE_32F expects.
        unsafe {
            cudarc::cublas::result::gemm_ex(
                *self.blas.handle(),
                cublas_sys::cublasOperation_t::CUBLAS_OP_T,
                cublas_sys::cublasOperation_t::CUBLAS_OP_N,
                w.n as i32,
                rows as i32,
                w.k as i32,
                &alpha as *const f32 as *const c_void,
                wp as *const c_void,
                ty,
                w.k as i32,
                xp as *const c_void,
                ty,
                w.k as i32,
                &beta as *const f32 as *const c_void,
                op as *mut c_void,
                out_type,
                w.n as i32,
                compute,
                cublas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(dev_err)
    }

    /// `out[i, :] = src[idx[i], :]` for `n` rows of `dim` elements through an `embedding_*`
    /// kernel `f` (one block per row).
    ///
    /// # Safety
    /// `idx` holds `n` row indices inside `src`; `out` holds `n × dim` elements of `f`'s output
    /// type and `src` rows of `dim` elements of its input type.
    unsafe fn launch_row_gather(
        &self,
        f: &CudaFunction,
        idx: &CudaView<'_, i32>,
        n: usize,
        src: &CudaSlice<u8>,
        out: &mut CudaSlice<u8>,
        dim: usize,
    ) -> Result<(), BackendError> {
        let d = dim as i32;
        let mut b = self.stream.launch_builder(f);
        b.arg(idx).arg(src).arg(out).arg(&d);
        let cfg = LaunchConfig {
            grid_dim: (n as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the caller's promise; every thread guards `i < dim` within its row.
        unsafe { b.launch(cfg) }.map_err(dev_err)?;
        Ok(())
    }

    /// `Err(InvalidArgument)` unless `b` holds the compute dtype.
    /// The gate|up product of an interleaved weight (`swiglu_rows`) through cuBLAS (or the
    /// backend's dense kernel) into `scratch` `[rows, 2·inter]`, then `swiglu_il`.
    fn interleaved_gate_up_swiglu(
        &self,
        x: &CudaBuffer,
        rows: usize,
        w: &CudaWeight,
        scratch: &mut CudaBuffer,
        out: &mut CudaBuffer,
        inter: usize,
    ) -> Result<(), BackendError> {
        {
            let _t = self.prof.op(&self.stream, "matmul");
            check_len("gate_up_swiglu weight", w.n, 2 * inter)?;
            check_len("gate_up_swiglu input", x.len, rows * w.k)?;
            check_len("gate_up_swiglu scratch", scratch.len, rows * w.n)?;
            self.expect_compute("gate_up_swiglu input", x)?;
            self.expect_compute("gate_up_swiglu scratch", scratch)?;
            if rows == 0 {
                return Ok(());
            }
            let (xp, _x_sync) = x.data.device_ptr(&self.stream);
            let (sp, _s_sync) = scratch.data.device_ptr_mut(&self.stream);
            // SAFETY: w, x and scratch hold n × k, rows × k and rows × n compute-dtype elements
            // (checked above); the sync guards keep them in use on this stream for the call.
            unsafe { self.gemm_xwt(w, rows, xp, sp, self.dtype.cuda_type()) }?;
        }
        let _t = self.prof.op(&self.stream, "swiglu");
        check_len("swiglu output", out.len, rows * inter)?;
        self.expect_compute("swiglu output", out)?;
        let (r, i) = (rows as i64, inter as i32);
        let mut b = self.stream.launch_builder(&self.k.swiglu_il);
        b.arg(&scratch.data).arg(&mut out.data).arg(&r).arg(&i);
        // SAFETY: scratch holds rows × 2·inter and out rows × inter elements (checked); the
        // kernel guards i < rows × inter.
        unsafe { b.launch(LaunchConfig::for_num_elems((rows * inter) as u32)) }.map_err(dev_err)?;
        Ok(())
    }

    fn expect_compute(&self, what: &str, b: &CudaBuffer) -> Result<(), BackendError> {
        if b.dtype == self.dtype {
            Ok(())
        } else {
            Err(mixed(what, b.dtype, self.dtype))
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn launch_rms_norm(
        &self,
        f: &CudaFunction,
        x: &CudaSlice<u8>,
        residual: Option<&mut CudaSlice<u8>>,
        weight: &CudaSlice<u8>,
        out: &mut CudaSlice<u8>,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<(), BackendError> {
        if rows == 0 {
            return Ok(());
        }
        let d = dim as i32;
        let null: u64 = 0;
        let mut b = self.stream.launch_builder(f);
        b.arg(x);
        match residual {
            Some(r) => b.arg(r),
            None => b.arg(&null),
        };
        b.arg(weight).arg(out).arg(&d).arg(&eps);
        let threads = if dim >= 1024 {
            1024
        } else {
            (dim.div_ceil(32) * 32) as u32
        };
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: x, residual and out hold rows × dim elements and weight dim (checked by the
        // callers); a null residual pointer selects the unfused path in the kernel.
        unsafe { b.launch(cfg) }.map_err(dev_err)?;
        Ok(())
    }
}
