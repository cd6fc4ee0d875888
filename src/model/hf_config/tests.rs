//! `config.json` variants (transformers 4 and 5) and GGUF metadata → `ModelConfig`.

use super::*;
use crate::model::gguf::writer::testing::{tiny_model, write_temp};
use crate::model::gguf::GgufValue;

/// A transformers 5.24 `LlamaConfig(...).to_json_string()` (trimmed of unused keys).
const LLAMA_V5: &str = r#"{
  "attention_bias": false, "bos_token_id": 1, "eos_token_id": 2, "head_dim": 16,
  "hidden_act": "silu", "hidden_size": 64, "intermediate_size": 128,
  "max_position_embeddings": 2048, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06, "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"},
  "tie_word_embeddings": true, "vocab_size": 100
}"#;

/// SmolLM2-135M-Instruct's config.json as published (transformers 4 form).
const SMOLLM2_V4: &str = r#"{
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 576,
  "initializer_range": 0.041666666666666664, "intermediate_size": 1536, "is_llama_config": true,
  "max_position_embeddings": 8192, "model_type": "llama", "num_attention_heads": 9,
  "num_hidden_layers": 30, "num_key_value_heads": 3, "pad_token_id": 2, "pretraining_tp": 1,
  "rms_norm_eps": 1e-05, "rope_interleaved": false, "rope_scaling": null, "rope_theta": 100000,
  "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.42.3",
  "use_cache": true, "vocab_size": 49152
}"#;

fn parse(text: &str) -> Result<ModelConfig, ModelError> {
    config_from_json(text, Path::new("config.json"))
}

fn with(base: &str, key: &str, value: &str) -> String {
    let mut v: serde_json::Value = serde_json::from_str(base).unwrap();
    v[key] = serde_json::from_str(value).unwrap();
    v.to_string()
}

#[test]
fn transformers_4_config() {
    let c = parse(SMOLLM2_V4).unwrap();
    assert_eq!(
        c,
        ModelConfig {
            architecture: Architecture::Llama,
            hidden_size: 576,
            intermediate_size: 1536,
            num_hidden_layers: 30,
            num_attention_heads: 9,
            num_key_value_heads: 3,
            head_dim: 64,
            rms_norm_eps: 1e-5,
            rope_theta: 100000.0,
            vocab_size: 49152,
            max_position_embeddings: 8192,
            tie_word_embeddings: true,
            attention_bias: false,
            hybrid: None,
        }
    );
}

#[test]
fn transformers_5_config() {
    let c = parse(LLAMA_V5).unwrap();
    assert_eq!(c.head_dim, 16);
    assert_eq!(c.rope_theta, 100000.0);
    assert_eq!(c.num_key_value_heads, 2);
    assert!(c.tie_word_embeddings);
}

