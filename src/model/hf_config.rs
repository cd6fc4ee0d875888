//! [`ModelConfig`] from a Hugging Face `config.json` or from GGUF metadata.
//!
//! `config.json`: the keys of `LlamaConfig` / `Qwen3Config`, in both transformers 4 form
//! (`rope_theta`, `rope_scaling`) and transformers 5 form (`rope_parameters: {rope_theta,
//! rope_type}`). Defaults follow transformers (`num_key_value_heads` = heads, `head_dim` =
//! hidden / heads, `rope_theta` 10000, `tie_word_embeddings` false, `attention_bias` false).
//!
//! GGUF: `general.architecture` = `llama` | `qwen3`, then `{arch}.embedding_length`,
//! `.feed_forward_length`, `.block_count`, `.attention.head_count(_kv)`,
//! `.attention.key_length`, `.attention.layer_norm_rms_epsilon`, `.rope.freq_base`,
//! `.context_length`; the vocabulary is the embedding's row count; `lm_head` is tied when the
//! file has no `output.weight`.
//!
//! Qwen3.5 (`qwen3_5`, `qwen3_5_text`: hybrid layers, partial rotary, a nested `text_config`)
//! is read by the private `qwen3_5` submodule.
//!
//! Anything kiln does not implement is `ModelError::Unsupported` naming it: another
//! architecture, a RoPE scaling other than none/default, partial rotary, sliding windows,
//! non-SiLU activations, MLP biases.

use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use crate::error::ModelError;
use crate::model::config::{Architecture, ModelConfig};
use crate::model::gguf::GgufFile;

/// Default RoPE base of `LlamaConfig` / `Qwen3Config`.
const DEFAULT_ROPE_THETA: f32 = 10_000.0;

/// The `config.json` keys kiln reads (unknown keys are ignored: HF configs carry many).
#[derive(Debug, Deserialize)]
struct HfConfigJson {
    model_type: Option<String>,
    #[serde(default)]
    architectures: Vec<String>,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    rms_norm_eps: f32,
    rope_theta: Option<f32>,
    rope_scaling: Option<Value>,
    rope_parameters: Option<Value>,
    partial_rotary_factor: Option<f32>,
    vocab_size: usize,
    max_position_embeddings: usize,
    #[serde(default)]
    tie_word_embeddings: bool,
    #[serde(default)]
    attention_bias: bool,
    #[serde(default)]
    mlp_bias: bool,
    hidden_act: Option<String>,
    #[serde(default)]
    use_sliding_window: bool,
    #[serde(default)]
    layer_types: Vec<String>,
}

/// Reads and checks `config.json` at `path`.
pub fn config_from_json_file(path: &Path) -> Result<ModelConfig, ModelError> {
    let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    config_from_json(&text, path)
}

