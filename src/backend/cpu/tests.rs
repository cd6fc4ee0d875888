//! Argument checks and small op identities of the CPU backend.

use super::*;
use crate::tensor::WeightDType;

#[test]
fn upload_weight_checks_shape_and_size() {
    let b = CpuBackend::new(1).unwrap();
    let data = [0u8; 20];
    let ok = TensorView {
        dtype: WeightDType::Q4_1,
        shape: &[1, 32],
        data: &data,
    };
    assert_eq!(b.upload_weight("w", &ok).unwrap().bytes(), &data[..]);
    let short = TensorView {
        dtype: WeightDType::Q4_1,
        shape: &[2, 32],
        data: &data,
    };
    assert!(matches!(
        b.upload_weight("w", &short),
        Err(BackendError::InvalidArgument(_))
    ));
    let ragged = TensorView {
        dtype: WeightDType::Q4_1,
        shape: &[1, 16],
        data: &data,
    };
    assert!(b.upload_weight("w", &ragged).is_err());
    let kq = TensorView {
        dtype: WeightDType::Q4K,
        shape: &[1, 256],
        data: &[0u8; 144],
    };
    assert_eq!(b.upload_weight("w", &kq).unwrap().row_bytes(), 144);
}

#[test]
fn ops_reject_short_buffers() {
    let b = CpuBackend::new(1).unwrap();
    let mut out = vec![0.0; 3];
    let err = b
        .rms_norm(&vec![1.0; 4], &vec![1.0; 2], &mut out, 2, 2, 1e-5)
        .unwrap_err();
    assert!(matches!(err, BackendError::InvalidArgument(_)));
}

#[test]
fn copy_block_checks_range() {
    let b = CpuBackend::new(1).unwrap();
    let spec = KvCacheSpec {
        num_layers: 1,
        num_blocks: 2,
        block_size: 1,
        num_kv_heads: 1,
        head_dim: 1,
    };
    let mut c = b.create_kv_cache(&spec).unwrap();
    assert!(b.copy_block(&mut c, 0, 1).is_ok());
    assert!(b.copy_block(&mut c, 0, 2).is_err());
    assert_eq!(b.kv_bytes_per_block(&spec), 8);
}

#[test]
fn swiglu_equals_silu_mul_on_the_halves() {
    let b = CpuBackend::new(1).unwrap();
    let (rows, inter) = (3, 5);
    let gu: Vec<f32> = (0..rows * 2 * inter)
        .map(|i| (i as f32 * 0.37).sin())
        .collect();
    let mut fused = vec![f32::NAN; rows * inter];
    b.swiglu(&gu, &mut fused, rows, inter).unwrap();
    let (mut g, mut u) = (Vec::new(), Vec::new());
    for r in gu.chunks(2 * inter) {
        g.extend_from_slice(&r[..inter]);
        u.extend_from_slice(&r[inter..]);
    }
    let mut split = vec![f32::NAN; rows * inter];
    b.silu_mul(&g, &u, &mut split, rows * inter).unwrap();
    assert_eq!(fused, split);
    assert!(b.swiglu(&gu, &mut fused, rows + 1, inter).is_err());
}

#[test]
fn stacked_weights_concatenate_rows_and_refuse_mismatches() {
    let b = CpuBackend::new(1).unwrap();
    let (a, c) = ([1.0f32, 2.0, 3.0, 4.0], [5.0f32, 6.0]);
    let (sa, sc) = ([2usize, 2], [1usize, 2]);
    let va = TensorView {
        dtype: WeightDType::F32,
        shape: &sa,
        data: bytemuck::cast_slice(&a),
    };
    let vc = TensorView {
        dtype: WeightDType::F32,
        shape: &sc,
        data: bytemuck::cast_slice(&c),
    };
    let w = b.upload_weight_rows("ac", &[va, vc]).unwrap();
    assert_eq!(w.shape, vec![3, 2]);
    assert_eq!(
        bytemuck::cast_slice::<u8, f32>(w.bytes()),
        &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    );
    let narrow = [2usize, 1];
    let vn = TensorView {
        dtype: WeightDType::F32,
        shape: &narrow,
        data: bytemuck::cast_slice(&c),
    };
    assert!(b.upload_weight_rows("an", &[va, vn]).is_err());
}
