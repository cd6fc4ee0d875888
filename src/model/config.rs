//! The model hyper-parameters kiln needs, named as in Hugging Face `config.json`.
//!
//! Filled either from `config.json` (HF folders) or from GGUF metadata (`llama.*`, `qwen3.*`
//! keys), so the model code sees one type whatever the file format.

use serde::{Deserialize, Serialize};

/// Supported architecture families (`model_type` in `config.json`, `general.architecture` in GGUF).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Architecture {
    /// Llama family (SmolLM2, Llama 2/3, Mistral without sliding window).
    Llama,
    /// Qwen3 dense: llama + per-head RMSNorm on q and k (`q_norm`, `k_norm`).
    Qwen3,
    /// Qwen3.5 / 3.6 / 3.8 hybrid (`qwen3_5`, `qwen3_5_text`): Gated DeltaNet (linear attention)
    /// and gated full-attention layers; the details are in [`ModelConfig::hybrid`].
    Qwen3_5,
}

/// Hyper-parameters (HF names).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    /// Architecture family.
    pub architecture: Architecture,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the MLP.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (GQA).
    pub num_key_value_heads: usize,
    /// Per-head width (`hidden_size / num_attention_heads` unless given).
    pub head_dim: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f32,
    /// RoPE base.
    pub rope_theta: f32,
    /// Vocabulary size (rows of the embedding).
    pub vocab_size: usize,
    /// Context limit the model was trained for.
    pub max_position_embeddings: usize,
    /// `lm_head` shares the embedding matrix.
    pub tie_word_embeddings: bool,
    /// Attention q/k/v projections carry biases (Qwen2-style); false for llama/qwen3.
    pub attention_bias: bool,
    /// The hybrid-architecture part (`Some` exactly for [`Architecture::Qwen3_5`]).
    #[serde(default)]
    pub hybrid: Option<HybridConfig>,
}

/// What one decoder layer mixes tokens with (`layer_types` in `config.json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerType {
    /// Gated DeltaNet (linear attention with a recurrent state; `linear_attn.*` weights).
    LinearAttention,
    /// Gated softmax attention over the paged KV cache (`self_attn.*` weights).
    FullAttention,
}

/// The Qwen3.5 hybrid hyper-parameters (HF names of `Qwen3_5TextConfig`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HybridConfig {
    /// One entry per decoder layer.
    pub layer_types: Vec<LayerType>,
    /// Leading dims of each attention head that RoPE rotates: `head_dim × partial_rotary_factor`
    /// (64 of 256 for the 27B); the rest pass through.
    pub rotary_dim: usize,
    /// GDN query/key heads (`linear_num_key_heads`).
    pub linear_num_key_heads: usize,
    /// GDN value heads (`linear_num_value_heads`), a multiple of the key heads: value head `h`
    /// reads key head `h / (value_heads / key_heads)`.
    pub linear_num_value_heads: usize,
    /// Width of a GDN query/key head (`linear_key_head_dim`).
    pub linear_key_head_dim: usize,
    /// Width of a GDN value head (`linear_value_head_dim`).
    pub linear_value_head_dim: usize,
    /// Taps of the causal depthwise conv (`linear_conv_kernel_dim`, 4).
    pub linear_conv_kernel_dim: usize,
    /// Checkpoint root of the text model: `model` (flat `Qwen3_5ForCausalLM`) or
    /// `model.language_model` (`Qwen3_5ForConditionalGeneration`).
    pub weight_prefix: String,
    /// The checkpoint has a vision tower (`model.visual.*`, not loaded: text only).
    pub has_vision: bool,
    /// MTP (multi-token prediction) decoder layers (`mtp_num_hidden_layers`; 0 = none).
    pub mtp_num_hidden_layers: usize,
}

impl HybridConfig {
    /// Layers of `kind`.
    pub fn count(&self, kind: LayerType) -> usize {
        self.layer_types.iter().filter(|&&t| t == kind).count()
    }

    /// Width of the GDN queries and of the keys (`key heads × key head dim`).
    pub fn key_dim(&self) -> usize {
        self.linear_num_key_heads * self.linear_key_head_dim
    }

    /// Width of the GDN values and outputs (`value heads × value head dim`).
    pub fn value_dim(&self) -> usize {
        self.linear_num_value_heads * self.linear_value_head_dim
    }

    /// Channels of the depthwise conv: `[q | k | v]` = `2 × key_dim + value_dim`.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }

    /// f32 elements of one sequence's recurrent state per GDN layer: `value heads × key head
    /// dim × value head dim`.
    pub fn recurrent_elems_per_layer(&self) -> usize {
        self.linear_num_value_heads * self.linear_key_head_dim * self.linear_value_head_dim
    }

    /// f32 elements of one sequence's conv state per GDN layer: the last `kernel − 1` pre-conv
    /// rows of `conv_dim`.
    pub fn conv_elems_per_layer(&self) -> usize {
        (self.linear_conv_kernel_dim - 1) * self.conv_dim()
    }

    /// Bytes of one state slot (all GDN layers, recurrent + conv) at `elem_bytes` per element
    /// (4: both are kept in f32).
    pub fn state_slot_bytes(&self, elem_bytes: usize) -> usize {
        self.count(LayerType::LinearAttention)
            * (self.recurrent_elems_per_layer() + self.conv_elems_per_layer())
            * elem_bytes
    }
}

impl ModelConfig {
    /// Shapes of this model's attention calls: its heads, KV heads and head width, scaled by
    /// `head_dim^-0.5` (llama, qwen3 and qwen3_5's gated attention alike).
    pub fn attention_params(&self) -> crate::backend::AttentionParams {
        crate::backend::AttentionParams {
            num_heads: self.num_attention_heads,
            num_kv_heads: self.num_key_value_heads,
            head_dim: self.head_dim,
            scale: (self.head_dim as f32).powf(-0.5),
        }
    }

    /// Checkpoint root of the decoder (`model`, or `model.language_model` for the nested
    /// Qwen3.5 layout).
    pub fn weight_prefix(&self) -> &str {
        self.hybrid
            .as_ref()
            .map_or("model", |h| h.weight_prefix.as_str())
    }

    /// Layers with a KV cache (all of them, except a hybrid model's linear-attention layers).
    pub fn num_kv_layers(&self) -> usize {
        self.hybrid.as_ref().map_or(self.num_hidden_layers, |h| {
            h.count(LayerType::FullAttention)
        })
    }
}
