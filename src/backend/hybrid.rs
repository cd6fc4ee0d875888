//! The device ops of hybrid models (Qwen3.5: Gated DeltaNet linear attention beside gated
//! softmax attention), as an extension trait of [`Backend`] so the base trait stays as it is.
//!
//! A hybrid backend adds a [`HybridBackend::StateCache`]: per sequence one *state slot*
//! (addressed by [`StepSeq::state_slot`](crate::backend::StepSeq::state_slot)) holding, for every
//! GDN layer, the conv state (the last `kernel − 1` pre-conv rows, `[kernel − 1, conv_dim]`) and
//! the recurrent state (`[value_heads, key_head_dim, value_head_dim]`, f32 on every backend:
//! the recurrence accumulates over the whole sequence).
//!
//! State-slot contract, shared by every op here: a sequence whose step starts at
//! `cached_len == 0` starts from a zero state (whatever the slot held before); otherwise its
//! slot must hold the state after exactly its first `cached_len` tokens, and the op leaves the
//! state after `cached_len + len` tokens there. Two sequences of one step never share a slot.
//!
//! The GDN layer, per token (shared/docs/qwen3_5.md §3.3–§3.7):
//! ```text
//! mixed = h·W_qkvᵀ                      [T, conv_dim] = [q | k | v], pre-conv
//! y     = silu(causal depthwise conv(mixed; conv state))          gdn_conv1d
//! q̂, k̂  = l2norm(q)·dk^-0.5, l2norm(k);  β = sigmoid(b);  g = −exp(A_log)·softplus(a + dt_bias)
//! S ← S·exp(g);  S += k̂ ⊗ β(v − Sᵀk̂);  o = Sᵀq̂                       gdn_recurrence
//! out = (rms_norm(o) · norm_w) ⊙ silu(z)  per value head             gated_rms_norm
//! ```
//! Value head `h` reads key head `h / (value_heads / key_heads)` (consecutive value heads share a
//! key head).

use crate::backend::{Backend, BackendError};

/// The inputs of [`HybridBackend::gated_qkv_rope_write`]: one gated-attention layer's projections
/// of the step's `tokens` tokens and its `(1 + w)` head norms.
pub struct GatedQkv<'a, B: Backend> {
    /// q_proj's output `[tokens, num_heads, 2 × head_dim]`, each head `[query | gate]`.
    pub qg: &'a B::Buffer,
    /// k_proj's and v_proj's outputs `[tokens, num_kv_heads, head_dim]`.
    pub k: &'a B::Buffer,
    pub v: &'a B::Buffer,
    /// The `(1 + w)` head norms as stored (`w`, `[head_dim]`), and their epsilon.
    pub q_norm: &'a B::Buffer,
    pub k_norm: &'a B::Buffer,
    pub eps: f32,
    /// Tokens of the step and the head shapes.
    pub tokens: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

/// The outputs (and scratch) of [`HybridBackend::gated_qkv_rope_write`].
pub struct GatedQkvOut<'a, B: Backend> {
    /// The normed, rotated queries `[tokens, num_heads, head_dim]` (the attention's input).
    pub q: &'a mut B::Buffer,
    /// The gates `[tokens, num_heads × head_dim]` (head-major, as the attention output).
    pub gate: &'a mut B::Buffer,
    /// Scratch of the unfused form: `[tokens, num_heads, head_dim]` and `[tokens, num_kv_heads,
    /// head_dim]` (a fused backend leaves them untouched).
    pub q_scratch: &'a mut B::Buffer,
    pub k_scratch: &'a mut B::Buffer,
}

/// [`HybridBackend::gated_qkv_rope_write`] as its parts (the default, and what the CPU runs):
/// split the query and gate, `(1 + w)`-norm q and k per head, RoPE both, store k and v in the
/// tokens' KV slots of `layer`.
pub fn gated_qkv_rope_write_unfused<B: HybridBackend>(
    b: &B,
    x: &GatedQkv<'_, B>,
    rope: &B::Rope,
    cache: &mut B::KvCache,
    layer: usize,
    step: &B::Step,
    out: GatedQkvOut<'_, B>,
) -> Result<(), BackendError> {
    let (t, nh, nkv, hd) = (x.tokens, x.num_heads, x.num_kv_heads, x.head_dim);
    b.split_query_gate(x.qg, out.q_scratch, out.gate, t, nh, hd)?;
    b.rms_norm_1p(out.q_scratch, x.q_norm, out.q, t * nh, hd, x.eps)?;
    b.rms_norm_1p(x.k, x.k_norm, out.k_scratch, t * nkv, hd, x.eps)?;
    b.rope(out.q, out.k_scratch, rope, step, nh, nkv, hd)?;
    b.write_kv(cache, layer, out.k_scratch, x.v, step)
}

