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
}
