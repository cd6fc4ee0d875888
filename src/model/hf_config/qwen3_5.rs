//! `config.json` of the Qwen3.5 hybrid family → [`ModelConfig`] with [`HybridConfig`].
//!
//! Two layouts (transformers `configuration_qwen3_5.py`):
//! - flat text-only, `model_type: qwen3_5_text` (`Qwen3_5ForCausalLM`): the keys at top level,
//!   weights under `model.*`;
//! - nested, `model_type: qwen3_5` (`Qwen3_5ForConditionalGeneration`, the real checkpoints):
//!   the text keys under `text_config`, weights under `model.language_model.*`, a vision tower
//!   under `model.visual.*` (`vision_config`) that kiln skips (text only).
//!
//! Keys read besides the llama ones: `layer_types` (or `full_attention_interval`, default 4),
//! `partial_rotary_factor` (top level or in `rope_parameters` / `rope_scaling`; default 0.25 as
//! in transformers), `linear_{num_key_heads, num_value_heads, key_head_dim, value_head_dim,
//! conv_kernel_dim}`, `attn_output_gate` (must be true), `mtp_num_hidden_layers`. M-RoPE
//! (`mrope_section`) only matters for image/video positions; for text all three position
//! components are equal and it is plain NeoX RoPE over `rotary_dim` dims.

use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use crate::error::ModelError;
use crate::model::config::{Architecture, HybridConfig, LayerType, ModelConfig};

/// `Qwen3_5TextConfig` defaults (transformers 5.24).
const DEFAULT_PARTIAL_ROTARY: f64 = 0.25;
const DEFAULT_FULL_ATTENTION_INTERVAL: usize = 4;

/// The text keys of a Qwen3.5 config (flat, or the nested `text_config`).
#[derive(Debug, Deserialize)]
struct TextJson {
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    #[serde(default = "default_head_dim")]
    head_dim: usize,
    #[serde(default = "default_eps")]
    rms_norm_eps: f32,
    rope_theta: Option<f64>,
    rope_parameters: Option<Value>,
    rope_scaling: Option<Value>,
    partial_rotary_factor: Option<f64>,
    vocab_size: usize,
    max_position_embeddings: usize,
    tie_word_embeddings: Option<bool>,
    #[serde(default)]
    attention_bias: bool,
    hidden_act: Option<String>,
    layer_types: Option<Vec<String>>,
    full_attention_interval: Option<usize>,
    #[serde(default = "default_linear_key_heads")]
    linear_num_key_heads: usize,
    #[serde(default = "default_linear_value_heads")]
    linear_num_value_heads: usize,
    #[serde(default = "default_linear_dim")]
    linear_key_head_dim: usize,
    #[serde(default = "default_linear_dim")]
    linear_value_head_dim: usize,
    #[serde(default = "default_conv")]
    linear_conv_kernel_dim: usize,
    attn_output_gate: Option<bool>,
    #[serde(default)]
    mtp_num_hidden_layers: usize,
}

fn default_head_dim() -> usize {
    256
}
fn default_eps() -> f32 {
    1e-6
}
fn default_linear_key_heads() -> usize {
    16
}
fn default_linear_value_heads() -> usize {
    32
}
fn default_linear_dim() -> usize {
    128
}
fn default_conv() -> usize {
    4
}

/// Whether `raw` (a parsed `config.json`) is a Qwen3.5 config: `model_type` `qwen3_5` /
/// `qwen3_5_text`, or (without `model_type`) a `Qwen3_5For*` architecture.
pub(super) fn is_qwen3_5(raw: &Value) -> bool {
    match raw.get("model_type").and_then(Value::as_str) {
        Some(t) => t == "qwen3_5" || t == "qwen3_5_text",
        None => raw
            .get("architectures")
            .and_then(Value::as_array)
            .and_then(|a| a.first())
            .and_then(Value::as_str)
            .is_some_and(|a| a.starts_with("Qwen3_5For")),
    }
}

