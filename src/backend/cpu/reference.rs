//! The exact reference matmul: each weight row is dequantized exactly as stored and dotted
//! with the f32 activations. Simple and slow; the fast kernels in `matmul.rs` are checked
//! against it.
//!
//! `dequantize_row` follows ggml's `dequantize_row_*` definitions for the formats the CPU
//! backend reads (F32, F16, BF16, Q8_0, Q4_0, Q4_1): each element is `d · q` (`d · q + m` for
//! Q4_1) in f32, the same values transformers' GGUF loader produces.

use half::{bf16, f16};
use rayon::prelude::*;

use crate::model::WeightDType;

use super::CpuWeight;

/// Dequantize one stored row (`bytes` holds whole blocks) into `out` (its element count).
///
/// # Panics
/// If `bytes` does not hold exactly `out.len()` elements, or for K-quant types (not supported
/// by this reference).
pub fn dequantize_row(dtype: WeightDType, bytes: &[u8], out: &mut [f32]) {
    assert_eq!(
        dtype.row_bytes(out.len()),
        Some(bytes.len()),
        "row of {dtype:?}"
    );
    let f16_at = |b: &[u8], i: usize| f16::from_le_bytes([b[i], b[i + 1]]).to_f32();
    match dtype {
        WeightDType::F32 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        WeightDType::F16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        WeightDType::BF16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = bf16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        WeightDType::Q8_0 => {
            for (o, b) in out.chunks_exact_mut(32).zip(bytes.chunks_exact(34)) {
                let d = f16_at(b, 0);
                for (o, &q) in o.iter_mut().zip(&b[2..]) {
                    *o = (q as i8) as f32 * d;
                }
            }
        }
        WeightDType::Q4_0 => {
            for (o, b) in out.chunks_exact_mut(32).zip(bytes.chunks_exact(18)) {
                let d = f16_at(b, 0);
                for (j, &q) in b[2..].iter().enumerate() {
                    o[j] = ((q & 0x0f) as i32 - 8) as f32 * d;
                    o[j + 16] = ((q >> 4) as i32 - 8) as f32 * d;
                }
            }
        }
        WeightDType::Q4_1 => {
            for (o, b) in out.chunks_exact_mut(32).zip(bytes.chunks_exact(20)) {
                let (d, m) = (f16_at(b, 0), f16_at(b, 2));
                for (j, &q) in b[4..].iter().enumerate() {
                    o[j] = (q & 0x0f) as f32 * d + m;
                    o[j + 16] = (q >> 4) as f32 * d + m;
                }
            }
        }
        WeightDType::Q4K | WeightDType::Q6K => {
            panic!("{dtype:?} is not supported by the reference dequantizer")
        }
    }
}

/// `out[r, n] = Σ_k x[r, k] · w[n, k]`; `x`: `[rows, k]`, `out`: `[rows, n]`. Parallel over
/// weight rows; each is dequantized once and dotted with every activation row.
pub fn matmul(x: &[f32], rows: usize, w: &CpuWeight, out: &mut [f32]) {
    let (n, k) = (w.shape[0], w.shape[1]);
    let row_bytes = w.row_bytes();
    let data = w.bytes();
    // Column-major result `[n, rows]`, transposed into `out` at the end.
    let mut t = vec![0.0f32; n * rows];
    t.par_chunks_mut(rows).enumerate().for_each_init(
        || vec![0.0f32; k],
        |wrow, (j, col)| {
            dequantize_row(w.dtype, &data[j * row_bytes..(j + 1) * row_bytes], wrow);
            for (r, c) in col.iter_mut().enumerate() {
                *c = dot(&x[r * k..(r + 1) * k], wrow);
            }
        },
    );
    for r in 0..rows {
        for j in 0..n {
            out[r * n + j] = t[j * rows + r];
        }
    }
}

/// f32 dot product with eight partial sums.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ac
        .remainder()
        .iter()
        .zip(bc.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ac.zip(bc) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One Q4_1 block: d = 0.5, m = −1, nibbles j (low) and 15 − j (high) in byte j.
    fn q4_1_block() -> Vec<u8> {
        let mut b = Vec::new();
        b.extend(f16::from_f32(0.5).to_le_bytes());
        b.extend(f16::from_f32(-1.0).to_le_bytes());
        b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        b
    }

    #[test]
    fn q4_1_is_d_times_q_plus_m_low_nibbles_first() {
        let mut out = [0.0; 32];
        dequantize_row(WeightDType::Q4_1, &q4_1_block(), &mut out);
        for j in 0..16 {
            assert_eq!(out[j], j as f32 * 0.5 - 1.0);
            assert_eq!(out[j + 16], (15 - j) as f32 * 0.5 - 1.0);
        }
    }

    #[test]
    fn q4_0_and_q8_0_are_signed() {
        let mut b = f16::from_f32(2.0).to_le_bytes().to_vec();
        b.extend([0x80u8; 16]); // low nibble 0 → −8, high nibble 8 → 0
        let mut out = [0.0; 32];
        dequantize_row(WeightDType::Q4_0, &b, &mut out);
        assert_eq!((out[0], out[16]), (-16.0, 0.0));
        let mut b = f16::from_f32(0.25).to_le_bytes().to_vec();
        b.extend((0..32).map(|j: i32| (j - 16) as i8 as u8));
        dequantize_row(WeightDType::Q8_0, &b, &mut out);
        assert_eq!((out[0], out[31]), (-4.0, 3.75));
    }

    #[test]
    fn plain_floats_round_trip() {
        let mut out = [0.0; 2];
        let b: Vec<u8> = [1.5f32, -2.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        dequantize_row(WeightDType::F32, &b, &mut out);
        assert_eq!(out, [1.5, -2.0]);
        let b: Vec<u8> = [bf16::from_f32(3.0), bf16::from_f32(-0.5)]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        dequantize_row(WeightDType::BF16, &b, &mut out);
        assert_eq!(out, [3.0, -0.5]);
        let b: Vec<u8> = [f16::from_f32(0.125), f16::from_f32(7.0)]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        dequantize_row(WeightDType::F16, &b, &mut out);
        assert_eq!(out, [0.125, 7.0]);
    }

    #[test]
    fn matmul_is_x_times_w_transposed() {
        // x = [[1, 2], [3, 4], [5, 6]], w = [[1, 0], [0, 1], [1, 1], [2, -1]] → out [3, 4].
        let w = CpuWeight::from_f32(&[4, 2], &[1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 2.0, -1.0]);
        let mut out = vec![0.0; 12];
        matmul(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 3, &w, &mut out);
        assert_eq!(
            out,
            vec![1.0, 2.0, 3.0, 0.0, 3.0, 4.0, 7.0, 2.0, 5.0, 6.0, 11.0, 4.0]
        );
    }

    #[test]
    fn matmul_on_quantized_rows_equals_dequantized_dot() {
        let block = q4_1_block();
        let w = CpuWeight::new(
            WeightDType::Q4_1,
            vec![2, 32],
            [block.clone(), block].concat(),
        );
        let x: Vec<f32> = (0..32).map(|i| (i % 5) as f32 - 2.0).collect();
        let mut deq = [0.0; 32];
        dequantize_row(WeightDType::Q4_1, &q4_1_block(), &mut deq);
        let want: f32 = x.iter().zip(&deq).map(|(a, b)| a * b).sum();
        let mut out = vec![0.0; 2];
        matmul(&x, 1, &w, &mut out);
        assert!(
            (out[0] - want).abs() < 1e-5 && out[0] == out[1],
            "{out:?} vs {want}"
        );
    }
}