/// Geometry of a state cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateSpec {
    /// Slots (sequences that can hold a state at once).
    pub num_slots: usize,
    /// GDN layers (the model's linear-attention layers, numbered 0.. in layer order).
    pub num_layers: usize,
    /// Channels of the depthwise conv (`2 × key_dim + value_dim`).
    pub conv_dim: usize,
    /// Conv taps (`linear_conv_kernel_dim`); the conv state keeps `kernel − 1` rows.
    pub conv_kernel: usize,
    /// GDN value heads.
    pub num_value_heads: usize,
    /// Width of a query/key head.
    pub key_head_dim: usize,
    /// Width of a value head.
    pub value_head_dim: usize,
}

impl StateSpec {
    /// f32 elements of one layer's conv state in one slot.
    pub fn conv_elems(&self) -> usize {
        (self.conv_kernel - 1) * self.conv_dim
    }

    /// f32 elements of one layer's recurrent state in one slot.
    pub fn recurrent_elems(&self) -> usize {
        self.num_value_heads * self.key_head_dim * self.value_head_dim
    }

    /// Bytes of one slot over all layers (both states in f32).
    pub fn bytes_per_slot(&self) -> usize {
        self.num_layers * (self.conv_elems() + self.recurrent_elems()) * 4
    }
}

/// Shapes and constants of one GDN layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GdnParams {
    /// Query/key heads.
    pub num_key_heads: usize,
    /// Value heads, a multiple of `num_key_heads`.
    pub num_value_heads: usize,
    /// Width of a query/key head.
    pub key_head_dim: usize,
    /// Width of a value head.
    pub value_head_dim: usize,
}

impl GdnParams {
    /// Width of q (and of k).
    pub fn key_dim(&self) -> usize {
        self.num_key_heads * self.key_head_dim
    }

    /// Width of v and of the output.
    pub fn value_dim(&self) -> usize {
        self.num_value_heads * self.value_head_dim
    }

    /// Channels of the conv output `[q | k | v]`.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }

    /// `Err(InvalidArgument)` unless these shapes are those of `spec`'s layers.
    pub fn check_fits(&self, spec: &StateSpec, layer: usize) -> Result<(), BackendError> {
        if layer >= spec.num_layers
            || self.num_key_heads == 0
            || !self.num_value_heads.is_multiple_of(self.num_key_heads)
            || self.num_value_heads != spec.num_value_heads
            || self.key_head_dim != spec.key_head_dim
            || self.value_head_dim != spec.value_head_dim
            || self.conv_dim() != spec.conv_dim
        {
            return Err(BackendError::InvalidArgument(format!(
                "GDN {self:?} on layer {layer} does not fit the state cache {spec:?}"
            )));
        }
        Ok(())
    }
}

/// A backend that runs hybrid (Gated DeltaNet) models. Shapes are row-major `[tokens, …]` over
/// the step's tokens, as in [`Backend`].
pub trait HybridBackend: Backend {
    /// The state slots of all GDN layers (see the module docs).
    type StateCache: Send;

    /// A zeroed state cache for `spec`.
    fn create_state_cache(&self, spec: &StateSpec) -> Result<Self::StateCache, BackendError>;

    /// Zero slot `slot` (all layers).
    fn reset_state_slot(&self, cache: &mut Self::StateCache, slot: u32)
        -> Result<(), BackendError>;

    /// Copy slot `src` into slot `dst` (all layers, both states).
    fn copy_state_slot(
        &self,
        cache: &mut Self::StateCache,
        src: u32,
        dst: u32,
    ) -> Result<(), BackendError>;

    /// Per-head split of a gated q projection: `qg` is `[tokens, heads, 2 × head_dim]`, each head
    /// `[query | gate]`; writes `q` `[tokens, heads, head_dim]` and `gate` `[tokens, heads ×
    /// head_dim]` (head-major, as the attention output it multiplies).
    fn split_query_gate(
        &self,
        qg: &Self::Buffer,
        q: &mut Self::Buffer,
        gate: &mut Self::Buffer,
        tokens: usize,
        heads: usize,
        head_dim: usize,
    ) -> Result<(), BackendError>;

    /// The pre-attention part of a gated-attention layer (Qwen3.5): per-head [query | gate]
    /// split, `(1 + w)` q/k norms, partial NeoX RoPE at the tokens' positions, k and v written to
    /// their KV slots of `layer`; `out.q` gets the queries, `out.gate` the gates. The default is
    /// [`gated_qkv_rope_write_unfused`]; CUDA runs it as one kernel with the same roundings.
    fn gated_qkv_rope_write(
        &self,
        x: &GatedQkv<'_, Self>,
        rope: &Self::Rope,
        cache: &mut Self::KvCache,
        layer: usize,
        step: &Self::Step,
        out: GatedQkvOut<'_, Self>,
    ) -> Result<(), BackendError> {
        gated_qkv_rope_write_unfused(self, x, rope, cache, layer, step, out)
    }

