//! Host-side views of checkpoint tensors, whatever file they came from.
//!
//! Loaders (`gguf`, `safetensors`) hand the model [`TensorView`]s through [`WeightSource`]:
//! names are Hugging Face checkpoint keys (`model.layers.0.self_attn.q_proj.weight`), shapes are
//! in Hugging Face order (`[out_features, in_features]`, row-major), and the bytes are the
//! stored encoding (possibly quantized blocks along the last axis), memory-mapped, not copied.
//!
//! A linear layer whose weight is split over several packed tensors (4-bit words, scales, zero
//! points, `g_idx`: compressed-tensors, AutoAWQ, GPTQ, NVFP4) is one [`packed::LinearView`],
//! handed out by [`WeightSource::linear`] and uploaded whole by the backend.

pub mod gguf_tiles;
pub mod packed;
pub mod packed_tiles;

use crate::error::ModelError;
pub use packed::{LinearView, PackedLinear, PackedScheme};

/// Element encodings of stored tensors. Quantized types pack `block_elems()` consecutive
/// elements of a row into `block_bytes()` bytes (ggml layouts). The integer and fp8 types are the
/// parts of packed linears ([`packed::PackedLinear`]: int32 words of 4-bit values, uint8 FP4
/// pairs, fp8 scales, int32 `g_idx`); they are never a matmul weight on their own
/// ([`WeightDType::is_weight`]).
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
    /// Little-endian i32 (packed 4-bit words, zero points, `g_idx`).
    I32,
    /// Little-endian i64 (compressed-tensors `weight_shape`).
    I64,
    /// u8 (NVFP4 nibble pairs).
    U8,
    /// i8.
    I8,
    /// OCP fp8 E4M3 (`float8_e4m3fn`: no infinities, 0x7F / 0xFF are NaN; NVFP4 block scales).
    F8E4M3,
}

impl WeightDType {
    /// Elements per block (1 for plain floats).
    pub fn block_elems(self) -> usize {
        match self {
            WeightDType::F32 | WeightDType::F16 | WeightDType::BF16 => 1,
            WeightDType::I32
            | WeightDType::I64
            | WeightDType::U8
            | WeightDType::I8
            | WeightDType::F8E4M3 => 1,
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
            WeightDType::I32 => 4,
            WeightDType::I64 => 8,
            WeightDType::U8 | WeightDType::I8 | WeightDType::F8E4M3 => 1,
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

    /// Whether this is a plain float type (F32, F16, BF16).
    pub fn is_float(self) -> bool {
        matches!(
            self,
            WeightDType::F32 | WeightDType::F16 | WeightDType::BF16
        )
    }

    /// Whether a tensor of this type can be a matmul weight or embedding table by itself
    /// (floats and ggml blocks); the integer and fp8 types are only parts of packed linears.
    pub fn is_weight(self) -> bool {
        self.is_float() || self.is_quantized()
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

/// What a tensor is without its bytes: encoding, shape and stored size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// Element encoding.
    pub dtype: WeightDType,
    /// Hugging Face order.
    pub shape: Vec<usize>,
    /// Stored bytes.
    pub bytes: usize,
}

impl TensorInfo {
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

    /// Encoding, shape and size of `name` without reading its bytes (sources that make
    /// tensors on demand, such as the synthetic one, override it to stay lazy).
    fn tensor_info(&self, name: &str) -> Result<TensorInfo, ModelError> {
        let t = self.tensor(name)?;
        Ok(TensorInfo {
            dtype: t.dtype,
            shape: t.shape.to_vec(),
            bytes: t.data.len(),
        })
    }

    /// The linear layer `module` (a module path such as `model.layers.0.mlp.down_proj`): by
    /// default the dense tensor `<module>.weight`. Sources that know the checkpoint's
    /// `quantization_config` return the packed parts of quantized modules instead.
    fn linear(&self, module: &str) -> Result<LinearView<'_>, ModelError> {
        Ok(LinearView::Dense(self.tensor(&format!("{module}.weight"))?))
    }
}
