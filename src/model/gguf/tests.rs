//! Reader tests on files built by [`super::writer::GgufWriter`] (and bytes patched by hand).

use super::writer::testing::{self, tiny_model, write_temp};
use super::*;
use crate::model::config::Architecture;
use crate::model::hf_config::config_from_gguf;
use crate::tensor::WeightSource;

fn open_bytes(bytes: &[u8]) -> Result<GgufFile, ModelError> {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    std::io::Write::write_all(&mut f, bytes).unwrap();
    GgufFile::open(f.path())
}

fn err_text(r: Result<GgufFile, ModelError>) -> String {
    r.expect_err("expected an error").to_string()
}

#[test]
fn every_value_type_round_trips() {
    let values = [
        ("u8", GgufValue::U8(200)),
        ("i8", GgufValue::I8(-100)),
        ("u16", GgufValue::U16(60000)),
        ("i16", GgufValue::I16(-30000)),
        ("u32", GgufValue::U32(4_000_000_000)),
        ("i32", GgufValue::I32(-2_000_000_000)),
        ("f32", GgufValue::F32(1.25)),
        ("bool", GgufValue::Bool(true)),
        ("str", GgufValue::String("héllo ✓".into())),
        ("u64", GgufValue::U64(u64::MAX)),
        ("i64", GgufValue::I64(i64::MIN)),
        ("f64", GgufValue::F64(-0.1)),
        (
            "a_str",
            GgufValue::Array(GgufArray::String(vec!["a".into(), "".into(), "ü".into()])),
        ),
        ("a_i32", GgufValue::Array(GgufArray::I32(vec![1, -1, 6]))),
        ("a_f32", GgufValue::Array(GgufArray::F32(vec![0.5, -0.25]))),
        (
            "a_bool",
            GgufValue::Array(GgufArray::Bool(vec![true, false])),
        ),
        ("a_u8", GgufValue::Array(GgufArray::U8(vec![]))),
        (
            "a_nested",
            GgufValue::Array(GgufArray::Array(vec![
                GgufArray::U64(vec![7]),
                GgufArray::I8(vec![-1, 2]),
            ])),
        ),
    ];
    let mut w = GgufWriter::new();
    for (k, v) in &values {
        w.metadata(k, v.clone());
    }
    let f = write_temp(&w);
    let g = GgufFile::open(f.path()).unwrap();
    assert_eq!(g.version(), 3);
    assert_eq!(g.metadata().len(), values.len());
    for ((k, v), (k2, v2)) in values.iter().zip(g.metadata().iter()) {
        assert_eq!((*k, v), (k2, v2));
    }
    assert!(g.tensors().is_empty());
    assert_eq!(GgufMetadata::read(f.path()).unwrap(), *g.metadata());
}

#[test]
fn tensors_are_mapped_in_place_with_their_directory() {
    let w = tiny_model("llama");
    let f = write_temp(&w);
    let g = GgufFile::open(f.path()).unwrap();
    assert_eq!(g.alignment(), 32);
    let embd = g.tensor_info("token_embd.weight").unwrap();
    assert_eq!(embd.dims, [testing::HIDDEN, testing::VOCAB]);
    assert_eq!(embd.ggml_type, GgmlType::Q8_0);
    assert_eq!(embd.hf_shape(), [testing::VOCAB, testing::HIDDEN]);
    let data = g.tensor_data(embd).unwrap();
    assert_eq!(data.len(), testing::VOCAB * 34);
    assert_eq!(data.as_ptr() as usize % 32, 0, "data is aligned in the map");
    assert_eq!(&data[34 + 2..34 + 4], &[1, 1], "row 1 quants are 1");
    let norm = g.tensor_info("output_norm.weight").unwrap();
    assert_eq!(
        g.tensor_data(norm).unwrap(),
        &testing::f32_bytes(testing::HIDDEN, 0.5)[..]
    );
}

#[test]
fn truncated_data_names_the_tensor() {
    let bytes = tiny_model("llama").to_bytes();
    let err = err_text(open_bytes(&bytes[..bytes.len() - 1]));
    // The last tensor written is blk.0.ffn_norm.weight.
    assert!(
        err.contains("`blk.0.ffn_norm.weight`") && err.contains("truncated"),
        "{err}"
    );
    assert!(err.contains("malformed gguf"), "{err}");
}

