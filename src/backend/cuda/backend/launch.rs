//! Kernel launches through `cuLaunchKernelEx`, with programmatic dependent launch (PDL) where
//! asked: the launched kernel may begin while the stream's previous kernel still runs, and must
//! itself wait (`griddepcontrol.wait`, dense.cu's `pdl_wait`) before touching what that kernel
//! reads or writes. Inside a stream capture the attribute becomes a programmatic edge of the
//! graph, so decode graphs keep the overlap. Only sm_90+ kernels carry the wait: the backend asks
//! for PDL only when its kernels were compiled for sm_90 or later (`CudaBackend::pdl`).

use std::ffi::c_void;

use cudarc::driver::{sys, CudaFunction, DevicePtr, LaunchConfig};

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

/// An on/off launch switch from the environment (`KILN_PDL`, `KILN_PDL_PACKED`): `1`, `true`, `on`
/// or `0`, `false`, `off` (any case); unset or empty: `default`; anything else is an error
/// naming the variable.
pub(super) fn env_switch(name: &str, default: bool) -> Result<bool, BackendError> {
    match std::env::var(name) {
        Err(_) => Ok(default),
        Ok(v) => match v.trim().to_ascii_lowercase().as_str() {
            "" => Ok(default),
            "1" | "true" | "on" => Ok(true),
            "0" | "false" | "off" => Ok(false),
            other => Err(BackendError::InvalidArgument(format!(
                "{name}={other:?}: expected 0 or 1"
            ))),
        },
    }
}

// Each value is stored in the low bytes of its 8-byte slot, which the driver reads from the
// slot's address: correct on little-endian hosts only (every CUDA host).
#[cfg(target_endian = "big")]
compile_error!("KernelArgs assumes a little-endian host");

/// Kernel parameters for [`CudaBackend::launch_args`]: each value (a device pointer, an `i32`, an
/// `i64` or an `f32`) in its own 8-byte slot, in the kernel's parameter order. The launches that
/// may carry the PDL attribute use it instead of cudarc's launch builder, which has no attributes
/// (the backend's context does not track events, so raw device pointers lose nothing).
#[derive(Debug, Default)]
pub(super) struct KernelArgs {
    slots: Vec<u64>,
}

impl KernelArgs {
    pub(super) fn new() -> Self {
        Self::default()
    }

    /// A device buffer's address (`T*` in the kernel). The backend's context does not track
    /// events, so the sync guard `device_ptr` returns holds nothing.
    pub(super) fn buf<E, B>(&mut self, b: &B, stream: &cudarc::driver::CudaStream) -> &mut Self
    where
        B: DevicePtr<E>,
    {
        let (p, _sync) = b.device_ptr(stream);
        self.slots.push(p);
        self
    }

    /// A raw device address (`T*` in the kernel; 0 = nullptr).
    pub(super) fn ptr(&mut self, p: u64) -> &mut Self {
        self.slots.push(p);
        self
    }

    pub(super) fn i32(&mut self, v: i32) -> &mut Self {
        self.slots.push(u64::from(v as u32));
        self
    }

    pub(super) fn i64(&mut self, v: i64) -> &mut Self {
        self.slots.push(v as u64);
        self
    }

    pub(super) fn f32(&mut self, v: f32) -> &mut Self {
        self.slots.push(u64::from(v.to_bits()));
        self
    }
}

impl CudaBackend {
    /// [`Self::launch_kernel`] with the parameters of `args`.
    ///
    /// # Safety
    /// As [`Self::launch_kernel`]: `args` must match `f`'s parameter list, and every buffer it
    /// names must stay alive until the kernel has run (the stream orders its frees after it).
    pub(super) unsafe fn launch_args(
        &self,
        f: &CudaFunction,
        cfg: LaunchConfig,
        args: &mut KernelArgs,
        pdl: bool,
    ) -> Result<(), BackendError> {
        let mut params: Vec<*mut c_void> = args
            .slots
            .iter_mut()
            .map(|s| s as *mut u64 as *mut c_void)
            .collect();
        // SAFETY: the slots live (in `args`) for the call; the rest is this function's contract.
        unsafe { self.launch_kernel(f, cfg, &mut params, pdl) }
    }
}

#[cfg(test)]
mod tests {
    use super::env_switch;

    #[test]
    fn env_switch_reads_on_off_and_rejects_the_rest() {
        // A variable of this test alone (tests run in parallel in one process).
        const V: &str = "KILN_TEST_ENV_SWITCH_ONLY_HERE";
        std::env::remove_var(V);
        assert!(env_switch(V, true).unwrap());
        assert!(!env_switch(V, false).unwrap());
        for (v, want) in [
            ("1", true),
            ("ON", true),
            (" true ", true),
            ("0", false),
            ("off", false),
            ("", true),
        ] {
            std::env::set_var(V, v);
            assert_eq!(env_switch(V, true).unwrap(), want, "{v:?}");
        }
        std::env::set_var(V, "maybe");
        let err = env_switch(V, true).unwrap_err().to_string();
        assert!(err.contains(V) && err.contains("maybe"), "{err}");
        std::env::remove_var(V);
    }
}
