//! Tests of [`GgufMetadata`]: the typed getters (coercions that lose nothing, wrong types and
//! missing keys reported as errors naming the key) and `insert` replacing in place.

use super::*;

fn sample() -> GgufMetadata {
    let mut m = GgufMetadata::new("test.gguf");
    m.insert("general.architecture", GgufValue::String("llama".into()));
    m.insert("llama.block_count", GgufValue::U32(30));
    m.insert("llama.context_length", GgufValue::U64(8192));
    m.insert("neg", GgufValue::I32(-1));
    m.insert("eps", GgufValue::F32(1e-5));
    m.insert("add_bos", GgufValue::Bool(true));
    m.insert(
        "tokens",
        GgufValue::Array(GgufArray::String(vec!["a".into(), "b".into()])),
    );
    m.insert("types", GgufValue::Array(GgufArray::I32(vec![1, 3, -2])));
    m.insert("scores", GgufValue::Array(GgufArray::F64(vec![0.5, -1.0])));
    m
}

#[test]
fn getters_read_their_types() {
    let m = sample();
    assert_eq!(m.get_str("general.architecture").unwrap(), Some("llama"));
    assert_eq!(m.get_u32("llama.block_count").unwrap(), Some(30));
    assert_eq!(m.get_u32("llama.context_length").unwrap(), Some(8192));
    assert_eq!(m.get_usize("llama.block_count").unwrap(), Some(30));
    assert_eq!(m.get_i32("neg").unwrap(), Some(-1));
    assert_eq!(m.get_f32("eps").unwrap(), Some(1e-5));
    assert_eq!(m.get_bool("add_bos").unwrap(), Some(true));
    assert_eq!(
        m.get_str_array("tokens").unwrap().unwrap(),
        &["a".to_string(), "b".to_string()]
    );
    assert_eq!(m.get_i32_array("types").unwrap(), Some(vec![1, 3, -2]));
    assert_eq!(m.get_f32_array("scores").unwrap(), Some(vec![0.5, -1.0]));
    assert_eq!(
        m.keys().collect::<Vec<_>>()[..3],
        [
            "general.architecture",
            "llama.block_count",
            "llama.context_length"
        ]
    );
}

#[test]
fn absent_keys_are_none_and_required_ones_fail() {
    let m = sample();
    assert_eq!(m.get_str("nope").unwrap(), None);
    assert_eq!(m.get_f32_array("nope").unwrap(), None);
    let err = m.require_u32("nope").unwrap_err().to_string();
    assert!(err.contains("`nope` is missing"), "{err}");
}

#[test]
fn wrong_types_are_format_errors_naming_the_key() {
    let m = sample();
    let err = m.get_u32("neg").unwrap_err().to_string();
    assert!(err.contains("`neg`") && err.contains("int32 -1"), "{err}");
    let err = m.get_str("llama.block_count").unwrap_err().to_string();
    assert!(err.contains("expected a string"), "{err}");
    assert!(m.get_u32_array("types").is_err(), "-2 does not fit u32");
    assert!(m.get_str_array("types").is_err());
    assert!(m.get_f32("llama.block_count").is_err());
}

#[test]
fn insert_replaces_in_place() {
    let mut m = sample();
    let n = m.len();
    m.insert("llama.block_count", GgufValue::U32(2));
    assert_eq!(m.len(), n);
    assert_eq!(m.get_u32("llama.block_count").unwrap(), Some(2));
}
