//! CUDA availability checks and the CUDA error type.
//!
//! cudarc loads the driver, NVRTC and cuBLAS dynamically and panics on first use when a library
//! is missing; every entry into the CUDA backend calls `require_driver` / `require_nvrtc` first, so
//! a machine without CUDA gets a clear error instead.

/// Errors of the CUDA backend. `is_oom` tells the engine to fail requests with `Oom`, not crash.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// `libcuda.so` could not be loaded.
    #[error("the NVIDIA driver library (libcuda.so) was not found: is a GPU driver installed?")]
    NoDriver,
    /// `libnvrtc.so` could not be loaded.
    #[error(
        "NVRTC (libnvrtc.so) was not found: install the CUDA toolkit or run scripts/nvrtc-setup, and put its lib folder on LD_LIBRARY_PATH"
    )]
    NoNvrtc,
    /// No folder with `cuda_fp16.h` was found.
    #[error("CUDA headers (cuda_fp16.h) not found; set KILN_CUDA_INCLUDE. Searched: {searched:?}")]
    HeadersNotFound {
        /// Folders that were tried.
        searched: Vec<String>,
    },
    /// NVRTC rejected a kernel; `log` is NVRTC's own output.
    #[error("NVRTC failed to compile {file} for {arch}:\n{log}")]
    Compile {
        /// Kernel file.
        file: &'static str,
        /// Target architecture.
        arch: String,
        /// The compiler log.
        log: String,
    },
    /// Any other NVRTC failure.
    #[error("NVRTC: {0}")]
    Nvrtc(String),
    /// A target kiln does not know.
    #[error("unsupported GPU architecture {0}")]
    UnsupportedArch(String),
    /// A kernel entry point is missing from a loaded module.
    #[error("kernel `{function}` missing from {module}")]
    MissingKernel {
        /// Kernel file.
        module: &'static str,
        /// Entry point.
        function: String,
    },
    /// A CUDA driver call failed.
    #[error("CUDA driver: {0:?}")]
    Driver(cudarc::driver::DriverError),
    /// A cuBLAS call failed.
    #[error("cuBLAS: {0:?}")]
    Cublas(cudarc::cublas::result::CublasError),
    /// An environment setting read when the backend is created has an invalid value.
    #[error("{0}")]
    Setting(String),
}

impl CudaError {
    /// Whether this is an out-of-memory condition (the request fails with `Oom`; the engine lives on).
    pub fn is_oom(&self) -> bool {
        match self {
            CudaError::Driver(e) => e.0 == cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY,
            CudaError::Cublas(e) => {
                e.0 == cudarc::cublas::sys::cublasStatus_t::CUBLAS_STATUS_ALLOC_FAILED
            }
            _ => false,
        }
    }
}

impl From<cudarc::driver::DriverError> for CudaError {
    fn from(e: cudarc::driver::DriverError) -> Self {
        CudaError::Driver(e)
    }
}

impl From<cudarc::cublas::result::CublasError> for CudaError {
    fn from(e: cudarc::cublas::result::CublasError) -> Self {
        CudaError::Cublas(e)
    }
}

/// Fail cleanly when the driver library is absent.
pub fn require_driver() -> Result<(), CudaError> {
    // SAFETY: only tries to dlopen the library by its usual names; no CUDA call is made.
    if unsafe { cudarc::driver::sys::is_culib_present() } {
        Ok(())
    } else {
        Err(CudaError::NoDriver)
    }
}

/// Fail cleanly when NVRTC is absent.
pub fn require_nvrtc() -> Result<(), CudaError> {
    // SAFETY: only tries to dlopen the library by its usual names; no NVRTC call is made.
    if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        Ok(())
    } else {
        Err(CudaError::NoNvrtc)
    }
}

/// One visible GPU, for `kiln doctor` and the startup log.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct GpuInfo {
    /// Device ordinal.
    pub ordinal: usize,
    /// Marketing name.
    pub name: String,
    /// Compute capability (major, minor).
    pub compute_capability: (u32, u32),
    /// Total memory in bytes.
    pub total_memory: usize,
    /// Theoretical memory bandwidth in GB/s from the driver's attributes (2 transfers per
    /// memory clock × bus width); `None` when the driver does not report them.
    pub peak_bandwidth_gbps: Option<f64>,
}

/// The driver's CUDA version (e.g. 13000 for 13.0) and every visible GPU.
pub fn list_gpus() -> Result<(i32, Vec<GpuInfo>), CudaError> {
    require_driver()?;
    let mut version = 0i32;
    // SAFETY: the driver library is loaded (checked above); cuInit is idempotent and the
    // version pointer is valid.
    unsafe {
        cudarc::driver::sys::cuInit(0).result()?;
        cudarc::driver::sys::cuDriverGetVersion(&mut version).result()?;
    }
    let count = cudarc::driver::CudaContext::device_count()?;
    let mut gpus = Vec::new();
    for ordinal in 0..count.max(0) as usize {
        let ctx = cudarc::driver::CudaContext::new(ordinal)?;
        let (major, minor) = ctx.compute_capability()?;
        use cudarc::driver::sys::CUdevice_attribute as A;
        let clock_khz = ctx.attribute(A::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE).ok();
        let bus_bits = ctx
            .attribute(A::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH)
            .ok();
        let peak_bandwidth_gbps = match (clock_khz, bus_bits) {
            (Some(c), Some(b)) if c > 0 && b > 0 => {
                Some(2.0 * c as f64 * 1e3 * b as f64 / 8.0 / 1e9)
            }
            _ => None,
        };
        gpus.push(GpuInfo {
            ordinal,
            name: ctx.name()?,
            compute_capability: (major as u32, minor as u32),
            total_memory: ctx.total_mem()?,
            peak_bandwidth_gbps,
        });
    }
    Ok((version, gpus))
}
