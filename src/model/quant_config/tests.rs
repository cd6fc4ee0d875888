//! `quantization_config` parsing and the per-module decision.

use serde_json::json;

use super::*;

fn cfg(q: Value) -> QuantConfig {
    QuantConfig::from_config_json(&json!({ "quantization_config": q }))
        .unwrap()
        .unwrap()
}

/// The llm-compressor W4A16_ASYM recipe seen for Qwen3.5 (qwen3_5.md §2.4).
fn qwen_awq_asym() -> Value {
    json!({
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "quantization_status": "compressed",
        "config_groups": {"group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128,
                        "symmetric": false, "actorder": null, "dynamic": false},
            "input_activations": null, "output_activations": null
        }},
        "ignore": ["lm_head", "re:.*linear_attn.in_proj_b$", "re:.*linear_attn.in_proj_a$"]
    })
}

#[test]
fn no_quantization_config_is_none() {
    assert!(
        QuantConfig::from_config_json(&json!({"model_type": "llama"}))
            .unwrap()
            .is_none()
    );
}

#[test]
fn ignore_lists_take_exact_names_and_regexes() {
    let c = cfg(qwen_awq_asym());
    let packed = Decision::Packed(SchemeTemplate::CtInt4 {
        group_size: Some(128),
        symmetric: false,
    });
    assert_eq!(
        c.decide("model.language_model.layers.0.mlp.up_proj")
            .unwrap(),
        packed
    );
    assert_eq!(
        c.decide("model.language_model.layers.0.linear_attn.in_proj_qkv")
            .unwrap(),
        packed
    );
    for dense in [
        "lm_head",
        "model.language_model.layers.0.linear_attn.in_proj_a",
        "model.language_model.layers.7.linear_attn.in_proj_b",
    ] {
        assert_eq!(c.decide(dense).unwrap(), Decision::Dense, "{dense}");
    }
    // `re:` matches from the start (Python's re.match), not anywhere.
    let c = cfg(json!({
        "quant_method": "compressed-tensors", "format": "pack-quantized",
        "config_groups": {"g": {"targets": ["re:model\\.layers\\.1\\..*"],
            "weights": {"num_bits": 4, "type": "int", "strategy": "channel", "symmetric": true}}},
        "ignore": ["model.layers.1.mlp.down_proj"]
    }));
    assert_eq!(
        c.decide("model.layers.1.mlp.up_proj").unwrap(),
        Decision::Packed(SchemeTemplate::CtInt4 {
            group_size: None,
            symmetric: true
        })
    );
    assert_eq!(
        c.decide("xmodel.layers.1.mlp.up_proj").unwrap(),
        Decision::Dense
    );
    assert_eq!(
        c.decide("model.layers.0.mlp.up_proj").unwrap(),
        Decision::Dense
    );
    assert_eq!(
        c.decide("model.layers.1.mlp.down_proj").unwrap(),
        Decision::Dense
    );
}

#[test]
fn nvfp4_presets_parse_and_w4a4_is_flagged() {
    let w = json!({"num_bits": 4, "type": "float", "strategy": "tensor_group",
                   "group_size": 16, "symmetric": true, "scale_dtype": "float8_e4m3fn"});
    let a16 = cfg(
        json!({"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": w}}}),
    );
    assert_eq!(
        a16.decide("model.layers.0.self_attn.q_proj").unwrap(),
        Decision::Packed(SchemeTemplate::CtNvfp4 { w4a4: false })
    );
    let a4 = cfg(json!({"quant_method": "compressed-tensors",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": w,
            "format": "nvfp4-pack-quantized",
            "input_activations": {"num_bits": 4, "type": "float", "strategy": "tensor_group",
                                  "group_size": 16, "dynamic": "local"}}}}));
    assert_eq!(
        a4.decide("model.layers.0.self_attn.q_proj").unwrap(),
        Decision::Packed(SchemeTemplate::CtNvfp4 { w4a4: true })
    );
}

#[test]
fn an_unsupported_scheme_names_the_module_and_the_scheme() {
    let c = cfg(
        json!({"quant_method": "compressed-tensors", "format": "float-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
            "input_activations": {"num_bits": 8, "type": "float", "dynamic": true}}},
        "ignore": ["lm_head"]}),
    );
    let e = c
        .decide("model.layers.3.mlp.gate_proj")
        .unwrap_err()
        .to_string();
    assert!(e.contains("`model.layers.3.mlp.gate_proj`"), "{e}");
    assert!(
        e.contains("float-quantized") && e.contains("8-bit float"),
        "{e}"
    );
    // Ignored modules still load.
    assert_eq!(c.decide("lm_head").unwrap(), Decision::Dense);
    let e = QuantConfig::from_config_json(
        &json!({"quantization_config": {"quant_method": "bitsandbytes"}}),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("bitsandbytes"), "{e}");
}

#[test]
fn awq_and_gptq_configs() {
    let awq = cfg(
        json!({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": true,
        "version": "gemm", "modules_to_not_convert": ["in_proj_a", "in_proj_b"]}),
    );
    assert_eq!(
        awq.decide("model.layers.0.mlp.up_proj").unwrap(),
        Decision::Packed(SchemeTemplate::AwqGemm { group_size: 128 })
    );
    assert_eq!(awq.decide("lm_head").unwrap(), Decision::Dense);
    assert_eq!(
        awq.decide("model.layers.0.linear_attn.in_proj_a").unwrap(),
        Decision::Dense
    );
    let gemv = cfg(json!({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"}));
    assert!(gemv
        .decide("model.layers.0.mlp.up_proj")
        .unwrap_err()
        .to_string()
        .contains("gemv"));

    let gptq = cfg(
        json!({"quant_method": "gptq", "bits": 4, "group_size": -1, "desc_act": true,
        "sym": true}),
    );
    assert_eq!(
        gptq.decide("model.layers.0.mlp.up_proj").unwrap(),
        Decision::Packed(SchemeTemplate::Gptq {
            group_size: None,
            zero_minus_one: true
        })
    );
    let v2 = cfg(json!({"quant_method": "gptq", "bits": 4, "group_size": 64,
        "checkpoint_format": "gptq_v2", "lm_head": true}));
    assert_eq!(
        v2.decide("lm_head").unwrap(),
        Decision::Packed(SchemeTemplate::Gptq {
            group_size: Some(64),
            zero_minus_one: false
        })
    );
    let three = cfg(json!({"quant_method": "gptq", "bits": 3, "group_size": 128}));
    let e = three
        .decide("model.layers.0.mlp.up_proj")
        .unwrap_err()
        .to_string();
    assert!(e.contains("3-bit") && e.contains("up_proj"), "{e}");
}
