//! Synthetic checkpoints written with the `safetensors` crate's serializer (and by hand).

use super::*;
use half::{bf16, f16};
use safetensors::tensor::TensorView as StView;

fn f32_bytes(vals: &[f32]) -> Vec<u8> {
    vals.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// `(name, dtype, shape, bytes)` serialized as one safetensors file.
fn serialize(tensors: &[(&str, Dtype, Vec<usize>, Vec<u8>)]) -> Vec<u8> {
    let views: Vec<(String, StView<'_>)> = tensors
        .iter()
        .map(|(n, d, s, b)| (n.to_string(), StView::new(*d, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize(views, None).unwrap()
}

fn sample() -> Vec<(&'static str, Dtype, Vec<usize>, Vec<u8>)> {
    let h: Vec<u8> = [1.0f32, -2.0, 0.5]
        .iter()
        .flat_map(|v| f16::from_f32(*v).to_le_bytes())
        .collect();
    let b: Vec<u8> = [3.0f32, 4.0]
        .iter()
        .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
        .collect();
    vec![
        (
            "model.norm.weight",
            Dtype::F32,
            vec![2, 2],
            f32_bytes(&[1.0, 2.0, 3.0, 4.0]),
        ),
        (
            "model.layers.0.self_attn.q_proj.weight",
            Dtype::F16,
            vec![3, 1],
            h,
        ),
        ("lm_head.weight", Dtype::BF16, vec![1, 2], b),
        ("position_ids", Dtype::F64, vec![2], vec![0; 16]),
        (
            "q.weight_packed",
            Dtype::I32,
            vec![1, 2],
            [-1i32, 0x1234_5678]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
        ),
        ("q.weight_scale", Dtype::F8_E4M3, vec![2], vec![0x38, 0xC0]),
    ]
}

#[test]
fn single_file_is_mapped_with_hf_names_and_dtypes() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(SINGLE_FILE), serialize(&sample())).unwrap();
    let w = SafetensorsWeights::open_dir(dir.path()).unwrap();
    assert_eq!(
        w.names(),
        [
            "lm_head.weight",
            "model.layers.0.self_attn.q_proj.weight",
            "model.norm.weight",
            "position_ids",
            "q.weight_packed",
            "q.weight_scale"
        ]
    );
    // The parts of packed linears are served as stored.
    let p = w.tensor("q.weight_packed").unwrap();
    assert_eq!((p.dtype, p.shape), (WeightDType::I32, &[1usize, 2][..]));
    assert_eq!(&p.data[4..8], &0x1234_5678i32.to_le_bytes());
    let f8 = w.tensor("q.weight_scale").unwrap();
    assert_eq!(f8.dtype, WeightDType::F8E4M3);
    assert_eq!(crate::quant::dequantize_view(&f8), [1.0, -2.0]);
    let n = w.tensor("model.norm.weight").unwrap();
    assert_eq!((n.dtype, n.shape), (WeightDType::F32, &[2usize, 2][..]));
    assert_eq!(crate::quant::dequantize_view(&n), [1.0, 2.0, 3.0, 4.0]);
    let q = w.tensor("model.layers.0.self_attn.q_proj.weight").unwrap();
    assert_eq!(q.dtype, WeightDType::F16);
    assert_eq!(crate::quant::dequantize_view(&q), [1.0, -2.0, 0.5]);
    let l = w.tensor("lm_head.weight").unwrap();
    assert_eq!(crate::quant::dequantize_view(&l), [3.0, 4.0]);
    // Mapped, not copied: the slice points into the map.
    let map = &w.shards[0];
    let range = map.as_ptr() as usize..map.as_ptr() as usize + map.len();
    assert!(range.contains(&(n.data.as_ptr() as usize)));

    let err = w.tensor("position_ids").unwrap_err();
    assert!(matches!(err, ModelError::Unsupported(_)), "{err}");
    assert!(err.to_string().contains("`position_ids`") && err.to_string().contains("F64"));
    assert!(matches!(
        w.tensor("nope"),
        Err(ModelError::MissingTensor(_))
    ));
}

#[test]
fn sharded_checkpoint_follows_the_index() {
    let dir = tempfile::tempdir().unwrap();
    let s = sample();
    std::fs::write(
        dir.path().join("model-00001-of-00002.safetensors"),
        serialize(&s[..2]),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("model-00002-of-00002.safetensors"),
        serialize(&s[2..3]),
    )
    .unwrap();
    // A stray file not in the index is ignored.
    std::fs::write(
        dir.path().join("consolidated.safetensors"),
        serialize(&s[..1]),
    )
    .unwrap();
    let index = serde_json::json!({
        "metadata": {"total_size": 0},
        "weight_map": {
            "model.norm.weight": "model-00001-of-00002.safetensors",
            "model.layers.0.self_attn.q_proj.weight": "model-00001-of-00002.safetensors",
            "lm_head.weight": "model-00002-of-00002.safetensors"
        }
    });
    std::fs::write(dir.path().join(INDEX_FILE), index.to_string()).unwrap();
    let w = SafetensorsWeights::open_dir(dir.path()).unwrap();
    assert_eq!(w.names().len(), 3);
    assert_eq!(w.tensor("lm_head.weight").unwrap().shape, [1, 2]);

    // An index that points a tensor at the wrong shard is a format error naming it.
    let bad = serde_json::json!({"weight_map": {
        "lm_head.weight": "model-00001-of-00002.safetensors"
    }});
    std::fs::write(dir.path().join(INDEX_FILE), bad.to_string()).unwrap();
    let err = SafetensorsWeights::open_dir(dir.path())
        .unwrap_err()
        .to_string();
    assert!(err.contains("`lm_head.weight`"), "{err}");

    // A shard name escaping the folder is refused.
    let bad = serde_json::json!({"weight_map": {"x": "../x.safetensors"}});
    std::fs::write(dir.path().join(INDEX_FILE), bad.to_string()).unwrap();
    assert!(SafetensorsWeights::open_dir(dir.path()).is_err());
}

#[test]
fn duplicate_tensors_across_shards_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = sample();
    let a = dir.path().join("a.safetensors");
    let b = dir.path().join("b.safetensors");
    std::fs::write(&a, serialize(&s[..1])).unwrap();
    std::fs::write(&b, serialize(&s[..2])).unwrap();
    let err = SafetensorsWeights::open_files(&[a, b])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("`model.norm.weight` appears in two shards"),
        "{err}"
    );
}

#[test]
fn truncated_shard_names_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = serialize(&sample());
    let path = dir.path().join(SINGLE_FILE);
    std::fs::write(&path, &bytes[..bytes.len() - 3]).unwrap();
    let err = SafetensorsWeights::open_dir(dir.path()).unwrap_err();
    assert!(
        matches!(
            err,
            ModelError::Format {
                format: "safetensors",
                ..
            }
        ),
        "{err}"
    );
    // The serializer orders by dtype alignment, then name: the 2-byte types come last, and
    // of those `model.layers.0.self_attn.q_proj.weight` (F16) sorts after `lm_head.weight` (BF16).
    let text = err.to_string();
    assert!(
        text.contains("truncated") && text.contains("`model.layers.0.self_attn.q_proj.weight`"),
        "{text}"
    );
}

#[test]
fn misaligned_tensors_are_copied_aligned() {
    // Hand-made file with a 3-byte-longer header so the data section starts at an odd offset.
    let header = r#"{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}   "#;
    assert_eq!(header.len() % 2, 1);
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend(header.as_bytes());
    bytes.extend(f32_bytes(&[7.5, -1.0]));
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(SINGLE_FILE), &bytes).unwrap();
    let w = SafetensorsWeights::open_dir(dir.path()).unwrap();
    let t = w.tensor("t").unwrap();
    assert_eq!(t.data.as_ptr() as usize % 4, 0);
    assert_eq!(bytemuck::cast_slice::<u8, f32>(t.data), [7.5, -1.0]);
}

#[test]
fn folder_without_weights_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let err = SafetensorsWeights::open_dir(dir.path())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(SINGLE_FILE) && err.contains(INDEX_FILE),
        "{err}"
    );
}
