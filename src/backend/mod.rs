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

mod concat;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod hybrid;
pub mod kv_dtype;
pub mod rope;
mod types;

pub use concat::concat_rows;
pub use cpu::CpuBackend;
pub use kv_dtype::KvCacheDType;
pub use rope::RopeSpec;
pub use types::{
    AttentionParams, BackendError, KvCacheSpec, PinnedShape, StepGraph, StepInput, StepSeq,
};

use crate::sampling::{SampleError, Sampled, SamplingRow};
use crate::tensor::{LinearView, TensorView};

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
