//! The Qwen3.5 hybrid decoder (`qwen3_5`, `qwen3_5_text`; Qwen3.6 / 3.8 use the same code):
//! Gated DeltaNet (linear attention, a recurrent state per sequence) and gated full-attention
//! layers, generic over a [`HybridBackend`], as one
//! [`ModelRunner`](crate::model::step::ModelRunner).
//!
//! Per layer (transformers `Qwen3_5DecoderLayer`; shared/docs/qwen3_5.md §3):
//! ```text
//! h = rms_norm(x) · (1 + input_layernorm)
//! linear_attention:  mixed = h·W_qkvᵀ, z = h·W_zᵀ, b = h·W_bᵀ, a = h·W_aᵀ
//!                    y = silu(conv(mixed; conv state));  o = gated delta rule(y, a, b; state)
//!                    Δ = (rms_norm(o) · norm ⊙ silu(z))·W_outᵀ          (per value head)
//! full_attention:    [q | gate] per head = h·W_qᵀ;  q, k = rms_norm per head · (1 + q/k_norm)
//!                    q, k = partial NeoX RoPE (first rotary_dim dims);  paged causal attention
//!                    Δ = (attn ⊙ sigmoid(gate))·W_oᵀ
//! x = x + Δ;  h = rms_norm(x) · (1 + post_attention_layernorm)
//! x = x + (silu(h·W_gateᵀ) ⊙ h·W_upᵀ)·W_downᵀ
//! ```
//! then `logits = rms_norm(x) · (1 + norm) · lm_headᵀ`. The `(1 + w)` norms are uploaded as
//! the stored `w` and run on [`HybridBackend::rms_norm_1p`] (`1 + w` formed in f32 in the
//! kernel, as transformers does); the GDN output norm uses its weight as stored.
//!
//! Caches: the KV cache holds the full-attention layers only; each sequence's GDN conv and
//! recurrent state live in its state slot ([`HybridBackend::StateCache`], slot from
//! `SeqSlice::state_slot`; a step starting at `cached_len == 0` starts from zeros). The MTP head
//! (`mtp.*`, in the checkpoint or a separate `model-mtp.safetensors`) is loaded and
//! shape-checked ([`mtp`]) but not used yet. A vision tower (`model.visual.*`) is skipped.

mod forward;
mod load;
pub mod mtp;
mod run;

pub use load::{load_cpu, load_gpu};

use crate::backend::hybrid::{GdnParams, HybridBackend, StateSpec};
use crate::backend::{Backend, KvCacheSpec};
use crate::error::{EngineError, ModelError};
use crate::model::config::{HybridConfig, LayerType};
use crate::model::llama::decode_graphs::DecodeGraphs;
use crate::model::llama::GraphStats;
use crate::model::step::CacheGeometry;
use crate::model::step_submit::StepState;
use crate::model::{Architecture, ModelConfig};
use crate::tensor::{TensorView, WeightSource};

/// A Gated DeltaNet layer's weights.
pub(crate) struct GdnLayer<B: HybridBackend> {
    /// `[conv_dim, hidden]`, rows `[q | k | v]`.
    in_proj_qkv: B::Weight,
    /// `[value_dim, hidden]`.
    in_proj_z: B::Weight,
    /// `[value_heads, hidden]`.
    in_proj_b: B::Weight,
    /// `[value_heads, hidden]`.
    in_proj_a: B::Weight,
    /// `[conv_dim, kernel]` (the checkpoint's `[conv_dim, 1, kernel]`).
    conv1d: B::Buffer,
    /// `[value_heads]`.
    dt_bias: B::Buffer,
    /// `[value_heads]`.
    a_log: B::Buffer,
    /// `[value_head_dim]`, plain weight.
    norm: B::Buffer,
    /// `[hidden, value_dim]`.
    out_proj: B::Weight,
    /// Index among the GDN layers (its layer in the state cache).
    state_layer: usize,
}

