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
use crate::tensor::WeightDType;

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
    /// Zeroed storage for `m` rows of `k` (a multiple of 32).
    pub fn zeroed(m: usize, k: usize) -> QuantizedRows {
        assert!(k.is_multiple_of(layout::QK), "quantize rows of {k}");
        let nb = k / layout::QK;
        QuantizedRows {
            k,
            nb,
            qs: vec![0; m * k],
            d: vec![0.0; m * nb],
            sum: vec![0; m * nb],
        }
    }

    /// Quantize the `m` rows of `x` (`[m, k]`, `k` a multiple of 32) with portable code; the
    /// SIMD versions ([`FastKernels::quantize`]) produce the same bits.
    pub fn new(x: &[f32], m: usize, k: usize) -> QuantizedRows {
        assert_eq!(x.len(), m * k, "quantize [{m}, {k}]");
        let mut r = QuantizedRows::zeroed(m, k);
        for ((xb, qb), (d, sum)) in x
            .chunks_exact(layout::QK)
            .zip(r.qs.chunks_exact_mut(layout::QK))
            .zip(r.d.iter_mut().zip(r.sum.iter_mut()))
        {
            (*d, *sum) = quantize_block(xb, qb);
        }
        r
    }
}

/// 1.5 · 2²³: adding and subtracting it rounds an f32 of magnitude < 2²² to an integer, ties
/// to even (the default rounding mode), the same as `cvtps2dq`.
const ROUND_MAGIC: f32 = 12_582_912.0;

/// One block: `d = max|x| / 127`, `q = round(x / d)` (as `x · (1 / d)`, ties to even).
/// Returns `(d, Σ q)`.
#[inline]
pub(super) fn block_scale(amax: f32) -> (f32, f32) {
    let d = amax / 127.0;
    (d, if d > 0.0 { 1.0 / d } else { 0.0 })
}

fn quantize_block(xb: &[f32], qb: &mut [i8]) -> (f32, i32) {
    let amax = xb.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let (d, inv) = block_scale(amax);
    let mut s = 0i32;
    for (q, &v) in qb.iter_mut().zip(xb) {
        let t = ((v * inv + ROUND_MAGIC) - ROUND_MAGIC).clamp(-127.0, 127.0) as i8;
        *q = t;
        s += t as i32;
    }
    (d, s)
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
