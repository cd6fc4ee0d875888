//! Kernel launches through `cuLaunchKernelEx`, with programmatic dependent launch (PDL) where
//! asked: the launched kernel may begin while the stream's previous kernel still runs, and must
//! itself wait (`griddepcontrol.wait`, dense.cu's `pdl_wait`) before touching what that kernel
//! reads or writes. Inside a stream capture the attribute becomes a programmatic edge of the
//! graph, so decode graphs keep the overlap. Only sm_90+ kernels carry the wait: the backend asks
//! for PDL only when its kernels were compiled for sm_90 or later (`CudaBackend::pdl`).

use std::ffi::c_void;

use cudarc::driver::{sys, CudaFunction, LaunchConfig};

use super::{dev_err, CudaBackend};
use crate::backend::BackendError;

impl CudaBackend {
    /// Launch `f` on the backend's stream with `params` (one pointer per kernel parameter, in
    /// order), with the programmatic-stream-serialization attribute when `pdl`.
    ///
    /// # Safety
    /// `params` must match `f`'s parameter list in number, order and types, point at values that
    /// live for the call, and every buffer the kernel touches must be large enough for `cfg`
    /// (the caller's contract for that kernel). With `pdl`, `f` must wait (`griddepcontrol.wait`)
    /// before it reads or writes memory the previous kernel of the stream touches.
    pub(super) unsafe fn launch_kernel(
        &self,
        f: &CudaFunction,
        cfg: LaunchConfig,
        params: &mut [*mut c_void],
        pdl: bool,
    ) -> Result<(), BackendError> {
        self.ctx.bind_to_thread().map_err(dev_err)?;
        // SAFETY: a zeroed CUlaunchAttribute is a valid (ignored) value; the id and the union
        // field written are the ones the driver reads for this attribute.
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let config = sys::CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: self.stream.cu_stream(),
            attrs: if pdl { &mut attr } else { std::ptr::null_mut() },
            numAttrs: u32::from(pdl),
        };
        // SAFETY: the config, its attribute and `params` live for the call; the function handle
        // belongs to a module the backend keeps loaded; the rest is this function's contract.
        unsafe {
            sys::cuLaunchKernelEx(
                &config,
                f.cu_function(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
        .map_err(dev_err)
    }
}
