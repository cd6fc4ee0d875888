//! Compute backends. `cpu` is always built and is the numerical reference; `cuda` sits behind
//! the `cuda` feature and must match `cpu` within named tolerances.
//!
//! Design (style-anchors §5): one [`Backend`] trait with associated types for everything that
//! lives on the device — activations ([`Backend::Buffer`]), stored weights
//! ([`Backend::Weight`]), the paged KV cache ([`Backend::KvCache`]), the RoPE table
//! ([`Backend::Rope`]) and the per-step metadata ([`Backend::Step`]). The model is generic over
//! it (`Llama<B: Backend>`), so every op is checked at compile time for every backend and no
//! per-op dispatch exists. `model::runner::build_runner` holds the only `match` that names a
//! concrete backend.
//!
//! The ops are coarse and fused on purpose, one method per kernel family, so that a CUDA
//! backend maps each to one launch (or a few):
//! - [`Backend::embedding`], [`Backend::rms_norm`], [`Backend::add_rms_norm`] (residual add
//!   fused with the next norm), [`Backend::rope`] (q and k in one call),
//!   [`Backend::matmul`] (straight on the stored weight format), [`Backend::write_kv`] +
//!   [`Backend::paged_attention`] (varlen prefill chunks and decodes in one call, over block
//!   tables), [`Backend::silu_mul`], [`Backend::add`], [`Backend::gather_rows`],
//!   [`Backend::copy_block`].
//! - The lm_head projection writes f32 logits ([`Backend::logits`], [`Backend::Logits`]) that
//!   stay on the device: [`Backend::sample`] turns rows into tokens there (penalties, logprobs,
//!   greedy or top-k / top-p / min-p draws, exactly as [`crate::sampling::sample_row`]),
//!   so only the sampled ids and requested logprobs reach the host; [`Backend::download_logits`]
//!   copies raw rows for the callers that want them (`kiln probe`, tests).
//! - All integer metadata of a step (token ids, positions, KV slots, block tables, which rows
//!   need logits) is uploaded once per step by [`Backend::prepare_step`] (or refilled into a
//!   step the runner keeps, [`Backend::update_step`]); ops read it from there, so a CUDA
//!   backend does one host→device copy per step.
//! - Fused forms for the llama family: [`Backend::upload_weight_rows`] stacks the q|k|v (and
//!   gate|up) weights into one, so one GEMM replaces three (two);
//!   [`Backend::qkv_rope_write`] takes the fused q|k|v rows through the per-head norm, RoPE and
//!   the KV write in one op, and [`Backend::swiglu`] the fused gate|up rows through SiLU·up.
//!   Each equals its unfused ops (the CPU backend composes them, as the reference).
//! - A runner keeps its activations, step metadata and logits for its life ([`Backend::alloc`]
//!   once, at the largest step, then [`Backend::update_step`] and [`Backend::logits_into`]),
//!   so every op takes buffers that may be longer than the rows it is given.
//!
//! Activations are in the backend's compute dtype (f32 on the CPU; bf16/fp16 on GPUs); only
//! [`Backend::upload`] and [`Backend::download`] convert to and from host f32.
//!
//! Hybrid models (Qwen3.5, Gated DeltaNet layers) need more: the extension trait
//! [`hybrid::HybridBackend`] adds a `StateCache` with one recurrent-state slot per sequence
//! (addressed by [`StepSeq::state_slot`]) and the GDN ops; the CPU and CUDA implement it.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod hybrid;
pub mod kv_dtype;
pub mod rope;

pub use cpu::CpuBackend;
pub use kv_dtype::KvCacheDType;
pub use rope::RopeSpec;

use crate::error::EngineError;
use crate::sampling::{SampleError, Sampled, SamplingRow};
use crate::tensor::{LinearView, TensorView};

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

/// Everything integer a step needs, in host memory; [`Backend::prepare_step`] copies it to the
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

/// Launch shapes a graph-replayed step keeps whatever its data ([`Backend::update_step_pinned`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PinnedShape {
    /// Context length the attention's work split is sized for (`max_model_len`): at least the
    /// longest context of any step refilled with it.
    pub max_context: usize,
}

/// A recorded sequence of ops ([`Backend::begin_capture`] .. [`Backend::end_capture`]) that
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

