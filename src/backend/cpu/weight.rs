//! [`CpuWeight`]: a weight as the CPU backend holds it, in its stored encoding.

use super::matmul;
use crate::tensor::{PackedLinear, TensorView, WeightDType};

/// A stored weight in host memory: the checkpoint's bytes, copied into a 64-byte aligned
/// buffer backed by huge pages ([`matmul::HugePageBytes`]: batch-1 decoding streams every
/// weight per token, and 4 KiB pages cost it ~3× on VMs); quantized blocks stay quantized,
/// nothing is expanded to f32.
/// A packed 4-bit linear keeps its parts instead ([`matmul::packed::PackedWeight`]; then
/// `dtype` is its packed words' type and `bytes` is empty).
#[derive(Debug, Clone)]
pub struct CpuWeight {
    /// Element encoding.
    pub dtype: WeightDType,
    /// `[rows, cols]` (Hugging Face order; the last axis is contiguous).
    pub shape: Vec<usize>,
    pub(super) bytes: matmul::HugePageBytes,
    /// The parts of a packed linear.
    pub(super) packed: Option<std::sync::Arc<matmul::packed::PackedWeight>>,
}

impl CpuWeight {
    /// Take `bytes` (`rows × row_bytes(cols)`) of a `dtype` tensor of `shape`.
    pub fn new(dtype: WeightDType, shape: Vec<usize>, bytes: Vec<u8>) -> CpuWeight {
        CpuWeight {
            dtype,
            shape,
            bytes: matmul::HugePageBytes::copy_from(&bytes),
            packed: None,
        }
    }

    /// A packed linear, its parts copied as stored.
    pub fn packed(p: &PackedLinear<'_>) -> CpuWeight {
        CpuWeight {
            dtype: p.qweight.dtype,
            shape: vec![p.out_features, p.in_features],
            bytes: matmul::HugePageBytes::copy_from(&[]),
            packed: Some(std::sync::Arc::new(
                matmul::packed::PackedWeight::copy_from(p),
            )),
        }
    }

    /// The parts, when this is a packed linear.
    pub fn packed_parts(&self) -> Option<&matmul::packed::PackedWeight> {
        self.packed.as_deref()
    }

    /// An F32 weight from values (tests and small synthetic models).
    pub fn from_f32(shape: &[usize], values: &[f32]) -> CpuWeight {
        CpuWeight::new(
            WeightDType::F32,
            shape.to_vec(),
            bytemuck::cast_slice(values).to_vec(),
        )
    }

    /// The stored bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.bytes.len() / self.shape[0].max(1)
    }

    /// A borrowed view, as the fast matmul kernels take it.
    pub fn view(&self) -> TensorView<'_> {
        TensorView {
            dtype: self.dtype,
            shape: &self.shape,
            data: self.bytes(),
        }
    }
}