#[test]
fn qwen3_with_explicit_head_dim() {
    let text = with(
        &with(LLAMA_V5, "model_type", r#""qwen3""#),
        "head_dim",
        "32",
    );
    let text = with(
        &text,
        "layer_types",
        r#"["full_attention", "full_attention"]"#,
    );
    let text = with(&text, "sliding_window", "null");
    let c = parse(&text).unwrap();
    assert_eq!(c.architecture, Architecture::Qwen3);
    assert_eq!(c.head_dim, 32);
}

#[test]
fn defaults_follow_transformers() {
    let mut v: serde_json::Value = serde_json::from_str(LLAMA_V5).unwrap();
    let o = v.as_object_mut().unwrap();
    for k in [
        "num_key_value_heads",
        "head_dim",
        "rope_parameters",
        "tie_word_embeddings",
        "attention_bias",
    ] {
        o.remove(k);
    }
    let c = parse(&v.to_string()).unwrap();
    assert_eq!((c.num_key_value_heads, c.head_dim), (4, 16));
    assert_eq!(c.rope_theta, 10000.0);
    assert!(!c.tie_word_embeddings && !c.attention_bias);
}

#[test]
fn unsupported_features_are_named() {
    let cases = [
        (
            with(LLAMA_V5, "model_type", r#""mistral""#),
            "architecture `mistral`",
        ),
        (
            with(
                SMOLLM2_V4,
                "rope_scaling",
                r#"{"rope_type": "llama3", "factor": 8.0}"#,
            ),
            "rope scaling `llama3`",
        ),
        (
            with(
                SMOLLM2_V4,
                "rope_scaling",
                r#"{"type": "linear", "factor": 2.0}"#,
            ),
            "rope scaling `linear`",
        ),
        (
            with(
                LLAMA_V5,
                "rope_parameters",
                r#"{"rope_theta": 1e6, "rope_type": "yarn"}"#,
            ),
            "rope scaling `yarn`",
        ),
        (
            with(LLAMA_V5, "hidden_act", r#""gelu""#),
            "hidden_act `gelu`",
        ),
        (with(LLAMA_V5, "mlp_bias", "true"), "mlp_bias"),
        (
            with(LLAMA_V5, "use_sliding_window", "true"),
            "sliding-window",
        ),
        (
            with(LLAMA_V5, "layer_types", r#"["sliding_attention"]"#),
            "sliding_attention",
        ),
    ];
    for (text, needle) in cases {
        let err = parse(&text).unwrap_err();
        assert!(matches!(err, ModelError::Unsupported(_)), "{err}");
        assert!(
            err.to_string().contains(needle),
            "{err} should name {needle}"
        );
    }
}

#[test]
fn malformed_configs_are_format_errors() {
    for text in [
        "{",
        r#"{"model_type": "llama"}"#,
        &with(LLAMA_V5, "num_key_value_heads", "3"),
        &with(LLAMA_V5, "hidden_size", "0"),
    ] {
        let err = parse(text).unwrap_err();
        assert!(
            matches!(
                err,
                ModelError::Format {
                    format: "config.json",
                    ..
                }
            ),
            "{err}"
        );
    }
}

#[test]
fn gguf_metadata_to_config() {
    let f = write_temp(&tiny_model("qwen3"));
    let c = config_from_gguf(&GgufFile::open(f.path()).unwrap()).unwrap();
    assert_eq!(
        c,
        ModelConfig {
            architecture: Architecture::Qwen3,
            hidden_size: 32,
            intermediate_size: 64,
            num_hidden_layers: 1,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            head_dim: 8,
            rms_norm_eps: 1e-6,
            rope_theta: 10000.0,
            vocab_size: 10,
            max_position_embeddings: 128,
            tie_word_embeddings: true,
            attention_bias: false,
            hybrid: None,
        }
    );
}

#[test]
fn gguf_unsupported_features_are_named() {
    let open = |w: &crate::model::gguf::GgufWriter| {
        let f = write_temp(w);
        config_from_gguf(&GgufFile::open(f.path()).unwrap()).unwrap_err()
    };
    let mut w = tiny_model("llama");
    w.metadata("llama.rope.scaling.type", GgufValue::String("yarn".into()));
    assert!(open(&w).to_string().contains("rope scaling `yarn`"));

    let mut w = tiny_model("llama");
    w.metadata("general.architecture", GgufValue::String("gemma2".into()));
    let err = open(&w);
    assert!(
        matches!(err, ModelError::Unsupported(_)) && err.to_string().contains("`gemma2`"),
        "{err}"
    );

    let mut w = tiny_model("llama");
    w.metadata("llama.rope.dimension_count", GgufValue::U32(4));
    assert!(open(&w).to_string().contains("partial rotary"));

    let mut w = tiny_model("llama");
    w.metadata("llama.attention.head_count_kv", GgufValue::U32(3));
    assert!(matches!(open(&w), ModelError::Format { .. }));

    let mut w = tiny_model("llama");
    w.metadata("llama.block_count", GgufValue::String("thirty".into()));
    assert!(open(&w).to_string().contains("`llama.block_count`"));

    let mut w = tiny_model("llama");
    w.tensor(
        "rope_freqs.weight",
        &[4],
        crate::model::gguf::GgmlType::F32,
        vec![0; 16],
    );
    assert!(open(&w).to_string().contains("rope_freqs.weight"));

    let mut w = tiny_model("llama");
    w.metadata("llama.vocab_size", GgufValue::U32(11));
    assert!(open(&w)
        .to_string()
        .contains("token_embd.weight has 10 rows"));
}