/// A compute device. Shapes are row-major; `rows` is the number of tokens unless stated.
/// Methods take `&self`: a backend is shared by the model's layers and its state (streams,
/// thread pool) is internal.
pub trait Backend: Send + Sync + Sized + 'static {
    /// Activations in the compute dtype, contiguous, with a fixed element count.
    type Buffer: Send + Sync;
    /// A stored 2-D weight `[out_features, in_features]` in its checkpoint encoding.
    type Weight: Send + Sync;
    /// The paged KV cache of all layers (see [`KvCacheSpec`]).
    type KvCache: Send;
    /// Precomputed RoPE cos/sin table (see [`rope`]).
    type Rope: Send + Sync;
    /// One step's integer metadata on the device (see [`StepInput`]).
    type Step: Send;
    /// f32 logits rows `[rows, vocab]` on the device, from [`Backend::logits`].
    type Logits: Send;
    /// Sampled tokens queued on the device and not yet read ([`Backend::sample_submit`]).
    type PendingSamples: Send + Sync;

    /// Short description for logs, e.g. `cpu (2 threads)` or `cuda:0 (sm_90)`.
    fn name(&self) -> String;

    /// A zero-filled buffer of `len` elements.
    fn alloc(&self, len: usize) -> Result<Self::Buffer, BackendError>;
    /// A zero-filled buffer of `len` f32 elements whatever the compute dtype: the model's
    /// residual stream, kept in f32 so 16-bit compute neither rounds nor (fp16) overflows the
    /// running sum over layers. Accepted as `out` of [`Backend::embedding`], `x` of
    /// [`Backend::rms_norm`], `residual` of [`Backend::add_rms_norm`] and by
    /// [`Backend::download`]; every other op takes compute-dtype buffers. The CPU computes in
    /// f32, so there it is [`Backend::alloc`].
    fn alloc_f32(&self, len: usize) -> Result<Self::Buffer, BackendError>;
    /// A buffer holding `data` (converted to the compute dtype).
    fn upload(&self, data: &[f32]) -> Result<Self::Buffer, BackendError>;
    /// Copy all of `src` to host f32; `dst.len()` must equal the buffer's length.
    fn download(&self, src: &Self::Buffer, dst: &mut [f32]) -> Result<(), BackendError>;
    /// Upload a 2-D weight as stored (quantized blocks stay quantized). `name` is for errors.
    fn upload_weight(
        &self,
        name: &str,
        view: &TensorView<'_>,
    ) -> Result<Self::Weight, BackendError>;
    /// Upload a linear layer's weight: a dense one as [`Backend::upload_weight`], a packed
    /// 4-bit one ([`crate::tensor::PackedLinear`]) with its parts kept packed. The default
    /// refuses packed weights with `Unsupported` (a backend without dequantizing kernels).
    fn upload_linear(
        &self,
        name: &str,
        linear: &LinearView<'_>,
    ) -> Result<Self::Weight, BackendError> {
        match linear {
            LinearView::Dense(view) => self.upload_weight(name, view),
            LinearView::Packed(p) => Err(BackendError::Unsupported(format!(
                "`{name}`: {} weights on {} (no dequantizing kernel for them yet)",
                p.scheme,
                self.name()
            ))),
        }
    }
    /// Upload 2-D weights of the same width `k` as ONE weight `[Σ nᵢ, k]` whose rows are theirs
    /// stacked in order: the fused q|k|v and gate|up projections (one GEMM instead of several;
    /// output column `j` of the stack is output column `j − Σ_{i<p} nᵢ` of part `p`). The default
    /// concatenates the stored rows on the host, exact for the encodings whose rows are stored
    /// one after another (dense floats and the ggml block formats); any other encoding, or parts
    /// of different encodings, is `Err(Unsupported)`, and the caller keeps the weights apart.
    fn upload_weight_rows(
        &self,
        name: &str,
        parts: &[TensorView<'_>],
    ) -> Result<Self::Weight, BackendError> {
        let (bytes, shape, dtype) = concat_rows(name, parts)?;
        self.upload_weight(
            name,
            &TensorView {
                dtype,
                shape: &shape,
                data: &bytes,
            },
        )
    }
    /// Upload a layer's gate and up projections (`parts` = [gate, up], `[inter, k]` each) as
    /// one weight for [`Backend::gate_up_swiglu`] only (a backend may store the rows in its own
    /// order, so the weight is not for [`Backend::matmul`]). The default is
    /// [`Backend::upload_weight_rows`] (gate rows, then up rows).
    fn upload_gate_up(
        &self,
        name: &str,
        parts: &[TensorView<'_>; 2],
    ) -> Result<Self::Weight, BackendError> {
        self.upload_weight_rows(name, parts)
    }
    /// Bytes `w` occupies on the device.
    fn weight_bytes(&self, w: &Self::Weight) -> usize;
    /// Upload a 1-D parameter (norm weights), dequantized exactly to the compute dtype.
    fn upload_vector(
        &self,
        name: &str,
        view: &TensorView<'_>,
    ) -> Result<Self::Buffer, BackendError>;
    /// Allocate a zeroed KV cache.
    fn create_kv_cache(&self, spec: &KvCacheSpec) -> Result<Self::KvCache, BackendError>;
    /// Bytes one KV block takes (all layers, K and V), for sizing the cache from a budget.
    fn kv_bytes_per_block(&self, spec: &KvCacheSpec) -> usize;
    /// Build the RoPE table for `spec` (computed on the host by [`rope::cos_sin_table`]).
    fn create_rope(&self, spec: &RopeSpec) -> Result<Self::Rope, BackendError>;
    /// Copy a step's metadata to the device.
    fn prepare_step(&self, step: &StepInput) -> Result<Self::Step, BackendError>;
    /// Refill `step` (made by [`Backend::prepare_step`]) with `input`, reusing its buffers where
    /// they are large enough: a runner keeps one step for its life, so a GPU step allocates
    /// nothing and its metadata keeps its device addresses. The default makes a new one.
    fn update_step(&self, step: &mut Self::Step, input: &StepInput) -> Result<(), BackendError> {
        *step = self.prepare_step(input)?;
        Ok(())
    }
    /// [`Backend::update_step`] for a step that a captured graph replays ([`Backend::begin_capture`]):
    /// the launch shapes that would otherwise follow the data are pinned by `shape` (the split-K
    /// attention's part count follows `shape.max_context`, not the step's longest context), so
    /// every refill with the same number of tokens, sequences and block-table width launches the
    /// same grids. Results equal [`Backend::update_step`]'s bit for bit. The default is
    /// [`Backend::update_step`] (a backend without graphs has no shapes to pin).
    fn update_step_pinned(
        &self,
        step: &mut Self::Step,
        input: &StepInput,
        shape: &PinnedShape,
    ) -> Result<(), BackendError> {
        let _ = shape;
        self.update_step(step, input)
    }
    /// Whether [`Backend::begin_capture`] can work here (CUDA: yes; the CPU: no).
    fn supports_graphs(&self) -> bool {
        false
    }
    /// Start recording the ops queued from now on into a graph instead of running them, until
    /// [`Backend::end_capture`] (which must follow, also when an op in between failed). Ops
    /// recorded must obey the capture rules in docs/architecture.md: no allocation, no host
    /// synchronization, no host reads of device data, fixed device pointers.
    fn begin_capture(&self) -> Result<(), BackendError> {
        Err(BackendError::Unsupported(format!(
            "graph capture on {}",
            self.name()
        )))
    }
    /// Stop recording and instantiate what was recorded since [`Backend::begin_capture`].
    fn end_capture(&self) -> Result<Box<dyn StepGraph>, BackendError> {
        Err(BackendError::Unsupported(format!(
            "graph capture on {}",
            self.name()
        )))
    }
    /// Wait for queued work (a no-op on the CPU).
    fn synchronize(&self) -> Result<(), BackendError>;
    /// Run `f`, one step's worth of ops, in the backend's execution context: on the CPU inside
    /// its thread pool, so each op's parallel loop starts without a hand-off between threads;
    /// on a GPU with the device context bound to the calling thread.
    /// The default runs `f` on the calling thread.
    fn run_step<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        f()
    }

    /// `out[t, :] = table[token_ids[t], :]`, dequantized; `table`: `[vocab, hidden]`,
    /// `out`: `[num_tokens, hidden]` (compute dtype or [`Backend::alloc_f32`]).
    fn embedding(
        &self,
        table: &Self::Weight,
        step: &Self::Step,
        out: &mut Self::Buffer,
    ) -> Result<(), BackendError>;

    /// `out[r, :] = x[r, :] / sqrt(mean(x[r, :]²) + eps) * weight`; `x`, `out`: `[rows, dim]`,
    /// `weight`: `[dim]`. Used for the per-head q/k norms too (`rows = tokens × heads`).
    /// `x` may be an f32 buffer ([`Backend::alloc_f32`]); `out` is in the compute dtype.
    fn rms_norm(
        &self,
        x: &Self::Buffer,
        weight: &Self::Buffer,
        out: &mut Self::Buffer,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<(), BackendError>;

    /// Fused residual add and norm: `residual += delta`, then `out = rms_norm(residual)`.
    /// All `[rows, dim]`; `residual` may be an f32 buffer ([`Backend::alloc_f32`]).
    fn add_rms_norm(
        &self,
        residual: &mut Self::Buffer,
        delta: &Self::Buffer,
        weight: &Self::Buffer,
        out: &mut Self::Buffer,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<(), BackendError>;

    /// `out[r, n] = Σ_k x[r, k] · w[n, k]`; `x`: `[rows, k]`, `w`: `[n, k]` as stored,
    /// `out`: `[rows, n]`.
    fn matmul(
        &self,
        x: &Self::Buffer,
        rows: usize,
        w: &Self::Weight,
        out: &mut Self::Buffer,
    ) -> Result<(), BackendError>;

    /// Rotate q (`[num_tokens, num_heads, head_dim]`) and k (`[num_tokens, num_kv_heads,
    /// head_dim]`) in place at each token's position, NeoX "rotate_half" style over the first
    /// `rope.rotary_dim` dims of every head.
    fn rope(
        &self,
        q: &mut Self::Buffer,
        k: &mut Self::Buffer,
        rope: &Self::Rope,
        step: &Self::Step,
        num_heads: usize,
        num_kv_heads: usize,
        head_dim: usize,
    ) -> Result<(), BackendError>;

    /// Store each new token's k and v (`[num_tokens, num_kv_heads, head_dim]`) in its KV slot
    /// of layer `layer`.
    fn write_kv(
        &self,
        cache: &mut Self::KvCache,
        layer: usize,
        k: &Self::Buffer,
        v: &Self::Buffer,
        step: &Self::Step,
    ) -> Result<(), BackendError>;

    /// Causal GQA attention over the paged cache of layer `layer` (after [`Backend::write_kv`]
    /// of this step): each new token at position `p` attends to its sequence's positions
    /// `0..=p`. Prefill chunks and decodes mix freely. `q`, `out`:
    /// `[num_tokens, num_heads, head_dim]`.
    fn paged_attention(
        &self,
        q: &Self::Buffer,
        cache: &Self::KvCache,
        layer: usize,
        step: &Self::Step,
        params: &AttentionParams,
        out: &mut Self::Buffer,
    ) -> Result<(), BackendError>;

    /// `out = silu(gate) * up`, elementwise over `len` elements.
    fn silu_mul(
        &self,
        gate: &Self::Buffer,
        up: &Self::Buffer,
        out: &mut Self::Buffer,
        len: usize,
    ) -> Result<(), BackendError>;

    /// `x += y` over `len` elements.
    fn add(&self, x: &mut Self::Buffer, y: &Self::Buffer, len: usize) -> Result<(), BackendError>;

    /// `out[i, :] = x[step.logit_rows[i], :]`; `x`: `[num_tokens, dim]`,
    /// `out`: `[logit_rows, dim]`.
    fn gather_rows(
        &self,
        x: &Self::Buffer,
        step: &Self::Step,
        dim: usize,
        out: &mut Self::Buffer,
    ) -> Result<(), BackendError>;

    /// The lm_head projection in f32: `logits[r, n] = Σ_k x[r, k] · w[n, k]` with `x`:
    /// `[rows, k]` in the compute dtype, `w`: `[n = vocab, k]` as stored; the products are
    /// accumulated and written in f32 (never rounded to a 16-bit compute dtype).
    fn logits(
        &self,
        x: &Self::Buffer,
        rows: usize,
        w: &Self::Weight,
    ) -> Result<Self::Logits, BackendError>;

    /// Zeroed f32 logits of `rows` rows of `vocab`, to be filled by [`Backend::logits_into`].
    fn alloc_logits(&self, rows: usize, vocab: usize) -> Result<Self::Logits, BackendError>;

    /// [`Backend::logits`] into `out` (from [`Backend::alloc_logits`], holding at least
    /// `rows × w.rows` values), which then holds `rows` rows: no allocation.
    fn logits_into(
        &self,
        x: &Self::Buffer,
        rows: usize,
        w: &Self::Weight,
        out: &mut Self::Logits,
    ) -> Result<(), BackendError>;

    /// One layer's attention input from the fused q|k|v projection, in one op: `qkv` is
    /// `[num_tokens, (num_heads + 2·num_kv_heads)·head_dim]` (q heads, then k heads, then v
    /// heads); q and k are RMS-normed per head when `qk_norm = Some((q_norm, k_norm, eps))`
    /// (each `[head_dim]`, Qwen3), both are rotated as [`Backend::rope`] does, q is written to
    /// `q_out` (`[num_tokens, num_heads, head_dim]`) and k, v to each token's KV slot of layer
    /// `layer` as [`Backend::write_kv`] does. Equals [`Backend::rms_norm`] ×2 (when normed),
    /// [`Backend::rope`] and [`Backend::write_kv`] on the split rows, with the same roundings.
    #[allow(clippy::too_many_arguments)]
    fn qkv_rope_write(
        &self,
        qkv: &Self::Buffer,
        q_out: &mut Self::Buffer,
        cache: &mut Self::KvCache,
        layer: usize,
        rope: &Self::Rope,
        step: &Self::Step,
        params: &AttentionParams,
        qk_norm: Option<(&Self::Buffer, &Self::Buffer, f32)>,
    ) -> Result<(), BackendError>;

    /// `out[r, i] = silu(gate_up[r, i]) · gate_up[r, inter + i]`: the fused gate|up
    /// projection's product; `gate_up`: `[rows, 2·inter]`, `out`: `[rows, inter]`. Equals
    /// [`Backend::silu_mul`] on the two halves.
    fn swiglu(
        &self,
        gate_up: &Self::Buffer,
        out: &mut Self::Buffer,
        rows: usize,
        inter: usize,
    ) -> Result<(), BackendError>;

    /// `out[r, i] = silu(g) · u` of `x · wᵀ` for a weight from [`Backend::upload_gate_up`]:
    /// the MLP's gate|up projection and its SwiGLU in one call; `x`: `[rows, k]`, `out`:
    /// `[rows, inter]`, `scratch`: `[rows, 2·inter]` (used by the unfused form). The default (the
    /// CPU twin of every fused form) is [`Backend::matmul`] into `scratch`, then
    /// [`Backend::swiglu`]; a fused form must give the same values (gate and up rounded to the
    /// compute dtype before the product, as the unfused matmul's output is).
    fn gate_up_swiglu(
        &self,
        x: &Self::Buffer,
        rows: usize,
        w: &Self::Weight,
        scratch: &mut Self::Buffer,
        out: &mut Self::Buffer,
        inter: usize,
    ) -> Result<(), BackendError> {
        self.matmul(x, rows, w, scratch)?;
        self.swiglu(scratch, out, rows, inter)
    }

    /// Largest step (tokens) for which a runner should run a layer with weights `ws` through the
    /// fused decode ops ([`Backend::norm_matmul`], [`Backend::norm_gate_up_swiglu`],
    /// [`Backend::matmul_residual`]); 0 (the default): never, the unfused ops run. A backend
    /// says more than 0 only where the fused forms are one kernel each.
    fn fused_decode_rows(&self, ws: &[&Self::Weight]) -> usize {
        let _ = ws;
        0
    }

    /// `out = rms_norm(x) · w ᵀ` with the norm folded into the matmul: `x` the f32 residual stream
    /// `[rows, dim]` ([`Backend::alloc_f32`]), `weight` `[dim]`, `out` `[rows, n]`, `h` `[rows,
    /// dim]` scratch of the unfused form. The default (the CPU twin) is [`Backend::rms_norm`] into
    /// `h`, then [`Backend::matmul`]; a fused form may sum a row's squares in another fixed order
    /// (so h may differ in the last bit), nothing else.
    #[allow(clippy::too_many_arguments)]
    fn norm_matmul(
        &self,
        x: &Self::Buffer,
        weight: &Self::Buffer,
        eps: f32,
        rows: usize,
        dim: usize,
        w: &Self::Weight,
        h: &mut Self::Buffer,
        out: &mut Self::Buffer,
    ) -> Result<(), BackendError> {
        self.rms_norm(x, weight, h, rows, dim, eps)?;
        self.matmul(h, rows, w, out)
    }

    /// [`Backend::norm_matmul`] for the q|k|v weight of a layer without per-head q/k norms, then
    /// [`Backend::qkv_rope_write`] on its product: RoPE, q into `q_out`, k and v into layer
    /// `layer` of the cache, in one op. `h` `[rows, dim]` and `qkv` `[rows, (heads + 2·kv_heads)
    /// · head_dim]` are the unfused form's buffers (a fused form need not write them). The default
    /// (the CPU twin): [`Backend::norm_matmul`] into `qkv`, then [`Backend::qkv_rope_write`]; a
    /// fused form gives the same values (the q|k|v product rounded to the compute dtype before
    /// the rotation, the same rotation products), but for the norm's sums of squares as
    /// [`Backend::norm_matmul`] allows.
    #[allow(clippy::too_many_arguments)]
    fn norm_matmul_rope_write(
        &self,
        x: &Self::Buffer,
        weight: &Self::Buffer,
        eps: f32,
        rows: usize,
        dim: usize,
        w: &Self::Weight,
        h: &mut Self::Buffer,
        qkv: &mut Self::Buffer,
        q_out: &mut Self::Buffer,
        cache: &mut Self::KvCache,
        layer: usize,
        rope: &Self::Rope,
        step: &Self::Step,
        params: &AttentionParams,
    ) -> Result<(), BackendError> {
        self.norm_matmul(x, weight, eps, rows, dim, w, h, qkv)?;
        self.qkv_rope_write(qkv, q_out, cache, layer, rope, step, params, None)
    }

    /// [`Backend::norm_matmul`] for the gate|up weight of [`Backend::upload_gate_up`], then its
    /// SwiGLU as [`Backend::gate_up_swiglu`]: `out` `[rows, inter]`, `h` and `scratch` the
    /// unfused form's buffers. The default: [`Backend::rms_norm`] into `h`, then
    /// [`Backend::gate_up_swiglu`].
    #[allow(clippy::too_many_arguments)]
    fn norm_gate_up_swiglu(
        &self,
        x: &Self::Buffer,
        weight: &Self::Buffer,
        eps: f32,
        rows: usize,
        dim: usize,
        w: &Self::Weight,
        h: &mut Self::Buffer,
        scratch: &mut Self::Buffer,
        out: &mut Self::Buffer,
        inter: usize,
    ) -> Result<(), BackendError> {
        self.rms_norm(x, weight, h, rows, dim, eps)?;
        self.gate_up_swiglu(h, rows, w, scratch, out, inter)
    }

    /// `residual += x · wᵀ` (the product rounded to the compute dtype, then added in the
    /// residual's f32): `x` `[rows, k]`, `residual` `[rows, n]` ([`Backend::alloc_f32`]), `delta`
    /// `[rows, n]` scratch of the unfused form. The default (the CPU twin): [`Backend::matmul`]
    /// into `delta`, then [`Backend::add`] — the residual half of [`Backend::add_rms_norm`].
    fn matmul_residual(
        &self,
        x: &Self::Buffer,
        rows: usize,
        w: &Self::Weight,
        delta: &mut Self::Buffer,
        residual: &mut Self::Buffer,
        n: usize,
    ) -> Result<(), BackendError> {
        self.matmul(x, rows, w, delta)?;
        self.add(residual, delta, rows * n)
    }

    /// Copy rows `first_row ..` of `logits` into `dst` (a whole number of `[vocab]` rows).
    fn download_logits(
        &self,
        logits: &Self::Logits,
        first_row: usize,
        dst: &mut [f32],
    ) -> Result<(), BackendError>;

    /// Sample one token per `(row, descriptor)`: the result of
    /// [`crate::sampling::sample_row`] on logits row `row`, bit for bit (same token,
    /// logprobs within float rounding). `logits` is not modified. One result per entry, in order.
    fn sample(
        &self,
        logits: &Self::Logits,
        rows: &[(usize, &SamplingRow)],
    ) -> Result<Vec<Result<Sampled, SampleError>>, BackendError>;

    /// Queue [`Backend::sample`] without waiting for its answer: the ids (and requested
    /// logprobs) are read back by [`Backend::sample_collect`], and a later step's tokens can be
    /// taken from them on the device ([`Backend::feed_tokens`]). Backends that compute at once
    /// (the CPU) hold the finished answer.
    fn sample_submit(
        &self,
        logits: &Self::Logits,
        rows: &[(usize, &SamplingRow)],
    ) -> Result<Self::PendingSamples, BackendError>;

    /// Wait for a [`Backend::sample_submit`]'s answer: one result per row, in order. Pending
    /// samples are collected in the order they were submitted; at most two are pending.
    fn sample_collect(
        &self,
        pending: Self::PendingSamples,
    ) -> Result<Vec<Result<Sampled, SampleError>>, BackendError>;

    /// Whether [`Backend::sample_submit`] returns before the device has computed the step (so
    /// a runner can queue steps: [`Backend::feed_tokens`] works).
    fn queues_steps(&self) -> bool {
        false
    }

    /// Overwrite, on the device, token `t` of `step` with the id that the pending sampling call
    /// `from` samples for its row `r`, for each `(t, r)` in `feeds` (a row that failed gives
    /// token 0), ordered after `from`'s kernels and before the ops that read `step`.
    fn feed_tokens(
        &self,
        step: &mut Self::Step,
        from: &Self::PendingSamples,
        feeds: &[(u32, u32)],
    ) -> Result<(), BackendError> {
        let _ = (step, from);
        if feeds.is_empty() {
            return Ok(());
        }
        Err(BackendError::Unsupported(format!(
            "tokens fed on the device ({})",
            self.name()
        )))
    }

    /// Copy block `src` into block `dst`, K and V, all layers.
    fn copy_block(&self, cache: &mut Self::KvCache, src: u32, dst: u32)
        -> Result<(), BackendError>;
}

/// The stored rows of `parts` (2-D, one encoding, one width) one after another: the bytes, shape
/// `[Σ nᵢ, k]` and encoding of their stack, for [`Backend::upload_weight_rows`]. Only for the
/// encodings whose rows are stored independently and in order (dense floats, ggml blocks).
pub fn concat_rows(
    name: &str,
    parts: &[TensorView<'_>],
) -> Result<(Vec<u8>, [usize; 2], crate::tensor::WeightDType), BackendError> {
    use crate::tensor::WeightDType as D;
    let bad = |m: String| BackendError::InvalidArgument(format!("`{name}`: {m}"));
    let first = parts
        .first()
        .ok_or_else(|| bad("no weights to stack".into()))?;
    let &[_, k] = first.shape else {
        return Err(bad(format!(
            "expected 2-D weights, found {:?}",
            first.shape
        )));
    };
    match first.dtype {
        D::F32 | D::F16 | D::BF16 | D::Q8_0 | D::Q4_0 | D::Q4_1 | D::Q4K | D::Q6K => {}
        #[allow(unreachable_patterns)]
        other => {
            return Err(BackendError::Unsupported(format!(
                "`{name}`: stacking {other:?} weights"
            )))
        }
    }
    let row_bytes = first.dtype.row_bytes(k).ok_or_else(|| {
        bad(format!(
            "{k} columns are not whole {:?} blocks",
            first.dtype
        ))
    })?;
    let mut rows = 0;
    let mut bytes = Vec::new();
    for p in parts {
        let &[n, pk] = p.shape else {
            return Err(bad(format!("expected 2-D weights, found {:?}", p.shape)));
        };
        if p.dtype != first.dtype {
            // Mixed encodings (a Q4_K_M file's Q6_K attn_v under Q4_K q / k): not one weight;
            // the caller keeps the parts apart.
            return Err(BackendError::Unsupported(format!(
                "`{name}`: stacking {:?} under {:?}",
                p.dtype, first.dtype
            )));
        }
        if pk != k || p.data.len() != n * row_bytes {
            return Err(bad(format!(
                "cannot stack {:?} {:?} ({} bytes) under {:?} {:?}",
                p.dtype,
                p.shape,
                p.data.len(),
                first.dtype,
                first.shape
            )));
        }
        bytes.extend_from_slice(p.data);
        rows += n;
    }
    Ok((bytes, [rows, k], first.dtype))
}
