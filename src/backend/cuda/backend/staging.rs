//! [`Staging`]: a pinned (page-locked) host buffer paired with a device buffer of the same
//! capacity, for data the host writes every step (step metadata, sampling parameters) and the
//! device reads: the host fills a prefix, one asynchronous copy moves it, and the buffers are
//! kept for the backend's life, so a step allocates nothing and its device addresses do not
//! change (what a captured CUDA graph needs).
//!
//! Ordering: [`Staging::upload`] records an event after its copy; [`Staging::host_mut`] waits
//! for it, so the host never rewrites bytes a queued copy has not read yet. Device readers are
//! ordered after the copy by the stream itself (everything runs on the backend's one stream).

use std::sync::Arc;

use cudarc::driver::{
    CudaEvent, CudaSlice, CudaStream, DevicePtrMut, DeviceRepr, PinnedHostSlice, ValidAsZeroBits,
};

use super::dev_err;
use crate::backend::BackendError;

/// A pinned host buffer and a device buffer of `capacity` elements of `T`.
#[derive(Debug)]
pub(crate) struct Staging<T> {
    host: PinnedHostSlice<T>,
    dev: CudaSlice<T>,
    copied: CudaEvent,
}

impl<T: DeviceRepr + ValidAsZeroBits + Copy + Default> Staging<T> {
    /// Buffers of `capacity` elements (at least one) on `stream`'s device.
    pub fn new(stream: &Arc<CudaStream>, capacity: usize) -> Result<Staging<T>, BackendError> {
        let capacity = capacity.max(1);
        let ctx = stream.context();
        // SAFETY: the pinned memory is zero-filled below before anything reads it.
        let mut host = unsafe { ctx.alloc_pinned::<T>(capacity) }.map_err(dev_err)?;
        host.as_mut_slice().map_err(dev_err)?.fill(T::default());
        let dev = stream.alloc_zeros::<T>(capacity).map_err(dev_err)?;
        let copied = ctx.new_event(None).map_err(dev_err)?;
        Ok(Staging { host, dev, copied })
    }

    /// Elements each side holds.
    pub fn capacity(&self) -> usize {
        self.dev.len()
    }

    /// The host side, once the previous upload from it has been read by the device.
    pub fn host_mut(&mut self) -> Result<&mut [T], BackendError> {
        self.copied.synchronize().map_err(dev_err)?;
        self.host.as_mut_slice().map_err(dev_err)
    }

    /// Queue one copy of the first `len` host elements to the device.
    pub fn upload(&mut self, stream: &Arc<CudaStream>, len: usize) -> Result<(), BackendError> {
        if len == 0 {
            return Ok(());
        }
        if len > self.capacity() {
            return Err(BackendError::InvalidArgument(format!(
                "staging upload of {len} elements into {}",
                self.capacity()
            )));
        }
        let src = &self.host.as_mut_slice().map_err(dev_err)?[..len];
        let (dst, _sync) = self.dev.device_ptr_mut(stream);
        // SAFETY: `dst` holds capacity ≥ len elements (checked); `src` is pinned memory owned by
        // self, which outlives the copy: the event recorded below is waited on before the host
        // side is written again (`host_mut`) or freed (`Drop`).
        unsafe { cudarc::driver::result::memcpy_htod_async(dst, src, stream.cu_stream()) }
            .map_err(dev_err)?;
        self.copied.record(stream).map_err(dev_err)
    }

    /// The device side.
    pub fn dev(&self) -> &CudaSlice<T> {
        &self.dev
    }

    /// The device side, for ops that rewrite part of it after the upload (ordered after it by
    /// the stream).
    pub fn dev_mut(&mut self) -> &mut CudaSlice<T> {
        &mut self.dev
    }
}

impl<T> Drop for Staging<T> {
    fn drop(&mut self) {
        // A queued copy may still read the pinned memory: wait for it before it is freed.
        let _ = self.copied.synchronize();
    }
}
