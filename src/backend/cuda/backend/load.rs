//! Getting host data onto the device in the compute dtype: activations from host f32, and
//! stored tensors dequantized (GGUF Q8_0/Q4_0/Q4_1 by kernels on the GPU, every other encoding
//! exactly on the host; a tensor already stored in the compute dtype is copied as it is).

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};

use super::{dev_err, ComputeDType, CudaBackend, CudaBuffer, CudaWeight};
use crate::backend::BackendError;
use crate::quant::dequantize_row;
use crate::tensor::{TensorView, WeightDType};

impl CudaBackend {
    /// Host f32 values → a compute-dtype buffer.
    pub(super) fn upload_host_f32(&self, data: &[f32]) -> Result<CudaSlice<u8>, BackendError> {
        match self.dtype {
            ComputeDType::F32 => {
                let bytes: &[u8] = bytemuck::cast_slice(data);
                self.stream.clone_htod(bytes).map_err(dev_err)
            }
            ComputeDType::F16 => {
                let h: Vec<u16> = data
                    .iter()
                    .map(|&x| half::f16::from_f32(x).to_bits())
                    .collect();
                self.stream
                    .clone_htod(bytemuck::cast_slice::<u16, u8>(&h))
                    .map_err(dev_err)
            }
            ComputeDType::BF16 => {
                let h: Vec<u16> = data
                    .iter()
                    .map(|&x| half::bf16::from_f32(x).to_bits())
                    .collect();
                self.stream
                    .clone_htod(bytemuck::cast_slice::<u16, u8>(&h))
                    .map_err(dev_err)
            }
        }
    }

    /// Dequantize any stored tensor into a compute-dtype device buffer: Q8_0/Q4_0/Q4_1 on the GPU,
    /// everything else exactly on the host.
    pub(super) fn dequantize_to_device(
        &self,
        name: &str,
        view: &TensorView<'_>,
    ) -> Result<CudaSlice<u8>, BackendError> {
        let numel = view.numel();
        let kernel = match view.dtype {
            WeightDType::Q8_0 => Some(&self.k.dequant_q8_0),
            WeightDType::Q4_0 => Some(&self.k.dequant_q4_0),
            WeightDType::Q4_1 => Some(&self.k.dequant_q4_1),
            _ => None,
        };
        if let Some(f) = kernel {
            let raw = self.stream.clone_htod(view.data).map_err(dev_err)?;
            let mut out = self.alloc_bytes(numel * self.dtype.size())?;
            let n_blocks = (numel / 32) as i64;
            let mut b = self.stream.launch_builder(f);
            b.arg(&raw).arg(&mut out).arg(&n_blocks);
            // SAFETY: `raw` holds n_blocks whole blocks and `out` numel elements of the compute
            // dtype; the grid covers exactly n_blocks * 32 threads (extra ones return).
            unsafe { b.launch(LaunchConfig::for_num_elems(numel as u32)) }.map_err(dev_err)?;
            return Ok(out);
        }
        let cols = (*view.shape.last().unwrap_or(&1)).max(1);
        let row_bytes = view.dtype.row_bytes(cols).ok_or_else(|| {
            BackendError::InvalidArgument(format!("{name}: {cols} columns are not whole blocks"))
        })?;
        if view.data.len() != numel / cols * row_bytes {
            return Err(BackendError::InvalidArgument(format!(
                "{name}: {} bytes for shape {:?} of {:?}",
                view.data.len(),
                view.shape,
                view.dtype
            )));
        }
        // Stored already in the compute dtype: the bytes are the answer (the f32 round trip below
        // is exact for these pairs, so this changes no bit, only the load time: a dense bf16 27B is
        // ~27 G elements through one host thread otherwise).
        let same = matches!(
            (view.dtype, self.dtype),
            (WeightDType::F32, ComputeDType::F32)
                | (WeightDType::F16, ComputeDType::F16)
                | (WeightDType::BF16, ComputeDType::BF16)
        );
        if same {
            return self.stream.clone_htod(view.data).map_err(dev_err);
        }
        let mut host = vec![0f32; numel];
        for (r, chunk) in host.chunks_mut(cols).enumerate() {
            let bytes = &view.data[r * row_bytes..(r + 1) * row_bytes];
            dequantize_row(view.dtype, bytes, chunk);
        }
        self.upload_host_f32(&host)
    }
}

pub(super) fn download(
    be: &CudaBackend,
    src: &CudaBuffer,
    dst: &mut [f32],
) -> Result<(), BackendError> {
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
            be.stream.memcpy_dtoh(&src.data, bytes).map_err(dev_err)?;
        }
        dt => {
            let mut host = vec![0u16; src.len];
            be.stream
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
    be.stream.synchronize().map_err(dev_err)
}

pub(super) fn upload_weight(
    be: &CudaBackend,
    name: &str,
    view: &TensorView<'_>,
) -> Result<CudaWeight, BackendError> {
    let &[n, k] = view.shape else {
        return Err(BackendError::InvalidArgument(format!(
            "`{name}`: expected a 2-D weight, found shape {:?}",
            view.shape
        )));
    };
    if let Some(w) = be.upload_gguf(name, view)? {
        return Ok(w);
    }
    Ok(CudaWeight {
        data: be.dequantize_to_device(name, view)?,
        n,
        k,
        packed: None,
        gguf: None,
        swiglu_rows: false,
    })
}

pub(super) fn upload_vector(
    be: &CudaBackend,
    name: &str,
    view: &TensorView<'_>,
) -> Result<CudaBuffer, BackendError> {
    let &[n] = view.shape else {
        return Err(BackendError::InvalidArgument(format!(
            "`{name}`: expected a 1-D tensor, found shape {:?}",
            view.shape
        )));
    };
    Ok(CudaBuffer {
        data: be.dequantize_to_device(name, view)?,
        len: n,
        dtype: be.dtype,
    })
}