/// Parses `config.json` text (`path` only names the file in errors).
pub fn config_from_json(text: &str, path: &Path) -> Result<ModelConfig, ModelError> {
    let format_err = |message: String| ModelError::Format {
        path: path.to_path_buf(),
        format: "config.json",
        message,
    };
    let value: Value = serde_json::from_str(text).map_err(|e| format_err(e.to_string()))?;
    if qwen3_5::is_qwen3_5(&value) {
        return qwen3_5::config_from_value(&value, path);
    }
    let raw: HfConfigJson = serde_json::from_value(value).map_err(|e| format_err(e.to_string()))?;
    let architecture = match raw.model_type.as_deref() {
        Some("llama") => Architecture::Llama,
        Some("qwen3") => Architecture::Qwen3,
        Some(other) => {
            return Err(ModelError::Unsupported(format!(
                "architecture `{other}` (model_type in {}; kiln supports llama, qwen3 and qwen3_5)",
                path.display()
            )))
        }
        None => match raw.architectures.first().map(String::as_str) {
            Some("LlamaForCausalLM") => Architecture::Llama,
            Some("Qwen3ForCausalLM") => Architecture::Qwen3,
            Some(other) => {
                return Err(ModelError::Unsupported(format!(
                    "architecture `{other}` in {}",
                    path.display()
                )))
            }
            None => {
                return Err(format_err(
                    "neither model_type nor architectures is set".into(),
                ))
            }
        },
    };
    if let Some(act) = raw.hidden_act.as_deref() {
        if act != "silu" {
            return Err(ModelError::Unsupported(format!(
                "hidden_act `{act}` (only silu)"
            )));
        }
    }
    if raw.mlp_bias {
        return Err(ModelError::Unsupported("mlp_bias = true".into()));
    }
    if raw.use_sliding_window {
        return Err(ModelError::Unsupported(
            "use_sliding_window = true (sliding-window attention)".into(),
        ));
    }
    if let Some(t) = raw.layer_types.iter().find(|t| *t != "full_attention") {
        return Err(ModelError::Unsupported(format!(
            "layer type `{t}` (only full_attention)"
        )));
    }
    if let Some(f) = raw.partial_rotary_factor {
        if f != 1.0 {
            return Err(ModelError::Unsupported(format!(
                "partial_rotary_factor = {f}"
            )));
        }
    }

    // RoPE: transformers 4 has rope_theta + rope_scaling, transformers 5 rope_parameters.
    let mut rope_theta = raw.rope_theta;
    for (key, value) in [
        ("rope_scaling", &raw.rope_scaling),
        ("rope_parameters", &raw.rope_parameters),
    ] {
        let Some(value) = value else { continue };
        if value.is_null() {
            continue;
        }
        let obj = value
            .as_object()
            .ok_or_else(|| format_err(format!("{key} is not an object")))?;
        let kind = obj
            .get("rope_type")
            .or_else(|| obj.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("default");
        if kind != "default" {
            return Err(ModelError::Unsupported(format!(
                "rope scaling `{kind}` ({key} in {})",
                path.display()
            )));
        }
        if let Some(theta) = obj.get("rope_theta") {
            let theta = theta
                .as_f64()
                .ok_or_else(|| format_err(format!("{key}.rope_theta is not a number")))?;
            rope_theta = Some(theta as f32);
        }
        if let Some(f) = obj.get("partial_rotary_factor").and_then(Value::as_f64) {
            if f != 1.0 {
                return Err(ModelError::Unsupported(format!(
                    "partial_rotary_factor = {f}"
                )));
            }
        }
    }

    if raw.num_attention_heads == 0
        || (!raw.hidden_size.is_multiple_of(raw.num_attention_heads) && raw.head_dim.is_none())
    {
        return Err(format_err(format!(
            "hidden_size {} is not a multiple of num_attention_heads {}",
            raw.hidden_size, raw.num_attention_heads
        )));
    }
    let config = ModelConfig {
        architecture,
        hidden_size: raw.hidden_size,
        intermediate_size: raw.intermediate_size,
        num_hidden_layers: raw.num_hidden_layers,
        num_attention_heads: raw.num_attention_heads,
        num_key_value_heads: raw.num_key_value_heads.unwrap_or(raw.num_attention_heads),
        head_dim: raw
            .head_dim
            .unwrap_or(raw.hidden_size / raw.num_attention_heads),
        rms_norm_eps: raw.rms_norm_eps,
        rope_theta: rope_theta.unwrap_or(DEFAULT_ROPE_THETA),
        vocab_size: raw.vocab_size,
        max_position_embeddings: raw.max_position_embeddings,
        tie_word_embeddings: raw.tie_word_embeddings,
        attention_bias: raw.attention_bias,
        hybrid: None,
    };
    check(&config).map_err(format_err)?;
    Ok(config)
}

/// Invariants every config must satisfy, whatever its source.
fn check(c: &ModelConfig) -> Result<(), String> {
    let positive = [
        ("hidden_size", c.hidden_size),
        ("intermediate_size", c.intermediate_size),
        ("num_hidden_layers", c.num_hidden_layers),
        ("num_attention_heads", c.num_attention_heads),
        ("num_key_value_heads", c.num_key_value_heads),
        ("head_dim", c.head_dim),
        ("vocab_size", c.vocab_size),
        ("max_position_embeddings", c.max_position_embeddings),
    ];
    if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
        return Err(format!("{name} is 0"));
    }
    if !c.num_attention_heads.is_multiple_of(c.num_key_value_heads) {
        return Err(format!(
            "num_attention_heads {} is not a multiple of num_key_value_heads {}",
            c.num_attention_heads, c.num_key_value_heads
        ));
    }
    if !c.head_dim.is_multiple_of(2) {
        return Err(format!("head_dim {} is odd (RoPE needs pairs)", c.head_dim));
    }
    if !(c.rms_norm_eps > 0.0 && c.rope_theta > 0.0) {
        return Err(format!(
            "rms_norm_eps {} and rope_theta {} must be positive",
            c.rms_norm_eps, c.rope_theta
        ));
    }
    Ok(())
}