    /// Gated attention's core (Qwen3.5): [`Backend::paged_attention`] of `q` (`tokens` tokens of
    /// the step), then `out *= sigmoid(gate)`, `gate` `[tokens, heads × head_dim]` like `out`. The
    /// default is those two ops (the reference); CUDA fuses the gate into the attention kernels'
    /// epilogue (sigmoid in f32 on the attention value before its rounding).
    #[allow(clippy::too_many_arguments)]
    fn gated_paged_attention(
        &self,
        q: &Self::Buffer,
        gate: &Self::Buffer,
        tokens: usize,
        cache: &Self::KvCache,
        layer: usize,
        step: &Self::Step,
        params: &crate::backend::AttentionParams,
        out: &mut Self::Buffer,
    ) -> Result<(), BackendError> {
        self.paged_attention(q, cache, layer, step, params, out)?;
        self.sigmoid_mul(out, gate, tokens * params.num_heads * params.head_dim)
    }

    /// `x *= sigmoid(gate)` elementwise over `len` elements.
    fn sigmoid_mul(
        &self,
        x: &mut Self::Buffer,
        gate: &Self::Buffer,
        len: usize,
    ) -> Result<(), BackendError>;

    /// Causal depthwise conv + SiLU of GDN layer `layer` over each sequence's new rows of `mixed`
    /// (`[tokens, conv_dim]`, pre-conv), continuing from (and updating) the sequence's conv
    /// state: `out[t, c] = silu(Σ_j weight[c, j] · x[t − (kernel − 1) + j, c])`, where rows
    /// before the step come from the state (zeros at `cached_len == 0`). `weight`: `[conv_dim,
    /// kernel]` (tap `kernel − 1` multiplies the current token).
    fn gdn_conv1d(
        &self,
        cache: &mut Self::StateCache,
        layer: usize,
        mixed: &Self::Buffer,
        weight: &Self::Buffer,
        step: &Self::Step,
        out: &mut Self::Buffer,
    ) -> Result<(), BackendError>;

    /// The gated delta rule of GDN layer `layer`: from the conv output `qkv` (`[tokens,
    /// conv_dim]`), the gate projections `a`, `b` (`[tokens, value_heads]`) and the per-head
    /// `a_log`, `dt_bias` (`[value_heads]`), writes `out` `[tokens, value_heads, value_head_dim]`
    /// and leaves each sequence's recurrent state after its new tokens in its slot. One token
    /// uses the recurrent step; several use the chunked form (chunks of 64 tokens) continuing
    /// from the state; both are the same math (float rounding apart).
    #[allow(clippy::too_many_arguments)]
    fn gdn_recurrence(
        &self,
        cache: &mut Self::StateCache,
        layer: usize,
        qkv: &Self::Buffer,
        a: &Self::Buffer,
        b: &Self::Buffer,
        a_log: &Self::Buffer,
        dt_bias: &Self::Buffer,
        step: &Self::Step,
        params: &GdnParams,
        out: &mut Self::Buffer,
    ) -> Result<(), BackendError>;

    /// Zero-centred RMSNorm (Qwen3.5's `(1 + w)` norms): per row of `dim`, `out = x / sqrt(mean(x²)
    /// + eps) · (1 + weight)`, with `weight` the checkpoint's `w` as stored and `1 + w` formed in
    /// f32 (as transformers does; `1 + w` stored in bf16 would be rounded to 2⁻⁸). As
    /// [`Backend::rms_norm`]: `x` may be an f32 buffer, `out` is in the compute dtype.
    #[allow(clippy::too_many_arguments)]
    fn rms_norm_1p(
        &self,
        x: &Self::Buffer,
        weight: &Self::Buffer,
        out: &mut Self::Buffer,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<(), BackendError>;

    /// `residual += delta`, then [`HybridBackend::rms_norm_1p`] of `residual` into `out`, as
    /// [`Backend::add_rms_norm`] (`residual` may be an f32 buffer).
    #[allow(clippy::too_many_arguments)]
    fn add_rms_norm_1p(
        &self,
        residual: &mut Self::Buffer,
        delta: &Self::Buffer,
        weight: &Self::Buffer,
        out: &mut Self::Buffer,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<(), BackendError>;

    /// Gated RMSNorm: per row of `dim`, `out = x / sqrt(mean(x²) + eps) · weight · silu(z)`
    /// (norm before the gate, a plain weight). `x`, `z`, `out`: `[rows, dim]`.
    #[allow(clippy::too_many_arguments)]
    fn gated_rms_norm(
        &self,
        x: &Self::Buffer,
        z: &Self::Buffer,
        weight: &Self::Buffer,
        out: &mut Self::Buffer,
        rows: usize,
        dim: usize,
        eps: f32,
    ) -> Result<(), BackendError>;
}