/// Builds the config of a Qwen3.5 `config.json` (`raw`, for which [`is_qwen3_5`] holds).
pub(super) fn config_from_value(raw: &Value, path: &Path) -> Result<ModelConfig, ModelError> {
    let format_err = |message: String| ModelError::Format {
        path: path.to_path_buf(),
        format: "config.json",
        message,
    };
    let nested = raw.get("text_config").filter(|v| !v.is_null());
    let text_value = nested.unwrap_or(raw);
    let t: TextJson = serde_json::from_value(text_value.clone())
        .map_err(|e| format_err(format!("qwen3_5 text config: {e}")))?;
    if let Some(act) = t.hidden_act.as_deref() {
        if act != "silu" {
            return Err(ModelError::Unsupported(format!(
                "hidden_act `{act}` (only silu)"
            )));
        }
    }
    if t.attention_bias {
        return Err(ModelError::Unsupported(
            "attention biases (`attention_bias = true`) in a qwen3_5 model".into(),
        ));
    }
    if t.attn_output_gate == Some(false) {
        return Err(ModelError::Unsupported(
            "qwen3_5 attention without its output gate (`attn_output_gate = false`)".into(),
        ));
    }
    let layer_types = match &t.layer_types {
        Some(names) => names
            .iter()
            .map(|n| match n.as_str() {
                "linear_attention" => Ok(LayerType::LinearAttention),
                "full_attention" => Ok(LayerType::FullAttention),
                other => Err(ModelError::Unsupported(format!(
                    "layer type `{other}` (qwen3_5 layers are linear_attention or full_attention)"
                ))),
            })
            .collect::<Result<Vec<_>, _>>()?,
        None => {
            let every = t
                .full_attention_interval
                .unwrap_or(DEFAULT_FULL_ATTENTION_INTERVAL)
                .max(1);
            (0..t.num_hidden_layers)
                .map(|i| {
                    if (i + 1) % every == 0 {
                        LayerType::FullAttention
                    } else {
                        LayerType::LinearAttention
                    }
                })
                .collect()
        }
    };
    if layer_types.len() != t.num_hidden_layers {
        return Err(format_err(format!(
            "layer_types has {} entries for {} layers",
            layer_types.len(),
            t.num_hidden_layers
        )));
    }

    // RoPE: `rope_parameters` (transformers 5) or `rope_theta` + `rope_scaling` (4.x files).
    let mut theta = t.rope_theta;
    let mut partial = t.partial_rotary_factor;
    for (key, value) in [
        ("rope_scaling", &t.rope_scaling),
        ("rope_parameters", &t.rope_parameters),
    ] {
        let Some(value) = value.as_ref().filter(|v| !v.is_null()) else {
            continue;
        };
        let obj = value
            .as_object()
            .ok_or_else(|| format_err(format!("{key} is not an object")))?;
        let kind = obj
            .get("rope_type")
            .or_else(|| obj.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("default");
        // Qwen3.5 files written by transformers 4 name M-RoPE `mrope` / `default` with sections.
        if kind != "default" && kind != "mrope" {
            return Err(ModelError::Unsupported(format!(
                "rope scaling `{kind}` ({key} in {})",
                path.display()
            )));
        }
        if let Some(v) = obj.get("rope_theta") {
            theta = Some(
                v.as_f64()
                    .ok_or_else(|| format_err(format!("{key}.rope_theta is not a number")))?,
            );
        }
        if let Some(v) = obj.get("partial_rotary_factor") {
            partial = Some(v.as_f64().ok_or_else(|| {
                format_err(format!("{key}.partial_rotary_factor is not a number"))
            })?);
        }
    }
    let theta = theta.ok_or_else(|| format_err("qwen3_5 config without rope_theta".into()))?;
    let partial = partial.unwrap_or(DEFAULT_PARTIAL_ROTARY);
    if !(partial > 0.0 && partial <= 1.0) {
        return Err(format_err(format!(
            "partial_rotary_factor {partial} is not in (0, 1]"
        )));
    }
    // transformers: dim = int(head_dim * partial_rotary_factor).
    let rotary_dim = (t.head_dim as f64 * partial) as usize;
    if rotary_dim == 0 || !rotary_dim.is_multiple_of(2) {
        return Err(format_err(format!(
            "rotary dim {rotary_dim} (head_dim {} × partial_rotary_factor {partial}) must be even and positive",
            t.head_dim
        )));
    }
    if t.linear_num_key_heads == 0
        || !t
            .linear_num_value_heads
            .is_multiple_of(t.linear_num_key_heads)
    {
        return Err(format_err(format!(
            "linear_num_value_heads {} is not a multiple of linear_num_key_heads {}",
            t.linear_num_value_heads, t.linear_num_key_heads
        )));
    }
    if t.linear_conv_kernel_dim < 2 {
        return Err(format_err(format!(
            "linear_conv_kernel_dim {} (needs at least 2 taps)",
            t.linear_conv_kernel_dim
        )));
    }
    let positive = [
        ("linear_num_value_heads", t.linear_num_value_heads),
        ("linear_key_head_dim", t.linear_key_head_dim),
        ("linear_value_head_dim", t.linear_value_head_dim),
    ];
    if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
        return Err(format_err(format!("{name} is 0")));
    }
    let has_vision = nested.is_some() && raw.get("vision_config").is_some_and(|v| !v.is_null());
    // The nested layout ties (or not) at the top level.
    let tie = raw
        .get("tie_word_embeddings")
        .filter(|_| nested.is_some())
        .and_then(Value::as_bool)
        .or(t.tie_word_embeddings)
        .unwrap_or(false);
    let config = ModelConfig {
        architecture: Architecture::Qwen3_5,
        hidden_size: t.hidden_size,
        intermediate_size: t.intermediate_size,
        num_hidden_layers: t.num_hidden_layers,
        num_attention_heads: t.num_attention_heads,
        num_key_value_heads: t.num_key_value_heads.unwrap_or(t.num_attention_heads),
        head_dim: t.head_dim,
        rms_norm_eps: t.rms_norm_eps,
        rope_theta: theta as f32,
        vocab_size: t.vocab_size,
        max_position_embeddings: t.max_position_embeddings,
        tie_word_embeddings: tie,
        attention_bias: false,
        hybrid: Some(HybridConfig {
            layer_types,
            rotary_dim,
            linear_num_key_heads: t.linear_num_key_heads,
            linear_num_value_heads: t.linear_num_value_heads,
            linear_key_head_dim: t.linear_key_head_dim,
            linear_value_head_dim: t.linear_value_head_dim,
            linear_conv_kernel_dim: t.linear_conv_kernel_dim,
            weight_prefix: if nested.is_some() {
                "model.language_model".into()
            } else {
                "model".into()
            },
            has_vision,
            mtp_num_hidden_layers: t.mtp_num_hidden_layers,
        }),
    };
    super::check(&config).map_err(format_err)?;
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::hf_config::config_from_json;

    /// The Qwen3.5-27B text config (shared/docs/qwen3_5.md §2.1), nested as the real files are.
    const QWEN3_5_27B: &str = r#"{
      "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
      "tie_word_embeddings": false,
      "text_config": {
        "model_type": "qwen3_5_text", "hidden_size": 5120, "num_hidden_layers": 64,
        "full_attention_interval": 4, "num_attention_heads": 24, "num_key_value_heads": 4,
        "head_dim": 256, "attn_output_gate": true, "intermediate_size": 17408,
        "max_position_embeddings": 262144, "rms_norm_eps": 1e-6, "vocab_size": 248320,
        "linear_num_key_heads": 16, "linear_num_value_heads": 48, "linear_key_head_dim": 128,
        "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "mtp_num_hidden_layers": 1,
        "mamba_ssm_dtype": "float32", "hidden_act": "silu",
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000,
          "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10], "mrope_interleaved": true}
      },
      "vision_config": {"depth": 27}
    }"#;

    #[test]
    fn the_27b_config_reads_as_the_research_notes_say() {
        let c = config_from_json(QWEN3_5_27B, Path::new("config.json")).unwrap();
        assert_eq!(c.architecture, Architecture::Qwen3_5);
        let h = c.hybrid.as_ref().unwrap();
        assert_eq!(h.count(LayerType::FullAttention), 16);
        assert_eq!(h.count(LayerType::LinearAttention), 48);
        assert_eq!(h.layer_types[3], LayerType::FullAttention);
        assert_eq!(h.layer_types[4], LayerType::LinearAttention);
        assert_eq!(h.rotary_dim, 64);
        assert_eq!(
            (h.key_dim(), h.value_dim(), h.conv_dim()),
            (2048, 6144, 10240)
        );
        assert_eq!(h.weight_prefix, "model.language_model");
        assert!(h.has_vision);
        assert_eq!(h.mtp_num_hidden_layers, 1);
        assert_eq!(c.rope_theta, 1e7);
        assert_eq!(c.num_kv_layers(), 16);
        // 48 layers × ([48, 128, 128] + 3 × 10240) f32 = 144 MiB + 5.6 MiB.
        assert_eq!(h.state_slot_bytes(4), 48 * (48 * 128 * 128 + 3 * 10240) * 4);
    }

    #[test]
    fn flat_text_config_and_bad_values() {
        let flat = r#"{"model_type": "qwen3_5_text", "hidden_size": 64, "num_hidden_layers": 2,
          "layer_types": ["linear_attention", "full_attention"], "num_attention_heads": 4,
          "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 128,
          "max_position_embeddings": 512, "vocab_size": 128, "tie_word_embeddings": true,
          "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 32,
          "linear_value_head_dim": 32,
          "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}}"#;
        let c = config_from_json(flat, Path::new("c.json")).unwrap();
        let h = c.hybrid.as_ref().unwrap();
        assert_eq!(h.weight_prefix, "model");
        assert!(!h.has_vision && c.tie_word_embeddings);
        assert_eq!(h.rotary_dim, 16);
        let bad = |from: &str, to: &str| {
            config_from_json(&flat.replace(from, to), Path::new("c.json")).unwrap_err()
        };
        assert!(matches!(
            bad("\"full_attention\"]", "\"sliding_attention\"]"),
            ModelError::Unsupported(_)
        ));
        assert!(matches!(
            bad(
                "\"linear_num_value_heads\": 4",
                "\"linear_num_value_heads\": 3"
            ),
            ModelError::Format { .. }
        ));
        assert!(matches!(
            bad("\"rope_type\": \"default\"", "\"rope_type\": \"yarn\""),
            ModelError::Unsupported(_)
        ));
        assert!(matches!(
            bad(
                "\"hidden_size\": 64,",
                "\"hidden_size\": 64, \"attn_output_gate\": false,"
            ),
            ModelError::Unsupported(_)
        ));
    }
}