/// A gated full-attention layer's weights.
pub(crate) struct AttnLayer<B: HybridBackend> {
    /// `[heads × 2 × head_dim, hidden]`, per head `[query | gate]`.
    q_proj: B::Weight,
    k_proj: B::Weight,
    v_proj: B::Weight,
    /// `[hidden, heads × head_dim]`.
    o_proj: B::Weight,
    /// `1 + q_norm.weight`, `[head_dim]`.
    q_norm: B::Buffer,
    /// `1 + k_norm.weight`, `[head_dim]`.
    k_norm: B::Buffer,
    /// Index among the full-attention layers (its layer in the KV cache).
    kv_layer: usize,
}

/// What a layer mixes tokens with.
pub(crate) enum Mixer<B: HybridBackend> {
    Linear(GdnLayer<B>),
    Full(AttnLayer<B>),
}

/// One decoder layer.
pub(crate) struct Layer<B: HybridBackend> {
    /// `1 + input_layernorm.weight`.
    input_layernorm: B::Buffer,
    mixer: Mixer<B>,
    /// `1 + post_attention_layernorm.weight`.
    post_attention_layernorm: B::Buffer,
    gate_proj: B::Weight,
    up_proj: B::Weight,
    down_proj: B::Weight,
}

/// All weights the forward pass uses.
pub(crate) struct Weights<B: HybridBackend> {
    embed_tokens: B::Weight,
    /// `None`: tied to `embed_tokens`.
    lm_head: Option<B::Weight>,
    layers: Vec<Layer<B>>,
    /// `1 + norm.weight`.
    norm: B::Buffer,
    rope: B::Rope,
}

/// A loaded Qwen3.5 model with its KV cache and state slots on backend `B`.
pub struct Qwen3_5<B: HybridBackend> {
    backend: B,
    config: ModelConfig,
    weights: Weights<B>,
    /// Loaded and shape-checked, not used yet (speculative decoding comes later).
    mtp: Option<mtp::MtpWeights<B>>,
    kv_cache: B::KvCache,
    states: B::StateCache,
    geometry: CacheGeometry,
    /// The workspace (made at the first step), the eager step's metadata, the decode graphs
    /// ([`Qwen3_5::with_decode_graphs`]) and the submitted steps (at most two; see `run.rs`).
    steps: StepState<B, forward::Workspace<B>>,
}

/// Looks tensors up by key, checks their shapes and uploads them.
pub(crate) struct Loader<'a, B: Backend> {
    pub(crate) backend: &'a B,
    pub(crate) weights: &'a dyn WeightSource,
}

fn backend_err(e: crate::backend::BackendError) -> ModelError {
    ModelError::Backend(e.to_string())
}

