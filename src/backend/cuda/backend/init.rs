//! Opening the device: [`CudaBackend::new`] compiles (or loads from the kernel cache) every
//! kernel module for the architecture, resolves the typed handles, gives cuBLAS its fixed
//! workspace and reads the launch settings from the environment (`KILN_DENSE_MATMUL`,
//! `KILN_FUSED_DECODE_ROWS`, `KILN_PDL`, `KILN_PDL_PACKED`, `KILN_PDL_GEMV_TRIGGER`).

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;

use cudarc::cublas::sys as cublas_sys;
use cudarc::cublas::CudaBlas;
use cudarc::driver::{CudaContext, DevicePtr};

use super::super::attention_plan::{self, PrefillVariant};
use super::super::device::{self, CudaError};
use super::super::kernel_cache::KernelCache;
use super::super::kernels::KernelModule;
use super::super::nvrtc::{self, Arch};
use super::{
    dense, profile, resolve_kv, w4a16, ComputeDType, CudaBackend, Kernels, KvStorage, Scratch,
};
use crate::backend::BackendError;

/// Bytes of the workspace cuBLAS is given (NVIDIA's advice for Hopper; more than enough below).
pub const CUBLAS_WORKSPACE_BYTES: usize = 32 << 20;

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
        // Unset: `mma` on sm_80+ and `fma` below for a 16-bit dtype (batch-invariant), cuBLAS for f32.
        let default_dense = dense::DenseMatmul::default_for(arch, dtype);
        let dense = match dense::DenseMatmul::from_env(default_dense)
            .map_err(|e| CudaError::Nvrtc(e.to_string()))?
        {
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
        let sms = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .map_or(1, |v| v.max(1) as usize);
        let mid = dense::MidRows::from_env(sms).map_err(env_err)?;
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
            + &if dense == dense::DenseMatmul::Mma {
                mid.describe()
            } else {
                String::new()
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
            mid,
            pdl,
            pdl_packed: w4a16::pdl_packed_from_env().map_err(env_err)?,
            w4_trigger_late: w4a16::trigger_late_from_env().map_err(env_err)?,
            arch,
            dtype,
            kv,
            device_name,
        })
    }
}
