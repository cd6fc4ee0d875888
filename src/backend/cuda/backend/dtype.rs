//! [`ComputeDType`]: the dtype activations and weights are kept in on the GPU, and how
//! `engine.dtype` resolves to it for a device.

use cudarc::cublas::sys as cublas_sys;

use crate::backend::cuda::device::CudaError;
use crate::backend::cuda::nvrtc::Arch;

/// The dtype activations and weights are kept in on the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ComputeDType {
    /// f32 (parity tests; slow).
    F32,
    /// IEEE half: the V100 / T4 path.
    F16,
    /// bfloat16: sm_80 and newer.
    BF16,
}

impl ComputeDType {
    /// Kernel-name suffix.
    pub fn suffix(self) -> &'static str {
        match self {
            ComputeDType::F32 => "f32",
            ComputeDType::F16 => "f16",
            ComputeDType::BF16 => "bf16",
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            ComputeDType::F32 => 4,
            _ => 2,
        }
    }

    pub(super) fn cuda_type(self) -> cublas_sys::cudaDataType {
        match self {
            ComputeDType::F32 => cublas_sys::cudaDataType::CUDA_R_32F,
            ComputeDType::F16 => cublas_sys::cudaDataType::CUDA_R_16F,
            ComputeDType::BF16 => cublas_sys::cudaDataType::CUDA_R_16BF,
        }
    }

    /// Resolve `engine.dtype` (`auto | bf16 | fp16 | f32`) for a device.
    pub fn resolve(setting: &str, arch: Arch) -> Result<ComputeDType, CudaError> {
        match setting {
            "auto" if arch.has_bf16() => Ok(ComputeDType::BF16),
            "auto" | "fp16" | "f16" => Ok(ComputeDType::F16),
            "bf16" if arch.has_bf16() => Ok(ComputeDType::BF16),
            "bf16" => Err(CudaError::Nvrtc(format!(
                "engine.dtype = bf16 needs sm_80 or newer; this device is {arch} (use fp16)"
            ))),
            "f32" => Ok(ComputeDType::F32),
            other => Err(CudaError::Nvrtc(format!("unknown engine.dtype `{other}`"))),
        }
    }
}