impl<B: Backend> Loader<'_, B> {
    fn view(&self, key: &str, shape: &[usize]) -> Result<TensorView<'_>, ModelError> {
        let view = self.weights.tensor(key)?;
        if view.shape != shape {
            return Err(ModelError::Shape {
                name: key.to_owned(),
                expected: shape.to_vec(),
                found: view.shape.to_vec(),
            });
        }
        Ok(view)
    }

    /// A 2-D weight `[rows, cols]` as stored.
    pub(crate) fn matrix(
        &self,
        key: &str,
        rows: usize,
        cols: usize,
    ) -> Result<B::Weight, ModelError> {
        let view = self.view(key, &[rows, cols])?;
        self.backend.upload_weight(key, &view).map_err(backend_err)
    }

    /// The linear layer `module` (`<module>.weight`, or its packed parts when the checkpoint's
    /// `quantization_config` packs it: [`WeightSource::linear`]), checked to be `[rows, cols]`.
    pub(crate) fn linear(
        &self,
        module: &str,
        rows: usize,
        cols: usize,
    ) -> Result<B::Weight, ModelError> {
        let view = self.weights.linear(module)?;
        if view.shape() != [rows, cols] {
            // Named by the stored tensor when there is one (as `matrix` does), else the module.
            let name = match &view {
                crate::tensor::LinearView::Dense(_) => format!("{module}.weight"),
                crate::tensor::LinearView::Packed(_) => module.to_owned(),
            };
            return Err(ModelError::Shape {
                name,
                expected: vec![rows, cols],
                found: view.shape(),
            });
        }
        self.backend
            .upload_linear(module, &view)
            .map_err(backend_err)
    }

    /// A 1-D parameter as stored.
    pub(crate) fn vector(&self, key: &str, len: usize) -> Result<B::Buffer, ModelError> {
        let view = self.view(key, &[len])?;
        self.backend.upload_vector(key, &view).map_err(backend_err)
    }

    /// A tensor of `shape` dequantized to host f32.
    fn host_f32(&self, key: &str, shape: &[usize]) -> Result<Vec<f32>, ModelError> {
        let view = self.view(key, shape)?;
        let n: usize = shape.iter().product();
        if view.dtype.is_quantized() || view.dtype.row_bytes(n) != Some(view.data.len()) {
            return Err(ModelError::Unsupported(format!(
                "`{key}` stored as {:?} (norms and conv weights must be f32, f16 or bf16)",
                view.dtype
            )));
        }
        let mut out = vec![0.0; n];
        crate::quant::dequantize_row(view.dtype, view.data, &mut out);
        Ok(out)
    }

    /// A zero-centred norm weight `w`, uploaded as stored: the `(1 + w)` ops
    /// ([`HybridBackend::rms_norm_1p`]) form `1 + w` in f32, as transformers does (`1 + w` stored
    /// in bf16 would be rounded to 2⁻⁸ relative: that cost the bf16 GPU path most of its
    /// whole-model agreement, docs/gpu-validation.md).
    pub(crate) fn norm_1p(&self, key: &str, len: usize) -> Result<B::Buffer, ModelError> {
        let w = self.host_f32(key, &[len])?;
        self.backend.upload(&w).map_err(backend_err)
    }

    /// The depthwise conv weight `[channels, 1, kernel]` as a `[channels × kernel]` buffer.
    fn conv(&self, key: &str, channels: usize, kernel: usize) -> Result<B::Buffer, ModelError> {
        let w = self.host_f32(key, &[channels, 1, kernel])?;
        self.backend.upload(&w).map_err(backend_err)
    }
}

/// The hybrid part of `config`, or `Unsupported`.
fn hybrid(config: &ModelConfig) -> Result<&HybridConfig, ModelError> {
    match (&config.architecture, &config.hybrid) {
        (Architecture::Qwen3_5, Some(h)) => Ok(h),
        _ => Err(ModelError::Unsupported(format!(
            "a {:?} config without the qwen3_5 hybrid fields",
            config.architecture
        ))),
    }
}

/// The GDN layer shapes of `config`, or `Unsupported` for a config without the hybrid fields.
pub fn gdn_params(config: &ModelConfig) -> Result<GdnParams, ModelError> {
    let h = hybrid(config)?;
    Ok(GdnParams {
        num_key_heads: h.linear_num_key_heads,
        num_value_heads: h.linear_num_value_heads,
        key_head_dim: h.linear_key_head_dim,
        value_head_dim: h.linear_value_head_dim,
    })
}

/// The state-cache geometry of `config` for `num_slots` slots.
pub fn state_spec(config: &ModelConfig, num_slots: usize) -> Result<StateSpec, ModelError> {
    let h = hybrid(config)?;
    Ok(StateSpec {
        num_slots,
        num_layers: h.count(LayerType::LinearAttention),
        conv_dim: h.conv_dim(),
        conv_kernel: h.linear_conv_kernel_dim,
        num_value_heads: h.linear_num_value_heads,
        key_head_dim: h.linear_key_head_dim,
        value_head_dim: h.linear_value_head_dim,
    })
}