#[test]
fn truncated_header_is_a_format_error() {
    let bytes = tiny_model("llama").to_bytes();
    for cut in [3, 10, 30, 200] {
        let err = err_text(open_bytes(&bytes[..cut]));
        assert!(err.contains("malformed gguf"), "cut {cut}: {err}");
    }
}

#[test]
fn bad_magic_version_and_endianness() {
    let mut bytes = tiny_model("llama").to_bytes();
    assert!(err_text(open_bytes(b"GGML\x03\0\0\0")).contains("not a GGUF file"));
    bytes[4..8].copy_from_slice(&1u32.to_le_bytes());
    assert!(err_text(open_bytes(&bytes)).contains("unsupported: "));
    bytes[4..8].copy_from_slice(&3u32.to_be_bytes());
    assert!(err_text(open_bytes(&bytes)).contains("big-endian"));
}

#[test]
fn corrupt_counts_do_not_allocate() {
    let mut bytes = tiny_model("llama").to_bytes();
    bytes[16..24].copy_from_slice(&(u64::MAX / 2).to_le_bytes()); // metadata count
    let err = err_text(open_bytes(&bytes));
    assert!(err.contains("metadata count"), "{err}");
}

#[test]
fn misaligned_offsets_are_refused() {
    let mut w = GgufWriter::new();
    w.metadata("general.alignment", GgufValue::U32(32));
    w.tensor("a.weight", &[4], GgmlType::F32, testing::f32_bytes(4, 0.0));
    w.tensor("b.weight", &[4], GgmlType::F32, testing::f32_bytes(4, 0.0));
    let mut bytes = w.to_bytes();
    // Raise the declared alignment to 64 after layout: b's offset 32 is then misaligned.
    let key = b"general.alignment";
    let at = bytes.windows(key.len()).position(|x| x == key).unwrap() + key.len() + 4;
    bytes[at..at + 4].copy_from_slice(&64u32.to_le_bytes());
    let err = err_text(open_bytes(&bytes));
    assert!(
        err.contains("`b.weight`") && err.contains("alignment 64"),
        "{err}"
    );
}

#[test]
fn unsupported_tensor_types_are_named() {
    let mut w = tiny_model("llama");
    w.tensor("blk.0.extra.weight", &[256], GgmlType(13), vec![0; 176]); // Q5_K
    let f = write_temp(&w);
    let g = GgufFile::open(f.path()).unwrap();
    let info = g.tensor_info("blk.0.extra.weight").unwrap().clone();
    let err = g.tensor_data(&info).unwrap_err().to_string();
    assert!(
        err.contains("`blk.0.extra.weight`") && err.contains("Q5_K"),
        "{err}"
    );
}

#[test]
fn duplicate_keys_are_refused() {
    let mut w = GgufWriter::new();
    w.metadata("k", GgufValue::U8(1))
        .metadata("j", GgufValue::U8(2));
    let mut bytes = w.to_bytes();
    let at = bytes.iter().rposition(|&b| b == b'j').unwrap();
    bytes[at] = b'k';
    assert!(err_text(open_bytes(&bytes)).contains("duplicate metadata key `k`"));
}

#[test]
fn llama_weights_get_hf_names_shapes_and_unpermuted_qk() {
    let f = write_temp(&tiny_model("llama"));
    let g = GgufFile::open(f.path()).unwrap();
    let config = config_from_gguf(&g).unwrap();
    assert_eq!(config.architecture, Architecture::Llama);
    assert!(config.tie_word_embeddings);
    let w = GgufWeights::new(g, &config).unwrap();
    assert!(w.contains("model.embed_tokens.weight"));
    assert!(!w.contains("lm_head.weight"));
    assert_eq!(w.names().len(), 11);
    let v = w.tensor("model.layers.0.self_attn.v_proj.weight").unwrap();
    assert_eq!(
        v.shape,
        [testing::KV_HEADS * testing::HEAD_DIM, testing::HIDDEN]
    );
    assert_eq!(v.dtype, WeightDType::F32);

    // Stored row s of attn_q holds values 0·1000 + 32·s + (0..32); HF row h·hd + a·hd/2 + j
    // must come from stored row h·hd + 2j + a.
    for (name, base, heads) in [
        ("q_proj", 0.0, testing::HEADS),
        ("k_proj", 1000.0, testing::KV_HEADS),
    ] {
        let t = w
            .tensor(&format!("model.layers.0.self_attn.{name}.weight"))
            .unwrap();
        assert_eq!(t.shape, [heads * testing::HEAD_DIM, testing::HIDDEN]);
        let vals = crate::quant::dequantize_view(&t);
        let (hd, half) = (testing::HEAD_DIM, testing::HEAD_DIM / 2);
        for h in 0..heads {
            for a in 0..2 {
                for j in 0..half {
                    let hf_row = h * hd + a * half + j;
                    let stored_row = h * hd + 2 * j + a;
                    let first = vals[hf_row * testing::HIDDEN];
                    assert_eq!(
                        first,
                        base + (stored_row * testing::HIDDEN) as f32,
                        "{name} row {hf_row}"
                    );
                }
            }
        }
    }
}

