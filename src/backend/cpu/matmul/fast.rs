//! The fast mode's activation side: each row of `x` quantized to 8-bit blocks of 32, and the
//! portable integer-dot kernels.
//!
//! Block `b` of row `i` (elements `32b .. 32b + 32`): `d = max|x| / 127`, `q = round(x / d)`
//! (ties to even, so `|q| ≤ 127`), kept as `qs` (i8), `d` (f32) and `sum = Σ q` (i32). The
//! weight side is read in place. Per block the dot is exact in integers, then scaled:
//! - Q8_0: `dw · d · Σ wq · q`;
//! - Q4_0: `dw · d · (Σ n · q − 8 · sum)` (`n` the unsigned nibble);
//! - Q4_1: `dw · d · Σ n · q + mw · d · sum`.

use super::{layout, FastKernels};
use crate::model::WeightDType;

/// Activation rows quantized to 8-bit blocks of 32.
#[derive(Debug, Clone, Default)]
pub(super) struct QuantizedRows {
    /// Elements per row (a multiple of 32).
    pub k: usize,
    /// Blocks per row (`k / 32`).
    pub nb: usize,
    /// `[m, k]` quantized values.
    pub qs: Vec<i8>,
    /// `[m, nb]` block scales.
    pub d: Vec<f32>,
    /// `[m, nb]` block sums of `qs`.
    pub sum: Vec<i32>,
}

impl QuantizedRows {
    /// Quantize the `m` rows of `x` (`[m, k]`, `k` a multiple of 32).
    pub fn new(x: &[f32], m: usize, k: usize) -> QuantizedRows {
        assert!(
            k.is_multiple_of(layout::QK) && x.len() == m * k,
            "quantize [{m}, {k}]"
        );
        let nb = k / layout::QK;
        let mut r = QuantizedRows {
            k,
            nb,
            qs: vec![0; m * k],
            d: vec![0.0; m * nb],
            sum: vec![0; m * nb],
        };
        for ((xb, qb), (d, sum)) in x
            .chunks_exact(layout::QK)
            .zip(r.qs.chunks_exact_mut(layout::QK))
            .zip(r.d.iter_mut().zip(r.sum.iter_mut()))
        {
            let amax = xb.iter().fold(0.0f32, |a, v| a.max(v.abs()));
            let scale = amax / 127.0;
            let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
            let mut s = 0i32;
            for (q, &v) in qb.iter_mut().zip(xb) {
                let t = (v * inv).round_ties_even().clamp(-127.0, 127.0) as i8;
                *q = t;
                s += t as i32;
            }
            *d = scale;
            *sum = s;
        }
        r
    }
}

/// The portable integer-dot kernels (one f32 accumulator per dot, blocks in order).
#[derive(Debug, Clone, Copy)]
pub(super) struct ScalarFast;

impl FastKernels for ScalarFast {
    const MR: usize = 4;
    const NR: usize = 4;

    fn tile(
        self,
        dtype: WeightDType,
        rows: &[u8],
        rb: usize,
        nr: usize,
        a: &QuantizedRows,
        i0: usize,
        mr: usize,
        out: &mut [f32],
    ) {
        for i in 0..mr {
            let row = i0 + i;
            let qs = &a.qs[row * a.k..(row + 1) * a.k];
            let (dx, sx) = (
                &a.d[row * a.nb..(row + 1) * a.nb],
                &a.sum[row * a.nb..(row + 1) * a.nb],
            );
            for j in 0..nr {
                let w = &rows[j * rb..(j + 1) * rb];
                out[i * nr + j] = dot_row(dtype, w, qs, dx, sx);
            }
        }
    }
}

/// One weight row against one quantized activation row.
fn dot_row(dtype: WeightDType, w: &[u8], qs: &[i8], dx: &[f32], sx: &[i32]) -> f32 {
    let mut acc = 0.0f32;
    for (b, q) in qs.chunks_exact(layout::QK).enumerate() {
        match dtype {
            WeightDType::Q8_0 => {
                let blk = &w[b * layout::Q8_0_BYTES..(b + 1) * layout::Q8_0_BYTES];
                let isum: i32 = blk[2..]
                    .iter()
                    .zip(q)
                    .map(|(&w, &x)| (w as i8) as i32 * x as i32)
                    .sum();
                acc += layout::f16_at(blk, 0) * dx[b] * isum as f32;
            }
            WeightDType::Q4_0 | WeightDType::Q4_1 => {
                let (bytes, qs_at) = if dtype == WeightDType::Q4_0 {
                    (layout::Q4_0_BYTES, 2)
                } else {
                    (layout::Q4_1_BYTES, 4)
                };
                let blk = &w[b * bytes..(b + 1) * bytes];
                let mut isum = 0i32;
                for (j, &byte) in blk[qs_at..].iter().enumerate() {
                    isum +=
                        (byte & 15) as i32 * q[j] as i32 + (byte >> 4) as i32 * q[j + 16] as i32;
                }
                let dw = layout::f16_at(blk, 0);
                if dtype == WeightDType::Q4_0 {
                    acc += dw * dx[b] * (isum - 8 * sx[b]) as f32;
                } else {
                    acc +=
                        dw * dx[b] * isum as f32 + layout::f16_at(blk, 2) * (dx[b] * sx[b] as f32);
                }
            }
            _ => panic!("no integer dot for {dtype:?}"),
        }
    }
    acc
}
