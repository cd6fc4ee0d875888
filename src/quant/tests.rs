//! Hand-built blocks against hand-computed values, and K-quant blocks against reference values
//! from gguf-py (`gguf.quants.dequantize`, see each test for the exact generator).

use super::*;
use bytemuck::Zeroable;

/// Deterministic filler bytes, `(i * mul + add) mod 256`, as in the Python generator below.
fn pattern(n: usize, mul: usize, add: usize) -> Vec<u8> {
    (0..n).map(|i| ((i * mul + add) % 256) as u8).collect()
}

fn dq(dtype: WeightDType, bytes: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![f32::NAN; n];
    dequantize_row(dtype, bytes, &mut out);
    out
}

#[test]
fn q8_0_is_scale_times_quant() {
    let b = BlockQ8_0 {
        d: f16::from_f32(0.5),
        qs: std::array::from_fn(|j| j as i8 - 16),
    };
    let y = dq(WeightDType::Q8_0, bytemuck::bytes_of(&b), 32);
    for (j, v) in y.iter().enumerate() {
        assert_eq!(*v, (j as f32 - 16.0) * 0.5, "element {j}");
    }
}

#[test]
fn q4_0_low_nibbles_first_then_high() {
    // qs[j] = low nibble j % 16, high nibble 15 - j % 16.
    let b = BlockQ4_0 {
        d: f16::from_f32(2.0),
        qs: std::array::from_fn(|j| (j as u8 & 0xF) | ((15 - j as u8) << 4)),
    };
    let y = dq(WeightDType::Q4_0, bytemuck::bytes_of(&b), 32);
    for j in 0..16 {
        assert_eq!(y[j], (j as f32 - 8.0) * 2.0, "element {j}");
        assert_eq!(
            y[j + 16],
            (15.0 - j as f32 - 8.0) * 2.0,
            "element {}",
            j + 16
        );
    }
}

#[test]
fn q4_1_adds_the_min() {
    let b = BlockQ4_1 {
        d: f16::from_f32(0.5),
        m: f16::from_f32(-1.0),
        qs: std::array::from_fn(|j| (j as u8) | ((j as u8 ^ 0xF) << 4)),
    };
    let y = dq(WeightDType::Q4_1, bytemuck::bytes_of(&b), 32);
    for j in 0..16 {
        assert_eq!(y[j], j as f32 * 0.5 - 1.0);
        assert_eq!(y[j + 16], (j ^ 0xF) as f32 * 0.5 - 1.0);
    }
}

#[test]
fn q4_k_scale_min_unpacking() {
    let mut b = BlockQ4K::zeroed();
    // Sub-block 1: scale in scales[1] low 6 bits, min in scales[5] low 6 bits.
    b.scales[1] = 0b11_101010; // top bits belong to sub-block 5's scale
    b.scales[5] = 0b01_010101; // top bits belong to sub-block 5's min
    b.scales[9] = 0x3C; // sub-block 5: scale low nibble 0xC, min low nibble 0x3
    assert_eq!(b.scale_min(1), (0b101010, 0b010101));
    assert_eq!(b.scale_min(5), (0xC | (0b11 << 4), 0x3 | (0b01 << 4)));
}

#[test]
fn q4_k_matches_gguf_py() {
    // Reference: /work/venv/bin/python with gguf-py:
    //   b = f16(0.5) + f16(0.25) + pattern(12, 37, 11) + pattern(128, 53, 7)
    //   y = gguf.quants.dequantize(np.frombuffer(b, np.uint8), GGMLQuantizationType.Q4_K)
    // With d = 0.5 and dmin = 0.25 every value is a multiple of 1/4, so the sums are exact.
    let mut bytes = Vec::new();
    bytes.extend(f16::from_f32(0.5).to_le_bytes());
    bytes.extend(f16::from_f32(0.25).to_le_bytes());
    bytes.extend(pattern(12, 37, 11));
    bytes.extend(pattern(128, 53, 7));
    let y = dq(WeightDType::Q4K, &bytes, 256);
    let sum: f64 = y.iter().map(|&v| f64::from(v)).sum();
    let wsum: f64 = y
        .iter()
        .enumerate()
        .map(|(i, &v)| i as f64 * f64::from(v))
        .sum();
    assert_eq!(sum, 21180.0);
    assert_eq!(wsum, 2416564.0);
    let picks = [0, 1, 31, 32, 33, 63, 64, 100, 127, 128, 200, 255];
    let want = [
        30.75, 58.25, 3.25, -1.0, 71.0, 167.0, 63.25, 199.5, 25.5, 1.75, 203.75, 42.5,
    ];
    for (i, w) in picks.iter().zip(want) {
        assert_eq!(y[*i], w, "element {i}");
    }
}