#[test]
fn qwen3_weights_are_not_permuted() {
    let f = write_temp(&tiny_model("qwen3"));
    let g = GgufFile::open(f.path()).unwrap();
    let config = config_from_gguf(&g).unwrap();
    assert_eq!(config.architecture, Architecture::Qwen3);
    let w = GgufWeights::new(g, &config).unwrap();
    let q = w.tensor("model.layers.0.self_attn.q_proj.weight").unwrap();
    assert_eq!(
        q.data,
        &testing::f32_bytes(testing::HIDDEN * testing::HEADS * testing::HEAD_DIM, 0.0)[..]
    );
    let qn = w.tensor("model.layers.0.self_attn.q_norm.weight").unwrap();
    assert_eq!(qn.shape, [testing::HEAD_DIM]);
}

#[test]
fn unknown_tensor_names_and_types_are_unsupported() {
    let mut w = tiny_model("llama");
    w.tensor(
        "blk.0.ffn_gate_exps.weight",
        &[4],
        GgmlType::F32,
        testing::f32_bytes(4, 0.0),
    );
    let f = write_temp(&w);
    let g = GgufFile::open(f.path()).unwrap();
    let config = config_from_gguf(&g).unwrap();
    let err = GgufWeights::new(g, &config).unwrap_err().to_string();
    assert!(
        err.starts_with("unsupported") && err.contains("`blk.0.ffn_gate_exps.weight`"),
        "{err}"
    );

    let mut w = tiny_model("llama");
    w.tensor(
        "output.weight",
        &[testing::HIDDEN, testing::VOCAB],
        GgmlType(6),
        vec![0; 10 * 22],
    ); // Q5_0
    let f = write_temp(&w);
    let g = GgufFile::open(f.path()).unwrap();
    let config = config_from_gguf(&g).unwrap();
    assert!(!config.tie_word_embeddings);
    let err = GgufWeights::new(g, &config).unwrap_err().to_string();
    assert!(
        err.contains("`output.weight`") && err.contains("Q5_0"),
        "{err}"
    );
}

#[test]
fn truncations_and_corruptions_never_panic() {
    let bytes = tiny_model("llama").to_bytes();
    let f = tempfile::NamedTempFile::new().unwrap();
    let load = |b: &[u8]| {
        f.as_file().set_len(0).unwrap();
        std::io::Write::write_all(&mut f.as_file(), b).unwrap();
        if let Ok(g) = GgufFile::open(f.path()) {
            if let Ok(config) = config_from_gguf(&g) {
                if let Ok(w) = GgufWeights::new(g, &config) {
                    for name in w.names() {
                        let t = w.tensor(&name).unwrap();
                        let _ = crate::quant::dequantize_view(&t);
                    }
                }
            }
        }
    };
    let header_len = {
        let tmp = write_temp(&tiny_model("llama"));
        GgufFile::open(tmp.path()).unwrap().data_offset
    };
    // Every cut inside the header, and a few inside the data.
    for cut in (0..header_len).chain((header_len..bytes.len()).step_by(997)) {
        load(&bytes[..cut]);
    }
    // Deterministic single-byte corruptions over the header (an LCG picks positions and values).
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    for _ in 0..400 {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let pos = (state >> 33) as usize % header_len;
        let mut corrupt = bytes.clone();
        corrupt[pos] ^= (state >> 13) as u8 | 1;
        load(&corrupt);
    }
}