/// Activation bytes a Qwen3.5 step of `tokens` tokens needs beyond the llama-family estimate
/// of [`crate::model::memory::workspace_bytes`] (0 for other architectures): the gated q
/// projection and gate, the unfused q/k/v and their norms, and the GDN buffers (pre-conv and
/// conv rows, z, b, a, the delta-rule output and the gated norm's), at `elem` bytes each.
pub fn extra_workspace_bytes(config: &ModelConfig, tokens: usize, elem: usize) -> usize {
    let Some(h) = config.hybrid.as_ref() else {
        return 0;
    };
    let q_dim = config.num_attention_heads * config.head_dim;
    let kv_dim = config.num_key_value_heads * config.head_dim;
    let per_token = 3 * q_dim
        + 2 * kv_dim
        + 2 * h.conv_dim()
        + 3 * h.value_dim()
        + 2 * h.linear_num_value_heads;
    tokens * per_token * elem
}

/// The KV-cache geometry of `config` (full-attention layers only).
pub fn kv_spec(config: &ModelConfig, block_size: usize, num_blocks: usize) -> KvCacheSpec {
    KvCacheSpec {
        num_layers: config.num_kv_layers(),
        num_blocks,
        block_size,
        num_kv_heads: config.num_key_value_heads,
        head_dim: config.head_dim,
    }
}

impl<B: HybridBackend> Qwen3_5<B> {
    /// Make the workspace (at the first step) for at least `tokens` tokens and `rows` logits
    /// rows, so steps up to that size never remake it (what the GPU planner counted).
    pub fn reserve_workspace(mut self, tokens: usize, rows: usize) -> Self {
        self.steps.reserve = (tokens, rows);
        self
    }

    /// Replay decode-only steps from CUDA graphs, one per batch bucket (1, 2, 4, … up to
    /// `max_num_seqs`), each recorded at its first use, as [`crate::model::llama::Llama::
    /// with_decode_graphs`] does (`crate::model::llama::decode_graphs`; the padding rows have no
    /// state slot). The last KV block becomes the padding rows' scratch block: the runner
    /// reports one block fewer. A backend without graphs, or a cache of one block, stays eager.
    pub fn with_decode_graphs(mut self, max_num_seqs: usize, max_model_len: usize) -> Self {
        if let Some(g) = DecodeGraphs::for_runner(
            &self.backend,
            &mut self.geometry,
            self.config.max_position_embeddings,
            max_num_seqs,
            max_model_len,
        ) {
            self.steps.graphs = Some(g);
        }
        self
    }

    /// What the decode graphs have done; `None` when this runner has none.
    pub fn graph_stats(&self) -> Option<GraphStats> {
        self.steps.graphs.as_ref().map(|g| g.stats())
    }

    /// The model's hyper-parameters.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Whether MTP weights were found (and shape-checked).
    pub fn has_mtp(&self) -> bool {
        self.mtp.is_some()
    }

    /// The backend's state cache (tests read slots through it).
    pub fn states(&self) -> &B::StateCache {
        &self.states
    }

    /// GDN shapes of this model.
    fn gdn_params(&self) -> GdnParams {
        gdn_params(&self.config).expect("checked at load")
    }

    /// Make the backend's chunked-prefill workspace once for every step of up to `max_tokens`
    /// tokens over `max_seqs` sequences (`engine.max_num_batched_tokens`, `max_num_seqs`: what
    /// the GPU planner counted, [`HybridBackend::prefill_workspace_bytes`]), so prefill steps
    /// never allocate it. A no-op on the CPU.
    pub fn reserve_prefill_workspace(
        mut self,
        max_tokens: usize,
        max_seqs: usize,
    ) -> Result<Self, ModelError> {
        let p = self.gdn_params();
        self.backend
            .reserve_prefill_workspace(&mut self.states, &p, max_tokens, max_seqs)
            .map_err(backend_err)?;
        Ok(self)
    }

    /// Copy state slot `src` into `dst` (prefix checkpoints).
    pub fn copy_state_slot(&mut self, src: u32, dst: u32) -> Result<(), EngineError> {
        Ok(self.backend.copy_state_slot(&mut self.states, src, dst)?)
    }
}
