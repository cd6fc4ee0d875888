//! Host-side views of checkpoint tensors, whatever file they came from.
//!
//! Loaders (`gguf`, `safetensors`) hand the model [`TensorView`]s through [`WeightSource`]:
//! names are Hugging Face checkpoint keys (`model.layers.0.self_attn.q_proj.weight`), shapes are
//! in Hugging Face order (`[out_features, in_features]`, row-major), and the bytes are the
//! stored encoding (possibly quantized blocks along the last axis), memory-mapped, not copied.

use crate::error::ModelError;

/// Element encodings of stored weights. Quantized types pack `block_elems()` consecutive
/// elements of a row into `block_bytes()` bytes (ggml layouts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightDType {
    /// IEEE f32.
    F32,
    /// IEEE f16.
    F16,
    /// bfloat16.
    BF16,
    /// ggml Q8_0: 32 elements = f16 scale + 32 × i8.
    Q8_0,
    /// ggml Q4_0: 32 elements = f16 scale + 16 bytes of 4-bit values (offset 8).
    Q4_0,
    /// ggml Q4_1: 32 elements = f16 scale + f16 min + 16 bytes of 4-bit values.
    Q4_1,
    /// ggml Q4_K: 256-element super-blocks, 144 bytes.
    Q4K,
    /// ggml Q6_K: 256-element super-blocks, 210 bytes.
    Q6K,
}

impl WeightDType {
    /// Elements per block (1 for plain floats).
    pub fn block_elems(self) -> usize {
        match self {
            WeightDType::F32 | WeightDType::F16 | WeightDType::BF16 => 1,
            WeightDType::Q8_0 | WeightDType::Q4_0 | WeightDType::Q4_1 => 32,
            WeightDType::Q4K | WeightDType::Q6K => 256,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            WeightDType::F32 => 4,
            WeightDType::F16 | WeightDType::BF16 => 2,
            WeightDType::Q8_0 => 34,
            WeightDType::Q4_0 => 18,
            WeightDType::Q4_1 => 20,
            WeightDType::Q4K => 144,
            WeightDType::Q6K => 210,
        }
    }

    /// Bytes of a row of `n` elements; `None` when `n` is not a whole number of blocks.
    pub fn row_bytes(self, n: usize) -> Option<usize> {
        n.is_multiple_of(self.block_elems())
            .then(|| n / self.block_elems() * self.block_bytes())
    }

    /// Whether this is a block-quantized type.
    pub fn is_quantized(self) -> bool {
        self.block_elems() > 1
    }
}

/// A borrowed tensor: stored bytes plus how to read them.
#[derive(Debug, Clone, Copy)]
pub struct TensorView<'a> {
    /// Element encoding.
    pub dtype: WeightDType,
    /// Hugging Face order; the last axis is contiguous.
    pub shape: &'a [usize],
    /// Raw stored bytes (`rows × row_bytes(shape.last())`).
    pub data: &'a [u8],
}

impl TensorView<'_> {
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// Anything that can hand out tensors by Hugging Face checkpoint key.
pub trait WeightSource: Send + Sync {
    /// The tensor stored under `name`, or `ModelError::MissingTensor`.
    fn tensor(&self, name: &str) -> Result<TensorView<'_>, ModelError>;
    /// Whether `name` exists (for optional tensors such as `lm_head.weight`).
    fn contains(&self, name: &str) -> bool;
    /// Every tensor name, sorted.
    fn names(&self) -> Vec<String>;
}
