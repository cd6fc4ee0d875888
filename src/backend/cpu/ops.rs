//! Elementwise and row-wise CPU ops on f32 slices: embedding lookup, RMSNorm (plain and fused
//! with the residual add), RoPE, SiLU-gated product, add, row gather.
//!
//! Each function mirrors one [`crate::backend::Backend`] method with the shapes documented
//! there; the caller has checked lengths. Work is split over rows with rayon on the current
//! pool (the [`super::CpuBackend`] installs its own). Norms accumulate the sum of squares in
//! f64, so they are at least as exact as transformers' f32 reductions.

use rayon::prelude::*;

use super::reference::dequantize_row;
use super::CpuWeight;

/// Rows below this many elements of work are not worth a rayon task of their own.
const MIN_PAR_ELEMS: usize = 4096;

/// Rows per rayon task for `rows` rows of `dim` elements.
fn rows_per_task(dim: usize) -> usize {
    MIN_PAR_ELEMS.div_ceil(dim.max(1)).max(1)
}

/// `out[t, :] = dequantize(table[ids[t], :])`; `out`: `[ids.len(), hidden]`.
pub fn embedding(table: &CpuWeight, ids: &[u32], out: &mut [f32]) {
    let hidden = table.shape[1];
    let row_bytes = table.row_bytes();
    let data = table.bytes();
    out.par_chunks_mut(hidden)
        .zip(ids.par_iter())
        .for_each(|(row, &id)| {
            let start = id as usize * row_bytes;
            dequantize_row(table.dtype, &data[start..start + row_bytes], row);
        });
}

/// One row of RMSNorm: `out = x / sqrt(mean(x²) + eps) * weight`.
fn rms_norm_row(x: &[f32], weight: &[f32], out: &mut [f32], eps: f32) {
    let sum_sq: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
    let mean = (sum_sq / x.len() as f64) as f32;
    let inv = 1.0 / (mean + eps).sqrt();
    for ((o, &v), &w) in out.iter_mut().zip(x).zip(weight) {
        *o = w * (v * inv);
    }
}

/// RMSNorm over rows of `dim`; `x`, `out`: `[rows, dim]`, `weight`: `[dim]`.
pub fn rms_norm(x: &[f32], weight: &[f32], out: &mut [f32], dim: usize, eps: f32) {
    let per = rows_per_task(dim);
    out.par_chunks_mut(dim * per)
        .zip(x.par_chunks(dim * per))
        .for_each(|(o, x)| {
            for (o, x) in o.chunks_mut(dim).zip(x.chunks(dim)) {
                rms_norm_row(x, weight, o, eps);
            }
        });
}

/// `residual += delta`, then `out = rms_norm(residual)`; all `[rows, dim]`.
pub fn add_rms_norm(
    residual: &mut [f32],
    delta: &[f32],
    weight: &[f32],
    out: &mut [f32],
    dim: usize,
    eps: f32,
) {
    let per = rows_per_task(dim);
    residual
        .par_chunks_mut(dim * per)
        .zip(delta.par_chunks(dim * per))
        .zip(out.par_chunks_mut(dim * per))
        .for_each(|((r, d), o)| {
            for ((r, d), o) in r.chunks_mut(dim).zip(d.chunks(dim)).zip(o.chunks_mut(dim)) {
                for (r, &d) in r.iter_mut().zip(d) {
                    *r += d;
                }
                rms_norm_row(r, weight, o, eps);
            }
        });
}

/// Rotate every head of `x` (`[num_tokens, heads, head_dim]`) at its token's position, NeoX
/// style over the first `2 * half` dims: `(a, b) → (a·cos − b·sin, b·cos + a·sin)` for the pair
/// `(i, i + half)`. `cos`, `sin`: `[max_positions, half]`.
pub fn rope(
    x: &mut [f32],
    positions: &[u32],
    cos: &[f32],
    sin: &[f32],
    heads: usize,
    head_dim: usize,
    half: usize,
) {
    x.par_chunks_mut(heads * head_dim)
        .zip(positions.par_iter())
        .for_each(|(tok, &pos)| {
            let base = pos as usize * half;
            let (c, s) = (&cos[base..base + half], &sin[base..base + half]);
            for head in tok.chunks_mut(head_dim) {
                let (lo, hi) = head[..2 * half].split_at_mut(half);
                for i in 0..half {
                    let (a, b) = (lo[i], hi[i]);
                    // transformers: q·cos + rotate_half(q)·sin, rotate_half(q) = (−b, a).
                    lo[i] = a * c[i] + (-b) * s[i];
                    hi[i] = b * c[i] + a * s[i];
                }
            }
        });
}

