//! The exact reference matmul: each weight row is dequantized exactly as stored and dotted
//! with the f32 activations. Simple and slow; the fast kernels in `matmul.rs` are checked
//! against it.
//!
//! Rows are dequantized by [`crate::quant::dequantize_row`], bit for bit ggml's reference
//! (the same values transformers' GGUF loader produces), for every stored format.

use rayon::prelude::*;

pub use crate::quant::dequantize_row;

use super::CpuWeight;

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
    use crate::tensor::WeightDType;
    use half::f16;

    /// One Q4_1 block: d = 0.5, m = −1, nibbles j (low) and 15 − j (high) in byte j.
    fn q4_1_block() -> Vec<u8> {
        let mut b = Vec::new();
        b.extend(f16::from_f32(0.5).to_le_bytes());
        b.extend(f16::from_f32(-1.0).to_le_bytes());
        b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        b
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