/// Builds the config from a GGUF file's metadata and tensor directory.
pub fn config_from_gguf(file: &GgufFile) -> Result<ModelConfig, ModelError> {
    let m = file.metadata();
    let format_err = |message: String| ModelError::Format {
        path: file.path().to_path_buf(),
        format: "gguf",
        message,
    };
    let arch_name = m.require_str("general.architecture")?;
    let architecture = match arch_name {
        "llama" => Architecture::Llama,
        "qwen3" => Architecture::Qwen3,
        other => {
            return Err(ModelError::Unsupported(format!(
            "architecture `{other}` (general.architecture in {}; kiln supports llama and qwen3)",
            file.path().display()
        )))
        }
    };
    let key = |k: &str| format!("{arch_name}.{k}");

    // RoPE scaling: any type but none, or a factor other than 1, is unsupported.
    if let Some(kind) = m.get_str(&key("rope.scaling.type"))? {
        if kind != "none" {
            return Err(ModelError::Unsupported(format!(
                "rope scaling `{kind}` ({} in {})",
                key("rope.scaling.type"),
                file.path().display()
            )));
        }
    }
    if let Some(f) = m.get_f32(&key("rope.scaling.factor"))? {
        if f != 1.0 && f != 0.0 {
            return Err(ModelError::Unsupported(format!(
                "rope scaling factor {f} ({})",
                key("rope.scaling.factor")
            )));
        }
    }
    if file.tensor_info("rope_freqs.weight").is_some() {
        return Err(ModelError::Unsupported(
            "rope scaling by per-dimension frequency factors (tensor `rope_freqs.weight`, llama3-style)".into(),
        ));
    }
    if let Some(w) = m.get_u32(&key("attention.sliding_window"))? {
        return Err(ModelError::Unsupported(format!(
            "sliding-window attention ({} = {w})",
            key("attention.sliding_window")
        )));
    }
    if let Some(n) = m.get_u32(&key("expert_count"))? {
        if n > 0 {
            return Err(ModelError::Unsupported(format!(
                "mixture of experts ({} = {n})",
                key("expert_count")
            )));
        }
    }

    let hidden_size = m.require_usize(&key("embedding_length"))?;
    let num_attention_heads = m.require_usize(&key("attention.head_count"))?;
    if num_attention_heads == 0 {
        return Err(format_err(format!("{} is 0", key("attention.head_count"))));
    }
    let num_key_value_heads = m
        .get_usize(&key("attention.head_count_kv"))?
        .unwrap_or(num_attention_heads);
    let head_dim = m
        .get_usize(&key("attention.key_length"))?
        .unwrap_or(hidden_size / num_attention_heads);
    if let Some(v) = m.get_usize(&key("attention.value_length"))? {
        if v != head_dim {
            return Err(ModelError::Unsupported(format!(
                "value head width {v} different from key head width {head_dim}"
            )));
        }
    }
    if let Some(rot) = m.get_usize(&key("rope.dimension_count"))? {
        if rot != head_dim {
            return Err(ModelError::Unsupported(format!(
                "partial rotary embedding ({} = {rot}, head_dim {head_dim})",
                key("rope.dimension_count")
            )));
        }
    }

    let embd = file
        .tensor_info("token_embd.weight")
        .ok_or_else(|| ModelError::MissingTensor("token_embd.weight".into()))?;
    // ggml dims of the embedding are [hidden, vocab].
    let vocab_size = *embd.dims.get(1).ok_or_else(|| {
        format_err(format!(
            "token_embd.weight has shape {:?}, expected 2 dims",
            embd.dims
        ))
    })?;
    if let Some(v) = m.get_usize(&key("vocab_size"))? {
        if v != vocab_size {
            return Err(format_err(format!(
                "{} = {v} but token_embd.weight has {vocab_size} rows",
                key("vocab_size")
            )));
        }
    }

    let config = ModelConfig {
        architecture,
        hidden_size,
        intermediate_size: m.require_usize(&key("feed_forward_length"))?,
        num_hidden_layers: m.require_usize(&key("block_count"))?,
        num_attention_heads,
        num_key_value_heads,
        head_dim,
        rms_norm_eps: m.require_f32(&key("attention.layer_norm_rms_epsilon"))?,
        rope_theta: m
            .get_f32(&key("rope.freq_base"))?
            .unwrap_or(DEFAULT_ROPE_THETA),
        vocab_size,
        max_position_embeddings: m.require_usize(&key("context_length"))?,
        tie_word_embeddings: file.tensor_info("output.weight").is_none(),
        attention_bias: file.tensor_info("blk.0.attn_q.bias").is_some(),
        hybrid: None,
    };
    check(&config).map_err(format_err)?;
    Ok(config)
}

mod qwen3_5;

#[cfg(test)]
mod tests;