/// `out = silu(gate) * up` elementwise, `silu(g) = g / (1 + e^(−g))`.
pub fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
    out.par_chunks_mut(MIN_PAR_ELEMS)
        .zip(gate.par_chunks(MIN_PAR_ELEMS))
        .zip(up.par_chunks(MIN_PAR_ELEMS))
        .for_each(|((o, g), u)| {
            for ((o, &g), &u) in o.iter_mut().zip(g).zip(u) {
                *o = g / (1.0 + (-g).exp()) * u;
            }
        });
}

/// `x += y` elementwise.
pub fn add(x: &mut [f32], y: &[f32]) {
    x.par_chunks_mut(MIN_PAR_ELEMS)
        .zip(y.par_chunks(MIN_PAR_ELEMS))
        .for_each(|(x, y)| {
            for (x, &y) in x.iter_mut().zip(y) {
                *x += y;
            }
        });
}

/// `out[i, :] = x[rows[i], :]`; rows of `dim`.
pub fn gather_rows(x: &[f32], rows: &[u32], dim: usize, out: &mut [f32]) {
    for (o, &r) in out.chunks_mut(dim).zip(rows) {
        let r = r as usize;
        o.copy_from_slice(&x[r * dim..(r + 1) * dim]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::WeightDType;

    fn close(a: &[f32], b: &[f32], tol: f32) {
        assert_eq!(a.len(), b.len());
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!((x - y).abs() <= tol, "element {i}: {x} vs {y}");
        }
    }

    #[test]
    fn embedding_picks_rows_in_token_order() {
        let table: Vec<f32> = (0..12).map(|v| v as f32).collect(); // [4, 3]
        let w = CpuWeight::from_f32(&[4, 3], &table);
        let mut out = vec![0.0; 6];
        embedding(&w, &[3, 1], &mut out);
        assert_eq!(out, vec![9.0, 10.0, 11.0, 3.0, 4.0, 5.0]);
        assert_eq!(w.dtype, WeightDType::F32);
    }

    #[test]
    fn rms_norm_scales_rows_to_unit_rms() {
        // Row [3, 4]: mean square 12.5, rms = 3.5355; row [0, 0] stays 0 with eps.
        let x = [3.0, 4.0, 0.0, 0.0];
        let mut out = [0.0; 4];
        rms_norm(&x, &[1.0, 2.0], &mut out, 2, 0.0);
        let r = 12.5f32.sqrt();
        close(&out[..2], &[3.0 / r, 8.0 / r], 1e-6);
        rms_norm(&x, &[1.0, 2.0], &mut out, 2, 1e-5);
        close(&out[2..], &[0.0, 0.0], 0.0);
    }

    #[test]
    fn add_rms_norm_updates_the_residual_then_normalizes() {
        let mut residual = [1.0, 1.0];
        let mut out = [0.0; 2];
        add_rms_norm(&mut residual, &[2.0, -5.0], &[1.0, 1.0], &mut out, 2, 0.0);
        assert_eq!(residual, [3.0, -4.0]);
        let r = 12.5f32.sqrt();
        close(&out, &[3.0 / r, -4.0 / r], 1e-6);
    }

    #[test]
    fn rope_rotates_pairs_i_and_i_plus_half() {
        // One head of dim 4, half 2, at position 1 with angles [π/2, 0]:
        // pair (x0, x2) rotates by 90° → (−x2, x0); pair (x1, x3) is unchanged.
        let cos = [1.0, 1.0, 0.0, 1.0];
        let sin = [0.0, 0.0, 1.0, 0.0];
        let mut x = [1.0, 2.0, 3.0, 4.0];
        rope(&mut x, &[1], &cos, &sin, 1, 4, 2);
        assert_eq!(x, [-3.0, 2.0, 1.0, 4.0]);
        // Position 0 is the identity.
        let mut y = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        rope(&mut y, &[0], &cos, &sin, 1, 6, 2); // partial rotary: dims 4, 5 untouched
        assert_eq!(y, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    }

    #[test]
    fn silu_mul_and_add_are_elementwise() {
        let mut out = [0.0; 3];
        silu_mul(&[0.0, 1.0, -1.0], &[5.0, 2.0, 3.0], &mut out);
        let s = |g: f32| g / (1.0 + (-g).exp());
        close(&out, &[0.0, 2.0 * s(1.0), 3.0 * s(-1.0)], 1e-7);
        let mut x = [1.0, 2.0];
        add(&mut x, &[0.5, -2.0]);
        assert_eq!(x, [1.5, 0.0]);
    }

    #[test]
    fn gather_rows_copies_the_named_rows() {
        let x = [0.0, 1.0, 10.0, 11.0, 20.0, 21.0];
        let mut out = [0.0; 4];
        gather_rows(&x, &[2, 0], 2, &mut out);
        assert_eq!(out, [20.0, 21.0, 0.0, 1.0]);
    }
}