#[test]
fn q6_k_matches_gguf_py() {
    // Reference: /work/venv/bin/python with gguf-py:
    //   b = pattern(128, 29, 3) + pattern(64, 71, 5) + pattern(16, 97, 200) + f16(0.125)
    //   y = gguf.quants.dequantize(np.frombuffer(b, np.uint8), GGMLQuantizationType.Q6_K)
    // With d = 1/8 every value is a multiple of 1/8, so the sums are exact.
    let mut bytes = pattern(128, 29, 3);
    bytes.extend(pattern(64, 71, 5));
    bytes.extend(pattern(16, 97, 200));
    bytes.extend(f16::from_f32(0.125).to_le_bytes());
    let y = dq(WeightDType::Q6K, &bytes, 256);
    let sum: f64 = y.iter().map(|&v| f64::from(v)).sum();
    let wsum: f64 = y
        .iter()
        .enumerate()
        .map(|(i, &v)| i as f64 * f64::from(v))
        .sum();
    assert_eq!(sum, -1356.5);
    assert_eq!(wsum, -265166.0);
    let picks = [0, 1, 31, 32, 33, 63, 64, 100, 127, 128, 200, 255];
    let want = [
        91.0, 224.0, 30.75, 191.75, -236.0, -57.75, -304.0, -54.25, 27.75, 78.0, -147.0, -148.75,
    ];
    for (i, w) in picks.iter().zip(want) {
        assert_eq!(y[*i], w, "element {i}");
    }
}

#[test]
fn q6_k_hand_built_element_positions() {
    // Element 128 + 64 + 5 (second half, l = 5, third quarter) is the high nibble of
    // ql[64 + 5] with bits 4-5 of qh[32 + 5] and scale scales[8 + 0 + 4].
    let mut b = BlockQ6K::zeroed();
    // Every other quant is 0 | (0 << 4) - 32 = -32: it vanishes under a zero scale, and gives
    // 0.5 · -3 · -32 = 48 for the other 15 elements (128 + 64 + 0..16) sharing scales[12].
    b.ql[64 + 5] = 0x70; // high nibble 7
    b.qh[32 + 5] = 0b10 << 4; // high bits 2 → q = 7 | 32 = 39, minus 32 = 7
    b.scales[8 + 4] = -3;
    b.d = f16::from_f32(0.5);
    let y = dq(WeightDType::Q6K, bytemuck::bytes_of(&b), 256);
    for (i, v) in y.iter().enumerate() {
        let want = match i {
            197 => 0.5 * -3.0 * 7.0,
            192..208 => 48.0,
            _ => 0.0,
        };
        assert_eq!(*v, want, "element {i}");
    }
}

#[test]
fn plain_floats_little_endian_and_unaligned() {
    let vals = [1.5f32, -2.25, 0.0, 65504.0];
    let mut bytes = vec![0u8]; // force misalignment
    for v in vals {
        bytes.extend(v.to_le_bytes());
    }
    assert_eq!(dq(WeightDType::F32, &bytes[1..], 4), vals);
    let mut h = vec![0u8];
    for v in vals {
        h.extend(f16::from_f32(v).to_le_bytes());
    }
    assert_eq!(dq(WeightDType::F16, &h[1..], 4), vals);
    let mut b = Vec::new();
    for v in vals {
        b.extend(bf16::from_f32(v).to_le_bytes());
    }
    // bf16 keeps the top 16 bits: these values are exact except 65504 → 65536 (rounded).
    assert_eq!(dq(WeightDType::BF16, &b, 4), [1.5, -2.25, 0.0, 65536.0]);
}

#[test]
fn multi_block_rows_and_unaligned_blocks_agree() {
    let bytes = pattern(3 * 20, 13, 1);
    let aligned = dq(WeightDType::Q4_1, &bytes, 96);
    let mut shifted = vec![0u8];
    shifted.extend(&bytes);
    let unaligned = dq(WeightDType::Q4_1, &shifted[1..], 96);
    assert_eq!(
        aligned.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        unaligned.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
    // Block 2 on its own equals elements 64..96 of the row.
    assert_eq!(dq(WeightDType::Q4_1, &bytes[40..60], 32)[..], aligned[64..]);
}

#[test]
fn view_rows_and_whole_view() {
    let rows: Vec<BlockQ8_0> = (0..2)
        .map(|r| BlockQ8_0 {
            d: f16::from_f32(1.0 + r as f32),
            qs: std::array::from_fn(|j| j as i8),
        })
        .collect();
    let shape = [2, 32];
    let view = TensorView {
        dtype: WeightDType::Q8_0,
        shape: &shape,
        data: bytemuck::cast_slice(&rows),
    };
    let all = dequantize_view(&view);
    let mut row1 = vec![0.0; 32];
    dequantize_view_row(&view, 1, &mut row1);
    assert_eq!(all[32..], row1[..]);
    assert_eq!(row1[3], 6.0);
    assert_eq!(blocks::<BlockQ8_0>(view.data).map(<[_]>::len), Some(2));
}

#[test]
#[should_panic(expected = "needs")]
fn wrong_byte_count_panics() {
    dq(WeightDType::Q4_0, &[0u8; 17], 32);
}
