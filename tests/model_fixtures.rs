//! The tiny HF and GGUF fixtures made by `scripts/gen-golden.py` (transformers + gguf-py)
//! through `ModelFiles::open`: configs, dtypes, and tensor values across formats.
//!
//! - `tiny-llama-f32.gguf` was written from `tiny-llama/` with llama.cpp's Q/K row permutation,
//!   so every tensor we read back must be bit-identical to the safetensors one.
//! - The quantized GGUFs must stay within each format's rounding bound per 32-element block
//!   (a wrong block layout or row order would be off by the weights' own magnitude).
//! - `tiny-llama-bf16/` is `tiny-llama/` rounded to bfloat16 (round to nearest even).

use std::path::{Path, PathBuf};

use half::bf16;
use kiln::model::{Architecture, ModelFiles, ModelFormat};
use kiln::quant::dequantize_view;
use kiln::tensor::WeightDType;

fn fixture(name: &str) -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    assert!(p.exists(), "fixture {} is missing", p.display());
    p
}

fn open(name: &str) -> ModelFiles {
    ModelFiles::open(&fixture(name)).unwrap_or_else(|e| panic!("open {name}: {e}"))
}

#[test]
fn tiny_llama_safetensors() {
    let m = open("tiny-llama");
    assert_eq!(m.format, ModelFormat::HfFolder);
    let c = &m.config;
    assert_eq!(c.architecture, Architecture::Llama);
    assert_eq!(
        (c.hidden_size, c.intermediate_size, c.num_hidden_layers),
        (64, 128, 2)
    );
    assert_eq!(
        (c.num_attention_heads, c.num_key_value_heads, c.head_dim),
        (4, 2, 16)
    );
    assert_eq!(
        (c.vocab_size, c.rope_theta, c.rms_norm_eps),
        (256, 10000.0, 1e-5)
    );
    assert!(!c.tie_word_embeddings);
    assert_eq!(m.weights.names().len(), 21);
    assert_eq!(m.weights.tensor("lm_head.weight").unwrap().shape, [256, 64]);
    assert!(m.tokenizer_files.tokenizer_json.is_none());
    assert!(m.tokenizer_files.generation_config_json.is_some());
    for name in m.weights.names() {
        assert_eq!(
            m.weights.tensor(&name).unwrap().dtype,
            WeightDType::F32,
            "{name}"
        );
    }
}

#[test]
fn tiny_qwen3_safetensors() {
    let m = open("tiny-qwen3");
    assert_eq!(m.config.architecture, Architecture::Qwen3);
    assert!(m.config.tie_word_embeddings);
    assert!(!m.weights.contains("lm_head.weight"));
    let qn = m
        .weights
        .tensor("model.layers.1.self_attn.q_norm.weight")
        .unwrap();
    assert_eq!(qn.shape, [16]);
    assert_eq!(
        m.weights
            .tensor("model.layers.0.self_attn.q_proj.weight")
            .unwrap()
            .shape,
        [64, 64]
    );
}

#[test]
fn bf16_folder_is_the_f32_model_rounded() {
    let f32s = open("tiny-llama");
    let bf16s = open("tiny-llama-bf16");
    assert_eq!(f32s.config, bf16s.config);
    assert_eq!(f32s.weights.names(), bf16s.weights.names());
    for name in f32s.weights.names() {
        let t = bf16s.weights.tensor(&name).unwrap();
        assert_eq!(t.dtype, WeightDType::BF16, "{name}");
        let want: Vec<f32> = dequantize_view(&f32s.weights.tensor(&name).unwrap())
            .into_iter()
            .map(|v| bf16::from_f32(v).to_f32())
            .collect();
        assert_eq!(dequantize_view(&t), want, "{name}");
    }
}

#[test]
fn f32_gguf_reads_back_bit_identical_to_safetensors() {
    let st = open("tiny-llama");
    let gg = open("tiny-llama-f32.gguf");
    assert_eq!(gg.format, ModelFormat::Gguf);
    assert_eq!(st.config, gg.config);
    assert_eq!(st.weights.names(), gg.weights.names());
    for name in st.weights.names() {
        let a = st.weights.tensor(&name).unwrap();
        let b = gg.weights.tensor(&name).unwrap();
        assert_eq!((a.dtype, a.shape), (b.dtype, b.shape), "{name}");
        assert!(a.data == b.data, "{name}: bytes differ");
    }
}

#[test]
fn quantized_ggufs_stay_within_their_rounding_bounds() {
    let st = open("tiny-llama");
    // Worst |error| per block relative to the block's max |value|: Q8_0 rounds to amax/127
    // (half a step, plus the f16 scale); Q4_0 may clip to a full step of amax/8; Q4_1 steps
    // are (max - min)/15 ≤ 2·amax/15, half of that plus f16 scale/min rounding.
    for (file, dtype, bound) in [
        ("tiny-llama-q8_0.gguf", WeightDType::Q8_0, 0.005),
        ("tiny-llama-q4_0.gguf", WeightDType::Q4_0, 0.13),
        ("tiny-llama-q4_1.gguf", WeightDType::Q4_1, 0.075),
    ] {
        let gg = open(file);
        assert_eq!(st.config, gg.config, "{file}");
        let mut quantized = 0;
        for name in st.weights.names() {
            let t = gg.weights.tensor(&name).unwrap();
            let want = dequantize_view(&st.weights.tensor(&name).unwrap());
            let got = dequantize_view(&t);
            if t.dtype == WeightDType::F32 {
                assert_eq!(got, want, "{file} {name}");
                continue;
            }
            assert_eq!(t.dtype, dtype, "{file} {name}");
            quantized += 1;
            for (i, (w, g)) in want.chunks(32).zip(got.chunks(32)).enumerate() {
                let amax = w.iter().fold(0f32, |m, v| m.max(v.abs()));
                let err = w.iter().zip(g).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
                assert!(
                    err <= bound * amax,
                    "{file} {name} block {i}: error {err} > {bound} × {amax}"
                );
            }
        }
        assert_eq!(quantized, 16, "{file}: the 2-D weights are quantized");
    }
}
