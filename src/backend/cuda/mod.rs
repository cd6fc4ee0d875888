//! The CUDA backend (behind the `cuda` feature): cudarc with dynamic loading, kernels compiled by
//! NVRTC at start for the device's `sm_XY`, cuBLAS for fp16/bf16 GEMMs.
//!
//! Every kernel has an sm_70 path (fp16 compute, software bf16/fp8 conversion, ≤ 96 KB shared
//! memory, no cp.async / ldmatrix / mma m16n8k16), so one build serves the V100 up to the H200.

pub mod attention_plan;
pub mod backend;
pub mod device;
pub mod kernel_cache;
pub mod kernels;
pub mod nvrtc;

pub use backend::{
    ComputeDType, CudaBackend, CudaLogits, DenseMatmul, GemmChoice, GemmTile, GgufKernel,
    KvStorage, MmaKernel, MmaOut, MmaProbeOut, W4Kernel, DEFAULT_CHUNKED_MIN_LEN, W4_GEMV_VARIANTS,
};
pub use device::{CudaError, GpuInfo};
pub use kernels::{KernelModule, W4_XR_VARIANTS};
pub use nvrtc::Arch;
