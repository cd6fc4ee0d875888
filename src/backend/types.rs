//! The plain types of the backend interface (re-exported from [`crate::backend`]): the error
//! every backend call returns ([`BackendError`]), the paged KV cache's geometry
//! ([`KvCacheSpec`]), one attention call's shapes ([`AttentionParams`]), a step's integer
//! metadata in host memory ([`StepInput`], [`StepSeq`], [`PinnedShape`]) and a captured step
//! ([`StepGraph`]).

use crate::error::EngineError;

/// Why a backend call failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BackendError {
    /// Device or host memory could not be allocated.
    #[error("out of memory: {0}")]
    OutOfMemory(String),
    /// Arguments that do not fit together (lengths, shapes, indices); a bug in the caller.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A weight format or feature this backend does not implement.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The device reported an error (driver, launch, compile).
    #[error("device error: {0}")]
    Device(String),
}

impl From<BackendError> for EngineError {
    fn from(e: BackendError) -> Self {
        match e {
            BackendError::OutOfMemory(m) => EngineError::Oom(m),
            other => EngineError::Internal(other.to_string()),
        }
    }
}

/// Geometry of a paged KV cache: per layer, K and V each hold `num_blocks × block_size`
/// token slots of `[num_kv_heads, head_dim]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvCacheSpec {
    /// Decoder layers with attention.
    pub num_layers: usize,
    /// Physical blocks.
    pub num_blocks: usize,
    /// Tokens per block.
    pub block_size: usize,
    /// Key/value heads.
    pub num_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
}

impl KvCacheSpec {
    /// Elements of K (or of V) in one token slot of one layer.
    pub fn slot_elems(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// Bytes one block takes over all layers, K and V, at `elem_bytes` per element.
    pub fn bytes_per_block(&self, elem_bytes: usize) -> usize {
        2 * self.num_layers * self.block_size * self.slot_elems() * elem_bytes
    }
}

/// Shapes of one attention call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionParams {
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads; `num_heads` is a multiple of it (GQA).
    pub num_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Factor on `q·k` before the softmax (`head_dim^-0.5` for llama).
    pub scale: f32,
}

impl AttentionParams {
    /// `Err(InvalidArgument)` unless these shapes fit `spec` (same KV heads and head width, a
    /// whole number of query heads per KV head) and `layer` is one of its layers.
    pub fn check_fits(&self, spec: &KvCacheSpec, layer: usize) -> Result<(), BackendError> {
        if layer >= spec.num_layers
            || self.num_kv_heads != spec.num_kv_heads
            || self.head_dim != spec.head_dim
            || self.num_kv_heads == 0
            || !self.num_heads.is_multiple_of(self.num_kv_heads)
        {
            return Err(BackendError::InvalidArgument(format!(
                "attention {self:?} on layer {layer} does not fit the cache {spec:?}"
            )));
        }
        Ok(())
    }
}

/// One sequence of a step, in host memory.
#[derive(Debug, Clone, PartialEq)]
pub struct StepSeq {
    /// Index of its first new token in [`StepInput::token_ids`].
    pub token_start: usize,
    /// New tokens this step.
    pub len: usize,
    /// Tokens already in the KV cache; the new ones take positions `cached_len..cached_len+len`.
    pub cached_len: usize,
    /// Physical KV blocks in order; covers `cached_len + len` tokens.
    pub block_table: Vec<u32>,
    /// Recurrent-state slot (hybrid models); `None` for pure attention models.
    pub state_slot: Option<u32>,
}

impl StepSeq {
    /// Tokens this sequence attends over after the step (`cached_len + len`).
    pub fn context_len(&self) -> usize {
        self.cached_len + self.len
    }
}

/// Everything integer a step needs, in host memory; [`Backend::prepare_step`](super::Backend::prepare_step) copies it to the
/// device. Built from a `ForwardBatch` by `ForwardBatch::step_input` (in `model::step`), which checks it.
#[derive(Debug, Clone, PartialEq)]
pub struct StepInput {
    /// New tokens of all sequences: `[num_tokens]`.
    pub token_ids: Vec<u32>,
    /// Absolute position of each new token: `[num_tokens]`.
    pub positions: Vec<u32>,
    /// KV slot of each new token, `block * block_size + offset`: `[num_tokens]`.
    pub slot_mapping: Vec<u32>,
    /// Per-sequence layout.
    pub seqs: Vec<StepSeq>,
    /// Token indices whose logits are returned, in output order.
    pub logit_rows: Vec<u32>,
    /// Tokens per KV block.
    pub block_size: usize,
}

impl StepInput {
    /// Number of new tokens.
    pub fn num_tokens(&self) -> usize {
        self.token_ids.len()
    }
}

/// Launch shapes a graph-replayed step keeps whatever its data ([`Backend::update_step_pinned`](super::Backend::update_step_pinned)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PinnedShape {
    /// Context length the attention's work split is sized for (`max_model_len`): at least the
    /// longest context of any step refilled with it.
    pub max_context: usize,
}

/// A recorded sequence of ops ([`Backend::begin_capture`](super::Backend::begin_capture) .. [`Backend::end_capture`](super::Backend::end_capture)) that
/// replays them on the device with the same pointers and shapes, reading whatever those
/// buffers hold at replay time.
pub trait StepGraph: Send {
    /// Queue one replay (asynchronous, like the ops it recorded).
    fn replay(&self) -> Result<(), BackendError>;
    /// Device bytes the instantiated graph took (measured around its instantiation).
    fn device_bytes(&self) -> usize;
    /// Ops (graph nodes) it holds.
    fn nodes(&self) -> usize;
}
